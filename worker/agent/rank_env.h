/*
 * rank_env: the environment a rank process is started with: the agent's own, plus the rank's identity under
 * torchrun's names and meanings (so that a PyTorch program runs unmodified,
 * docs/rank-env.md lists every variable), muster's own variables and the
 * devices it sees. Pure functions; the results are malloc'd NULL-terminated
 * arrays.
 *
 * Devices: a user's program sees its node's job devices as torchrun shows
 * them, CUDA_VISIBLE_DEVICES listing them in LOCAL_RANK order, so that
 * cuda:LOCAL_RANK (torch.cuda.set_device(LOCAL_RANK), DeepSpeed's and
 * accelerate's choice) is the rank's own GPU and NCCL can reach its node
 * peers' GPUs over CUDA IPC; muster-train (and a job with visible_devices
 * "own") sees only its own device, as cuda:0.
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
    uint32_t node_rank;        /* GROUP_RANK: the node's index among the members */
    uint32_t nnodes;           /* GROUP_WORLD_SIZE */
    uint64_t generation;
    uint32_t restart_count;    /* TORCHELASTIC_RESTART_COUNT */
    uint32_t max_restarts;     /* TORCHELASTIC_MAX_RESTARTS */
    const char *run_id;        /* TORCHELASTIC_RUN_ID: the job's name */
    const char *master_addr;   /* rank 0's node, as the ranks reach it */
    uint32_t master_port;      /* free on that node for this generation */
    const char *error_file;    /* TORCHELASTIC_ERROR_FILE; NULL or "" = unset */
    uint32_t omp_threads;      /* OMP_NUM_THREADS unless the parent sets it; 0 = leave */
    const char *node;
    const char *python_path;   /* muster's start-up hook, put first on PYTHONPATH; NULL or "" = none */
    const char *rank_dir;      /* MUSTER_RANK_DIR: the rank's directory on the node; NULL or "" = unset */
    int stacks_signal;         /* MUSTER_STACKS_SIGNAL: dumps the hook's stacks there; 0 = unset */
    uint32_t fr_buffer;        /* TORCH_FR_BUFFER_SIZE (torch's flight recorder, read by the hook) unless the
                                * agent's environment sets it; 0 = unset */
    enum proto_device_kind kind;
    uint32_t device; /* its own gpu ordinal; ignored for cpu */
    /* The ordinals CUDA_VISIBLE_DEVICES lists, in LOCAL_RANK order (device at index
     * local_rank); NULL or 0 = device alone. Ignored for cpu. */
    const uint32_t *visible;
    uint32_t nvisible;
};

/*
 * parent (may be NULL) plus the rank's variables. Those the agent owns
 * (RANK, WORLD_SIZE, MASTER_ADDR, ...) replace parent entries of the same
 * name, so that a platform's node-level values never reach a rank;
 * OMP_NUM_THREADS is a default that a parent entry keeps. NCCL's and torch's
 * error handling (TORCH_NCCL_ASYNC_ERROR_HANDLING, ...) is left as the parent
 * has it: torch's own default when unset. Returns NULL when out of memory.
 */
char **rank_env_build(char *const *parent, const struct rank_identity *id);

/* Looks up name in a NULL-terminated environment; NULL when absent. */
const char *rank_env_get(char *const *env, const char *name);

/* What rank_env_build returns is freed with cmdline_free (common/cmdline.h). */

#endif
