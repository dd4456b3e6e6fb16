/*
 * gpu_train: the training loop of one rank on the GPU, the counterpart of
 * worker/train/train.h's trainer over worker/gpu/gpu.h. Same job keys, same
 * data order (dataset_train_batch of (seed, step, micro_step, rank, world)),
 * same schedule, clipping and AdamW hyper-parameters (beta 0.9/0.95, eps
 * 1e-8), same step report (struct train_step_info) and hooks.
 *
 * Not on the GPU path yet: checkpoints (checkpoint_dir / --resume) and
 * sampling; gpu_trainer_init refuses a spec with checkpoint_dir set rather
 * than train without the checkpoints the job asked for.
 */
#ifndef MUSTER_GPU_TRAIN_H
#define MUSTER_GPU_TRAIN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "worker/gpu/gpu.h"
#include "worker/train/data.h"
#include "worker/train/train.h"

struct gpu_trainer {
    struct job_spec spec;    /* resolved (trainer_check_spec) */
    struct gpt_config cfg;
    struct gpu_zero *z;
    struct dataset data;
    struct lr_schedule sched;
    float beta1, beta2, eps;
    long step;
    int accum, rank, world;
    int *inputs, *targets;   /* (micro_batch, seq_len) */
};

/* id: the NCCL unique id of the world (NULL: world 1 without NCCL). */
int gpu_trainer_init(struct gpu_trainer *tr, const struct job_spec *spec, int rank, int world,
                     const uint8_t *id, char *err, size_t errlen);
void gpu_trainer_free(struct gpu_trainer *tr);
int gpu_trainer_step(struct gpu_trainer *tr, struct train_step_info *info, char *err,
                     size_t errlen);
/* Mean validation loss over spec.eval_batches (NAN: no validation data or an error). */
double gpu_trainer_eval(struct gpu_trainer *tr);
/* Steps until spec.steps, stop_after steps (<= 0: no limit) or *stop. */
int gpu_train_run(struct gpu_trainer *tr, long stop_after, const struct train_hooks *hooks,
                  volatile sig_atomic_t *stop, char *err, size_t errlen);

#endif
