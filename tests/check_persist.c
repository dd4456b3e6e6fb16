/*
 * persist: group commit of the state file, on a loop made inside each test
 * with a real directory. A burst of requests costs a bounded number of
 * writes; equal content costs none; on_durable never reports a request
 * before the file on disk holds it; a directory that cannot be written is
 * reported, lets the held frames go and does not keep the loop alive once
 * closed.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "daemon/persist.h"
#include "daemon/state.h"

#define BURST 1000

static uv_loop_t loop;
static struct persist ps;
static struct rdv rdv;
static struct job_spec spec;
static char dir[64];

/* What each sequence number stood for, and what on_durable saw. */
static uint64_t gen_of_seq[BURST + 2];
static uint64_t durable_seq;
static int ndurable;

static void nop_send(void *ctx, const char *node, const struct proto_msg *m) {}
static void nop_disconnect(void *ctx, const char *node, const char *why) {}
static void nop_changed(void *ctx, int persist) {}

/* The file on disk must already hold the state of every request up to seq. */
static void check_durable(void *ctx, uint64_t seq)
{
    static struct rdv_saved saved;
    char err[512];
    ck_assert_uint_ge(seq, durable_seq);
    ck_assert_int_eq(state_read(dir, &saved, err, sizeof(err)), 0);
    ck_assert_uint_le(seq, BURST + 1);
    ck_assert_uint_ge(saved.generation, gen_of_seq[seq]);
    durable_seq = seq;
    ndurable++;
}

static void count_durable(void *ctx, uint64_t seq)
{
    durable_seq = seq;
    ndurable++;
}

static void setup(void)
{
    job_spec_defaults(&spec);
    snprintf(spec.name, sizeof(spec.name), "t");
    spec.nodes = 2;
    json_t *job = json_pack("{s:s}", "name", "t");
    struct rdv_ops ops = {.send = nop_send, .disconnect = nop_disconnect, .changed = nop_changed};
    ck_assert_int_eq(rdv_init(&rdv, &spec, job, &ops, 0), 0);
    json_decref(job);
    snprintf(dir, sizeof(dir), "/tmp/check-persist.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    memset(gen_of_seq, 0, sizeof(gen_of_seq));
    durable_seq = 0;
    ndurable = 0;
}

static void teardown(void)
{
    persist_close(&ps);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    persist_free(&ps);
    rdv_free(&rdv);
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE_NAME);
    unlink(path);
    rmdir(dir);
}

