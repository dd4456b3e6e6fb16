/*
 * gpu_zero: the GPT-2 passes on the GPU and ZeRO-3 over NCCL (worker/train/gpu/gpu.h).
 *
 * Streams and events:
 *   cs  compute: casts, kernels, cuBLAS (the handle is bound to cs)
 *   ns  communication: all-gathers of units into their slots, reduce-scatters
 *       of unit gradients and their addition into the gradient shard
 *   ev_gath[s]  ns -> cs   slot s holds its unit          (cs waits before use)
 *   ev_free[s]  cs -> ns   cs is done reading slot s      (ns waits before refilling)
 *   ev_gready[s] cs -> ns  gradient buffer s is complete  (ns reduce-scatters it)
 *   ev_gfree[s] ns -> cs   gradient buffer s was reduced  (cs waits before zeroing it)
 *   xs  side: copies of the state (p, m, v) to pinned host memory, the
 *       snapshots peer replicas are sent from (gpu_zero_snapshot)
 *   ev_updated  cs -> xs   the last update (or upload) of the state is done
 *   ev_snap     xs -> cs   the snapshot is copied (the next AdamW waits)
 * Slots 0 and 1 alternate between the blocks (unit u in slot (u-1) % 2, the
 * final norm in slot L % 2); slot 2 is the embedding, gathered once per
 * forward and held through the backward for the tied head.
 *
 * The NCCL communicator has one owner: the thread that calls gpu_zero_*
 * (muster-train's training thread). Only it calls NCCL, ncclCommAbort
 * included; gpu_zero_abort, from any thread, sets an atomic flag the owner
 * acts on. The communicator is non-blocking (config.blocking = 0) and no
 * host wait blocks: each polls its event, ncclCommGetAsyncError, the abort
 * flag and a deadline, since on NCCL a collective whose peer died never
 * completes until this rank aborts.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "worker/train/gpu/gpu_err.h"
#include "worker/train/gpu/gpu_kernels.h"

#define ALIGN_FLOATS GPU_SHARD_ALIGN
#define BLAS_WORKSPACE (32u << 20) /* cuBLAS' recommended workspace on Hopper */
#define NSLOT 3                    /* two block/norm slots and the embedding */
#define EMBED 2
#define NSTALL 1024                /* stall measurements in flight */

/* Activations of one micro-batch, carved out of one allocation. */
struct gpu_acts {
    float *encoded;                                   /* (N,C) */
    bf16 *ln1[GPT_MAX_LAYERS];                        /* (N,C) */
    float *ln1_mean[GPT_MAX_LAYERS], *ln1_rstd[GPT_MAX_LAYERS];
    bf16 *qkvr[GPT_MAX_LAYERS];                       /* q, k, v (B,NH,T,hs) each */
    bf16 *att[GPT_MAX_LAYERS];                        /* (B,NH,T,T) probabilities */
    bf16 *atty[GPT_MAX_LAYERS];                       /* (N,C) */
    float *res2[GPT_MAX_LAYERS];                      /* (N,C) */
    bf16 *ln2[GPT_MAX_LAYERS];
    float *ln2_mean[GPT_MAX_LAYERS], *ln2_rstd[GPT_MAX_LAYERS];
    float *fch[GPT_MAX_LAYERS];                       /* (N,4C) pre-GELU */
    bf16 *fch_gelu[GPT_MAX_LAYERS];                   /* (N,4C) */
    float *res3[GPT_MAX_LAYERS];                      /* (N,C) block output */
    bf16 *lnf;
    float *lnf_mean, *lnf_rstd;
    float *logits;                                    /* (N,Vp); probabilities after the loss */
    bf16 *dlogits;                                    /* (N,Vp) */
    float *losses;                                    /* (N) */
    float *dres, *dsmall;                             /* (N,C) */
    float *scr_a;                                     /* (N,4C) GEMM outputs */
    float *scr_b;                                     /* (B,NH,T,T) pre-softmax, its gradient */
    float *scr_c;                                     /* dq, dk, dv */
    bf16 *scr_h;                                      /* max((N,4C), (B,NH,T,T)) */
    bf16 *scr_h2;                                     /* (N,3C) */
};

struct gpu_zero {
    struct gpt_config cfg;
    struct gpt_layout lay;
    int rank, world, maxB, maxT;
    int B, T;                                  /* the last forward's shape */
    size_t shard[GPT_MAX_UNITS], off[GPT_MAX_UNITS], total, max_shard;
    size_t toff[12];               /* block tensor offsets (gpt_unit_tensors order) */
    size_t eoff[2], noff[2];                   /* embedding (wte, wpe), norm (lnfw, lnfb) */
    /* model state (total floats each) */
    float *p, *m, *v, *g;
    unsigned char *decay;
    bf16 *pbf;                                 /* bf16 copy of p, the all-gathers' source */
    int Vp;                                    /* the vocabulary padded to GPU_VOCAB_ALIGN */
    bf16 *head_w;                              /* (Vp,C): wte of the gathered embedding, zero rows past V */
    /* transient */
    bf16 *slot[NSLOT];                         /* gathered units (world * shard) */
    float *gbuf[NSLOT];                        /* full unit gradients */
    float *rsbuf[NSLOT];                       /* reduce-scatter results (shard) */
    int holds[NSLOT];                          /* unit in the slot, -1: none */
    int stale;                                 /* pbf and slots are older than p */
    struct gpu_acts a;
    void *acts_mem;
    int *d_inp, *d_tgt, *h_inp, *h_tgt;        /* h_: pinned staging */
    double *d_stats, *h_stats;                 /* [0] step loss, [1] sum of squares, [2] one loss */
    void *workspace;
    cudaStream_t cs, ns, xs;
    cudaEvent_t ev_updated, ev_snap;
    float *snap[2];                            /* pinned, 3 x total each: p, m, v */
    int snap_pending;                          /* a snapshot copy the next AdamW must wait for */
    cudaEvent_t ev_gath[NSLOT], ev_free[NSLOT], ev_gready[NSLOT], ev_gfree[NSLOT];
    cudaEvent_t ev_cast, ev_ns, ev_cs, ev_upload, ev_host;
    /* compute-stream stalls on communication: a timing event before and
     * after each wait of cs on ns, a ring of NSTALL pairs */
    cudaEvent_t stall[NSTALL][2];
    int stall_first, stall_n;
    double stall_ms;
    cublasHandle_t blas;
#ifdef MUSTER_HAVE_NCCL
    ncclComm_t nc;
#endif
    int have_nc;
    int abort_req;                             /* gpu_zero_abort was called (any thread; __atomic) */
    int comm_gone;                             /* the owner ran ncclCommAbort */
    int nccl_failed;                           /* an NCCL call failed, or a wait timed out */
    const int *cancel;                         /* formation gives up when non-zero (__atomic) */
    int timeout_ms;                            /* a host wait with NCCL work fails after this */
    size_t alloc_bytes, peak_bytes, device_total;
    char err[1024];
};

/* ---- sizes ---- */

static size_t round_up(size_t x, size_t a) { return (x + a - 1) / a * a; }

static size_t vocab_padded(int V) { return round_up((size_t)V, GPU_VOCAB_ALIGN); }

static size_t shard_of(size_t numel, int world)
{
    return round_up((numel + (size_t)world - 1) / (size_t)world, ALIGN_FLOATS);
}

/* Carves the activations from mem (NULL: only counts); returns bytes. */
static size_t carve_acts(struct gpu_acts *a, char *mem, const struct gpt_config *cfg, int B, int T)
{
    const size_t N = (size_t)B * T, C = (size_t)cfg->C, V = vocab_padded(cfg->V);
    const size_t att = (size_t)B * cfg->NH * T * T;
    size_t used = 0;
#define TAKE(ptr, type, count)                                                 \
    do {                                                                       \
        (ptr) = mem ? (type *)(mem + used) : NULL;                             \
        used += round_up((count) * sizeof(type), 256);                         \
    } while (0)
    TAKE(a->encoded, float, N * C);
    for (int l = 0; l < cfg->L; l++) {
        TAKE(a->ln1[l], bf16, N * C);
        TAKE(a->ln1_mean[l], float, N);
        TAKE(a->ln1_rstd[l], float, N);
        TAKE(a->qkvr[l], bf16, 3 * N * C);
        TAKE(a->att[l], bf16, att);
        TAKE(a->atty[l], bf16, N * C);
        TAKE(a->res2[l], float, N * C);
        TAKE(a->ln2[l], bf16, N * C);
        TAKE(a->ln2_mean[l], float, N);
        TAKE(a->ln2_rstd[l], float, N);
        TAKE(a->fch[l], float, 4 * N * C);
        TAKE(a->fch_gelu[l], bf16, 4 * N * C);
        TAKE(a->res3[l], float, N * C);
    }
    TAKE(a->lnf, bf16, N * C);
    TAKE(a->lnf_mean, float, N);
    TAKE(a->lnf_rstd, float, N);
    TAKE(a->logits, float, N * V);
    TAKE(a->dlogits, bf16, N * V);
    TAKE(a->losses, float, N);
    TAKE(a->dres, float, N * C);
    TAKE(a->dsmall, float, N * C);
    TAKE(a->scr_a, float, 4 * N * C);
    TAKE(a->scr_b, float, att);
    TAKE(a->scr_c, float, 3 * N * C);
    TAKE(a->scr_h, bf16, att > 4 * N * C ? att : 4 * N * C);
    TAKE(a->scr_h2, bf16, 3 * N * C);
#undef TAKE
    return used;
}

