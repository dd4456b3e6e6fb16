#include "worker/train/zero.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/zeroshard.h"
#include "worker/train/comm/comm.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the comm thread ---- */

static int run_job(struct zero *z, const struct zero_job *j)
{
    float *mine = j->buf + (size_t)z->rank * j->count;
    int rc;
    switch (j->kind) {
    case ZERO_GATHER:
        memcpy(mine, z->params + j->at, sizeof(float) * j->count);
        return comm_all_gather(z->comm, mine, j->buf, j->count, COMM_F32);
    case ZERO_REDUCE:
        rc = comm_reduce_scatter(z->comm, j->buf, mine, j->count, COMM_F32, COMM_AVG);
        if (rc == 0) {
            float *g = z->grads + j->at;
            for (size_t i = 0; i < j->count; i++)
                g[i] += mine[i];
        }
        return rc;
    case ZERO_RAW_GATHER:
        return comm_all_gather(z->comm, j->send, j->buf, j->count, COMM_F32);
    }
    return -EINVAL;
}

static void *comm_thread(void *arg)
{
    struct zero *z = arg;
    pthread_mutex_lock(&z->mu);
    for (;;) {
        while (!z->stopping && z->done == z->submitted)
            pthread_cond_wait(&z->cv, &z->mu);
        if (z->done == z->submitted)
            break;
        struct zero_job j = z->q[z->done % ZERO_QUEUE];
        int rc = z->rc;
        pthread_mutex_unlock(&z->mu);
        if (rc == 0)
            rc = run_job(z, &j);
        pthread_mutex_lock(&z->mu);
        if (rc && !z->rc)
            z->rc = rc;
        z->done++;
        pthread_cond_broadcast(&z->cv);
    }
    pthread_mutex_unlock(&z->mu);
    return NULL;
}

/* Queues a job; returns its ticket (1-based; 0 means "nothing to wait for"). */
static unsigned long submit(struct zero *z, struct zero_job j)
{
    pthread_mutex_lock(&z->mu);
    while (z->submitted - z->done == ZERO_QUEUE)
        pthread_cond_wait(&z->cv, &z->mu);
    z->q[z->submitted % ZERO_QUEUE] = j;
    unsigned long ticket = ++z->submitted;
    pthread_cond_broadcast(&z->cv);
    pthread_mutex_unlock(&z->mu);
    return ticket;
}

/* Waits until the job of this ticket (and every earlier one) is done. */
static int wait_for(struct zero *z, unsigned long ticket)
{
    double t0 = now_s();
    pthread_mutex_lock(&z->mu);
    while (z->done < ticket)
        pthread_cond_wait(&z->cv, &z->mu);
    int rc = z->rc;
    pthread_mutex_unlock(&z->mu);
    z->wait_s += now_s() - t0;
    return rc;
}

/* ---- set-up ---- */

int zero_failed(struct zero *z)
{
    if (!z->running)
        return 0;
    pthread_mutex_lock(&z->mu);
    int rc = z->rc;
    pthread_mutex_unlock(&z->mu);
    return rc;
}

void zero_set_comm(struct zero *z, struct comm *comm)
{
    if (!z->running)
        return; /* world 1: no communicator */
    pthread_mutex_lock(&z->mu);
    while (z->done != z->submitted)
        pthread_cond_wait(&z->cv, &z->mu);
    z->comm = comm;
    z->rc = 0;
    pthread_mutex_unlock(&z->mu);
}

