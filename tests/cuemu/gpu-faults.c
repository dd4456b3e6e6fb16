/*
 * gpu-faults: the GPU path's communicator under failures, on cuemu's strict
 * NCCL (tests/cuemu/README.md): ranks are threads of this process, each
 * with its own gpu_zero of the tiny model, and a "control" thread plays
 * muster-train's, which aborts a rank's communicator when its generation
 * breaks (gpu_zero_abort, from another thread than the one training).
 *
 * - peer gone inside a collective: rank 1 aborts, rank 0 sums over both.
 *   On NCCL rank 0's collective never completes; rank 0 must leave its
 *   wait when its own control thread aborts it (and, told by nobody, at its
 *   wait deadline), fail as the generation's failure, and free its trainer
 *   without blocking.
 * - freed with a peer gone and no abort (an error exit): gpu_zero_free must
 *   not block in ncclCommDestroy.
 * - formation with a peer that never comes: the generation's cancellation
 *   ends the wait; then both ranks form a new communicator and sum.
 * - abort racing collectives, ROUNDS times (argument 1; default 1000):
 *   both ranks sum in a loop and the control thread aborts each at a random
 *   moment; every sum either returns the right value or fails, no use after
 *   abort nor concurrent call is reported, and the ranks form the next
 *   round's communicator on the same gpu_zero (gpu_zero_set_comm).
 * Times are bounded: a wait that does not end within 10 s is a failure
 * (cuemu reports a hang after CUEMU_NCCL_TIMEOUT_S, set low by the test).
 */
#include <errno.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/gpu-check-lib.h"
#include "worker/train/gpu/gpu.h"
#include "worker/train/model.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void sleep_us(long us)
{
    struct timespec ts = {us / 1000000, (us % 1000000) * 1000};
    nanosleep(&ts, NULL);
}

static struct gpt_config cfg;

static int make(struct gpu_zero **z, int rank, const uint8_t *id, atomic_int *cancel)
{
    char err[1024];
    int rc = gpu_zero_init(z, &cfg, 1, cfg.T, rank, 2, id, (const int *)cancel, err, sizeof(err));
    if (rc)
        printf("        rank %d: gpu_zero_init: %s\n", rank, err);
    return rc;
}

/* ---- a peer gone ----
 * cuemu runs a stream on the thread that made it: each rank's gpu_zero
 * lives and dies on its own thread. */

enum peer_mode { SUM_ABORTED, SUM_DEADLINE, FREE_ONLY, SUM_BOTH };

struct pair {
    enum peer_mode mode;
    uint8_t id[GPU_ID_BYTES];
    pthread_barrier_t formed, gone; /* gone: 3 (the control thread too) */
    struct gpu_zero *z[2];
    int init_rc[2], rc[2], failed[2];
    double x[2], t_sum[2], t_free;
};

struct rank_arg {
    struct pair *p;
    int rank;
};

static void *pair_rank(void *arg)
{
    struct rank_arg *a = arg;
    struct pair *p = a->p;
    const int me = a->rank;
    p->init_rc[me] = make(&p->z[me], me, p->id, NULL);
    pthread_barrier_wait(&p->formed);
    struct gpu_zero *z = p->z[me];
    if (p->mode == SUM_BOTH) {
        p->x[me] = 1.0;
        p->rc[me] = z ? gpu_zero_sum(z, &p->x[me]) : -1;
        gpu_zero_free(z);
        return NULL;
    }
    if (me == 1) { /* its generation broke: it aborts and leaves */
        gpu_zero_abort(z);
        gpu_zero_free(z);
        pthread_barrier_wait(&p->gone);
        return NULL;
    }
    pthread_barrier_wait(&p->gone);
    if (z && p->mode == SUM_DEADLINE)
        gpu_zero_set_timeout(z, 500);
    if (z && p->mode == FREE_ONLY)
        gpu_zero_set_timeout(z, 500); /* bounds the clean finalize it tries */
    if (z && p->mode != FREE_ONLY) {
        p->x[0] = 1.0;
        p->rc[0] = gpu_zero_sum(z, &p->x[0]);
        p->failed[0] = gpu_zero_failed(z);
        p->t_sum[0] = now_s();
    }
    const double t0 = now_s();
    gpu_zero_free(z);
    p->t_free = now_s() - t0;
    return NULL;
}

