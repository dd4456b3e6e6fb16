#include "worker/train/model.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/train/layers.h"
#include "worker/train/rng.h"

/* Named views of one unit's flat floats (same order as gpt_unit_tensors). */
struct block_params {
    float *ln1w, *ln1b, *qkvw, *qkvb, *attprojw, *attprojb;
    float *ln2w, *ln2b, *fcw, *fcb, *fcprojw, *fcprojb;
};
struct norm_params {
    float *lnfw, *lnfb;
};

/* Offsets of one unit's tensors, in gpt_unit_tensors order. */
static void unit_offsets(const struct gpt_config *cfg, int unit, size_t *off)
{
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    int n = gpt_unit_tensors(cfg, unit, t);
    for (int i = 0; i < n; i++)
        off[i] = t[i].offset;
}

static struct block_params block_view(const struct gpt_config *cfg, const float *base)
{
    size_t o[GPT_MAX_UNIT_TENSORS];
    float *p = (float *)base;
    unit_offsets(cfg, 1, o);
    return (struct block_params){p + o[0], p + o[1], p + o[2],  p + o[3],
                                 p + o[4], p + o[5], p + o[6],  p + o[7],
                                 p + o[8], p + o[9], p + o[10], p + o[11]};
}

static struct norm_params norm_view(const struct gpt_config *cfg, const float *base)
{
    size_t o[GPT_MAX_UNIT_TENSORS];
    float *p = (float *)base;
    unit_offsets(cfg, cfg->L + 1, o);
    return (struct norm_params){p + o[0], p + o[1]};
}

float *gpt_unit_ptr(const struct gpt *m, float *flat, int unit)
{
    return flat + m->layout.offset[unit];
}

/* Carves the activation pointers out of one block of memory (or, with
 * mem == NULL, only counts the floats). */
static size_t carve_acts(struct gpt_acts *a, float *mem, const struct gpt_config *cfg, int B,
                         int T)
{
    const size_t N = (size_t)B * T, C = (size_t)cfg->C;
    size_t used = 0;
#define TAKE(ptr, count)                                                       \
    do {                                                                       \
        (ptr) = mem ? mem + used : NULL;                                       \
        used += (count);                                                       \
    } while (0)
    TAKE(a->encoded, N * C);
    for (int l = 0; l < cfg->L; l++) {
        TAKE(a->ln1[l], N * C);
        TAKE(a->ln1_mean[l], N);
        TAKE(a->ln1_rstd[l], N);
        TAKE(a->qkv[l], N * 3 * C);
        TAKE(a->atty[l], N * C);
        TAKE(a->att[l], (size_t)B * cfg->NH * T * T);
        TAKE(a->attproj[l], N * C);
        TAKE(a->res2[l], N * C);
        TAKE(a->ln2[l], N * C);
        TAKE(a->ln2_mean[l], N);
        TAKE(a->ln2_rstd[l], N);
        TAKE(a->fch[l], N * 4 * C);
        TAKE(a->fch_gelu[l], N * 4 * C);
        TAKE(a->fcproj[l], N * C);
        TAKE(a->res3[l], N * C);
    }
    TAKE(a->lnf, N * C);
    TAKE(a->lnf_mean, N);
    TAKE(a->lnf_rstd, N);
    TAKE(a->logits, N * cfg->V);
    TAKE(a->probs, N * cfg->V);
    TAKE(a->losses, N);
    TAKE(a->dres, N * C);
    TAKE(a->dsmall, N * C);
    TAKE(a->dbig, N * 4 * C);
    TAKE(a->datt, (size_t)B * cfg->NH * T * T);
#undef TAKE
    return used;
}

int gpt_create_shell(struct gpt *m, const struct gpt_config *cfg, int maxB, int maxT)
{
    memset(m, 0, sizeof(*m));
    char why[128];
    if (gpt_config_check(cfg, why, sizeof(why)) || maxB < 1 || maxT < 1 || maxT > cfg->T)
        return -EINVAL;
    m->cfg = *cfg;
    gpt_layout_init(&m->layout, cfg);
    m->maxB = maxB;
    m->maxT = maxT;
    size_t nacts = carve_acts(&m->acts, NULL, cfg, maxB, maxT);
    m->acts_mem = calloc(nacts, sizeof(float));
    m->inputs = calloc((size_t)maxB * maxT, sizeof(int));
    m->targets = calloc((size_t)maxB * maxT, sizeof(int));
    if (!m->acts_mem || !m->inputs || !m->targets) {
        gpt_destroy(m);
        return -ENOMEM;
    }
    carve_acts(&m->acts, m->acts_mem, cfg, maxB, maxT);
    return 0;
}

