/*
 * batch: how a job's global batch (sequences per optimizer step) is split
 * over the ranks of a generation. The job states `batch` and, optionally,
 * `micro_batch` (sequences per micro-step per rank); the world size comes
 * from the nodes that formed the generation:
 *
 *   micro_batch = spec micro_batch, or batch / world when it is 0
 *   accum       = batch / (micro_batch * world)   micro-steps per step
 *
 * so the effective batch is the same on 8, 16 or 64 GPUs. musterd checks it
 * when generation 1 forms, before any rank starts; a batch that does not
 * divide is refused with the numbers that do not fit and the nearest ones
 * that would.
 */
#ifndef MUSTER_BATCH_H
#define MUSTER_BATCH_H

#include <stddef.h>

struct batch_plan {
    int micro_batch; /* sequences per micro-step per rank */
    int accum;       /* micro-steps per optimizer step */
};

/*
 * Returns 0 and fills *plan, or -EINVAL with the reason in err, e.g.
 * "batch 100 does not divide over 16 ranks: use a multiple of 16, e.g. 96 or 112".
 */
int batch_plan(int batch, int micro_batch, int world, struct batch_plan *plan, char *err, size_t errlen);

#endif
