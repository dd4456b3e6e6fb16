/* The kernels of worker/train/gpu/gpu_kernels.h. */
#include "worker/train/gpu/gpu_kernels.h"

#include <math.h>

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

static inline unsigned blocks_for(size_t n, unsigned threads)
{
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b > 65535u * 32u ? 65535u * 32u : (b ? b : 1));
}

__device__ __forceinline__ float warp_sum(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

__device__ __forceinline__ float warp_max(float x)
{
    for (int o = 16; o > 0; o >>= 1)
        x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}

/* Sum over a block of blockDim.x (a multiple of 32, <= 1024) threads; every
 * thread gets the result. */
__device__ float block_sum(float x)
{
    __shared__ float part[32];
    __shared__ float total;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    x = warp_sum(x);
    __syncthreads(); /* part[] may still be read by a previous call */
    if (lane == 0)
        part[warp] = x;
    __syncthreads();
    if (warp == 0) {
        float y = lane < (int)(blockDim.x / 32) ? part[lane] : 0.0f;
        y = warp_sum(y);
        if (lane == 0)
            total = y;
    }
    __syncthreads();
    return total;
}

__device__ float block_max(float x)
{
    __shared__ float part[32];
    __shared__ float total;
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
    x = warp_max(x);
    __syncthreads();
    if (lane == 0)
        part[warp] = x;
    __syncthreads();
    if (warp == 0) {
        float y = lane < (int)(blockDim.x / 32) ? part[lane] : -INFINITY;
        y = warp_max(y);
        if (lane == 0)
            total = y;
    }
    __syncthreads();
    return total;
}

/* ---- elementwise ---- */

__global__ void cast_bf16_kernel(bf16 *out, const float *in, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __float2bfloat16(in[i]);
}

cudaError_t k_cast_bf16(cudaStream_t s, bf16 *out, const float *in, size_t n)
{
    LAUNCH(cast_bf16_kernel, blocks_for(n, 256), 256, 0, s)(out, in, n);
    return cudaGetLastError();
}

__global__ void add_kernel(float *dst, const float *src, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        dst[i] += src[i];
}

cudaError_t k_add(cudaStream_t s, float *dst, const float *src, size_t n)
{
    LAUNCH(add_kernel, blocks_for(n, 256), 256, 0, s)(dst, src, n);
    return cudaGetLastError();
}

__global__ void sumsq_kernel(double *acc, const float *x, size_t n)
{
    __shared__ double part[256];
    double sum = 0;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        sum += (double)x[i] * x[i];
    part[threadIdx.x] = sum;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w >>= 1) {
        if ((int)threadIdx.x < w)
            part[threadIdx.x] += part[threadIdx.x + w];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        atomicAdd(acc, part[0]);
}

cudaError_t k_sumsq(cudaStream_t s, double *acc, const float *x, size_t n)
{
    unsigned b = blocks_for(n, 256);
    LAUNCH(sumsq_kernel, b > 1024 ? 1024 : b, 256, 0, s)(acc, x, n);
    return cudaGetLastError();
}

__global__ void residual_kernel(float *out, const float *a, const float *b, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = a[i] + b[i];
}

cudaError_t k_residual(cudaStream_t s, float *out, const float *a, const float *b, size_t n)
{
    LAUNCH(residual_kernel, blocks_for(n, 256), 256, 0, s)(out, a, b, n);
    return cudaGetLastError();
}

/* 0.5 (1 + tanh u) written as 1 - 1/(e^{2u} + 1): saturates without NaN. */
__device__ __forceinline__ float tanh_fast(float u)
{
    return 1.0f - 2.0f / (__expf(2.0f * u) + 1.0f);
}

__global__ void gelu_fwd_kernel(bf16 *out, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float y = 0.5f * x * (1.0f + tanh_fast(GELU_K * (x + 0.044715f * x * x * x)));
        out[i] = __float2bfloat16(y);
    }
}

cudaError_t k_gelu_fwd(cudaStream_t s, bf16 *out, const float *inp, size_t n)
{
    LAUNCH(gelu_fwd_kernel, blocks_for(n, 256), 256, 0, s)(out, inp, n);
    return cudaGetLastError();
}

__global__ void gelu_bwd_kernel(float *d, bf16 *d_h, const float *inp, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float x = inp[i];
        float th = tanh_fast(GELU_K * (x + 0.044715f * x * x * x));
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) +
                  0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        float r = g * d[i];
        d[i] = r;
        d_h[i] = __float2bfloat16(r);
    }
}

