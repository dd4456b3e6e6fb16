/*
 * train: the training loop of one rank, as a library. muster-train drives
 * it standalone and as a rank of a job (heartbeats and the stop vote hooked
 * onto the loop; worker/train/rank.h).
 *
 * A step: zero the gradients; for each of `accum` micro-steps draw the
 * micro-batch (seed, step, micro_step, rank, world), forward, backward with
 * the loss scaled by 1/accum; clip by the global gradient norm; AdamW with
 * the scheduled learning rate. A non-finite loss or gradient norm stops the
 * run with a diagnosis naming the step.
 *
 * Model state is held by ZeRO-3 (worker/train/zero.h): with a communicator
 * of N ranks each rank keeps 1/N of the weights, moments and gradients and
 * every step, eval, sample and checkpoint is collective (all ranks call it,
 * in the same order); without one (world 1) the same code is the
 * single-process trainer.
 */
#ifndef MUSTER_TRAIN_TRAIN_H
#define MUSTER_TRAIN_TRAIN_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "worker/train/data.h"
#include "worker/train/model.h"
#include "worker/train/optim.h"
#include "worker/train/zero.h"

struct comm;
struct replica;

/* The optimizer recipe both trainers (this one and the GPU one,
 * worker/train/gpu/gpu_train.h) follow: the spec's learning-rate schedule, AdamW
 * with betas 0.9/0.95 and eps 1e-8, the spec's weight decay. */
struct train_optim {
    struct lr_schedule sched;
    float beta1, beta2, eps, weight_decay;
};

void train_optim_init(struct train_optim *o, const struct job_spec *s);
/* AdamW's settings for 0-based step `step`; *lr gets its learning rate. */
struct adamw train_optim_at(const struct train_optim *o, long step, double *lr);

struct trainer {
    struct job_spec spec;       /* resolved: seq_len and micro_batch filled in */
    struct gpt model;           /* a shell: config, layout, activations */
    struct zero zero;           /* this rank's shards of weights, moments, gradients */
    struct dataset data;
    struct train_optim optim;
    long step;                  /* optimizer steps done */
    long last_checkpoint_step;  /* step of the last committed checkpoint (-1: none) */
    int accum;                  /* micro-steps per step */
    int rank, world;            /* the communicator's, or 0 and 1 */
    int *inputs, *targets;      /* (micro_batch, seq_len) */
    long fault_nan_step;        /* fault injection: poison a weight before the step that
                                 * follows this many steps (-1: off) */
    struct replica *replica;    /* peer replicas (worker/train/replica.h), or NULL */
    int fingerprint;            /* test hook: rank 0 logs zero_fingerprint after every step */
};

struct train_step_info {
    long step;                  /* 1-based: steps done after this one */
    long steps;                 /* the run's total */
    double loss;                /* mean over the step's micro-batches */
    double lr;
    double grad_norm;           /* before clipping */
    double tokens_per_s;        /* this rank's tokens per second over the step */
    double ms;
    double comm_frac;           /* share of the step spent waiting for collectives */
};

/* The report of a step after which `step` steps are done, that made
 * `tokens` tokens in dt seconds, comm_s of them waiting for collectives. */
void train_step_report(struct train_step_info *info, const struct job_spec *s, long step,
                       double loss, double lr, double norm, double tokens, double dt,
                       double comm_s);

/* Checks the training keys of a job spec and resolves seq_len = 0 and
 * micro_batch = 0. Returns 0 or -EINVAL with the reason in err. */
int trainer_check_spec(struct job_spec *spec, int world, char *err, size_t errlen);

/*
 * Checks the spec, loads the data, builds the model and initialises this
 * rank's shards from the seed. comm: the communicator of the world's ranks
 * (COMM_RING; rank and world must be its own; the trainer runs collectives
 * on it from its own comm thread, so the caller must not run any until
 * trainer_free, comm_abort excepted), or NULL for world 1.
 * Returns 0, or a negative errno with the reason in err.
 */
int trainer_init(struct trainer *tr, const struct job_spec *spec, int rank, int world,
                 struct comm *comm, char *err, size_t errlen);
void trainer_free(struct trainer *tr);

/* One optimizer step. -ERANGE with a diagnosis in err on a non-finite loss;
 * a comm error code when a collective failed. */
int trainer_step(struct trainer *tr, struct train_step_info *info, char *err, size_t errlen);

/* Collective test hook: rank 0 logs "fingerprint <when> <step>: <hex> (world
 * N)", zero_fingerprint of the whole state (equal for equal states at any
 * world size). */
void trainer_log_fingerprint(struct trainer *tr, const char *when);

/* Mean loss over spec.eval_batches validation micro-batches, shared out over
 * the ranks (NAN when the job holds out no validation data or a collective
 * failed). */
double trainer_eval(struct trainer *tr);

/* Generates n tokens from the current model, starting from prompt; a pure
 * function of (weights, seed, step). out gets n tokens. */
void trainer_sample(struct trainer *tr, int prompt, int *out, int n);

/* The same generation from a whole model in g->params (gpt_create; its
 * activations hold one sequence of maxT tokens): the same tokens as
 * trainer_sample from the same weights, seed and step. The GPU path gathers
 * its fp32 weights into such a model and samples with this. */
void train_sample_model(struct gpt *g, uint64_t seed, long step, int maxT, int prompt, int *out,
                        int n);

/* Checkpoints of this trainer (worker/train/ckpt.h), collective.
 * trainer_save writes step-<step> under dir (path, may be NULL, gets its
 * directory) and sets last_checkpoint_step; trainer_load reads a step
 * directory or a checkpoint_dir's latest, of any world size, and sets step,
 * last_checkpoint_step and spec.seed from it. 0 or a negative errno with the
 * reason in err. */
