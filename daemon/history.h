/*
 * history: the run's training curve kept by musterd in bounded memory:
 * step, loss, tokens/s and time, down-sampled as the run grows. Points
 * stand for buckets of `stride` steps (the mean of the samples that fell in
 * the bucket); when the ring is full the stride doubles and neighbouring
 * buckets merge, so a run of any length is covered end to end by at most
 * `cap` points. A step lower than the last one (a restart resumed from an
 * older checkpoint) drops the points beyond it: the curve is the one the
 * model actually followed. Pure code; the loop samples it (GET /v1/history).
 */
#ifndef MUSTER_HISTORY_H
#define MUSTER_HISTORY_H

#include <stdint.h>

#include <jansson.h>

struct history_point {
    uint64_t step;      /* last step sampled in the bucket */
    double loss;        /* mean of the finite losses sampled; NaN = none */
    double tokens_per_s; /* mean */
    double time_s;      /* daemon uptime at the last sample */
    uint64_t generation; /* at the last sample */
    uint32_t nloss, n;  /* samples with a loss, samples */
};

struct history {
    struct history_point *pts;
    uint32_t cap, n;
    uint64_t stride;    /* steps per bucket: 1, 2, 4, ... */
    uint64_t samples;   /* taken in all */
    int changed;        /* since history_json last ran */
};

/* cap: points kept, at least 2. Returns 0 or -ENOMEM. */
int history_init(struct history *h, uint32_t cap);
void history_free(struct history *h);
void history_add(struct history *h, uint64_t step, double loss, double tokens_per_s, double time_s,
                 uint64_t generation);
/* {"stride":..., "samples":..., "capacity":..., "step":[...], "loss":[...],
 *  "tokens_per_s":[...], "time_s":[...], "generation":[...]}; clears changed. */
json_t *history_json(struct history *h);

#endif
