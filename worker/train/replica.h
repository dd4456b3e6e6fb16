/*
 * replica: a rank's shard state mirrored in a peer's memory, and the choice
 * of where a generation's state comes from (docs/training.md, "Healing in
 * place").
 *
 * The replica ring. Besides the training communicator, the ranks of a
 * generation form a second ring whose order interleaves the nodes: ranks
 * sorted by (local rank, node rank), so that a rank's successor on it is,
 * where the layout allows, on another node. That successor is the rank's
 * holder: it keeps the rank's replicas, and sends one back against the ring
 * (comm_shift_back) to a rank that replaces the one it held them for. The
 * same layout gives the same ring in every generation. The Python client
 * picks its buddies by another rule, and docs/training.md ("Two buddy
 * rules") says how they differ and why.
 *
 * A round, every `replicate_every` steps, at the start of the step after
 * step s: this rank's replica thread sends its state S_s (fp32 weights and
 * both AdamW moments, straight from the shard buffers; on the GPU from a
 * pinned host copy that a side stream made, see replica_store) to its holder while
 * it receives its predecessor's into one of two slots (the one not holding
 * the newest complete replica). The trainer waits for its own round (sent,
 * and received in full) before the first collective that ends the step
 * (replica_wait), and the step's update is written into the other buffers
 * (zero_adamw's keep_next), so that S_s stays whole as this rank's snapshot
 * until the next round's update, at no copy. Hence:
 *   - a rank that finished update s+1 passed that step's closing
 *     collectives, which every rank entered after its round: every S_s is
 *     held by its holder;
 *   - ranks are at most one step apart (a step ends with collectives every
 *     rank must enter), and each survivor still has the state of the last
 *     round step before its current one.
 * So each survivor offers its current state and its snapshot, each holder
 * its two slots, and some step is offered for every rank unless a rank and
 * its holder were both lost.
 *
 * The plan (replica_plan, a pure function of what every rank offers): the
 * latest step t for which every rank's state exists, its own (current or
 * snapshot) or, for a replaced rank, a live holder's slot; ranks then go
 * back to t where they must, and holders ship replicas to replaced ranks
 * along the replica ring. No such step: every rank loads the last committed
 * checkpoint, or starts from the seed when there is none.
 */
#ifndef MUSTER_TRAIN_REPLICA_H
#define MUSTER_TRAIN_REPLICA_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct comm;
struct zero;

/* What one rank offers when a generation forms: REPLICA_OFFER u64s, gathered. */
enum {
    OFFER_HAS_STATE,   /* 1: a survivor, with its state */
    OFFER_STEP,        /* its current step */
    OFFER_SNAP,        /* its snapshot's step + 1; 0 = none */
    OFFER_PARTNER,     /* global rank + 1 whose replicas it holds; 0 = none */
    OFFER_SLOT0,       /* step + 1 of the replica in slot 0; 0 = none */
    OFFER_SLOT1,
    OFFER_NODE,        /* its node's rank (ASSIGN node_rank) */
    OFFER_LOCAL,       /* its local rank */
    OFFER_FLOATS,      /* shard floats (zero total): must agree */
    OFFER_SEED,        /* the seed it trains with (a checkpoint may have set it) */
    OFFER_CKPT,        /* last committed checkpoint step + 1; 0 = none */
    OFFER_OLD_RANK,    /* survivors: its rank + 1 in the generation its state is of */
    OFFER_OLD_WORLD,   /* survivors: that generation's world size */
    OFFER_MICRO,       /* the micro-batch it trains with in this generation: must agree (set by the
                        * caller, not by replica_offer; replica_plan ignores it) */
    REPLICA_OFFER
};

enum replica_source {
    SRC_OWN,      /* the survivor that was the rank: its current state */
    SRC_SNAP,     /* the survivor that was the rank: its snapshot */
    SRC_HOLDER,   /* a survivor holding the rank's replica */
};

/* Where the state of one rank of the old generation comes from. */
struct replica_src {
    enum replica_source kind;
    int rank;     /* the survivor (a rank of the new generation) that has it */
    int slot;     /* SRC_HOLDER: its slot */
};

#define REPLICA_MAX_WORLD 65536

struct replica_plan {
    long step;                 /* t; -1: no step in memory for every rank */
    int old_world;             /* the survivors' generation's world size */
    int in_place;              /* same ranks: replica_restore; else replica_reslice */
    int lost;                  /* when step is -1: a rank no one holds (-1: none) */
    uint64_t seed;             /* a survivor's seed (replaced ranks adopt it) */
    long last_checkpoint;      /* highest committed checkpoint any survivor knows; -1 */
    int survivors;
};

/* Replica-ring position of every rank: sorted by (local rank, node rank). pos[r]
 * for global rank r; all holds REPLICA_OFFER u64s per rank. 0 or -ENOMEM. */
int replica_positions(const uint64_t *all, int world, int *pos);

