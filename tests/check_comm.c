/*
 * comm: the ring collectives against a naive reference (bit for bit, in the
 * documented summation order) for 1..5 ranks and counts that do not divide
 * by the world size; abort, a killed peer, a refused id; the NCCL backend on
 * GPUs when there are any (otherwise it says "skipped: no GPU").
 *
 * Ranks are threads of the test process (one forked process for the killed
 * peer), talking over 127.0.0.1.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifdef MUSTER_HAVE_NCCL
#include <cuda_runtime.h>
#endif

#include "worker/train/comm/comm.h"

#define MAX_WORLD 8

static const size_t counts[] = {1, 7, 1000, 100003};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static uint8_t *loopback_id(void)
{
    static uint8_t id[COMM_ID_BYTES];
    setenv("MUSTER_COMM_ADDR", "127.0.0.1", 1);
    int rc = comm_unique_id(COMM_RING, id);
    ck_assert_msg(rc == 0, "comm_unique_id: %s", comm_strerror(rc));
    return id;
}

/* Input element i of rank r: values of mixed magnitude, so that a different
 * summation order would show in the low bits. */
static float input(int r, size_t i)
{
    uint32_t h = (uint32_t)(r * 2654435761u) ^ (uint32_t)(i * 40503u + 7);
    h ^= h >> 13;
    h *= 0x5bd1e995u;
    h ^= h >> 15;
    float mant = (float)(h & 0xffff) / 65536.0f - 0.5f;
    return ldexpf(mant, (int)(h >> 28) - 8);
}

/* The documented order: block b summed from its owner's successor around. */
static float reference(int world, int b, size_t i, enum comm_op op, float (*x)(int, size_t))
{
    float acc = x((b + 1) % world, i);
    for (int k = 2; k <= world; k++) {
        float v = x((b + k) % world, i);
        acc = op == COMM_MAX ? fmaxf(acc, v) : acc + v;
    }
    return op == COMM_AVG ? acc / (float)world : acc;
}

/* ---- ranks as threads ---------------------------------------------- */

struct rank {
    pthread_t thread;
    int rank, world;
    const uint8_t *id;
    int (*body)(struct rank *rk, struct comm *c);
    int rc;                /* first failure, 0 if none */
    char why[256];         /* what failed */
    float *allreduce_out;  /* kept to compare ranks */
    size_t allreduce_count;
};

__attribute__((format(printf, 3, 4)))
static int failf(struct rank *rk, int rc, const char *fmt, ...)
{
    if (!rk->rc) {
        rk->rc = rc ? rc : -1;
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(rk->why, sizeof(rk->why), fmt, ap);
        va_end(ap);
    }
    return rk->rc;
}

static void *rank_main(void *arg)
{
    struct rank *rk = arg;
    struct comm *c = NULL;
    int rc = comm_init(&c, COMM_RING, rk->rank, rk->world, rk->id, 10000);
    if (rc < 0) {
        failf(rk, rc, "comm_init");
        return NULL;
    }
    rk->body(rk, c);
    comm_destroy(c);
    return NULL;
}

static void run_world(int world, int (*body)(struct rank *, struct comm *), struct rank *rks)
{
    const uint8_t *id = loopback_id();
    for (int r = 0; r < world; r++) {
        rks[r] = (struct rank){.rank = r, .world = world, .id = id, .body = body};
        ck_assert_int_eq(pthread_create(&rks[r].thread, NULL, rank_main, &rks[r]), 0);
    }
    for (int r = 0; r < world; r++)
        pthread_join(rks[r].thread, NULL);
    /* the rank that saw a wrong value first, then any that failed */
    for (int pass = 0; pass < 2; pass++)
        for (int r = 0; r < world; r++)
            if (pass ? rks[r].rc != 0 : rks[r].rc == -1)
                ck_abort_msg("world %d rank %d: %s (%s)", world, r, rks[r].why,
                             rks[r].rc == -1 ? "wrong value" : comm_strerror(rks[r].rc));
}

/* ---- collectives against the reference ------------------------------- */

static int check_block(struct rank *rk, const float *got, const float *want, size_t n,
                       const char *what)
{
    for (size_t i = 0; i < n; i++) {
        if (memcmp(&got[i], &want[i], sizeof(float)) != 0) {
            return failf(rk, -1, "%s: count %zu: element %zu: %a, want %a", what, n, i,
                         (double)got[i], (double)want[i]);
        }
    }
    return 0;
}

