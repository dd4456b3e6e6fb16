/*
 * zero-bench: step time of ZeRO-3 (the trainer) against plain data parallel
 * at the same world size, N ranks as threads of this process over the TCP
 * ring on loopback, for tests/bench/bench_zero.sh.
 *
 * Plain data parallel here: every rank holds the whole model, its gradients
 * and both moments; after the backward the full gradient is all-reduced
 * (COMM_AVG, one call, not overlapped with the backward) and every rank runs
 * AdamW on all of it. ZeRO-3 is trainer_step() itself. Both see the same
 * global batch and the same per-rank micro-batches.
 *
 *   zero-bench --data FILE [--model small] [--ranks 2,4] [--batch 16]
 *              [--steps 10] [--warmup 2] [--threads-per-rank N]
 */
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "worker/train/comm/comm.h"
#include "worker/train/layers.h"
#include "worker/train/train.h"

#define MAXW 16

struct bench {
    const char *model, *data;
    int world, batch, steps, warmup, threads;
    int dp; /* 1: plain data parallel, 0: ZeRO-3 */
    /* results */
    double ms[MAXW];       /* median step time per rank */
    double wait_frac;      /* rank 0, ZeRO-3: waiting on collectives */
    size_t state_bytes;    /* rank 0: weights, moments, gradients */
    int rc[MAXW];
    char err[MAXW][256];
    /* rank 0 publishes the communicator's id */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    int id_ready, id_rc;
    uint8_t id[COMM_ID_BYTES];
};

struct rank_arg {
    struct bench *b;
    int rank;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(double), cmp_double);
    return n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
}

static void spec_for(const struct bench *b, struct job_spec *s)
{
    job_spec_defaults(s);
    snprintf(s->model, sizeof(s->model), "%s", b->model);
    snprintf(s->data, sizeof(s->data), "%s", b->data);
    s->steps = b->steps + b->warmup;
    s->batch = b->batch;
    s->micro_batch = 0; /* batch / world: one micro-step */
    s->lr = 1e-3;
    s->warmup_steps = 10;
    s->grad_clip = 1.0;
    s->eval_every = 0;
}

/* Plain data parallel, one rank. */
static int run_dp(struct bench *b, int r, struct comm *c, double *times, char *err,
                  size_t errlen)
{
    struct job_spec s;
    struct gpt_config cfg;
    struct dataset d;
    struct gpt g;
    spec_for(b, &s);
    int rc = trainer_check_spec(&s, b->world, err, errlen);
    if (rc)
        return rc;
    job_spec_model(&s, &cfg, err, errlen); /* checked by trainer_check_spec */
    if ((rc = dataset_open(&d, s.data, cfg.V, s.val_fraction, s.seq_len, err, errlen)))
        return rc;
    const int B = s.micro_batch, T = s.seq_len, accum = s.batch / (B * b->world);
    rc = gpt_create(&g, &cfg, B, T);
    size_t P = g.layout.total;
    float *m = calloc(P, sizeof(float)), *v = calloc(P, sizeof(float));
    int *in = calloc((size_t)B * T, sizeof(int)), *tg = calloc((size_t)B * T, sizeof(int));
    if (rc || !m || !v || !in || !tg) {
        rc = -ENOMEM;
        goto out;
    }
    if (r == 0)
        b->state_bytes = 4 * sizeof(float) * P;
    gpt_init_weights(&g, (uint64_t)s.seed);
    struct lr_schedule sched = {s.lr, s.lr_min, s.warmup_steps, s.steps};
    for (int step = 0; step < s.steps && !rc; step++) {
        double t0 = now_s();
        gpt_zero_grad(&g);
        for (int ms = 0; ms < accum; ms++) {
            dataset_train_batch(&d, in, tg, B, T, (uint64_t)s.seed, step, ms, r, b->world);
            gpt_forward(&g, in, tg, B, T);
            gpt_backward(&g, 1.0f / (float)accum);
        }
        rc = comm_all_reduce(c, g.grads, P, COMM_F32, COMM_AVG);
        double norm = sqrt(sum_squares(g.grads, P));
        struct adamw h = {(float)lr_at(&sched, step), 0.9f, 0.95f, 1e-8f,
                          (float)s.weight_decay, step + 1};
        float gscale = clip_scale(norm, s.grad_clip);
        struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
        for (int u = 0; u < g.layout.nunits; u++) {
            int n = gpt_unit_tensors(&cfg, u, t);
            for (int i = 0; i < n; i++) {
                size_t off = g.layout.offset[u] + t[i].offset;
                adamw_update(g.params + off, g.grads + off, m + off, v + off, t[i].numel, &h,
                             t[i].decay, gscale);
            }
        }
        if (step >= b->warmup)
            times[step - b->warmup] = (now_s() - t0) * 1e3;
    }
    if (rc)
        snprintf(err, errlen, "all-reduce: %s", comm_strerror(rc));
out:
    free(m);
    free(v);
    free(in);
    free(tg);
    gpt_destroy(&g);
    dataset_close(&d);
    return rc;
}

