/*
 * COMM_NCCL: the collectives over NCCL, on device buffers.
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0) so that no
 * NCCL call can hold a thread forever: every call is enqueued on the
 * communicator's own stream, then completion is polled (async error, then
 * the stream) together with the abort flag and the timeout. An error, a
 * timeout or comm_abort() ends in ncclCommAbort(), done by the thread that
 * is polling, or by comm_abort() itself when no collective is running.
 * Collectives return when the data is in place (the stream has drained).
 *
 * Built only with MUSTER_HAVE_NCCL (the Makefile sets it when nccl.h is
 * found); otherwise every entry point says "built without NCCL" once and
 * returns -ENOTSUP.
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "worker/train/comm/comm_impl.h"

#ifdef MUSTER_HAVE_NCCL

#include <pthread.h>
#include <sched.h>
#include <stdlib.h>
#include <time.h>

#include <cuda_runtime.h>
#include <nccl.h>

#define SPIN_MS 2          /* poll without sleeping this long, then nap */
#define NAP_US 50
#define FINALIZE_MS 10000  /* comm_destroy waits this long for a clean finish */

struct nccl {
    ncclComm_t comm;
    cudaStream_t stream;
    float *scratch;        /* one device float for barrier */
    pthread_mutex_t lock;  /* guards busy and gone */
    int busy;              /* a collective is polling: it does the abort */
    int gone;              /* ncclCommAbort ran */
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void nap(uint64_t started)
{
    if (now_ms() - started < SPIN_MS) {
        sched_yield();
        return;
    }
    struct timespec ts = {0, NAP_US * 1000};
    nanosleep(&ts, NULL);
}

static int from_nccl(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return 0;
    case ncclUnhandledCudaError: return COMM_E_CUDA;
    case ncclSystemError: return -EIO;
    case ncclRemoteError: return -ECONNRESET;
    case ncclInvalidArgument:
    case ncclInvalidUsage: return -EINVAL;
    case ncclInProgress: return -EINPROGRESS;
    default: return COMM_E_NCCL;
    }
}

static void log_nccl(const char *what, ncclResult_t r, ncclComm_t comm)
{
    const char *last = comm ? ncclGetLastError(comm) : NULL;
    fprintf(stderr, "comm: nccl: %s: %s%s%s\n", what, ncclGetErrorString(r),
            last && *last ? ": " : "", last ? last : "");
}

static ncclDataType_t to_dtype(enum comm_dtype dtype)
{
    return dtype == COMM_BF16 ? ncclBfloat16 : ncclFloat32;
}

static ncclRedOp_t to_op(enum comm_op op)
{
    return op == COMM_AVG ? ncclAvg : op == COMM_MAX ? ncclMax : ncclSum;
}

/* Polls the communicator until it is no longer ncclInProgress. */
static int wait_ready(ncclComm_t comm, const atomic_int *aborted, uint64_t started,
                      int timeout_ms)
{
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(comm, &st);
        if (r != ncclSuccess)
            st = r;
        if (st != ncclInProgress) {
            if (st != ncclSuccess)
                log_nccl("async error", st, comm);
            return from_nccl(st);
        }
        if (aborted && atomic_load(aborted))
            return -ECANCELED;
        if (now_ms() - started >= (uint64_t)timeout_ms)
            return -ETIMEDOUT;
        nap(started);
    }
}

/* Waits for an enqueued collective: NCCL done enqueueing, then the stream
 * drained, watching abort and the timeout all along. */
static int wait_done(struct comm *c, ncclResult_t enq)
{
    struct nccl *n = c->be;
    if (enq != ncclSuccess && enq != ncclInProgress) {
        log_nccl("enqueue", enq, n->comm);
        return from_nccl(enq);
    }
    uint64_t started = now_ms();
    int timeout_ms = atomic_load(&c->timeout_ms);
    int rc = wait_ready(n->comm, &c->aborted, started, timeout_ms);
    while (rc == 0) {
        cudaError_t ce = cudaStreamQuery(n->stream);
        if (ce == cudaSuccess)
            return 0;
        if (ce != cudaErrorNotReady) {
            fprintf(stderr, "comm: nccl: stream: %s\n", cudaGetErrorString(ce));
            return COMM_E_CUDA;
        }
        ncclResult_t st = ncclSuccess;
        if (ncclCommGetAsyncError(n->comm, &st) != ncclSuccess || st != ncclSuccess)
            rc = wait_ready(n->comm, &c->aborted, started, timeout_ms);
        else if (atomic_load(&c->aborted))
            rc = -ECANCELED;
        else if (now_ms() - started >= (uint64_t)timeout_ms)
            rc = -ETIMEDOUT;
        else
            nap(started);
    }
    return rc;
}

