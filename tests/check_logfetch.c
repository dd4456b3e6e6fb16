/*
 * logfetch: the loop's side of GET /v1/ranks/{rank}/log, driven with fake
 * ops (ranks 0-1 on node a, 2-3 on node b) on a loop made inside each test:
 * what LOG_REQUEST goes out, how each answer and each failure (no such rank,
 * node gone, timeout, too many, shutdown) completes the request, and that
 * the loop closes cleanly afterwards.
 */
#include <check.h>
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <uv.h>

#include "daemon/logfetch.h"

#define NREQ 64

static struct {
    pthread_mutex_t lock;
    bool b_connected;
    int nsent;
    struct proto_log_request sent[NREQ];
    char sent_to[NREQ][PROTO_NAME_MAX];
    int ndone;
} fx = {.lock = PTHREAD_MUTEX_INITIALIZER};

static uv_loop_t loop;
static struct logfetch lf;
static struct logfetch_req reqs[NREQ];

static int fake_locate(void *ctx, uint32_t rank, char node[PROTO_NAME_MAX], bool *connected, char *why, size_t cap)
{
    if (rank >= 4) {
        snprintf(why, cap, "rank %u is not in generation 1, which has ranks 0..3", rank);
        return -ENOENT;
    }
    snprintf(node, PROTO_NAME_MAX, "%s", rank < 2 ? "a" : "b");
    *connected = rank < 2 || fx.b_connected;
    return 0;
}

static void fake_send(void *ctx, const char *node, const struct proto_msg *m)
{
    ck_assert_int_eq(m->type, PROTO_LOG_REQUEST);
    pthread_mutex_lock(&fx.lock);
    fx.sent[fx.nsent] = m->u.log_request;
    snprintf(fx.sent_to[fx.nsent], PROTO_NAME_MAX, "%s", node);
    fx.nsent++;
    pthread_mutex_unlock(&fx.lock);
}

static void on_done(struct logfetch_req *req)
{
    ck_assert_uint_ne(req->status, 0);
    ck_assert_ptr_nonnull(req->body);
    pthread_mutex_lock(&fx.lock);
    fx.ndone++;
    pthread_mutex_unlock(&fx.lock);
}

static int done_count(void)
{
    pthread_mutex_lock(&fx.lock);
    int n = fx.ndone;
    pthread_mutex_unlock(&fx.lock);
    return n;
}

static void setup(void)
{
    memset(reqs, 0, sizeof(reqs));
    fx.b_connected = true;
    fx.nsent = fx.ndone = 0;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    struct logfetch_ops ops = {.ctx = NULL, .locate = fake_locate, .send = fake_send};
    ck_assert_int_eq(logfetch_init(&lf, &loop, &ops), 0);
}

static void teardown(void)
{
    logfetch_close(&lf);
    uv_run(&loop, UV_RUN_DEFAULT);
    logfetch_destroy(&lf);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    for (int i = 0; i < NREQ; i++)
        free(reqs[i].body);
}

static struct logfetch_req *submit(int i, uint32_t rank, uint64_t offset, uint32_t tail)
{
    struct logfetch_req *r = &reqs[i];
    r->rank = rank;
    r->generation = 0;
    r->offset = offset;
    r->tail = tail;
    r->max = 1000;
    r->done = on_done;
    logfetch_submit(&lf, r);
    return r;
}

/* The loop takes what was submitted. */
static void turn(void)
{
    uv_run(&loop, UV_RUN_NOWAIT);
}

/* status and the body's "error" (or "data" when 200). */
static void assert_answer(const struct logfetch_req *r, unsigned status, const char *field, const char *want)
{
    ck_assert_uint_eq(r->status, status);
    json_t *doc = json_loads(r->body, 0, NULL);
    ck_assert_msg(doc != NULL, "body is not JSON: %s", r->body);
    const char *got = json_string_value(json_object_get(doc, field));
    ck_assert_msg(got && strcmp(got, want) == 0, "%s: want \"%s\" in %s", field, want, r->body);
    json_decref(doc);
}