static int collectives_body(struct rank *rk, struct comm *c)
{
    int n = rk->world, me = rk->rank, rc;
    for (size_t k = 0; k < sizeof(counts) / sizeof(counts[0]); k++) {
        size_t cnt = counts[k], total = cnt * (size_t)n;
        float *send = malloc(total * sizeof(float));
        float *recv = malloc(total * sizeof(float));
        float *want = malloc(total * sizeof(float));

        /* all-gather, out of place and in place */
        for (size_t i = 0; i < cnt; i++)
            send[i] = input(me, i);
        for (int r = 0; r < n; r++)
            for (size_t i = 0; i < cnt; i++)
                want[(size_t)r * cnt + i] = input(r, i);
        if ((rc = comm_all_gather(c, send, recv, cnt, COMM_F32)) < 0)
            return failf(rk, rc, "all_gather count %zu", cnt);
        if (check_block(rk, recv, want, total, "all_gather"))
            return rk->rc;
        memset(recv, 0, total * sizeof(float));
        memcpy(recv + (size_t)me * cnt, send, cnt * sizeof(float));
        if ((rc = comm_all_gather(c, recv + (size_t)me * cnt, recv, cnt, COMM_F32)) < 0)
            return failf(rk, rc, "all_gather in place count %zu", cnt);
        if (check_block(rk, recv, want, total, "all_gather in place"))
            return rk->rc;

        /* reduce-scatter: send[b * cnt + i] is this rank's input(b * cnt + i) */
        static const enum comm_op ops[] = {COMM_SUM, COMM_AVG, COMM_MAX};
        for (int o = 0; o < 3; o++) {
            for (size_t i = 0; i < total; i++)
                send[i] = input(me, i);
            for (size_t i = 0; i < cnt; i++)
                want[i] = reference(n, me, (size_t)me * cnt + i, ops[o], input);
            if ((rc = comm_reduce_scatter(c, send, recv, cnt, COMM_F32, ops[o])) < 0)
                return failf(rk, rc, "reduce_scatter count %zu op %d", cnt, o);
            if (check_block(rk, recv, want, cnt, "reduce_scatter"))
                return rk->rc;
            float *mine = send + (size_t)me * cnt;
            if ((rc = comm_reduce_scatter(c, send, mine, cnt, COMM_F32, ops[o])) < 0)
                return failf(rk, rc, "reduce_scatter in place count %zu op %d", cnt, o);
            if (check_block(rk, mine, want, cnt, "reduce_scatter in place"))
                return rk->rc;
        }

        /* all-reduce of cnt elements: block b holds cnt/n elements, the
         * first cnt%n blocks one more */
        for (int o = 0; o < 2; o++) {
            enum comm_op op = o ? COMM_AVG : COMM_SUM;
            for (size_t i = 0; i < cnt; i++)
                recv[i] = input(me, i);
            size_t base = cnt / (size_t)n, extra = cnt % (size_t)n, at = 0;
            for (int b = 0; b < n; b++) {
                size_t len = base + ((size_t)b < extra);
                for (size_t i = at; i < at + len; i++)
                    want[i] = reference(n, b, i, op, input);
                at += len;
            }
            if ((rc = comm_all_reduce(c, recv, cnt, COMM_F32, op)) < 0)
                return failf(rk, rc, "all_reduce count %zu op %d", cnt, o);
            if (check_block(rk, recv, want, cnt, "all_reduce"))
                return rk->rc;
        }
        if (k == 3) { /* kept for the cross-rank comparison */
            rk->allreduce_out = malloc(cnt * sizeof(float));
            memcpy(rk->allreduce_out, recv, cnt * sizeof(float));
            rk->allreduce_count = cnt;
        }

        /* broadcast from every root, an odd number of bytes */
        size_t bytes = cnt * sizeof(float) + 3;
        uint8_t *bb = malloc(bytes);
        for (int root = 0; root < n; root++) {
            for (size_t i = 0; i < bytes; i++)
                bb[i] = me == root ? (uint8_t)(i * 31 + (size_t)root) : 0;
            if ((rc = comm_broadcast(c, bb, bytes, root)) < 0) {
                free(bb);
                return failf(rk, rc, "broadcast bytes %zu root %d", bytes, root);
            }
            for (size_t i = 0; i < bytes; i++)
                if (bb[i] != (uint8_t)(i * 31 + (size_t)root)) {
                    free(bb);
                    return failf(rk, -1, "broadcast: bytes %zu root %d: byte %zu", bytes, root, i);
                }
        }
        free(bb);
        free(send);
        free(recv);
        free(want);
    }
    if ((rc = comm_barrier(c)) < 0)
        return failf(rk, rc, "barrier");
    struct comm_stats st;
    comm_get_stats(c, &st);
    if (st.calls == 0 || (n > 1 && (st.bytes_sent == 0 || st.bytes_recv == 0)) ||
        st.seconds <= 0)
        return failf(rk, -1, "stats: calls %llu sent %llu", (unsigned long long)st.calls,
                     (unsigned long long)st.bytes_sent);
    return 0;
}