struct sizes {
    size_t state, transient, acts, other;
};

static void sizes_of(const struct gpt_config *cfg, int maxB, int T, int world, struct sizes *sz)
{
    struct gpt_layout lay;
    struct gpu_acts a;
    gpt_layout_init(&lay, cfg);
    size_t total = 0, max_shard = 0;
    for (int u = 0; u < lay.nunits; u++) {
        size_t s = shard_of(lay.numel[u], world);
        total += s;
        if (u > 0 && s > max_shard)
            max_shard = s;
    }
    const size_t s0 = shard_of(lay.numel[0], world);
    /* p, m, v, g fp32 + decay mask + bf16 copy */
    sz->state = total * (4 * sizeof(float) + 1 + sizeof(bf16));
    sz->transient = (size_t)world * (s0 + 2 * max_shard) * (sizeof(bf16) + sizeof(float)) +
                    (world > 1 ? (s0 + 2 * max_shard) * sizeof(float) : 0);
    sz->acts = carve_acts(&a, NULL, cfg, maxB, T);
    sz->other = BLAS_WORKSPACE + 2 * (size_t)maxB * T * sizeof(int) + 4 * sizeof(double) +
                vocab_padded(cfg->V) * cfg->C * sizeof(bf16); /* the padded head */
}

size_t gpu_zero_estimate_bytes(const struct gpt_config *cfg, int maxB, int T, int world)
{
    struct sizes sz;
    sizes_of(cfg, maxB, T, world, &sz);
    return sz.state + sz.transient + sz.acts + sz.other;
}

/* "gpt2-124m with micro_batch 4, small with micro_batch 8, ..." within budget. */
static void what_fits(char *out, size_t len, int maxB, int T, int world, size_t budget)
{
    static const char *names[] = {"gpt2-124m", "small", "tiny"};
    size_t o = 0;
    out[0] = '\0';
    for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && o < len; i++) {
        struct gpt_config c;
        gpt_preset(names[i], &c);
        int t = T < c.T ? T : c.T;
        for (int b = maxB; b >= 1; b /= 2)
            if (gpu_zero_estimate_bytes(&c, b, t, world) <= budget) {
                o += (size_t)snprintf(out + o, len - o, "%s%s with micro_batch %d (seq_len %d)",
                                      o ? "; " : "", names[i], b, t);
                break;
            }
    }
    if (!o)
        snprintf(out, len, "none of the presets, even with micro_batch 1: use more ranks");
}

static int gpu_alloc(struct gpu_zero *z, void **ptr, size_t bytes, const char *what)
{
    cudaError_t e = cudaMalloc(ptr, bytes);
    if (e == cudaSuccess) {
        z->alloc_bytes += bytes;
        return 0;
    }
    if (e != cudaErrorMemoryAllocation)
        return gpu_report_cuda(z->err, sizeof(z->err), "cudaMalloc", e, __FILE__, __LINE__);
    cudaGetLastError(); /* clear the sticky-free error */
    size_t fr = 0, tot = 0;
    cudaMemGetInfo(&fr, &tot);
    struct sizes sz;
    sizes_of(&z->cfg, z->maxB, z->maxT, z->world, &sz);
    char fits[384];
    what_fits(fits, sizeof(fits), z->maxB, z->maxT, z->world, (size_t)(tot * 0.92));
    const double G = 1024.0 * 1024.0 * 1024.0;
    snprintf(z->err, sizeof(z->err),
             "cudaMalloc(%s, %.3f GiB): cudaErrorMemoryAllocation: out of memory: %.3f GiB free of "
             "%.3f GiB on the device (%.3f GiB already taken by this rank); this run needs about "
             "%.3f GiB (ZeRO-3 estimate at world %d: model state %.3f, gathered units and full "
             "gradients %.3f, activations for micro_batch %d x seq_len %d %.3f); would fit: %s",
             what, bytes / G, fr / G, tot / G, z->alloc_bytes / G,
             (sz.state + sz.transient + sz.acts + sz.other) / G, z->world, sz.state / G,
             sz.transient / G, z->maxB, z->maxT, sz.acts / G, fits);
    return -ENOMEM;
}

static void sample_peak(struct gpu_zero *z)
{
    size_t fr, tot;
    if (cudaMemGetInfo(&fr, &tot) == cudaSuccess && tot - fr > z->peak_bytes)
        z->peak_bytes = tot - fr;
}

/* ---- matrix products: bf16 inputs, fp32 outputs and accumulation ---- */

static int gemm(struct gpu_zero *z, int ta, int tb, int m, int n, int k, const bf16 *A, int lda,
                long long sA, const bf16 *Bm, int ldb, long long sB, float *Cm, int ldc,
                long long sC, int batch, float alpha, float beta)
{
    CUBLAS_CK(cublasGemmStridedBatchedEx(z->blas, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                                         tb ? CUBLAS_OP_T : CUBLAS_OP_N, m, n, k, &alpha, A,
                                         CUDA_R_16BF, lda, sA, Bm, CUDA_R_16BF, ldb, sB, &beta, Cm,
                                         CUDA_R_32F, ldc, sC, batch, CUBLAS_COMPUTE_32F,
                                         CUBLAS_GEMM_DEFAULT));
    return 0;
}

/* out (N,OC) = inp (N,C) @ w^T + bias; w (OC,C) row-major, as layers.h. */
static int linear_fwd(struct gpu_zero *z, float *out, const bf16 *inp, const bf16 *w,
                      const bf16 *bias, int N, int C, int OC)
{
    if (bias)
        CUDA_CK(k_bias_fill(z->cs, out, bias, N, OC));
    return gemm(z, 1, 0, OC, N, C, w, C, 0, inp, C, 0, out, OC, 0, 1, 1.0f, bias ? 1.0f : 0.0f);
}

/* dinp (N,C) = dout @ w (overwritten; NULL: skipped); dw += dout^T @ inp;
 * dbias += column sums of dout (fp32). dout_h is dout in bf16. */
static int linear_bwd(struct gpu_zero *z, float *dinp, float *dw, float *dbias, const float *dout,
                      const bf16 *dout_h, const bf16 *inp, const bf16 *w, int N, int C, int OC)
{
    if (dinp)
        TRY(gemm(z, 0, 0, C, N, OC, w, C, 0, dout_h, OC, 0, dinp, C, 0, 1, 1.0f, 0.0f));
    TRY(gemm(z, 0, 1, C, OC, N, inp, C, 0, dout_h, OC, 0, dw, C, 0, 1, 1.0f, 1.0f));
    if (dbias)
        CUDA_CK(k_bias_bwd(z->cs, dbias, dout, N, OC));
    return 0;
}

/* ---- the model's passes over one unit (w: gathered bf16 unit; d: its fp32 gradient) ---- */

enum { LN1W, LN1B, QKVW, QKVB, APW, APB, LN2W, LN2B, FCW, FCB, FPW, FPB };

