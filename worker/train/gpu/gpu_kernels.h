/*
 * gpu_kernels: the CUDA kernels of the GPT-2 model on the GPU, one launcher
 * per kernel, each beside its backward, the way worker/train/layers.h lays
 * out the CPU reference. Outputs, then inputs, then sizes; shape letters as
 * in layers.h (B, T, C, NH, hs = C/NH, V, N = B*T, OC).
 *
 * Precision: matrix-product inputs (activations and gathered weights) are
 * bf16; the residual stream, matrix-product outputs, LayerNorm statistics,
 * softmax arithmetic, losses and every gradient that is accumulated are
 * fp32. Launchers return cudaGetLastError() so that the caller can name the
 * kernel that failed. Gradient reductions over rows (LayerNorm gains, biases,
 * embedding rows) use atomicAdd, so the GPU path is not bit-reproducible
 * run to run; the CPU path is the bit-exact reference.
 *
 * C++ linkage: only the worker/train/gpu CUDA files include this header.
 */
#ifndef MUSTER_GPU_KERNELS_H
#define MUSTER_GPU_KERNELS_H

#include <stddef.h>

#include <cuda_bf16.h>
#include <cuda_runtime.h>

typedef __nv_bfloat16 bf16;

/* A kernel launch, and a kernel's dynamic shared memory. Spelled as macros
 * so that the same source also runs under tests/cuemu (CUDA emulated on the
 * CPU for CI), whose cuda_runtime.h defines them its own way. */
#ifndef LAUNCH
#define LAUNCH(kernel, grid, block, smem, stream) kernel<<<grid, block, smem, stream>>>
#define DYN_SHARED(type, name) extern __shared__ type name[]
#endif

/* out (n) = bf16(in). */
cudaError_t k_cast_bf16(cudaStream_t s, bf16 *out, const float *in, size_t n);
/* dst (n) += src. */
cudaError_t k_add(cudaStream_t s, float *dst, const float *src, size_t n);
/* *acc += sum of x[i]^2 over n floats (double accumulation). */
cudaError_t k_sumsq(cudaStream_t s, double *acc, const float *x, size_t n);

/* out (N,C) = wte[inp] + wpe[t]. */
cudaError_t k_encoder_fwd(cudaStream_t s, float *out, const int *inp, const bf16 *wte,
                          const bf16 *wpe, int B, int T, int C);
/* dwte, dwpe += the gradient from dout (N,C). */
cudaError_t k_encoder_bwd(cudaStream_t s, float *dwte, float *dwpe, const float *dout,
                          const int *inp, int B, int T, int C);

/* LayerNorm (eps 1e-5): out bf16 (N,C); mean, rstd (N) fp32 for the backward. */
cudaError_t k_layernorm_fwd(cudaStream_t s, bf16 *out, float *mean, float *rstd,
                            const float *inp, const bf16 *w, const bf16 *b, int N, int C);
/* dinp += ...; dw, db += ... (fp32). */
cudaError_t k_layernorm_bwd(cudaStream_t s, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const bf16 *w,
                            const float *mean, const float *rstd, int N, int C);

/* out (N,OC) = bias broadcast over the rows: the C of a GEMM with beta 1. */
cudaError_t k_bias_fill(cudaStream_t s, float *out, const bf16 *bias, int N, int OC);
/* dbias (OC) += column sums of dout (N,OC). */
cudaError_t k_bias_bwd(cudaStream_t s, float *dbias, const float *dout, int N, int OC);

/* qkv (N,3C) fp32 -> q, k, v bf16, each (B,NH,T,hs). */
cudaError_t k_qkv_split(cudaStream_t s, bf16 *q, bf16 *k, bf16 *v, const float *qkv, int B,
                        int T, int C, int NH);
/* y (B,NH,T,hs) fp32 -> out (N,C) bf16 (heads side by side). */
cudaError_t k_heads_merge(cudaStream_t s, bf16 *out, const float *y, int B, int T, int C,
                          int NH);
/* dout (N,C) fp32 -> dy (B,NH,T,hs) bf16: the transpose of k_heads_merge. */
cudaError_t k_heads_split(cudaStream_t s, bf16 *dy, const float *dout, int B, int T, int C,
                          int NH);
/* dq, dk, dv (B,NH,T,hs) -> dqkv (N,3C) fp32 and its bf16 copy. */
cudaError_t k_qkv_merge(cudaStream_t s, float *dqkv, bf16 *dqkv_h, const float *dq,
                        const float *dk, const float *dv, int B, int T, int C, int NH);

/* Causal softmax over rows of T: att (R,T,T) bf16 from preatt (already
 * scaled) fp32; columns past the row's position are 0. R = B*NH. */
cudaError_t k_softmax_causal_fwd(cudaStream_t s, bf16 *att, const float *preatt, int R, int T);
/* dpre (R,T,T) bf16 = scale * att * (datt - sum(att * datt)), causal. */
cudaError_t k_softmax_causal_bwd(cudaStream_t s, bf16 *dpre, const float *datt, const bf16 *att,
                                 float scale, int R, int T);

/* out (n) = a + b. */
cudaError_t k_residual(cudaStream_t s, float *out, const float *a, const float *b, size_t n);

/* GELU, tanh approximation as layers.c: out bf16 (n). */
cudaError_t k_gelu_fwd(cudaStream_t s, bf16 *out, const float *inp, size_t n);
/* d (n) *= gelu'(inp), in place, and d_h = bf16(d). */
cudaError_t k_gelu_bwd(cudaStream_t s, float *d, bf16 *d_h, const float *inp, size_t n);

/* logits (N,Vp), rows of the vocabulary padded to Vp >= V, become
 * probabilities in place over the V real tokens (the padding's: 0, whatever
 * its logits); losses (N); *acc += mean loss. */
cudaError_t k_crossentropy_fwd(cudaStream_t s, float *logits, float *losses, double *acc,
                               const int *targets, int N, int V, int Vp);
/* dlogits (N,Vp) bf16 = (probs - onehot(target)) * dloss, 0 in the padding. */
cudaError_t k_crossentropy_bwd(cudaStream_t s, bf16 *dlogits, const float *probs,
                               const int *targets, float dloss, int N, int V, int Vp);

/* AdamW as worker/train/optim.c, per element decay mask (1: decay). */
cudaError_t k_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v,
                    const unsigned char *decay, size_t n, float b1, float b2, float eps,
                    float step_size, float bc2_sqrt, float shrink, float gscale);

#endif
