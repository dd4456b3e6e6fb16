/*
 * agent_daemon_msg.c: frames from the daemon: the handshake (CHALLENGE,
 * WELCOME, REJECT, following a standby to the leader), fencing of frames
 * from a deposed leader's term, and the dispatch of every other frame.
 */

#include "worker/agent/agent_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include <uv.h>

#include "common/log.h"
#include "common/notify.h"

/* A standby refused the join: the leader it names is tried at once; when it
 * names none (an election is under way), the next daemon a moment later. */
static void follow_leader(struct agent *a, const struct proto_reject *rj)
{
    char was[DAEMON_ADDR_MAX];
    snprintf(was, sizeof(was), "%s", a->daemon);
    int followed = daemon_list_follow(&a->daemons, rj->reason);
    if (followed < 0)
        log_warn_limited("daemon at %s names a leader that is not in --daemon (%s): not joined; give the agent "
                         "every musterd's address as the leader advertises it",
                         was, rj->reason);
    if (followed != 1 || strcmp(a->daemons.addr[a->daemons.cur], was) == 0)
        daemon_list_next(&a->daemons);
    agent__use_daemon(a);
    bool named = strncmp(rj->reason, a->daemon, strlen(a->daemon)) == 0;
    log_info("daemon at %s stands by (%s): trying %s%s", was, rj->reason, a->daemon,
             named ? "" : " in a moment");
    agent__link_close(a);
    agent__link_set_state(a, LINK_IDLE);
    /* At once to a leader named for the first time since the last join; a
     * name that failed already (its lease has not ended yet) waits. */
    bool at_once = named && !a->followed;
    a->followed = true;
    uv_timer_start(&a->retry_timer, agent__on_retry_timer, at_once ? 0 : FOLLOW_RETRY_MS, 0);
}

static void on_reject(struct agent *a, const struct proto_reject *rj)
{
    if (strcmp(rj->code, PROTO_REJECT_NOT_LEADER) == 0) {
        follow_leader(a, rj);
        return;
    }
    bool fatal = strcmp(rj->code, PROTO_REJECT_AUTH) == 0 || strcmp(rj->code, PROTO_REJECT_VERSION) == 0;
    log_error("daemon at %s refused node %s: %s: %s%s", a->daemon, a->cfg->node, rj->code, rj->reason,
              fatal ? "" : "; retrying");
    agent__link_close(a);
    if (fatal)
        agent__agent_exit(a, 1);
    else
        agent__schedule_retry(a, NULL);
}

static void on_welcome(struct agent *a, const struct proto_welcome *w)
{
    a->heartbeat_interval_ms = w->heartbeat_interval_ms ? w->heartbeat_interval_ms : 1000;
    a->heartbeat_timeout_ms = w->heartbeat_timeout_ms ? w->heartbeat_timeout_ms : 5000;
    a->lease_ms = w->lease_ms ? w->lease_ms : 10000;
    a->ack_every_ms = proto_ack_every_ms(a->heartbeat_interval_ms, a->heartbeat_timeout_ms, a->lease_ms);
    backoff_reset(&a->backoff);
    a->tried = 0;
    a->followed = false;
    if (a->stalled)
        log_info("session with the daemon at %s resumed on a new connection, %" PRIu64 " ms after the stall",
                 a->daemon, uv_now(a->loop) - a->stalled_at);
    agent__drop_stalled(a);
    a->session = w->session;
    a->unanswered_since = 0;
    a->beats_since_answer = 0;
    agent__link_set_state(a, LINK_JOINED);
    char term[48] = "";
    if (a->daemons.term)
        snprintf(term, sizeof(term), "; leader's term %" PRIu64, a->daemons.term);
    log_info("joined daemon at %s as node %s (%u %s device(s), address %s; heartbeat %u ms, lease %u ms%s)",
             a->daemon, a->cfg->node, a->cfg->devices.n,
             a->cfg->devices.kind == PROTO_DEV_GPU ? "gpu" : "cpu", a->cfg->addr[0] ? a->cfg->addr : a->local_addr,
             a->heartbeat_interval_ms, a->lease_ms, term);
    agent__send_unread_exits(a);
    /* Rank 0's unique id, made while the link was down (or stalled, its frame set aside unread with the old
     * connection): the generation's ranks wait for it. musterd takes one per generation and refuses a stale one. */
    if (a->have_made_uid && a->made_uid.generation == a->cur_gen && !(a->have_uid && a->uid.generation == a->cur_gen)) {
        log_info("sending rank 0's unique id of generation %" PRIu64 ", made while the daemon was unreachable",
                 a->cur_gen);
        struct proto_msg m;
        agent__msg_init(&m, PROTO_UNIQUE_ID);
        m.u.unique_id = a->made_uid;
        agent__send_to_daemon(a, &m);
    }
    uv_timer_start(&a->beat_timer, agent__on_beat_timer, 0, a->heartbeat_interval_ms);
    agent__notify_joined(a);
    if (a->preflight_promised)
        agent__start_preflight(a, w);
}

