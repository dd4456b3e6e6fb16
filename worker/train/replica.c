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

/* Steps a survivor has its own state at: its current one and its snapshot's. */
static int own_has(const uint64_t *o, long t)
{
    return o[OFFER_HAS_STATE] && ((long)o[OFFER_STEP] == t || (o[OFFER_SNAP] && (long)o[OFFER_SNAP] - 1 == t));
}

/* The slot of a holder's offer with the replica of step t: 0, 1, or -1. */
static int slot_with(const uint64_t *o, long t)
{
    if (o[OFFER_SLOT0] && (long)o[OFFER_SLOT0] - 1 == t)
        return 0;
    if (o[OFFER_SLOT1] && (long)o[OFFER_SLOT1] - 1 == t)
        return 1;
    return -1;
}

int replica_plan(const uint64_t *all, int world, const int *pos, struct replica_plan *plan, struct replica_src *src)
{
    memset(plan, 0, sizeof(*plan));
    plan->step = -1;
    plan->lost = -1;
    plan->last_checkpoint = -1;
    long hi = -1, lo = -1;
    int w0 = 0, first = -1;
    for (int r = 0; r < world; r++) {
        const uint64_t *o = offer_of(all, r);
        if (o[OFFER_CKPT] && (long)o[OFFER_CKPT] - 1 > plan->last_checkpoint)
            plan->last_checkpoint = (long)o[OFFER_CKPT] - 1;
        if (!o[OFFER_HAS_STATE])
            continue;
        if (first < 0) {
            first = r;
            plan->seed = o[OFFER_SEED];
            w0 = (int)o[OFFER_OLD_WORLD];
        }
        /* every survivor held a shard of the same model in the same world */
        if (o[OFFER_FLOATS] != offer_of(all, first)[OFFER_FLOATS] || (int)o[OFFER_OLD_WORLD] != w0 ||
            o[OFFER_OLD_RANK] < 1 || (int)o[OFFER_OLD_RANK] > w0)
            return -EINVAL;
        plan->survivors++;
        long step = (long)o[OFFER_STEP], snap = o[OFFER_SNAP] ? (long)o[OFFER_SNAP] - 1 : step;
        hi = step > hi ? step : hi;
        lo = lo < 0 || snap < lo ? snap : lo;
        lo = step < lo ? step : lo;
    }
    if (plan->survivors == 0)
        return 0; /* a fresh start: nothing in memory */
    if (w0 < 1 || w0 > REPLICA_MAX_WORLD)
        return -EINVAL;
    plan->old_world = w0;
    /* For each old rank: the survivor that was it, and a survivor holding its replicas. */
    int *own = malloc(sizeof(int) * (size_t)w0), *hold = malloc(sizeof(int) * (size_t)w0);
    if (!own || !hold) {
        free(own);
        free(hold);
        return -ENOMEM;
    }
    for (int o = 0; o < w0; o++)
        own[o] = hold[o] = -1;
    for (int r = 0; r < world; r++) {
        const uint64_t *o = offer_of(all, r);
        if (!o[OFFER_HAS_STATE])
            continue;
        own[o[OFFER_OLD_RANK] - 1] = r;
        if (o[OFFER_PARTNER] >= 1 && (int)o[OFFER_PARTNER] <= w0)
            hold[o[OFFER_PARTNER] - 1] = r;
    }
    /* The ranks are within one round of each other: trying every step from the
     * highest down to the lowest any survivor still has finds the latest common one. */
    for (long t = hi; t >= lo && t >= 0; t--) {
        int ok = 1, missing = -1;
        for (int o = 0; o < w0 && ok; o++) {
            if (own[o] >= 0 && own_has(offer_of(all, own[o]), t))
                continue;
            if (hold[o] >= 0 && slot_with(offer_of(all, hold[o]), t) >= 0)
                continue;
            ok = 0;
            missing = o;
        }
        if (!ok) {
            if (plan->lost < 0 || own[missing] < 0)
                plan->lost = missing;
            continue;
        }
        plan->step = t;
        plan->lost = -1;
        for (int o = 0; o < w0; o++) {
            if (own[o] >= 0 && own_has(offer_of(all, own[o]), t)) {
                src[o].rank = own[o];
                src[o].kind = (long)offer_of(all, own[o])[OFFER_STEP] == t ? SRC_OWN : SRC_SNAP;
                src[o].slot = -1;
            } else {
                src[o].rank = hold[o];
                src[o].kind = SRC_HOLDER;
                src[o].slot = slot_with(offer_of(all, hold[o]), t);
            }
        }
        break;
    }
    free(own);
    free(hold);
    if (plan->step < 0)
        return 0;
    /* In place: the same world, every survivor at its old rank, and each
     * replaced rank's holder just after it on the ring (a shift back reaches
     * it); else the state is re-sliced (replica_reslice). */
    plan->in_place = w0 == world;
    for (int r = 0; r < world && plan->in_place; r++) {
        const uint64_t *o = offer_of(all, r);
        if (o[OFFER_HAS_STATE] && (int)o[OFFER_OLD_RANK] - 1 != r)
            plan->in_place = 0;
    }
    for (int o = 0; o < w0 && plan->in_place; o++) {
        if (src[o].kind != SRC_HOLDER)
            continue;
        int next = -1;
        for (int r = 0; r < world; r++)
            if (pos[r] == (pos[o] + 1) % world)
                next = r;
        plan->in_place = next == src[o].rank;
    }
    return 0;
}

