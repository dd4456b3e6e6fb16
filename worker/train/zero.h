/*
 * zero: ZeRO stage 3 over the model's flat units (worker/train/model.h).
 *
 * Unit u of P_u floats is cut into N contiguous shards of S_u floats; rank r
 * owns floats [r*S_u, (r+1)*S_u) of the unit, zero past P_u. S_u is
 * ceil(P_u/N) for the blocks and the norm; the embedding (unit 0: V + T rows
 * of C floats, wte's then wpe's) is cut at whole rows, R = ceil((V+T)/N)
 * rows and S_0 = R*C floats per rank. What a rank keeps across steps, its
 * model state, is four shard buffers with the units' shards back to back:
 * fp32 weights, both AdamW moments and the gradient, 16 bytes x sum(S_u).
 *
 * Transient, per rank (world > 1): three slots of N * max(S_u, u >= 1)
 * floats (a block gathered whole), and nothing else: the embedding is never
 * whole on a rank. It passes through the slots a chunk at a time: chunk c
 * is rows [c*k, (c+1)*k) of every rank's R rows (k rows such that N*k*C
 * floats fit a slot; the last chunk shorter), gathered as N windows of rows
 * side by side. Forward: the chunks for the token and position lookup, the
 * blocks, the norm, the chunks again for the tied head's logits. Backward:
 * the chunks for the head's input gradient, the norm, the blocks in
 * reverse, each unit's full gradient reduce-scattered from a slot while the
 * next unit computes; last the embedding's gradient (the head's share from
 * its dlogits, the lookup's from the first block's input gradient) a chunk
 * at a time, each reduce-scattered while the next is computed. The three
 * slots hold what computes, the next step's parameters being gathered, and
 * a gradient being written or reduced.
 *
 * One comm thread per rank runs every collective, in the order the training
 * thread submits them (the order is the same on every rank, so the
 * collectives match): all-gathers ahead of the compute, reduce-scatters
 * (COMM_AVG, then added into the gradient shard) behind it. Each result is a
 * pure function of its inputs, so runs are bit-identical whatever the timing.
 *
 * World 1 (no communicator) is the same code degenerate: a shard is the whole
 * unit, a "gathered" unit is the shard itself and the backward accumulates
 * straight into the gradient shard, which makes it the single-process
 * trainer, bit for bit.
 */
#ifndef MUSTER_TRAIN_ZERO_H
#define MUSTER_TRAIN_ZERO_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#include "common/zeroshard.h"
#include "worker/train/model.h"
#include "worker/train/optim.h"

struct comm;

#define ZERO_QUEUE 8

enum zero_job_kind { ZERO_GATHER, ZERO_REDUCE, ZERO_RAW_GATHER };

struct zero_job {
    enum zero_job_kind kind;
    size_t at;        /* ZERO_GATHER, ZERO_REDUCE: where this rank's part starts in the shard buffers */
    size_t count;     /* floats from each rank */
    float *buf;       /* world * count floats: gathered into, or reduced from */
    const void *send; /* ZERO_RAW_GATHER: count floats from each rank into buf */
};

struct zero {
    struct comm *comm;             /* NULL when world == 1 */
    int rank, world;
    struct gpt *g;                 /* config, layout and activations */
    struct zero_shards plan;       /* shard sizes and offsets, chunks, slots */
    /* model state: plan.total floats each; params, m and v are one block of 3 x total */
    float *params, *m, *v, *grads;
    /* the other block of weights and moments (zero_keep_previous), and
     * whether the next update writes into them (then they swap places) */
    float *alt_params, *alt_m, *alt_v;
    int keep_next;
    /* transient (world > 1): the slots, and each one's last job (its ticket) */
    float *slot[ZERO_SLOTS];
    unsigned long slot_job[ZERO_SLOTS];
    /* comm thread */
    pthread_t thread;
    int running;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct zero_job q[ZERO_QUEUE];
    unsigned long submitted, done; /* jobs */
    int stopping;
    int rc;                        /* first collective error; the rest are skipped */
    double wait_s;                 /* training thread blocked on the comm thread */
};

/*
 * Sets up the shards of g's layout for comm's rank and world (comm NULL:
 * world 1) and starts the comm thread. g may be a shell (gpt_create_shell);
 * its activations are used. Returns 0 or -ENOMEM.
 */
int zero_init(struct zero *z, struct gpt *g, struct comm *comm);
/* Stops the comm thread and frees everything (not comm, not g). */
void zero_free(struct zero *z);

/* The first collective error since the communicator was set (0: none). */
int zero_failed(struct zero *z);
/* Swaps in another communicator of the same rank and world (a new
 * generation's, after the old one failed): waits for the jobs already
 * queued (skipped after an error) and clears the error. The caller then
 * destroys the old one. */
void zero_set_comm(struct zero *z, struct comm *comm);

/* Bytes allocated for what persists across steps: weights, moments, gradients. */
size_t zero_model_state_bytes(const struct zero *z);
/* Bytes of the slots for gathered units, chunks and full gradients (0 at world 1). */
size_t zero_transient_bytes(const struct zero *z);

/* The floats of unit u this rank owns: global offset *lo within the unit and
 * *n real (non-padding) floats, n <= S_u. */
void zero_owned(const struct zero *z, int unit, size_t *lo, size_t *n);

/* The model's initialisation (gpt_init_range) for this rank's shards. */
void zero_init_weights(struct zero *z, uint64_t seed);

/* Collective forward of one batch (targets may be NULL); *loss gets this
 * rank's mean loss (0 without targets). Returns 0 or a comm error. */
int zero_forward(struct zero *z, const int *inputs, const int *targets, int B, int T,
                 double *loss);
/* Collective backward of the last forward: the gradient of scale * mean loss,
 * averaged over ranks, is added into the gradient shards. */
int zero_backward(struct zero *z, float scale);
void zero_zero_grad(struct zero *z);

/* Global gradient norm: the shards' sums of squares, summed over ranks. */
int zero_grad_norm(struct zero *z, double *norm);
/* AdamW on the shards; weight decay on the parts of matrices each shard holds.
 * With keep_next set (and zero_keep_previous done) the update is written into
 * the other buffers, which become the current ones: the weights and moments
 * before it stay whole in alt_params, alt_m, alt_v (until the next kept
 * update), at no copy. keep_next is cleared. */
void zero_adamw(struct zero *z, const struct adamw *h, float gscale);
/* A second buffer of weights and both moments, for zero_adamw's keep_next
 * (worker/train/replica.h: the snapshot). 0 or -ENOMEM. */
int zero_keep_previous(struct zero *z);
/* The state kept by the last kept update becomes the current one again. */
void zero_revert(struct zero *z);


/* x summed over ranks in rank order (the same double on every rank). */
int zero_sum(struct zero *z, double *x);
/* all[r * n + i] = rank r's mine[i]; a barrier as well. */
int zero_gather_u64(struct zero *z, const uint64_t *mine, size_t n, uint64_t *all);

/* Collective: a 64-bit fingerprint of the whole model state (weights and
 * both moments, bit for bit, with their places in the model), the same for
 * the same state at any world size: a sum over every float of a hash of its
 * global index times its bits. For tests of re-slicing. */
int zero_fingerprint(struct zero *z, uint64_t *out);

/* Seconds the training thread waited for collectives since the last call. */
double zero_take_wait(struct zero *z);

#endif
