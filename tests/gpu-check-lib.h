/*
 * gpu-check-lib: what the GPU check programs share (tests/gpu-check.c,
 * tests/cuemu/zero-world.c): the ok/FAIL line and the per-tensor error of a
 * whole model's floats against a reference. Header-only; each program has
 * its own failure count.
 */
#ifndef MUSTER_GPU_CHECK_LIB_H
#define MUSTER_GPU_CHECK_LIB_H

#include <math.h>
#include <stdio.h>

#include "worker/train/model.h"

static int failures;

#define CHECK(cond, ...)                                                                     \
    do {                                                                                     \
        printf((cond) ? "  ok    " : "  FAIL  ");                                            \
        failures += !(cond);                                                                 \
        printf(__VA_ARGS__);                                                                 \
        printf("\n");                                                                        \
    } while (0)

/* Worst normalised L2 error |a - ref| / |ref| over the model's tensors
 * (absolute where ref is all but zero); names the tensor. */
static inline double worst_tensor_error(const struct gpt *m, const float *a, const float *ref,
                                        char *name, size_t len)
{
    double worst = 0;
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    for (int u = 0; u < m->layout.nunits; u++) {
        int nt = gpt_unit_tensors(&m->cfg, u, t);
        for (int i = 0; i < nt; i++) {
            const size_t o = m->layout.offset[u] + t[i].offset;
            double d = 0, r = 0;
            for (size_t j = 0; j < t[i].numel; j++) {
                d += ((double)a[o + j] - ref[o + j]) * ((double)a[o + j] - ref[o + j]);
                r += (double)ref[o + j] * ref[o + j];
            }
            double e = r > 1e-20 ? sqrt(d / r) : sqrt(d);
            if (e > worst) {
                worst = e;
                snprintf(name, len, "unit %d %s", u, t[i].name);
            }
        }
    }
    return worst;
}

#endif