int gpt_create(struct gpt *m, const struct gpt_config *cfg, int maxB, int maxT)
{
    int rc = gpt_create_shell(m, cfg, maxB, maxT);
    if (rc)
        return rc;
    m->params = calloc(m->layout.total, sizeof(float));
    m->grads = calloc(m->layout.total, sizeof(float));
    if (!m->params || !m->grads) {
        gpt_destroy(m);
        return -ENOMEM;
    }
    return 0;
}

void gpt_destroy(struct gpt *m)
{
    free(m->params);
    free(m->grads);
    free(m->acts_mem);
    free(m->inputs);
    free(m->targets);
    memset(m, 0, sizeof(*m));
}

void gpt_init_range(const struct gpt_config *cfg, uint64_t seed, int unit, size_t lo,
                    size_t n, float *out)
{
    const double resid_std = 0.02 / sqrt(2.0 * cfg->L);
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    int nt = gpt_unit_tensors(cfg, unit, t);
    for (int i = 0; i < nt; i++) {
        /* the part of tensor i inside [lo, lo + n) */
        size_t a = t[i].offset > lo ? t[i].offset : lo;
        size_t b = t[i].offset + t[i].numel < lo + n ? t[i].offset + t[i].numel : lo + n;
        if (a >= b)
            continue;
        float *p = out + (a - lo);
        const char *name = t[i].name;
        if (!t[i].decay) { /* biases 0, norm gains ("..w" among them) 1 */
            float v = (strcmp(name, "ln1w") == 0 || strcmp(name, "ln2w") == 0 ||
                       strcmp(name, "lnfw") == 0) ? 1.0f : 0.0f;
            for (size_t j = 0; j < b - a; j++)
                p[j] = v;
            continue;
        }
        double std = (strcmp(name, "attprojw") == 0 || strcmp(name, "fcprojw") == 0)
                         ? resid_std : 0.02;
        size_t first = a - t[i].offset, count = b - a;
#pragma omp parallel for schedule(static)
        for (size_t j = 0; j < count; j++)
            p[j] = (float)(std * rng_normal(rng_hash(seed, 0x494e4954, (uint64_t)unit,
                                                     (uint64_t)i, first + j)));
    }
}

void gpt_init_weights(struct gpt *m, uint64_t seed)
{
    for (int u = 0; u < m->layout.nunits; u++)
        gpt_init_range(&m->cfg, seed, u, 0, m->layout.numel[u], gpt_unit_ptr(m, m->params, u));
}

/* Rows of unit 0: wte's V, then wpe's T. */
static size_t embed_rows(const struct gpt *m) { return (size_t)m->cfg.V + (size_t)m->cfg.T; }

void embed_forward_begin(struct gpt *m)
{
    const size_t n = (size_t)m->B * m->T * m->cfg.C;
    float *o = m->acts.encoded;
    for (size_t i = 0; i < n; i++)
        o[i] = -0.0f; /* -0 + x is x for every x, +0 too */
}

void embed_forward_rows(struct gpt *m, const float *rows, size_t first, size_t n)
{
    encoder_forward_rows(m->acts.encoded, m->inputs, rows, first, n, m->B, m->T, m->cfg.C,
                         m->cfg.V);
}

void embed_forward(struct gpt *m, const float *embed_unit)
{
    embed_forward_begin(m);
    embed_forward_rows(m, embed_unit, 0, embed_rows(m));
}

