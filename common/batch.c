#include "common/batch.h"

#include <errno.h>
#include <stdio.h>

/* "e.g. 96 or 112": the multiples of unit around batch (the lower one only when > 0). */
static void nearest(long long batch, long long unit, char *out, size_t cap)
{
    long long lo = batch / unit * unit, hi = lo + unit;
    if (lo > 0)
        snprintf(out, cap, "e.g. %lld or %lld", lo, hi);
    else
        snprintf(out, cap, "e.g. %lld", hi);
}

int batch_plan(int batch, int micro_batch, int world, struct batch_plan *plan, char *err, size_t errlen)
{
    char near[64];

    if (world < 1 || batch < 1 || micro_batch < 0) {
        snprintf(err, errlen, "batch %d, micro_batch %d over %d ranks: expected batch >= 1, micro_batch >= 0 "
                 "and at least one rank", batch, micro_batch, world);
        return -EINVAL;
    }
    if (micro_batch == 0) {
        if (batch % world != 0) {
            nearest(batch, world, near, sizeof(near));
            snprintf(err, errlen, "batch %d does not divide over %d ranks: use a multiple of %d, %s",
                     batch, world, world, near);
            return -EINVAL;
        }
        plan->micro_batch = batch / world;
        plan->accum = 1;
        return 0;
    }
    long long unit = (long long)micro_batch * world; /* sequences per micro-step over all ranks */
    if (batch % unit != 0) {
        nearest(batch, unit, near, sizeof(near));
        int n = snprintf(err, errlen,
                         "batch %d does not divide into micro-batches of %d over %d ranks (%lld sequences "
                         "per micro-step): use a multiple of %lld, %s",
                         batch, micro_batch, world, unit, unit, near);
        if (batch % world == 0 && n > 0 && (size_t)n < errlen)
            snprintf(err + n, errlen - (size_t)n, ", or a micro_batch that divides %d", batch / world);
        return -EINVAL;
    }
    plan->micro_batch = micro_batch;
    plan->accum = (int)(batch / unit);
    return 0;
}