cudaError_t k_gelu_bwd(cudaStream_t s, float *d, bf16 *d_h, const float *inp, size_t n)
{
    LAUNCH(gelu_bwd_kernel, blocks_for(n, 256), 256, 0, s)(d, d_h, inp, n);
    return cudaGetLastError();
}

/* ---- embedding ---- */

__global__ void encoder_fwd_kernel(float *out, const int *inp, const bf16 *wte, const bf16 *wpe,
                                   int B, int T, int C)
{
    const size_t total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C;
        int c = (int)(i % C), t = (int)(n % T);
        out[i] = __bfloat162float(wte[(size_t)inp[n] * C + c]) +
                 __bfloat162float(wpe[(size_t)t * C + c]);
    }
}

cudaError_t k_encoder_fwd(cudaStream_t s, float *out, const int *inp, const bf16 *wte,
                          const bf16 *wpe, int B, int T, int C)
{
    LAUNCH(encoder_fwd_kernel, blocks_for((size_t)B * T * C, 256), 256, 0, s)(out, inp, wte, wpe,
                                                                          B, T, C);
    return cudaGetLastError();
}

__global__ void encoder_bwd_kernel(float *dwte, float *dwpe, const float *dout, const int *inp,
                                   int B, int T, int C)
{
    const size_t total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / C;
        int c = (int)(i % C), t = (int)(n % T);
        atomicAdd(&dwte[(size_t)inp[n] * C + c], dout[i]);
        atomicAdd(&dwpe[(size_t)t * C + c], dout[i]);
    }
}

cudaError_t k_encoder_bwd(cudaStream_t s, float *dwte, float *dwpe, const float *dout,
                          const int *inp, int B, int T, int C)
{
    LAUNCH(encoder_bwd_kernel, blocks_for((size_t)B * T * C, 256), 256, 0, s)(dwte, dwpe, dout,
                                                                          inp, B, T, C);
    return cudaGetLastError();
}

/* ---- LayerNorm: one warp per row ---- */

__global__ void layernorm_fwd_kernel(bf16 *out, float *mean, float *rstd, const float *inp,
                                     const bf16 *w, const bf16 *b, int N, int C)
{
    const int lane = threadIdx.x % 32;
    const int row = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= N)
        return;
    const float *x = inp + (size_t)row * C;
    float sum = 0;
    for (int i = lane; i < C; i += 32)
        sum += x[i];
    const float m = warp_sum(sum) / C;
    float var = 0;
    for (int i = lane; i < C; i += 32) {
        float d = x[i] - m;
        var += d * d;
    }
    const float s = rsqrtf(warp_sum(var) / C + 1e-5f);
    bf16 *o = out + (size_t)row * C;
    for (int i = lane; i < C; i += 32)
        o[i] = __float2bfloat16((x[i] - m) * s * __bfloat162float(w[i]) + __bfloat162float(b[i]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = s;
    }
}

cudaError_t k_layernorm_fwd(cudaStream_t s, bf16 *out, float *mean, float *rstd,
                            const float *inp, const bf16 *w, const bf16 *b, int N, int C)
{
    const int warps = 8;
    LAUNCH(layernorm_fwd_kernel, (N + warps - 1) / warps, warps * 32, 0, s)(out, mean, rstd, inp, w,
                                                                       b, N, C);
    return cudaGetLastError();
}

/* A block of 8 warps takes LN_ROWS rows, a warp at a time per row; gain and
 * bias gradients are summed in shared memory, then added once per block. */
#define LN_ROWS 64