START_TEST(test_ring_collectives)
{
    int world = _i;
    struct rank rks[MAX_WORLD];
    run_world(world, collectives_body, rks);
    for (int r = 1; r < world; r++)
        ck_assert_msg(memcmp(rks[0].allreduce_out, rks[r].allreduce_out,
                             rks[0].allreduce_count * sizeof(float)) == 0,
                      "all_reduce: rank %d differs from rank 0", r);
    for (int r = 0; r < world; r++)
        free(rks[r].allreduce_out);
}
END_TEST

/* bf16: small integers, so sums are exact whatever the rounding. */
static int bf16_body(struct rank *rk, struct comm *c)
{
    enum { N = 1001 };
    uint16_t buf[N], gathered[N * 3];
    for (int i = 0; i < N; i++) {
        float v = (float)((i + rk->rank) % 17 - 8);
        uint32_t u;
        memcpy(&u, &v, 4);
        buf[i] = (uint16_t)(u >> 16);
    }
    int rc = comm_all_gather(c, buf, gathered, N, COMM_BF16);
    if (rc < 0)
        return failf(rk, rc, "bf16 all_gather");
    if (memcmp(gathered + (size_t)rk->rank * N, buf, sizeof(buf)) != 0)
        return failf(rk, -1, "bf16 all_gather: own block");
    if ((rc = comm_all_reduce(c, buf, N, COMM_BF16, COMM_SUM)) < 0)
        return failf(rk, rc, "bf16 all_reduce");
    for (int i = 0; i < N; i++) {
        float want = 0;
        for (int r = 0; r < rk->world; r++)
            want += (float)((i + r) % 17 - 8);
        uint32_t u = (uint32_t)buf[i] << 16;
        float got;
        memcpy(&got, &u, 4);
        if (got != want)
            return failf(rk, -1, "bf16 all_reduce: element %d", i);
    }
    return 0;
}

START_TEST(test_ring_bf16)
{
    struct rank rks[3];
    run_world(3, bf16_body, rks);
}
END_TEST

/* shift: every rank sends its own pattern (rank r sends 1000 + r bytes, large
 * enough for several ring chunks at the last size) to its successor; then one
 * rank alone sends (the others pass 0 bytes), as a replica restore does. */
static int shift_body(struct rank *rk, struct comm *c)
{
    const int n = rk->world, me = rk->rank, prev = (me + n - 1) % n;
    const size_t sizes[] = {1, 1000, 3u << 20};
    for (size_t k = 0; k < sizeof(sizes) / sizeof(sizes[0]); k++) {
        size_t mine = sizes[k] + (size_t)me, theirs = sizes[k] + (size_t)prev;
        uint8_t *out = malloc(mine), *in = malloc(theirs);
        if (!out || !in) {
            free(out);
            free(in);
            return failf(rk, -ENOMEM, "shift: malloc");
        }
        for (size_t i = 0; i < mine; i++)
            out[i] = (uint8_t)(i * 7 + (size_t)me);
        int rc = comm_shift(c, out, mine, in, theirs);
        for (size_t i = 0; rc == 0 && i < theirs; i++)
            if (in[i] != (uint8_t)(i * 7 + (size_t)prev))
                rc = failf(rk, -1, "shift of %zu bytes: byte %zu from rank %d", theirs, i, prev);
        free(out);
        free(in);
        if (rc)
            return rc < 0 && rc != -1 ? failf(rk, rc, "shift of %zu bytes", mine) : rc;
    }
    /* one sender, rank world - 1, to rank 0 */
    uint32_t word = 0xC0FFEE00u + (uint32_t)n, got = 0;
    int rc = comm_shift(c, &word, me == n - 1 ? sizeof(word) : 0, &got, me == 0 ? sizeof(got) : 0);
    if (rc)
        return failf(rk, rc, "lone shift");
    if (me == 0 && got != word)
        return failf(rk, -1, "lone shift: got %#x", got);
    /* backwards: every rank to its predecessor, then rank 0 alone to rank world - 1 */
    uint64_t mine64 = 0xAB00u + (uint64_t)me, theirs64 = 0;
    if ((rc = comm_shift_back(c, &mine64, sizeof(mine64), &theirs64, sizeof(theirs64))) != 0)
        return failf(rk, rc, "shift back");
    if (theirs64 != 0xAB00u + (uint64_t)((me + 1) % n))
        return failf(rk, -1, "shift back: got %#llx from rank %d", (unsigned long long)theirs64, (me + 1) % n);
    got = 0;
    rc = comm_shift_back(c, &word, me == 0 ? sizeof(word) : 0, &got, me == n - 1 ? sizeof(got) : 0);
    if (rc)
        return failf(rk, rc, "lone shift back");
    if (me == n - 1 && got != word)
        return failf(rk, -1, "lone shift back: got %#x", got);
    return comm_barrier(c) ? failf(rk, -1, "barrier after shift") : 0;
}