/*
 * The plan from every rank's offer (all: world x REPLICA_OFFER, the new
 * generation's ranks). The state to assemble is that of the survivors'
 * generation, old_world ranks: for each old rank o, src[o] (old_world
 * entries; at most REPLICA_MAX_WORLD) says which new rank has it at the
 * plan's step, its own or a replica. pos: the new generation's replica-ring
 * positions (for in_place). Returns 0 (plan->step -1: none), -EINVAL when
 * the survivors disagree (another model, another world), or -ENOMEM.
 */
int replica_plan(const uint64_t *all, int world, const int *pos, struct replica_plan *plan, struct replica_src *src);

/*
 * Where a rank's state lives, as the rounds see it: the CPU trainer's shard
 * buffers (replica_init: the block of weights and moments is sent in place,
 * and the snapshot is the zero's second buffers), or the GPU trainer's
 * device state through pinned host copies (worker/train/gpu/gpu_train.c).
 * The callbacks run on the training thread and get arg.
 */
struct replica_store {
    /* The round of `step` begins: the block (weights, m, v: 3 x floats)
     * that holds the state of `step`, whole until that step's update, kept
     * or not (NULL: the round cannot be made; replica_wait then fails with
     * -EIO) */
    const float *(*round)(void *arg, long step);
    /* keep 1: the update after round() was made and kept its block as the
     * snapshot; keep 0: whatever round() set aside is dropped */
    void (*keep)(void *arg, int keep);
    /* The snapshot becomes the current state. 0 or an error. */
    int (*revert)(void *arg);
    /* Where this rank's state received from its holder goes (3 x floats),
     * and what makes it current once there. 0 or an error. */
    float *(*inbox)(void *arg);
    int (*received)(void *arg);
    void *arg;
};

struct replica {
    struct replica_store store;
    const float *block;        /* what the round under way sends */
    int every;                 /* steps between rounds */
    size_t floats;             /* per buffer: the shard's total */
    /* this rank's snapshot (the store keeps it) */
    long snap_step;            /* its step; -1: none */
    long snap_pending;         /* the step whose update will keep it; -1 */
    /* the predecessor's replicas: two slots of 3 x floats */
    float *slot[2];
    long slot_step[2];         /* -1: empty or being written */
    int partner;               /* global rank whose replicas the slots hold; -1 */
    /* the replica ring of this generation */
    struct comm *comm;
    int rank;                  /* global */
    /* the replica thread */
    pthread_t thread;
    int started;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    long want;                 /* step whose round is asked for; -1: none */
    int busy;                  /* a round is under way or asked for */
    int quit;
    int rc;                    /* the last round's error; sticky until replica_attach */
};

/* Buffers for z's shards (every > 0: two replica slots, and the zero's
 * second buffers for the snapshot) and the thread. 0 or -ENOMEM. */
int replica_init(struct replica *r, struct zero *z, int every, int rank);
/* The same for a state of `floats` per buffer kept by store (copied). */
int replica_init_store(struct replica *r, size_t floats, int every, int rank, const struct replica_store *store);
void replica_free(struct replica *r);

/* The replica ring of a new generation (NULL: no rounds). */
void replica_attach(struct replica *r, struct comm *comm);
/* Waits until no round is under way (abort the ring first to cut one short)
 * and lets go of the ring; returns it for the caller to destroy. */
struct comm *replica_detach(struct replica *r);

/* Start of a step, with the state of `step` steps complete: starts the
 * round of this step when one is due. */
void replica_begin(struct replica *r, long step);
/* Before the collective that ends the step: waits for the round under way.
 * 0, or the ring's error. */
int replica_wait(struct replica *r);
/* After the step's update: a kept update made the snapshot. */
void replica_updated(struct replica *r);
/* The round's error, if the last one failed (the generation is over). */
int replica_failed(struct replica *r);

/* Drops the snapshot, and the replicas of steps after `keep` (all: -1): what
 * they held belongs to a run that was abandoned. */
void replica_forget(struct replica *r, long keep);

/* This rank's offer. survivor: it brings the state of old_rank of a world of
 * old_world (floats per shard) at `step` from the generation before; r: its
 * replicas then (NULL: none); node_rank and local_rank: its new place. */
void replica_offer(const struct replica *r, int survivor, int old_rank, int old_world, size_t floats, long step,
                   int node_rank, int local_rank, uint64_t seed, long last_checkpoint, uint64_t offer[REPLICA_OFFER]);

/*
 * Carries out an in_place plan on this rank (collective on the replica
 * ring): a survivor going back makes its snapshot current (zero_revert); a
 * holder of a replaced rank sends it the slot of plan->step back along the
 * ring; a replaced rank receives its state. 0 or a comm error.
 */
int replica_restore(struct replica *r, const struct replica_plan *plan, const struct replica_src *src,
                    const int *pos, int world);

#endif
