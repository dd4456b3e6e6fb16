/*
 * rdv_internal.h: what the files of rdv (daemon/rdv*.c) share, and nothing
 * outside them includes but rdv's unit tests. Three tiers of names: rdv_ in
 * rdv.h for musterd, rdv__ here across rdv's files, static within one.
 * Each function is described where it is defined.
 */
#ifndef MUSTER_RDV_INTERNAL_H
#define MUSTER_RDV_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/failure.h"
#include "daemon/rdv.h"

/* rdv.c: the job state, events, sending, lookups */

/* Every change of r->state goes through here: a transition of the job state
 * machine (rdv.h) is made and logged at debug; any other is refused, logged
 * as an error, and r->state kept. Returns 0 or -EINVAL. */
int rdv__set_state(struct rdv *r, enum rdv_job_state to);

void rdv__event(struct rdv *r, const char *kind, int node, int rank, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
int rdv__find_node(const struct rdv *r, const char *name);
void rdv__remove_node(struct rdv *r, uint32_t idx);
void rdv__set_rank_state(struct rdv *r, struct rdv_rank *rk, enum rdv_rank_state to);
void rdv__send_to(struct rdv *r, uint32_t node, const struct proto_msg *m);
void rdv__send_command(struct rdv *r, uint32_t node, enum proto_command action);
void rdv__changed(struct rdv *r, int persist);
uint32_t rdv__member_count(const struct rdv *r);
void rdv__missing_members(const struct rdv *r, char *out, size_t cap);
void rdv__command_all(struct rdv *r, enum proto_command action);
void rdv__stop_all(struct rdv *r);

/* rdv_join.c: nodes joining, their pre-flight, nodes lost */
void rdv__on_preflight(struct rdv *r, uint32_t idx, const struct proto_preflight *p, uint64_t now_ms);
void rdv__check_lost(struct rdv *r, uint64_t now_ms);

/* rdv_form.c: forming generations */
int rdv__layout_members(struct rdv *r);
int rdv__build_ranks(struct rdv *r);
void rdv__check_plan(struct rdv *r, int candidates);
void rdv__try_start_generation(struct rdv *r, uint64_t now_ms);
void rdv__check_running(struct rdv *r, uint64_t now_ms);
void rdv__maybe_form(struct rdv *r, uint64_t now_ms);
void rdv__send_unique_id(struct rdv *r, uint32_t node);
void rdv__resend_assign(struct rdv *r, uint32_t node);
/* 1 when u is taken (and sent on), 0 when it is refused or ignored. */
int rdv__on_unique_id(struct rdv *r, uint32_t node, const struct proto_unique_id *u, uint64_t now_ms);
void rdv__check_start(struct rdv *r, uint64_t now_ms);

/* rdv_beat.c: heartbeats */
void rdv__on_heartbeat(struct rdv *r, uint32_t node, const struct proto_heartbeat *hb, uint64_t now_ms);

/* rdv_fail.c: failures and the restart policy */
void rdv__settle_ranks(struct rdv *r);
void rdv__open_next_generation(struct rdv *r, uint64_t now_ms, int node, int rank, const char *what,
                               int spend, enum failure_class cls, int park);
void rdv__fail_generation(struct rdv *r, uint64_t now_ms, int node, int rank, const char *what);
void rdv__on_rank_exit(struct rdv *r, uint32_t node, const struct proto_rank_exit *x, uint64_t now_ms);
void rdv__check_rejoin(struct rdv *r, uint64_t now_ms);

/* rdv_grow.c: growing by a node, the yield at a step boundary */
void rdv__grow_waiting(struct rdv *r, uint64_t now_ms);
uint64_t rdv__yield_wait_ms(const struct rdv *r);
int rdv__all_yielded(const struct rdv *r);
/* Every rank of the generation runs and can rejoin in place: they can leave it together at a step boundary. */
int rdv__all_rejoin(const struct rdv *r);
void rdv__maybe_grow(struct rdv *r, uint32_t idx, uint64_t now_ms);
void rdv__finish_yield(struct rdv *r, uint64_t now_ms, int timed_out);

/* rdv_hang.c: hangs and stacks */
void rdv__stacks_clear(struct rdv_stacks *k);
int rdv__ask_stacks(struct rdv *r);
int rdv__stacks_complete(const struct rdv *r);
void rdv__on_stacks(struct rdv *r, uint32_t node, const struct proto_stacks *x);
void rdv__stacks_summary(const struct rdv *r, char *out, size_t cap);
void rdv__finish_hang(struct rdv *r, uint64_t now_ms);
void rdv__check_progress(struct rdv *r, uint64_t now_ms);
/* rdv_flight.c: 1 with the flight recorder's sentence in out and the rank it
 * blames in *culprit once every running rank's STACKS brought a summary and
 * one is behind; 0 when it names nobody; -ENOMEM. */
int rdv__flight_verdict(const struct rdv *r, char *out, size_t cap, uint32_t *culprit);
/* The peer that rank exited's collective error is put down to: a running rank
 * whose process is stopped, else a quiet one; its index, with what it is
 * into *why ("whose process is stopped ..."), or -1. */
int rdv__blame_peer(const struct rdv *r, uint32_t exited, uint64_t now_ms, const char **why);

/* rdv_spare.c: hot spare nodes (job key spare_nodes) */
/* A spare whose pre-flight passed (fitness_ready). */
int rdv__spare_ready(const struct rdv *r, uint32_t idx);
uint32_t rdv__spare_count(const struct rdv *r);
/* The spares that hold one of the job's spare_nodes places: all but those
 * found unfit (a member replaced for it, its agent still connected), which
 * would otherwise keep a healthy spare out. */
uint32_t rdv__spare_places(const struct rdv *r);
/* The ready spare to take member lost's place: as many devices of its kind,
 * its domain first, then the first to join; -1 = none. */
int rdv__pick_spare(const struct rdv *r, uint32_t lost);
/* A generation waiting to start: each member gone or unfit whose block is
 * unassigned is replaced by a ready spare; returns how many were. A member
 * restored from the state file is gone only once heartbeat_timeout_ms passed
 * since the restore without it (rdv_tick looks again). */
int rdv__spares_fill(struct rdv *r, uint64_t now_ms);
/* slow_policy swap: a member whose rank was named slow for slow_swap_after_s
 * leaves its place to a ready spare, after a yield when the ranks can leave
 * at a step boundary (rdv__finish_yield goes on with rdv__swap_now). */
void rdv__maybe_swap_slow(struct rdv *r, uint64_t now_ms);
void rdv__swap_now(struct rdv *r, uint32_t node, uint64_t now_ms);
/* rdv_slow.c: the fail-slow rule over the ranks' time splits */
void rdv__note_split(struct rdv *r, struct rdv_rank *rk, const struct proto_rank_beat *b, uint64_t now_ms);
void rdv__check_slow(struct rdv *r, uint64_t now_ms);

/* rdv_resume.c: a restored generation */
void rdv__check_resumed(struct rdv *r, uint64_t now_ms);

/* rdv_memrep.c: memory checkpoints replicated to a buddy node and given back */
uint32_t rdv__buddy(const struct rdv *r, uint32_t node); /* r->nnodes when none */
/* Names in as the node holding node's copy of as's checkpoint, and asks it (MEM_FETCH), when node lacks its own. */
void rdv__memckpt_from(struct rdv *r, uint32_t node, struct proto_assign *as);
/*
 * "node b's files from node a, node c's files from its drained copy in
 * checkpoint_dir, ..." for the members that resume tag from a buddy's copy
 * or their drained one; "" when none. Returns how many use a drained copy.
 */
uint32_t rdv__memckpt_sources(const struct rdv *r, const char *tag, char *out, size_t cap);
void rdv__on_mem_file(struct rdv *r, uint32_t node, const struct proto_mem_file *f, uint64_t now_ms);
/*
 * 1 when every member has reported its memory checkpoints since it joined
 * (or the job keeps none), so that the one to resume from can be named;
 * else r->reason says who is waited for, at most heartbeat_timeout_ms.
 */
int rdv__memckpt_reported(struct rdv *r, uint64_t now_ms);
/* Each member's buddy, the newest copy it holds and the replica lag in steps. */
json_t *rdv__memckpt_replicas_json(const struct rdv *r);

#endif
