#include "worker/train/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/train/ckpt.h"
#include "worker/train/rng.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int trainer_check_spec(struct job_spec *s, int world, char *err, size_t errlen)
{
    struct gpt_config cfg;
    if (gpt_preset(s->model, &cfg)) {
        snprintf(err, errlen, "model: unknown preset \"%s\" (expected one of %s)", s->model,
                 gpt_preset_list());
        return -EINVAL;
    }
    if (s->seq_len == 0)
        s->seq_len = cfg.T;
    if (s->seq_len > cfg.T) {
        snprintf(err, errlen, "seq_len: %d exceeds the model's context T = %d", s->seq_len, cfg.T);
        return -EINVAL;
    }
    if (s->micro_batch == 0)
        s->micro_batch = s->batch / world;
    if (s->micro_batch < 1 || s->batch % (s->micro_batch * world)) {
        snprintf(err, errlen,
                 "batch: %d is not a multiple of micro_batch (%d) x world size (%d)", s->batch,
                 s->micro_batch, world);
        return -EINVAL;
    }
    if (s->data[0] == '\0') {
        snprintf(err, errlen, "data: no training data given");
        return -EINVAL;
    }
    return 0;
}

int trainer_init(struct trainer *tr, const struct job_spec *spec, int rank, int world,
                 char *err, size_t errlen)
{
    struct gpt_config cfg;
    memset(tr, 0, sizeof(*tr));
    tr->spec = *spec;
    tr->rank = rank;
    tr->world = world;
    tr->fault_nan_step = -1;
    struct job_spec *s = &tr->spec;
    int rc = trainer_check_spec(s, world, err, errlen);
    if (rc)
        return rc;
    gpt_preset(s->model, &cfg);
    tr->accum = s->batch / (s->micro_batch * world);
    tr->sched = (struct lr_schedule){s->lr, s->lr_min, s->warmup_steps, s->steps};
    tr->beta1 = 0.9f;
    tr->beta2 = 0.95f;
    tr->eps = 1e-8f;

    rc = dataset_open(&tr->data, s->data, cfg.V, s->val_fraction, s->seq_len, err, errlen);
    if (rc)
        return rc;
    rc = gpt_create(&tr->model, &cfg, s->micro_batch, s->seq_len);
    size_t P = tr->model.layout.total;
    tr->m = calloc(P ? P : 1, sizeof(float));
    tr->v = calloc(P ? P : 1, sizeof(float));
    tr->inputs = calloc((size_t)s->micro_batch * s->seq_len, sizeof(int));
    tr->targets = calloc((size_t)s->micro_batch * s->seq_len, sizeof(int));
    if (rc || !tr->m || !tr->v || !tr->inputs || !tr->targets) {
        snprintf(err, errlen, "out of memory for model %s with micro_batch %d x seq_len %d",
                 s->model, s->micro_batch, s->seq_len);
        trainer_free(tr);
        return -ENOMEM;
    }
    gpt_init_weights(&tr->model, (uint64_t)s->seed);
    return 0;
}

void trainer_free(struct trainer *tr)
{
    gpt_destroy(&tr->model);
    dataset_close(&tr->data);
    free(tr->m);
    free(tr->v);
    free(tr->inputs);
    free(tr->targets);
    tr->m = tr->v = NULL;
    tr->inputs = tr->targets = NULL;
}

/* Names the first tensor holding a non-finite value in flat, or "none". */
static void first_bad_tensor(const struct gpt *g, const float *flat, char *out, size_t len)
{
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    for (int u = 0; u < g->layout.nunits; u++) {
        int n = gpt_unit_tensors(&g->cfg, u, t);
        for (int i = 0; i < n; i++) {
            const float *p = flat + g->layout.offset[u] + t[i].offset;
            for (size_t j = 0; j < t[i].numel; j++)
                if (!isfinite(p[j])) {
                    snprintf(out, len, "%s of unit %d (%s)", t[i].name, u,
                             gpt_unit_kind_name(gpt_unit_kind(&g->cfg, u)));
                    return;
                }
        }
    }
    snprintf(out, len, "none");
}

