#include "worker/train/layers.h"

#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <string.h>

void encoder_forward_rows(float *out, const int *inp, const float *rows, size_t first, size_t n,
                          int B, int T, int C, int V)
{
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            float *o = out + ((size_t)b * T + t) * C;
            const size_t row[2] = {(size_t)inp[b * T + t], (size_t)V + (size_t)t};
            for (int k = 0; k < 2; k++) {
                if (row[k] < first || row[k] - first >= n)
                    continue;
                const float *e = rows + (row[k] - first) * C;
                for (int i = 0; i < C; i++)
                    o[i] += e[i];
            }
        }
}

void encoder_backward_rows(float *drows, const float *dout, const int *inp, size_t first,
                           size_t n, int B, int T, int C, int V)
{
    /* Serial on purpose: rows collide when tokens repeat, and a fixed order
     * keeps the sum reproducible. B*T*C additions are cheap. */
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++) {
            const float *d = dout + ((size_t)b * T + t) * C;
            const size_t row[2] = {(size_t)inp[b * T + t], (size_t)V + (size_t)t};
            for (int k = 0; k < 2; k++) {
                if (row[k] < first || row[k] - first >= n)
                    continue;
                float *e = drows + (row[k] - first) * C;
                for (int i = 0; i < C; i++)
                    e[i] += d[i];
            }
        }
}

void layernorm_forward(float *out, float *mean, float *rstd, const float *inp,
                       const float *w, const float *b, int N, int C)
{
    const double eps = 1e-5;
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        double m = 0, v = 0;
        for (int i = 0; i < C; i++)
            m += x[i];
        m /= C;
        for (int i = 0; i < C; i++)
            v += (x[i] - m) * (x[i] - m);
        v /= C; /* biased variance, as PyTorch's layer_norm */
        float s = (float)(1.0 / sqrt(v + eps));
        float *o = out + (size_t)n * C;
        for (int i = 0; i < C; i++)
            o[i] = ((x[i] - (float)m) * s) * w[i] + b[i];
        mean[n] = (float)m;
        rstd[n] = s;
    }
}

void layernorm_backward(float *dinp, float *dw, float *db, const float *dout,
                        const float *inp, const float *w, const float *mean,
                        const float *rstd, int N, int C)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float m = mean[n], s = rstd[n];
        /* dx = s * (dnorm - mean(dnorm) - norm * mean(dnorm * norm)) */
        double dmean = 0, dnorm_mean = 0;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            float dn = w[i] * d[i];
            dmean += dn;
            dnorm_mean += dn * norm;
        }
        float a = (float)(dmean / C), c = (float)(dnorm_mean / C);
        float *dx = dinp + (size_t)n * C;
        for (int i = 0; i < C; i++) {
            float norm = (x[i] - m) * s;
            dx[i] += (w[i] * d[i] - a - norm * c) * s;
        }
    }
    /* Weight gradients by channel, so that each is summed in row order. */
#pragma omp parallel for schedule(static)
    for (int i = 0; i < C; i++) {
        float gw = 0, gb = 0;
        for (int n = 0; n < N; n++) {
            float d = dout[(size_t)n * C + i];
            gw += d * (inp[(size_t)n * C + i] - mean[n]) * rstd[n];
            gb += d;
        }
        dw[i] += gw;
        db[i] += gb;
    }
}

/* This thread's share [lo, hi) of n rows inside a parallel region. */
static void thread_range(int n, int *lo, int *hi)
{
    int nt = omp_get_num_threads(), id = omp_get_thread_num();
    *lo = (int)((long)n * id / nt);
    *hi = (int)((long)n * (id + 1) / nt);
}

void layers_set_threads(int n)
{
    omp_set_num_threads(n);
    openblas_set_num_threads(1);
}

/* Rows [lo, hi) of out (rows ld apart) = inp @ w^T + beta * out. */
static void sgemm_out(int lo, int hi, float *out, int ld, const float *inp, const float *w,
                      int C, int OC, float beta)
{
    if (hi > lo)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, hi - lo, OC, C, 1.0f,
                    inp + (size_t)lo * C, C, w, C, beta, out + (size_t)lo * ld, ld);
}

/* Rows [lo, hi) of dinp = dout @ w + beta * dinp (dout's rows ld apart). */
static void sgemm_dinp(int lo, int hi, float *dinp, const float *dout, int ld, const float *w,
                       int C, int OC, float beta)
{
    if (hi > lo)
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, hi - lo, C, OC, 1.0f,
                    dout + (size_t)lo * ld, ld, w, C, beta, dinp + (size_t)lo * C, C);
}