static int begin(struct comm *c)
{
    struct nccl *n = c->be;
    pthread_mutex_lock(&n->lock);
    int gone = n->gone;
    if (!gone)
        n->busy = 1;
    pthread_mutex_unlock(&n->lock);
    return gone ? -ECANCELED : 0;
}

/* Ends a collective; a failed one takes the communicator down. */
static int end(struct comm *c, int rc)
{
    struct nccl *n = c->be;
    pthread_mutex_lock(&n->lock);
    n->busy = 0;
    if ((rc < 0 || atomic_load(&c->aborted)) && !n->gone) {
        ncclCommAbort(n->comm);
        n->gone = 1;
    }
    pthread_mutex_unlock(&n->lock);
    return rc;
}

static int nccl_all_gather(struct comm *c, const void *send, void *recv, size_t count,
                           enum comm_dtype dtype)
{
    struct nccl *n = c->be;
    int rc = begin(c);
    if (rc < 0)
        return rc;
    rc = wait_done(c, ncclAllGather(send, recv, count, to_dtype(dtype), n->comm, n->stream));
    if (rc == 0) {
        uint64_t bytes = count * comm_dtype_size(dtype) * (size_t)(c->world - 1);
        atomic_fetch_add(&c->bytes_sent, bytes);
        atomic_fetch_add(&c->bytes_recv, bytes);
    }
    return end(c, rc);
}

static int nccl_reduce_scatter(struct comm *c, const void *send, void *recv, size_t count,
                               enum comm_dtype dtype, enum comm_op op)
{
    struct nccl *n = c->be;
    int rc = begin(c);
    if (rc < 0)
        return rc;
    rc = wait_done(c, ncclReduceScatter(send, recv, count, to_dtype(dtype), to_op(op),
                                        n->comm, n->stream));
    if (rc == 0) {
        uint64_t bytes = count * comm_dtype_size(dtype) * (size_t)(c->world - 1);
        atomic_fetch_add(&c->bytes_sent, bytes);
        atomic_fetch_add(&c->bytes_recv, bytes);
    }
    return end(c, rc);
}

static int nccl_all_reduce(struct comm *c, void *buf, size_t count, enum comm_dtype dtype,
                           enum comm_op op)
{
    struct nccl *n = c->be;
    int rc = begin(c);
    if (rc < 0)
        return rc;
    rc = wait_done(c, ncclAllReduce(buf, buf, count, to_dtype(dtype), to_op(op),
                                    n->comm, n->stream));
    if (rc == 0) {
        /* what a ring moves: 2 (N-1)/N of the buffer each way */
        uint64_t bytes = 2 * count * comm_dtype_size(dtype) * (size_t)(c->world - 1)
                         / (size_t)c->world;
        atomic_fetch_add(&c->bytes_sent, bytes);
        atomic_fetch_add(&c->bytes_recv, bytes);
    }
    return end(c, rc);
}

static int nccl_broadcast(struct comm *c, void *buf, size_t bytes, int root)
{
    struct nccl *n = c->be;
    int rc = begin(c);
    if (rc < 0)
        return rc;
    rc = wait_done(c, ncclBroadcast(buf, buf, bytes, ncclUint8, root, n->comm, n->stream));
    if (rc == 0 && c->world > 1) {
        if (c->rank != root)
            atomic_fetch_add(&c->bytes_recv, bytes);
        atomic_fetch_add(&c->bytes_sent, bytes);
    }
    return end(c, rc);
}

static int nccl_barrier(struct comm *c)
{
    struct nccl *n = c->be;
    int rc = begin(c);
    if (rc < 0)
        return rc;
    rc = wait_done(c, ncclAllReduce(n->scratch, n->scratch, 1, ncclFloat32, ncclSum,
                                    n->comm, n->stream));
    return end(c, rc);
}