static void answer(uint32_t id, const char *node, uint32_t rank, enum proto_log_error error, const char *data)
{
    struct proto_log_data d = {.id = id, .rank = rank, .generation = 2, .newest = 3, .offset = 10};
    d.data = (char *)data;
    d.next_offset = d.offset + strlen(data);
    d.size = d.next_offset + 5;
    d.error = error;
    if (error)
        snprintf(d.reason, sizeof(d.reason), "why %d", (int)error);
    logfetch_data(&lf, node, &d);
}

START_TEST(answered_by_the_node)
{
    struct logfetch_req *r = submit(0, 1, 0, 4096);
    ck_assert_int_eq(fx.nsent, 0); /* nothing before the loop runs */
    turn();
    ck_assert_int_eq(fx.nsent, 1);
    ck_assert_str_eq(fx.sent_to[0], "a");
    ck_assert_uint_eq(fx.sent[0].rank, 1);
    ck_assert_uint_eq(fx.sent[0].tail, 4096);
    ck_assert_uint_eq(fx.sent[0].max, 1000);
    ck_assert_int_eq(done_count(), 0);

    /* An answer from another node, or for another id, is not this one's. */
    answer(fx.sent[0].id, "b", 1, PROTO_LOG_OK, "x");
    answer(fx.sent[0].id + 1, "a", 1, PROTO_LOG_OK, "x");
    ck_assert_int_eq(done_count(), 0);
    answer(fx.sent[0].id, "a", 1, PROTO_LOG_OK, "line\n");
    ck_assert_int_eq(done_count(), 1);
    assert_answer(r, 200, "data", "line\n");
    json_t *doc = json_loads(r->body, 0, NULL);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "rank")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "node")), "a");
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "generation")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "newest_generation")), 3);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "offset")), 10);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "next_offset")), 15);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "size")), 20);
    json_decref(doc);

    /* The same answer again is late: dropped. */
    answer(fx.sent[0].id, "a", 1, PROTO_LOG_OK, "line\n");
    ck_assert_int_eq(done_count(), 1);
}
END_TEST

START_TEST(each_failure_has_its_status)
{
    struct logfetch_req *unknown = submit(0, 9, 0, 0);
    fx.b_connected = false;
    struct logfetch_req *away = submit(1, 2, 0, 0);
    turn();
    assert_answer(unknown, 404, "error", "no such rank");
    assert_answer(unknown, 404, "detail", "rank 9 is not in generation 1, which has ranks 0..3");
    assert_answer(away, 503, "error", "node not connected");
    ck_assert_int_eq(fx.nsent, 0);

    struct {
        enum proto_log_error error;
        unsigned status;
        const char *text;
    } cases[] = {
        {PROTO_LOG_NO_LOG, 404, "no log"},
        {PROTO_LOG_BEYOND_END, 416, "offset beyond the end"},
        {PROTO_LOG_UNREADABLE, 502, "log unreadable"},
        {PROTO_LOG_BUSY, 503, "node busy"},
    };
    for (int i = 0; i < 4; i++) {
        struct logfetch_req *r = submit(2 + i, 0, 5, 0);
        turn();
        answer(fx.sent[i].id, "a", 0, cases[i].error, "");
        assert_answer(r, cases[i].status, "error", cases[i].text);
    }
    assert_answer(&reqs[2], 404, "detail", "why 1");
}
END_TEST

START_TEST(node_lost_or_silent)
{
    struct logfetch_req *on_a = submit(0, 0, 0, 0), *on_b = submit(1, 3, 0, 0);
    turn();
    ck_assert_int_eq(fx.nsent, 2);
    logfetch_node_lost(&lf, "b");
    assert_answer(on_b, 503, "error", "node not connected");
    ck_assert_int_eq(done_count(), 1);

    uint64_t now = uv_now(&loop);
    logfetch_tick(&lf, now + LOGFETCH_TIMEOUT_MS - 1);
    ck_assert_int_eq(done_count(), 1);
    logfetch_tick(&lf, now + LOGFETCH_TIMEOUT_MS);
    assert_answer(on_a, 504, "error", "node did not answer");
    ck_assert_int_eq(done_count(), 2);
}
END_TEST