int zero_init(struct zero *z, struct gpt *g, struct comm *comm)
{
    memset(z, 0, sizeof(*z));
    z->g = g;
    z->comm = comm;
    z->world = comm ? comm_world(comm) : 1;
    z->rank = comm ? comm_rank(comm) : 0;
    if (z->world == 1)
        z->comm = NULL;
    zero_shards_init(&z->plan, &g->layout, z->world, 1);
    const size_t total = z->plan.total;
    /* weights and both moments back to back: one block that a replica round sends at once */
    z->params = calloc(3 * total, sizeof(float));
    z->m = z->params ? z->params + total : NULL;
    z->v = z->params ? z->params + 2 * total : NULL;
    z->grads = calloc(total, sizeof(float));
    int ok = z->params && z->m && z->v && z->grads;
    if (ok && z->comm) {
        for (int k = 0; k < ZERO_SLOTS; k++) {
            z->slot[k] = malloc(sizeof(float) * z->plan.slot);
            ok = ok && z->slot[k];
        }
        if (ok) {
            pthread_mutex_init(&z->mu, NULL);
            pthread_cond_init(&z->cv, NULL);
            ok = pthread_create(&z->thread, NULL, comm_thread, z) == 0;
            z->running = ok;
            if (!ok) {
                pthread_mutex_destroy(&z->mu);
                pthread_cond_destroy(&z->cv);
            }
        }
    }
    if (!ok) {
        zero_free(z);
        return -ENOMEM;
    }
    return 0;
}

void zero_free(struct zero *z)
{
    if (z->running) {
        pthread_mutex_lock(&z->mu);
        z->stopping = 1;
        pthread_cond_broadcast(&z->cv);
        pthread_mutex_unlock(&z->mu);
        pthread_join(z->thread, NULL);
        pthread_mutex_destroy(&z->mu);
        pthread_cond_destroy(&z->cv);
    }
    free(z->params);
    free(z->alt_params);
    free(z->grads);
    for (int k = 0; k < ZERO_SLOTS; k++)
        free(z->slot[k]);
    memset(z, 0, sizeof(*z));
}

size_t zero_model_state_bytes(const struct zero *z) { return zero_shards_state_bytes(&z->plan); }

size_t zero_transient_bytes(const struct zero *z)
{
    return zero_shards_transient_bytes(&z->plan);
}

void zero_owned(const struct zero *z, int unit, size_t *lo, size_t *n)
{
    size_t P = z->g->layout.numel[unit], S = z->plan.shard[unit];
    *lo = (size_t)z->rank * S;
    *n = *lo >= P ? 0 : (P - *lo < S ? P - *lo : S);
}

void zero_init_weights(struct zero *z, uint64_t seed)
{
    for (int u = 0; u < z->g->layout.nunits; u++) {
        size_t lo, n;
        zero_owned(z, u, &lo, &n);
        gpt_init_range(&z->g->cfg, seed, u, lo, n, z->params + z->plan.off[u]);
    }
}

/* ---- passes ---- */

static float *own(const struct zero *z, float *flat, int unit) { return flat + z->plan.off[unit]; }

/*
 * A pass is a list of steps; each gathers a unit or a chunk of the embedding
 * (its parameters) into a slot, and those of the backward make a gradient
 * of the same span in another slot, which is then reduce-scattered.
 */
enum zero_step_kind {
    STEP_LOOKUP,     /* embedding chunk: its token and position rows into acts.encoded */
    STEP_BLOCK,      /* block i */
    STEP_NORM,       /* the final norm */
    STEP_LOGITS,     /* embedding chunk: the logits of its wte rows */
    STEP_HEAD_BACK,  /* embedding chunk: its share of the head's input gradient */
    STEP_NORM_BACK,  /* the final norm's gradient, and the last block's output's */
    STEP_BLOCK_BACK, /* block i's gradient, and its input's */
    STEP_EMBED_GRAD, /* embedding chunk i's gradient; nothing gathered */
};

struct zero_step {
    enum zero_step_kind kind;
    int i; /* block or chunk */
};

typedef struct zero_step (*zero_pass_fn)(const struct zero *z, int j);

/* Forward: chunks (lookup), blocks, norm, chunks (logits). */
static int forward_steps(const struct zero *z) { return 2 * z->plan.chunks + z->g->cfg.L + 1; }

static struct zero_step forward_step(const struct zero *z, int j)
{
    const int K = z->plan.chunks, L = z->g->cfg.L;
    if (j < K)
        return (struct zero_step){STEP_LOOKUP, j};
    if (j < K + L)
        return (struct zero_step){STEP_BLOCK, j - K};
    if (j == K + L)
        return (struct zero_step){STEP_NORM, 0};
    return (struct zero_step){STEP_LOGITS, j - K - L - 1};
}

