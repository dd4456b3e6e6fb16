/*
 * gpu_train: the training loop of one rank on the GPU, the counterpart of
 * worker/train/train.h's trainer over worker/train/gpu/gpu.h. Same job keys, same
 * data order (dataset_train_batch of (seed, step, micro_step, rank, world)),
 * same optimizer recipe (struct train_optim), same step report, hooks and
 * run loop (train_loop_run: stop vote, validation, checkpoint cadence).
 *
 * Checkpoints are the CPU path's (worker/train/ckpt.h): the same files,
 * written from this rank's fp32 shards copied to the host, so that GPU
 * ranks resume what CPU ranks wrote and the other way round, at any world
 * size. Sampling gathers the fp32 weights to the host and runs the CPU
 * model's sampler; world 1 only.
 */
#ifndef MUSTER_GPU_TRAIN_H
#define MUSTER_GPU_TRAIN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "worker/train/gpu/gpu.h"
#include "worker/train/data.h"
#include "worker/train/train.h"

struct gpu_trainer {
    struct job_spec spec;    /* resolved (trainer_check_spec) */
    struct gpt_config cfg;
    struct gpu_zero *z;
    struct dataset data;
    struct train_optim optim;
    long step;
    long last_checkpoint_step; /* step of the last committed checkpoint (-1: none) */
    int accum, rank, world;
    int *inputs, *targets;   /* (micro_batch, seq_len) */
    struct replica *replica; /* peer replicas (worker/train/replica.h), or NULL */
    float *snap[2];          /* their pinned snapshot blocks (gpu_zero_keep_snapshots) */
    int snap_cur, snap_next; /* the block that is the snapshot, the one being taken; -1: none */
    /* after gpu_trainer_to_host: z is freed (NULL) and the state of the
     * last step, and the kept snapshot (NULL: none), are host copies of
     * 3 x host_floats floats each (weights, m, v) */
    float *host_state, *host_snap;
    size_t host_floats;
};

/* id: the NCCL unique id of the world (NULL: world 1 without NCCL);
 * cancel: the formation's cancellation (gpu_zero_init; NULL: none). */
int gpu_trainer_init(struct gpu_trainer *tr, const struct job_spec *spec, int rank, int world,
                     const uint8_t *id, const int *cancel, char *err, size_t errlen);
void gpu_trainer_free(struct gpu_trainer *tr);
int gpu_trainer_step(struct gpu_trainer *tr, struct train_step_info *info, char *err,
                     size_t errlen);
/* Mean validation loss over spec.eval_batches (NAN: no validation data or an error). */
double gpu_trainer_eval(struct gpu_trainer *tr);
/* Steps until spec.steps, stop_after steps (<= 0: no limit) or *stop;
 * checkpoints as train_run does. */
int gpu_train_run(struct gpu_trainer *tr, long stop_after, const struct train_hooks *hooks,
                  volatile sig_atomic_t *stop, char *err, size_t errlen);

/*
 * Healing in place (docs/training.md), a rank of a world > 1 across
 * generations. gpu_trainer_replicas gives the trainer peer replicas
 * (replica.h) every `every` steps: at the start of such a step the state is
 * copied to a pinned block on a side stream while the step's first
 * micro-batch computes, and the replica thread ships that block to the
 * holder; the block not being written is the snapshot, so the state of the
 * last round stays whole until the next one (0 or -ENOMEM, err set).
 * gpu_trainer_set_comm joins a new generation's NCCL communicator after the
 * old one was aborted, keeping the state; gpu_trainer_reset goes back to
 * the seed (weights from it, zero moments, step 0); gpu_trainer_failed
 * says whether the generation broke (a collective of either communicator
 * failed) rather than this rank.
 */
int gpu_trainer_replicas(struct gpu_trainer *tr, int every, char *err, size_t errlen);
int gpu_trainer_set_comm(struct gpu_trainer *tr, const uint8_t *id, const int *cancel, char *err,
                         size_t errlen);
int gpu_trainer_reset(struct gpu_trainer *tr, char *err, size_t errlen);

/* Re-slicing from peers' memory (collective), as trainer_reslice (train.h)
 * for the GPU trainer's slicing: each rank brings nmine blocks of the state
 * of old_world ranks cut as the GPU trainer cuts it (weights, m, v back to
 * back, host memory); they are re-sliced into host copies of this
 * trainer's shards (ckpt_reslice) and uploaded, every rank agreeing that
 * they are on its GPU; my_rc as trainer_reslice's. 0 or an error, with
 * err set. gpu_trainer_read_state copies this rank's state (snapshot set:
 * its kept snapshot) into such a block (3 x its total floats); after an
 * abort it first lets the broken generation's queued work run out. */
int gpu_trainer_reslice(struct gpu_trainer *tr, int my_rc, int old_world, int ncontrib,
                        const float *const *mine, int nmine, const int *from_rank, const int *from_index,
                        char *err, size_t errlen);
int gpu_trainer_read_state(struct gpu_trainer *tr, int snapshot, float *block);
/* Before the trainer of another place is built (a re-slice): this rank's
 * state and its kept snapshot copied to host memory and everything on the
 * device freed (the communicator was released before), so that the old and
 * the new trainer are never on the device together. What stays is what a
 * re-slice reads: gpu_trainer_read_state (from the host copies), the
 * replicas held for peers (host memory) and the step; nothing else may be
 * called but gpu_trainer_free. 0, or -ENOMEM / -EIO with err set and the
 * trainer unchanged (still on its device). */
int gpu_trainer_to_host(struct gpu_trainer *tr, char *err, size_t errlen);
int gpu_trainer_failed(struct gpu_trainer *tr);

/* Checkpoints, collective, as trainer_save / trainer_load (train.h). */
int gpu_trainer_save(struct gpu_trainer *tr, const char *dir, char *path, size_t pathlen,
                     char *err, size_t errlen);
int gpu_trainer_load(struct gpu_trainer *tr, const char *path, char *err, size_t errlen);

/* n tokens after prompt from the current weights, gathered to the host:
 * trainer_sample's tokens for the same weights, seed and step. World 1
 * only (-ENOTSUP otherwise). */
int gpu_trainer_sample(struct gpu_trainer *tr, int prompt, int *out, int n, char *err,
                       size_t errlen);

#endif
