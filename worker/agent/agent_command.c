/*
 * agent_command.c: the daemon's requests about the job: COMMANDs (stop,
 * shutdown, stacks with the flight recorders and NCCL's RAS, ...) and log
 * requests answered from the rank logs.
 */

#include "worker/agent/agent_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <uv.h>

#include "common/log.h"

/* Any generation's: logs are what an operator reads after a restart, so they are not fenced. */
void agent__on_log_request(struct agent *a, const struct proto_log_request *q)
{
    struct proto_msg m;
    agent__msg_init(&m, PROTO_LOG_DATA);
    if (a->conn && a->conn->wq_bytes > LOG_SEND_QUEUE_MAX) {
        struct proto_log_data *d = &m.u.log_data;
        d->id = q->id;
        d->rank = q->rank;
        d->generation = q->generation;
        d->error = PROTO_LOG_BUSY;
        snprintf(d->reason, sizeof(d->reason), "node %s has %zu bytes waiting to go to musterd; ask again",
                 a->cfg->node, a->conn->wq_bytes);
        agent__send_to_daemon(a, &m);
        return;
    }
    rank_log_serve(a->state_dir, a->cfg->node, a->cfg->log_max_bytes == 0, q, &m.u.log_data);
    log_debug("log of rank %u, generation %" PRIu64 ": %" PRIu64 "..%" PRIu64 " of %" PRIu64 " bytes%s%s", q->rank,
              m.u.log_data.generation, m.u.log_data.offset, m.u.log_data.next_offset, m.u.log_data.size,
              m.u.log_data.error ? ": " : "", m.u.log_data.reason);
    if (agent__send_to_daemon(a, &m) == UV_EPROTO) {
        /* The request is answered all the same, or it holds a daemon slot until its deadline. */
        int why = a->conn->encode_err;
        proto_msg_clear(&m);
        agent__msg_init(&m, PROTO_LOG_DATA);
        m.u.log_data.id = q->id;
        m.u.log_data.rank = q->rank;
        m.u.log_data.error = PROTO_LOG_UNREADABLE;
        snprintf(m.u.log_data.reason, sizeof(m.u.log_data.reason), "node %s could not encode its answer: %s",
                 a->cfg->node, proto_strerror(why));
        agent__send_to_daemon(a, &m);
    }
    proto_msg_clear(&m);
}

/* ---- stacks (COMMAND stacks) ------------------------------------------ */

#define STACKS_POLL_MS 20

/* Sends one STACKS per rank of the request, as far as each got, and ends it. */
static void finish_stacks(struct agent *a, bool timed_out)
{
    uv_timer_stop(&a->stacks_timer);
    struct ras_finding *ras = NULL;
    size_t nras = 0;
    ras_poll(&a->ras, uv_now(a->loop)); /* done by now, answered or not */
    if (a->ras.error[0]) {
        if (strncmp(a->ras.error, "nothing answers", 15) != 0) /* not an NCCL job: nothing to say */
            log_warn("NCCL RAS: %s", a->ras.error);
    } else if (a->ras.in && (ras = calloc(RAS_MAX_FINDINGS, sizeof(*ras)))) {
        char why[200];
        if (ras_findings(a->ras.in, a->ras.inlen, ras, RAS_MAX_FINDINGS, &nras, why, sizeof(why)) != 0)
            log_warn("NCCL RAS: %s", why);
        else
            log_info("NCCL RAS: %zu finding(s) about the job's communicators", nras);
    }
    for (uint32_t i = 0; i < a->nstacks; i++) {
        struct proto_msg m;
        if (stacks_message(&a->stacks[i], &m, timed_out) != 0) {
            log_warn("rank %u: out of memory for its stacks", a->stacks[i].rank);
            continue;
        }
        char why[PROTO_REASON_MAX] = "";
        if (m.u.stacks.pid)
            m.u.stacks.fr = flight_ask_read(&a->flights[i], why, sizeof(why));
        if (why[0] && m.u.stacks.pid)
            log_warn("rank %u: %s", a->stacks[i].rank, why);
        if (nras)
            m.u.stacks.ras = ras_rank_text(ras, nras < RAS_MAX_FINDINGS ? nras : RAS_MAX_FINDINGS,
                                           a->stacks[i].rank_pid);
        agent__send_to_daemon(a, &m);
        proto_msg_clear(&m);
    }
    free(ras);
    ras_end(&a->ras);
    log_info("stacks of %u rank(s) sent (%" PRIu64 " ms%s)", a->nstacks, uv_now(a->loop) - a->stacks_since,
             timed_out ? ", some cut short at the deadline" : "");
    free(a->stacks);
    free(a->flights);
    a->stacks = NULL;
    a->flights = NULL;
    a->nstacks = 0;
}

static void on_stacks_timer(uv_timer_t *t)
{
    struct agent *a = t->data;
    bool all = true;
    for (uint32_t i = 0; i < a->nstacks; i++)
        if (!stacks_poll(&a->stacks[i], uv_now(a->loop)) || !flight_ask_poll(&a->flights[i]))
            all = false;
    /* RAS, under way, has its own deadline (a little longer: it asks its peers) */
    bool ras_done = ras_poll(&a->ras, uv_now(a->loop));
    uint64_t took = uv_now(a->loop) - a->stacks_since;
    if ((all && ras_done) || (took >= STACKS_DEADLINE_MS && (ras_done || took >= RAS_DEADLINE_MS)))
        finish_stacks(a, !all);
}

