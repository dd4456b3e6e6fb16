/*
 * comm.h front: checks arguments, keeps the sticky error and the counters,
 * and hands each call to its backend.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/train/comm/comm_impl.h"

size_t comm_dtype_size(enum comm_dtype dtype)
{
    switch (dtype) {
    case COMM_F32: return 4;
    case COMM_BF16: return 2;
    }
    return 0;
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static int valid_backend(enum comm_backend backend)
{
    return backend == COMM_RING || backend == COMM_NCCL;
}

int comm_unique_id(enum comm_backend backend, uint8_t id[COMM_ID_BYTES])
{
    if (!id || !valid_backend(backend))
        return -EINVAL;
    memset(id, 0, COMM_ID_BYTES);
    return backend == COMM_RING ? comm_ring_unique_id(id) : comm_nccl_unique_id(id);
}

int comm_init(struct comm **out, enum comm_backend backend, int rank, int world,
              const uint8_t id[COMM_ID_BYTES], int timeout_ms)
{
    return comm_init_cancelable(out, backend, rank, world, id, timeout_ms, NULL);
}

int comm_init_cancelable(struct comm **out, enum comm_backend backend, int rank, int world,
                         const uint8_t id[COMM_ID_BYTES], int timeout_ms, const atomic_int *cancel)
{
    if (!out || !id || !valid_backend(backend) || world < 1 || rank < 0 || rank >= world)
        return -EINVAL;
    *out = NULL;
    struct comm *c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->backend = backend;
    c->rank = rank;
    c->world = world;
    atomic_init(&c->timeout_ms, COMM_DEFAULT_TIMEOUT_MS);
    if (timeout_ms <= 0)
        timeout_ms = COMM_DEFAULT_TIMEOUT_MS;
    c->init_cancel = cancel;
    int rc = backend == COMM_RING ? comm_ring_init(c, id, timeout_ms)
                                  : comm_nccl_init(c, id, timeout_ms);
    if (rc < 0) {
        free(c);
        return rc;
    }
    *out = c;
    return 0;
}

/* Common entry of every collective: 0 to go on, or the code to return. */
static int enter(struct comm *c)
{
    if (!c)
        return -EINVAL;
    if (atomic_load(&c->aborted))
        return -ECANCELED;
    int failed = atomic_load(&c->failed);
    if (failed)
        return failed;
    atomic_fetch_add(&c->calls, 1);
    return 0;
}

static int leave(struct comm *c, int rc, uint64_t t0)
{
    atomic_fetch_add(&c->nanos, now_ns() - t0);
    if (rc < 0) {
        if (atomic_load(&c->aborted))
            rc = -ECANCELED;
        int expected = 0;
        atomic_compare_exchange_strong(&c->failed, &expected, rc);
    }
    return rc;
}

/* The ring has no backend work to do for one rank: copies and scaling. */
static int single(struct comm *c)
{
    return c->world == 1 && c->backend == COMM_RING;
}

static int valid_op(enum comm_op op)
{
    return op == COMM_SUM || op == COMM_AVG || op == COMM_MAX;
}

/* rank 1 of 1: AVG divides by 1, so the block is the input as is. */
static void copy_block(void *dst, const void *src, size_t bytes)
{
    if (dst != src)
        memmove(dst, src, bytes);
}

int comm_all_gather(struct comm *c, const void *send, void *recv, size_t count,
                    enum comm_dtype dtype)
{
    size_t es = comm_dtype_size(dtype);
    if (!c || !es || (count && (!send || !recv)))
        return -EINVAL;
    int rc = enter(c);
    if (rc < 0 || count == 0)
        return rc;
    uint64_t t0 = now_ns();
    if (single(c)) {
        copy_block(recv, send, count * es);
        return leave(c, 0, t0);
    }
    return leave(c, c->ops->all_gather(c, send, recv, count, dtype), t0);
}

int comm_reduce_scatter(struct comm *c, const void *send, void *recv, size_t count,
                        enum comm_dtype dtype, enum comm_op op)
{
    size_t es = comm_dtype_size(dtype);
    if (!c || !es || !valid_op(op) || (count && (!send || !recv)))
        return -EINVAL;
    int rc = enter(c);
    if (rc < 0 || count == 0)
        return rc;
    uint64_t t0 = now_ns();
    if (single(c)) {
        copy_block(recv, send, count * es);
        return leave(c, 0, t0);
    }
    return leave(c, c->ops->reduce_scatter(c, send, recv, count, dtype, op), t0);
}