static void protocol_violation(struct agent *a, const struct proto_msg *msg)
{
    char why[160];
    snprintf(why, sizeof(why), "unexpected %s in state %s", proto_type_name(msg->type), agent__link_names[a->link]);
    agent__link_lost(a, why);
}

/* The term a frame says it was sent in (0: none). */
static uint64_t *frame_term(struct proto_msg *msg)
{
    switch (msg->type) {
    case PROTO_WELCOME: return &msg->u.welcome.term;
    case PROTO_ASSIGN: return &msg->u.assign.term;
    case PROTO_UNIQUE_ID: return &msg->u.unique_id.term;
    case PROTO_COMMAND: return &msg->u.command.term;
    default: return NULL;
    }
}

/*
 * Fencing by term (PROTOCOL.md "Terms"): a frame of a term lower than one
 * seen comes from a musterd that led once and no longer does (it was stopped
 * or cut off past its lease, and another was elected meanwhile). It is not
 * obeyed; the agent leaves that daemon for the next. Otherwise the term is
 * taken, and cleared: ranks are not told terms. True when refused.
 */
static bool refuse_deposed(struct agent *a, struct proto_msg *msg)
{
    uint64_t *term = frame_term(msg);
    if (!term)
        return false;
    uint64_t known = a->daemons.term;
    if (daemon_list_term(&a->daemons, *term) == 0) {
        if (*term > known && known)
            log_info("daemon at %s leads in term %" PRIu64 " (was %" PRIu64 ")", a->daemon, *term, known);
        *term = 0;
        return false;
    }
    log_warn("%s of term %" PRIu64 " from the daemon at %s refused: term %" PRIu64
             " was seen, so that daemon no longer leads",
             proto_type_name(msg->type), *term, a->daemon, known);
    agent__link_lost(a, "it sent a frame of a deposed leader's term");
    if (a->daemons.n > 1) {
        daemon_list_next(&a->daemons); /* the retry goes there */
        agent__use_daemon(a);
    }
    return true;
}

/*
 * A peer that has not proven the token is acted on in nothing: not its
 * WELCOME, ASSIGN, COMMAND, LOG_REQUEST or term, not even its REJECT's
 * verdict (a stranger could make the agent exit or follow it elsewhere).
 * The agent says why, counts it and goes on with the next of its daemons.
 */
static void refuse_unproven(struct agent *a, const char *what)
{
    a->unproven++;
    log_warn("refused the peer at %s: %s; nothing it sent is acted on (%" PRIu64 " peer%s refused so far)",
             a->daemon, what, a->unproven, a->unproven == 1 ? "" : "s");
    notify_sendf("STATUS=refused the peer at %s: it has not proven the cluster token (%" PRIu64 " so far)",
                 a->daemon, a->unproven);
    agent__link_close(a);
    if (a->daemons.n > 1) {
        daemon_list_next(&a->daemons);
        agent__use_daemon(a);
    }
    agent__schedule_retry(a, NULL);
}

