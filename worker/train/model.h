/*
 * model: GPT-2 in fp32 on the CPU, built from worker/train/layers.h.
 *
 * Parameters live in flat buffers grouped by *unit*, the granule that ZeRO-3
 * shards, gathers and releases:
 *
 *   unit 0        embed   wte (V,C), wpe (T,C)
 *   unit 1..L     block   ln1w ln1b (C), qkvw (3C,C) qkvb (3C), attprojw (C,C)
 *                         attprojb (C), ln2w ln2b (C), fcw (4C,C) fcb (4C),
 *                         fcprojw (C,4C) fcprojb (C)
 *   unit L+1      norm    lnfw lnfb (C)
 *
 * in that order, tensors packed without padding, units back to back in one
 * allocation (gpt.params; gpt.grads has the same layout). The LM head is tied
 * to wte, so the head needs unit 0 as well as unit L+1.
 *
 * The forward is a loop over units: embed_forward(unit 0), block_forward(l,
 * unit l+1) for each l, head_forward(unit L+1, unit 0); the backward runs
 * them in reverse, and takes the gradient of unit 0 last (embed_backward),
 * from both of its uses: the tied head's and the lookup's. Each takes the
 * unit's parameters as a pointer, so a caller can hand it a gathered copy
 * instead of gpt.params.
 *
 * Unit 0 is also a table of V + T rows of C floats (wte's rows, then wpe's),
 * and the passes that use it come in a form that takes a window of rows at
 * a time (*_rows below), for a caller that never holds the whole unit
 * (ZeRO-3 gathers it in chunks: worker/train/zero.h).
 */
#ifndef MUSTER_TRAIN_MODEL_H
#define MUSTER_TRAIN_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/gptlayout.h" /* struct gpt_config, presets, units and their tensors */

/* Activations of the last forward, kept for the backward. */
struct gpt_acts {
    float *encoded;                                   /* (B,T,C) */
    float *ln1[GPT_MAX_LAYERS], *ln1_mean[GPT_MAX_LAYERS], *ln1_rstd[GPT_MAX_LAYERS];
    float *qkv[GPT_MAX_LAYERS];                       /* (B,T,3C) */
    float *atty[GPT_MAX_LAYERS];                      /* (B,T,C) */
    float *att[GPT_MAX_LAYERS];                       /* (B,NH,T,T) */
    float *attproj[GPT_MAX_LAYERS], *res2[GPT_MAX_LAYERS];
    float *ln2[GPT_MAX_LAYERS], *ln2_mean[GPT_MAX_LAYERS], *ln2_rstd[GPT_MAX_LAYERS];
    float *fch[GPT_MAX_LAYERS], *fch_gelu[GPT_MAX_LAYERS]; /* (B,T,4C) */
    float *fcproj[GPT_MAX_LAYERS], *res3[GPT_MAX_LAYERS];  /* res3[l]: block l's output */
    float *lnf, *lnf_mean, *lnf_rstd;
    float *logits;                                    /* (B,T,V) */
    float *probs;                                     /* (B,T,V); dlogits in the backward */
    float *losses;                                    /* (B,T) */
    /* backward scratch */
    float *dres;                                      /* (B,T,C) gradient of the residual */
    float *dsmall;                                    /* (B,T,C) */
    float *dbig;                                      /* (B,T,4C) */
    float *datt;                                      /* (B,NH,T,T) */
};

struct gpt {
    struct gpt_config cfg;
    struct gpt_layout layout;
    float *params; /* layout.total floats */
    float *grads;  /* same layout; the backward accumulates into it */
    int maxB, maxT; /* activation capacity */
    int B, T;       /* shape of the last forward */
    int *inputs, *targets; /* (maxB, maxT) copies of the last batch */
    struct gpt_acts acts;
    float *acts_mem;
};

/* Allocates parameters, gradients and activations for batches up to
 * (maxB, maxT). Returns 0 or -ENOMEM / -EINVAL. Parameters are zero. */
