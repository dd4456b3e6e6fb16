/*
 * failslow: the rule that names a rank slow (daemon/failslow.h) on
 * synthetic figures, and musterd applying it to heartbeats' time splits
 * (daemon/rdv_slow.c): the events, the evidence, /v1/status's slow_ranks.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "daemon/failslow.h"
#include "daemon/rdv.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* Which of x stand out, as a string of 0s and 1s. */
static const char *flags(const double *x, size_t n, int *count)
{
    static char out[64];
    uint8_t f[64];
    double med, spread;
    *count = failslow_outliers(x, n, f, &med, &spread);
    for (size_t i = 0; i < n; i++)
        out[i] = f[i] ? '1' : '0';
    out[n] = 0;
    return out;
}

START_TEST(one_slow_rank_stands_out)
{
    const double x[] = {0.30, 0.30, 0.31, 0.42};
    uint8_t f[4];
    double med, spread;
    int n;
    ck_assert_str_eq(flags(x, N(x), &n), "0001");
    ck_assert_int_eq(n, 1);
    failslow_outliers(x, N(x), f, &med, &spread);
    ck_assert_double_eq_tol(med, 0.305, 1e-9);
    ck_assert_double_eq_tol(spread, 1.4826 * 0.005, 1e-9);
    ck_assert_double_eq_tol(failslow_peers(x, N(x), 3), 0.30, 1e-9);
    ck_assert_double_eq_tol(failslow_peers(x, N(x), 0), 0.31, 1e-9);
}
END_TEST

START_TEST(alike_ranks_stand_out_for_nothing)
{
    const double noise[] = {0.30, 0.31, 0.29, 0.305, 0.298, 0.302, 0.311, 0.296};
    const double tight[] = {1.0, 1.0, 1.0, 1.05}; /* no spread at all: the margin holds */
    const double noisy[] = {1.0, 1.5, 0.7, 1.25, 0.9, 1.35}; /* a wide spread: 1.5 is within it */
    int n;
    ck_assert_str_eq(flags(noise, N(noise), &n), "00000000");
    ck_assert_str_eq(flags(tight, N(tight), &n), "0000");
    ck_assert_str_eq(flags(noisy, N(noisy), &n), "000000");
    ck_assert_int_eq(n, 0);
}
END_TEST

START_TEST(the_rule_is_robust_to_the_slow_ones)
{
    const double extreme[] = {1, 1, 1, 1, 100}; /* the median and spread stay the others' */
    const double two[] = {1.0, 1.01, 0.99, 1.0, 1.02, 0.98, 1.5, 2.0};
    int n;
    ck_assert_str_eq(flags(extreme, N(extreme), &n), "00001");
    ck_assert_str_eq(flags(two, N(two), &n), "00000011");
    ck_assert_int_eq(n, 2);
    /* two figures name nobody: each is the other's only peer */
    const double pair[] = {1, 10};
    ck_assert_str_eq(flags(pair, N(pair), &n), "00");
    ck_assert_int_eq(n, 0);
}
END_TEST

START_TEST(windows_in_a_row_start_and_end_it)
{
    struct failslow_state s = {0};
    uint64_t at = 100;
    for (int i = 1; i < FAILSLOW_WINDOWS; i++, at += 10)
        ck_assert_int_eq(failslow_note(&s, 1, at), FAILSLOW_SAME);
    ck_assert_int_eq(failslow_note(&s, 0, at), FAILSLOW_SAME); /* broken: starts over */
    const uint64_t first = at += 10;
    for (int i = 1; i < FAILSLOW_WINDOWS; i++, at += 10)
        ck_assert_int_eq(failslow_note(&s, 1, at), FAILSLOW_SAME);
    ck_assert_int_eq(failslow_note(&s, 1, at += 10), FAILSLOW_STARTS);
    ck_assert_int_eq(s.slow, 1);
    ck_assert_uint_eq(s.since, first); /* from the run's first window */
    for (int i = 1; i < FAILSLOW_WINDOWS; i++)
        ck_assert_int_eq(failslow_note(&s, 0, at += 10), FAILSLOW_SAME);
    ck_assert_int_eq(failslow_note(&s, 1, at += 10), FAILSLOW_SAME); /* still slow */
    ck_assert_uint_eq(s.since, first);
    for (int i = 1; i < FAILSLOW_WINDOWS; i++)
        ck_assert_int_eq(failslow_note(&s, 0, at += 10), FAILSLOW_SAME);
    ck_assert_int_eq(failslow_note(&s, 0, at += 10), FAILSLOW_ENDS);
    ck_assert_int_eq(s.slow, 0);
}
END_TEST

/* ---- musterd: the rule over heartbeats (rdv_slow.c) ---------------------- */

static struct rdv rdv;
static struct job_spec spec;

static void nop_send(void *ctx, const char *node, const struct proto_msg *m) { (void)ctx, (void)node, (void)m; }
static void nop_disconnect(void *ctx, const char *node, const char *why) { (void)ctx, (void)node, (void)why; }
static void nop_changed(void *ctx, int persist) { (void)ctx, (void)persist; }

static void hello(const char *name, uint64_t now)
{
    struct proto_hello h;
    char code[32], reason[PROTO_REASON_MAX];
    memset(&h, 0, sizeof(h));
    snprintf(h.node, sizeof(h.node), "%s", name);
    snprintf(h.addr, sizeof(h.addr), "127.0.0.1");
    h.ndevices = 2;
    h.devices[1] = 1;
    h.free_port = 29500u + 2u * (uint32_t)(name[0] - 'a');
    ck_assert_int_eq(rdv_join(&rdv, &h, now, code, reason), 0);
}