/* ZeRO-3: the trainer. */
static int run_zero(struct bench *b, int r, struct comm *c, double *times, char *err,
                    size_t errlen)
{
    struct job_spec s;
    struct trainer tr;
    spec_for(b, &s);
    int rc = trainer_init(&tr, &s, r, b->world, c, err, errlen);
    if (rc)
        return rc;
    if (r == 0)
        b->state_bytes = zero_model_state_bytes(&tr.zero);
    double wait = 0, total = 0;
    for (int step = 0; step < s.steps && !rc; step++) {
        struct train_step_info info;
        rc = trainer_step(&tr, &info, err, errlen);
        if (!rc && step >= b->warmup) {
            times[step - b->warmup] = info.ms;
            wait += info.comm_frac * info.ms;
            total += info.ms;
        }
    }
    if (r == 0)
        b->wait_frac = total > 0 ? wait / total : 0;
    trainer_free(&tr);
    return rc;
}

static void *rank_main(void *arg)
{
    struct rank_arg *a = arg;
    struct bench *b = a->b;
    struct comm *c = NULL;
    layers_set_threads(b->threads);
    pthread_mutex_lock(&b->mu);
    if (a->rank == 0) {
        b->id_rc = comm_unique_id(COMM_RING, b->id);
        b->id_ready = 1;
        pthread_cond_broadcast(&b->cv);
    }
    while (!b->id_ready)
        pthread_cond_wait(&b->cv, &b->mu);
    pthread_mutex_unlock(&b->mu);
    int rc = b->id_rc ? b->id_rc : comm_init(&c, COMM_RING, a->rank, b->world, b->id, 60000);
    if (rc) {
        snprintf(b->err[a->rank], sizeof(b->err[a->rank]), "comm: %s", comm_strerror(rc));
        b->rc[a->rank] = rc;
        return NULL;
    }
    double *times = calloc((size_t)b->steps, sizeof(double));
    rc = times ? (b->dp ? run_dp : run_zero)(b, a->rank, c, times, b->err[a->rank],
                                               sizeof(b->err[a->rank]))
               : -ENOMEM;
    if (!rc)
        b->ms[a->rank] = median(times, b->steps);
    b->rc[a->rank] = rc;
    free(times);
    comm_destroy(c);
    return NULL;
}

static int run(struct bench *b)
{
    pthread_t th[MAXW];
    struct rank_arg args[MAXW];
    pthread_mutex_init(&b->mu, NULL);
    pthread_cond_init(&b->cv, NULL);
    b->id_ready = 0;
    for (int r = 0; r < b->world; r++) {
        args[r] = (struct rank_arg){b, r};
        if (pthread_create(&th[r], NULL, rank_main, &args[r]) != 0)
            return -errno;
    }
    for (int r = 0; r < b->world; r++)
        pthread_join(th[r], NULL);
    pthread_mutex_destroy(&b->mu);
    pthread_cond_destroy(&b->cv);
    for (int r = 0; r < b->world; r++)
        if (b->rc[r]) {
            fprintf(stderr, "zero-bench: N=%d %s rank %d: %s\n", b->world,
                    b->dp ? "data parallel" : "ZeRO-3", r, b->err[r]);
            return b->rc[r];
        }
    return 0;
}

static void usage(void)
{
    fprintf(stderr, "usage: zero-bench --data FILE [--model small] [--ranks 2,4] [--batch 16] "
                    "[--steps 10] [--warmup 2] [--threads-per-rank N]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *model = "small", *data = NULL, *ranks = "2,4";
    int batch = 16, steps = 10, warmup = 2, threads = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!v)
            usage();
        if (!strcmp(a, "--model"))
            model = v;
        else if (!strcmp(a, "--data"))
            data = v;
        else if (!strcmp(a, "--ranks"))
            ranks = v;
        else if (!strcmp(a, "--batch"))
            batch = atoi(v);
        else if (!strcmp(a, "--steps"))
            steps = atoi(v);
        else if (!strcmp(a, "--warmup"))
            warmup = atoi(v);
        else if (!strcmp(a, "--threads-per-rank"))
            threads = atoi(v);
        else
            usage();
        i++;
    }
    if (!data || steps < 1 || warmup < 0 || batch < 1)
        usage();
    setenv("MUSTER_COMM_ADDR", "127.0.0.1", 0);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    printf("%-3s %-8s %12s %12s %8s %14s %14s %10s\n", "N", "model", "zero3_ms", "dp_ms",
           "ratio", "zero3_state_B", "dp_state_B", "zero3_wait");
    for (const char *p = ranks; *p;) {
        int world = atoi(p);
        if (world < 1 || world > MAXW)
            usage();
        int tpr = threads > 0 ? threads : (int)(cores / world > 0 ? cores / world : 1);
        struct bench z = {.model = model, .data = data, .world = world, .batch = batch,
                          .steps = steps, .warmup = warmup, .threads = tpr, .dp = 0};
        struct bench d = z;
        d.dp = 1;
        if (run(&z) || run(&d))
            return 1;
        printf("%-3d %-8s %12.1f %12.1f %8.2f %14zu %14zu %9.1f%%\n", world, model, z.ms[0],
               d.ms[0], z.ms[0] / d.ms[0], z.state_bytes, d.state_bytes, 100 * z.wait_frac);
        fflush(stdout);
        p = strchr(p, ',');
        if (!p)
            break;
        p++;
    }
    return 0;
}