static int block_fwd(struct gpu_zero *z, int l, const bf16 *w)
{
    struct gpu_acts *a = &z->a;
    const int B = z->B, T = z->T, C = z->cfg.C, NH = z->cfg.NH, N = B * T, hs = C / NH;
    const size_t NC = (size_t)N * C;
    const float *x = l == 0 ? a->encoded : a->res3[l - 1];
    const size_t *o = z->toff;
    bf16 *q = a->qkvr[l], *k = q + NC, *v = k + NC;
    CUDA_CK(k_layernorm_fwd(z->cs, a->ln1[l], a->ln1_mean[l], a->ln1_rstd[l], x, w + o[LN1W],
                            w + o[LN1B], N, C));
    TRY(linear_fwd(z, a->scr_a, a->ln1[l], w + o[QKVW], w + o[QKVB], N, C, 3 * C));
    CUDA_CK(k_qkv_split(z->cs, q, k, v, a->scr_a, B, T, C, NH));
    /* preatt = q k^T / sqrt(hs), per (b, h) */
    TRY(gemm(z, 1, 0, T, T, hs, k, hs, (long long)T * hs, q, hs, (long long)T * hs, a->scr_b, T,
             (long long)T * T, B * NH, 1.0f / sqrtf((float)hs), 0.0f));
    CUDA_CK(k_softmax_causal_fwd(z->cs, a->att[l], a->scr_b, B * NH, T));
    /* y = att v */
    TRY(gemm(z, 0, 0, hs, T, T, v, hs, (long long)T * hs, a->att[l], T, (long long)T * T,
             a->scr_a, hs, (long long)T * hs, B * NH, 1.0f, 0.0f));
    CUDA_CK(k_heads_merge(z->cs, a->atty[l], a->scr_a, B, T, C, NH));
    TRY(linear_fwd(z, a->scr_a, a->atty[l], w + o[APW], w + o[APB], N, C, C));
    CUDA_CK(k_residual(z->cs, a->res2[l], x, a->scr_a, NC));
    CUDA_CK(k_layernorm_fwd(z->cs, a->ln2[l], a->ln2_mean[l], a->ln2_rstd[l], a->res2[l],
                            w + o[LN2W], w + o[LN2B], N, C));
    TRY(linear_fwd(z, a->fch[l], a->ln2[l], w + o[FCW], w + o[FCB], N, C, 4 * C));
    CUDA_CK(k_gelu_fwd(z->cs, a->fch_gelu[l], a->fch[l], 4 * NC));
    TRY(linear_fwd(z, a->scr_a, a->fch_gelu[l], w + o[FPW], w + o[FPB], N, 4 * C, C));
    CUDA_CK(k_residual(z->cs, a->res3[l], a->res2[l], a->scr_a, NC));
    return 0;
}

/* a.dres holds d(res3[l]) on entry and d(block input) on return. */
static int block_bwd(struct gpu_zero *z, int l, float *d, const bf16 *w)
{
    struct gpu_acts *a = &z->a;
    const int B = z->B, T = z->T, C = z->cfg.C, NH = z->cfg.NH, N = B * T, hs = C / NH;
    const size_t NC = (size_t)N * C;
    const float *x = l == 0 ? a->encoded : a->res3[l - 1];
    const size_t *o = z->toff;
    const bf16 *q = a->qkvr[l], *k = q + NC, *v = k + NC;
    float *dq = a->scr_c, *dk = dq + NC, *dv = dk + NC;

    CUDA_CK(k_cast_bf16(z->cs, a->scr_h2, a->dres, NC));
    TRY(linear_bwd(z, a->scr_a, d + o[FPW], d + o[FPB], a->dres, a->scr_h2, a->fch_gelu[l],
                   w + o[FPW], N, 4 * C, C));
    CUDA_CK(k_gelu_bwd(z->cs, a->scr_a, a->scr_h, a->fch[l], 4 * NC));
    TRY(linear_bwd(z, a->dsmall, d + o[FCW], d + o[FCB], a->scr_a, a->scr_h, a->ln2[l],
                   w + o[FCW], N, C, 4 * C));
    CUDA_CK(k_layernorm_bwd(z->cs, a->dres, d + o[LN2W], d + o[LN2B], a->dsmall, a->res2[l],
                            w + o[LN2W], a->ln2_mean[l], a->ln2_rstd[l], N, C));
    CUDA_CK(k_cast_bf16(z->cs, a->scr_h2, a->dres, NC));
    TRY(linear_bwd(z, a->dsmall, d + o[APW], d + o[APB], a->dres, a->scr_h2, a->atty[l],
                   w + o[APW], N, C, C));
    /* attention: dy (B,NH,T,hs) in scr_h2 */
    bf16 *dy = a->scr_h2;
    CUDA_CK(k_heads_split(z->cs, dy, a->dsmall, B, T, C, NH));
    const long long sh = (long long)T * hs, st = (long long)T * T;
    TRY(gemm(z, 1, 0, T, T, hs, v, hs, sh, dy, hs, sh, a->scr_b, T, st, B * NH, 1.0f, 0.0f));
    TRY(gemm(z, 0, 1, hs, T, T, dy, hs, sh, a->att[l], T, st, dv, hs, sh, B * NH, 1.0f, 0.0f));
    CUDA_CK(k_softmax_causal_bwd(z->cs, a->scr_h, a->scr_b, a->att[l], 1.0f / sqrtf((float)hs),
                                 B * NH, T));
    TRY(gemm(z, 0, 0, hs, T, T, k, hs, sh, a->scr_h, T, st, dq, hs, sh, B * NH, 1.0f, 0.0f));
    TRY(gemm(z, 0, 1, hs, T, T, q, hs, sh, a->scr_h, T, st, dk, hs, sh, B * NH, 1.0f, 0.0f));
    CUDA_CK(k_qkv_merge(z->cs, a->scr_a, a->scr_h2, dq, dk, dv, B, T, C, NH));
    TRY(linear_bwd(z, a->dsmall, d + o[QKVW], d + o[QKVB], a->scr_a, a->scr_h2, a->ln1[l],
                   w + o[QKVW], N, C, 3 * C));
    CUDA_CK(k_layernorm_bwd(z->cs, a->dres, d + o[LN1W], d + o[LN1B], a->dsmall, x, w + o[LN1W],
                            a->ln1_mean[l], a->ln1_rstd[l], N, C));
    return 0;
}

static int head_fwd(struct gpu_zero *z, const bf16 *nw, const bf16 *ew, int with_targets,
                    double *acc)
{
    struct gpu_acts *a = &z->a;
    const int N = z->B * z->T, C = z->cfg.C, V = z->cfg.V, Vp = z->Vp;
    CUDA_CK(k_layernorm_fwd(z->cs, a->lnf, a->lnf_mean, a->lnf_rstd, a->res3[z->cfg.L - 1],
                            nw + z->noff[0], nw + z->noff[1], N, C));
    /* tied head over the padded vocabulary: the logits of padding are 0, masked in the loss */
    CUDA_CK(cudaMemcpyAsync(z->head_w, ew + z->eoff[0], sizeof(bf16) * (size_t)V * C, cudaMemcpyDeviceToDevice,
                            z->cs));
    TRY(linear_fwd(z, a->logits, a->lnf, z->head_w, NULL, N, C, Vp));
    if (with_targets)
        CUDA_CK(k_crossentropy_fwd(z->cs, a->logits, a->losses, acc, z->d_tgt, N, V, Vp));
    return 0;
}

static int head_bwd(struct gpu_zero *z, float *dn, float *de, const bf16 *nw, const bf16 *ew,
                    float dloss)
{
    struct gpu_acts *a = &z->a;
    const int N = z->B * z->T, C = z->cfg.C, V = z->cfg.V, Vp = z->Vp;
    (void)ew; /* the head's weights are z->head_w, copied from ew in head_fwd */
    CUDA_CK(k_crossentropy_bwd(z->cs, a->dlogits, a->logits, z->d_tgt, dloss, N, V, Vp));
    /* d(lnf) over all Vp columns (the padding's are zero), d(wte) for its V real rows only */
    TRY(gemm(z, 0, 0, C, N, Vp, z->head_w, C, 0, a->dlogits, Vp, 0, a->dsmall, C, 0, 1, 1.0f, 0.0f));
    TRY(gemm(z, 0, 1, C, V, N, a->lnf, C, 0, a->dlogits, Vp, 0, de + z->eoff[0], C, 0, 1, 1.0f, 1.0f));
    CUDA_CK(cudaMemsetAsync(a->dres, 0, sizeof(float) * (size_t)N * C, z->cs));
    CUDA_CK(k_layernorm_bwd(z->cs, a->dres, dn + z->noff[0], dn + z->noff[1], a->dsmall,
                            a->res3[z->cfg.L - 1], nw + z->noff[0], a->lnf_mean, a->lnf_rstd, N,
                            C));
    return 0;
}

/* ---- ZeRO-3 traffic on ns ---- */

#define FINALIZE_MS 10000 /* a clean finish of the communicator gets this long at most */

static double mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

/* Between polls: spin briefly, then nap. */
static void poll_nap(double t0)
{
    if (mono_ms() - t0 < 2)
        return;
    const struct timespec ts = {0, 50 * 1000};
    nanosleep(&ts, NULL);
}

static int abort_requested(const struct gpu_zero *z) { return __atomic_load_n(&z->abort_req, __ATOMIC_ACQUIRE); }

/* The owner ends the communicator: NCCL's way out of a broken one (its
 * collectives end, the handle is freed). */
static void comm_abort_now(struct gpu_zero *z)
{
#ifdef MUSTER_HAVE_NCCL
    if (z->have_nc && !z->comm_gone)
        ncclCommAbort(z->nc);
#endif
    z->comm_gone = 1;
}