/* Node's two ranks' entries: step, and a window of 10 steps in split_s seconds of which
 * they computed compute[0] and compute[1] seconds per step (split_s 0: no split). */
static void beat(const char *node, uint64_t now, uint64_t step, double split_s, const double *compute)
{
    static struct proto_msg m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_HEARTBEAT;
    m.u.heartbeat.generation = rdv.generation;
    m.u.heartbeat.seq = now;
    m.u.heartbeat.free_port = 29500u + 2u * (uint32_t)(node[0] - 'a');
    m.u.heartbeat.nranks = 2;
    for (uint32_t i = 0; i < 2; i++) {
        struct proto_rank_beat *b = &m.u.heartbeat.ranks[i];
        b->rank = (node[0] - 'a') * 2u + i;
        b->state = PROTO_RANK_RUNNING;
        b->step = step;
        b->loss = 1;
        if (split_s > 0) {
            b->split_s = split_s;
            b->split_steps = 10;
            b->split[PROTO_SPLIT_COMPUTE] = compute[i] * 10 / split_s;
            b->split[PROTO_SPLIT_COLLECTIVE] = 1 - b->split[PROTO_SPLIT_COMPUTE];
        }
    }
    rdv_message(&rdv, node, &m, now);
}

static int events_of(const char *kind, char *last, size_t cap)
{
    int n = 0;
    for (uint64_t i = 0; i < rdv.nevents && i < RDV_EVENTS; i++)
        if (strcmp(rdv.events[i].kind, kind) == 0) {
            n++;
            snprintf(last, cap, "%s", rdv.events[i].message);
        }
    return n;
}

START_TEST(musterd_names_the_rank_that_computes_longest_and_unnames_it)
{
    uint64_t now = 1000;
    job_spec_defaults(&spec);
    snprintf(spec.name, sizeof(spec.name), "t");
    spec.nodes = 2;
    json_t *job = json_pack("{s:s, s:i}", "name", "t", "nodes", 2);
    struct rdv_ops ops = {.ctx = NULL, .send = nop_send, .disconnect = nop_disconnect, .changed = nop_changed};
    ck_assert_int_eq(rdv_init(&rdv, &spec, job, &ops, now), 0);
    json_decref(job);
    hello("a", now);
    hello("b", now);
    beat("a", now, 1, 0, NULL);
    beat("b", now, 1, 0, NULL);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);

    const double fast[] = {0.30, 0.30}, slow_b[] = {0.31, 0.42};
    char msg[PROTO_REASON_MAX] = "";
    uint64_t step = 1;
    int w;
    for (w = 1; w <= 10 && !events_of("rank_slow", msg, sizeof(msg)); w++) {
        now += 5000;
        step += 10;
        beat("a", now, step, 5.0 + 1e-3 * w, fast); /* each window's figures differ a little */
        beat("b", now, step, 5.0 + 1e-3 * w, slow_b);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(w - 1, FAILSLOW_WINDOWS); /* named at the last window of the run */
    char want[PROTO_REASON_MAX];
    snprintf(want, sizeof(want), "rank 3 on node b is slow: computes 0.42 s per step where its peers compute 0.3 s "
             "(1.4x), for the last %d steps", FAILSLOW_WINDOWS * 10);
    ck_assert_str_eq(msg, want);
    ck_assert_int_eq(rdv.ranks[3].slow.slow, 1);
    ck_assert_int_eq(rdv.ranks[2].slow.slow, 0);
    json_t *slow = rdv_slow_json(&rdv, now);
    ck_assert_int_eq(json_array_size(slow), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(slow, 0), "rank")), 3);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(slow, 0), "node")), "b");
    json_decref(slow);

    /* a keepalive repeating the same window is no new window: nothing moves */
    now += 400;
    beat("b", now, step, 5.0 + 1e-3 * (w - 1), slow_b);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.ranks[3].split_seq, rdv.ranks[3].split_judged);

    /* alike again: no longer slow after as many windows */
    for (w = 1; w <= 10 && !events_of("rank_slow_ended", msg, sizeof(msg)); w++) {
        now += 5000;
        step += 10;
        beat("a", now, step, 5.0 + 1e-3 * w, fast); /* each window's figures differ a little */
        beat("b", now, step, 5.0 + 1e-3 * w, fast);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(w - 1, FAILSLOW_WINDOWS);
    ck_assert_msg(strncmp(msg, "rank 3 on node b is no longer slow: computes 0.3 s per step", 59) == 0 &&
                  strstr(msg, "; it was slow for ") != NULL, "%s", msg);
    ck_assert_int_eq(events_of("rank_slow", msg, sizeof(msg)), 1);
    slow = rdv_slow_json(&rdv, now);
    ck_assert_int_eq(json_array_size(slow), 0);
    json_decref(slow);
    rdv_free(&rdv);
}
END_TEST

Suite *make_failslow_suite(void)
{
    Suite *s = suite_create("failslow");
    TCase *tc = tcase_create("rule");
    tcase_add_test(tc, one_slow_rank_stands_out);
    tcase_add_test(tc, alike_ranks_stand_out_for_nothing);
    tcase_add_test(tc, the_rule_is_robust_to_the_slow_ones);
    tcase_add_test(tc, windows_in_a_row_start_and_end_it);
    suite_add_tcase(s, tc);
    tc = tcase_create("musterd");
    tcase_add_test(tc, musterd_names_the_rank_that_computes_longest_and_unnames_it);
    suite_add_tcase(s, tc);
    return s;
}