/* Backward: chunks (head input gradient), norm, blocks in reverse, chunks (gradient). */
static int backward_steps(const struct zero *z) { return forward_steps(z); }

static struct zero_step backward_step(const struct zero *z, int j)
{
    const int K = z->plan.chunks, L = z->g->cfg.L;
    if (j < K)
        return (struct zero_step){STEP_HEAD_BACK, j};
    if (j == K)
        return (struct zero_step){STEP_NORM_BACK, 0};
    if (j <= K + L)
        return (struct zero_step){STEP_BLOCK_BACK, K + L - j};
    return (struct zero_step){STEP_EMBED_GRAD, j - K - L - 1};
}

static int is_chunk(struct zero_step s)
{
    return s.kind == STEP_LOOKUP || s.kind == STEP_LOGITS || s.kind == STEP_HEAD_BACK ||
           s.kind == STEP_EMBED_GRAD;
}

static int gathers(struct zero_step s) { return s.kind != STEP_EMBED_GRAD; }

static int makes_gradient(struct zero_step s)
{
    return s.kind == STEP_NORM_BACK || s.kind == STEP_BLOCK_BACK || s.kind == STEP_EMBED_GRAD;
}

/* Embedding rows per rank in chunk c: k, the last one what is left of R. */
static size_t chunk_rows(const struct zero *z, int c)
{
    const size_t k = z->plan.chunk_rows, first = (size_t)c * k;
    return z->plan.rows - first < k ? z->plan.rows - first : k;
}

/* A step's span in the shard buffers: where this rank's part starts and
 * the floats each rank holds. */
static void step_span(const struct zero *z, struct zero_step s, size_t *at, size_t *count)
{
    const size_t C = (size_t)z->g->cfg.C;
    if (is_chunk(s)) {
        *at = z->plan.off[0] + (size_t)s.i * z->plan.chunk_rows * C;
        *count = chunk_rows(z, s.i) * C;
        return;
    }
    int u = s.kind == STEP_BLOCK || s.kind == STEP_BLOCK_BACK ? s.i + 1 : z->g->cfg.L + 1;
    *at = z->plan.off[u];
    *count = z->plan.shard[u];
}

/* Step s with its gathered parameters p and its gradient d (world * count
 * floats each). A chunk arrives as one window per rank: rank r's part is
 * rows [r*R + c*k, ... + n) of unit 0, at r*n*C floats into the slot. */
static void compute(struct zero *z, struct zero_step s, const float *p, float *d)
{
    struct gpt *g = z->g;
    switch (s.kind) {
    case STEP_BLOCK: block_forward(g, s.i, p); return;
    case STEP_NORM: head_norm_forward(g, p); return;
    case STEP_NORM_BACK: head_norm_backward(g, d, p); return;
    case STEP_BLOCK_BACK: block_backward(g, s.i, d, p); return;
    default: break;
    }
    const size_t n = chunk_rows(z, s.i), C = (size_t)g->cfg.C;
    for (int r = 0; r < z->world; r++) {
        const size_t first = (size_t)r * z->plan.rows + (size_t)s.i * z->plan.chunk_rows;
        const size_t at = (size_t)r * n * C;
        switch (s.kind) {
        case STEP_LOOKUP: embed_forward_rows(g, p + at, first, n); break;
        case STEP_LOGITS: head_forward_rows(g, p + at, first, n); break;
        case STEP_HEAD_BACK: head_backward_rows(g, p + at, first, n); break;
        case STEP_EMBED_GRAD: embed_backward_rows(g, d + at, first, n); break;
        default: break;
        }
    }
}

/* Queues a gather of step s's parameters into slot k. */
static void fetch(struct zero *z, struct zero_step s, int k)
{
    struct zero_job j = {.kind = ZERO_GATHER, .buf = z->slot[k]};
    step_span(z, s, &j.at, &j.count);
    z->slot_job[k] = submit(z, j);
}