START_TEST(burst_costs_a_bounded_number_of_writes)
{
    ck_assert_int_eq(persist_init(&ps, &loop, dir, check_durable, NULL), 0);
    uint64_t last = 0;
    for (uint64_t g = 1; g <= BURST; g++) {
        rdv.generation = g;
        last = persist_request(&ps, &rdv);
        ck_assert_uint_le(last, BURST);
        gen_of_seq[last] = g;
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    /* One write starts at once; all the others fold into the next. */
    ck_assert_uint_le(ps.writes, 2);
    ck_assert_uint_eq(ps.failures, 0);
    ck_assert_uint_eq(durable_seq, last);
    static struct rdv_saved saved;
    char err[512];
    ck_assert_int_eq(state_read(dir, &saved, err, sizeof(err)), 0);
    ck_assert_uint_eq(saved.generation, BURST);
}
END_TEST

START_TEST(equal_content_costs_no_write)
{
    ck_assert_int_eq(persist_init(&ps, &loop, dir, check_durable, NULL), 0);
    rdv.generation = 7;
    uint64_t a = persist_request(&ps, &rdv);
    gen_of_seq[a] = 7;
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_uint_eq(ps.writes, 1);
    /* Unchanged: reported durable, nothing written. */
    uint64_t same = 0;
    for (int i = 0; i < 100; i++) {
        same = persist_request(&ps, &rdv);
        gen_of_seq[same] = 7;
    }
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_uint_eq(ps.writes, 1);
    ck_assert_uint_eq(durable_seq, same);
    rdv.restarts = 1;
    uint64_t b = persist_request(&ps, &rdv);
    ck_assert_uint_gt(b, a);
    gen_of_seq[b] = 7;
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_uint_eq(ps.writes, 2);
    ck_assert_uint_eq(durable_seq, b);
}
END_TEST

/* Requests spread over time: writes start at most every PERSIST_SPACING_MS. */
static int ticks;
static void on_tick(uv_timer_t *t)
{
    rdv.generation++;
    gen_of_seq[persist_request(&ps, &rdv)] = rdv.generation;
    if (++ticks == 100)
        uv_close((uv_handle_t *)t, NULL);
}

START_TEST(writes_are_spaced)
{
    ck_assert_int_eq(persist_init(&ps, &loop, dir, check_durable, NULL), 0);
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    ticks = 0;
    uint64_t t0 = uv_now(&loop);
    uv_timer_start(&t, on_tick, 1, 1); /* 100 requests over ~100 ms */
    uv_run(&loop, UV_RUN_DEFAULT);
    uint64_t took = uv_now(&loop) - t0 + PERSIST_SPACING_MS;
    ck_assert_uint_le(ps.writes, took / PERSIST_SPACING_MS + 1);
    ck_assert_uint_lt(ps.writes, 100);
    static struct rdv_saved saved;
    char err[512];
    ck_assert_int_eq(state_read(dir, &saved, err, sizeof(err)), 0);
    ck_assert_uint_eq(saved.generation, rdv.generation);
}
END_TEST

START_TEST(unwritable_directory_is_reported_and_lets_frames_go)
{
    rmdir(dir);
    snprintf(dir, sizeof(dir), "/nonexistent/check-persist");
    ck_assert_int_eq(persist_init(&ps, &loop, dir, count_durable, NULL), 0);
    rdv.generation = 3;
    uint64_t seq = persist_request(&ps, &rdv);
    ck_assert_uint_gt(seq, 0);
    uv_run(&loop, UV_RUN_ONCE); /* the write fails on the pool; its callback runs */
    while (ndurable == 0 && uv_run(&loop, UV_RUN_ONCE))
        ;
    ck_assert_int_ge(ps.failures, 1);
    ck_assert_uint_eq(durable_seq, seq);
    ck_assert_uint_eq(ps.writes, 0);
    /* teardown closes it: the retry timer must not keep the loop alive. */
}
END_TEST

/* A sink (etcd) that refuses its first writes, then takes them. */
static int sink_refusals, sink_writes;
static uint64_t sink_generation;
static int refusing_sink(void *ctx, const struct rdv_saved *s, char *err, size_t errlen)
{
    if (sink_refusals > 0) {
        sink_refusals--;
        snprintf(err, errlen, "no quorum");
        return -EIO;
    }
    sink_writes++;
    sink_generation = s->generation;
    return 0;
}

/* With a store shared by several musterd, a failed write holds its frames
 * until a later write makes the state durable there. */
START_TEST(sink_failure_holds_frames_until_a_write_succeeds)
{
    ck_assert_int_eq(persist_init(&ps, &loop, dir, count_durable, NULL), 0);
    persist_set_sink(&ps, refusing_sink, NULL);
    sink_refusals = 1;
    sink_writes = 0;
    rdv.generation = 5;
    uint64_t seq = persist_request(&ps, &rdv);
    while (ps.failures == 0 && uv_run(&loop, UV_RUN_ONCE))
        ;
    ck_assert_int_eq(ps.failures, 1);
    ck_assert_int_eq(ndurable, 0); /* nothing released on the failure */
    while (ndurable == 0 && uv_run(&loop, UV_RUN_ONCE))
        ;
    ck_assert_int_eq(sink_writes, 1);
    ck_assert_uint_eq(sink_generation, 5);
    ck_assert_uint_eq(durable_seq, seq);
    /* The file was never written: the sink replaces it. */
    char path[128];
    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE_NAME);
    ck_assert_int_ne(access(path, F_OK), 0);
}
END_TEST

Suite *make_persist_suite(void)
{
    Suite *s = suite_create("persist");
    TCase *tc = tcase_create("persist");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, burst_costs_a_bounded_number_of_writes);
    tcase_add_test(tc, equal_content_costs_no_write);
    tcase_add_test(tc, writes_are_spaced);
    tcase_add_test(tc, unwritable_directory_is_reported_and_lets_frames_go);
    tcase_add_test(tc, sink_failure_holds_frames_until_a_write_succeeds);
    suite_add_tcase(s, tc);
    return s;
}
