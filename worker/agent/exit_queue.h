/*
 * exit_queue: the RANK_EXITs the daemon may not have read yet. Pure logic:
 * no socket, no clock.
 *
 * A rank's exit is the one report that says why a generation failed, so it
 * must survive a stalled link. TCP delivers in order and the daemon answers
 * a HEARTBEAT that asks with one of the same seq (PROTO_HEARTBEAT, step 6
 * of proto/PROTOCOL.md; every heartbeat asks while this queue holds an
 * exit), so an exit sent before the heartbeat of seq s has been read once
 * the echo of s (or a later one) comes back on the same connection. Until
 * then it stays here:
 *
 *   - sent on a connection: `after_seq` is the last heartbeat seq sent before
 *     it; an echo of a higher seq confirms it (exitq_confirm);
 *   - not sent (no joined link when the rank ended): EXITQ_UNSENT, which no
 *     echo confirms;
 *   - when a session is resumed on a new connection, everything left is sent
 *     again (the agent walks the queue and calls exitq_sent), after HELLO has
 *     reported the exits' generation as the one its ranks run (exitq_holds),
 *     so that musterd waits for the exits instead of failing the node "came
 *     back without its ranks".
 *
 * The daemon ignores an exit it has read already: the first one ended the
 * generation, and a second one is of an older generation then (stale).
 */
#ifndef MUSTER_WORKER_EXIT_QUEUE_H
#define MUSTER_WORKER_EXIT_QUEUE_H

#include <stdint.h>

#include "proto/proto.h"

/* One exit per slot of a node: more than that in one outage drops the oldest. */
#define EXITQ_MAX PROTO_MAX_LOCAL_RANKS
#define EXITQ_UNSENT UINT64_MAX

struct exitq_entry {
    struct proto_rank_exit x;
    uint64_t after_seq; /* last heartbeat seq sent before x went; EXITQ_UNSENT = not sent */
};

struct exitq {
    uint32_t n;
    struct exitq_entry e[EXITQ_MAX]; /* oldest first */
};

/* Queue x; after_seq as above. Returns 1 when the oldest entry was dropped to make room, else 0. */
int exitq_push(struct exitq *q, const struct proto_rank_exit *x, uint64_t after_seq);

/* The echo of heartbeat `seq` came back: exits sent before that heartbeat are read. */
void exitq_confirm(struct exitq *q, uint64_t seq);

/* Forget exits of generations before `generation` (the daemon has moved past them). */
void exitq_drop_before(struct exitq *q, uint64_t generation);

/* Whether some exit of `generation` is still unconfirmed. */
int exitq_holds(const struct exitq *q, uint64_t generation);

/* Entry i was sent (again) after heartbeat `seq`. */
void exitq_sent(struct exitq *q, uint32_t i, uint64_t seq);

#endif