/* Waits until slot k's last job is done: then the training thread may use it. */
static int take(struct zero *z, int k) { return wait_for(z, z->slot_job[k]); }

/*
 * Runs a pass of n steps through the slots. Step j+1's parameters are
 * gathered while step j computes, and step j's gradient is reduce-scattered
 * while step j+1 computes. The slots turn, (params, next, grad) <- (next,
 * grad, params): the next step's parameters are gathered into the slot whose
 * gradient was just submitted (the comm thread reduces it first: it keeps
 * the order), and the next gradient is written where these parameters were.
 * Returns once every job of the pass is done.
 */
static int run_pass(struct zero *z, zero_pass_fn step, int n)
{
    int p = 0, q = 1, d = 2, rc = 0;
    if (n > 0 && gathers(step(z, 0)))
        fetch(z, step(z, 0), p);
    for (int j = 0; j < n && rc == 0; j++) {
        struct zero_step s = step(z, j);
        if (gathers(s) && (rc = take(z, p)) != 0)
            break;
        if (j + 1 < n && gathers(step(z, j + 1)))
            fetch(z, step(z, j + 1), q);
        struct zero_job red = {.kind = ZERO_REDUCE, .buf = z->slot[d]};
        if (makes_gradient(s)) {
            if ((rc = take(z, d)) != 0)
                break;
            step_span(z, s, &red.at, &red.count);
            memset(red.buf, 0, sizeof(float) * (size_t)z->world * red.count);
        }
        compute(z, s, z->slot[p], z->slot[d]);
        if (makes_gradient(s))
            z->slot_job[d] = submit(z, red);
        int t = p;
        p = q;
        q = d;
        d = t;
    }
    int drained = wait_for(z, z->submitted);
    return rc ? rc : drained;
}

int zero_forward(struct zero *z, const int *inputs, const int *targets, int B, int T,
                 double *loss)
{
    struct gpt *g = z->g;
    const int L = g->cfg.L;
    gpt_set_batch(g, inputs, targets, B, T);
    if (!z->comm) {
        embed_forward(g, own(z, z->params, 0));
        for (int l = 0; l < L; l++)
            block_forward(g, l, own(z, z->params, l + 1));
        *loss = head_forward(g, own(z, z->params, L + 1), own(z, z->params, 0), targets != NULL);
        return 0;
    }
    embed_forward_begin(g);
    int rc = run_pass(z, forward_step, forward_steps(z));
    *loss = rc == 0 ? head_loss(g, targets != NULL) : 0.0;
    return rc;
}

int zero_backward(struct zero *z, float scale)
{
    struct gpt *g = z->g;
    const int L = g->cfg.L;
    const float dloss = scale / (float)(g->B * g->T);
    if (!z->comm) {
        head_backward(g, own(z, z->grads, L + 1), own(z, z->params, L + 1), own(z, z->params, 0),
                      dloss);
        for (int l = L - 1; l >= 0; l--)
            block_backward(g, l, own(z, z->grads, l + 1), own(z, z->params, l + 1));
        embed_backward(g, own(z, z->grads, 0));
        return 0;
    }
    head_backward_begin(g, dloss);
    return run_pass(z, backward_step, backward_steps(z));
}

void zero_zero_grad(struct zero *z) { memset(z->grads, 0, sizeof(float) * z->plan.total); }

int zero_grad_norm(struct zero *z, double *norm)
{
    double ss = sum_squares(z->grads, z->plan.total); /* padding is zero */
    int rc = zero_sum(z, &ss);
    *norm = sqrt(ss);
    return rc;
}

int zero_keep_previous(struct zero *z)
{
    if (z->alt_params)
        return 0;
    z->alt_params = calloc(3 * z->plan.total, sizeof(float));
    if (!z->alt_params)
        return -ENOMEM;
    z->alt_m = z->alt_params + z->plan.total;
    z->alt_v = z->alt_params + 2 * z->plan.total;
    return 0;
}

