#include "worker/gpu/gpu_train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int gpu_trainer_init(struct gpu_trainer *tr, const struct job_spec *spec, int rank, int world,
                     const uint8_t *id, char *err, size_t errlen)
{
    memset(tr, 0, sizeof(*tr));
    tr->spec = *spec;
    tr->rank = rank;
    tr->world = world;
    struct job_spec *s = &tr->spec;
    int rc = trainer_check_spec(s, world, err, errlen);
    if (rc)
        return rc;
    if (s->checkpoint_dir[0]) {
        snprintf(err, errlen, "checkpoint_dir is set, but the GPU path does not write checkpoints "
                              "yet (docs/gpu.md): run with --device cpu, or without checkpoint_dir");
        return -ENOTSUP;
    }
    char why[256];
    if (gpu_device_count(why, sizeof(why)) < 1) {
        snprintf(err, errlen, "--device gpu: %s", why);
        return -ENODEV;
    }
    gpt_preset(s->model, &tr->cfg);
    tr->accum = s->batch / (s->micro_batch * world);
    tr->sched = (struct lr_schedule){s->lr, s->lr_min, s->warmup_steps, s->steps};
    tr->beta1 = 0.9f;
    tr->beta2 = 0.95f;
    tr->eps = 1e-8f;
    rc = dataset_open(&tr->data, s->data, tr->cfg.V, s->val_fraction, s->seq_len, err, errlen);
    if (rc)
        return rc;
    const size_t n = (size_t)s->micro_batch * s->seq_len;
    tr->inputs = malloc(sizeof(int) * n);
    tr->targets = malloc(sizeof(int) * n);
    if (!tr->inputs || !tr->targets) {
        snprintf(err, errlen, "out of host memory for the batch");
        gpu_trainer_free(tr);
        return -ENOMEM;
    }
    rc = gpu_zero_init(&tr->z, &tr->cfg, s->micro_batch, s->seq_len, rank, world, id, err, errlen);
    if (rc == 0 && (rc = gpu_zero_init_weights(tr->z, (uint64_t)s->seed)) != 0)
        snprintf(err, errlen, "%s", gpu_zero_error(tr->z));
    if (rc)
        gpu_trainer_free(tr);
    return rc;
}

void gpu_trainer_free(struct gpu_trainer *tr)
{
    gpu_zero_free(tr->z);
    dataset_close(&tr->data);
    free(tr->inputs);
    free(tr->targets);
    memset(tr, 0, sizeof(*tr));
}

static int failed(struct gpu_trainer *tr, int rc, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "step %ld: %s on the GPU failed: %s", tr->step + 1, what,
             gpu_zero_error(tr->z));
    return rc;
}

int gpu_trainer_step(struct gpu_trainer *tr, struct train_step_info *info, char *err,
                     size_t errlen)
{
    const struct job_spec *s = &tr->spec;
    const int B = s->micro_batch, T = s->seq_len;
    const double t0 = now_s();
    int rc = gpu_zero_zero_grad(tr->z);
    for (int ms = 0; ms < tr->accum && !rc; ms++) {
        dataset_train_batch(&tr->data, tr->inputs, tr->targets, B, T, (uint64_t)s->seed,
                            tr->step, ms, tr->rank, tr->world);
        rc = gpu_zero_forward(tr->z, tr->inputs, tr->targets, B, T, NULL);
        if (!rc)
            rc = gpu_zero_backward(tr->z, 1.0f / (float)tr->accum);
    }
    double loss = 0, norm = 0;
    if (!rc)
        rc = gpu_zero_step_stats(tr->z, &loss, &norm);
    if (rc)
        return failed(tr, rc, "forward/backward", err, errlen);
    loss /= (double)tr->accum * tr->world;
    if (!isfinite(loss) || !isfinite(norm)) {
        snprintf(err, errlen,
                 "step %ld: loss is %g (gradient norm %g) on the GPU; the run diverged: lower lr "
                 "(now %g)%s",
                 tr->step + 1, loss, norm, s->lr, s->grad_clip > 0 ? "" : " or set grad_clip");
        return -ERANGE;
    }
    const double lr = lr_at(&tr->sched, (int)tr->step);
    struct adamw h = {(float)lr, tr->beta1, tr->beta2, tr->eps, (float)s->weight_decay,
                      tr->step + 1};
    rc = gpu_zero_adamw(tr->z, &h, clip_scale(norm, s->grad_clip));
    if (rc)
        return failed(tr, rc, "AdamW", err, errlen);
    tr->step++;
    const double dt = now_s() - t0;
    if (info) {
        info->step = tr->step;
        info->steps = s->steps;
        info->loss = loss;
        info->lr = lr;
        info->grad_norm = norm;
        info->ms = dt * 1e3;
        info->tokens_per_s = (double)tr->accum * B * T / (dt > 0 ? dt : 1e-9);
        info->comm_frac = 0; /* collectives overlap on their own stream: not measured */
    }
    return 0;
}

double gpu_trainer_eval(struct gpu_trainer *tr)
{
    const struct job_spec *s = &tr->spec;
    if (tr->data.ntokens == tr->data.ntrain)
        return NAN;
    /* as trainer_eval: rank r takes batches r, r + world, ... */
    const int rounds = (s->eval_batches + tr->world - 1) / tr->world;
    double sum = 0;
    for (int i = 0; i < rounds; i++) {
        int k = i * tr->world + tr->rank;
        double l;
        dataset_val_batch(&tr->data, tr->inputs, tr->targets, s->micro_batch, s->seq_len,
                          (uint64_t)s->seed, k);
        if (gpu_zero_forward(tr->z, tr->inputs, tr->targets, s->micro_batch, s->seq_len, &l))
            return NAN;
        if (k < s->eval_batches)
            sum += l;
    }
    if (gpu_zero_sum(tr->z, &sum))
        return NAN;
    return sum / s->eval_batches;
}

int gpu_train_run(struct gpu_trainer *tr, long stop_after, const struct train_hooks *hooks,
                  volatile sig_atomic_t *stop, char *err, size_t errlen)
{
    const struct job_spec *s = &tr->spec;
    long done = 0;
    for (;;) {
        /* every rank makes the same number of steps: any rank asking to stop is enough */
        double want = stop && *stop ? 1.0 : 0.0;
        int rc = gpu_zero_sum(tr->z, &want);
        if (rc)
            return failed(tr, rc, "stop agreement", err, errlen);
        if (want > 0 || tr->step >= s->steps || (stop_after > 0 && done >= stop_after))
            return 0;
        struct train_step_info info;
        rc = gpu_trainer_step(tr, &info, err, errlen);
        if (rc)
            return rc;
        done++;
        if (hooks && hooks->on_step)
            hooks->on_step(&info, hooks->user);
        const int last = tr->step == s->steps;
        if (s->eval_every > 0 && (tr->step % s->eval_every == 0 || last)) {
            double val = gpu_trainer_eval(tr);
            if (hooks && hooks->on_eval && !isnan(val))
                hooks->on_eval(tr->step, val, hooks->user);
        }
    }
}