static int alive(struct gpu_zero *z)
{
    if (abort_requested(z) || z->comm_gone) {
        comm_abort_now(z);
        snprintf(z->err, sizeof(z->err), "the communicator was aborted (ncclCommAbort)");
        return -ECANCELED;
    }
    return 0;
}

#ifdef MUSTER_HAVE_NCCL
/* An NCCL failure: the generation's; the communicator is aborted. */
static int nccl_fail(struct gpu_zero *z, const char *call, ncclResult_t r, const char *file, int line)
{
    z->nccl_failed = 1;
    gpu_report_nccl(z->err, sizeof(z->err), call, r, file, line);
    comm_abort_now(z);
    return GPU_E_NCCL;
}

/* Until the communicator's last call is no longer ncclInProgress, watching
 * the formation's cancellation, the abort flag and the deadline. */
static int nccl_poll(struct gpu_zero *z, const char *call, int timeout_ms, const char *file, int line)
{
    const double t0 = mono_ms();
    for (;;) {
        ncclResult_t st = ncclInProgress;
        ncclResult_t r = ncclCommGetAsyncError(z->nc, &st);
        if (r != ncclSuccess)
            st = r;
        if (st == ncclSuccess)
            return 0;
        if (st != ncclInProgress)
            return nccl_fail(z, call, st, file, line);
        if (z->cancel && __atomic_load_n(z->cancel, __ATOMIC_ACQUIRE)) {
            comm_abort_now(z);
            snprintf(z->err, sizeof(z->err), "%s: cancelled (a newer generation came)", call);
            return -ECANCELED;
        }
        TRY(alive(z));
        if (mono_ms() - t0 > timeout_ms) {
            comm_abort_now(z);
            z->nccl_failed = 1;
            snprintf(z->err, sizeof(z->err), "%s: not done after %d ms (a peer is gone or never came); "
                     "the communicator was aborted", call, timeout_ms);
            return -ETIMEDOUT;
        }
        poll_nap(t0);
    }
}

/* A call on the non-blocking communicator: done, still in progress (polled), or failed. */
static int nccl_settle(struct gpu_zero *z, ncclResult_t r, const char *call, const char *file, int line)
{
    if (r == ncclInProgress)
        return nccl_poll(z, call, z->timeout_ms, file, line);
    return r == ncclSuccess ? 0 : nccl_fail(z, call, r, file, line);
}
#define NCCL_Q(call) TRY(nccl_settle(z, (call), #call, __FILE__, __LINE__))
#endif

/* A host wait for event ev, as host code must wait on NCCL work: its
 * query, the communicator's asynchronous error, the abort flag and the
 * deadline, in a loop. A CUDA error of this rank is reported as such
 * before anything else; the deadline applies once NCCL work may be queued. */
static int wait_event(struct gpu_zero *z, cudaEvent_t ev, const char *what)
{
    const double t0 = mono_ms();
    for (;;) {
        cudaError_t e = cudaEventQuery(ev);
        if (e != cudaSuccess && e != cudaErrorNotReady)
            return gpu_report_cuda(z->err, sizeof(z->err), what, e, __FILE__, __LINE__);
        if (e == cudaErrorNotReady)
            cudaGetLastError(); /* not an error */
#ifdef MUSTER_HAVE_NCCL
        if (z->have_nc && !z->comm_gone) {
            ncclResult_t ae = ncclSuccess;
            ncclResult_t r = ncclCommGetAsyncError(z->nc, &ae);
            if (r != ncclSuccess)
                ae = r;
            if (ae != ncclSuccess && ae != ncclInProgress)
                return nccl_fail(z, "a collective (ncclCommGetAsyncError)", ae, __FILE__, __LINE__);
        }
#endif
        TRY(alive(z)); /* also when done: an aborted collective completes with garbage */
        if (e == cudaSuccess)
            return 0;
        if (z->have_nc && mono_ms() - t0 > z->timeout_ms) {
            comm_abort_now(z);
            z->nccl_failed = 1;
            snprintf(z->err, sizeof(z->err), "%s: not done after %d ms: a peer is gone or stuck in a "
                     "collective (the communicator was aborted)", what, z->timeout_ms);
            return -ETIMEDOUT;
        }
        poll_nap(t0);
    }
}

/* cs waits for the snapshot copy under way before the state changes. */
static int snapshot_done(struct gpu_zero *z)
{
    if (z->snap_pending)
        CUDA_CK(cudaStreamWaitEvent(z->cs, z->ev_snap, 0));
    z->snap_pending = 0;
    return 0;
}

/* Unit u into slot s, after cs is done with what the slot held. */
static int gather(struct gpu_zero *z, int u, int s)
{
    if (z->holds[s] == u)
        return 0;
    TRY(alive(z));
    CUDA_CK(cudaStreamWaitEvent(z->ns, z->ev_free[s], 0));
#ifdef MUSTER_HAVE_NCCL
    if (z->have_nc)
        NCCL_Q(ncclAllGather(z->pbf + z->off[u], z->slot[s], z->shard[u] * sizeof(bf16), ncclUint8,
                              z->nc, z->ns));
    else
#endif
        CUDA_CK(cudaMemcpyAsync(z->slot[s], z->pbf + z->off[u], z->shard[u] * sizeof(bf16),
                                cudaMemcpyDeviceToDevice, z->ns));
    CUDA_CK(cudaEventRecord(z->ev_gath[s], z->ns));
    z->holds[s] = u;
    return 0;
}

/* Adds the oldest measured stall, which must be complete, to stall_ms. */
static int stall_collect(struct gpu_zero *z)
{
    cudaEvent_t *e = z->stall[z->stall_first];
    float ms = 0;
    CUDA_CK(cudaEventElapsedTime(&ms, e[0], e[1]));
    z->stall_ms += ms;
    z->stall_first = (z->stall_first + 1) % NSTALL;
    z->stall_n--;
    return 0;
}

/* cs waits for event ev of ns. The time cs spends blocked there (the
 * communication the compute could not hide) is measured between two
 * timing events on cs: gpu_zero_comm_wait_s() reports it. The host never
 * waits for a measurement: with NSTALL of them in flight (about 25
 * micro-steps of gpt2-124m) and the oldest not done, this wait goes
 * unmeasured and comm_frac is a lower bound. */
static int cs_wait(struct gpu_zero *z, cudaEvent_t ev)
{
    if (z->stall_n == NSTALL) {
        if (cudaEventQuery(z->stall[z->stall_first][1]) != cudaSuccess) {
            cudaGetLastError(); /* cudaErrorNotReady is not an error */
            CUDA_CK(cudaStreamWaitEvent(z->cs, ev, 0));
            return 0;
        }
        TRY(stall_collect(z));
    }
    cudaEvent_t *e = z->stall[(z->stall_first + z->stall_n) % NSTALL];
    CUDA_CK(cudaEventRecord(e[0], z->cs));
    CUDA_CK(cudaStreamWaitEvent(z->cs, ev, 0));
    CUDA_CK(cudaEventRecord(e[1], z->cs));
    z->stall_n++;
    return 0;
}

/* cs: wait for slot s's gather; after the compute, let ns reuse the slot. */
static int use(struct gpu_zero *z, int s) { return cs_wait(z, z->ev_gath[s]); }

static int release(struct gpu_zero *z, int s)
{
    CUDA_CK(cudaEventRecord(z->ev_free[s], z->cs));
    return 0;
}

/* cs: gradient buffer s, zeroed for unit u once its last reduction is done. */
static int grad_begin(struct gpu_zero *z, int u, int s)
{
    TRY(cs_wait(z, z->ev_gfree[s]));
    CUDA_CK(cudaMemsetAsync(z->gbuf[s], 0, sizeof(float) * (size_t)z->world * z->shard[u], z->cs));
    return 0;
}

/* ns: unit u's full gradient in buffer s, averaged over ranks, added into
 * this rank's gradient shard. */
static int reduce(struct gpu_zero *z, int u, int s)
{
    TRY(alive(z));
    CUDA_CK(cudaEventRecord(z->ev_gready[s], z->cs));
    CUDA_CK(cudaStreamWaitEvent(z->ns, z->ev_gready[s], 0));
    const float *src = z->gbuf[s];
#ifdef MUSTER_HAVE_NCCL
    if (z->have_nc) {
        NCCL_Q(ncclReduceScatter(z->gbuf[s], z->rsbuf[s], z->shard[u], ncclFloat, ncclAvg, z->nc,
                                  z->ns));
        src = z->rsbuf[s];
    }
#endif
    CUDA_CK(k_add(z->ns, z->g + z->off[u], src, z->shard[u]));
    CUDA_CK(cudaEventRecord(z->ev_gfree[s], z->ns));
    return 0;
}

/* cs waits for everything queued on ns so far. */
static int join_ns(struct gpu_zero *z)
{
    CUDA_CK(cudaEventRecord(z->ev_ns, z->ns));
    TRY(cs_wait(z, z->ev_ns));
    return 0;
}

