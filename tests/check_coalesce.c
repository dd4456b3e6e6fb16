/* coalesce: a busy loop iteration waits before the next poll; a quiet one does not. */
#include <check.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <uv.h>

#include "daemon/coalesce.h"

static uint64_t now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000u + (uint64_t)ts.tv_nsec / 1000u;
}

/* ---- events noted from a timer ---- */

#define NOTER_MAX 8

struct noter {
    struct coalesce *c;
    unsigned n;
    uint64_t marks[NOTER_MAX]; /* one source each */
};

static void note_n(uv_timer_t *t)
{
    struct noter *w = t->data;
    for (unsigned i = 0; i < w->n; i++)
        coalesce_note(w->c, &w->marks[i]);
}

/* One loop iteration in which a timer notes n sources (n <= NOTER_MAX);
 * answers the wall time it took. */
static uint64_t iteration_noting(struct coalesce *c, uv_loop_t *loop, unsigned n)
{
    uv_timer_t t;
    struct noter w = {.c = c, .n = n};
    uv_timer_init(loop, &t);
    t.data = &w;
    uv_timer_start(&t, note_n, 0, 0);
    uint64_t t0 = now_us();
    uv_run(loop, UV_RUN_ONCE);
    uint64_t took = now_us() - t0;
    uv_close((uv_handle_t *)&t, NULL);
    uv_run(loop, UV_RUN_DEFAULT);
    return took;
}

START_TEST(an_iteration_with_enough_events_waits_and_a_quieter_one_does_not)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    struct coalesce c;
    ck_assert_int_eq(coalesce_start(&c, &loop, 3, 30000), 0);

    iteration_noting(&c, &loop, 2);
    ck_assert_uint_eq(c.iterations, 1);
    ck_assert_uint_eq(c.waits, 0);

    uint64_t took = iteration_noting(&c, &loop, 3);
    ck_assert_uint_eq(c.iterations, 2);
    ck_assert_uint_eq(c.waits, 1);
    ck_assert_msg(took >= 30000, "a busy iteration took %llu us, less than the 30 ms wait", (unsigned long long)took);

    /* The count starts again with each iteration: 2 + 2 in two iterations is not 4. */
    iteration_noting(&c, &loop, 2);
    iteration_noting(&c, &loop, 2);
    ck_assert_uint_eq(c.iterations, 4);
    ck_assert_uint_eq(c.waits, 1);

    /* The handle does not keep the loop alive, and it closes. */
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    coalesce_close(&c);
    coalesce_close(&c); /* idempotent */
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

/* ---- reads, as the control port notes them ---- */

/* The near end of a socket pair, read on the loop, noted as the server notes
 * a connection. */
struct peer {
    uv_pipe_t pipe;
    struct coalesce *c;
    uint64_t mark;
    int far; /* the other end, written by the test */
    char buf[16];
    unsigned reads;
};

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct peer *p = h->data;
    *buf = uv_buf_init(p->buf, sizeof(p->buf));
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct peer *p = s->data;
    if (nread <= 0)
        return;
    p->reads++;
    coalesce_note(p->c, &p->mark);
}

static void peers_open(uv_loop_t *loop, struct coalesce *c, struct peer *p, int n)
{
    for (int i = 0; i < n; i++) {
        int sv[2];
        ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
        p[i] = (struct peer){.c = c, .far = sv[1]};
        ck_assert_int_eq(uv_pipe_init(loop, &p[i].pipe, 0), 0);
        ck_assert_int_eq(uv_pipe_open(&p[i].pipe, sv[0]), 0);
        p[i].pipe.data = &p[i];
        ck_assert_int_eq(uv_read_start((uv_stream_t *)&p[i].pipe, on_alloc, on_read), 0);
    }
}

/* Closes the peers and c, and the loop, which must then close cleanly. */
static void peers_close(uv_loop_t *loop, struct coalesce *c, struct peer *p, int n)
{
    for (int i = 0; i < n; i++) {
        uv_close((uv_handle_t *)&p[i].pipe, NULL);
        close(p[i].far);
    }
    coalesce_close(c);
    uv_run(loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(loop), 0);
}

#define PEERS 4

START_TEST(frames_ready_together_are_read_in_one_wakeup_that_then_waits)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    struct coalesce c;
    ck_assert_int_eq(coalesce_start(&c, &loop, 2, 1000), 0);
    struct peer p[PEERS];
    peers_open(&loop, &c, p, PEERS);
    /* Every peer's frame is there before the loop polls: one wakeup reads them all. */
    for (int i = 0; i < PEERS; i++)
        ck_assert_int_eq(write(p[i].far, "beat", 4), 4);
    uv_run(&loop, UV_RUN_NOWAIT);
    for (int i = 0; i < PEERS; i++)
        ck_assert_uint_eq(p[i].reads, 1);
    ck_assert_uint_eq(c.iterations, 1);
    ck_assert_uint_eq(c.waits, 1);

    /* One frame alone is read at once, with no wait after it. */
    ck_assert_int_eq(write(p[0].far, "beat", 4), 4);
    uv_run(&loop, UV_RUN_ONCE);
    ck_assert_uint_eq(p[0].reads, 2);
    ck_assert_uint_eq(c.iterations, 2);
    ck_assert_uint_eq(c.waits, 1);
    peers_close(&loop, &c, p, PEERS);
}
END_TEST

/* One connection whose frames fill more than one read buffer is read several
 * times in one iteration: still one connection, so no wait. */
START_TEST(one_connection_read_many_times_in_an_iteration_does_not_wait)
{
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    struct coalesce c;
    ck_assert_int_eq(coalesce_start(&c, &loop, 2, 30000), 0);
    struct peer p[2];
    peers_open(&loop, &c, p, 2);
    static const char stream[40] = "heartbeats of one agent, more than 16";
    ck_assert_int_eq(write(p[0].far, stream, sizeof(stream)), (ssize_t)sizeof(stream));
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_uint_eq(p[0].reads, 3); /* 16 + 16 + 8 bytes */
    ck_assert_uint_eq(c.iterations, 1);
    ck_assert_uint_eq(c.waits, 0);

    /* The next iteration counts anew: two connections wait. */
    ck_assert_int_eq(write(p[0].far, "beat", 4), 4);
    ck_assert_int_eq(write(p[1].far, "beat", 4), 4);
    uv_run(&loop, UV_RUN_NOWAIT);
    ck_assert_uint_eq(c.iterations, 2);
    ck_assert_uint_eq(c.waits, 1);
    peers_close(&loop, &c, p, 2);
}
END_TEST

Suite *make_coalesce_suite(void)
{
    Suite *s = suite_create("coalesce");
    TCase *tc = tcase_create("loop");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, an_iteration_with_enough_events_waits_and_a_quieter_one_does_not);
    tcase_add_test(tc, frames_ready_together_are_read_in_one_wakeup_that_then_waits);
    tcase_add_test(tc, one_connection_read_many_times_in_an_iteration_does_not_wait);
    suite_add_tcase(s, tc);
    return s;
}
