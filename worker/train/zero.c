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
    size_t S = z->shard[j->unit];
    float *mine = j->buf + (size_t)z->rank * S;
    int rc;
    switch (j->kind) {
    case ZERO_GATHER:
        memcpy(mine, z->params + z->off[j->unit], sizeof(float) * S);
        return comm_all_gather(z->comm, mine, j->buf, S, COMM_F32);
    case ZERO_REDUCE:
        rc = comm_reduce_scatter(z->comm, j->buf, mine, S, COMM_F32, COMM_AVG);
        if (rc == 0) {
            float *g = z->grads + z->off[j->unit];
            for (size_t i = 0; i < S; i++)
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

static unsigned long gather(struct zero *z, int unit, float *buf)
{
    return submit(z, (struct zero_job){.kind = ZERO_GATHER, .unit = unit, .buf = buf});
}

static unsigned long reduce(struct zero *z, int unit, float *buf)
{
    return submit(z, (struct zero_job){.kind = ZERO_REDUCE, .unit = unit, .buf = buf});
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
    struct zero_shards zs;
    zero_shards_init(&zs, &g->layout, z->world, 1);
    memcpy(z->shard, zs.shard, sizeof(z->shard));
    memcpy(z->off, zs.off, sizeof(z->off));
    z->total = zs.total;
    const size_t big = zs.max_shard * (size_t)z->world; /* largest block or norm unit, padded */
    /* weights and both moments back to back: one block that a replica round sends at once */
    z->params = calloc(3 * z->total, sizeof(float));
    z->m = z->params ? z->params + z->total : NULL;
    z->v = z->params ? z->params + 2 * z->total : NULL;
    z->grads = calloc(z->total, sizeof(float));
    int ok = z->params && z->m && z->v && z->grads;
    if (ok && z->comm) {
        size_t e = z->shard[0] * (size_t)z->world;
        z->embed = malloc(sizeof(float) * e);
        z->gembed = malloc(sizeof(float) * e);
        for (int k = 0; k < 2; k++) {
            z->slot[k] = malloc(sizeof(float) * big);
            z->gslot[k] = malloc(sizeof(float) * big);
            ok = ok && z->slot[k] && z->gslot[k];
        }
        ok = ok && z->embed && z->gembed;
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
    free(z->embed);
    free(z->gembed);
    for (int k = 0; k < 2; k++) {
        free(z->slot[k]);
        free(z->gslot[k]);
    }
    memset(z, 0, sizeof(*z));
}

size_t zero_model_state_bytes(const struct zero *z)
{
    struct zero_shards zs;
    zero_shards_init(&zs, &z->g->layout, z->world, 1);
    return zero_shards_state_bytes(&zs);
}

size_t zero_transient_bytes(const struct zero *z)
{
    struct zero_shards zs;
    zero_shards_init(&zs, &z->g->layout, z->world, 1);
    return zero_shards_transient_bytes(&zs);
}

void zero_owned(const struct zero *z, int unit, size_t *lo, size_t *n)
{
    size_t P = z->g->layout.numel[unit], S = z->shard[unit];
    *lo = (size_t)z->rank * S;
    *n = *lo >= P ? 0 : (P - *lo < S ? P - *lo : S);
}

void zero_init_weights(struct zero *z, uint64_t seed)
{
    for (int u = 0; u < z->g->layout.nunits; u++) {
        size_t lo, n;
        zero_owned(z, u, &lo, &n);
        gpt_init_range(&z->g->cfg, seed, u, lo, n, z->params + z->off[u]);
    }
}

/* ---- passes ---- */

static float *own(const struct zero *z, float *flat, int unit) { return flat + z->off[unit]; }

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
    /* unit u (1..L+1) goes to slot (u-1) % 2; the next one is gathered while
     * this one computes */
    unsigned long te = gather(z, 0, z->embed), ts[2] = {gather(z, 1, z->slot[0]), 0};
    wait_for(z, te);
    embed_forward(g, z->embed);
    for (int l = 0; l < L; l++) {
        int k = l % 2;
        wait_for(z, ts[k]);
        ts[!k] = gather(z, l + 2, z->slot[!k]);
        block_forward(g, l, z->slot[k]);
    }
    int rc = wait_for(z, ts[L % 2]);
    *loss = head_forward(g, z->slot[L % 2], z->embed, targets != NULL);
    return rc;
}

int zero_backward(struct zero *z, float scale)
{
    struct gpt *g = z->g;
    const int L = g->cfg.L;
    const float dloss = scale / (float)(g->B * g->T);
    if (!z->comm) {
        head_backward(g, own(z, z->grads, L + 1), own(z, z->grads, 0), own(z, z->params, L + 1),
                      own(z, z->params, 0), dloss);
        for (int l = L - 1; l >= 0; l--)
            block_backward(g, l, own(z, z->grads, l + 1), own(z, z->params, l + 1));
        embed_backward(g, own(z, z->grads, 0));
        return 0;
    }
    /* The forward left the norm unit in slot L % 2 and the last block in the
     * other slot. */
    const size_t W = (size_t)z->world;
    memset(z->gembed, 0, sizeof(float) * W * z->shard[0]);
    memset(z->gslot[0], 0, sizeof(float) * W * z->shard[L + 1]);
    head_backward(g, z->gslot[0], z->gembed, z->slot[L % 2], z->embed, dloss);
    unsigned long tg[2] = {reduce(z, L + 1, z->gslot[0]), 0}, ts[2] = {0, 0};
    int j = 1;
    for (int l = L - 1; l >= 0; l--) {
        int u = l + 1, k = l % 2;
        wait_for(z, ts[k]);
        if (u > 1)
            ts[!k] = gather(z, u - 1, z->slot[!k]);
        wait_for(z, tg[j]);
        memset(z->gslot[j], 0, sizeof(float) * W * z->shard[u]);
        block_backward(g, l, z->gslot[j], z->slot[k]);
        tg[j] = reduce(z, u, z->gslot[j]);
        j ^= 1;
    }
    embed_backward(g, z->gembed);
    return wait_for(z, reduce(z, 0, z->gembed));
}

void zero_zero_grad(struct zero *z) { memset(z->grads, 0, sizeof(float) * z->total); }

int zero_grad_norm(struct zero *z, double *norm)
{
    double ss = sum_squares(z->grads, z->total); /* padding is zero */
    int rc = zero_sum(z, &ss);
    *norm = sqrt(ss);
    return rc;
}

int zero_keep_previous(struct zero *z)
{
    if (z->alt_params)
        return 0;
    z->alt_params = calloc(3 * z->total, sizeof(float));
    if (!z->alt_params)
        return -ENOMEM;
    z->alt_m = z->alt_params + z->total;
    z->alt_v = z->alt_params + 2 * z->total;
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
            size_t o = z->off[u] + (a - lo);
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

int zero_reslice(struct zero *z, int old_world, int ncontrib, const float *const *mine, int nmine,
                 const int *from_rank, const int *from_index)
{
    const struct gpt_layout *lay = &z->g->layout;
    size_t old_total = 0, old_off[GPT_MAX_UNITS], old_shard[GPT_MAX_UNITS], big = 0;
    for (int u = 0; u < lay->nunits; u++) {
        old_shard[u] = (lay->numel[u] + (size_t)old_world - 1) / (size_t)old_world;
        old_off[u] = old_total;
        old_total += old_shard[u];
        big = old_shard[u] > big ? old_shard[u] : big;
    }
    const size_t per = (size_t)ncontrib * 3 * big; /* one rank's contribution, at most */
    float *send = calloc(per, sizeof(float));
    float *all = calloc(per * (size_t)z->world, sizeof(float));
    int rc = send && all ? 0 : -ENOMEM;
    float *dst[3] = {z->params, z->m, z->v};
    for (int u = 0; u < lay->nunits && rc == 0; u++) {
        const size_t S = old_shard[u], n = (size_t)ncontrib * 3 * S;
        memset(send, 0, n * sizeof(float));
        for (int c = 0; c < nmine; c++)
            for (int k = 0; k < 3; k++)
                memcpy(send + ((size_t)c * 3 + (size_t)k) * S, mine[c] + (size_t)k * old_total + old_off[u],
                       S * sizeof(float));
        if (z->comm)
            rc = raw_gather(z, send, all, n);
        else
            memcpy(all, send, n * sizeof(float));
        if (rc)
            break;
        size_t lo, cnt;
        zero_owned(z, u, &lo, &cnt);
        for (size_t i = 0; i < cnt; i++) {
            size_t g = lo + i, o = g / S, w = g % S;
            size_t base = ((size_t)from_rank[o] * (size_t)ncontrib + (size_t)from_index[o]) * 3 * S;
            for (int k = 0; k < 3; k++)
                dst[k][z->off[u] + i] = all[base + (size_t)k * S + w];
        }
    }
    free(send);
    free(all);
    return rc;
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
                memcpy(&bits, &src[k][z->off[u] + i], sizeof(bits));
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
