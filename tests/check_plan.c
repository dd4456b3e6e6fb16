/*
 * The planner (common/plan.h) against what the code really does, on CPU:
 * N ranks as threads of this process over the TCP ring on loopback.
 *
 *   - model state and transient buffers per rank: what zero_init allocates,
 *     buffer by buffer (malloc_usable_size), for tiny, small and gpt2-124m
 *     at N = 1, 2, 3, 8;
 *   - bytes per step: what the ring backend counts (comm_get_stats) over one
 *     step of train_run, vote included, exactly, for the same presets and N;
 *   - activations: what gpt_create_shell carves;
 *   - predicted peak: within 15 % of the RSS a real run grows by;
 *   - bad input: named errors.
 */
#include <check.h>
#include <errno.h>
#include <malloc.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/plan.h"
#include "common/zeroshard.h"
#include "worker/train/comm/comm.h"
#include "worker/train/layers.h"
#include "worker/train/replica.h"
#include "worker/train/train.h"

/* Generated text the trainers read: one path per test, removed after it. */
static char textpath[] = "/tmp/check-plan-text-XXXXXX";
#define TEXT_BYTES 200000

static void setup(void)
{
    int fd = mkstemp(textpath);
    ck_assert_int_ge(fd, 0);
    FILE *f = fdopen(fd, "wb");
    ck_assert_ptr_nonnull(f);
    unsigned x = 7;
    for (size_t n = 0; n < TEXT_BYTES; n++) {
        x = x * 1103515245u + 12345u;
        fputc('a' + (int)((x >> 16) % 26), f);
    }
    fclose(f);
    setenv("MUSTER_COMM_ADDR", "127.0.0.1", 1);
    layers_set_threads(1);
}

static void teardown(void)
{
    unlink(textpath);
    strcpy(textpath, "/tmp/check-plan-text-XXXXXX");
}

static struct plan plan_of(const char *model, int world, int batch, int micro, int seq)
{
    struct job_spec s;
    struct plan_input in;
    struct plan p;
    char err[256];
    job_spec_defaults(&s);
    snprintf(s.model, sizeof(s.model), "%s", model);
    s.batch = batch;
    s.micro_batch = micro;
    s.seq_len = seq;
    s.nodes = world;
    ck_assert_int_eq(plan_input_from_spec(&in, &s, err, sizeof(err)), 0);
    ck_assert_msg(plan_compute(&in, &p, err, sizeof(err)) == 0, "%s", err);
    return p;
}

/* ---- N ranks as threads ---- */

struct world {
    const char *model;
    int n, batch, micro, seq, train; /* train: one train_run step, else zero_init only */
    uint8_t id[COMM_ID_BYTES];
    int id_ready, id_rc;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* per rank */
    int rc[8];
    char err[8][256];
    uint64_t state[8], transient[8], sent[8], recv[8];
};

struct rank_arg {
    struct world *w;
    int rank;
};

/* The allocation behind p holds at least want bytes, and not a page more. */
static int holds(const void *p, size_t want)
{
    size_t got = p ? malloc_usable_size((void *)p) : 0;
    return got >= want && got <= want + 4096;
}

static void zero_only(struct world *w, int r, struct comm *c)
{
    struct gpt_config cfg;
    struct gpt g;
    struct zero z;
    gpt_preset(w->model, &cfg);
    ck_assert_int_eq(gpt_create_shell(&g, &cfg, 1, 1), 0);
    ck_assert_int_eq(zero_init(&z, &g, c), 0);
    /* what zero_init allocated, buffer by buffer */
    const size_t F = sizeof(float), N = (size_t)w->n;
    size_t big = 0;
    for (int u = 1; u < g.layout.nunits; u++)
        big = z.plan.shard[u] > big ? z.plan.shard[u] : big;
    /* weights and both moments are one block (a replica round sends it at once) */
    const size_t total = z.plan.total;
    int ok = holds(z.params, 3 * F * total) && z.m == z.params + total && z.v == z.params + 2 * total &&
             holds(z.grads, F * total);
    w->state[r] = 4 * F * total;
    if (N > 1) {
        /* the slots: every gathered unit, embedding chunk and full gradient */
        for (int k = 0; k < ZERO_SLOTS; k++)
            ok = ok && holds(z.slot[k], F * N * big);
        w->transient[r] = ZERO_SLOTS * F * N * big;
    }
    if (!ok) {
        w->rc[r] = -1;
        snprintf(w->err[r], sizeof(w->err[r]), "an allocation of zero_init is not the size its fields say");
    }
    zero_free(&z);
    gpt_destroy(&g);
}

