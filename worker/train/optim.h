/*
 * optim: AdamW on a flat range, the learning-rate schedule, and the global
 * gradient norm. Nothing here knows the model: the caller walks the tensors
 * of its units (gpt_unit_tensors) and passes each range with its decay, so
 * the same code updates a whole model or one rank's ZeRO shard.
 */
#ifndef MUSTER_TRAIN_OPTIM_H
#define MUSTER_TRAIN_OPTIM_H

#include <stddef.h>

struct adamw {
    float lr;           /* this step's learning rate */
    float beta1, beta2;
    float eps;
    float weight_decay; /* decoupled: p -= lr * wd * p, before the Adam step */
    long t;             /* 1-based step number for the bias corrections */
};

/*
 * One AdamW step over n floats, as torch.optim.AdamW does it: p *= 1 - lr*wd;
 * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2; p -= lr/(1-b1^t) * m /
 * (sqrt(v)/sqrt(1-b2^t) + eps). g is first multiplied by gscale (the
 * clipping factor; 1 for none). decay selects weight_decay or 0.
 */
void adamw_update(float *p, const float *g, float *m, float *v, size_t n,
                  const struct adamw *h, int decay, float gscale);
/* The same update read from p, m, v and written to p_out, m_out, v_out
 * (the same arithmetic: in place when they are the same arrays). */
void adamw_update_into(const float *p, const float *g, const float *m, const float *v, float *p_out,
                       float *m_out, float *v_out, size_t n, const struct adamw *h, int decay, float gscale);

struct lr_schedule {
    double lr;      /* peak */
    double lr_min;  /* floor */
    int warmup;     /* steps of linear warm-up */
    int steps;      /* total steps; cosine decay from warmup to steps */
};

/* Learning rate of 0-based step: lr*(step+1)/warmup during warm-up, then
 * lr_min + (lr-lr_min)/2 * (1 + cos(pi * progress)). */
double lr_at(const struct lr_schedule *s, int step);

/* Sum of squares of n floats, in double, in index order. */
double sum_squares(const float *x, size_t n);

/* torch.nn.utils.clip_grad_norm_'s factor: min(1, clip / (norm + 1e-6));
 * 1 when clip <= 0. */
float clip_scale(double norm, double clip);

#endif