int trainer_save(struct trainer *tr, const char *dir, char *path, size_t pathlen, char *err,
                 size_t errlen);
int trainer_load(struct trainer *tr, const char *path, char *err, size_t errlen);

/* Collective: tr's shards get the weights and both moments of the same
 * model as the CPU trainer cut it over old_world ranks (the job grew or
 * shrank; ckpt_reslice, an exact copy). Each rank brings nmine <= ncontrib
 * blocks (mine[i]: weights, m, v back to back, 3 x the old layout's total
 * floats, as struct zero holds them); old rank o is block from_index[o] of
 * new rank from_rank[o] (the same tables on every rank). A rank that could
 * not bring its blocks passes their error as my_rc (its tables may then be
 * NULL): it still takes part, and every rank fails alike. 0 or an error
 * with err set. */
int trainer_reslice(struct trainer *tr, int my_rc, int old_world, int ncontrib, const float *const *mine, int nmine,
                    const int *from_rank, const int *from_index, char *err, size_t errlen);

struct train_hooks {
    void (*on_step)(const struct train_step_info *info, void *user);
    void (*on_eval)(long step, double val_loss, void *user);
    /* after the commit, on every rank, with the committed step */
    void (*on_checkpoint)(long step, const char *path, void *user);
    void *user;
    /* Requested checkpoints: a count that another thread (the control
     * channel's, on COMMAND checkpoint) raises by one per request; NULL:
     * none. Read only between steps. */
    volatile sig_atomic_t *checkpoint_requests;
    /* How many of those the loop answered, kept across runs (a rank that
     * rejoins a new generation runs the loop again and must not answer an
     * old request twice); NULL: counted from 0 in each run. */
    long *checkpoints_answered;
    /* Set (by the control channel's thread, on COMMAND yield) when the
     * ranks are to leave the generation at the next step boundary; NULL:
     * never. Read only between steps. */
    volatile sig_atomic_t *yield;
};

/*
 * The vote at every step boundary: one all-reduce (sum) of one double per
 * rank that carries three questions, "stop?", "checkpoint now?" and "leave
 * the generation (yield)?". Ranks see a request at different moments; any
 * rank asking is enough, and all of them learn it from the same sum, so all
 * stop, checkpoint or yield at the same step. With b = world + 1, a rank's
 * share is stop + b * checkpoint + b^2 * yield (each 0 or 1): the sum's
 * digits in base b count the votes, exact in a double for any world below
 * 2^17.
 */
struct train_vote {
    int stop;        /* ranks asking to stop */
    int checkpoint;  /* ranks asking for a checkpoint */
    int yield;       /* ranks asking to leave the generation */
};

/* train_loop_run's return when the ranks left the generation at a step
 * boundary on a yield vote (the state is whole at that step). */
#define TRAIN_YIELDED 1

double train_vote_share(int stop, int checkpoint, int yield, int world);
struct train_vote train_vote_count(double sum, int world);

/*
 * Runs steps until spec.steps, until stop_after steps of this call were made
 * (<= 0: no limit), or until *stop becomes non-zero (checked between steps).
 * Validates every eval_every steps and at the end; checkpoints every
 * checkpoint_every steps, at the end, and at the first step boundary after
 * a request (hooks->checkpoint_requests, agreed by the vote above) when
 * checkpoint_dir is set. Each request is answered by one checkpoint, taken
 * by every rank at the same step: the loop counts the requests it answered
 * (the same count on every rank), and a rank votes while its own count of
 * requests is ahead of that, so a rank that sees a request after the others
 * acted on it does not ask again. A request at a step that is already
 * checkpointed is answered by that checkpoint. A yield (hooks->yield) ends
 * the run at the next step boundary on every rank, without the final
 * checkpoint: TRAIN_YIELDED.
 * Returns 0, TRAIN_YIELDED or a negative errno with the reason in err.
 */
int train_run(struct trainer *tr, long stop_after, const struct train_hooks *hooks,
              volatile sig_atomic_t *stop, char *err, size_t errlen);

/*
 * The run loop and the validation, for any trainer: train_run and
 * trainer_eval are these over the CPU trainer, gpu_train_run and
 * gpu_trainer_eval over the GPU one, so that both stop, validate and
 * checkpoint alike. The callbacks get `tr`.
 */
struct train_ops {
    /* one optimizer step */
    int (*step)(void *tr, struct train_step_info *info, char *err, size_t errlen);
    /* collective forward of one micro-batch; *loss: its mean loss */
    int (*forward)(void *tr, const int *inputs, const int *targets, int B, int T, double *loss);
    /* *x summed over ranks: the same double on every rank */
    int (*sum)(void *tr, double *x);
    /* collective checkpoint of the current step under dir (checkpoint_dir) */
    int (*save)(void *tr, const char *dir, char *path, size_t pathlen, char *err, size_t errlen);
    /* words for a failed collective (sum), into err; returns rc */
    int (*failed)(void *tr, int rc, const char *what, char *err, size_t errlen);
};

struct train_loop {
    const struct train_ops *ops;
    void *tr;
    const struct job_spec *spec;
    const struct dataset *data;
    const long *step;           /* the trainer's optimizer steps done */
    const long *last_checkpoint; /* the trainer's last committed checkpoint (-1: none) */
    int rank, world;
    int *inputs, *targets;      /* (micro_batch, seq_len) */
};

double train_loop_eval(const struct train_loop *l);
int train_loop_run(const struct train_loop *l, long stop_after, const struct train_hooks *hooks,
                   volatile sig_atomic_t *stop, char *err, size_t errlen);

#endif
