/*
 * agent_ranks.c: the ranks of the held assignment while they run: which run,
 * which are quiet or stopping, what a rank says on its control socket
 * (relayed to the daemon), and a rank's exit (explained, queued as
 * RANK_EXIT until the daemon has read it).
 */

#include "worker/agent/agent_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <uv.h>

#include "common/log.h"
#include "worker/agent/rank_failure.h"

/* ---- ranks ------------------------------------------------------------- */

bool agent__any_running(const struct agent *a)
{
    for (const struct agent_rank *r = a->all; r; r = r->next)
        if (r->running)
            return true;
    return false;
}

/* A rank that can rejoin sends a heartbeat every half second from its own
 * thread, whatever its training does. One silent this long is frozen
 * (SIGSTOP, a debugger, swapped out for good): it would never take up a
 * parked generation, so it is stopped instead (SIGTERM, then SIGKILL) and its
 * slot started again. */
#define RANK_SILENT_MS 3000
/* Not heard for this long, nor for twice the longest gap between its frames
 * so far, a rank's cached entry is left out of heartbeats (muster-train
 * beats every RANK_BEAT_MS, 500 ms; a program that beats once a step, as the
 * rank contract allows, only after two of its steps). */
#define RANK_QUIET_MS 1500

/* Whether a running rank has been quiet for longer than its own cadence:
 * frozen, stopped, wedged. Before its second frame its cadence is unknown,
 * and it is not. */
bool agent__quiet(const struct agent_rank *r, uint64_t now)
{
    const uint64_t wait = 2 * r->frame_gap_ms > RANK_QUIET_MS ? 2 * r->frame_gap_ms : RANK_QUIET_MS;
    return r->running && !r->stopping && r->frame_gap_ms && now - r->heard_ms > wait;
}

bool agent__responsive(const struct agent *a, const struct agent_rank *r)
{
    return r->heard_ms && uv_now(a->loop) - r->heard_ms <= RANK_SILENT_MS;
}

/* Some rank runs that the held assignment does not keep: it is being stopped,
 * and its slot is started again once it is gone. */
bool agent__any_outgoing(const struct agent *a)
{
    for (const struct agent_rank *r = a->all; r; r = r->next)
        if (r->running && (!a->have_assign || r->generation != a->assign.generation))
            return true;
    return false;
}

/* Some rank runs and has not been told to stop. */
bool agent__any_unstopped(const struct agent *a)
{
    for (const struct agent_rank *r = a->all; r; r = r->next)
        if (r->running && !r->stopping)
            return true;
    return false;
}

/* Ranks running, not being stopped, for the held assignment. */
bool agent__ranks_live(const struct agent *a)
{
    if (!a->have_assign || a->nranks == 0)
        return false;
    for (uint32_t i = 0; i < a->nranks; i++)
        if (!a->ranks[i] || !a->ranks[i]->running || a->ranks[i]->stopping)
            return false;
    return true;
}

void agent__stop_all(struct agent *a, uint64_t generation)
{
    for (struct agent_rank *r = a->all; r; r = r->next)
        rank_stop(r, generation, (uint64_t)a->spec.stop_grace_ms);
}

/*
 * A rank ended: tell the daemon, and keep the exit until the echo of a later
 * heartbeat shows it was read (exit_queue.h). Without a joined link it waits
 * for the next WELCOME (send_unread_exits), unless the agent stopped the rank
 * itself (stopped): that exit is news to nobody, or it is the agent's own
 * fencing, which the daemon learns from HELLO (its ranks run no generation).
 */
void agent__send_rank_exit(struct agent *a, uint64_t generation, uint32_t rank, int code, int sig,
                           const char *reason, const char *detail, bool stopped)
{
    static struct proto_msg m; /* ~5 KiB of text: not on the loop's stack */
    agent__msg_init(&m, PROTO_RANK_EXIT);
    m.u.rank_exit.generation = generation;
    m.u.rank_exit.rank = rank;
    m.u.rank_exit.exit_code = code;
    m.u.rank_exit.signal = sig;
    snprintf(m.u.rank_exit.reason, sizeof(m.u.rank_exit.reason), "%s", reason ? reason : "");
    snprintf(m.u.rank_exit.detail, sizeof(m.u.rank_exit.detail), "%s", detail ? detail : "");
    proto_text_sanitize(m.u.rank_exit.reason);
    proto_text_sanitize(m.u.rank_exit.detail);
    const bool joined = a->link == LINK_JOINED;
    if (!joined && stopped)
        return;
    if (exitq_push(&a->exits, &m.u.rank_exit, joined ? a->beat_seq : EXITQ_UNSENT))
        log_warn("more than %d rank exits unread by the daemon: the oldest is forgotten", EXITQ_MAX);
    if (joined)
        agent__send_to_daemon(a, &m);
    else
        log_info("rank %u's exit is sent once the daemon is reachable again", rank);
}