/* Output channels [lo, hi) of dw += dout^T @ inp (dout's rows ld apart). */
static void sgemm_dw(int lo, int hi, float *dw, const float *dout, int ld, const float *inp,
                     int N, int C)
{
    if (hi > lo)
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, hi - lo, C, N, 1.0f, dout + lo, ld,
                    inp, C, 1.0f, dw + (size_t)lo * C, C);
}

void matmul_forward(float *out, const float *inp, const float *w, const float *bias,
                    int N, int C, int OC)
{
#pragma omp parallel
    {
        int lo, hi;
        thread_range(N, &lo, &hi);
        float beta = 0.0f;
        if (bias) {
            for (int n = lo; n < hi; n++)
                memcpy(out + (size_t)n * OC, bias, sizeof(float) * (size_t)OC);
            beta = 1.0f;
        }
        sgemm_out(lo, hi, out, OC, inp, w, C, OC, beta);
    }
}

void matmul_backward(float *dinp, float *dw, float *dbias, const float *dout,
                     const float *inp, const float *w, int N, int C, int OC)
{
#pragma omp parallel
    {
        int lo, hi;
        /* dinp by rows of N; dw and dbias by output channels */
        thread_range(N, &lo, &hi);
        sgemm_dinp(lo, hi, dinp, dout, OC, w, C, OC, 0.0f);
        thread_range(OC, &lo, &hi);
        sgemm_dw(lo, hi, dw, dout, OC, inp, N, C);
        if (dbias) {
            for (int o = lo; o < hi; o++) {
                float s = 0;
                for (int n = 0; n < N; n++)
                    s += dout[(size_t)n * OC + o];
                dbias[o] += s;
            }
        }
    }
}

void matmul_forward_cols(float *out, int ld, const float *inp, const float *w, int N, int C,
                         int OC)
{
#pragma omp parallel
    {
        int lo, hi;
        thread_range(N, &lo, &hi);
        sgemm_out(lo, hi, out, ld, inp, w, C, OC, 0.0f);
    }
}

void matmul_backward_cols(float *dinp, float *dw, const float *dout, int ld, const float *inp,
                          const float *w, int N, int C, int OC)
{
#pragma omp parallel
    {
        int lo, hi;
        thread_range(N, &lo, &hi);
        if (dinp)
            sgemm_dinp(lo, hi, dinp, dout, ld, w, C, OC, 1.0f);
        thread_range(OC, &lo, &hi);
        if (dw)
            sgemm_dw(lo, hi, dw, dout, ld, inp, N, C);
    }
}

/* Rows of the causal softmax: row t keeps columns 0..t of scores (T wide). */
static void causal_softmax_rows(float *att, size_t rows, int T)
{
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        float *a = att + r * T;
        int t = (int)(r % (size_t)T);
        float mx = -INFINITY;
        for (int t2 = 0; t2 <= t; t2++)
            mx = a[t2] > mx ? a[t2] : mx;
        float sum = 0;
        for (int t2 = 0; t2 <= t; t2++) {
            a[t2] = expf(a[t2] - mx);
            sum += a[t2];
        }
        float inv = 1.0f / sum;
        for (int t2 = 0; t2 <= t; t2++)
            a[t2] *= inv;
        for (int t2 = t + 1; t2 < T; t2++)
            a[t2] = 0;
    }
}

/*
 * Per (b, h) the products are sgemm over strided views of qkv: q, k and v of
 * head h are (T, hs) matrices with row stride 3C. The upper triangle of the
 * scores is computed and then zeroed by the softmax: twice the flops of a
 * causal kernel, still far faster than scalar loops.
 */
void attention_forward(float *out, float *att, const float *qkv, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C;
            float *a = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, scale, q, C3, k, C3,
                        0.0f, a, T);
        }
    causal_softmax_rows(att, (size_t)B * NH * T, T);
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *v = qkv + (size_t)b * T * C3 + 2 * C + h * hs;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, v, C3,
                        0.0f, out + (size_t)b * T * C + h * hs, C);
        }
}

