#include "worker/train/optim.h"

#include <math.h>

void adamw_update_into(const float *p, const float *g, const float *m, const float *v, float *p_out,
                       float *m_out, float *v_out, size_t n, const struct adamw *h, int decay, float gscale)
{
    /* Scalars in double like PyTorch computes them, then rounded once. */
    const double bc1 = 1.0 - pow(h->beta1, (double)h->t);
    const double bc2 = 1.0 - pow(h->beta2, (double)h->t);
    const float step_size = (float)(h->lr / bc1);
    const float bc2_sqrt = (float)sqrt(bc2);
    const float shrink = decay ? 1.0f - h->lr * h->weight_decay : 1.0f;
    const float b1 = h->beta1, b2 = h->beta2, eps = h->eps;
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        float gi = gscale == 1.0f ? g[i] : g[i] * gscale;
        float w = p[i] * shrink;
        float mi = m[i] * b1 + gi * (1.0f - b1);
        float vi = v[i] * b2 + (1.0f - b2) * gi * gi;
        m_out[i] = mi;
        v_out[i] = vi;
        w -= step_size * (mi / (sqrtf(vi) / bc2_sqrt + eps));
        p_out[i] = w;
    }
}

void adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                  const struct adamw *h, int decay, float gscale)
{
    adamw_update_into(p, g, m, v, p, m, v, n, h, decay, gscale);
}

double lr_at(const struct lr_schedule *s, int step)
{
    if (step < s->warmup)
        return s->lr * (step + 1) / s->warmup;
    if (s->steps <= s->warmup)
        return s->lr_min;
    double progress = (double)(step - s->warmup) / (s->steps - s->warmup);
    if (progress > 1.0)
        progress = 1.0;
    return s->lr_min + 0.5 * (s->lr - s->lr_min) * (1.0 + cos(M_PI * progress));
}

double sum_squares(const float *x, size_t n)
{
    double s = 0;
    for (size_t i = 0; i < n; i++)
        s += (double)x[i] * x[i];
    return s;
}

float clip_scale(double norm, double clip)
{
    if (clip <= 0)
        return 1.0f;
    double c = clip / (norm + 1e-6);
    return c < 1.0 ? (float)c : 1.0f;
}