START_TEST(test_ring_shift)
{
    struct rank rks[4];
    run_world(_i, shift_body, rks);
}
END_TEST

/* ---- abort ----------------------------------------------------------- */

struct abort_rank {
    struct comm *c;
    const uint8_t *id;
    int rank, rc;
    double returned;
    atomic_int *ready;
};

static void *abort_init(void *arg)
{
    struct abort_rank *a = arg;
    a->rc = comm_init(&a->c, COMM_RING, a->rank, 2, a->id, 10000);
    return NULL;
}

static void *abort_victim(void *arg)
{
    struct abort_rank *a = arg;
    float buf[4096] = {0};
    atomic_store(a->ready, 1);
    a->rc = comm_all_reduce(a->c, buf, 4096, COMM_F32, COMM_SUM);
    a->returned = now_s();
    return NULL;
}

START_TEST(test_ring_abort)
{
    const uint8_t *id = loopback_id();
    atomic_int ready = 0;
    struct abort_rank a[2] = {{.id = id, .rank = 0, .ready = &ready},
                              {.id = id, .rank = 1, .ready = &ready}};
    pthread_t t[2];
    for (int r = 0; r < 2; r++)
        pthread_create(&t[r], NULL, abort_init, &a[r]);
    for (int r = 0; r < 2; r++)
        pthread_join(t[r], NULL);
    ck_assert_int_eq(a[0].rc, 0);
    ck_assert_int_eq(a[1].rc, 0);

    /* rank 0 waits in an all-reduce that rank 1 never joins */
    pthread_create(&t[0], NULL, abort_victim, &a[0]);
    while (!atomic_load(&ready))
        usleep(1000);
    usleep(300 * 1000);
    double t0 = now_s();
    comm_abort(a[0].c);
    comm_abort(a[0].c);
    pthread_join(t[0], NULL);
    double took = a[0].returned - t0;
    ck_assert_int_eq(a[0].rc, -ECANCELED);
    ck_assert_msg(took < 1.0, "aborted collective returned after %.3f s", took);
    ck_assert_int_eq(comm_barrier(a[0].c), -ECANCELED);

    /* the peer fails fast too, and stays failed */
    t0 = now_s();
    int rc = comm_barrier(a[1].c);
    ck_assert_int_eq(rc, -ECONNRESET);
    ck_assert_msg(now_s() - t0 < 1.0, "peer of an aborted rank took %.3f s", now_s() - t0);
    ck_assert_int_eq(comm_barrier(a[1].c), -ECONNRESET);
    comm_destroy(a[0].c);
    comm_destroy(a[1].c);
}
END_TEST

/* ---- a killed peer --------------------------------------------------- */

enum { KILL_COUNT = 1 << 18 };

struct loop_rank {
    pthread_t thread;
    const uint8_t *id;
    int rank;
    atomic_int rc;
    atomic_int iters;
    double failed_at;
};

static int loop_collectives(struct comm *c, atomic_int *iters)
{
    float *buf = calloc(KILL_COUNT, sizeof(float));
    int rc;
    while ((rc = comm_all_reduce(c, buf, KILL_COUNT, COMM_F32, COMM_SUM)) == 0)
        atomic_fetch_add(iters, 1);
    free(buf);
    return rc;
}

