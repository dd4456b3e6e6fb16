/*
 * comm: the collectives muster-train needs for ZeRO-3, over one of two
 * backends.
 *
 *   COMM_RING  TCP ring between processes (or threads), host buffers. For
 *              CPUs, development and tests. Reductions are deterministic:
 *              see "Summation order" below.
 *   COMM_NCCL  NCCL, device buffers (pointers from cudaMalloc on the device
 *              that was current when comm_init ran). Built only when nccl.h
 *              was found; otherwise every call returns -ENOTSUP.
 *
 * Life cycle: rank 0 calls comm_unique_id(), hands the 128 bytes to every
 * rank by some other channel (the agent), then every rank calls comm_init()
 * with the same id and world size; collectives follow, in the same order on
 * every rank; comm_destroy() ends it.
 *
 * Errors: every call returns 0 or a negative code (-errno, or COMM_E_*);
 * comm_strerror() says it in words. The important ones:
 *   -ECANCELED   comm_abort() was called
 *   -ECONNRESET  a peer closed, died or aborted
 *   -ETIMEDOUT   no progress for the timeout (comm_set_timeout)
 *   -EACCES      the id's nonce was refused (stale or foreign id)
 *   -ENOTSUP     backend or dtype/op not available in this build
 * After an error the communicator is broken: every later collective returns
 * the same code at once; only comm_destroy() is left to do.
 *
 * Threads: one thread at a time may run collectives on a communicator;
 * comm_abort() and comm_get_stats() may be called from any thread at any
 * time before comm_destroy().
 *
 * Summation order (COMM_RING): block b of a reduce-scatter (and of the
 * reduce-scatter inside all-reduce) is summed along the ring starting after
 * its owner, ((x[b+1] + x[b+2]) + ...) + x[b], indices mod world, then
 * divided by world for COMM_AVG. The order depends only on the world size,
 * so the same inputs give bit-identical results on every run and, for
 * all-reduce, on every rank.
 */
#ifndef MUSTER_COMM_H
#define MUSTER_COMM_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#define COMM_ID_BYTES 128

/* Default collective timeout: this long without a byte of progress fails. */
#define COMM_DEFAULT_TIMEOUT_MS 300000

enum comm_backend { COMM_RING, COMM_NCCL };

/* COMM_BF16 reductions on the ring accumulate each hop in fp32 and round. */
enum comm_dtype { COMM_F32, COMM_BF16 };

enum comm_op { COMM_SUM, COMM_AVG, COMM_MAX };

/* Codes beyond errno. */
enum {
    COMM_E_NCCL = -4001, /* NCCL reported an internal error */
    COMM_E_CUDA = -4002, /* a CUDA call failed */
    COMM_E_PROTO = -4003 /* a peer spoke something that is not the ring protocol */
};

struct comm;

/* What a communicator has done so far; cumulative, read at any time. */
struct comm_stats {
    uint64_t bytes_sent; /* payload bytes this rank put on the wire */
    uint64_t bytes_recv;
    uint64_t calls;      /* collectives entered */
    double seconds;      /* wall time spent inside collectives */
};

/* Rank 0 only. Ring: binds a listening socket on $MUSTER_COMM_ADDR, else the
 * first non-loopback IPv4 address that is up, else 127.0.0.1, on an ephemeral
 * port, and keeps it for comm_init of rank 0 in this process; the id holds
 * that address, the port and a random nonce. NCCL: ncclGetUniqueId. */
int comm_unique_id(enum comm_backend backend, uint8_t id[COMM_ID_BYTES]);

/* Joins the communicator; returns once every rank is connected, or fails
 * after timeout_ms (<= 0: COMM_DEFAULT_TIMEOUT_MS). NCCL: uses the current
 * CUDA device (cudaSetDevice before). */
int comm_init(struct comm **out, enum comm_backend backend, int rank, int world,
              const uint8_t id[COMM_ID_BYTES], int timeout_ms);
/* The same, given up with -ECANCELED as soon as *cancel is non-zero (ring:
 * checked every 100 ms while waiting for peers; NULL: never), e.g. when a
 * newer generation makes the one being formed moot. */
int comm_init_cancelable(struct comm **out, enum comm_backend backend, int rank, int world,
                         const uint8_t id[COMM_ID_BYTES], int timeout_ms, const atomic_int *cancel);

/* recv holds world * count elements; rank r's send lands at r * count.
 * In place: send == recv + rank * count. */
int comm_all_gather(struct comm *c, const void *send, void *recv, size_t count,
                    enum comm_dtype dtype);

/* send holds world * count elements; recv gets this rank's block (rank *
 * count), reduced over all ranks. In place: recv == send + rank * count. */
int comm_reduce_scatter(struct comm *c, const void *send, void *recv, size_t count,
                        enum comm_dtype dtype, enum comm_op op);

/* In place; count need not be a multiple of world. Same result on every rank. */
int comm_all_reduce(struct comm *c, void *buf, size_t count, enum comm_dtype dtype,
                    enum comm_op op);

/* root's bytes to every rank. */
int comm_broadcast(struct comm *c, void *buf, size_t bytes, int root);

/* Returns once every rank has entered it. */
int comm_barrier(struct comm *c);

/* Point to point along the ring: sbytes of send to rank + 1 while rbytes
 * arrive into recv from rank - 1 (indices mod world). Either may be 0; each
 * rank's sbytes must equal its successor's rbytes. Returns when both are
 * done: the successor may not have read the last bytes yet (a barrier after
 * it says that everyone has). Ring only (-ENOTSUP on NCCL); world 1 copies
 * send to recv. comm_shift_back: the other way, to rank - 1 from rank + 1. */
int comm_shift(struct comm *c, const void *send, size_t sbytes, void *recv, size_t rbytes);
int comm_shift_back(struct comm *c, const void *send, size_t sbytes, void *recv, size_t rbytes);

/* Makes the pending collective (if any) and every later one return
 * -ECANCELED within a second; peers see -ECONNRESET. Thread-safe and
 * idempotent. */
void comm_abort(struct comm *c);

/* Frees everything; no other thread may be using c. NULL is fine. */
void comm_destroy(struct comm *c);

/* No byte of progress for timeout_ms fails a collective with -ETIMEDOUT
 * (ring; NCCL: the whole call). <= 0 restores the default. */
void comm_set_timeout(struct comm *c, int timeout_ms);

void comm_get_stats(const struct comm *c, struct comm_stats *out);
int comm_rank(const struct comm *c);
int comm_world(const struct comm *c);
enum comm_backend comm_backend_of(const struct comm *c);

/* CUDA devices NCCL could use here: 0 when built without NCCL or without a
 * GPU (so callers and tests can skip the NCCL backend). */
int comm_gpu_count(void);

const char *comm_strerror(int code);
const char *comm_backend_name(enum comm_backend backend);

#endif