/* The host waits for everything queued on cs (polling). */
static int sync_cs(struct gpu_zero *z)
{
    CUDA_CK(cudaEventRecord(z->ev_host, z->cs));
    TRY(wait_event(z, z->ev_host, "the compute stream (cudaEventQuery)"));
    sample_peak(z);
    return 0;
}

/* ---- public ---- */

extern "C" int gpu_device_count(char *why, size_t whylen)
{
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        if (why)
            snprintf(why, whylen, "cudaGetDeviceCount: %s (%s)", cudaGetErrorName(e),
                     cudaGetErrorString(e));
        return 0;
    }
    if (n == 0 && why)
        snprintf(why, whylen, "no CUDA device visible (CUDA_VISIBLE_DEVICES=%s)",
                 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "(unset)");
    return n;
}

extern "C" int gpu_device_name(char *out, size_t len)
{
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) {
        snprintf(out, len, "unknown");
        return GPU_E_CUDA;
    }
    snprintf(out, len, "%s", prop.name);
    return 0;
}

extern "C" int gpu_unique_id(uint8_t id[GPU_ID_BYTES])
{
#ifdef MUSTER_HAVE_NCCL
    ncclUniqueId u;
    if (ncclGetUniqueId(&u) != ncclSuccess)
        return GPU_E_NCCL;
    memcpy(id, u.internal, GPU_ID_BYTES);
    return 0;
#else
    (void)id;
    return -ENOTSUP;
#endif
}

#ifdef MUSTER_HAVE_NCCL
/* Joins the communicator of id, non-blocking, polled against the
 * generation's cancellation, the abort flag and the deadline: a peer that
 * dies while it forms never completes it. */
static int comm_form(struct gpu_zero *z, const uint8_t *id)
{
    ncclUniqueId u;
    memcpy(u.internal, id, GPU_ID_BYTES);
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    z->nc = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&z->nc, z->world, u, z->rank, &cfg);
    if (r != ncclSuccess && r != ncclInProgress) {
        if (z->nc)
            ncclCommAbort(z->nc);
        z->nccl_failed = 1;
        return gpu_report_nccl(z->err, sizeof(z->err), "ncclCommInitRankConfig", r, __FILE__, __LINE__);
    }
    z->have_nc = 1;
    z->comm_gone = 0;
    int rc = r == ncclInProgress ? nccl_poll(z, "ncclCommInitRankConfig", z->timeout_ms, __FILE__, __LINE__) : 0;
    if (rc)
        z->have_nc = 0; /* aborted */
    return rc;
}
#endif

static int setup(struct gpu_zero *z, const uint8_t *id)
{
    const struct gpt_config *cfg = &z->cfg;
    CUDA_CK(cudaSetDevice(0));
    size_t fr;
    CUDA_CK(cudaMemGetInfo(&fr, &z->device_total));
    CUDA_CK(cudaStreamCreateWithFlags(&z->cs, cudaStreamNonBlocking));
    CUDA_CK(cudaStreamCreateWithFlags(&z->ns, cudaStreamNonBlocking));
    /* created after cs and ns: cuemu numbers streams in creation order (CUEMU_EAGER=2 is ns) */
    CUDA_CK(cudaStreamCreateWithFlags(&z->xs, cudaStreamNonBlocking));
    cudaEvent_t *evs[] = {&z->ev_cast, &z->ev_ns, &z->ev_cs, &z->ev_upload, &z->ev_updated, &z->ev_snap,
                          &z->ev_host};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        CUDA_CK(cudaEventCreateWithFlags(evs[i], cudaEventDisableTiming));
    for (int s = 0; s < NSLOT; s++) {
        CUDA_CK(cudaEventCreateWithFlags(&z->ev_gath[s], cudaEventDisableTiming));
        CUDA_CK(cudaEventCreateWithFlags(&z->ev_free[s], cudaEventDisableTiming));
        CUDA_CK(cudaEventCreateWithFlags(&z->ev_gready[s], cudaEventDisableTiming));
        CUDA_CK(cudaEventCreateWithFlags(&z->ev_gfree[s], cudaEventDisableTiming));
        z->holds[s] = -1;
    }
    for (int i = 0; i < NSTALL; i++)
        for (int k = 0; k < 2; k++)
            CUDA_CK(cudaEventCreate(&z->stall[i][k]));
    CUBLAS_CK(cublasCreate(&z->blas));
    CUBLAS_CK(cublasSetStream(z->blas, z->cs));
    TRY(gpu_alloc(z, &z->workspace, BLAS_WORKSPACE, "cuBLAS workspace"));
    CUBLAS_CK(cublasSetWorkspace(z->blas, z->workspace, BLAS_WORKSPACE));

    /* shards and the decay mask */
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    for (int u = 0; u < z->lay.nunits; u++) {
        z->shard[u] = shard_of(z->lay.numel[u], z->world);
        z->off[u] = z->total;
        z->total += z->shard[u];
        if (u > 0 && z->shard[u] > z->max_shard)
            z->max_shard = z->shard[u];
    }
    int nt = gpt_unit_tensors(cfg, 1, t);
    for (int i = 0; i < nt && i < 12; i++)
        z->toff[i] = t[i].offset;
    gpt_unit_tensors(cfg, 0, t);
    z->eoff[0] = t[0].offset;
    z->eoff[1] = t[1].offset;
    gpt_unit_tensors(cfg, cfg->L + 1, t);
    z->noff[0] = t[0].offset;
    z->noff[1] = t[1].offset;

    const size_t tf = z->total * sizeof(float);
    TRY(gpu_alloc(z, (void **)&z->p, tf, "fp32 weight shard"));
    TRY(gpu_alloc(z, (void **)&z->m, tf, "AdamW first moment shard"));
    TRY(gpu_alloc(z, (void **)&z->v, tf, "AdamW second moment shard"));
    TRY(gpu_alloc(z, (void **)&z->g, tf, "gradient shard"));
    TRY(gpu_alloc(z, (void **)&z->pbf, z->total * sizeof(bf16), "bf16 weight shard"));
    TRY(gpu_alloc(z, (void **)&z->decay, z->total, "weight-decay mask"));
    z->Vp = (int)vocab_padded(cfg->V);
    const size_t head_rows = (size_t)z->Vp * cfg->C;
    TRY(gpu_alloc(z, (void **)&z->head_w, head_rows * sizeof(bf16), "padded head weights"));
    /* rows V..Vp-1 stay zero; rows 0..V-1 are copied from each gathered embedding */
    CUDA_CK(cudaMemsetAsync(z->head_w, 0, head_rows * sizeof(bf16), z->cs));
    /* On cs, not the legacy stream: cudaMemset is asynchronous, and the
     * legacy stream does not order work on the non-blocking cs and ns. */
    CUDA_CK(cudaMemsetAsync(z->p, 0, tf, z->cs));
    CUDA_CK(cudaMemsetAsync(z->m, 0, tf, z->cs));
    CUDA_CK(cudaMemsetAsync(z->v, 0, tf, z->cs));
    CUDA_CK(cudaMemsetAsync(z->g, 0, tf, z->cs));
    unsigned char *mask = (unsigned char *)calloc(z->total, 1);
    if (!mask) {
        snprintf(z->err, sizeof(z->err), "out of host memory for the decay mask");
        return -ENOMEM;
    }
    for (int u = 0; u < z->lay.nunits; u++) {
        const size_t lo = (size_t)z->rank * z->shard[u];
        nt = gpt_unit_tensors(cfg, u, t);
        for (int i = 0; i < nt; i++) {
            size_t a = t[i].offset > lo ? t[i].offset : lo;
            size_t b = t[i].offset + t[i].numel < lo + z->shard[u] ? t[i].offset + t[i].numel
                                                                   : lo + z->shard[u];
            for (size_t j = a; j < b && t[i].decay; j++)
                mask[z->off[u] + (j - lo)] = 1;
        }
    }
    cudaError_t e = cudaMemcpyAsync(z->decay, mask, z->total, cudaMemcpyHostToDevice, z->cs);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(z->cs); /* before the mask is freed */
    free(mask);
    CUDA_CK(e);

    for (int s = 0; s < NSLOT; s++) {
        size_t S = s == EMBED ? z->shard[0] : z->max_shard;
        TRY(gpu_alloc(z, (void **)&z->slot[s], (size_t)z->world * S * sizeof(bf16),
                      s == EMBED ? "gathered embedding (bf16)" : "gathered unit slot (bf16)"));
        TRY(gpu_alloc(z, (void **)&z->gbuf[s], (size_t)z->world * S * sizeof(float),
                      s == EMBED ? "embedding gradient (fp32)" : "unit gradient (fp32)"));
        if (id) /* NCCL reduce-scatters even at world 1 */
            TRY(gpu_alloc(z, (void **)&z->rsbuf[s], S * sizeof(float), "reduce-scatter result"));
    }
    const size_t ab = carve_acts(&z->a, NULL, cfg, z->maxB, z->maxT);
    TRY(gpu_alloc(z, &z->acts_mem, ab, "activations"));
    carve_acts(&z->a, (char *)z->acts_mem, cfg, z->maxB, z->maxT);
    const size_t nb = sizeof(int) * (size_t)z->maxB * z->maxT;
    TRY(gpu_alloc(z, (void **)&z->d_inp, nb, "input tokens"));
    TRY(gpu_alloc(z, (void **)&z->d_tgt, nb, "target tokens"));
    TRY(gpu_alloc(z, (void **)&z->d_stats, 4 * sizeof(double), "loss and norm"));
    CUDA_CK(cudaMemsetAsync(z->d_stats, 0, 4 * sizeof(double), z->cs));
    CUDA_CK(cudaEventRecord(z->ev_updated, z->cs));
    CUDA_CK(cudaStreamSynchronize(z->cs));
    CUDA_CK(cudaMallocHost((void **)&z->h_inp, nb));
    CUDA_CK(cudaMallocHost((void **)&z->h_tgt, nb));
    CUDA_CK(cudaMallocHost((void **)&z->h_stats, 4 * sizeof(double)));
    z->stale = 1;

    if (id) {
#ifdef MUSTER_HAVE_NCCL
        TRY(comm_form(z, id));
#else
        snprintf(z->err, sizeof(z->err), "this muster-train was built without NCCL "
                                         "(nccl.h not found at build time): world > 1 needs it");
        return -ENOTSUP;
#endif
    }
    sample_peak(z);
    return 0;
}

