/*
 * rank: muster-train's side of the conversation with its agent, over the
 * socket the agent passes as MUSTER_CTL_FD (proto/ framing; see
 * proto/PROTOCOL.md). The agent sends ASSIGN right after spawning the rank;
 * global rank 0 creates the communicator's unique id and sends it up; every
 * rank receives the id of its generation back; heartbeats carry step, loss,
 * tokens/s, communication fraction, the time split of its latest window of
 * steps (compute against collective, from its own timers) and the last
 * committed checkpoint.
 *
 * A control thread owns the reading side: it answers COMMAND stop (and the
 * agent's death, seen as EOF) by raising the stop flag and calling the abort
 * hook (e.g. comm_abort, so a rank stuck in a collective returns at once);
 * COMMAND checkpoint by raising the caller's request count
 * (rank_ctl_on_checkpoint); other commands are logged and ignored. It also
 * sends the latest heartbeat every RANK_BEAT_MS, and at once when the first
 * step is reported. The training thread only calls rank_ctl_beat().
 */
#ifndef MUSTER_TRAIN_RANK_H
#define MUSTER_TRAIN_RANK_H

#include <signal.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "proto/proto.h"

#define RANK_BEAT_MS 500
/* The time split (proto.h: compute against collective, for musterd's
 * fail-slow rule) is reported over windows of at least this long. */
#define RANK_SPLIT_MS 1000u

struct rank_assign {
    uint64_t generation;
    int rank, world;             /* global */
    int local_rank, local_world; /* on this node */
    int node_rank, nnodes;       /* this node among the generation's */
    int device;                  /* device index the agent gave this rank */
    json_t *job;                 /* job spec object (a reference; rank_ctl_close drops it) */
};

struct rank_ctl;

/* True when this process was started by an agent (MUSTER_CTL_FD is set). */
int rank_ctl_present(void);

/*
 * Takes over MUSTER_CTL_FD, checks RANK / WORLD_SIZE / MUSTER_GENERATION
 * against the ASSIGN the agent sends (waiting at most timeout_ms), and
 * starts the control thread. stop is the caller's flag, which must outlive
 * the channel (a static): the control thread raises it on COMMAND stop or
 * EOF, and the caller's signal handler may raise it too without touching
 * anything this module frees. Returns 0 or a negative errno with the
 * reason in err.
 */
int rank_ctl_open(struct rank_ctl **out, struct rank_assign *assign, volatile sig_atomic_t *stop, int timeout_ms,
                  char *err, size_t errlen);

/*
 * Unique id of this generation's communicator. Rank 0 passes its own id
 * (mine != NULL), which is sent up; every rank then waits (at most
 * timeout_ms, or until stopped) for the id the daemon hands back and gets
 * it in out. Returns 0, -ETIMEDOUT, -ECANCELED when stopped, or -EAGAIN when
 * a newer generation came meanwhile (see rank_ctl_next_generation).
 */
int rank_ctl_unique_id(struct rank_ctl *c, const uint8_t mine[PROTO_UID_LEN], uint8_t out[PROTO_UID_LEN],
                       int timeout_ms);

/* Latest progress; sent by the control thread (and at once the first time). */
void rank_ctl_beat(struct rank_ctl *c, uint64_t step, double loss, double tokens_per_s, double comm_frac,
                   uint64_t checkpoint_step);

/* What the rank measured of its plan (docs/plan.md), sent with the next
 * heartbeat: bytes sent during its last step (0 = none / unknown) and its
 * peak memory in bytes (0 = unknown). */
void rank_ctl_measured(struct rank_ctl *c, uint64_t step_bytes, uint64_t peak_mem);

/* Called on the control thread, under its lock, when the communicator must
 * be aborted: the rank must stop (COMMAND stop, EOF) or a newer generation
 * came. Returns once no call of the previous hook is under way; fn NULL
 * removes it. */
void rank_ctl_on_abort(struct rank_ctl *c, void (*fn)(void *arg), void *arg);

/* COMMAND checkpoint of this generation raises *requests by one, on the
 * control thread (its only writer); the caller's training loop answers it at
 * the next step boundary. requests must outlive the channel (a static).
 * Without this call the command is logged and ignored. */
void rank_ctl_on_checkpoint(struct rank_ctl *c, volatile sig_atomic_t *requests);

/* COMMAND yield of the generation the rank works in (the job is about to
 * grow) sets *flag, on the control thread; the training loop leaves the
 * generation at the next step boundary, all ranks at the same one (the
 * step vote), and the rank calls rank_ctl_yielded: its heartbeat says
 * `yielded` (sent at once) until rank_ctl_next_generation, which clears
 * both. flag must outlive the channel (a static). */
void rank_ctl_on_yield(struct rank_ctl *c, volatile sig_atomic_t *flag);
void rank_ctl_yielded(struct rank_ctl *c);


/*
 * Rejoining in place (docs/training.md, "Healing in place"). After
 * rank_ctl_set_rejoin the rank's heartbeats say it can join the next
 * generation without a restart: COMMAND park and a newer ASSIGN that has a
 * slot for its local rank (device) abort the communicator (the abort hook)
 * instead of stopping the rank; its global rank and the world size may
 * change (the job grew or shrank). An ASSIGN without its slot stops it.
 * rank_ctl_next_generation waits (until stopped) for such a generation,
 * makes it the one this rank works in (its unique id, heartbeats and
 * checkpoint commands are that generation's from then on) and gives its
 * place in a (job NULL). Returns 0 or -ECANCELED when stopped.
 * rank_ctl_restored reports where the generation's state came from, and its
 * step, in the heartbeat (sent at once).
 */
void rank_ctl_set_rejoin(struct rank_ctl *c);
/* Non-zero once the rank is stopped or a generation newer than the one it
 * works in came (until rank_ctl_next_generation): for comm_init_cancelable. */
const atomic_int *rank_ctl_superseded(struct rank_ctl *c);
int rank_ctl_next_generation(struct rank_ctl *c, struct rank_assign *a);
void rank_ctl_restored(struct rank_ctl *c, enum proto_restore from, uint64_t step);

/* Stops the control thread, closes the socket, frees everything. */
void rank_ctl_close(struct rank_ctl *c);

#endif