static void swap_state(struct zero *z)
{
    float *p = z->params, *m = z->m, *v = z->v;
    z->params = z->alt_params;
    z->m = z->alt_m;
    z->v = z->alt_v;
    z->alt_params = p;
    z->alt_m = m;
    z->alt_v = v;
}

void zero_revert(struct zero *z)
{
    if (z->alt_params)
        swap_state(z);
}

void zero_adamw(struct zero *z, const struct adamw *h, float gscale)
{
    /* Kept: written into the other buffers, which become the current ones,
     * and the state before this update stays whole where it was. */
    const int keep = z->keep_next && z->alt_params;
    float *p_out = keep ? z->alt_params : z->params, *m_out = keep ? z->alt_m : z->m;
    float *v_out = keep ? z->alt_v : z->v;
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    for (int u = 0; u < z->g->layout.nunits; u++) {
        size_t lo, n;
        zero_owned(z, u, &lo, &n);
        int nt = gpt_unit_tensors(&z->g->cfg, u, t);
        for (int i = 0; i < nt; i++) {
            size_t a = t[i].offset > lo ? t[i].offset : lo;
            size_t b = t[i].offset + t[i].numel < lo + n ? t[i].offset + t[i].numel : lo + n;
            if (a >= b)
                continue;
            size_t o = z->plan.off[u] + (a - lo);
            adamw_update_into(z->params + o, z->grads + o, z->m + o, z->v + o, p_out + o, m_out + o, v_out + o,
                              b - a, h, t[i].decay, gscale);
        }
    }
    if (keep)
        swap_state(z);
    z->keep_next = 0;
}

/* ---- small collectives ---- */

static int raw_gather(struct zero *z, const void *send, void *recv, size_t floats)
{
    return wait_for(z, submit(z, (struct zero_job){.kind = ZERO_RAW_GATHER, .send = send,
                                                    .buf = recv, .count = floats}));
}

int zero_sum(struct zero *z, double *x)
{
    if (!z->comm)
        return 0;
    double *all = calloc((size_t)z->world, sizeof(double));
    if (!all)
        return -ENOMEM;
    int rc = raw_gather(z, x, all, sizeof(double) / sizeof(float));
    if (rc == 0) {
        double s = 0;
        for (int r = 0; r < z->world; r++)
            s += all[r];
        *x = s;
    }
    free(all);
    return rc;
}

int zero_gather_u64(struct zero *z, const uint64_t *mine, size_t n, uint64_t *all)
{
    if (!z->comm) {
        memcpy(all, mine, sizeof(uint64_t) * n);
        return 0;
    }
    return raw_gather(z, mine, all, n * (sizeof(uint64_t) / sizeof(float)));
}

/* A 64-bit mix of a global index (splitmix64's finaliser). */
static uint64_t mix64(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

int zero_fingerprint(struct zero *z, uint64_t *out)
{
    const struct gpt_layout *lay = &z->g->layout;
    const float *src[3] = {z->params, z->m, z->v};
    uint64_t mine = 0;
    for (int u = 0; u < lay->nunits; u++) {
        size_t lo, n;
        zero_owned(z, u, &lo, &n);
        for (size_t i = 0; i < n; i++) {
            uint64_t g = (uint64_t)(lay->offset[u] + lo + i);
            for (int k = 0; k < 3; k++) {
                uint32_t bits;
                memcpy(&bits, &src[k][z->plan.off[u] + i], sizeof(bits));
                mine += mix64(3 * g + (uint64_t)k) * ((uint64_t)bits + 1);
            }
        }
    }
    uint64_t *all = calloc((size_t)z->world, sizeof(uint64_t));
    if (!all)
        return -ENOMEM;
    int rc = zero_gather_u64(z, &mine, 1, all);
    uint64_t sum = 0;
    for (int r = 0; rc == 0 && r < z->world; r++)
        sum += all[r];
    free(all);
    *out = sum;
    return rc;
}

double zero_take_wait(struct zero *z)
{
    double w = z->wait_s;
    z->wait_s = 0;
    return w;
}
