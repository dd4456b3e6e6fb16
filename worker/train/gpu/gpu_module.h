/*
 * gpu_module: the GPU path of muster-train (worker/train/gpu/: the CUDA
 * kernels, the ZeRO-3 schedule, the training loop over them) and the NCCL
 * backend of comm.h, built as one shared module, muster-train-gpu.so, that
 * muster-train loads only when a GPU or NCCL is asked for. A CPU rank so
 * never maps the CUDA runtime, cuBLAS or NCCL (docs/gpu.md).
 *
 * The module exports one symbol, gpu_module_entry(), which returns its
 * table; everything else crosses through that table. The module holds no
 * copy of the trainer's CPU code: data, checkpoints, the run loop and the
 * model's host code are the executable's, exported to it (muster-train is
 * linked with --export-dynamic).
 *
 * gpu_module_load() (worker/train/gpu/gpu_load.c, in the executable) finds
 * and opens the module once: next to the executable, then in
 * ../lib/muster/ beside it (the installed layout). Builds that link the GPU
 * path in statically (cuemu's test programs, -DMUSTER_GPU_STATIC) get the
 * same table without dlopen.
 */
#ifndef MUSTER_GPU_MODULE_H
#define MUSTER_GPU_MODULE_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "worker/train/comm/comm.h"
#include "worker/train/gpu/gpu_train.h"

#define GPU_MODULE_FILE "muster-train-gpu.so"
#define GPU_MODULE_ENTRY "gpu_module_entry"
/* Bumped whenever the table or a type it passes changes. */
#define GPU_MODULE_ABI 5

/* The first three fields stay where they are in every version: they are
 * what tells a module of another build. */
struct gpu_module {
    int abi;                     /* GPU_MODULE_ABI of the module's build */
    const char *version;         /* MUSTER_VERSION of the module's build */
    size_t trainer_size;         /* sizeof(struct gpu_trainer) there */

    /* The GPU path: worker/train/gpu/gpu.h and gpu_train.h. */
    int (*device_name)(char *out, size_t len);
    int (*unique_id)(uint8_t id[GPU_ID_BYTES]);
    const char *(*strerror)(int code);
    void (*zero_abort)(struct gpu_zero *z);
    void (*zero_release)(struct gpu_zero *z);
    size_t (*zero_state_bytes)(const struct gpu_zero *z);
    int (*trainer_init)(struct gpu_trainer *tr, const struct job_spec *spec, int rank, int world,
                        const uint8_t *id, const int *cancel, char *err, size_t errlen);
    void (*trainer_free)(struct gpu_trainer *tr);
    int (*trainer_load)(struct gpu_trainer *tr, const char *path, char *err, size_t errlen);
    int (*trainer_sample)(struct gpu_trainer *tr, int prompt, int *out, int n, char *err,
                          size_t errlen);
    int (*train_run)(struct gpu_trainer *tr, long stop_after, const struct train_hooks *hooks,
                     volatile sig_atomic_t *stop, char *err, size_t errlen);
    /* Healing in place (gpu_train.h). */
    int (*trainer_replicas)(struct gpu_trainer *tr, int every, char *err, size_t errlen);
    int (*trainer_set_comm)(struct gpu_trainer *tr, const uint8_t *id, const int *cancel, char *err,
                            size_t errlen);
    int (*trainer_reset)(struct gpu_trainer *tr, char *err, size_t errlen);
    int (*trainer_reslice)(struct gpu_trainer *tr, int my_rc, int old_world, int ncontrib, const float *const *mine,
                           int nmine, const int *from_rank, const int *from_index, char *err, size_t errlen);
    int (*trainer_read_state)(struct gpu_trainer *tr, int snapshot, float *block);
    int (*trainer_to_host)(struct gpu_trainer *tr, char *err, size_t errlen);
    int (*trainer_failed)(struct gpu_trainer *tr);
    int (*zero_gather_u64)(struct gpu_zero *z, const uint64_t *mine, size_t n, uint64_t *all);

    /* COMM_NCCL of comm.h (worker/train/comm/comm_impl.h). */
    int (*comm_nccl_unique_id)(uint8_t id[COMM_ID_BYTES]);
    int (*comm_nccl_init)(struct comm *c, const uint8_t id[COMM_ID_BYTES], int timeout_ms);
    int (*comm_nccl_gpu_count)(void);
};

/* The module's one export. */
const struct gpu_module *gpu_module_entry(void);

/* The table, loaded on first call (thread-safe); NULL when there is none,
 * with the reason and the fix in err (what was not found, where it was
 * looked for). The answer of the first call is kept. */
const struct gpu_module *gpu_module_load(char *err, size_t errlen);

/* 1 when this build has a GPU path at all (nvcc was found). */
int gpu_module_built(void);

#endif