static void one_step(struct world *w, int r, struct comm *c)
{
    struct job_spec s;
    struct trainer tr;
    job_spec_defaults(&s);
    snprintf(s.model, sizeof(s.model), "%s", w->model);
    snprintf(s.data, sizeof(s.data), "%s", textpath);
    s.batch = w->batch;
    s.micro_batch = w->micro;
    s.seq_len = w->seq;
    s.steps = 100;
    s.eval_every = 0;
    s.val_fraction = 0;
    int rc = trainer_init(&tr, &s, r, w->n, c, w->err[r], sizeof(w->err[r]));
    if (rc) {
        w->rc[r] = rc;
        return;
    }
    struct comm_stats before = {0}, after = {0};
    if (c)
        comm_get_stats(c, &before);
    volatile sig_atomic_t stop = 0;
    w->rc[r] = train_run(&tr, 1, NULL, &stop, w->err[r], sizeof(w->err[r]));
    if (c)
        comm_get_stats(c, &after);
    w->sent[r] = after.bytes_sent - before.bytes_sent;
    w->recv[r] = after.bytes_recv - before.bytes_recv;
    trainer_free(&tr);
}

static void *rank_main(void *arg)
{
    struct rank_arg *a = arg;
    struct world *w = a->w;
    struct comm *c = NULL;
    layers_set_threads(1);
    if (w->n > 1) {
        pthread_mutex_lock(&w->mu);
        if (a->rank == 0) {
            w->id_rc = comm_unique_id(COMM_RING, w->id);
            w->id_ready = 1;
            pthread_cond_broadcast(&w->cv);
        }
        while (!w->id_ready)
            pthread_cond_wait(&w->cv, &w->mu);
        pthread_mutex_unlock(&w->mu);
        int rc = w->id_rc ? w->id_rc : comm_init(&c, COMM_RING, a->rank, w->n, w->id, 30000);
        if (rc) {
            w->rc[a->rank] = rc;
            snprintf(w->err[a->rank], sizeof(w->err[a->rank]), "comm: %s", comm_strerror(rc));
            return NULL;
        }
        comm_set_timeout(c, 30000);
    }
    if (w->train)
        one_step(w, a->rank, c);
    else
        zero_only(w, a->rank, c);
    comm_destroy(c);
    return NULL;
}

static void run(struct world *w)
{
    pthread_t th[8];
    struct rank_arg args[8];
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    for (int r = 0; r < w->n; r++) {
        args[r] = (struct rank_arg){w, r};
        ck_assert_int_eq(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int r = 0; r < w->n; r++)
        pthread_join(th[r], NULL);
    for (int r = 0; r < w->n; r++)
        ck_assert_msg(w->rc[r] == 0, "%s at N=%d, rank %d: %s", w->model, w->n, r, w->err[r]);
    pthread_mutex_destroy(&w->mu);
    pthread_cond_destroy(&w->cv);
}

static const char *const presets[] = {"tiny", "small", "gpt2-124m"};
static const int worlds[] = {1, 2, 3, 8};

START_TEST(model_state_and_buffers_are_what_zero_allocates)
{
    for (size_t m = 0; m < 3; m++)
        for (size_t k = 0; k < 4; k++) {
            struct world w = {.model = presets[m], .n = worlds[k]};
            run(&w);
            struct plan p = plan_of(presets[m], w.n, w.n, 1, 1);
            for (int r = 0; r < w.n; r++) {
                ck_assert_msg(p.state == w.state[r], "%s N=%d: plan says model state %llu B, zero_init allocated %llu",
                              presets[m], w.n, (unsigned long long)p.state, (unsigned long long)w.state[r]);
                ck_assert_msg(p.transient == w.transient[r],
                              "%s N=%d: plan says transient %llu B, zero_init allocated %llu", presets[m], w.n,
                              (unsigned long long)p.transient, (unsigned long long)w.transient[r]);
            }
        }
}
END_TEST

/* One step at batch N x micro (accum 1), and small with two micro-steps. */
START_TEST(bytes_per_step_are_what_the_ring_counts)
{
    for (size_t m = 0; m < 3; m++)
        for (size_t k = 0; k < 4; k++) {
            struct world w = {.model = presets[m], .n = worlds[k], .micro = 1, .seq = 4, .train = 1};
            w.batch = (m == 1 ? 2 : 1) * w.n; /* small accumulates two micro-steps */
            run(&w);
            struct plan p = plan_of(presets[m], w.n, w.batch, 1, 4);
            ck_assert_int_eq(p.accum, m == 1 ? 2 : 1);
            for (int r = 0; r < w.n; r++) {
                ck_assert_msg(p.sent == w.sent[r] && p.recv == w.recv[r],
                              "%s N=%d rank %d: plan says %llu B sent, %llu received per step; the ring counted "
                              "%llu and %llu", presets[m], w.n, r, (unsigned long long)p.sent,
                              (unsigned long long)p.recv, (unsigned long long)w.sent[r],
                              (unsigned long long)w.recv[r]);
            }
            if (w.n == 1)
                ck_assert_uint_eq(p.sent, 0);
        }
}
END_TEST

START_TEST(activations_are_what_the_model_carves)
{
    static const int shapes[][2] = {{1, 1}, {3, 7}, {4, 32}};
    for (size_t m = 0; m < 3; m++)
        for (size_t i = 0; i < 3; i++) {
            struct gpt_config cfg;
            struct gpt g;
            gpt_preset(presets[m], &cfg);
            int B = shapes[i][0], T = shapes[i][1];
            ck_assert_int_eq(gpt_create_shell(&g, &cfg, B, T), 0);
            /* datt is carved last */
            size_t floats = (size_t)(g.acts.datt - g.acts_mem) + (size_t)B * cfg.NH * T * T;
            uint64_t ids = 4 * (uint64_t)B * T * sizeof(int);
            ck_assert_uint_eq(plan_act_bytes(&cfg, PLAN_CPU, B, T), sizeof(float) * floats + ids);
            gpt_destroy(&g);
        }
}
END_TEST

static long rss_bytes(void)
{
    FILE *f = fopen("/proc/self/statm", "r");
    long pages = 0, rss = 0;
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fscanf(f, "%ld %ld", &pages, &rss), 2);
    fclose(f);
    return rss * sysconf(_SC_PAGESIZE);
}

