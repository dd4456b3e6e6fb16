#include "worker/train/gpu/gpu_train.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zeroshard.h"
#include "worker/train/ckpt.h"
#include "worker/train/comm/comm.h"
#include "worker/train/replica.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int gpu_trainer_init(struct gpu_trainer *tr, const struct job_spec *spec, int rank, int world,
                     const uint8_t *id, const int *cancel, char *err, size_t errlen)
{
    memset(tr, 0, sizeof(*tr));
    tr->spec = *spec;
    tr->rank = rank;
    tr->world = world;
    tr->last_checkpoint_step = -1;
    tr->snap_cur = tr->snap_next = -1;
    struct job_spec *s = &tr->spec;
    int rc = trainer_check_spec(s, world, err, errlen);
    if (rc)
        return rc;
    char why[256];
    if (gpu_device_count(why, sizeof(why)) < 1) {
        snprintf(err, errlen, "--device gpu: %s", why);
        return -ENODEV;
    }
    job_spec_model(s, &tr->cfg, err, errlen); /* checked by trainer_check_spec */
    tr->accum = s->batch / (s->micro_batch * world);
    train_optim_init(&tr->optim, s);
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
    rc = gpu_zero_init(&tr->z, &tr->cfg, s->micro_batch, s->seq_len, rank, world, id, cancel, err,
                       errlen);
    if (rc == 0 && (rc = gpu_zero_init_weights(tr->z, (uint64_t)s->seed)) != 0)
        snprintf(err, errlen, "%s", gpu_zero_error(tr->z));
    if (rc)
        gpu_trainer_free(tr);
    return rc;
}

void gpu_trainer_free(struct gpu_trainer *tr)
{
    if (tr->replica) { /* its thread reads the pinned blocks the zero frees */
        replica_free(tr->replica);
        free(tr->replica);
    }
    gpu_zero_free(tr->z);
    free(tr->host_state);
    free(tr->host_snap);
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
        /* The state of tr->step goes to this rank's holder while the step
         * computes: the copy off the device runs beside the micro-batch
         * just queued, and the round (its store waits for the copy) starts
         * once it is done. */
        if (!rc && ms == 0)
            replica_begin(tr->replica, tr->step);
    }
    double loss = 0, norm = 0;
    /* No update before every rank's replica of the round is held (replica.h). */
    int rrc = rc ? 0 : replica_wait(tr->replica);
    if (rrc) {
        snprintf(err, errlen, "step %ld: the replica round failed: %s", tr->step + 1, comm_strerror(rrc));
        return rrc;
    }
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
    double lr;
    struct adamw h = train_optim_at(&tr->optim, tr->step, &lr);
    rc = gpu_zero_adamw(tr->z, &h, clip_scale(norm, s->grad_clip));
    if (rc)
        return failed(tr, rc, "AdamW", err, errlen);
    replica_updated(tr->replica);
    tr->step++;
    const double comm_s = gpu_zero_comm_wait_s(tr->z);
    if (info)
        train_step_report(info, s, tr->step, loss, lr, norm, (double)tr->accum * B * T,
                          now_s() - t0, comm_s);
    return 0;
}

/* ---- healing in place: peer replicas from pinned snapshots, a new communicator ---- */

/* The round of `step`: its state copied into the block that is not the snapshot. */
static const float *snap_round(void *arg, long step)
{
    struct gpu_trainer *tr = arg;
    const int k = tr->snap_cur == 0 ? 1 : 0;
    (void)step;
    if (gpu_zero_snapshot(tr->z, k) != 0 || gpu_zero_snapshot_wait(tr->z) != 0)
        return NULL;
    tr->snap_next = k;
    return tr->snap[k];
}

static void snap_keep(void *arg, int keep)
{
    struct gpu_trainer *tr = arg;
    tr->snap_cur = keep ? tr->snap_next : -1;
    tr->snap_next = -1;
}

/* Floats of each of the shard's buffers. */
static size_t state_floats(const struct gpu_trainer *tr)
{
    size_t shard[GPT_MAX_UNITS], off[GPT_MAX_UNITS];
    return gpu_zero_shard_layout(tr->z, shard, off);
}

/* A pinned block of p, m, v back onto the device. */
static int snap_upload(struct gpu_trainer *tr, const float *b)
{
    const size_t n = state_floats(tr);
    return gpu_zero_write_state(tr->z, b, b + n, b + 2 * n);
}

