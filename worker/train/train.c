#include "worker/train/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/comm.h"
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
                 struct comm *comm, char *err, size_t errlen)
{
    struct gpt_config cfg;
    memset(tr, 0, sizeof(*tr));
    tr->spec = *spec;
    tr->rank = rank;
    tr->world = world;
    tr->fault_nan_step = -1;
    tr->last_checkpoint_step = -1;
    if (comm ? comm_rank(comm) != rank || comm_world(comm) != world : world != 1 || rank != 0) {
        snprintf(err, errlen, "rank %d of %d does not match the communicator (%s)", rank, world,
                 comm ? "another rank or world" : "none: world 1 only");
        return -EINVAL;
    }
    struct job_spec *s = &tr->spec;
    int rc = trainer_check_spec(s, tr->world, err, errlen);
    if (rc)
        return rc;
    gpt_preset(s->model, &cfg);
    tr->accum = s->batch / (s->micro_batch * tr->world);
    tr->sched = (struct lr_schedule){s->lr, s->lr_min, s->warmup_steps, s->steps};
    tr->beta1 = 0.9f;
    tr->beta2 = 0.95f;
    tr->eps = 1e-8f;

    rc = dataset_open(&tr->data, s->data, cfg.V, s->val_fraction, s->seq_len, err, errlen);
    if (rc)
        return rc;
    rc = gpt_create_shell(&tr->model, &cfg, s->micro_batch, s->seq_len);
    if (rc == 0)
        rc = zero_init(&tr->zero, &tr->model, comm);
    tr->inputs = calloc((size_t)s->micro_batch * s->seq_len, sizeof(int));
    tr->targets = calloc((size_t)s->micro_batch * s->seq_len, sizeof(int));
    if (rc || !tr->inputs || !tr->targets) {
        snprintf(err, errlen, "out of memory for model %s with micro_batch %d x seq_len %d",
                 s->model, s->micro_batch, s->seq_len);
        trainer_free(tr);
        return -ENOMEM;
    }
    zero_init_weights(&tr->zero, (uint64_t)s->seed);
    return 0;
}

void trainer_free(struct trainer *tr)
{
    zero_free(&tr->zero);
    gpt_destroy(&tr->model);
    dataset_close(&tr->data);
    free(tr->inputs);
    free(tr->targets);
    tr->inputs = tr->targets = NULL;
}

/* Names the first tensor holding a non-finite value in this rank's part of a
 * shard buffer (weights or gradients), or "none". */
static void first_bad_tensor(const struct zero *z, const float *flat, char *out, size_t len)
{
    const struct gpt *g = z->g;
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    for (int u = 0; u < g->layout.nunits; u++) {
        size_t lo, n;
        zero_owned(z, u, &lo, &n);
        int nt = gpt_unit_tensors(&g->cfg, u, t);
        for (int i = 0; i < nt; i++) {
            size_t a = t[i].offset > lo ? t[i].offset : lo;
            size_t b = t[i].offset + t[i].numel < lo + n ? t[i].offset + t[i].numel : lo + n;
            for (size_t j = a; j < b; j++)
                if (!isfinite(flat[z->off[u] + j - lo])) {
                    snprintf(out, len, "%s of unit %d (%s)", t[i].name, u,
                             gpt_unit_kind_name(gpt_unit_kind(&g->cfg, u)));
                    return;
                }
        }
    }
    snprintf(out, len, "none");
}

static int comm_failed(int rc, const char *what, char *err, size_t errlen)
{
    snprintf(err, errlen, "%s: collective failed: %s", what, comm_strerror(rc));
    return rc;
}

