/*
 * rank_env: what a rank process is started with: its argument vector (the
 * --rank-cmd line split on whitespace, no shell) and its environment (the
 * agent's own plus the rank's identity and its one visible device).
 * Pure functions; the results are malloc'd NULL-terminated arrays.
 */
#ifndef MUSTER_WORKER_RANK_ENV_H
#define MUSTER_WORKER_RANK_ENV_H

#include <stdint.h>

#include "proto/proto.h"

/* The control socket is the rank's file descriptor 3. */
#define RANK_CTL_FD 3

struct rank_identity {
    uint32_t rank;
    uint32_t local_rank;
    uint32_t world_size;
    uint32_t local_world_size;
    uint64_t generation;
    const char *node;
    enum proto_device_kind kind;
    uint32_t device; /* gpu ordinal; ignored for cpu */
};

/*
 * parent (may be NULL) plus RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,
 * MUSTER_GENERATION, MUSTER_NODE, MUSTER_CTL_FD and CUDA_VISIBLE_DEVICES
 * (the ordinal for a gpu, empty for cpu); parent entries of those names are
 * replaced. Returns NULL when out of memory.
 */
char **rank_env_build(char *const *parent, const struct rank_identity *id);

/* Splits cmd on spaces and tabs; NULL when empty or out of memory. */
char **rank_argv_split(const char *cmd);

/* Frees what either function returned (NULL is fine). */
void rank_strv_free(char **v);

#endif