/* A new connection was welcomed: the exits the daemon may not have read go (again). */
void agent__send_unread_exits(struct agent *a)
{
    static struct proto_msg m;
    exitq_drop_before(&a->exits, a->cur_gen);
    if (a->exits.n)
        log_info("sending %u rank exit(s) the daemon may not have read (the link was down)", a->exits.n);
    for (uint32_t i = 0; i < a->exits.n && a->link == LINK_JOINED; i++) {
        agent__msg_init(&m, PROTO_RANK_EXIT);
        m.u.rank_exit = a->exits.e[i].x;
        exitq_sent(&a->exits, i, a->beat_seq);
        agent__send_to_daemon(a, &m);
    }
}

/* Whether a line about one more ignored frame of rank r may go out now
 * (one per rank per RATELIMIT_PEER_MS); note then says how many were held back. */
static bool rank_may_log(struct agent_rank *r, char *note, size_t cap)
{
    struct agent *a = r->cb.data;
    unsigned long held;
    if (!ratelimit_pass(&r->ignored_log, uv_now(a->loop), RATELIMIT_PEER_MS, &held))
        return false;
    ratelimit_note(held, note, cap);
    if (!held)
        note[0] = '\0';
    return true;
}

void agent__rank_on_msg(struct agent_rank *r, struct proto_msg *msg)
{
    struct agent *a = r->cb.data;
    uint64_t gen = 0;
    char note[64];
    if (msg->type == PROTO_HEARTBEAT)
        gen = msg->u.heartbeat.generation;
    else if (msg->type == PROTO_UNIQUE_ID)
        gen = msg->u.unique_id.generation;
    else {
        if (rank_may_log(r, note, sizeof(note)))
            log_warn("rank %u sent %s, which ranks do not send; ignored%s", r->rank, proto_type_name(msg->type), note);
        return;
    }
    if (gen < a->cur_gen || gen != r->generation) {
        if (log_threshold >= LOG_DEBUG && rank_may_log(r, note, sizeof(note)))
            log_debug("rank %u: %s of generation %" PRIu64 " ignored (current %" PRIu64 ", rank's %" PRIu64 ")%s",
                      r->rank, proto_type_name(msg->type), gen, a->cur_gen, r->generation, note);
        return;
    }
    if (msg->type == PROTO_HEARTBEAT) {
        const struct proto_heartbeat *hb = &msg->u.heartbeat;
        for (uint32_t i = 0; i < hb->nranks; i++) {
            if (hb->ranks[i].rank != r->rank)
                continue;
            enum proto_rank_state st = r->beat.state;
            int was_yielded = r->beat.yielded;
            r->beat = hb->ranks[i];
            r->beat.stopped = 0; /* the agent's word, from /proc, never the rank's */
            r->beat_ms = uv_now(a->loop);
            if (r->beat.restore_from != PROTO_RESTORE_NONE)
                r->rejoined_from = 0; /* it took up the generation it was rejoined to */
            r->beat.silent = 0;
            r->beat_unrelayed = true;
            if (r->stopping || st == PROTO_RANK_EXITED)
                r->beat.state = st;
            else if (r->beat.state == PROTO_RANK_STARTING || r->beat.state == PROTO_RANK_EXITED)
                r->beat.state = PROTO_RANK_RUNNING;
            /* A rank that just began running, or left its generation for a grow, is news:
             * tell the daemon now, not at the next tick. */
            if ((st != PROTO_RANK_RUNNING && r->beat.state == PROTO_RANK_RUNNING) ||
                (!was_yielded && r->beat.yielded))
                agent__on_beat_timer(&a->beat_timer);
            return;
        }
        if (rank_may_log(r, note, sizeof(note)))
            log_warn("rank %u sent a heartbeat without its own entry; ignored%s", r->rank, note);
        return;
    }
    if (r->rank != 0) {
        if (rank_may_log(r, note, sizeof(note)))
            log_warn("rank %u sent a unique id; only rank 0 creates it; ignored%s", r->rank, note);
        return;
    }
    /* One per generation, as the daemon takes it: a repeat is counted, not sent up. */
    if (a->have_made_uid && a->made_uid.generation == gen) {
        a->repeated_uids++;
        if (rank_may_log(r, note, sizeof(note)))
            log_warn("rank 0 sent the unique id of generation %" PRIu64 " again; ignored (%" PRIu64 " repeats in all)%s",
                     gen, a->repeated_uids, note);
        return;
    }
    a->made_uid = msg->u.unique_id;
    a->have_made_uid = true;
    if (a->link != LINK_JOINED) {
        log_warn("rank 0 created the unique id of generation %" PRIu64 " but the daemon is not reachable; sent once it is back",
                 gen);
        return;
    }
    log_info("forwarding the unique id of generation %" PRIu64 " from rank 0 to the daemon", gen);
    agent__send_to_daemon(a, msg);
}