int trainer_step(struct trainer *tr, struct train_step_info *info, char *err, size_t errlen)
{
    struct gpt *g = &tr->model;
    const struct job_spec *s = &tr->spec;
    const int B = s->micro_batch, T = s->seq_len;
    double t0 = now_s();

    if (tr->step == tr->fault_nan_step)
        g->params[0] = NAN;
    gpt_zero_grad(g);
    double loss = 0;
    for (int ms = 0; ms < tr->accum; ms++) {
        dataset_train_batch(&tr->data, tr->inputs, tr->targets, B, T, (uint64_t)s->seed,
                            tr->step, ms, tr->rank, tr->world);
        loss += gpt_forward(g, tr->inputs, tr->targets, B, T);
        gpt_backward(g, 1.0f / (float)tr->accum);
    }
    loss /= tr->accum;
    double norm = sqrt(sum_squares(g->grads, g->layout.total));
    if (!isfinite(loss) || !isfinite(norm)) {
        char pbad[96], gbad[96];
        first_bad_tensor(g, g->params, pbad, sizeof(pbad));
        first_bad_tensor(g, g->grads, gbad, sizeof(gbad));
        snprintf(err, errlen,
                 "step %ld: loss is %g (gradient norm %g); first non-finite weight: %s; first "
                 "non-finite gradient: %s; the run diverged: lower lr (now %g)%s",
                 tr->step + 1, loss, norm, pbad, gbad, s->lr,
                 s->grad_clip > 0 ? "" : " or set grad_clip");
        return -ERANGE;
    }

    double lr = lr_at(&tr->sched, (int)tr->step);
    struct adamw h = {(float)lr, tr->beta1, tr->beta2, tr->eps, (float)s->weight_decay,
                      tr->step + 1};
    float gscale = clip_scale(norm, s->grad_clip);
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    for (int u = 0; u < g->layout.nunits; u++) {
        int n = gpt_unit_tensors(&g->cfg, u, t);
        for (int i = 0; i < n; i++) {
            size_t off = g->layout.offset[u] + t[i].offset;
            adamw_update(g->params + off, g->grads + off, tr->m + off, tr->v + off, t[i].numel,
                         &h, t[i].decay, gscale);
        }
    }
    tr->step++;

    double dt = now_s() - t0;
    if (info) {
        info->step = tr->step;
        info->steps = s->steps;
        info->loss = loss;
        info->lr = lr;
        info->grad_norm = norm;
        info->ms = dt * 1e3;
        info->tokens_per_s = (double)tr->accum * B * T / (dt > 0 ? dt : 1e-9);
    }
    return 0;
}

double trainer_eval(struct trainer *tr)
{
    const struct job_spec *s = &tr->spec;
    if (tr->data.ntokens == tr->data.ntrain)
        return NAN;
    double sum = 0;
    for (int k = 0; k < s->eval_batches; k++) {
        dataset_val_batch(&tr->data, tr->inputs, tr->targets, s->micro_batch, s->seq_len,
                          (uint64_t)s->seed, k);
        sum += gpt_forward(&tr->model, tr->inputs, tr->targets, s->micro_batch, s->seq_len);
    }
    return sum / s->eval_batches;
}

void trainer_sample(struct trainer *tr, int prompt, int *out, int n)
{
    struct gpt *g = &tr->model;
    const int maxT = tr->spec.seq_len, V = g->cfg.V;
    int *ctx = malloc(sizeof(int) * (size_t)(n + 1));
    if (!ctx)
        return;
    ctx[0] = prompt;
    for (int i = 0; i < n; i++) {
        int len = i + 1, start = len > maxT ? len - maxT : 0, T = len - start;
        gpt_forward(g, ctx + start, NULL, 1, T);
        const float *z = g->acts.logits + (size_t)(T - 1) * V;
        float mx = z[0];
        for (int k = 1; k < V; k++)
            mx = z[k] > mx ? z[k] : mx;
        double sum = 0;
        for (int k = 0; k < V; k++)
            sum += exp((double)(z[k] - mx));
        double r = rng_uniform(rng_hash((uint64_t)tr->spec.seed, 0x53414d50, (uint64_t)tr->step,
                                        (uint64_t)i, 0)) * sum;
        int next = V - 1;
        for (int k = 0; k < V; k++) {
            r -= exp((double)(z[k] - mx));
            if (r <= 0) {
                next = k;
                break;
            }
        }
        ctx[len] = next;
        out[i] = next;
    }
    free(ctx);
}

int train_run(struct trainer *tr, long stop_after, const struct train_hooks *hooks,
              volatile sig_atomic_t *stop, char *err, size_t errlen)
{
    const struct job_spec *s = &tr->spec;
    long done = 0;
    int rc = 0;
    while (tr->step < s->steps && !(stop && *stop) && !(stop_after > 0 && done >= stop_after)) {
        struct train_step_info info;
        rc = trainer_step(tr, &info, err, errlen);
        if (rc)
            return rc;
        done++;
        if (hooks && hooks->on_step)
            hooks->on_step(&info, hooks->user);
        int last = tr->step == s->steps;
        if (s->eval_every > 0 && (tr->step % s->eval_every == 0 || last)) {
            double val = trainer_eval(tr);
            if (hooks && hooks->on_eval && !isnan(val))
                hooks->on_eval(tr->step, val, hooks->user);
        }
        if (s->checkpoint_dir[0] && s->checkpoint_every > 0 &&
            tr->step % s->checkpoint_every == 0 && !last) {
            char path[JOB_PATH_MAX + 64];
            rc = ckpt_save(tr, s->checkpoint_dir, path, sizeof(path), err, errlen);
            if (rc)
                return rc;
            if (hooks && hooks->on_checkpoint)
                hooks->on_checkpoint(tr->step, path, hooks->user);
        }
    }
    if (s->checkpoint_dir[0] && done > 0) {
        char path[JOB_PATH_MAX + 64];
        rc = ckpt_save(tr, s->checkpoint_dir, path, sizeof(path), err, errlen);
        if (rc)
            return rc;
        if (hooks && hooks->on_checkpoint)
            hooks->on_checkpoint(tr->step, path, hooks->user);
    }
    return 0;
}
