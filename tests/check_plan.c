/*
 * The planner (common/plan.h) against what the code really does, on CPU:
 * N ranks as threads of this process over the TCP ring on loopback.
 *
 *   - model state and transient buffers per rank: what zero_init allocates,
 *     buffer by buffer (malloc_usable_size), for tiny, small and gpt2-124m
 *     at N = 1, 2, 3, 8;
 *   - bytes per step: what the ring backend counts (comm_get_stats) over one
 *     step of train_run, vote included, exactly, for the same presets and N
 *     (gpt2-124m at N = 2 alone);
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
#include "common/plan_prog.h"
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

/* One step at batch N x micro (accum 1), and small with two micro-steps.
 * gpt2-124m at N = 2 only: its odd vocabulary's padding is what it adds to
 * tiny's and small's cases, and each further world (its 124M parameters
 * gathered and reduced over loopback by every rank) cost ~15 s of CPU, more
 * than all the other cases together. */
START_TEST(bytes_per_step_are_what_the_ring_counts)
{
    for (size_t m = 0; m < 3; m++)
        for (size_t k = 0; k < 4; k++) {
            if (m == 2 && worlds[k] != 2)
                continue;
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

/* ---- the programs users bring (common/plan_prog.h), against hand-computed figures ---- */

static struct plan_prog_input prog_in(enum plan_par par, enum plan_prec prec, uint64_t params, int nodes)
{
    struct plan_prog_input in = {.par = par, .prec = prec, .params = params, .seq_len = 1024, .micro_batch = 1,
                                 .accum = 1, .nodes = nodes, .gpus_per_node = 1, .tflops = 100};
    ck_assert_int_eq(plan_link_parse("1g", &in.inter), 0);
    ck_assert_int_eq(plan_link_parse("nvlink", &in.intra), 0);
    return in;
}

static struct plan_prog prog_of(const struct plan_prog_input *in)
{
    struct plan_prog p;
    char err[256];
    ck_assert_msg(plan_prog_compute(in, &p, err, sizeof(err)) == 0, "%s", err);
    return p;
}

/* The guides' case: ~50.3M parameters, 2 nodes x 1 GPU over 1 Gbit/s, fp16,
 * accumulation 8. One sync all-reduces 50.3M fp16 gradients = 100.6 MB: the
 * ring sends 2(N-1)/N x 100.6 MB = 100.6 MB and receives as much (201.2 MB
 * moved), once per optimizer step. 100.6 MB at 1 Gbit/s = 0.8048 s, plus 2
 * hops x 50 us; against a 4 s step that is 20.1 %. */
START_TEST(guides_case_ddp_allreduce_and_comm_fraction)
{
    struct plan_prog_input in = prog_in(PLAN_PAR_DDP, PLAN_FP16, 50300000, 2);
    in.accum = 8;
    in.step_time = 4.0;
    struct plan_prog p = prog_of(&in);
    ck_assert_uint_eq(p.grad_bytes, 100600000);
    ck_assert_uint_eq(p.sync_sent, 100600000);
    ck_assert_int_eq(p.syncs_per_step, 1);
    ck_assert_uint_eq(p.step_sent, 100600000);
    ck_assert_uint_eq(p.gather_sent, 0);
    ck_assert_int_eq(p.ring_steps, 2);
    ck_assert_double_eq_tol(p.comm_s, 0.8048 + 2 * 50e-6, 1e-9);
    ck_assert_double_eq_tol(p.comm_frac, (0.8048 + 100e-6) / 4.0, 1e-9);
    ck_assert_int_eq(p.comm_over_step, 0);

    /* 2(N-1)/N at N = 4 over 1000 fp32 gradients: 6 blocks of 250 x 4 B; at N = 3
     * the ring's blocks are ceil(1000/3) = 334 elements: 4 x 334 x 4 B */
    in = prog_in(PLAN_PAR_DDP, PLAN_FP32, 1000, 4);
    ck_assert_uint_eq(prog_of(&in).sync_sent, 6000);
    in.nodes = 3;
    ck_assert_uint_eq(prog_of(&in).sync_sent, 5344);
    in.nodes = 1;
    p = prog_of(&in);
    ck_assert_uint_eq(p.step_sent, 0);
    ck_assert_double_eq(p.comm_s, 0);

    /* a step shorter than the predicted communication is said so, not a fraction above 1 */
    in = prog_in(PLAN_PAR_DDP, PLAN_FP16, 50300000, 2);
    in.step_time = 0.5;
    p = prog_of(&in);
    ck_assert_int_eq(p.comm_over_step, 1);
    ck_assert_double_eq(p.comm_frac, 1);

    /* without a step time: compute = 6 x params x tokens at the given TFLOPS */
    in.step_time = 0;
    in.tflops = 1;
    p = prog_of(&in);
    ck_assert_double_eq_tol(p.compute_s, 6.0 * 50300000 * 1024 / 1e12, 1e-9);
    ck_assert_double_eq_tol(p.comm_frac, p.comm_s / (p.comm_s + p.compute_s), 1e-12);
}
END_TEST

/* Memory per parameter as published (ZeRO, Rajbhandari et al. 2020), at
 * N = 4 over 1200 parameters: mixed precision DDP 16, ZeRO-1 4 + 12/4,
 * ZeRO-2 2 + 14/4, ZeRO-3 16/4; fp32 DDP 4 + 4 + 8, ZeRO-1 8 + 8/4. */
START_TEST(zero_memory_per_parameter)
{
    static const struct {
        enum plan_par par;
        enum plan_prec prec;
        uint64_t state; /* bytes for 1200 parameters */
    } cases[] = {
        {PLAN_PAR_DDP, PLAN_BF16, 16 * 1200},     {PLAN_PAR_ZERO1, PLAN_BF16, 7 * 1200},
        {PLAN_PAR_ZERO2, PLAN_FP16, 11 * 600},    {PLAN_PAR_ZERO3, PLAN_FP16, 4 * 1200},
        {PLAN_PAR_FSDP, PLAN_BF16, 4 * 1200},     {PLAN_PAR_FSDP_GRAD_OP, PLAN_BF16, 11 * 600},
        {PLAN_PAR_DDP, PLAN_FP32, 16 * 1200},     {PLAN_PAR_ZERO1, PLAN_FP32, 10 * 1200},
        {PLAN_PAR_ZERO2, PLAN_FP32, 7 * 1200},    {PLAN_PAR_ZERO3, PLAN_FP32, 4 * 1200},
    };
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        struct plan_prog_input in = prog_in(cases[i].par, cases[i].prec, 1200, 4);
        struct plan_prog p = prog_of(&in);
        ck_assert_msg(p.weights + p.grads + p.optim == cases[i].state, "%s %s: %llu bytes, expected %llu",
                      plan_par_name(cases[i].par), plan_prec_name(cases[i].prec),
                      (unsigned long long)(p.weights + p.grads + p.optim), (unsigned long long)cases[i].state);
        ck_assert_uint_eq(p.peak, cases[i].state); /* no shape: no activations */
        ck_assert_int_eq(p.max_micro_batch, -1);
    }
    /* the split of ZeRO-1 in mixed precision: 2 + 2 + 12/4 */
    struct plan_prog_input in = prog_in(PLAN_PAR_ZERO1, PLAN_BF16, 1200, 4);
    struct plan_prog p = prog_of(&in);
    ck_assert_uint_eq(p.weights, 2400);
    ck_assert_uint_eq(p.grads, 2400);
    ck_assert_uint_eq(p.optim, 3600);
}
END_TEST

/* Per step, N = 4, accumulation 3, 1200 fp16 parameters: a block is 3 x 300
 * elements. ZeRO-1: one reduce-scatter and one all-gather; ZeRO-2: a
 * reduce-scatter per micro-step, one all-gather; ZeRO-3: per micro-step two
 * all-gathers and a reduce-scatter. */
START_TEST(zero_traffic_per_step)
{
    struct plan_prog_input in = prog_in(PLAN_PAR_ZERO1, PLAN_FP16, 1200, 4);
    in.accum = 3;
    struct plan_prog p = prog_of(&in);
    ck_assert_uint_eq(p.reduce_sent, 1800);
    ck_assert_uint_eq(p.gather_sent, 1800);
    ck_assert_int_eq(p.syncs_per_step, 1);
    in.par = PLAN_PAR_ZERO2;
    p = prog_of(&in);
    ck_assert_uint_eq(p.reduce_sent, 5400);
    ck_assert_uint_eq(p.gather_sent, 1800);
    ck_assert_int_eq(p.syncs_per_step, 3);
    in.par = PLAN_PAR_ZERO3;
    p = prog_of(&in);
    ck_assert_uint_eq(p.reduce_sent, 5400);
    ck_assert_uint_eq(p.gather_sent, 10800);
    ck_assert_uint_eq(p.step_sent, 16200);
    ck_assert_int_eq(p.ring_steps, 27);
    /* within a node: the intra-node link (NVLink, 3600 Gbit/s, 2 us) */
    in.nodes = 1;
    in.gpus_per_node = 4;
    p = prog_of(&in);
    ck_assert_double_eq_tol(p.comm_s, 16200 * 8 / 3600e9 + 27 * 2e-6, 1e-12);
}
END_TEST

/* Activations, L = 2, h = 8, a = 2, s = 4, V = 16: per layer 34·s·h + 5·a·s²
 * = 1088 + 160 = 1248 bytes in 16 bits; logits 4·s·V = 256. */
START_TEST(activations_and_largest_micro_batch)
{
    struct plan_prog_input in = prog_in(PLAN_PAR_DDP, PLAN_BF16, 0, 1);
    in.layers = 2;
    in.d_model = 8;
    in.heads = 2;
    in.vocab = 16;
    in.seq_len = 4;
    in.micro_batch = 3;
    struct plan_prog p = prog_of(&in);
    ck_assert_uint_eq(p.params, 16 * 8 + 4 * 8 + 2 * (12 * 64 + 13 * 8) + 2 * 8);
    ck_assert_uint_eq(p.acts_per_seq, 2 * 1248 + 256);
    ck_assert_uint_eq(p.acts, 3 * (2 * 1248 + 256));
    in.prec = PLAN_FP32;
    ck_assert_uint_eq(prog_of(&in).acts_per_seq, 2 * 2496 + 256);
    in.prec = PLAN_BF16;
    in.act_ckpt = 1; /* each layer's input, 2·s·h, and one layer recomputed */
    ck_assert_uint_eq(prog_of(&in).acts_per_seq, 2 * 64 + 1248 + 256);
    in.act_ckpt = 0;
    /* room for 5 and a half sequences beside the model state: 5 fit, not 6 */
    const uint64_t state = 16 * p.params;
    in.gpu_mem = state + 5 * p.acts_per_seq + p.acts_per_seq / 2;
    p = prog_of(&in);
    ck_assert_int_eq(p.max_micro_batch, 5);
    ck_assert_int_eq(p.fits, 1);
    in.micro_batch = 6;
    ck_assert_int_eq(prog_of(&in).fits, 0);
    in.gpu_mem = state - 1;
    ck_assert_int_eq(prog_of(&in).max_micro_batch, 0);
}
END_TEST

/* The largest inputs the checks let through are counted, not wrapped: a
 * ZeRO-3 step of 10^15 parameters over 10^6 micro-steps would move ~4e21
 * bytes (past 2^64) and is refused by name; DDP's one all-reduce of as many
 * is 2 x 5e14 x 2 B; 4096 x 64 ranks x 10^6 micro-steps take 3 x 10^6 x
 * 262143 hops, past an int. */
START_TEST(program_extremes_are_counted_not_wrapped)
{
    struct plan_prog p;
    char err[256];
    struct plan_prog_input in = prog_in(PLAN_PAR_ZERO3, PLAN_BF16, PLAN_PROG_MAX_PARAMS, 2);
    in.accum = 1000000;
    ck_assert_int_eq(plan_prog_compute(&in, &p, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "1000000 micro-steps of 1000000000000000 parameters over 2 ranks move more "
                                      "than 2^62 bytes per step"));
    in.par = PLAN_PAR_DDP;
    p = prog_of(&in);
    ck_assert_uint_eq(p.step_sent, 2000000000000000ULL);
    ck_assert_int_eq(p.ring_steps, 2);
    in = prog_in(PLAN_PAR_ZERO3, PLAN_BF16, 1, 4096);
    in.gpus_per_node = 64;
    in.accum = 1000000;
    p = prog_of(&in);
    ck_assert_int_eq(p.ring_steps, 3000000LL * 262143);
    ck_assert_uint_eq(p.step_sent, 3000000ULL * 262143 * 2);
    ck_assert(p.comm_s > 0 && p.comm_frac > 0 && p.comm_frac <= 1);
}
END_TEST

START_TEST(program_bad_input_is_named)
{
    struct plan_prog p;
    char err[256];
    struct plan_prog_input in = prog_in(PLAN_PAR_DDP, PLAN_FP16, 0, 2);
    ck_assert_int_eq(plan_prog_compute(&in, &p, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "params: give the parameter count"));
    in = prog_in(PLAN_PAR_DDP, PLAN_FP16, 1000, 0);
    ck_assert_int_eq(plan_prog_compute(&in, &p, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "nodes: expected 1 to 4096, got 0");
    in = prog_in(PLAN_PAR_DDP, PLAN_FP16, 1000, 2);
    in.layers = 2, in.d_model = 10, in.heads = 3;
    ck_assert_int_eq(plan_prog_compute(&in, &p, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "heads: expected a divisor of d_model 10, got 3");
    in = prog_in(PLAN_PAR_DDP, PLAN_FP16, 1000, 2);
    in.micro_batch = -1;
    ck_assert_int_eq(plan_prog_compute(&in, &p, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "micro_batch: expected 1 to"));
    enum plan_par par;
    enum plan_prec prec;
    struct plan_link l = {0};
    ck_assert_int_eq(plan_par_parse("zero4", &par), -EINVAL);
    ck_assert_int_eq(plan_par_parse("fsdp", &par), 0);
    ck_assert_int_eq(plan_par_stage(par), 3);
    ck_assert_int_eq(plan_prec_parse("fp8", &prec), -EINVAL);
    ck_assert_int_eq(plan_link_parse("-1", &l), -EINVAL);
    ck_assert_int_eq(plan_link_parse("ndr", &l), 0);
    ck_assert_double_eq(l.gbit, 400);
}
END_TEST

/* A rank_cmd job spec describes its program: the plan takes its parallelism,
 * params, precision and the batch split from the spec, the one mechanism
 * muster-train's plan uses too; bad values are named. */
START_TEST(program_plan_from_job_spec)
{
    struct job_spec s;
    struct plan_prog_input in;
    char err[512];
    json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:I, s:i, s:i, s:i}", "name", "ds", "rank_cmd", "python3 train.py",
                          "parallelism", "ddp", "precision", "fp16", "params", (json_int_t)50300000, "batch", 64,
                          "micro_batch", 4, "seq_len", 1024);
    ck_assert_msg(job_spec_from_json(o, "job.json", &s, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(plan_prog_input_from_spec(&in, &s, 2, 1, err, sizeof(err)), 0);
    ck_assert_int_eq(in.par, PLAN_PAR_DDP);
    ck_assert_int_eq(in.prec, PLAN_FP16);
    ck_assert_uint_eq(in.params, 50300000);
    ck_assert_int_eq(in.accum, 8);
    ck_assert_int_eq(in.layers, 0); /* no model keys: the shape is unknown */
    json_object_set_new(o, "parallelism", json_string("zero4"));
    ck_assert_int_eq(job_spec_from_json(o, "job.json", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: parallelism: expected muster-train or one of ddp"));
    json_object_set_new(o, "parallelism", json_string("zero3"));
    json_object_del(o, "params");
    ck_assert_int_eq(job_spec_from_json(o, "job.json", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "params: the plan of a zero3 program needs"));
    json_decref(o);
    o = json_pack("{s:s, s:s}", "name", "mt", "precision", "fp16");
    ck_assert_int_eq(job_spec_from_json(o, "job.json", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "precision: muster-train computes in bf16"));
    json_decref(o);
    /* a program's keys on a muster-train job (parallelism forgotten) are refused, not ignored */
    o = json_pack("{s:s, s:s, s:I}", "name", "mt", "rank_cmd", "python3 train.py", "params", (json_int_t)50300000);
    ck_assert_int_eq(job_spec_from_json(o, "job.json", &s, err, sizeof(err)), -EINVAL);
    ck_assert_str_eq(err, "job.json: params: describes a rank_cmd program (set parallelism); muster-train counts "
                          "its parameters from the model keys and keeps its activations");
    json_decref(o);
    o = json_pack("{s:s, s:i}", "name", "mt", "activation_checkpointing", 1);
    ck_assert_int_eq(job_spec_from_json(o, "job.json", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: activation_checkpointing: describes a rank_cmd program"));
    json_decref(o);
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
    TCase *prog = tcase_create("program");
    tcase_add_test(prog, guides_case_ddp_allreduce_and_comm_fraction);
    tcase_add_test(prog, zero_memory_per_parameter);
    tcase_add_test(prog, zero_traffic_per_step);
    tcase_add_test(prog, activations_and_largest_micro_batch);
    tcase_add_test(prog, program_bad_input_is_named);
    tcase_add_test(prog, program_extremes_are_counted_not_wrapped);
    tcase_add_test(prog, program_plan_from_job_spec);
    suite_add_tcase(s, prog);
    return s;
}
