/*
 * gpu: the GPT-2 model of worker/train/model.h on one CUDA device, trained
 * with ZeRO-3 over NCCL. C-callable; the implementation is CUDA
 * (worker/train/gpu/gpu_zero.cu, gpu_kernels.cu) and is only built when nvcc was
 * found (MUSTER_HAVE_CUDA). See docs/gpu.md.
 *
 * Same units, tensors and layout as the CPU model (unit 0 embedding, units
 * 1..L blocks, unit L+1 final norm; tied head). Each rank keeps its shard of
 * every unit in fp32 on the device: weights, AdamW moments, gradient (16
 * bytes per owned parameter). Before each forward the shard is cast to bf16
 * and the units are all-gathered in bf16 on a communication stream, unit
 * l+1 while unit l computes; gradients of each unit are computed in fp32 and
 * reduce-scattered in fp32 (average over ranks) on the same communication
 * stream, behind the compute. Events order the two streams; the host waits
 * once per step, for the loss and the gradient norm.
 *
 * Errors: functions return 0 or a negative code (gpu_strerror); the reason,
 * naming the CUDA/cuBLAS/NCCL call, the error's name and a diagnosis (out of
 * memory: bytes asked, bytes free, which preset would fit) is in
 * gpu_zero_error().
 */
#ifndef MUSTER_GPU_H
#define MUSTER_GPU_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "worker/train/model.h"
#include "worker/train/optim.h"

enum {
    GPU_E_NCCL = -4001,   /* same values as COMM_E_NCCL / COMM_E_CUDA */
    GPU_E_CUDA = -4002,
    GPU_E_CUBLAS = -4101,
};

#define GPU_ID_BYTES 128

/* CUDA devices visible to this process (0: none, or no driver). When 0 and
 * why is given, it says why. */
int gpu_device_count(char *why, size_t whylen);
/* Name of device 0, e.g. "NVIDIA H100 80GB HBM3". */
int gpu_device_name(char *out, size_t len);

/* ncclGetUniqueId: rank 0 creates it, every rank passes it to gpu_zero_init.
 * -ENOTSUP when built without NCCL. */
int gpu_unique_id(uint8_t id[GPU_ID_BYTES]);

struct gpu_zero;

/*
 * Takes device 0, allocates the shards, the transient gathered units and
 * the activations for micro-batches up to (maxB, T). id: NCCL unique id of
 * the world's communicator (world >= 1), or NULL for world 1 without NCCL
 * (then "gathers" are device copies). Weights are zero. Returns 0 or a
 * negative code with the reason in err.
 *
 * The communicator forms non-blocking and is polled: cancel (NULL: none)
 * is a C11 atomic_int read atomically; once non-zero (a newer generation
 * came) the formation is aborted and -ECANCELED returned; a formation not
 * done within the wait deadline gives -ETIMEDOUT. The thread that calls
 * gpu_zero_init owns the communicator: every gpu_zero_* call but
 * gpu_zero_abort and gpu_zero_failed comes from it.
 */
int gpu_zero_init(struct gpu_zero **out, const struct gpt_config *cfg, int maxB, int T,
                  int rank, int world, const uint8_t *id, const int *cancel, char *err,
                  size_t errlen);
void gpu_zero_free(struct gpu_zero *z);
/* The last error's message. */
const char *gpu_zero_error(const struct gpu_zero *z);

/* Asks for the NCCL communicator to be aborted: an atomic flag, so it
 * never blocks (muster-train's control thread calls it under its lock).
 * The owner thread runs ncclCommAbort at its next call or within its
 * current wait, which then fails with -ECANCELED, as do later calls until
 * gpu_zero_set_comm. Any thread, any time before gpu_zero_free; idempotent. */
void gpu_zero_abort(struct gpu_zero *z);
/* Every host wait with NCCL work queued fails with -ETIMEDOUT (the
 * communicator aborted) after this long (<= 0: GPU_WAIT_TIMEOUT_MS): the
 * backstop for a rank that nobody tells its generation broke. */
void gpu_zero_set_timeout(struct gpu_zero *z, int timeout_ms);
#define GPU_WAIT_TIMEOUT_MS 300000
/* Non-zero once the communicator was aborted or an NCCL call failed: the
 * generation broke, as opposed to a CUDA error of this rank's own. */
int gpu_zero_failed(const struct gpu_zero *z);
/* Healing in place (docs/training.md): drops the old communicator
 * (gpu_zero_release_comm) and joins the new generation's (id: its NCCL
 * unique id; same rank and world), keeping the device, the streams and the
 * state (weights, moments); the formation as gpu_zero_init's, cancel
 * included. 0 or an error. */
int gpu_zero_set_comm(struct gpu_zero *z, const uint8_t *id, const int *cancel);
/* Its first half: the communicator is let go (ncclCommFinalize then
 * ncclCommDestroy when the generation ended cleanly and every rank
 * finalizes within 10 s or the wait deadline; ncclCommAbort otherwise), then the queued work
 * runs out. The zero counts as failed until set_comm joins a new one.
 * After an abort gpu_zero_read_state does this itself: the state of a
 * trainer whose generation broke can be read, for a re-slice. */
void gpu_zero_release_comm(struct gpu_zero *z);