/* Asks every rank of generation gen on this node for its stacks; the answers go up as STACKS. */
static void begin_stacks(struct agent *a, uint64_t gen)
{
    if (a->stacks) {
        log_info("daemon: stacks (generation %" PRIu64 ") while a dump is under way: answered by that one", gen);
        return;
    }
    a->stacks = calloc(PROTO_MAX_LOCAL_RANKS, sizeof(*a->stacks));
    a->flights = calloc(PROTO_MAX_LOCAL_RANKS, sizeof(*a->flights));
    if (!a->stacks || !a->flights) {
        log_warn("daemon: stacks: out of memory");
        free(a->stacks);
        free(a->flights);
        a->stacks = NULL;
        a->flights = NULL;
        return;
    }
    a->nstacks = 0;
    a->stacks_since = uv_now(a->loop);
    bool waiting = false;
    for (uint32_t i = 0; i < a->nranks; i++) {
        const struct agent_rank *r = a->ranks[i];
        if (!r || !r->running || r->generation != gen)
            continue;
        struct stacks_dump *d = &a->stacks[a->nstacks++];
        d->generation = gen;
        d->rank = r->rank;
        char dir[PATH_MAX];
        agent__rank_dir(a, r->generation, r->rank, dir, sizeof(dir));
        if (stacks_begin(d, dir, r->pid, STACKS_SIGNAL, uv_now(a->loop)))
            waiting = true;
        if (!d->stopped && flight_ask_begin(&a->flights[a->nstacks - 1], dir, r->pid))
            waiting = true;
    }
    /* NCCL's RAS service, where the job's NCCL processes run one on this node */
    if (a->nstacks && ras_begin(&a->ras, getenv("NCCL_RAS_ADDR"), uv_now(a->loop), RAS_DEADLINE_MS) == 0)
        waiting = true;
    log_info("daemon: stacks (generation %" PRIu64 "): %u rank(s) asked", gen, a->nstacks);
    if (waiting)
        uv_timer_start(&a->stacks_timer, on_stacks_timer, STACKS_POLL_MS, STACKS_POLL_MS);
    else
        finish_stacks(a, false);
}

void agent__on_command(struct agent *a, const struct proto_command_msg *c)
{
    if (agent__stale(a, "COMMAND", c->generation))
        return;
    switch (c->action) {
    case PROTO_CMD_STOP:
        log_info("daemon: stop (generation %" PRIu64 ")", c->generation);
        a->cur_gen = c->generation;
        a->spawn_pending = false;
        agent__stop_all(a, c->generation);
        agent__recheck_checkpoint(a);
        break;
    case PROTO_CMD_PARK: {
        log_info("daemon: generation over, park (generation %" PRIu64 " is next)", c->generation);
        a->cur_gen = c->generation;
        a->spawn_pending = false;
        struct proto_msg m;
        agent__msg_init(&m, PROTO_COMMAND);
        m.u.command = *c;
        for (struct agent_rank *r = a->all; r; r = r->next) {
            if (!r->running || r->stopping)
                continue;
            if (r->beat.rejoin && r->ctl && agent__responsive(a, r)) {
                rank_send(r, &m); /* it aborts its communicator and waits for the next ASSIGN */
                continue;
            }
            if (r->beat.rejoin)
                log_warn("rank %u (pid %d) has said nothing for %.1f s: stopped, not parked", r->rank, r->pid,
                         r->heard_ms ? (double)(uv_now(a->loop) - r->heard_ms) / 1000.0 : 0.0);
            rank_stop(r, c->generation, (uint64_t)a->spec.stop_grace_ms);
        }
        agent__recheck_checkpoint(a);
        break;
    }
    case PROTO_CMD_START:
        if (!a->have_assign || a->assign.generation != c->generation) {
            log_warn("daemon: start for generation %" PRIu64 " but the held assignment is of generation %" PRIu64
                     "; ignored",
                     c->generation, a->have_assign ? a->assign.generation : 0);
            break;
        }
        log_info("daemon: start (generation %" PRIu64 ")", c->generation);
        a->cur_gen = c->generation;
        agent__stop_all(a, c->generation);
        a->spawn_pending = true;
        if (!agent__any_running(a))
            agent__spawn_all(a);
        break;
    case PROTO_CMD_SHUTDOWN:
        log_info("daemon: shutdown");
        a->mem_drop = true;
        agent__agent_exit(a, 0);
        break;
    case PROTO_CMD_CHECKPOINT: {
        struct proto_msg m;
        agent__msg_init(&m, PROTO_COMMAND);
        m.u.command = *c;
        for (uint32_t i = 0; i < a->nranks; i++)
            if (a->ranks[i] && a->ranks[i]->running && a->ranks[i]->generation == c->generation)
                rank_send(a->ranks[i], &m);
        log_info("daemon: checkpoint (generation %" PRIu64 ") forwarded to the ranks", c->generation);
        break;
    }
    case PROTO_CMD_YIELD: { /* the job grows: ranks that rejoin leave the generation at a step boundary */
        struct proto_msg m;
        agent__msg_init(&m, PROTO_COMMAND);
        m.u.command = *c;
        for (struct agent_rank *r = a->all; r; r = r->next)
            if (r->running && !r->stopping && r->beat.rejoin && r->ctl)
                rank_send(r, &m);
        log_info("daemon: yield (generation %" PRIu64 ") forwarded to the ranks", c->generation);
        break;
    }
    case PROTO_CMD_STACKS:
        begin_stacks(a, c->generation);
        break;
    default: {
        unsigned long held;
        char note[64];
        if (ratelimit_pass(&a->daemon_ignored_log, uv_now(a->loop), RATELIMIT_PEER_MS, &held))
            log_warn("daemon: unknown command %d ignored%s", (int)c->action, ratelimit_note(held, note, sizeof(note)));
    }
    }
}