static void *loop_main(void *arg)
{
    struct loop_rank *l = arg;
    struct comm *c;
    int rc = comm_init(&c, COMM_RING, l->rank, 3, l->id, 10000);
    if (rc < 0) {
        atomic_store(&l->rc, rc);
        return NULL;
    }
    rc = loop_collectives(c, &l->iters);
    l->failed_at = now_s();
    atomic_store(&l->rc, rc);
    comm_destroy(c);
    return NULL;
}

START_TEST(test_ring_killed_peer)
{
    /* fork first, hand the id over a pipe: the child holds no listener */
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        uint8_t cid[COMM_ID_BYTES];
        close(p[1]);
        if (read(p[0], cid, sizeof(cid)) != (ssize_t)sizeof(cid))
            _exit(2);
        struct comm *c;
        if (comm_init(&c, COMM_RING, 2, 3, cid, 10000) < 0)
            _exit(3);
        atomic_int iters = 0;
        loop_collectives(c, &iters);
        _exit(4);
    }
    close(p[0]);
    const uint8_t *id = loopback_id();
    ck_assert_int_eq(write(p[1], id, COMM_ID_BYTES), COMM_ID_BYTES);
    close(p[1]);

    struct loop_rank l[2] = {{.id = id, .rank = 0}, {.id = id, .rank = 1}};
    for (int r = 0; r < 2; r++)
        pthread_create(&l[r].thread, NULL, loop_main, &l[r]);
    double until = now_s() + 5;
    while ((atomic_load(&l[0].iters) < 3 || atomic_load(&l[1].iters) < 3) && now_s() < until &&
           atomic_load(&l[0].rc) == 0 && atomic_load(&l[1].rc) == 0)
        usleep(1000);
    ck_assert_msg(atomic_load(&l[0].iters) >= 3, "ranks did not get going (rc %d %d)",
                  atomic_load(&l[0].rc), atomic_load(&l[1].rc));
    double killed = now_s();
    kill(pid, SIGKILL);
    for (int r = 0; r < 2; r++)
        pthread_join(l[r].thread, NULL);
    waitpid(pid, NULL, 0);
    for (int r = 0; r < 2; r++) {
        int rc = atomic_load(&l[r].rc);
        ck_assert_msg(rc < 0 && rc != -ECANCELED, "rank %d: rc %d", r, rc);
        double took = l[r].failed_at - killed;
        ck_assert_msg(took < 2.0, "rank %d failed %.3f s after the kill", r, took);
    }
}
END_TEST

/* ---- forming the ring ------------------------------------------------ */

struct init_arg {
    const uint8_t *id;
    int rank, world, timeout_ms, rc;
    struct comm *c;
};

static void *init_main(void *arg)
{
    struct init_arg *a = arg;
    a->rc = comm_init(&a->c, COMM_RING, a->rank, a->world, a->id, a->timeout_ms);
    return NULL;
}

START_TEST(test_ring_bad_nonce)
{
    const uint8_t *id = loopback_id();
    struct init_arg root = {.id = id, .rank = 0, .world = 2, .timeout_ms = 10000};
    pthread_t t;
    pthread_create(&t, NULL, init_main, &root);

    uint8_t bad[COMM_ID_BYTES];
    memcpy(bad, id, sizeof(bad));
    bad[40] ^= 0x5a; /* inside the nonce */
    struct comm *c = NULL;
    double t0 = now_s();
    ck_assert_int_eq(comm_init(&c, COMM_RING, 1, 2, bad, 5000), -EACCES);
    ck_assert_msg(now_s() - t0 < 1.0, "refusal took %.3f s", now_s() - t0);
    ck_assert_ptr_null(c);

    bad[0] ^= 1; /* not an id at all */
    ck_assert_int_eq(comm_init(&c, COMM_RING, 1, 2, bad, 5000), -EINVAL);

    /* the real rank 1 still gets in */
    struct init_arg one = {.id = id, .rank = 1, .world = 2, .timeout_ms = 10000};
    init_main(&one);
    pthread_join(t, NULL);
    ck_assert_int_eq(root.rc, 0);
    ck_assert_int_eq(one.rc, 0);
    comm_destroy(root.c);
    comm_destroy(one.c);
}
END_TEST

