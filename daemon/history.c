#include "daemon/history.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

int history_init(struct history *h, uint32_t cap)
{
    memset(h, 0, sizeof(*h));
    if (cap < 2)
        cap = 2;
    h->pts = calloc(cap, sizeof(*h->pts));
    if (!h->pts)
        return -ENOMEM;
    h->cap = cap;
    h->stride = 1;
    return 0;
}

void history_free(struct history *h)
{
    free(h->pts);
    memset(h, 0, sizeof(*h));
}

/* The mean of x (weight wx) and y (weight wy), finite for any finite x and y (no x * wx + y * wy to overflow). */
static double mean2(double x, double wx, double y, double wy)
{
    return x * (wx / (wx + wy)) + y * (wy / (wx + wy));
}

/* Folds sample-weighted b into a (b is the later one). */
static void merge(struct history_point *a, const struct history_point *b)
{
    if (b->nloss)
        a->loss = a->nloss ? mean2(a->loss, a->nloss, b->loss, b->nloss) : b->loss;
    a->tokens_per_s = mean2(a->tokens_per_s, a->n, b->tokens_per_s, b->n);
    a->nloss += b->nloss;
    a->n += b->n;
    a->step = b->step;
    a->time_s = b->time_s;
    a->generation = b->generation;
}

/* The stride doubles until the buckets fit in fewer than cap points. */
static void coarsen(struct history *h)
{
    while (h->n >= h->cap) {
        h->stride *= 2;
        uint32_t out = 0;
        for (uint32_t i = 0; i < h->n; i++) {
            if (out && h->pts[out - 1].step / h->stride == h->pts[i].step / h->stride)
                merge(&h->pts[out - 1], &h->pts[i]);
            else
                h->pts[out++] = h->pts[i];
        }
        h->n = out;
    }
}

void history_add(struct history *h, uint64_t step, double loss, double tokens_per_s, double time_s,
                 uint64_t generation)
{
    if (!h->pts)
        return;
    while (h->n && h->pts[h->n - 1].step > step)
        h->n--; /* resumed from an older step: that part of the curve is redone */
    struct history_point p = {.step = step, .loss = isfinite(loss) ? loss : 0, .tokens_per_s = tokens_per_s,
                              .time_s = time_s, .generation = generation, .nloss = isfinite(loss), .n = 1};
    if (!isfinite(p.tokens_per_s))
        p.tokens_per_s = 0;
    struct history_point *last = h->n ? &h->pts[h->n - 1] : NULL;
    if (last && last->step / h->stride == step / h->stride) {
        merge(last, &p);
    } else {
        h->pts[h->n++] = p;
        coarsen(h);
    }
    h->samples++;
    h->changed = 1;
}

json_t *history_json(struct history *h)
{
    json_t *step = json_array(), *loss = json_array(), *tps = json_array(), *t = json_array(),
           *gen = json_array();
    for (uint32_t i = 0; i < h->n; i++) {
        const struct history_point *p = &h->pts[i];
        json_array_append_new(step, json_integer((json_int_t)p->step));
        /* every array one entry per point, whatever the value (json_real refuses a non-finite one) */
        json_array_append_new(loss, p->nloss && isfinite(p->loss) ? json_real(p->loss) : json_null());
        json_array_append_new(tps, json_real(isfinite(p->tokens_per_s) ? p->tokens_per_s : 0));
        json_array_append_new(t, json_real(isfinite(p->time_s) ? p->time_s : 0));
        json_array_append_new(gen, json_integer((json_int_t)p->generation));
    }
    h->changed = 0;
    return json_pack("{s:I, s:I, s:i, s:o, s:o, s:o, s:o, s:o}", "stride", (json_int_t)h->stride, "samples",
                     (json_int_t)h->samples, "capacity", (int)h->cap, "step", step, "loss", loss, "tokens_per_s",
                     tps, "time_s", t, "generation", gen);
}