extern "C" int gpu_zero_init(struct gpu_zero **out, const struct gpt_config *cfg, int maxB, int T,
                             int rank, int world, const uint8_t *id, const int *cancel, char *err,
                             size_t errlen)
{
    *out = NULL;
    if (maxB < 1 || T < 1 || T > cfg->T || world < 1 || rank < 0 || rank >= world ||
        (world > 1 && !id) || cfg->L > GPT_MAX_LAYERS) {
        snprintf(err, errlen, "gpu_zero_init: bad shape (micro_batch %d, seq_len %d, rank %d of %d%s)",
                 maxB, T, rank, world, world > 1 && !id ? ", no NCCL id" : "");
        return -EINVAL;
    }
    struct gpu_zero *z = (struct gpu_zero *)calloc(1, sizeof(*z));
    if (!z) {
        snprintf(err, errlen, "out of host memory");
        return -ENOMEM;
    }
    z->cfg = *cfg;
    gpt_layout_init(&z->lay, cfg);
    z->rank = rank;
    z->world = world;
    z->maxB = maxB;
    z->maxT = T;
    z->cancel = cancel;
    z->timeout_ms = GPU_WAIT_TIMEOUT_MS;
    int rc = setup(z, id);
    z->cancel = NULL; /* the caller's, for the formation only */
    if (rc) {
        snprintf(err, errlen, "%s", z->err);
        gpu_zero_free(z);
        return rc;
    }
    *out = z;
    return 0;
}

extern "C" void gpu_zero_free(struct gpu_zero *z)
{
    if (!z)
        return;
    gpu_zero_release_comm(z); /* then every stream can run out */
    if (z->blas) /* before its workspace goes */
        cublasDestroy(z->blas);
    void *bufs[] = {z->p, z->m, z->v, z->g, z->pbf, z->decay, z->head_w, z->acts_mem, z->d_inp, z->d_tgt,
                    z->d_stats, z->workspace, z->slot[0], z->slot[1], z->slot[2], z->gbuf[0],
                    z->gbuf[1], z->gbuf[2], z->rsbuf[0], z->rsbuf[1], z->rsbuf[2]};
    for (size_t i = 0; i < sizeof(bufs) / sizeof(bufs[0]); i++)
        cudaFree(bufs[i]);
    cudaFreeHost(z->h_inp);
    cudaFreeHost(z->h_tgt);
    cudaFreeHost(z->h_stats);
    cudaFreeHost(z->snap[0]);
    cudaFreeHost(z->snap[1]);
    cudaEvent_t evs[] = {z->ev_cast, z->ev_ns, z->ev_cs, z->ev_upload, z->ev_updated, z->ev_snap, z->ev_host};
    for (size_t i = 0; i < sizeof(evs) / sizeof(evs[0]); i++)
        if (evs[i])
            cudaEventDestroy(evs[i]);
    for (int s = 0; s < NSLOT; s++) {
        cudaEvent_t e4[] = {z->ev_gath[s], z->ev_free[s], z->ev_gready[s], z->ev_gfree[s]};
        for (int i = 0; i < 4; i++)
            if (e4[i])
                cudaEventDestroy(e4[i]);
    }
    for (int i = 0; i < NSTALL; i++)
        for (int k = 0; k < 2; k++)
            if (z->stall[i][k])
                cudaEventDestroy(z->stall[i][k]);
    if (z->cs)
        cudaStreamDestroy(z->cs);
    if (z->ns)
        cudaStreamDestroy(z->ns);
    if (z->xs)
        cudaStreamDestroy(z->xs);
    free(z);
}

extern "C" const char *gpu_zero_error(const struct gpu_zero *z) { return z->err; }

extern "C" int gpu_zero_failed(const struct gpu_zero *z)
{
    return abort_requested(z) || z->comm_gone || z->nccl_failed;
}

#ifdef MUSTER_HAVE_NCCL
/* A clean end: ncclCommFinalize completes with every rank's, then the
 * destroy is local. 0, or the communicator was aborted instead. */
static int comm_finish(struct gpu_zero *z)
{
    ncclResult_t r = ncclCommFinalize(z->nc);
    const int ms = z->timeout_ms < FINALIZE_MS ? z->timeout_ms : FINALIZE_MS;
    int rc = r == ncclInProgress ? nccl_poll(z, "ncclCommFinalize", ms, __FILE__, __LINE__)
             : r == ncclSuccess ? 0 : nccl_fail(z, "ncclCommFinalize", r, __FILE__, __LINE__);
    if (rc == 0)
        ncclCommDestroy(z->nc);
    return rc;
}
#endif

extern "C" void gpu_zero_release_comm(struct gpu_zero *z)
{
#ifdef MUSTER_HAVE_NCCL
    /* Destroy only after a clean finalize (the generation ended well and
     * this rank's work is done); abort otherwise: a destroy would wait for
     * peers that may be gone. */
    if (z->have_nc && !z->comm_gone) {
        int clean = !gpu_zero_failed(z) && z->cs && z->ns && join_ns(z) == 0 && sync_cs(z) == 0;
        if (!clean || comm_finish(z) != 0)
            comm_abort_now(z);
    }
#endif
    /* Now the queued work can run out (an aborted collective ends, leaving
     * garbage: nothing of it is kept; the state is the last AdamW's). */
    cudaStream_t ss[] = {z->ns, z->cs, z->xs};
    for (int i = 0; i < 3; i++)
        if (ss[i])
            cudaStreamSynchronize(ss[i]);
    cudaGetLastError();
    z->have_nc = 0;
    z->comm_gone = 1; /* no communicator until set_comm joins one */
    z->stall_first = z->stall_n = 0; /* complete, after the syncs; the broken step is not reported */
    z->stall_ms = 0;
    z->stale = 1; /* the slots may hold what an aborted gather left */
    z->snap_pending = 0;
}

extern "C" int gpu_zero_set_comm(struct gpu_zero *z, const uint8_t *id, const int *cancel)
{
    gpu_zero_release_comm(z);
#ifdef MUSTER_HAVE_NCCL
    /* a new generation: what aborted the old one is past (the caller
     * registers the new abort hook after this returns) */
    __atomic_store_n(&z->abort_req, 0, __ATOMIC_RELEASE);
    z->nccl_failed = 0;
    z->comm_gone = 0;
    z->cancel = cancel;
    int rc = comm_form(z, id);
    z->cancel = NULL;
    return rc;
#else
    (void)id;
    (void)cancel;
    snprintf(z->err, sizeof(z->err), "this muster-train was built without NCCL: world > 1 needs it");
    return -ENOTSUP;
#endif
}

extern "C" void gpu_zero_abort(struct gpu_zero *z)
{
    if (z) /* the owner aborts the communicator at its next call or poll */
        __atomic_store_n(&z->abort_req, 1, __ATOMIC_RELEASE);
}

extern "C" void gpu_zero_set_timeout(struct gpu_zero *z, int timeout_ms)
{
    z->timeout_ms = timeout_ms > 0 ? timeout_ms : GPU_WAIT_TIMEOUT_MS;
}