/* A world of 2 in mode; the control thread aborts rank 0 after abort_after_us (0: never). */
static int run_pair(struct pair *p, enum peer_mode mode, long abort_after_us, double *t_abort)
{
    pthread_t th[2];
    struct rank_arg args[2] = {{p, 0}, {p, 1}};
    memset(p, 0, sizeof(*p));
    p->mode = mode;
    if (gpu_unique_id(p->id))
        return -1;
    pthread_barrier_init(&p->formed, NULL, 2);
    pthread_barrier_init(&p->gone, NULL, mode == SUM_BOTH ? 1 : 3);
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, pair_rank, &args[k]);
    if (mode != SUM_BOTH)
        pthread_barrier_wait(&p->gone);
    if (abort_after_us) {
        sleep_us(abort_after_us);
        *t_abort = now_s();
        gpu_zero_abort(p->z[0]); /* rank 0's control thread: the daemon opened the next generation */
    }
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    pthread_barrier_destroy(&p->formed);
    pthread_barrier_destroy(&p->gone);
    return p->init_rc[0] || p->init_rc[1] ? -1 : 0;
}

static void peer_gone(void)
{
    struct pair p;
    double t_abort = 0;
    if (run_pair(&p, SUM_ABORTED, 300000, &t_abort)) {
        CHECK(0, "peer gone: both ranks formed");
        return;
    }
    CHECK(p.rc[0] == -ECANCELED && p.failed[0] && p.t_sum[0] - t_abort < 10,
          "peer gone inside a collective: rank 0 leaves its sum %.3f s after its own abort, with the "
          "generation's failure (rc %d, failed %d)", p.t_sum[0] - t_abort, p.rc[0], p.failed[0]);
    CHECK(p.t_free < 10, "peer gone: rank 0's trainer is freed in %.3f s", p.t_free);

    if (run_pair(&p, SUM_DEADLINE, 0, NULL)) {
        CHECK(0, "peer gone, deadline: both ranks formed");
        return;
    }
    CHECK(p.rc[0] == -ETIMEDOUT && p.failed[0] && p.t_free < 10,
          "peer gone, nobody aborts: rank 0 leaves its sum at its 0.5 s deadline (rc %d, failed %d) and is "
          "freed in %.3f s", p.rc[0], p.failed[0], p.t_free);

    if (run_pair(&p, FREE_ONLY, 0, NULL)) {
        CHECK(0, "freed with a peer gone: both ranks formed");
        return;
    }
    CHECK(p.t_free < 10, "freed with a peer gone and no abort (an error exit): gpu_zero_free returns in "
          "%.3f s (the clean finalize cannot complete: it aborts)", p.t_free);
}

/* ---- formation with a peer that never comes ---- */

struct form_arg {
    uint8_t id[GPU_ID_BYTES];
    atomic_int cancel;
    int rc, made;
    double t_end;
};

static void *form_alone(void *arg)
{
    struct form_arg *f = arg;
    struct gpu_zero *z = NULL;
    f->rc = make(&z, 0, f->id, &f->cancel);
    f->t_end = now_s();
    f->made = z != NULL;
    gpu_zero_free(z);
    return NULL;
}

static void formation_cancelled(void)
{
    struct form_arg f = {0};
    atomic_init(&f.cancel, 0);
    if (gpu_unique_id(f.id)) {
        CHECK(0, "formation: gpu_unique_id");
        return;
    }
    pthread_t th;
    pthread_create(&th, NULL, form_alone, &f);
    sleep_us(300000);
    const double t_cancel = now_s();
    atomic_store(&f.cancel, 1); /* a newer generation came: rank 1 died while it formed */
    pthread_join(th, NULL);
    CHECK(f.rc == -ECANCELED && !f.made && f.t_end - t_cancel < 10,
          "formation: rank 0 of 2, alone, leaves the communicator's formation %.3f s after the "
          "generation is cancelled (rc %d)", f.t_end - t_cancel, f.rc);
    struct pair p;
    int rc = run_pair(&p, SUM_BOTH, 0, NULL);
    CHECK(!rc && p.rc[0] == 0 && p.rc[1] == 0 && p.x[0] == 2.0 && p.x[1] == 2.0,
          "formation: the next generation forms and sums (%g, %g)", p.x[0], p.x[1]);
}

/* ---- abort racing collectives ---- */

enum { MAX_SUMS = 100000 };