START_TEST(in_flight_is_bounded)
{
    for (int i = 0; i < LOGFETCH_MAX_INFLIGHT; i++)
        submit(i, (uint32_t)(i % 4), 0, 0);
    ck_assert_int_eq(done_count(), 0);
    struct logfetch_req *extra = submit(LOGFETCH_MAX_INFLIGHT, 0, 0, 0);
    assert_answer(extra, 503, "error", "too many log requests in flight"); /* at once, before the loop */
    turn();
    ck_assert_int_eq(fx.nsent, LOGFETCH_MAX_INFLIGHT);
    logfetch_node_lost(&lf, "b"); /* half of them end */
    ck_assert_int_eq(done_count(), 1 + LOGFETCH_MAX_INFLIGHT / 2);
    struct logfetch_req *again = submit(LOGFETCH_MAX_INFLIGHT + 1, 1, 0, 0);
    turn();
    ck_assert_uint_eq(again->status, 0);
    ck_assert_int_eq(fx.nsent, LOGFETCH_MAX_INFLIGHT + 1);
}
END_TEST

START_TEST(shutdown_answers_everything)
{
    struct logfetch_req *sent = submit(0, 0, 0, 0);
    turn();
    struct logfetch_req *queued = submit(1, 2, 0, 0); /* the loop has not taken it */
    logfetch_close(&lf);
    assert_answer(sent, 503, "error", "shutting down");
    assert_answer(queued, 503, "error", "shutting down");
    struct logfetch_req *late = submit(2, 1, 0, 0);
    assert_answer(late, 503, "error", "shutting down");
    ck_assert_int_eq(done_count(), 3);
    ck_assert_int_eq(fx.nsent, 1);
}
END_TEST

/* Requests from another thread while the loop runs: each is sent once, and answered. */
static void *submitter(void *arg)
{
    for (int i = 0; i < 20; i++)
        submit(i, (uint32_t)(i % 4), (uint64_t)i, 0);
    return NULL;
}

static void on_poll(uv_timer_t *t)
{
    pthread_mutex_lock(&fx.lock);
    int n = fx.nsent;
    pthread_mutex_unlock(&fx.lock);
    if (n == 20)
        uv_stop(&loop);
}

START_TEST(submitted_from_another_thread)
{
    pthread_t th;
    static uv_timer_t poll; /* closed by the fixture's last uv_run */
    uv_timer_init(&loop, &poll);
    uv_timer_start(&poll, on_poll, 1, 1);
    ck_assert_int_eq(pthread_create(&th, NULL, submitter, NULL), 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    pthread_join(th, NULL);
    ck_assert_int_eq(fx.nsent, 20);
    for (int i = 0; i < 20; i++)
        answer(fx.sent[i].id, fx.sent_to[i], fx.sent[i].rank, PROTO_LOG_OK, "ok");
    ck_assert_int_eq(done_count(), 20);
    for (int i = 0; i < 20; i++)
        assert_answer(&reqs[i], 200, "data", "ok");
    uv_close((uv_handle_t *)&poll, NULL);
}
END_TEST

Suite *make_logfetch_suite(void)
{
    Suite *s = suite_create("logfetch");
    TCase *tc = tcase_create("requests");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, answered_by_the_node);
    tcase_add_test(tc, each_failure_has_its_status);
    tcase_add_test(tc, node_lost_or_silent);
    tcase_add_test(tc, in_flight_is_bounded);
    tcase_add_test(tc, shutdown_answers_everything);
    tcase_add_test(tc, submitted_from_another_thread);
    suite_add_tcase(s, tc);
    return s;
}