void block_forward(struct gpt *m, int l, const float *block_unit)
{
    struct block_params p = block_view(&m->cfg, block_unit);
    struct gpt_acts *a = &m->acts;
    const int B = m->B, T = m->T, C = m->cfg.C, N = B * T;
    const float *x = l == 0 ? a->encoded : a->res3[l - 1];

    layernorm_forward(a->ln1[l], a->ln1_mean[l], a->ln1_rstd[l], x, p.ln1w, p.ln1b, N, C);
    matmul_forward(a->qkv[l], a->ln1[l], p.qkvw, p.qkvb, N, C, 3 * C);
    attention_forward(a->atty[l], a->att[l], a->qkv[l], B, T, C, m->cfg.NH);
    matmul_forward(a->attproj[l], a->atty[l], p.attprojw, p.attprojb, N, C, C);
    residual_forward(a->res2[l], x, a->attproj[l], (size_t)N * C);
    layernorm_forward(a->ln2[l], a->ln2_mean[l], a->ln2_rstd[l], a->res2[l], p.ln2w, p.ln2b,
                      N, C);
    matmul_forward(a->fch[l], a->ln2[l], p.fcw, p.fcb, N, C, 4 * C);
    gelu_forward(a->fch_gelu[l], a->fch[l], (size_t)N * 4 * C);
    matmul_forward(a->fcproj[l], a->fch_gelu[l], p.fcprojw, p.fcprojb, N, 4 * C, C);
    residual_forward(a->res3[l], a->res2[l], a->fcproj[l], (size_t)N * C);
}

void head_norm_forward(struct gpt *m, const float *norm_unit)
{
    struct norm_params n = norm_view(&m->cfg, norm_unit);
    struct gpt_acts *a = &m->acts;
    layernorm_forward(a->lnf, a->lnf_mean, a->lnf_rstd, a->res3[m->cfg.L - 1], n.lnfw, n.lnfb,
                      m->B * m->T, m->cfg.C);
}

/* The part [first, *end) of a window of n rows from first that is wte's
 * (the tied head's); 0 when it holds none. */
static int head_part(const struct gpt *m, size_t first, size_t n, size_t *end)
{
    const size_t V = (size_t)m->cfg.V;
    *end = first + n < V ? first + n : V;
    return first < *end;
}

void head_forward_rows(struct gpt *m, const float *rows, size_t first, size_t n)
{
    size_t end;
    if (head_part(m, first, n, &end)) /* tied head: logits[:, first:end] */
        matmul_forward_cols(m->acts.logits + first, m->cfg.V, m->acts.lnf, rows, m->B * m->T,
                            m->cfg.C, (int)(end - first));
}

double head_loss(struct gpt *m, int with_targets)
{
    struct gpt_acts *a = &m->acts;
    if (!with_targets)
        return 0.0;
    return crossentropy_forward(a->probs, a->losses, a->logits, m->targets, m->B * m->T,
                                m->cfg.V);
}

double head_forward(struct gpt *m, const float *norm_unit, const float *embed_unit,
                    int with_targets)
{
    head_norm_forward(m, norm_unit);
    head_forward_rows(m, embed_unit, 0, (size_t)m->cfg.V);
    return head_loss(m, with_targets);
}

void head_backward_begin(struct gpt *m, float dloss)
{
    struct gpt_acts *a = &m->acts;
    const int N = m->B * m->T;
    /* dlogits replace the probabilities; acts.dsmall gathers d(lnf) */
    crossentropy_backward(a->probs, a->probs, m->targets, dloss, N, m->cfg.V);
    memset(a->dsmall, 0, sizeof(float) * (size_t)N * m->cfg.C);
}

void head_backward_rows(struct gpt *m, const float *rows, size_t first, size_t n)
{
    size_t end;
    if (head_part(m, first, n, &end))
        matmul_backward_cols(m->acts.dsmall, NULL, m->acts.probs + first, m->cfg.V, m->acts.lnf,
                             rows, m->B * m->T, m->cfg.C, (int)(end - first));
}

void head_norm_backward(struct gpt *m, float *dnorm_unit, const float *norm_unit)
{
    struct norm_params n = norm_view(&m->cfg, norm_unit), dn = norm_view(&m->cfg, dnorm_unit);
    struct gpt_acts *a = &m->acts;
    const int N = m->B * m->T, C = m->cfg.C;
    memset(a->dres, 0, sizeof(float) * (size_t)N * C);
    layernorm_backward(a->dres, dn.lnfw, dn.lnfb, a->dsmall, a->res3[m->cfg.L - 1], n.lnfw,
                       a->lnf_mean, a->lnf_rstd, N, C);
}

void head_backward(struct gpt *m, float *dnorm_unit, const float *norm_unit,
                   const float *embed_unit, float dloss)
{
    head_backward_begin(m, dloss);
    head_backward_rows(m, embed_unit, 0, (size_t)m->cfg.V);
    head_norm_backward(m, dnorm_unit, norm_unit);
}