/* ---- the replica thread ---- */

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
    /* weights and moments are one block (replica_store), not written before the step's update, which waits for this */
    const size_t bytes = 3 * r->floats * sizeof(float);
    rc = comm_shift(r->comm, r->block, bytes, r->slot[k], bytes);
    if (rc)
        return rc;
    pthread_mutex_lock(&r->mu);
    r->slot_step[k] = step;
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
        r->busy = 0;
        pthread_cond_broadcast(&r->cv);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

/* ---- the CPU trainer's store: its shard buffers (zero.h) ---- */

/* The round sends the current block itself; the step's update is written
 * into the second buffers (keep_next), so the block stays as the snapshot. */
static const float *zero_round(void *arg, long step)
{
    struct zero *z = arg;
    (void)step;
    z->keep_next = 1;
    return z->params;
}

static void zero_keep(void *arg, int keep)
{
    struct zero *z = arg;
    if (!keep)
        z->keep_next = 0;
}

static int zero_back(void *arg)
{
    zero_revert(arg);
    return 0;
}

static float *zero_inbox(void *arg) { return ((struct zero *)arg)->params; }

static int zero_received(void *arg)
{
    (void)arg;
    return 0;
}

/* ---- the trainer's side ---- */

int replica_init(struct replica *r, struct zero *z, int every, int rank)
{
    const struct replica_store store = {zero_round, zero_keep, zero_back, zero_inbox, zero_received, z};
    if (zero_keep_previous(z) != 0)
        return -ENOMEM;
    return replica_init_store(r, z->plan.total, every, rank, &store);
}