int comm_all_reduce(struct comm *c, void *buf, size_t count, enum comm_dtype dtype,
                    enum comm_op op)
{
    if (!c || !comm_dtype_size(dtype) || !valid_op(op) || (count && !buf))
        return -EINVAL;
    int rc = enter(c);
    if (rc < 0 || count == 0)
        return rc;
    uint64_t t0 = now_ns();
    if (single(c))
        return leave(c, 0, t0);
    return leave(c, c->ops->all_reduce(c, buf, count, dtype, op), t0);
}

int comm_broadcast(struct comm *c, void *buf, size_t bytes, int root)
{
    if (!c || (bytes && !buf) || root < 0 || root >= c->world)
        return -EINVAL;
    int rc = enter(c);
    if (rc < 0 || bytes == 0)
        return rc;
    uint64_t t0 = now_ns();
    if (single(c))
        return leave(c, 0, t0);
    return leave(c, c->ops->broadcast(c, buf, bytes, root), t0);
}

int comm_barrier(struct comm *c)
{
    int rc = enter(c);
    if (rc < 0)
        return rc;
    uint64_t t0 = now_ns();
    if (single(c))
        return leave(c, 0, t0);
    return leave(c, c->ops->barrier(c), t0);
}

static int shift(struct comm *c, const void *send, size_t sbytes, void *recv, size_t rbytes, int back)
{
    if (!c || (sbytes && !send) || (rbytes && !recv) || (single(c) && sbytes != rbytes))
        return -EINVAL;
    if (!c->ops->shift)
        return -ENOTSUP;
    int rc = enter(c);
    if (rc < 0 || (sbytes == 0 && rbytes == 0))
        return rc;
    uint64_t t0 = now_ns();
    if (single(c)) {
        copy_block(recv, send, sbytes);
        return leave(c, 0, t0);
    }
    return leave(c, c->ops->shift(c, send, sbytes, recv, rbytes, back), t0);
}

int comm_shift(struct comm *c, const void *send, size_t sbytes, void *recv, size_t rbytes)
{
    return shift(c, send, sbytes, recv, rbytes, 0);
}

int comm_shift_back(struct comm *c, const void *send, size_t sbytes, void *recv, size_t rbytes)
{
    return shift(c, send, sbytes, recv, rbytes, 1);
}

void comm_abort(struct comm *c)
{
    if (!c)
        return;
    if (atomic_exchange(&c->aborted, 1) == 0)
        c->ops->abort(c);
}

void comm_destroy(struct comm *c)
{
    if (!c)
        return;
    c->ops->destroy(c);
    free(c);
}

void comm_set_timeout(struct comm *c, int timeout_ms)
{
    if (c)
        atomic_store(&c->timeout_ms, timeout_ms > 0 ? timeout_ms : COMM_DEFAULT_TIMEOUT_MS);
}

void comm_get_stats(const struct comm *c, struct comm_stats *out)
{
    struct comm *m = (struct comm *)c; /* atomics are read, never written */
    out->bytes_sent = atomic_load(&m->bytes_sent);
    out->bytes_recv = atomic_load(&m->bytes_recv);
    out->calls = atomic_load(&m->calls);
    out->seconds = (double)atomic_load(&m->nanos) / 1e9;
}

int comm_rank(const struct comm *c) { return c->rank; }
int comm_world(const struct comm *c) { return c->world; }
enum comm_backend comm_backend_of(const struct comm *c) { return c->backend; }

int comm_gpu_count(void)
{
    return comm_nccl_gpu_count();
}

const char *comm_backend_name(enum comm_backend backend)
{
    switch (backend) {
    case COMM_RING: return "ring";
    case COMM_NCCL: return "nccl";
    }
    return "unknown";
}

const char *comm_strerror(int code)
{
    switch (code) {
    case 0: return "success";
    case COMM_E_NCCL: return "NCCL error";
    case COMM_E_CUDA: return "CUDA error";
    case COMM_E_PROTO: return "peer broke the ring protocol";
    case -ECANCELED: return "communicator aborted";
    case -ECONNRESET: return "a peer closed, died or aborted";
    case -ETIMEDOUT: return "no progress before the timeout";
    case -EACCES: return "unique id refused (wrong nonce)";
    case -ENOTSUP: return "not supported by this backend or build";
    }
    return code < 0 ? strerror(-code) : "unknown comm error";
}
