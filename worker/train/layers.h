/*
 * layers: the GPT-2 building blocks, each <layer>_forward beside its
 * <layer>_backward. Arguments go outputs, then inputs, then sizes.
 *
 * Shape letters, used throughout worker/train/:
 *   B  sequences in a micro-batch     T  tokens per sequence (<= the model's T)
 *   C  channels (model width)         NH attention heads, head size hs = C/NH
 *   V  vocabulary size                L  transformer blocks
 *   N  rows of a matrix product, B*T  OC output channels of a linear layer
 *
 * Weights of linear layers are stored as PyTorch stores them, (OC, C), so a
 * layer computes out = inp @ w^T + bias. Every backward *accumulates* into
 * weight gradients (gradient accumulation over micro-batches relies on it);
 * what it does to input gradients is stated per function. Loops are split
 * over OpenMP threads so that each output element is written by one thread
 * in a fixed order: for a given thread count, results do not depend on
 * scheduling (bit-exact resume).
 */
#ifndef MUSTER_TRAIN_LAYERS_H
#define MUSTER_TRAIN_LAYERS_H

#include <stddef.h>
#include <stdint.h>

/*
 * Threads: every kernel splits its work over n OpenMP threads, and each
 * thread calls a single-threaded sgemm on its slice, so one pool serves both
 * (two pools on few cores spin against each other). Call before the first
 * kernel and whenever the count should change.
 */
void layers_set_threads(int n);

/*
 * The token and position embeddings as one table of V + T rows of C floats,
 * wte's V rows then wpe's T (the embedding unit's layout), taken a window at
 * a time: `rows` holds rows [first, first + n) of it. A window may hold any
 * part of the table, or rows past its end (padding, ignored).
 */
/* out (B,T,C) += the row of each token (inp) and of each position t that
 * falls in the window. Starting from out = -0 and adding every row once
 * gives wte[inp] + wpe[t] exactly, in any order of windows: -0 + x is x,
 * and a sum of two floats does not depend on their order. */
void encoder_forward_rows(float *out, const int *inp, const float *rows, size_t first, size_t n,
                          int B, int T, int C, int V);
/* drows (the window's rows) += the gradient from dout (B,T,C), summed in
 * (b, t) order. */
void encoder_backward_rows(float *drows, const float *dout, const int *inp, size_t first,
                           size_t n, int B, int T, int C, int V);

/* LayerNorm over the last axis of N rows, eps 1e-5 as in PyTorch;
 * mean and rstd (N) are kept for the backward. */
void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int N, int C);
/* dinp += ..., dw, db += ... */
void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean,
                        const float *rstd, int N, int C);

/* out (N,OC) = inp (N,C) @ w^T (w is (OC,C)) + bias (OC, may be NULL). */
void matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                    int N, int C, int OC);
/* dinp (N,C) = dout @ w (overwritten); dw (OC,C) += dout^T @ inp;
 * dbias (OC, may be NULL) += column sums of dout. */
void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                     const float *inp, const float *w, int N, int C, int OC);
/* A block of OC output channels with its own weights w (OC,C), inside a
 * wider output whose rows are ld floats apart (ld >= OC): the tied LM head,
 * a block of vocabulary rows at a time. Forward: out[:, 0:OC] = inp @ w^T,
 * no bias. Backward, from dout[:, 0:OC]: dinp (N,C) += dout @ w and
 * dw (OC,C) += dout^T @ inp, either may be NULL; both accumulate, so that
 * the blocks add up. */
void matmul_forward_cols(float *out, int ld, const float *inp, const float *w, int N, int C,
                         int OC);
void matmul_backward_cols(float *dinp, float *dw, const float *dout, int ld, const float *inp,
                          const float *w, int N, int C, int OC);

/* Causal self-attention. qkv (B,T,3C) holds q, k, v side by side per token;
 * att (B,NH,T,T) keeps the softmax probabilities (row t uses 0..t);
 * out (B,T,C) is the heads' outputs concatenated. */
void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH);
/* dqkv (B,T,3C) is overwritten; datt (B,NH,T,T) is scratch. */
void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH);

/* GELU, tanh approximation (GPT-2's; PyTorch approximate='tanh'). */
void gelu_forward(float *out, const float *inp, size_t n);
/* dinp = dout * gelu'(inp), overwritten. */
void gelu_backward(float *dinp, const float *dout, const float *inp, size_t n);

/* out = a + b. */
void residual_forward(float *out, const float *a, const float *b, size_t n);

/* Softmax over V then cross-entropy with targets: probs (N,V, may alias
 * logits), losses (N).
 * Returns the mean loss over the N rows. */
double crossentropy_forward(float *probs, float *losses, const float *logits,
                            const int *targets, int N, int V);
/* dlogits (N,V) = (probs - onehot(target)) * dloss, overwritten. dlogits may
 * alias probs. */
void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                           float dloss, int N, int V);

#endif