static int snap_revert(void *arg)
{
    struct gpu_trainer *tr = arg;
    return tr->snap_cur < 0 ? -EINVAL : snap_upload(tr, tr->snap[tr->snap_cur]);
}

/* Received state lands in block 0: every snapshot is dropped after a restore. */
static float *snap_inbox(void *arg) { return ((struct gpu_trainer *)arg)->snap[0]; }

static int snap_received(void *arg)
{
    struct gpu_trainer *tr = arg;
    return snap_upload(tr, tr->snap[0]);
}

int gpu_trainer_replicas(struct gpu_trainer *tr, int every, char *err, size_t errlen)
{
    const size_t total = state_floats(tr);
    const struct replica_store store = {snap_round, snap_keep, snap_revert, snap_inbox, snap_received, tr};
    if (gpu_zero_keep_snapshots(tr->z, tr->snap) != 0) {
        snprintf(err, errlen, "%s: set replicate_every to 0", gpu_zero_error(tr->z));
        return -ENOMEM;
    }
    struct replica *r = calloc(1, sizeof(*r));
    if (!r || replica_init_store(r, total, every, tr->rank, &store) != 0) {
        free(r);
        snprintf(err, errlen, "out of host memory for peer replicas (two more copies of this rank's "
                 "state, %.1f MiB): set replicate_every to 0", 2 * 12.0 * total / 1048576.0);
        return -ENOMEM;
    }
    tr->replica = r;
    return 0;
}

int gpu_trainer_set_comm(struct gpu_trainer *tr, const uint8_t *id, const int *cancel, char *err,
                         size_t errlen)
{
    int rc = gpu_zero_set_comm(tr->z, id, cancel);
    if (rc)
        snprintf(err, errlen, "NCCL communicator (rank %d of %d) did not form: %s", tr->rank, tr->world,
                 gpu_zero_error(tr->z));
    return rc;
}

int gpu_trainer_reset(struct gpu_trainer *tr, char *err, size_t errlen)
{
    const size_t total = state_floats(tr);
    float *zeros = calloc(total, sizeof(float));
    int rc = zeros ? gpu_zero_init_weights(tr->z, (uint64_t)tr->spec.seed) : -ENOMEM;
    if (rc == 0)
        rc = gpu_zero_write_state(tr->z, NULL, zeros, zeros);
    free(zeros);
    if (rc) {
        snprintf(err, errlen, "back to the seed's weights: %s", zeros ? gpu_zero_error(tr->z) : "out of host memory");
        return rc;
    }
    tr->step = 0;
    tr->last_checkpoint_step = -1;
    return 0;
}

int gpu_trainer_failed(struct gpu_trainer *tr)
{
    if (!tr->z) /* on the host: no generation of its own */
        return 0;
    return gpu_zero_failed(tr->z) || (tr->replica && replica_failed(tr->replica));
}

/* ---- the GPU trainer as the shared loop sees it ---- */

static int gpu_step(void *tr, struct train_step_info *info, char *err, size_t errlen)
{
    return gpu_trainer_step(tr, info, err, errlen);
}

static int gpu_forward(void *tr, const int *inputs, const int *targets, int B, int T,
                       double *loss)
{
    return gpu_zero_forward(((struct gpu_trainer *)tr)->z, inputs, targets, B, T, loss);
}

static int gpu_sum(void *tr, double *x) { return gpu_zero_sum(((struct gpu_trainer *)tr)->z, x); }

static int gpu_save(void *tr, const char *dir, char *path, size_t pathlen, char *err,
                    size_t errlen)
{
    return gpu_trainer_save(tr, dir, path, pathlen, err, errlen);
}

static int gpu_failed(void *tr, int rc, const char *what, char *err, size_t errlen)
{
    return failed(tr, rc, what, err, errlen);
}

static const struct train_ops gpu_ops = {gpu_step, gpu_forward, gpu_sum, gpu_save, gpu_failed};

static struct train_loop gpu_loop(struct gpu_trainer *tr)
{
    return (struct train_loop){.ops = &gpu_ops, .tr = tr, .spec = &tr->spec, .data = &tr->data,
                               .step = &tr->step, .last_checkpoint = &tr->last_checkpoint_step,
                               .rank = tr->rank, .world = tr->world,
                               .inputs = tr->inputs, .targets = tr->targets};
}

double gpu_trainer_eval(struct gpu_trainer *tr)
{
    struct train_loop l = gpu_loop(tr);
    return train_loop_eval(&l);
}