__global__ void layernorm_bwd_kernel(float *dinp, float *dw, float *db, const float *dout,
                                     const float *inp, const bf16 *w, const float *mean,
                                     const float *rstd, int N, int C)
{
    DYN_SHARED(float, sh); /* dw (C), db (C) */
    float *sdw = sh, *sdb = sh + C;
    for (int i = threadIdx.x; i < 2 * C; i += blockDim.x)
        sh[i] = 0;
    __syncthreads();
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, nwarps = blockDim.x / 32;
    const int first = blockIdx.x * LN_ROWS;
    for (int r = first + warp; r < first + LN_ROWS && r < N; r += nwarps) {
        const float *x = inp + (size_t)r * C, *d = dout + (size_t)r * C;
        const float m = mean[r], s = rstd[r];
        float dmean = 0, dnm = 0;
        for (int i = lane; i < C; i += 32) {
            float norm = (x[i] - m) * s;
            float dn = __bfloat162float(w[i]) * d[i];
            dmean += dn;
            dnm += dn * norm;
        }
        const float a = warp_sum(dmean) / C, c = warp_sum(dnm) / C;
        float *dx = dinp + (size_t)r * C;
        for (int i = lane; i < C; i += 32) {
            float norm = (x[i] - m) * s;
            dx[i] += (__bfloat162float(w[i]) * d[i] - a - norm * c) * s;
            atomicAdd(&sdw[i], d[i] * norm);
            atomicAdd(&sdb[i], d[i]);
        }
    }
    __syncthreads();
    for (int i = threadIdx.x; i < C; i += blockDim.x) {
        atomicAdd(&dw[i], sdw[i]);
        atomicAdd(&db[i], sdb[i]);
    }
}

cudaError_t k_layernorm_bwd(cudaStream_t s, float *dinp, float *dw, float *db,
                            const float *dout, const float *inp, const bf16 *w,
                            const float *mean, const float *rstd, int N, int C)
{
    LAUNCH(layernorm_bwd_kernel, (N + LN_ROWS - 1) / LN_ROWS, 256, 2 * C * sizeof(float), s)(
        dinp, dw, db, dout, inp, w, mean, rstd, N, C);
    return cudaGetLastError();
}

/* ---- biases ---- */

__global__ void bias_fill_kernel(float *out, const bf16 *bias, int N, int OC)
{
    const size_t total = (size_t)N * OC;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x)
        out[i] = __bfloat162float(bias[i % OC]);
}

cudaError_t k_bias_fill(cudaStream_t s, float *out, const bf16 *bias, int N, int OC)
{
    LAUNCH(bias_fill_kernel, blocks_for((size_t)N * OC, 256), 256, 0, s)(out, bias, N, OC);
    return cudaGetLastError();
}

#define BIAS_ROWS 256

/* Thread = column, blockIdx.y = a chunk of BIAS_ROWS rows: coalesced reads. */
__global__ void bias_bwd_kernel(float *dbias, const float *dout, int N, int OC)
{
    const int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= OC)
        return;
    const int first = blockIdx.y * BIAS_ROWS;
    float sum = 0;
    for (int r = first; r < first + BIAS_ROWS && r < N; r++)
        sum += dout[(size_t)r * OC + col];
    atomicAdd(&dbias[col], sum);
}

cudaError_t k_bias_bwd(cudaStream_t s, float *dbias, const float *dout, int N, int OC)
{
    dim3 grid((OC + 255) / 256, (N + BIAS_ROWS - 1) / BIAS_ROWS);
    LAUNCH(bias_bwd_kernel, grid, 256, 0, s)(dbias, dout, N, OC);
    return cudaGetLastError();
}

/* ---- attention layout changes ---- */

/* Index i of a (B,NH,T,hs) tensor -> (b, t, h, d). */
__device__ __forceinline__ void bhtd(size_t i, int T, int NH, int hs, int *b, int *t, int *h,
                                     int *d)
{
    *d = (int)(i % hs);
    size_t r = i / hs;
    *t = (int)(r % T);
    r /= T;
    *h = (int)(r % NH);
    *b = (int)(r / NH);
}

__global__ void qkv_split_kernel(bf16 *q, bf16 *k, bf16 *v, const float *qkv, int B, int T,
                                 int C, int NH)
{
    const int hs = C / NH;
    const size_t total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int b, t, h, d;
        bhtd(i, T, NH, hs, &b, &t, &h, &d);
        const float *row = qkv + ((size_t)b * T + t) * 3 * C + (size_t)h * hs + d;
        q[i] = __float2bfloat16(row[0]);
        k[i] = __float2bfloat16(row[C]);
        v[i] = __float2bfloat16(row[2 * C]);
    }
}

cudaError_t k_qkv_split(cudaStream_t s, bf16 *q, bf16 *k, bf16 *v, const float *qkv, int B,
                        int T, int C, int NH)
{
    LAUNCH(qkv_split_kernel, blocks_for((size_t)B * T * C, 256), 256, 0, s)(q, k, v, qkv, B, T, C,
                                                                        NH);
    return cudaGetLastError();
}