int gpt_create(struct gpt *m, const struct gpt_config *cfg, int maxB, int maxT);
/* The same without parameters and gradients (params = grads = NULL): for a
 * caller that keeps them elsewhere (ZeRO-3 shards) and passes unit pointers. */
int gpt_create_shell(struct gpt *m, const struct gpt_config *cfg, int maxB, int maxT);
void gpt_destroy(struct gpt *m);

/* GPT-2 initialisation, a pure function of the seed: weights N(0, 0.02),
 * residual projections (attproj, fcproj) N(0, 0.02/sqrt(2L)), biases 0,
 * norm gains 1. */
void gpt_init_weights(struct gpt *m, uint64_t seed);
/* The same initialisation for floats [lo, lo + n) of one unit, into out (n
 * floats): a rank initialises its own shard without the whole model. */
void gpt_init_range(const struct gpt_config *cfg, uint64_t seed, int unit, size_t lo,
                    size_t n, float *out);

/* Pointer to unit u inside a flat buffer of this layout (params or grads). */
float *gpt_unit_ptr(const struct gpt *m, float *flat, int unit);

/* Per-unit passes. unit_params points at that unit's floats. */
void embed_forward(struct gpt *m, const float *embed_unit);
void block_forward(struct gpt *m, int l, const float *block_unit);
/* Final norm, logits, and (when targets were given) the mean loss. */
double head_forward(struct gpt *m, const float *norm_unit, const float *embed_unit,
                    int with_targets);
/* dloss: gradient of the objective with respect to each position's loss.
 * Gives the gradient of the norm unit and, in acts.dres, of the last
 * block's output; the tied wte's share is left to embed_backward. */
void head_backward(struct gpt *m, float *dnorm_unit, const float *norm_unit,
                   const float *embed_unit, float dloss);
void block_backward(struct gpt *m, int l, float *dblock_unit, const float *block_unit);
/* The gradient of unit 0: the tied head's (from the head's dlogits, which
 * stay in acts.probs) and the lookup's (from acts.dres). */
void embed_backward(struct gpt *m, float *dembed_unit);

/*
 * The same passes over a window of unit 0: rows holds rows [first, first +
 * n) of it; a window may also hold rows past V + T (padding, ignored). Every
 * window must be passed once, in any order, between a *_begin (or the norm)
 * and what needs them all:
 *   forward:  embed_forward_begin, embed_forward_rows per window; ...blocks...;
 *             head_norm_forward, head_forward_rows per window, head_loss;
 *   backward: head_backward_begin, head_backward_rows per window,
 *             head_norm_backward; ...blocks...; embed_backward_rows per window.
 * embed_forward_rows gives embed_forward's result bit for bit whatever the
 * windows; the others agree with the whole-unit passes up to the order of
 * floating-point sums.
 */
void embed_forward_begin(struct gpt *m);
void embed_forward_rows(struct gpt *m, const float *rows, size_t first, size_t n);
void head_norm_forward(struct gpt *m, const float *norm_unit);
void head_forward_rows(struct gpt *m, const float *rows, size_t first, size_t n);
double head_loss(struct gpt *m, int with_targets);
void head_backward_begin(struct gpt *m, float dloss);
void head_backward_rows(struct gpt *m, const float *rows, size_t first, size_t n);
void head_norm_backward(struct gpt *m, float *dnorm_unit, const float *norm_unit);
/* drows: the gradient of the window's rows, added into. */
void embed_backward_rows(struct gpt *m, float *drows, size_t first, size_t n);

/*
 * Whole-model passes over gpt.params. gpt_forward copies the batch (inputs
 * and targets (B,T); targets may be NULL for generation) and returns the
 * mean loss (0 without targets). gpt_backward accumulates into gpt.grads the
 * gradient of scale * mean loss (scale = 1/micro-steps when accumulating).
 */
/* Copies a batch (targets may be NULL) for the per-unit passes that follow. */
void gpt_set_batch(struct gpt *m, const int *inputs, const int *targets, int B, int T);
double gpt_forward(struct gpt *m, const int *inputs, const int *targets, int B, int T);
void gpt_backward(struct gpt *m, float scale);
void gpt_zero_grad(struct gpt *m);

#endif