int replica_init_store(struct replica *r, size_t floats, int every, int rank, const struct replica_store *store)
{
    memset(r, 0, sizeof(*r));
    r->store = *store;
    r->every = every;
    r->rank = rank;
    r->floats = floats;
    r->snap_step = r->snap_pending = r->slot_step[0] = r->slot_step[1] = -1;
    r->partner = -1;
    r->want = -1;
    r->slot[0] = malloc(3 * r->floats * sizeof(float));
    r->slot[1] = malloc(3 * r->floats * sizeof(float));
    if (!r->slot[0] || !r->slot[1]) {
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
    free(r->slot[0]);
    free(r->slot[1]);
    r->slot[0] = r->slot[1] = NULL;
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
    /* The store sets the state of `step` aside: this step's update keeps it as the snapshot. */
    if (!r->busy && !r->rc && !(r->block = r->store.round(r->store.arg, step))) {
        r->rc = -EIO; /* the peers wait for a round this rank cannot make: the generation is over */
    } else if (!r->busy && !r->rc) {
        r->busy = 1;
        r->want = step;
        pthread_cond_broadcast(&r->cv);
        r->snap_pending = step;
    }
    pthread_mutex_unlock(&r->mu);
}

void replica_updated(struct replica *r)
{
    if (!r || r->snap_pending < 0)
        return;
    r->store.keep(r->store.arg, 1);
    r->snap_step = r->snap_pending;
    r->snap_pending = -1;
}

int replica_wait(struct replica *r)
{
    if (!r)
        return 0;
    pthread_mutex_lock(&r->mu);
    while (r->busy)
        pthread_cond_wait(&r->cv, &r->mu);
    int rc = r->rc;
    pthread_mutex_unlock(&r->mu);
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
    r->snap_step = r->snap_pending = -1;
    r->store.keep(r->store.arg, 0);
    for (int k = 0; k < 2; k++)
        if (keep < 0 || r->slot_step[k] > keep)
            r->slot_step[k] = -1;
    if (r->slot_step[0] < 0 && r->slot_step[1] < 0)
        r->partner = -1;
    pthread_mutex_unlock(&r->mu);
}

void replica_offer(const struct replica *r, int survivor, int old_rank, int old_world, size_t floats, long step,
                   int node_rank, int local_rank, uint64_t seed, long last_checkpoint, uint64_t offer[REPLICA_OFFER])
{
    memset(offer, 0, sizeof(uint64_t) * REPLICA_OFFER);
    offer[OFFER_NODE] = (uint64_t)node_rank;
    offer[OFFER_LOCAL] = (uint64_t)local_rank;
    offer[OFFER_SEED] = seed;
    offer[OFFER_CKPT] = last_checkpoint >= 0 ? (uint64_t)last_checkpoint + 1 : 0;
    if (!survivor)
        return;
    offer[OFFER_HAS_STATE] = 1;
    offer[OFFER_STEP] = (uint64_t)step;
    offer[OFFER_OLD_RANK] = (uint64_t)old_rank + 1;
    offer[OFFER_OLD_WORLD] = (uint64_t)old_world;
    offer[OFFER_FLOATS] = floats;
    if (!r)
        return;
    offer[OFFER_SNAP] = r->snap_step >= 0 ? (uint64_t)r->snap_step + 1 : 0;
    offer[OFFER_PARTNER] = r->partner >= 0 ? (uint64_t)r->partner + 1 : 0;
    offer[OFFER_SLOT0] = r->slot_step[0] >= 0 ? (uint64_t)r->slot_step[0] + 1 : 0;
    offer[OFFER_SLOT1] = r->slot_step[1] >= 0 ? (uint64_t)r->slot_step[1] + 1 : 0;
}

int replica_restore(struct replica *r, const struct replica_plan *plan, const struct replica_src *src,
                    const int *pos, int world)
{
    const int me = r->rank;
    int rc = 0;
    if (src[me].kind == SRC_SNAP && src[me].rank == me)
        rc = r->store.revert(r->store.arg); /* the snapshot is the state of plan->step */
    if (rc)
        return rc;
    int prev = -1; /* the rank whose replicas this one holds */
    for (int q = 0; q < world && prev < 0; q++)
        if (pos[q] == (pos[me] + world - 1) % world)
            prev = q;
    int sends = prev >= 0 && prev != me && src[prev].kind == SRC_HOLDER && src[prev].rank == me;
    int gets = src[me].kind == SRC_HOLDER;
    const float *out = sends ? r->slot[src[prev].slot] : NULL;
    const size_t bytes = 3 * r->floats * sizeof(float); /* weights and moments: one block */
    rc = world > 1 ? comm_shift_back(r->comm, out, sends ? bytes : 0, gets ? r->store.inbox(r->store.arg) : NULL,
                                     gets ? bytes : 0) : 0;
    if (rc == 0 && gets)
        rc = r->store.received(r->store.arg);
    if (rc)
        return rc;
    /* Every rank is at plan->step: no snapshot until the next round's update. */
    replica_forget(r, gets ? -1 : plan->step);
    return 0;
}
