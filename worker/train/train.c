#include "worker/train/train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/train/comm/comm.h"
#include "worker/train/replica.h"
#include "common/log.h"
#include "worker/train/ckpt.h"
#include "worker/train/rng.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

void train_optim_init(struct train_optim *o, const struct job_spec *s)
{
    o->sched = (struct lr_schedule){s->lr, s->lr_min, s->warmup_steps, s->steps};
    o->beta1 = 0.9f;
    o->beta2 = 0.95f;
    o->eps = 1e-8f;
    o->weight_decay = (float)s->weight_decay;
}

struct adamw train_optim_at(const struct train_optim *o, long step, double *lr)
{
    *lr = lr_at(&o->sched, (int)step);
    return (struct adamw){(float)*lr, o->beta1, o->beta2, o->eps, o->weight_decay, step + 1};
}

void train_step_report(struct train_step_info *info, const struct job_spec *s, long step,
                       double loss, double lr, double norm, double tokens, double dt,
                       double comm_s)
{
    info->step = step;
    info->steps = s->steps;
    info->loss = loss;
    info->lr = lr;
    info->grad_norm = norm;
    info->ms = dt * 1e3;
    info->tokens_per_s = tokens / (dt > 0 ? dt : 1e-9);
    info->comm_frac = dt > 0 ? comm_s / dt : 0;
}