/* LINK_HELLO: the first frame a daemon sends is its CHALLENGE, with its proof. */
static void on_challenge(struct agent *a, const struct proto_msg *msg)
{
    char what[PROTO_REASON_MAX + 96];
    if (msg->type == PROTO_REJECT) {
        /* musterd's own REJECTs before its proof (a full connection table at
         * accept, a HELLO it could not read) are worth a retry: none is final. */
        log_warn("daemon at %s refused node %s before proving the token: %s: %s; retrying", a->daemon,
                 a->cfg->node, msg->u.reject.code, msg->u.reject.reason);
        agent__link_close(a);
        agent__schedule_retry(a, NULL);
        return;
    }
    if (msg->type != PROTO_CHALLENGE) {
        snprintf(what, sizeof(what), "it sent %s before proving the cluster token", proto_type_name(msg->type));
        refuse_unproven(a, what);
        return;
    }
    memcpy(a->bind.daemon_nonce, msg->u.challenge.nonce, PROTO_NONCE_LEN);
    if (!proto_proof_verify(a->cfg->token, a->cfg->token_len, &a->bind, PROTO_SIDE_DAEMON,
                            msg->u.challenge.hmac)) {
        /* Told, so that the master's log names a node whose token differs. */
        struct proto_msg e;
        agent__msg_init(&e, PROTO_ERROR);
        snprintf(e.u.error.code, sizeof(e.u.error.code), "%s", PROTO_REJECT_AUTH);
        snprintf(e.u.error.reason, sizeof(e.u.error.reason), "musterd's proof does not verify under node %s's token",
                 a->cfg->node);
        fconn_send(a->conn, &e);
        refuse_unproven(a, "its CHALLENGE does not prove the cluster token (a listener that is not a musterd "
                           "of this cluster, a relay, or this node's token differs from musterd's)");
        return;
    }
    struct proto_channel *ch = proto_channel_new(a->cfg->token, a->cfg->token_len, &a->bind, PROTO_SIDE_AGENT);
    struct proto_msg r;
    agent__msg_init(&r, PROTO_RESPONSE);
    if (!ch || proto_proof(a->cfg->token, a->cfg->token_len, &a->bind, PROTO_SIDE_AGENT, r.u.response.hmac) != 0) {
        proto_channel_free(ch);
        log_error("cannot compute the proof or the channel's keys (crypto library failure)");
        agent__link_lost(a, "crypto failure");
        return;
    }
    fconn_seal_rx(a->conn, ch); /* every later frame from the daemon is sealed */
    agent__link_set_state(a, LINK_AUTH);
    if (agent__send_to_daemon(a, &r) == 0)
        fconn_seal_tx(a->conn); /* and every later frame to it */
}

void agent__daemon_msg(struct fconn *c, struct proto_msg *msg)
{
    struct agent *a = c->data;
    if (c != a->conn)
        return;
    if (a->link == LINK_HELLO) {
        on_challenge(a, msg);
        return;
    }
    /* Past LINK_HELLO every frame came sealed under the handshake's keys:
     * from the daemon that proved the token, in its order. */
    if (msg->type != PROTO_REJECT) {
        a->last_rx = uv_now(a->loop);
        a->unanswered_since = 0;
    }
    if (msg->type == PROTO_REJECT) {
        on_reject(a, &msg->u.reject);
        return;
    }
    if (msg->type == PROTO_ERROR) {
        log_warn("daemon reports an error: %s: %s", msg->u.error.code, msg->u.error.reason);
        return;
    }
    if (refuse_deposed(a, msg))
        return;
    switch (a->link) {
    case LINK_AUTH:
        if (msg->type != PROTO_WELCOME) {
            protocol_violation(a, msg);
            return;
        }
        on_welcome(a, &msg->u.welcome);
        return;
    case LINK_JOINED:
        break;
    default:
        return;
    }
    switch (msg->type) {
    case PROTO_ASSIGN:
        agent__on_assign(a, &msg->u.assign);
        /* The port it reported free is now the generation's MASTER_PORT, and
         * musterd gives the next generation another: one beat says which at
         * once, so that a generation breaking now does not wait for it. */
        if (a->have_assign && a->free_port == a->assign.master_port)
            agent__on_beat_timer(&a->beat_timer);
        break;
    case PROTO_UNIQUE_ID:
        agent__on_unique_id(a, &msg->u.unique_id);
        break;
    case PROTO_HEARTBEAT:
        exitq_confirm(&a->exits, msg->u.heartbeat.seq); /* the echo: and last_rx, above */
        a->beats_since_answer = 0;
        break;
    case PROTO_COMMAND:
        agent__on_command(a, &msg->u.command);
        break;
    case PROTO_LOG_REQUEST:
        agent__on_log_request(a, &msg->u.log_request);
        break;
    case PROTO_MEM_FILE:
    case PROTO_MEM_FETCH:
        memrep_on_msg(&a->rep, msg);
        break;
    default: {
        unsigned long held;
        char note[64];
        if (ratelimit_pass(&a->daemon_ignored_log, uv_now(a->loop), RATELIMIT_PEER_MS, &held))
            log_warn("daemon sent %s after joining; ignored%s", proto_type_name(msg->type),
                     ratelimit_note(held, note, sizeof(note)));
    }
    }
}

void agent__daemon_bad(struct fconn *c, int err)
{
    struct agent *a = c->data;
    if (c != a->conn)
        return;
    log_warn("daemon sent a frame that does not decode (%s); skipped", proto_strerror(err));
    agent__send_error(a, PROTO_REJECT_BAD_REQUEST, proto_strerror(err));
}