__global__ void heads_merge_kernel(bf16 *out, const float *y, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const size_t total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int b, t, h, d;
        bhtd(i, T, NH, hs, &b, &t, &h, &d);
        out[((size_t)b * T + t) * C + (size_t)h * hs + d] = __float2bfloat16(y[i]);
    }
}

cudaError_t k_heads_merge(cudaStream_t s, bf16 *out, const float *y, int B, int T, int C, int NH)
{
    LAUNCH(heads_merge_kernel, blocks_for((size_t)B * T * C, 256), 256, 0, s)(out, y, B, T, C, NH);
    return cudaGetLastError();
}

__global__ void heads_split_kernel(bf16 *dy, const float *dout, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const size_t total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int b, t, h, d;
        bhtd(i, T, NH, hs, &b, &t, &h, &d);
        dy[i] = __float2bfloat16(dout[((size_t)b * T + t) * C + (size_t)h * hs + d]);
    }
}

cudaError_t k_heads_split(cudaStream_t s, bf16 *dy, const float *dout, int B, int T, int C,
                          int NH)
{
    LAUNCH(heads_split_kernel, blocks_for((size_t)B * T * C, 256), 256, 0, s)(dy, dout, B, T, C, NH);
    return cudaGetLastError();
}

__global__ void qkv_merge_kernel(float *dqkv, bf16 *dqkv_h, const float *dq, const float *dk,
                                 const float *dv, int B, int T, int C, int NH)
{
    const int hs = C / NH;
    const size_t total = (size_t)B * T * C;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        int b, t, h, d;
        bhtd(i, T, NH, hs, &b, &t, &h, &d);
        size_t o = ((size_t)b * T + t) * 3 * C + (size_t)h * hs + d;
        dqkv[o] = dq[i];
        dqkv[o + C] = dk[i];
        dqkv[o + 2 * C] = dv[i];
        dqkv_h[o] = __float2bfloat16(dq[i]);
        dqkv_h[o + C] = __float2bfloat16(dk[i]);
        dqkv_h[o + 2 * C] = __float2bfloat16(dv[i]);
    }
}

cudaError_t k_qkv_merge(cudaStream_t s, float *dqkv, bf16 *dqkv_h, const float *dq,
                        const float *dk, const float *dv, int B, int T, int C, int NH)
{
    LAUNCH(qkv_merge_kernel, blocks_for((size_t)B * T * C, 256), 256, 0, s)(dqkv, dqkv_h, dq, dk, dv,
                                                                        B, T, C, NH);
    return cudaGetLastError();
}

/* ---- causal softmax: one warp per row; row r's position is r % T ---- */

__global__ void softmax_causal_fwd_kernel(bf16 *att, const float *preatt, int R, int T)
{
    const int lane = threadIdx.x % 32;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)R * T)
        return;
    const int t = (int)(row % T);
    const float *x = preatt + row * T;
    bf16 *a = att + row * T;
    float mx = -INFINITY;
    for (int j = lane; j <= t; j += 32)
        mx = fmaxf(mx, x[j]);
    mx = warp_max(mx);
    float sum = 0;
    for (int j = lane; j <= t; j += 32)
        sum += expf(x[j] - mx);
    const float inv = 1.0f / warp_sum(sum);
    for (int j = lane; j < T; j += 32)
        a[j] = __float2bfloat16(j <= t ? expf(x[j] - mx) * inv : 0.0f);
}

cudaError_t k_softmax_causal_fwd(cudaStream_t s, bf16 *att, const float *preatt, int R, int T)
{
    const size_t rows = (size_t)R * T;
    LAUNCH(softmax_causal_fwd_kernel, (unsigned)((rows + 7) / 8), 256, 0, s)(att, preatt, R, T);
    return cudaGetLastError();
}

__global__ void softmax_causal_bwd_kernel(bf16 *dpre, const float *datt, const bf16 *att,
                                          float scale, int R, int T)
{
    const int lane = threadIdx.x % 32;
    const size_t row = (size_t)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;
    if (row >= (size_t)R * T)
        return;
    const int t = (int)(row % T);
    const float *g = datt + row * T;
    const bf16 *a = att + row * T;
    bf16 *o = dpre + row * T;
    float dot = 0;
    for (int j = lane; j <= t; j += 32)
        dot += __bfloat162float(a[j]) * g[j];
    dot = warp_sum(dot);
    for (int j = lane; j < T; j += 32)
        o[j] = __float2bfloat16(j <= t ? __bfloat162float(a[j]) * (g[j] - dot) * scale : 0.0f);
}