int gpu_train_run(struct gpu_trainer *tr, long stop_after, const struct train_hooks *hooks,
                  volatile sig_atomic_t *stop, char *err, size_t errlen)
{
    struct train_loop l = gpu_loop(tr);
    return train_loop_run(&l, stop_after, hooks, stop, err, errlen);
}

/* ---- checkpoints: the CPU path's files, through host copies of the shards ---- */

static int gpu_gather(void *z, const uint64_t *mine, size_t n, uint64_t *all)
{
    return gpu_zero_gather_u64(z, mine, n, all);
}

static const char *gpu_why(void *z, int rc)
{
    (void)rc;
    return gpu_zero_error(z);
}

/* What the checkpoint files see of this trainer. The shards are staged in
 * *stage (three arrays of the shard layout, zeroed: padding stays zero),
 * which the caller frees; without memory c->local_rc says so. */
static void ckpt_view(struct gpu_trainer *tr, struct ckpt_rank *c, float **stage)
{
    memset(c, 0, sizeof(*c));
    c->spec = &tr->spec;
    c->data = &tr->data;
    c->cfg = tr->cfg;
    gpt_layout_init(&c->lay, &tr->cfg);
    c->beta1 = tr->optim.beta1;
    c->beta2 = tr->optim.beta2;
    c->eps = tr->optim.eps;
    c->step = tr->step;
    c->seed = tr->spec.seed;
    c->rank = tr->rank;
    c->world = tr->world;
    const size_t total = gpu_zero_shard_layout(tr->z, c->shard, c->off);
    *stage = calloc(3 * total, sizeof(float));
    if (*stage) {
        c->params = *stage;
        c->m = *stage + total;
        c->v = *stage + 2 * total;
    } else {
        c->local_rc = -ENOMEM;
    }
    c->gather = gpu_gather;
    c->why = gpu_why;
    c->coll = tr->z;
}

int gpu_trainer_save(struct gpu_trainer *tr, const char *dir, char *path, size_t pathlen,
                     char *err, size_t errlen)
{
    struct ckpt_rank c;
    float *stage;
    char why[1100] = "";
    ckpt_view(tr, &c, &stage);
    if (c.local_rc)
        snprintf(why, sizeof(why), "no host memory to stage the shards");
    else if (gpu_zero_read_state(tr->z, c.params, c.m, c.v) != 0) {
        c.local_rc = -EIO;
        snprintf(why, sizeof(why), "copying the shards from the GPU: %s", gpu_zero_error(tr->z));
    }
    /* a rank that has nothing to write still takes part, and fails the checkpoint everywhere */
    int rc = ckpt_save(&c, dir, path, pathlen, err, errlen);
    free(stage);
    if (rc == 0)
        tr->last_checkpoint_step = tr->step;
    else if (why[0]) {
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, " (rank %d: %s)", tr->rank, why);
    }
    return rc;
}

/* The staged shards onto this rank's GPU, every rank agreeing that they
 * are there, or none goes on (collective). */
static int upload_staged(struct gpu_trainer *tr, const struct ckpt_rank *c, const char *what, char *err,
                         size_t errlen)
{
    int rc = gpu_zero_write_state(tr->z, c->params, c->m, c->v);
    if (rc)
        snprintf(err, errlen, "%s: copying the shards to the GPU failed: %s", what, gpu_zero_error(tr->z));
    double bad = rc != 0;
    int vrc = gpu_zero_sum(tr->z, &bad);
    if (!rc && vrc) {
        snprintf(err, errlen, "%s: agreeing on the upload failed: %s", what, gpu_zero_error(tr->z));
        rc = vrc;
    } else if (!rc && bad > 0) {
        snprintf(err, errlen, "%s: another rank could not copy its shards to its GPU", what);
        rc = -EIO;
    }
    return rc;
}

int gpu_trainer_reslice(struct gpu_trainer *tr, int my_rc, int old_world, int ncontrib, const float *const *mine, int nmine,
                        const int *from_rank, const int *from_index, char *err, size_t errlen)
{
    struct ckpt_rank c;
    struct zero_shards old; /* how the GPU trainer cut the model over old_world */
    float *stage;
    ckpt_view(tr, &c, &stage);
    if (my_rc)
        c.local_rc = my_rc;
    else if (c.local_rc)
        snprintf(err, errlen, "re-slicing: no host memory to stage this rank's shards");
    zero_shards_init(&old, &c.lay, old_world, GPU_SHARD_ALIGN);
    /* a rank without room to stage (c.local_rc) still takes part: ckpt_reslice agrees on it first */
    int rc = ckpt_reslice(&c, old_world, old.shard, ncontrib, mine, nmine, from_rank, from_index, err, errlen);
    if (rc == 0)
        rc = upload_staged(tr, &c, "re-slicing", err, errlen);
    free(stage);
    return rc;
}