struct race {
    struct gpu_zero *z[2];
    uint8_t id[GPU_ID_BYTES];
    pthread_barrier_t ready, start, done, checked;
    int rounds, stop;
    int rc[2], bad[2], sums[2], set_rc[2];
};

struct race_arg {
    struct race *race;
    int rank;
};

static void *race_rank(void *p)
{
    struct race_arg *a = p;
    struct race *r = a->race;
    for (int round = 0; round < r->rounds; round++) {
        pthread_barrier_wait(&r->ready); /* the round's id is there */
        if (r->stop)
            break;
        r->set_rc[a->rank] = !r->z[a->rank] ? make(&r->z[a->rank], a->rank, r->id, NULL)
                                        : gpu_zero_set_comm(r->z[a->rank], r->id, NULL);
        if (r->set_rc[a->rank] && r->z[a->rank])
            printf("        rank %d round %d: gpu_zero_set_comm: %s\n", a->rank, round,
                   gpu_zero_error(r->z[a->rank]));
        pthread_barrier_wait(&r->start);
        int rc = r->set_rc[a->rank], n = 0;
        while (!rc && n < MAX_SUMS) {
            double x = a->rank + 1;
            rc = gpu_zero_sum(r->z[a->rank], &x);
            if (!rc && x != 3.0)
                r->bad[a->rank]++;
            n += !rc;
        }
        r->rc[a->rank] = rc;
        r->sums[a->rank] += n;
        pthread_barrier_wait(&r->done);
        pthread_barrier_wait(&r->checked);
    }
    gpu_zero_free(r->z[a->rank]);
    return NULL;
}

static void abort_race(int rounds)
{
    struct race r = {.rounds = rounds};
    struct race_arg args[2] = {{&r, 0}, {&r, 1}};
    pthread_t th[2];
    pthread_barrier_init(&r.ready, NULL, 3);
    pthread_barrier_init(&r.start, NULL, 3);
    pthread_barrier_init(&r.done, NULL, 3);
    pthread_barrier_init(&r.checked, NULL, 3);
    for (int k = 0; k < 2; k++)
        pthread_create(&th[k], NULL, race_rank, &args[k]);
    unsigned seed = 12345;
    int ok = 0, formed = 0;
    const double t0 = now_s();
    for (int round = 0; round < rounds; round++) {
        if (gpu_unique_id(r.id))
            r.stop = 1;
        pthread_barrier_wait(&r.ready);
        if (r.stop)
            break;
        pthread_barrier_wait(&r.start);
        formed += !r.set_rc[0] && !r.set_rc[1];
        sleep_us(rand_r(&seed) % 2000);
        gpu_zero_abort(r.z[rand_r(&seed) % 2]); /* one first, the other a moment later */
        sleep_us(rand_r(&seed) % 500);
        gpu_zero_abort(r.z[0]);
        gpu_zero_abort(r.z[1]);
        pthread_barrier_wait(&r.done);
        ok += r.rc[0] != 0 && r.rc[1] != 0 && gpu_zero_failed(r.z[0]) && gpu_zero_failed(r.z[1]);
        pthread_barrier_wait(&r.checked);
    }
    for (int k = 0; k < 2; k++)
        pthread_join(th[k], NULL);
    CHECK(formed == rounds && ok == rounds && !r.bad[0] && !r.bad[1],
          "abort racing collectives: %d rounds in %.1f s, %d formed, %d ended failed on both ranks, "
          "%d + %d sums completed, %d + %d wrong sums", rounds, now_s() - t0, formed, ok, r.sums[0],
          r.sums[1], r.bad[0], r.bad[1]);
    pthread_barrier_destroy(&r.checked);
    pthread_barrier_destroy(&r.ready);
    pthread_barrier_destroy(&r.start);
    pthread_barrier_destroy(&r.done);
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 1000;
    if (rounds < 1) {
        fprintf(stderr, "usage: gpu-faults [ROUNDS]  (ROUNDS >= 1, default 1000)\n");
        return 2;
    }
    gpt_preset("tiny", &cfg);
    printf("the GPU path's communicator under failures (cuemu's strict NCCL):\n");
    if (argc < 3 || strcmp(argv[2], "race") != 0) {
        peer_gone();
        formation_cancelled();
    }
    abort_race(rounds);
    printf("gpu-faults: %s (%d failure%s)\n", failures ? "FAILED" : "passed", failures,
           failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