/* A model-state-heavy run and an activation-heavy one, each one step of one
 * rank; OpenBLAS's own buffers are warmed up before the baseline. */
START_TEST(predicted_peak_is_within_15_percent_of_rss_growth)
{
    static const struct {
        const char *model;
        int micro, seq;
    } runs[] = {{"gpt2-124m", 1, 64}, {"small", 32, 128}};
    struct world warm = {.model = "tiny", .n = 1, .batch = 4, .micro = 4, .seq = 32, .train = 1};
    run(&warm);
    for (size_t i = 0; i < 2; i++) {
        long before = rss_bytes();
        struct world w = {.model = runs[i].model, .n = 1, .batch = runs[i].micro, .micro = runs[i].micro,
                          .seq = runs[i].seq, .train = 1};
        struct job_spec s;
        struct trainer tr;
        char err[256];
        job_spec_defaults(&s);
        snprintf(s.model, sizeof(s.model), "%s", w.model);
        snprintf(s.data, sizeof(s.data), "%s", textpath);
        s.batch = w.batch;
        s.micro_batch = w.micro;
        s.seq_len = w.seq;
        s.steps = 100;
        s.eval_every = 0;
        s.val_fraction = 0;
        ck_assert_msg(trainer_init(&tr, &s, 0, 1, NULL, err, sizeof(err)) == 0, "%s", err);
        volatile sig_atomic_t stop = 0;
        ck_assert_msg(train_run(&tr, 1, NULL, &stop, err, sizeof(err)) == 0, "%s", err);
        long grown = rss_bytes() - before;
        trainer_free(&tr);
        struct plan p = plan_of(w.model, 1, w.batch, w.micro, w.seq);
        struct plan_input in = p.in;
        in.data_tokens = TEXT_BYTES;
        ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), 0);
        double off = ((double)p.peak - (double)grown) / (double)grown;
        printf("plan: %s micro_batch %d seq_len %d: predicted peak %.1f MiB, RSS grew %.1f MiB (%+.1f %%)\n", w.model,
               w.micro, w.seq, (double)p.peak / 1048576.0, (double)grown / 1048576.0, 100 * off);
        ck_assert_msg(off > -0.15 && off < 0.15, "%s micro_batch %d: predicted peak %llu B, RSS grew %ld B (%+.1f %%)",
                      w.model, w.micro, (unsigned long long)p.peak, grown, 100 * off);
    }
}
END_TEST

START_TEST(bad_input_is_named)
{
    struct plan_input in;
    struct plan p;
    struct job_spec s;
    char err[256];
    job_spec_defaults(&s);
    snprintf(s.model, sizeof(s.model), "gpt5");
    ck_assert_int_eq(plan_input_from_spec(&in, &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "unknown preset \"gpt5\""));

    job_spec_defaults(&s);
    ck_assert_int_eq(plan_input_from_spec(&in, &s, err, sizeof(err)), 0);
    in.nodes = 0;
    ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "nodes: expected 1 to 4096, got 0");
    in.nodes = 1;
    in.network_gbit = 1e12;
    ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "network: expected"));
    in.network_gbit = 0;
    ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), -EINVAL);
    in.network_gbit = 10;
    in.devices_per_node = 65;
    ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "devices per node"));
    in.devices_per_node = 3; /* batch 16 does not divide over 3 ranks */
    ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "batch"));
}
END_TEST