START_TEST(test_ring_init_timeout)
{
    const uint8_t *id = loopback_id();
    struct init_arg root = {.id = id, .rank = 0, .world = 3, .timeout_ms = 300};
    double t0 = now_s();
    init_main(&root);
    ck_assert_int_eq(root.rc, -ETIMEDOUT);
    ck_assert_msg(now_s() - t0 < 1.0, "init timeout took %.3f s", now_s() - t0);
    struct comm *c;
    ck_assert_int_eq(comm_init(&c, COMM_RING, 3, 3, id, 100), -EINVAL);
    ck_assert_str_eq(comm_strerror(-ECANCELED), "communicator aborted");
}
END_TEST

/* ---- NCCL -------------------------------------------------------------- */

START_TEST(test_nccl)
{
    if (comm_gpu_count() == 0) {
        fprintf(stderr, "check_comm: nccl backend: skipped: no GPU\n");
        return;
    }
#ifdef MUSTER_HAVE_NCCL
    uint8_t id[COMM_ID_BYTES];
    ck_assert_int_eq(comm_unique_id(COMM_NCCL, id), 0);
    ck_assert_int_eq(cudaSetDevice(0), cudaSuccess);
    struct comm *c;
    int rc = comm_init(&c, COMM_NCCL, 0, 1, id, 60000);
    ck_assert_msg(rc == 0, "comm_init nccl: %s", comm_strerror(rc));
    enum { N = 100003 };
    float *host = malloc(N * sizeof(float)), *back = malloc(N * sizeof(float));
    for (size_t i = 0; i < N; i++)
        host[i] = input(0, i);
    float *dev, *dev2;
    ck_assert_int_eq(cudaMalloc((void **)&dev, N * sizeof(float)), cudaSuccess);
    ck_assert_int_eq(cudaMalloc((void **)&dev2, N * sizeof(float)), cudaSuccess);
    cudaMemcpy(dev, host, N * sizeof(float), cudaMemcpyHostToDevice);
    ck_assert_int_eq(comm_all_gather(c, dev, dev2, N, COMM_F32), 0);
    ck_assert_int_eq(comm_reduce_scatter(c, dev2, dev, N, COMM_F32, COMM_AVG), 0);
    ck_assert_int_eq(comm_all_reduce(c, dev, N, COMM_F32, COMM_SUM), 0);
    ck_assert_int_eq(comm_broadcast(c, dev, N * sizeof(float), 0), 0);
    ck_assert_int_eq(comm_barrier(c), 0);
    cudaMemcpy(back, dev, N * sizeof(float), cudaMemcpyDeviceToHost);
    ck_assert_msg(memcmp(host, back, N * sizeof(float)) == 0, "nccl world 1 changed data");
    comm_abort(c);
    ck_assert_int_eq(comm_barrier(c), -ECANCELED);
    comm_destroy(c);
    cudaFree(dev);
    cudaFree(dev2);
    free(host);
    free(back);
#endif
}
END_TEST

START_TEST(test_nccl_unavailable)
{
#ifdef MUSTER_HAVE_NCCL
    fprintf(stderr, "check_comm: built with NCCL: the -ENOTSUP path: skipped\n");
#else
    uint8_t id[COMM_ID_BYTES];
    ck_assert_int_eq(comm_unique_id(COMM_NCCL, id), -ENOTSUP);
    ck_assert_int_eq(comm_gpu_count(), 0);
#endif
}
END_TEST

Suite *make_comm_suite(void)
{
    Suite *s = suite_create("comm");
    TCase *tc = tcase_create("ring");
    tcase_set_timeout(tc, 20);
    tcase_add_loop_test(tc, test_ring_collectives, 1, 6);
    tcase_add_test(tc, test_ring_bf16);
    tcase_add_loop_test(tc, test_ring_shift, 2, 5);
    suite_add_tcase(s, tc);

    tc = tcase_create("failure");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_ring_abort);
    tcase_add_test(tc, test_ring_killed_peer);
    tcase_add_test(tc, test_ring_bad_nonce);
    tcase_add_test(tc, test_ring_init_timeout);
    suite_add_tcase(s, tc);

    tc = tcase_create("nccl");
    tcase_set_timeout(tc, 60);
    tcase_add_test(tc, test_nccl);
    tcase_add_test(tc, test_nccl_unavailable);
    suite_add_tcase(s, tc);
    return s;
}