int gpu_trainer_read_state(struct gpu_trainer *tr, int snapshot, float *block)
{
    if (!tr->z) { /* on the host (gpu_trainer_to_host) */
        const float *from = snapshot ? tr->host_snap : tr->host_state;
        if (!from)
            return -EINVAL;
        memcpy(block, from, 3 * tr->host_floats * sizeof(float));
        return 0;
    }
    const size_t n = state_floats(tr);
    if (!snapshot)
        return gpu_zero_read_state(tr->z, block, block + n, block + 2 * n);
    if (tr->snap_cur < 0)
        return -EINVAL;
    memcpy(block, tr->snap[tr->snap_cur], 3 * n * sizeof(float)); /* pinned host memory already */
    return 0;
}

int gpu_trainer_to_host(struct gpu_trainer *tr, char *err, size_t errlen)
{
    const size_t n = state_floats(tr), bytes = 3 * n * sizeof(float);
    float *state = malloc(bytes), *snap = tr->snap_cur >= 0 ? malloc(bytes) : NULL;
    int rc = state && (tr->snap_cur < 0 || snap) ? 0 : -ENOMEM;
    if (rc)
        snprintf(err, errlen, "no host memory for a copy of this rank's state (%.1f MiB)",
                 (tr->snap_cur >= 0 ? 2.0 : 1.0) * (double)bytes / 1048576.0);
    else if ((rc = gpu_trainer_read_state(tr, 0, state)) != 0)
        snprintf(err, errlen, "copying this rank's state from its GPU: %s", gpu_zero_error(tr->z));
    else if (snap)
        rc = gpu_trainer_read_state(tr, 1, snap);
    if (rc) {
        free(state);
        free(snap);
        return rc;
    }
    gpu_zero_free(tr->z); /* the pinned snapshot blocks with it */
    tr->z = NULL;
    tr->snap[0] = tr->snap[1] = NULL;
    tr->host_state = state;
    tr->host_snap = snap;
    tr->host_floats = n;
    return 0;
}

int gpu_trainer_load(struct gpu_trainer *tr, const char *path, char *err, size_t errlen)
{
    struct ckpt_rank c;
    float *stage;
    ckpt_view(tr, &c, &stage);
    int rc = ckpt_load(&c, path, err, errlen);
    /* every rank read its shards (ckpt_load agreed on it) */
    if (rc == 0)
        rc = upload_staged(tr, &c, "checkpoint", err, errlen);
    free(stage);
    if (rc == 0) {
        tr->spec.seed = c.seed;
        tr->step = c.step;
        tr->last_checkpoint_step = c.step;
    }
    return rc;
}

/* ---- sampling on the host ---- */

int gpu_trainer_sample(struct gpu_trainer *tr, int prompt, int *out, int n, char *err,
                       size_t errlen)
{
    if (tr->world != 1) {
        snprintf(err, errlen, "sampling on the GPU path gathers the weights of one rank: world 1 "
                              "only (this run has %d ranks)", tr->world);
        return -ENOTSUP;
    }
    size_t shard[GPT_MAX_UNITS], off[GPT_MAX_UNITS];
    const size_t total = gpu_zero_shard_layout(tr->z, shard, off);
    struct gpt g;
    float *shards = malloc(sizeof(float) * total);
    int rc = shards ? gpt_create(&g, &tr->cfg, 1, tr->spec.seq_len) : -ENOMEM;
    if (rc) {
        free(shards);
        snprintf(err, errlen, "no host memory for the model to sample from (%s)", tr->spec.model);
        return -ENOMEM;
    }
    rc = gpu_zero_read_state(tr->z, shards, NULL, NULL);
    if (rc) {
        snprintf(err, errlen, "copying the weights from the GPU failed: %s",
                 gpu_zero_error(tr->z));
    } else {
        /* world 1: the rank's shard of each unit is the whole unit, padded */
        for (int u = 0; u < g.layout.nunits; u++)
            memcpy(g.params + g.layout.offset[u], shards + off[u],
                   sizeof(float) * g.layout.numel[u]);
        train_sample_model(&g, (uint64_t)tr->spec.seed, tr->step, tr->spec.seq_len, prompt, out,
                           n);
    }
    free(shards);
    gpt_destroy(&g);
    return rc;
}
