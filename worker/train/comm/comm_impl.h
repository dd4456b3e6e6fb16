/*
 * What comm.c (argument checks, sticky errors, stats) shares with the
 * backends (comm_ring.c, comm_nccl.c). Not for users of comm.h.
 */
#ifndef MUSTER_COMM_IMPL_H
#define MUSTER_COMM_IMPL_H

#include <stdatomic.h>

#include "worker/train/comm/comm.h"

/* A backend's collectives. Arguments are checked, the communicator is known
 * healthy and count/bytes are > 0 when these run; world > 1 too, except for
 * NCCL which handles world 1 itself. */
struct comm_ops {
    int (*all_gather)(struct comm *c, const void *send, void *recv, size_t count,
                      enum comm_dtype dtype);
    int (*reduce_scatter)(struct comm *c, const void *send, void *recv, size_t count,
                          enum comm_dtype dtype, enum comm_op op);
    int (*all_reduce)(struct comm *c, void *buf, size_t count, enum comm_dtype dtype,
                      enum comm_op op);
    int (*broadcast)(struct comm *c, void *buf, size_t bytes, int root);
    int (*barrier)(struct comm *c);
    /* NULL: not offered by the backend (comm_shift answers -ENOTSUP) */
    int (*shift)(struct comm *c, const void *send, size_t sbytes, void *recv, size_t rbytes, int back);
    void (*abort)(struct comm *c);   /* after c->aborted is set; any thread */
    void (*destroy)(struct comm *c); /* frees c->be */
};

struct comm {
    enum comm_backend backend;
    int rank, world;
    atomic_int timeout_ms;
    atomic_int aborted;
    atomic_int failed;             /* first error of a collective, sticky */
    atomic_uint_fast64_t bytes_sent, bytes_recv, calls, nanos;
    const struct comm_ops *ops;
    void *be;                      /* backend state */
    const atomic_int *init_cancel; /* comm_init_cancelable's flag, during init (ring) */
};

size_t comm_dtype_size(enum comm_dtype dtype);

/* Backends: fill c->ops and c->be (c->rank, world, timeout_ms are set). */
int comm_ring_unique_id(uint8_t id[COMM_ID_BYTES]);
int comm_ring_init(struct comm *c, const uint8_t id[COMM_ID_BYTES], int timeout_ms);
int comm_nccl_unique_id(uint8_t id[COMM_ID_BYTES]);
int comm_nccl_init(struct comm *c, const uint8_t id[COMM_ID_BYTES], int timeout_ms);
int comm_nccl_gpu_count(void);

#endif
