#include "worker/train/replica.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"
#include "worker/train/comm/comm.h"
#include "worker/train/zero.h"

#define ROUND_MAGIC 0x4d52504cu /* "MRPL" */

/* What travels ahead of a replica, so the holder knows whose state of which step it got. */
struct round_header {
    uint32_t magic;
    uint32_t rank;
    uint64_t step;
    uint64_t floats;
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* ---- the plan ---- */

static const uint64_t *offer_of(const uint64_t *all, int r) { return all + (size_t)r * REPLICA_OFFER; }

struct pos_key {
    uint64_t local, node;
    int rank;
};

static int cmp_key(const void *x, const void *y)
{
    const struct pos_key *a = x, *b = y;
    if (a->local != b->local)
        return a->local < b->local ? -1 : 1;
    if (a->node != b->node)
        return a->node < b->node ? -1 : 1;
    return a->rank < b->rank ? -1 : a->rank > b->rank;
}

int replica_positions(const uint64_t *all, int world, int *pos)
{
    struct pos_key *k = malloc(sizeof(*k) * (size_t)world);
    if (!k)
        return -ENOMEM;
    for (int r = 0; r < world; r++)
        k[r] = (struct pos_key){offer_of(all, r)[OFFER_LOCAL], offer_of(all, r)[OFFER_NODE], r};
    qsort(k, (size_t)world, sizeof(*k), cmp_key);
    for (int p = 0; p < world; p++)
        pos[k[p].rank] = p;
    free(k);
    return 0;
}

/* Steps rank r can have its own state at (survivors): its current one and its snapshot's. */
static int own_has(const uint64_t *o, long t)
{
    return o[OFFER_HAS_STATE] && ((long)o[OFFER_STEP] == t || (o[OFFER_SNAP] && (long)o[OFFER_SNAP] - 1 == t));
}

/* A live holder of rank r's replica of step t: the survivor just after r on the ring. */
static int holder_has(const uint64_t *all, const int *pos, const int *at, int world, int r, long t)
{
    int h = at[(pos[r] + 1) % world];
    if (h == r)
        return 0;
    const uint64_t *o = offer_of(all, h);
    return o[OFFER_HAS_STATE] && o[OFFER_PARTNER] == (uint64_t)r + 1 &&
           ((o[OFFER_SLOT0] && (long)o[OFFER_SLOT0] - 1 == t) || (o[OFFER_SLOT1] && (long)o[OFFER_SLOT1] - 1 == t));
}

int replica_plan(const uint64_t *all, int world, const int *pos, struct replica_plan *plan,
                 enum replica_source *src_of)
{
    memset(plan, 0, sizeof(*plan));
    plan->step = -1;
    plan->lost = -1;
    plan->last_checkpoint = -1;
    long hi = -1;
    for (int r = 0; r < world; r++) {
        const uint64_t *o = offer_of(all, r);
        if (o[OFFER_FLOATS] != offer_of(all, 0)[OFFER_FLOATS])
            return -EINVAL;
        if (o[OFFER_CKPT] && (long)o[OFFER_CKPT] - 1 > plan->last_checkpoint)
            plan->last_checkpoint = (long)o[OFFER_CKPT] - 1;
        if (!o[OFFER_HAS_STATE])
            continue;
        if (!plan->survivors++)
            plan->seed = o[OFFER_SEED];
        if ((long)o[OFFER_STEP] > hi)
            hi = (long)o[OFFER_STEP];
    }
    if (plan->survivors == 0)
        return 0; /* a fresh start: nothing in memory */
    int *at = malloc(sizeof(int) * (size_t)world); /* the rank at each position */
    if (!at)
        return -ENOMEM;
    for (int r = 0; r < world; r++)
        at[pos[r]] = r;
    /* Candidates: each survivor's current step and the one before its snapshot's;
     * the ranks are within one round of each other, so trying every step from
     * the highest down over a short range finds the latest common one. */
    long lo = hi;
    for (int r = 0; r < world; r++) {
        const uint64_t *o = offer_of(all, r);
        if (o[OFFER_HAS_STATE] && o[OFFER_SNAP] && (long)o[OFFER_SNAP] - 1 < lo)
            lo = (long)o[OFFER_SNAP] - 1;
        if (o[OFFER_HAS_STATE] && (long)o[OFFER_STEP] < lo)
            lo = (long)o[OFFER_STEP];
    }
    for (long t = hi; t >= lo && t >= 0; t--) {
        int ok = 1, missing = -1;
        for (int r = 0; r < world && ok; r++) {
            if (own_has(offer_of(all, r), t))
                continue;
            if (!offer_of(all, r)[OFFER_HAS_STATE] && holder_has(all, pos, at, world, r, t))
                continue;
            ok = 0;
            missing = r;
        }
        if (!ok) {
            if (plan->lost < 0 || !offer_of(all, missing)[OFFER_HAS_STATE])
                plan->lost = missing;
            continue;
        }
        plan->step = t;
        plan->lost = -1;
        for (int r = 0; r < world; r++) {
            const uint64_t *o = offer_of(all, r);
            src_of[r] = !o[OFFER_HAS_STATE]            ? SRC_HOLDER
                        : (long)o[OFFER_STEP] == t      ? SRC_OWN
                                                        : SRC_SNAP;
        }
        break;
    }
    free(at);
    return 0;
}

/* ---- the replica thread ---- */

static int shift_state(struct replica *r, float *const out[3], float *const in[3])
{
    size_t bytes = r->floats * sizeof(float);
    for (int k = 0; k < 3; k++) {
        int rc = comm_shift(r->comm, out ? out[k] : NULL, out ? bytes : 0, in ? in[k] : NULL, in ? bytes : 0);
        if (rc)
            return rc;
    }
    return 0;
}

/* The slot to receive into: the one not holding the newest complete replica. */
static int older_slot(const struct replica *r)
{
    if (r->slot_step[0] < 0)
        return 0;
    if (r->slot_step[1] < 0)
        return 1;
    return r->slot_step[0] < r->slot_step[1] ? 0 : 1;
}

static int run_round(struct replica *r, long step)
{
    struct zero *z = r->z;
    struct round_header mine = {ROUND_MAGIC, (uint32_t)r->rank, (uint64_t)step, r->floats}, theirs;
    int rc = comm_shift(r->comm, &mine, sizeof(mine), &theirs, sizeof(theirs));
    if (rc)
        return rc;
    if (theirs.magic != ROUND_MAGIC || theirs.floats != r->floats || theirs.step != (uint64_t)step) {
        log_error("replica round of step %ld: the predecessor sent step %llu of %llu floats (want %zu)", step,
                  (unsigned long long)theirs.step, (unsigned long long)theirs.floats, r->floats);
        return -EPROTO;
    }
    pthread_mutex_lock(&r->mu);
    int k = older_slot(r);
    if (r->partner != (int)theirs.rank) { /* another predecessor: what the slots held is not its */
        r->slot_step[0] = r->slot_step[1] = -1;
        r->partner = (int)theirs.rank;
    }
    r->slot_step[k] = -1; /* being overwritten */
    pthread_mutex_unlock(&r->mu);
    float *out[3] = {z->params, z->m, z->v};
    float *in[3] = {r->slot[k], r->slot[k] + r->floats, r->slot[k] + 2 * r->floats};
    rc = shift_state(r, out, in);
    if (rc)
        return rc;
    /* The slot holds the predecessor's whole state of `step`: offered from now
     * on, even if the barrier fails. A rank that gets through the barrier
     * moves its snapshot past step - every, so a generation broken during
     * the barrier can only go back to `step`, and must find this slot. */
    pthread_mutex_lock(&r->mu);
    r->slot_step[k] = step;
    pthread_mutex_unlock(&r->mu);
    rc = comm_barrier(r->comm); /* every replica of this step is held */
    if (rc)
        return rc;
    /* Every rank has done update `step`: the snapshot may move on to it. */
    memcpy(r->snap, z->params, r->floats * sizeof(float));
    memcpy(r->snap + r->floats, z->m, r->floats * sizeof(float));
    memcpy(r->snap + 2 * r->floats, z->v, r->floats * sizeof(float));
    pthread_mutex_lock(&r->mu);
    r->snap_step = step;
    pthread_mutex_unlock(&r->mu);
    return 0;
}

static void *replica_thread(void *arg)
{
    struct replica *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->quit && r->want < 0)
            pthread_cond_wait(&r->cv, &r->mu);
        if (r->quit)
            break;
        long step = r->want;
        r->want = -1;
        pthread_mutex_unlock(&r->mu);
        int rc = r->comm ? run_round(r, step) : -ENOTCONN;
        pthread_mutex_lock(&r->mu);
        if (rc && !r->rc)
            r->rc = rc;
        if (!rc)
            r->rounds++;
        r->busy = 0;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- the trainer's side ---- */

int replica_init(struct replica *r, struct zero *z, int every, int rank)
{
    memset(r, 0, sizeof(*r));
    r->z = z;
    r->every = every;
    r->rank = rank;
    r->floats = z->total;
    r->snap_step = r->slot_step[0] = r->slot_step[1] = -1;
    r->partner = -1;
    r->want = -1;
    r->snap = malloc(3 * r->floats * sizeof(float));
    r->slot[0] = malloc(3 * r->floats * sizeof(float));
    r->slot[1] = malloc(3 * r->floats * sizeof(float));
    if (!r->snap || !r->slot[0] || !r->slot[1]) {
        replica_free(r);
        return -ENOMEM;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    if (pthread_create(&r->thread, NULL, replica_thread, r) != 0) {
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        replica_free(r);
        return -ENOMEM;
    }
    r->started = 1;
    return 0;
}

void replica_free(struct replica *r)
{
    if (r->started) {
        pthread_mutex_lock(&r->mu);
        r->quit = 1;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
        pthread_mutex_destroy(&r->mu);
        pthread_cond_destroy(&r->cv);
        r->started = 0;
    }
    free(r->snap);
    free(r->slot[0]);
    free(r->slot[1]);
    r->snap = r->slot[0] = r->slot[1] = NULL;
}

void replica_attach(struct replica *r, struct comm *comm)
{
    pthread_mutex_lock(&r->mu);
    r->comm = comm;
    r->rc = 0;
    pthread_mutex_unlock(&r->mu);
}

struct comm *replica_detach(struct replica *r)
{
    pthread_mutex_lock(&r->mu);
    while (r->busy)
        pthread_cond_wait(&r->cv, &r->mu);
    struct comm *c = r->comm;
    r->comm = NULL;
    pthread_mutex_unlock(&r->mu);
    return c;
}

void replica_begin(struct replica *r, long step)
{
    if (!r || !r->comm || r->every <= 0 || step % r->every != 0)
        return;
    pthread_mutex_lock(&r->mu);
    if (!r->busy && !r->rc) {
        r->busy = 1;
        r->want = step;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
}

int replica_wait(struct replica *r)
{
    if (!r)
        return 0;
    double t0 = now_s();
    pthread_mutex_lock(&r->mu);
    while (r->busy)
        pthread_cond_wait(&r->cv, &r->mu);
    int rc = r->rc;
    pthread_mutex_unlock(&r->mu);
    r->wait_s += now_s() - t0;
    return rc;
}

int replica_failed(struct replica *r)
{
    if (!r || !r->started)
        return 0;
    pthread_mutex_lock(&r->mu);
    int rc = r->rc;
    pthread_mutex_unlock(&r->mu);
    return rc;
}

void replica_forget(struct replica *r, long keep)
{
    pthread_mutex_lock(&r->mu);
    r->snap_step = -1;
    for (int k = 0; k < 2; k++)
        if (keep < 0 || r->slot_step[k] > keep)
            r->slot_step[k] = -1;
    if (r->slot_step[0] < 0 && r->slot_step[1] < 0)
        r->partner = -1;
    pthread_mutex_unlock(&r->mu);
}

void replica_offer(const struct replica *r, int survivor, long step, int node_rank, int local_rank,
                   uint64_t seed, long last_checkpoint, uint64_t offer[REPLICA_OFFER])
{
    memset(offer, 0, sizeof(uint64_t) * REPLICA_OFFER);
    offer[OFFER_HAS_STATE] = survivor != 0;
    offer[OFFER_STEP] = survivor ? (uint64_t)step : 0;
    offer[OFFER_NODE] = (uint64_t)node_rank;
    offer[OFFER_LOCAL] = (uint64_t)local_rank;
    offer[OFFER_SEED] = seed;
    offer[OFFER_CKPT] = last_checkpoint >= 0 ? (uint64_t)last_checkpoint + 1 : 0;
    if (!r)
        return;
    offer[OFFER_FLOATS] = r->floats;
    if (!survivor)
        return;
    offer[OFFER_SNAP] = r->snap_step >= 0 ? (uint64_t)r->snap_step + 1 : 0;
    offer[OFFER_PARTNER] = r->partner >= 0 ? (uint64_t)r->partner + 1 : 0;
    offer[OFFER_SLOT0] = r->slot_step[0] >= 0 ? (uint64_t)r->slot_step[0] + 1 : 0;
    offer[OFFER_SLOT1] = r->slot_step[1] >= 0 ? (uint64_t)r->slot_step[1] + 1 : 0;
}

int replica_restore(struct replica *r, const struct replica_plan *plan, const enum replica_source *src,
                    const int *pos, int world)
{
    struct zero *z = r->z;
    const int me = r->rank;
    const size_t bytes = r->floats * sizeof(float);
    float *shards[3] = {z->params, z->m, z->v};
    if (src[me] == SRC_SNAP)
        for (int k = 0; k < 3; k++)
            memcpy(shards[k], r->snap + (size_t)k * r->floats, bytes);
    int prev = -1; /* the rank whose replicas this one holds */
    for (int q = 0; q < world && prev < 0; q++)
        if (pos[q] == (pos[me] + world - 1) % world)
            prev = q;
    int sends = plan->step >= 0 && prev >= 0 && prev != me && src[prev] == SRC_HOLDER;
    int gets = src[me] == SRC_HOLDER;
    float *out[3] = {NULL, NULL, NULL};
    if (sends) {
        int k = r->slot_step[0] == plan->step ? 0 : 1;
        for (int i = 0; i < 3; i++)
            out[i] = r->slot[k] + (size_t)i * r->floats;
    }
    int rc = 0;
    if (world > 1)
        for (int k = 0; k < 3 && !rc; k++)
            rc = comm_shift_back(r->comm, out[k], sends ? bytes : 0, shards[k], gets ? bytes : 0);
    if (rc)
        return rc;
    /* The snapshot is the state of plan->step on every rank now; a replaced
     * rank holds no replica of anyone yet. */
    for (int k = 0; k < 3; k++)
        memcpy(r->snap + (size_t)k * r->floats, shards[k], bytes);
    replica_forget(r, gets ? -1 : plan->step);
    r->snap_step = plan->step;
    return 0;
}