extern "C" int gpu_zero_init_weights(struct gpu_zero *z, uint64_t seed)
{
    float *h = (float *)calloc(z->total, sizeof(float));
    if (!h) {
        snprintf(z->err, sizeof(z->err), "out of host memory for the initial weights");
        return -ENOMEM;
    }
    for (int u = 0; u < z->lay.nunits; u++) {
        size_t lo = (size_t)z->rank * z->shard[u];
        size_t n = lo < z->lay.numel[u] ? z->lay.numel[u] - lo : 0;
        if (n > z->shard[u])
            n = z->shard[u];
        if (n)
            gpt_init_range(&z->cfg, seed, u, lo, n, h + z->off[u]);
    }
    int rc = gpu_zero_write_state(z, h, NULL, NULL);
    free(h);
    return rc;
}

extern "C" int gpu_zero_load_params(struct gpu_zero *z, const float *full)
{
    float *h = (float *)calloc(z->total, sizeof(float));
    if (!h) {
        snprintf(z->err, sizeof(z->err), "out of host memory for the weights");
        return -ENOMEM;
    }
    for (int u = 0; u < z->lay.nunits; u++) {
        size_t lo = (size_t)z->rank * z->shard[u];
        for (size_t j = 0; j < z->shard[u] && lo + j < z->lay.numel[u]; j++)
            h[z->off[u] + j] = full[z->lay.offset[u] + lo + j];
    }
    int rc = gpu_zero_write_state(z, h, NULL, NULL);
    free(h);
    return rc;
}