/* gpt_init_range for this rank's shards, uploaded. */
int gpu_zero_init_weights(struct gpu_zero *z, uint64_t seed);
/* This rank's shards of a whole model's fp32 parameters (layout order). */
int gpu_zero_load_params(struct gpu_zero *z, const float *full);
/* Gradient of the whole model, fp32, layout order: world 1 only (-EINVAL). */
int gpu_zero_read_grads(struct gpu_zero *z, float *full);

/* Zeroes the gradient shards and the step's loss. */
int gpu_zero_zero_grad(struct gpu_zero *z);
/* Collective forward of a micro-batch (B <= maxB, T <= the init's T). loss
 * non-NULL: waits and returns this batch's mean loss; NULL: the mean loss is
 * added to the step's loss on the device (read by gpu_zero_step_stats). */
int gpu_zero_forward(struct gpu_zero *z, const int *inputs, const int *targets, int B, int T,
                     double *loss);
/* Collective backward of the last forward: the gradient of scale * mean
 * loss, averaged over ranks, is added into the gradient shards. */
int gpu_zero_backward(struct gpu_zero *z, float scale);
/* Waits for the step's collectives; *loss_sum: the step's losses summed over
 * micro-steps and ranks; *norm: the global gradient norm. */
int gpu_zero_step_stats(struct gpu_zero *z, double *loss_sum, double *norm);
/* Seconds the compute stream stood waiting for communication (gathers not
 * yet arrived, reductions not yet done) in the steps whose
 * gpu_zero_step_stats returned since the last call: the communication
 * that overlap did not hide. */
double gpu_zero_comm_wait_s(struct gpu_zero *z);
/* x summed over ranks (identity without NCCL); waits. */
int gpu_zero_sum(struct gpu_zero *z, double *x);
/* AdamW on the shards (decay on matrices only, as worker/train/optim.c). */
int gpu_zero_adamw(struct gpu_zero *z, const struct adamw *h, float gscale);

/* Bytes on the device for the model state (shards), for everything this
 * object allocated, and the device's peak use since init (cudaMemGetInfo). */
size_t gpu_zero_state_bytes(const struct gpu_zero *z);
size_t gpu_zero_alloc_bytes(const struct gpu_zero *z);
size_t gpu_zero_peak_bytes(const struct gpu_zero *z);

/* What gpu_zero_init would allocate for this configuration: the ZeRO-3
 * estimate (shards + transients + activations, cuBLAS workspace). */
size_t gpu_zero_estimate_bytes(const struct gpt_config *cfg, int maxB, int T, int world);

const char *gpu_strerror(int code);

/* GPU shard sizes are multiples of this many floats (256-byte aligned
 * shards): zero_shards_init(lay, world, GPU_SHARD_ALIGN) is this trainer's
 * slicing. */
#define GPU_SHARD_ALIGN 64
/* The tied head computes logits for the vocabulary padded to a multiple of
 * this many tokens (V = 50257 -> 50304): every row of the logits and of
 * their bf16 gradient starts 256-byte aligned and the head's products have
 * a multiple of 64 rows. The padding is the GPU's own: the model state,
 * its shards and checkpoints hold V rows; the padded rows of the head's
 * weights are zero, the loss masks their logits out and their gradient is
 * zero. */
#define GPU_VOCAB_ALIGN 64
/*
 * Checkpoints (worker/train/ckpt.h, through worker/train/gpu/gpu_train.c): this
 * rank's shards as host arrays. Unit u is cut into shards of shard[u] floats
 * (ceil(numel / world) rounded up to 64); rank r holds floats [r*S_u,
 * (r+1)*S_u) of the unit, zero past its end, at off[u] of arrays of the
 * returned total floats (units back to back).
 */
size_t gpu_zero_shard_layout(const struct gpu_zero *z, size_t shard[GPT_MAX_UNITS],
                             size_t off[GPT_MAX_UNITS]);
/* Copies the fp32 weight shards and both AdamW moments to the host (total
 * floats each; m and v may be NULL) once the queued work is done. */
int gpu_zero_read_state(struct gpu_zero *z, float *params, float *m, float *v);
/* Replaces them from the host (any of them NULL: kept); the bf16 copy follows at
 * the next forward. */
int gpu_zero_write_state(struct gpu_zero *z, const float *params, const float *m, const float *v);
/*
 * Snapshots for peer replicas (worker/train/replica.h): two pinned host
 * blocks of 3 x total floats (weights, m, v back to back), allocated once
 * by gpu_zero_keep_snapshots (0 or -ENOMEM). gpu_zero_snapshot queues the
 * copy of the state into block k on a side stream, behind the last update
 * and beside the compute queued after it; the next AdamW (or upload) waits
 * for it, so the block holds the state of the step it was taken at.
 * gpu_zero_snapshot_wait blocks until the copy is done (the host may read
 * the block). A block goes back to the device with gpu_zero_write_state.
 */
int gpu_zero_keep_snapshots(struct gpu_zero *z, float *blocks[2]);
int gpu_zero_snapshot(struct gpu_zero *z, int k);
int gpu_zero_snapshot_wait(struct gpu_zero *z);
/* all[r * n + i] = rank r's mine[i] on every rank (NCCL all-gather; a copy
 * without NCCL); waits: a barrier as well. */
int gpu_zero_gather_u64(struct gpu_zero *z, const uint64_t *mine, size_t n, uint64_t *all);

#ifdef __cplusplus
}
#endif

#endif