static void nccl_abort(struct comm *c)
{
    struct nccl *n = c->be;
    pthread_mutex_lock(&n->lock);
    if (!n->busy && !n->gone) {
        ncclCommAbort(n->comm);
        n->gone = 1;
    }
    pthread_mutex_unlock(&n->lock);
}

static void nccl_destroy(struct comm *c)
{
    struct nccl *n = c->be;
    if (!n->gone) {
        uint64_t started = now_ms();
        ncclResult_t r = ncclCommFinalize(n->comm);
        int rc = (r == ncclSuccess || r == ncclInProgress)
                     ? wait_ready(n->comm, NULL, started, FINALIZE_MS) : from_nccl(r);
        if (rc == 0)
            ncclCommDestroy(n->comm);
        else
            ncclCommAbort(n->comm);
    }
    cudaFree(n->scratch);
    cudaStreamDestroy(n->stream);
    pthread_mutex_destroy(&n->lock);
    free(n);
}

static const struct comm_ops nccl_ops = {
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_reduce = nccl_all_reduce,
    .broadcast = nccl_broadcast,
    .barrier = nccl_barrier,
    .abort = nccl_abort,
    .destroy = nccl_destroy,
};

int comm_nccl_unique_id(uint8_t id[COMM_ID_BYTES])
{
    ncclUniqueId uid;
    ncclResult_t r = ncclGetUniqueId(&uid);
    if (r != ncclSuccess) {
        log_nccl("ncclGetUniqueId", r, NULL);
        return from_nccl(r);
    }
    memcpy(id, uid.internal, COMM_ID_BYTES);
    return 0;
}

int comm_nccl_init(struct comm *c, const uint8_t id[COMM_ID_BYTES], int timeout_ms)
{
    struct nccl *n = calloc(1, sizeof(*n));
    if (!n)
        return -ENOMEM;
    pthread_mutex_init(&n->lock, NULL);
    cudaError_t ce = cudaStreamCreateWithFlags(&n->stream, cudaStreamNonBlocking);
    if (ce == cudaSuccess)
        ce = cudaMalloc((void **)&n->scratch, sizeof(float));
    if (ce != cudaSuccess) {
        fprintf(stderr, "comm: nccl: %s\n", cudaGetErrorString(ce));
        if (n->stream)
            cudaStreamDestroy(n->stream);
        pthread_mutex_destroy(&n->lock);
        free(n);
        return COMM_E_CUDA;
    }
    ncclUniqueId uid;
    memcpy(uid.internal, id, COMM_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    uint64_t started = now_ms();
    ncclResult_t r = ncclCommInitRankConfig(&n->comm, c->world, uid, c->rank, &cfg);
    int rc;
    if (r == ncclSuccess || r == ncclInProgress) {
        rc = wait_ready(n->comm, NULL, started, timeout_ms);
        if (rc < 0)
            ncclCommAbort(n->comm);
    } else {
        log_nccl("ncclCommInitRankConfig", r, NULL);
        rc = from_nccl(r);
    }
    if (rc < 0) {
        cudaFree(n->scratch);
        cudaStreamDestroy(n->stream);
        pthread_mutex_destroy(&n->lock);
        free(n);
        return rc;
    }
    c->be = n;
    c->ops = &nccl_ops;
    return 0;
}

int comm_nccl_gpu_count(void)
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess)
        return 0;
    return count;
}

#else /* !MUSTER_HAVE_NCCL */

#include <stdatomic.h>

static int without_nccl(void)
{
    static atomic_flag said = ATOMIC_FLAG_INIT;
    if (!atomic_flag_test_and_set(&said))
        fprintf(stderr, "comm: the nccl backend is unavailable: built without NCCL "
                        "(nccl.h was not found at build time)\n");
    return -ENOTSUP;
}

int comm_nccl_unique_id(uint8_t id[COMM_ID_BYTES])
{
    return without_nccl();
}

int comm_nccl_init(struct comm *c, const uint8_t id[COMM_ID_BYTES], int timeout_ms)
{
    return without_nccl();
}

int comm_nccl_gpu_count(void)
{
    return 0;
}

#endif