/*
 * What a failed rank said: its error file, else its stderr. A rank killed by
 * SIGKILL, SIGTERM or SIGINT was stopped from outside: its last stderr line
 * is ordinary output, not a reason.
 */
static void explain_failure(const struct agent_rank *r, int sig, char *reason, size_t rcap, char *detail,
                            size_t dcap)
{
    char why_not[PATH_MAX + 128];
    int stopped = sig == SIGKILL || sig == SIGTERM || sig == SIGINT;
    rank_failure_explain(r->error_file, stopped ? NULL : r->err.tail, reason, rcap, detail, dcap, why_not,
                         sizeof(why_not));
    if (why_not[0])
        log_warn("rank %u: %s; its stderr stands in for it", r->rank, why_not);
}

void agent__rank_on_exit(struct agent_rank *r, int code, int sig)
{
    struct agent *a = r->cb.data;
    static char reason[PROTO_REASON_MAX], detail[PROTO_DETAIL_MAX];
    reason[0] = detail[0] = '\0';
    if (sig || code != 0)
        explain_failure(r, sig, reason, sizeof(reason), detail, sizeof(detail));
    if (sig)
        log_warn("rank %u (pid %d, generation %" PRIu64 ") was killed by signal %d (%s)%s%s", r->rank, r->pid,
                 r->generation, sig, strsignal(sig), reason[0] ? ": " : "", reason);
    else if (code == 0)
        log_info("rank %u (pid %d, generation %" PRIu64 ") exited with status 0", r->rank, r->pid,
                 r->generation);
    else
        log_warn("rank %u (pid %d, generation %" PRIu64 ") exited with status %d%s%s", r->rank, r->pid,
                 r->generation, code, reason[0] ? ": " : "", reason);
    uint64_t gen = r->generation;
    if (!sig && code == 0)
        spare_drop(&a->spare); /* its training is done: the job ends, no replacement will be needed */
    if (r->rejoined_from && !sig && code == 0) {
        /* Rejoined to this generation, it ended the one before instead (its
         * training was done) without taking this one up: its exit is that
         * generation's, and its slot is started again for this one. */
        log_info("rank %u (pid %d) finished generation %" PRIu64 " before it took up generation %" PRIu64
                 "; its slot is started again", r->rank, r->pid, r->rejoined_from, r->generation);
        gen = r->rejoined_from;
        if (a->have_assign && a->assign.generation == r->generation)
            a->spawn_pending = true;
    }
    /* Its last entry (the final step, say) goes before its exit: after the
     * exit the daemon takes no more figures from it. */
    if (r->beat_unrelayed && r->generation == a->cur_gen)
        agent__on_beat_timer(&a->beat_timer);
    agent__send_rank_exit(a, gen, r->rank, code, sig, reason, detail, r->stopping);
    memckpt_rank_exit(&a->mem, a->ranks, a->nranks);
    if (a->exiting)
        agent__maybe_finish(a);
    else if (a->spawn_pending && !agent__any_outgoing(a))
        agent__spawn_all(a);
}