extern "C" int gpu_zero_read_grads(struct gpu_zero *z, float *full)
{
    if (z->world != 1) {
        snprintf(z->err, sizeof(z->err), "gpu_zero_read_grads: world 1 only");
        return -EINVAL;
    }
    TRY(join_ns(z));
    TRY(sync_cs(z));
    for (int u = 0; u < z->lay.nunits; u++)
        CUDA_CK(cudaMemcpy(full + z->lay.offset[u], z->g + z->off[u],
                           z->lay.numel[u] * sizeof(float), cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int gpu_zero_zero_grad(struct gpu_zero *z)
{
    /* after the last AdamW (cs) has read the gradients */
    CUDA_CK(cudaEventRecord(z->ev_cs, z->cs));
    CUDA_CK(cudaStreamWaitEvent(z->ns, z->ev_cs, 0));
    CUDA_CK(cudaMemsetAsync(z->g, 0, z->total * sizeof(float), z->ns));
    CUDA_CK(cudaMemsetAsync(z->d_stats, 0, 2 * sizeof(double), z->cs));
    return 0;
}

extern "C" int gpu_zero_forward(struct gpu_zero *z, const int *inputs, const int *targets, int B,
                                int T, double *loss)
{
    TRY(alive(z));
    if (B < 1 || B > z->maxB || T < 1 || T > z->maxT) {
        snprintf(z->err, sizeof(z->err), "batch (%d, %d) beyond the allocated (%d, %d)", B, T,
                 z->maxB, z->maxT);
        return -EINVAL;
    }
    const int L = z->cfg.L;
    z->B = B;
    z->T = T;
    /* the staging buffers are free once the previous upload is done */
    TRY(wait_event(z, z->ev_upload, "the staging buffers' last upload (cudaEventQuery)"));
    const size_t nb = sizeof(int) * (size_t)B * T;
    memcpy(z->h_inp, inputs, nb);
    CUDA_CK(cudaMemcpyAsync(z->d_inp, z->h_inp, nb, cudaMemcpyHostToDevice, z->cs));
    if (targets) {
        memcpy(z->h_tgt, targets, nb);
        CUDA_CK(cudaMemcpyAsync(z->d_tgt, z->h_tgt, nb, cudaMemcpyHostToDevice, z->cs));
    }
    CUDA_CK(cudaEventRecord(z->ev_upload, z->cs));
    if (z->stale) {
        CUDA_CK(k_cast_bf16(z->cs, z->pbf, z->p, z->total));
        CUDA_CK(cudaEventRecord(z->ev_cast, z->cs));
        CUDA_CK(cudaStreamWaitEvent(z->ns, z->ev_cast, 0));
        for (int s = 0; s < NSLOT; s++)
            z->holds[s] = -1;
        z->stale = 0;
    }
    double *acc = loss ? z->d_stats + 2 : z->d_stats;
    if (loss)
        CUDA_CK(cudaMemsetAsync(acc, 0, sizeof(double), z->cs));

    TRY(gather(z, 0, EMBED));
    TRY(gather(z, 1, 0));
    TRY(use(z, EMBED));
    bf16 *ew = z->slot[EMBED];
    CUDA_CK(k_encoder_fwd(z->cs, z->a.encoded, z->d_inp, ew + z->eoff[0], ew + z->eoff[1], B, T,
                          z->cfg.C));
    for (int l = 0; l < L; l++) {
        const int s = l % 2;
        TRY(gather(z, l + 2, 1 - s)); /* the next block, or the final norm */
        TRY(use(z, s));
        TRY(block_fwd(z, l, z->slot[s]));
        TRY(release(z, s));
    }
    const int sn = L % 2;
    TRY(use(z, sn));
    TRY(head_fwd(z, z->slot[sn], ew, targets != NULL, acc));
    TRY(release(z, sn));
    TRY(release(z, EMBED));
    if (loss) {
        CUDA_CK(cudaMemcpyAsync(z->h_stats + 2, acc, sizeof(double), cudaMemcpyDeviceToHost, z->cs));
        TRY(sync_cs(z));
        *loss = z->h_stats[2];
    }
    return 0;
}

extern "C" int gpu_zero_backward(struct gpu_zero *z, float scale)
{
    TRY(alive(z));
    const int L = z->cfg.L;
    const float dloss = scale / (float)(z->B * z->T);
    bf16 *ew = z->slot[EMBED];
    TRY(grad_begin(z, 0, EMBED));
    const int sn = L % 2;
    TRY(gather(z, L + 1, sn));
    TRY(gather(z, 0, EMBED));
    TRY(use(z, sn));
    TRY(use(z, EMBED));
    TRY(grad_begin(z, L + 1, sn));
    TRY(head_bwd(z, z->gbuf[sn], z->gbuf[EMBED], z->slot[sn], ew, dloss));
    TRY(reduce(z, L + 1, sn));
    TRY(release(z, sn));
    for (int l = L - 1; l >= 0; l--) {
        const int s = l % 2;
        TRY(gather(z, l + 1, s));
        if (l > 0)
            TRY(gather(z, l, 1 - s)); /* prefetch the block below */
        TRY(use(z, s));
        TRY(grad_begin(z, l + 1, s));
        TRY(block_bwd(z, l, z->gbuf[s], z->slot[s]));
        TRY(reduce(z, l + 1, s));
        TRY(release(z, s));
    }
    CUDA_CK(k_encoder_bwd(z->cs, z->gbuf[EMBED] + z->eoff[0], z->gbuf[EMBED] + z->eoff[1],
                          z->a.dres, z->d_inp, z->B, z->T, z->cfg.C));
    TRY(reduce(z, 0, EMBED));
    TRY(release(z, EMBED));
    return 0;
}

extern "C" int gpu_zero_step_stats(struct gpu_zero *z, double *loss_sum, double *norm)
{
    TRY(alive(z));
    TRY(join_ns(z));
    CUDA_CK(k_sumsq(z->cs, z->d_stats + 1, z->g, z->total));
#ifdef MUSTER_HAVE_NCCL
    if (z->have_nc) {
        CUDA_CK(cudaEventRecord(z->ev_cs, z->cs));
        CUDA_CK(cudaStreamWaitEvent(z->ns, z->ev_cs, 0));
        NCCL_Q(ncclAllReduce(z->d_stats, z->d_stats, 2, ncclDouble, ncclSum, z->nc, z->ns));
        TRY(join_ns(z));
    }
#endif
    CUDA_CK(cudaMemcpyAsync(z->h_stats, z->d_stats, 2 * sizeof(double), cudaMemcpyDeviceToHost,
                            z->cs));
    TRY(sync_cs(z));
    while (z->stall_n)
        TRY(stall_collect(z)); /* all complete: cs is synchronised */
    *loss_sum = z->h_stats[0];
    *norm = sqrt(z->h_stats[1]);
    return 0;
}

extern "C" int gpu_zero_sum(struct gpu_zero *z, double *x)
{
    TRY(alive(z));
#ifdef MUSTER_HAVE_NCCL
    if (z->have_nc) {
        z->h_stats[3] = *x;
        TRY(join_ns(z));
        CUDA_CK(cudaMemcpyAsync(z->d_stats + 3, z->h_stats + 3, sizeof(double),
                                cudaMemcpyHostToDevice, z->cs));
        CUDA_CK(cudaEventRecord(z->ev_cs, z->cs));
        CUDA_CK(cudaStreamWaitEvent(z->ns, z->ev_cs, 0));
        NCCL_Q(ncclAllReduce(z->d_stats + 3, z->d_stats + 3, 1, ncclDouble, ncclSum, z->nc, z->ns));
        TRY(join_ns(z));
        CUDA_CK(cudaMemcpyAsync(z->h_stats + 3, z->d_stats + 3, sizeof(double),
                                cudaMemcpyDeviceToHost, z->cs));
        TRY(sync_cs(z));
        *x = z->h_stats[3];
    }
#else
    (void)x; /* without NCCL there is no other rank: the sum is x */
#endif
    return 0;
}

extern "C" int gpu_zero_adamw(struct gpu_zero *z, const struct adamw *h, float gscale)
{
    TRY(alive(z));
    /* scalars in double as optim.c, rounded once */
    const double bc1 = 1.0 - pow(h->beta1, (double)h->t);
    const double bc2 = 1.0 - pow(h->beta2, (double)h->t);
    TRY(snapshot_done(z));
    CUDA_CK(k_adamw(z->cs, z->p, z->g, z->m, z->v, z->decay, z->total, h->beta1, h->beta2, h->eps,
                    (float)(h->lr / bc1), (float)sqrt(bc2), 1.0f - h->lr * h->weight_decay,
                    gscale));
    CUDA_CK(cudaEventRecord(z->ev_updated, z->cs));
    z->stale = 1;
    return 0;
}

extern "C" size_t gpu_zero_state_bytes(const struct gpu_zero *z)
{
    return z->total * (4 * sizeof(float) + 1 + sizeof(bf16));
}

extern "C" size_t gpu_zero_alloc_bytes(const struct gpu_zero *z) { return z->alloc_bytes; }

extern "C" size_t gpu_zero_peak_bytes(const struct gpu_zero *z) { return z->peak_bytes; }

extern "C" const char *gpu_strerror(int code)
{
    switch (code) {
    case GPU_E_CUDA: return "CUDA error";
    case GPU_E_CUBLAS: return "cuBLAS error";
    case GPU_E_NCCL: return "NCCL error";
    case -ENOMEM: return "out of GPU memory";
    case -ECANCELED: return "communicator aborted";
    case -ENOTSUP: return "not supported by this build";
    default: return code < 0 ? strerror(-code) : "success";
    }
}

/* ---- checkpoints: the shards on the host ---- */

extern "C" size_t gpu_zero_shard_layout(const struct gpu_zero *z, size_t shard[GPT_MAX_UNITS],
                                        size_t off[GPT_MAX_UNITS])
{
    for (int u = 0; u < z->lay.nunits; u++) {
        shard[u] = z->shard[u];
        off[u] = z->off[u];
    }
    return z->total;
}

extern "C" int gpu_zero_read_state(struct gpu_zero *z, float *params, float *m, float *v)
{
    if (gpu_zero_failed(z)) { /* a generation that broke: its queued work runs out; the state is its last AdamW's */
        gpu_zero_release_comm(z);
    } else { /* after the last AdamW (cs) and whatever ns still holds */
        TRY(join_ns(z));
        TRY(sync_cs(z));
    }
    const size_t bytes = z->total * sizeof(float);
    CUDA_CK(cudaMemcpy(params, z->p, bytes, cudaMemcpyDeviceToHost));
    if (m)
        CUDA_CK(cudaMemcpy(m, z->m, bytes, cudaMemcpyDeviceToHost));
    if (v)
        CUDA_CK(cudaMemcpy(v, z->v, bytes, cudaMemcpyDeviceToHost));
    return 0;
}

extern "C" int gpu_zero_write_state(struct gpu_zero *z, const float *params, const float *m,
                                    const float *v)
{
    TRY(alive(z));
    /* on cs, behind everything that reads or writes the shards (the legacy
     * stream's cudaMemcpy would not be ordered with cs and ns) */
    TRY(join_ns(z));
    TRY(snapshot_done(z));
    const size_t bytes = z->total * sizeof(float);
    if (params)
        CUDA_CK(cudaMemcpyAsync(z->p, params, bytes, cudaMemcpyHostToDevice, z->cs));
    if (m)
        CUDA_CK(cudaMemcpyAsync(z->m, m, bytes, cudaMemcpyHostToDevice, z->cs));
    if (v)
        CUDA_CK(cudaMemcpyAsync(z->v, v, bytes, cudaMemcpyHostToDevice, z->cs));
    CUDA_CK(cudaEventRecord(z->ev_updated, z->cs));
    TRY(sync_cs(z)); /* the host arrays may go once this returns */
    z->stale = 1;
    return 0;
}

/* ---- snapshots for peer replicas: the state in pinned host memory ---- */

extern "C" int gpu_zero_keep_snapshots(struct gpu_zero *z, float *blocks[2])
{
    for (int k = 0; k < 2; k++) {
        if (!z->snap[k] && cudaMallocHost((void **)&z->snap[k], 3 * z->total * sizeof(float)) != cudaSuccess) {
            cudaGetLastError();
            snprintf(z->err, sizeof(z->err), "cudaMallocHost: no pinned host memory for two snapshots of "
                     "this rank's state (%.1f MiB)", 2 * 3 * z->total * sizeof(float) / 1048576.0);
            return -ENOMEM;
        }
        blocks[k] = z->snap[k];
    }
    return 0;
}

extern "C" int gpu_zero_snapshot(struct gpu_zero *z, int k)
{
    if (k < 0 || k > 1 || !z->snap[k]) {
        snprintf(z->err, sizeof(z->err), "gpu_zero_snapshot: no snapshot block %d", k);
        return -EINVAL;
    }
    const size_t bytes = z->total * sizeof(float);
    float *h = z->snap[k];
    /* after the last update, beside this step's compute on cs */
    CUDA_CK(cudaStreamWaitEvent(z->xs, z->ev_updated, 0));
    CUDA_CK(cudaMemcpyAsync(h, z->p, bytes, cudaMemcpyDeviceToHost, z->xs));
    CUDA_CK(cudaMemcpyAsync(h + z->total, z->m, bytes, cudaMemcpyDeviceToHost, z->xs));
    CUDA_CK(cudaMemcpyAsync(h + 2 * z->total, z->v, bytes, cudaMemcpyDeviceToHost, z->xs));
    CUDA_CK(cudaEventRecord(z->ev_snap, z->xs));
    z->snap_pending = 1;
    return 0;
}

extern "C" int gpu_zero_snapshot_wait(struct gpu_zero *z)
{
    return wait_event(z, z->ev_snap, "the snapshot copy (cudaEventQuery)");
}

#ifdef MUSTER_HAVE_NCCL
/* gpu_zero_gather_u64 through d (n + world * n words on the device). */
static int gather_u64_via(struct gpu_zero *z, uint64_t *d, const uint64_t *mine, size_t n,
                          uint64_t *all)
{
    uint64_t *d_all = d + n;
    CUDA_CK(cudaMemcpyAsync(d, mine, n * sizeof(uint64_t), cudaMemcpyHostToDevice, z->cs));
    CUDA_CK(cudaEventRecord(z->ev_cs, z->cs));
    CUDA_CK(cudaStreamWaitEvent(z->ns, z->ev_cs, 0));
    NCCL_Q(ncclAllGather(d, d_all, n, ncclUint64, z->nc, z->ns));
    TRY(join_ns(z));
    CUDA_CK(cudaMemcpyAsync(all, d_all, (size_t)z->world * n * sizeof(uint64_t),
                            cudaMemcpyDeviceToHost, z->cs));
    return sync_cs(z);
}
#endif

extern "C" int gpu_zero_gather_u64(struct gpu_zero *z, const uint64_t *mine, size_t n,
                                   uint64_t *all)
{
    TRY(alive(z));
#ifdef MUSTER_HAVE_NCCL
    if (z->have_nc) {
        /* cudaMalloc and cudaFree may wait for the whole device: allocate
         * with no NCCL kernel of this rank in flight */
        TRY(join_ns(z));
        TRY(sync_cs(z));
        uint64_t *d = NULL;
        CUDA_CK(cudaMalloc((void **)&d, (size_t)(z->world + 1) * n * sizeof(uint64_t)));
        int rc = gather_u64_via(z, d, mine, n, all);
        cudaFree(d);
        return rc;
    }
#endif
    memcpy(all, mine, n * sizeof(uint64_t));
    return 0;
}

extern "C" double gpu_zero_comm_wait_s(struct gpu_zero *z)
{
    double s = z->stall_ms / 1e3;
    z->stall_ms = 0;
    return s;
}