void block_backward(struct gpt *m, int l, float *dblock_unit, const float *block_unit)
{
    struct block_params p = block_view(&m->cfg, block_unit);
    struct block_params d = block_view(&m->cfg, dblock_unit);
    struct gpt_acts *a = &m->acts;
    const int B = m->B, T = m->T, C = m->cfg.C, N = B * T;
    const float *x = l == 0 ? a->encoded : a->res3[l - 1];

    /* a->dres holds d(res3[l]); residuals pass it through unchanged, and the
     * layer norms add their input gradients into it. */
    matmul_backward(a->dbig, d.fcprojw, d.fcprojb, a->dres, a->fch_gelu[l], p.fcprojw, N,
                    4 * C, C);
    gelu_backward(a->dbig, a->dbig, a->fch[l], (size_t)N * 4 * C);
    matmul_backward(a->dsmall, d.fcw, d.fcb, a->dbig, a->ln2[l], p.fcw, N, C, 4 * C);
    layernorm_backward(a->dres, d.ln2w, d.ln2b, a->dsmall, a->res2[l], p.ln2w, a->ln2_mean[l],
                       a->ln2_rstd[l], N, C);
    matmul_backward(a->dsmall, d.attprojw, d.attprojb, a->dres, a->atty[l], p.attprojw, N, C,
                    C);
    attention_backward(a->dbig, a->datt, a->dsmall, a->qkv[l], a->att[l], B, T, C, m->cfg.NH);
    matmul_backward(a->dsmall, d.qkvw, d.qkvb, a->dbig, a->ln1[l], p.qkvw, N, C, 3 * C);
    layernorm_backward(a->dres, d.ln1w, d.ln1b, a->dsmall, x, p.ln1w, a->ln1_mean[l],
                       a->ln1_rstd[l], N, C);
}

void embed_backward_rows(struct gpt *m, float *drows, size_t first, size_t n)
{
    struct gpt_acts *a = &m->acts;
    const int N = m->B * m->T;
    size_t end;
    if (head_part(m, first, n, &end)) /* the tied head's: dlogits[:, first:end]^T @ lnf */
        matmul_backward_cols(NULL, drows, a->probs + first, m->cfg.V, a->lnf, NULL, N, m->cfg.C,
                             (int)(end - first));
    encoder_backward_rows(drows, a->dres, m->inputs, first, n, m->B, m->T, m->cfg.C, m->cfg.V);
}

void embed_backward(struct gpt *m, float *dembed_unit)
{
    embed_backward_rows(m, dembed_unit, 0, embed_rows(m));
}

void gpt_set_batch(struct gpt *m, const int *inputs, const int *targets, int B, int T)
{
    m->B = B;
    m->T = T;
    memcpy(m->inputs, inputs, sizeof(int) * (size_t)B * T);
    if (targets)
        memcpy(m->targets, targets, sizeof(int) * (size_t)B * T);
}

double gpt_forward(struct gpt *m, const int *inputs, const int *targets, int B, int T)
{
    const int L = m->cfg.L;
    gpt_set_batch(m, inputs, targets, B, T);
    embed_forward(m, gpt_unit_ptr(m, m->params, 0));
    for (int l = 0; l < L; l++)
        block_forward(m, l, gpt_unit_ptr(m, m->params, l + 1));
    return head_forward(m, gpt_unit_ptr(m, m->params, L + 1), gpt_unit_ptr(m, m->params, 0),
                        targets != NULL);
}

void gpt_backward(struct gpt *m, float scale)
{
    const int L = m->cfg.L;
    float dloss = scale / (float)(m->B * m->T);
    head_backward(m, gpt_unit_ptr(m, m->grads, L + 1), gpt_unit_ptr(m, m->params, L + 1),
                  gpt_unit_ptr(m, m->params, 0), dloss);
    for (int l = L - 1; l >= 0; l--)
        block_backward(m, l, gpt_unit_ptr(m, m->grads, l + 1),
                       gpt_unit_ptr(m, m->params, l + 1));
    embed_backward(m, gpt_unit_ptr(m, m->grads, 0));
}

void gpt_zero_grad(struct gpt *m)
{
    memset(m->grads, 0, sizeof(float) * m->layout.total);
}