cudaError_t k_softmax_causal_bwd(cudaStream_t s, bf16 *dpre, const float *datt, const bf16 *att,
                                 float scale, int R, int T)
{
    const size_t rows = (size_t)R * T;
    LAUNCH(softmax_causal_bwd_kernel, (unsigned)((rows + 7) / 8), 256, 0, s)(dpre, datt, att, scale,
                                                                        R, T);
    return cudaGetLastError();
}

/* ---- cross-entropy: one block per row ---- */

__global__ void crossentropy_fwd_kernel(float *logits, float *losses, double *acc,
                                        const int *targets, int N, int V, int Vp)
{
    const int row = blockIdx.x;
    float *z = logits + (size_t)row * Vp;
    float mx = -INFINITY;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        mx = fmaxf(mx, z[i]);
    mx = block_max(mx);
    const float zt = z[targets[row]]; /* read before the row is overwritten */
    __syncthreads();
    float sum = 0;
    for (int i = threadIdx.x; i < V; i += blockDim.x) {
        float e = expf(z[i] - mx);
        z[i] = e;
        sum += e;
    }
    sum = block_sum(sum);
    const float inv = 1.0f / sum;
    for (int i = threadIdx.x; i < V; i += blockDim.x)
        z[i] *= inv;
    for (int i = V + threadIdx.x; i < Vp; i += blockDim.x)
        z[i] = 0; /* the padding is no token: probability 0 */
    if (threadIdx.x == 0) {
        /* logsumexp(z) - z[target], without log(p) */
        float loss = logf(sum) - (zt - mx);
        losses[row] = loss;
        atomicAdd(acc, (double)loss / N);
    }
}

cudaError_t k_crossentropy_fwd(cudaStream_t s, float *logits, float *losses, double *acc,
                               const int *targets, int N, int V, int Vp)
{
    LAUNCH(crossentropy_fwd_kernel, N, 512, 0, s)(logits, losses, acc, targets, N, V, Vp);
    return cudaGetLastError();
}

__global__ void crossentropy_bwd_kernel(bf16 *dlogits, const float *probs, const int *targets,
                                        float dloss, int N, int V, int Vp)
{
    const size_t total = (size_t)N * Vp;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
         i += (size_t)gridDim.x * blockDim.x) {
        size_t n = i / Vp;
        int c = (int)(i % Vp);
        /* the padding's gradient is zero */
        float p = c < V ? probs[i] - (c == targets[n] ? 1.0f : 0.0f) : 0.0f;
        dlogits[i] = __float2bfloat16(p * dloss);
    }
}

cudaError_t k_crossentropy_bwd(cudaStream_t s, bf16 *dlogits, const float *probs,
                               const int *targets, float dloss, int N, int V, int Vp)
{
    LAUNCH(crossentropy_bwd_kernel, blocks_for((size_t)N * Vp, 256), 256, 0, s)(dlogits, probs,
                                                                            targets, dloss, N, V, Vp);
    return cudaGetLastError();
}

/* ---- AdamW on the fp32 shard ---- */

__global__ void adamw_kernel(float *p, const float *g, float *m, float *v,
                             const unsigned char *decay, size_t n, float b1, float b2, float eps,
                             float step_size, float bc2_sqrt, float shrink, float gscale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        float gi = g[i] * gscale;
        float w = decay[i] ? p[i] * shrink : p[i];
        float mi = m[i] * b1 + gi * (1.0f - b1);
        float vi = v[i] * b2 + (1.0f - b2) * gi * gi;
        m[i] = mi;
        v[i] = vi;
        p[i] = w - step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
    }
}

cudaError_t k_adamw(cudaStream_t s, float *p, const float *g, float *m, float *v,
                    const unsigned char *decay, size_t n, float b1, float b2, float eps,
                    float step_size, float bc2_sqrt, float shrink, float gscale)
{
    LAUNCH(adamw_kernel, blocks_for(n, 256), 256, 0, s)(p, g, m, v, decay, n, b1, b2, eps, step_size,
                                                    bc2_sqrt, shrink, gscale);
    return cudaGetLastError();
}