/* Fits, and the largest micro-batch that fits, move with the memory. */
START_TEST(fit_and_largest_micro_batch)
{
    struct plan p = plan_of("gpt2-124m", 2, 64, 4, 1024);
    struct plan_input in = p.in;
    char err[256];
    in.device = PLAN_GPU;
    in.devices_per_node = 8;
    in.device_mem = 80ull << 30;
    ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), 0);
    ck_assert_int_eq(p.fits, 1);
    ck_assert_int_eq(p.max_micro_batch, 4); /* 64 / 16 ranks */
    in.device_mem = p.peak - 1;
    ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), 0);
    ck_assert_int_eq(p.fits, 0);
    ck_assert_int_lt(p.max_micro_batch, 4);
    in.device_mem = 1 << 20;
    ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), 0);
    ck_assert_int_eq(p.max_micro_batch, 0);
    /* against a plain search over every micro-batch, batch 720 over 2 x 8 ranks (q = 45) */
    in.batch = 720;
    in.micro_batch = 0;
    in.seq_len = 256;
    for (uint64_t mem = 64ull << 20; mem < (32ull << 30); mem = mem * 3 / 2) {
        int want = 0;
        for (int b = 45; b >= 1 && !want; b--) {
            struct plan_input one = in;
            one.micro_batch = b;
            one.device_mem = 0;
            if (45 % b == 0 && plan_compute(&one, &p, err, sizeof(err)) == 0 && p.need <= mem)
                want = b;
        }
        in.device_mem = mem;
        ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), 0);
        ck_assert_msg(p.max_micro_batch == want, "%llu B: largest micro_batch %d, a plain search says %d",
                      (unsigned long long)mem, p.max_micro_batch, want);
    }
    /* a shape whose figures would not fit 64 bits is refused, not wrapped */
    struct plan_input huge = in;
    huge.cfg = (struct gpt_config){.L = 64, .NH = 1024, .C = 65536, .T = 65536, .V = 65536};
    huge.batch = 1048576;
    huge.micro_batch = 0;
    huge.nodes = 1;
    huge.devices_per_node = 1;
    huge.seq_len = 65536;
    ck_assert_int_eq(plan_compute(&huge, &p, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "more than 2^56 bytes"));
    /* CPU ranks of a node share its memory */
    in.batch = 64;
    in.seq_len = 1024;
    in.device = PLAN_CPU;
    in.device_mem = 64ull << 30;
    ck_assert_int_eq(plan_compute(&in, &p, err, sizeof(err)), 0);
    ck_assert_uint_eq(p.need, 8 * p.peak);
}
END_TEST

/* Peer replicas (issue 12): what replica_init allocates for a rank's shards
 * is what the plan adds, with replicate_every on and a world above 1. */
START_TEST(replicas_are_counted_as_allocated)
{
    static const char *const models[] = {"tiny", "small"};
    for (int k = 0; k < 2; k++) {
        struct plan p = plan_of(models[k], 4, 8, 2, 0);
        struct plan one = plan_of(models[k], 1, 8, 2, 0);
        ck_assert_uint_eq(one.replicas, 0);
        struct zero z = {.world = 4};
        z.plan.total = (size_t)p.shard_floats;
        const size_t block = 3 * sizeof(float) * z.plan.total; /* weights and both moments */
        struct replica rep;
        ck_assert_int_eq(replica_init(&rep, &z, 1, 0), 0);
        ck_assert_uint_eq(p.replicas, 3 * block);
        ck_assert(holds(z.alt_params, block));
        ck_assert(holds(rep.slot[0], block) && holds(rep.slot[1], block));
        replica_free(&rep);
        free(z.alt_params);
        struct plan_input in = p.in;
        in.replicate_every = 0;
        struct plan off;
        char err[256];
        ck_assert_int_eq(plan_compute(&in, &off, err, sizeof(err)), 0);
        ck_assert_uint_eq(off.replicas, 0);
        ck_assert_uint_eq(off.peak + p.replicas, p.peak);
    }
}
END_TEST

Suite *make_plan_suite(void)
{
    Suite *s = suite_create("plan");
    TCase *tc = tcase_create("plan");
    tcase_set_timeout(tc, 600);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, bad_input_is_named);
    tcase_add_test(tc, fit_and_largest_micro_batch);
    tcase_add_test(tc, activations_are_what_the_model_carves);
    tcase_add_test(tc, model_state_and_buffers_are_what_zero_allocates);
    tcase_add_test(tc, bytes_per_step_are_what_the_ring_counts);
    tcase_add_test(tc, predicted_peak_is_within_15_percent_of_rss_growth);
    tcase_add_test(tc, replicas_are_counted_as_allocated);
    suite_add_tcase(s, tc);
    return s;
}