int trainer_step(struct trainer *tr, struct train_step_info *info, char *err, size_t errlen)
{
    struct zero *z = &tr->zero;
    const struct job_spec *s = &tr->spec;
    const int B = s->micro_batch, T = s->seq_len;
    double t0 = now_s();
    zero_take_wait(z);

    /* unit 0's first float is rank 0's */
    if (tr->step == tr->fault_nan_step && tr->rank == 0)
        z->params[0] = NAN;
    zero_zero_grad(z);
    double loss = 0;
    int rc = 0;
    for (int ms = 0; ms < tr->accum && !rc; ms++) {
        double l;
        dataset_train_batch(&tr->data, tr->inputs, tr->targets, B, T, (uint64_t)s->seed,
                            tr->step, ms, tr->rank, tr->world);
        rc = zero_forward(z, tr->inputs, tr->targets, B, T, &l);
        loss += l;
        if (!rc)
            rc = zero_backward(z, 1.0f / (float)tr->accum);
    }
    loss /= tr->accum;
    double norm = 0;
    if (!rc)
        rc = zero_sum(z, &loss);
    loss /= tr->world;
    if (!rc)
        rc = zero_grad_norm(z, &norm);
    if (rc)
        return comm_failed(rc, "step", err, errlen);
    if (!isfinite(loss) || !isfinite(norm)) {
        char pbad[96], gbad[96];
        first_bad_tensor(z, z->params, pbad, sizeof(pbad));
        first_bad_tensor(z, z->grads, gbad, sizeof(gbad));
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
    zero_adamw(z, &h, clip_scale(norm, s->grad_clip));
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
        info->comm_frac = dt > 0 ? zero_take_wait(z) / dt : 0;
    }
    return 0;
}

double trainer_eval(struct trainer *tr)
{
    const struct job_spec *s = &tr->spec;
    if (tr->data.ntokens == tr->data.ntrain)
        return NAN;
    /* rank r takes batches r, r + world, ...; every rank runs as many
     * forwards (collectives must match), the ones past the end unused */
    const int rounds = (s->eval_batches + tr->world - 1) / tr->world;
    double sum = 0;
    for (int i = 0; i < rounds; i++) {
        int k = i * tr->world + tr->rank;
        double l;
        dataset_val_batch(&tr->data, tr->inputs, tr->targets, s->micro_batch, s->seq_len,
                          (uint64_t)s->seed, k);
        if (zero_forward(&tr->zero, tr->inputs, tr->targets, s->micro_batch, s->seq_len, &l))
            return NAN;
        if (k < s->eval_batches)
            sum += l;
    }
    if (zero_sum(&tr->zero, &sum))
        return NAN;
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
        double unused;
        if (zero_forward(&tr->zero, ctx + start, NULL, 1, T, &unused))
            break;
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

/* Whether to stop before the next step. Ranks see a stop request at
 * different moments; they agree (any rank asking is enough) so that all make
 * the same number of steps and the collectives keep matching. */
static int agree_stop(struct trainer *tr, volatile sig_atomic_t *stop, int *rc)
{
    double want = stop && *stop ? 1.0 : 0.0;
    *rc = zero_sum(&tr->zero, &want);
    return *rc || want > 0;
}

/* Collective: a checkpoint of this step, then the hook with its committed path. */
static int save_and_tell(struct trainer *tr, const struct train_hooks *hooks, char *err, size_t errlen)
{
    char path[JOB_PATH_MAX + 64];
    int rc = ckpt_save(tr, tr->spec.checkpoint_dir, path, sizeof(path), err, errlen);
    if (rc == 0 && hooks && hooks->on_checkpoint)
        hooks->on_checkpoint(tr->step, path, hooks->user);
    return rc;
}

int train_run(struct trainer *tr, long stop_after, const struct train_hooks *hooks,
              volatile sig_atomic_t *stop, char *err, size_t errlen)
{
    const struct job_spec *s = &tr->spec;
    long done = 0;
    int rc = 0;
    while (tr->step < s->steps && !(stop_after > 0 && done >= stop_after) &&
           !agree_stop(tr, stop, &rc)) {
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
            rc = save_and_tell(tr, hooks, err, errlen);
            if (rc)
                return rc;
        }
    }
    if (rc)
        return comm_failed(rc, "stop agreement", err, errlen);
    if (s->checkpoint_dir[0] && done > 0)
        return save_and_tell(tr, hooks, err, errlen);
    return 0;
}