int trainer_check_spec(struct job_spec *s, int world, char *err, size_t errlen)
{
    struct gpt_config cfg;
    if (job_spec_model(s, &cfg, err, errlen))
        return -EINVAL;
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
    job_spec_model(s, &cfg, err, errlen); /* checked by trainer_check_spec */
    tr->accum = s->batch / (s->micro_batch * tr->world);
    train_optim_init(&tr->optim, s);

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
                if (!isfinite(flat[z->plan.off[u] + j - lo])) {
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
    /* The state of tr->step steps goes to this rank's holder while the step computes. */
    replica_begin(tr->replica, tr->step);

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
    /* No update before every rank's replica of the last round is held (replica.h);
     * the wait counts as time spent on communication. */
    if (!rc && tr->replica) {
        double w0 = now_s();
        rc = replica_wait(tr->replica);
        z->wait_s += now_s() - w0;
    }
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

    double lr;
    struct adamw h = train_optim_at(&tr->optim, tr->step, &lr);
    zero_adamw(z, &h, clip_scale(norm, s->grad_clip));
    replica_updated(tr->replica);
    tr->step++;
    if (tr->fingerprint)
        trainer_log_fingerprint(tr, "after step");

    double dt = now_s() - t0;
    if (info)
        train_step_report(info, s, tr->step, loss, lr, norm, (double)tr->accum * B * T, dt,
                          zero_take_wait(z));
    return 0;
}

void trainer_log_fingerprint(struct trainer *tr, const char *when)
{
    uint64_t f = 0;
    if (zero_fingerprint(&tr->zero, &f) == 0 && tr->rank == 0)
        log_info("fingerprint %s %ld: %016llx (world %d)", when, tr->step, (unsigned long long)f, tr->world);
}

/* ---- the CPU trainer as the shared loop sees it ---- */

static int cpu_step(void *tr, struct train_step_info *info, char *err, size_t errlen)
{
    return trainer_step(tr, info, err, errlen);
}

static int cpu_forward(void *tr, const int *inputs, const int *targets, int B, int T,
                       double *loss)
{
    return zero_forward(&((struct trainer *)tr)->zero, inputs, targets, B, T, loss);
}

static int cpu_sum(void *tr, double *x) { return zero_sum(&((struct trainer *)tr)->zero, x); }

static int cpu_save(void *tr, const char *dir, char *path, size_t pathlen, char *err,
                    size_t errlen)
{
    return trainer_save(tr, dir, path, pathlen, err, errlen);
}

static int cpu_failed(void *tr, int rc, const char *what, char *err, size_t errlen)
{
    (void)tr;
    return comm_failed(rc, what, err, errlen);
}

static const struct train_ops cpu_ops = {cpu_step, cpu_forward, cpu_sum, cpu_save, cpu_failed};

static struct train_loop cpu_loop(struct trainer *tr)
{
    return (struct train_loop){.ops = &cpu_ops, .tr = tr, .spec = &tr->spec, .data = &tr->data,
                               .step = &tr->step, .last_checkpoint = &tr->last_checkpoint_step,
                               .rank = tr->rank, .world = tr->world,
                               .inputs = tr->inputs, .targets = tr->targets};
}

double trainer_eval(struct trainer *tr)
{
    struct train_loop l = cpu_loop(tr);
    return train_loop_eval(&l);
}

int train_run(struct trainer *tr, long stop_after, const struct train_hooks *hooks,
              volatile sig_atomic_t *stop, char *err, size_t errlen)
{
    struct train_loop l = cpu_loop(tr);
    return train_loop_run(&l, stop_after, hooks, stop, err, errlen);
}

/* ---- sampling ---- */

/* The generation behind trainer_sample and train_sample_model: forward runs
 * the model on ctx (T tokens) and leaves the logits (T, V) in logits. */
static void sample_with(int (*forward)(void *u, const int *ctx, int T), void *u,
                        const float *logits, int V, uint64_t seed, long step, int maxT,
                        int prompt, int *out, int n)
{
    int *ctx = malloc(sizeof(int) * (size_t)(n + 1));
    if (!ctx)
        return;
    ctx[0] = prompt;
    for (int i = 0; i < n; i++) {
        int len = i + 1, start = len > maxT ? len - maxT : 0, T = len - start;
        if (forward(u, ctx + start, T))
            break;
        const float *z = logits + (size_t)(T - 1) * V;
        float mx = z[0];
        for (int k = 1; k < V; k++)
            mx = z[k] > mx ? z[k] : mx;
        double sum = 0;
        for (int k = 0; k < V; k++)
            sum += exp((double)(z[k] - mx));
        double r = rng_uniform(rng_hash(seed, 0x53414d50, (uint64_t)step, (uint64_t)i, 0)) * sum;
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

static int zero_sample_forward(void *z, const int *ctx, int T)
{
    double unused;
    return zero_forward(z, ctx, NULL, 1, T, &unused);
}

void trainer_sample(struct trainer *tr, int prompt, int *out, int n)
{
    sample_with(zero_sample_forward, &tr->zero, tr->model.acts.logits, tr->model.cfg.V,
                (uint64_t)tr->spec.seed, tr->step, tr->spec.seq_len, prompt, out, n);
}

static int gpt_sample_forward(void *g, const int *ctx, int T)
{
    gpt_forward(g, ctx, NULL, 1, T);
    return 0;
}

void train_sample_model(struct gpt *g, uint64_t seed, long step, int maxT, int prompt, int *out,
                        int n)
{
    sample_with(gpt_sample_forward, g, g->acts.logits, g->cfg.V, seed, step, maxT, prompt, out,
                n);
}

/* ---- checkpoints ---- */

static int zero_gather(void *z, const uint64_t *mine, size_t n, uint64_t *all)
{
    return zero_gather_u64(z, mine, n, all);
}

static const char *comm_why(void *z, int rc)
{
    (void)z;
    return comm_strerror(rc);
}

/* What the checkpoint files see of this trainer. */
static void ckpt_view(struct trainer *tr, struct ckpt_rank *c)
{
    struct zero *z = &tr->zero;
    memset(c, 0, sizeof(*c));
    c->spec = &tr->spec;
    c->data = &tr->data;
    c->cfg = tr->model.cfg;
    c->lay = tr->model.layout;
    c->beta1 = tr->optim.beta1;
    c->beta2 = tr->optim.beta2;
    c->eps = tr->optim.eps;
    c->step = tr->step;
    c->seed = tr->spec.seed;
    c->rank = z->rank;
    c->world = z->world;
    memcpy(c->shard, z->plan.shard, sizeof(c->shard));
    memcpy(c->off, z->plan.off, sizeof(c->off));
    c->params = z->params;
    c->m = z->m;
    c->v = z->v;
    c->gather = zero_gather;
    c->why = comm_why;
    c->coll = z;
}

int trainer_save(struct trainer *tr, const char *dir, char *path, size_t pathlen, char *err,
                 size_t errlen)
{
    struct ckpt_rank c;
    ckpt_view(tr, &c);
    int rc = ckpt_save(&c, dir, path, pathlen, err, errlen);
    if (rc == 0)
        tr->last_checkpoint_step = tr->step;
    return rc;
}

int trainer_reslice(struct trainer *tr, int my_rc, int old_world, int ncontrib, const float *const *mine, int nmine,
                    const int *from_rank, const int *from_index, char *err, size_t errlen)
{
    struct ckpt_rank c;
    struct zero_shards old; /* how the CPU trainer cut the model over old_world */
    ckpt_view(tr, &c);
    c.local_rc = my_rc;
    zero_shards_init(&old, &tr->model.layout, old_world, 1);
    return ckpt_reslice(&c, old_world, old.shard, ncontrib, mine, nmine, from_rank, from_index, err, errlen);
}

int trainer_load(struct trainer *tr, const char *path, char *err, size_t errlen)
{
    struct ckpt_rank c;
    ckpt_view(tr, &c);
    int rc = ckpt_load(&c, path, err, errlen);
    if (rc == 0) {
        tr->spec.seed = c.seed;
        tr->step = c.step;
        tr->last_checkpoint_step = c.step;
    }
    return rc;
}

/* ---- the loop both trainers share ---- */

double train_loop_eval(const struct train_loop *l)
{
    const struct job_spec *s = l->spec;
    if (l->data->ntokens == l->data->ntrain)
        return NAN;
    /* The validation set is eval_batches x batch sequences, chosen by the seed
     * alone; rank r evaluates the r-th of world equal shares, micro_batch
     * sequences at a time (batch = world x micro_batch x accumulation, so the
     * shares are whole and every rank runs as many forwards: the collectives
     * match). The loss is then the same at any world size and micro-batch, up
     * to the order of floating-point sums. */
    const long total = (long)s->eval_batches * s->batch, share = total / l->world;
    const long first = share * l->rank;
    double sum = 0;
    for (long done = 0; done < share; done += s->micro_batch) {
        double loss;
        dataset_val_batch(l->data, l->inputs, l->targets, s->micro_batch, s->seq_len, (uint64_t)s->seed,
                          first + done);
        if (l->ops->forward(l->tr, l->inputs, l->targets, s->micro_batch, s->seq_len, &loss))
            return NAN;
        sum += loss * s->micro_batch; /* the mean over the micro-batch, as a sum over its sequences */
    }
    if (l->ops->sum(l->tr, &sum))
        return NAN;
    return sum / (double)total;
}

double train_vote_share(int stop, int checkpoint, int yield, int world)
{
    const double b = (double)world + 1.0;
    return (stop ? 1.0 : 0.0) + (checkpoint ? b : 0.0) + (yield ? b * b : 0.0);
}

struct train_vote train_vote_count(double sum, int world)
{
    const long long base = (long long)world + 1, n = llround(sum);
    return (struct train_vote){.stop = (int)(n % base), .checkpoint = (int)(n / base % base),
                               .yield = (int)(n / base / base)};
}

/* The vote before the next step (see train_vote in train.h): whether any
 * rank wants to stop, and whether any has a checkpoint request that the
 * loop has not answered yet (answered: requests answered so far). */
static int agree(const struct train_loop *l, volatile sig_atomic_t *stop,
                 const struct train_hooks *hooks, long answered, struct train_vote *v)
{
    const long asked = hooks && hooks->checkpoint_requests ? *hooks->checkpoint_requests : 0;
    const int yield = hooks && hooks->yield && *hooks->yield;
    double x = train_vote_share(stop && *stop, asked > answered, yield, l->world);
    int rc = l->ops->sum(l->tr, &x);
    *v = rc ? (struct train_vote){0, 0, 0} : train_vote_count(x, l->world);
    return rc;
}

/* Collective: a checkpoint of this step, then the hook with its committed path. */
static int save_and_tell(const struct train_loop *l, const struct train_hooks *hooks, char *err,
                         size_t errlen)
{
    char path[JOB_PATH_MAX + 64];
    int rc = l->ops->save(l->tr, l->spec->checkpoint_dir, path, sizeof(path), err, errlen);
    if (rc == 0 && hooks && hooks->on_checkpoint)
        hooks->on_checkpoint(*l->step, path, hooks->user);
    return rc;
}

int train_loop_run(const struct train_loop *l, long stop_after, const struct train_hooks *hooks,
                   volatile sig_atomic_t *stop, char *err, size_t errlen)
{
    const struct job_spec *s = l->spec;
    const int can_save = s->checkpoint_dir[0] != '\0';
    long done = 0, answered = hooks && hooks->checkpoints_answered ? *hooks->checkpoints_answered : 0;
    int rc = 0;
    while (*l->step < s->steps && !(stop_after > 0 && done >= stop_after)) {
        struct train_vote v;
        if ((rc = agree(l, stop, hooks, answered, &v)) != 0)
            break;
        if (v.checkpoint) {
            answered++; /* on every rank alike: they all saw this sum */
            if (hooks && hooks->checkpoints_answered)
                *hooks->checkpoints_answered = answered;
            if (can_save && *l->last_checkpoint != *l->step &&
                (rc = save_and_tell(l, hooks, err, errlen)) != 0)
                return rc;
        }
        if (v.stop)
            break;
        if (v.yield)
            return TRAIN_YIELDED; /* no final checkpoint: the job goes on in the next generation */
        struct train_step_info info;
        rc = l->ops->step(l->tr, &info, err, errlen);
        if (rc)
            return rc;
        done++;
        if (hooks && hooks->on_step)
            hooks->on_step(&info, hooks->user);
        const long step = *l->step;
        const int last = step == s->steps;
        if (s->eval_every > 0 && (step % s->eval_every == 0 || last)) {
            double val = train_loop_eval(l);
            if (hooks && hooks->on_eval && !isnan(val))
                hooks->on_eval(step, val, hooks->user);
        }
        if (can_save && s->checkpoint_every > 0 && step % s->checkpoint_every == 0 && !last) {
            rc = save_and_tell(l, hooks, err, errlen);
            if (rc)
                return rc;
        }
    }
    if (rc)
        return l->ops->failed(l->tr, rc, "stop and checkpoint vote", err, errlen);
    if (can_save && done > 0 && *l->last_checkpoint != *l->step)
        return save_and_tell(l, hooks, err, errlen);
    return 0;
}