void attention_backward(float *dqkv, float *datt, const float *dout, const float *qkv,
                        const float *att, int B, int T, int C, int NH)
{
    const int hs = C / NH, C3 = 3 * C;
    const float scale = 1.0f / sqrtf((float)hs);
    /* through out = att @ v: dv = att^T @ dout, datt = dout @ v^T */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *v = qkv + (size_t)b * T * C3 + 2 * C + h * hs;
            const float *d = dout + (size_t)b * T * C + h * hs;
            const float *a = att + ((size_t)b * NH + h) * T * T;
            float *dv = dqkv + (size_t)b * T * C3 + 2 * C + h * hs;
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, a, T, d, C,
                        0.0f, dv, C3);
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, T, T, hs, 1.0f, d, C, v, C3,
                        0.0f, datt + ((size_t)b * NH + h) * T * T, T);
        }
    /* through the softmax and the scale: dpre = scale * a * (datt - sum(a * datt)) */
    const size_t rows = (size_t)B * NH * T;
#pragma omp parallel for schedule(static)
    for (size_t r = 0; r < rows; r++) {
        const float *a = att + r * T;
        float *g = datt + r * T;
        int t = (int)(r % (size_t)T);
        float dot = 0;
        for (int t2 = 0; t2 <= t; t2++)
            dot += a[t2] * g[t2];
        for (int t2 = 0; t2 <= t; t2++)
            g[t2] = a[t2] * (g[t2] - dot) * scale;
        for (int t2 = t + 1; t2 < T; t2++)
            g[t2] = 0;
    }
    /* through scores = q @ k^T: dq = dpre @ k, dk = dpre^T @ q */
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const float *q = qkv + (size_t)b * T * C3 + h * hs, *k = q + C;
            const float *g = datt + ((size_t)b * NH + h) * T * T;
            float *dq = dqkv + (size_t)b * T * C3 + h * hs, *dk = dq + C;
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, T, hs, T, 1.0f, g, T, k, C3,
                        0.0f, dq, C3);
            cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, T, hs, T, 1.0f, g, T, q, C3,
                        0.0f, dk, C3);
        }
}

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */

/* tanh through one expf: glibc's tanhf goes through expm1f and costs about
 * three times as much. Absolute error ~1e-7, which is what GELU needs
 * (0.5 x (1 + tanh u)); saturates correctly when expf overflows to inf. */
static inline float fast_tanhf(float u)
{
    return 1.0f - 2.0f / (expf(2.0f * u) + 1.0f);
}

void gelu_forward(float *out, const float *inp, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        out[i] = 0.5f * x * (1.0f + fast_tanhf(GELU_K * (x + 0.044715f * x * x * x)));
    }
}

void gelu_backward(float *dinp, const float *dout, const float *inp, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float x = inp[i];
        float u = GELU_K * (x + 0.044715f * x * x * x);
        float th = fast_tanhf(u);
        float sech2 = 1.0f - th * th;
        float g = 0.5f * (1.0f + th) + 0.5f * x * sech2 * GELU_K * (1.0f + 3.0f * 0.044715f * x * x);
        dinp[i] = g * dout[i];
    }
}

void residual_forward(float *out, const float *a, const float *b, size_t n)
{
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++)
        out[i] = a[i] + b[i];
}

double crossentropy_forward(float *probs, float *losses, const float *logits,
                            const int *targets, int N, int V)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *z = logits + (size_t)n * V;
        float *p = probs + (size_t)n * V;
        float mx = z[0];
        for (int i = 1; i < V; i++)
            if (z[i] > mx)
                mx = z[i];
        float zt = z[targets[n]]; /* read before p, which may alias z, is written */
        double sum = 0;
        for (int i = 0; i < V; i++) {
            p[i] = expf(z[i] - mx);
            sum += p[i];
        }
        /* loss = logsumexp(z) - z[target], computed without log(p) */
        losses[n] = (float)(log(sum) - (double)(zt - mx));
        float inv = (float)(1.0 / sum);
        for (int i = 0; i < V; i++)
            p[i] *= inv;
    }
    double mean = 0;
    for (int n = 0; n < N; n++)
        mean += losses[n];
    return mean / N;
}

void crossentropy_backward(float *dlogits, const float *probs, const int *targets,
                           float dloss, int N, int V)
{
#pragma omp parallel for schedule(static)
    for (int n = 0; n < N; n++) {
        const float *p = probs + (size_t)n * V;
        float *d = dlogits + (size_t)n * V;
        for (int i = 0; i < V; i++)
            d[i] = (p[i] - (i == targets[n] ? 1.0f : 0.0f)) * dloss;
    }
}
