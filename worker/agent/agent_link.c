/*
 * agent_link.c: the link to the daemon: picking a daemon of the list,
 * resolving and connecting (jittered backoff), the HELLO with this node's
 * facts, heartbeats, and stalls: a stalled connection is set aside and the
 * session resumed on a new one (see "Link stalls" in agent_internal.h).
 */

#include "worker/agent/agent_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <uv.h>

#include "common/log.h"
#include "common/notify.h"

const char *const agent__link_names[] = {"idle", "resolving", "connecting", "hello", "auth", "joined",
                                         "closed"};

uint32_t agent__rng_next(struct agent *a)
{
    /* xorshift64*: enough for jitter. */
    a->rng ^= a->rng >> 12;
    a->rng ^= a->rng << 25;
    a->rng ^= a->rng >> 27;
    return (uint32_t)((a->rng * 0x2545F4914F6CDD1DULL) >> 32);
}

void agent__link_set_state(struct agent *a, enum link_state s)
{
    if (a->link == LINK_CLOSED && s != LINK_CLOSED) {
        log_error("internal: link state change closed -> %s refused", agent__link_names[s]);
        return;
    }
    if (a->link != s)
        log_debug("link: %s -> %s", agent__link_names[a->link], agent__link_names[s]);
    a->link = s;
    a->link_since = uv_now(a->loop);
}

/* ---- the daemon link --------------------------------------------------- */

/* The current entry of the daemon list becomes the daemon joined. */
void agent__use_daemon(struct agent *a)
{
    char err[160];
    snprintf(a->daemon, sizeof(a->daemon), "%s", a->daemons.addr[a->daemons.cur]);
    hostport_parse(a->daemon, a->host, &a->port, err, sizeof(err)); /* valid: daemon_list_parse checked it */
}

void agent__link_close(struct agent *a)
{
    uv_timer_stop(&a->beat_timer);
    agent_preflight_stop(&a->pf);
    if (a->conn) {
        fconn_close(a->conn);
        a->conn = NULL;
    }
    if (a->ai_list) {
        uv_freeaddrinfo(a->ai_list);
        a->ai_list = a->ai_next = NULL;
    }
}

/* systemd: READY=1 on the first join; STATUS= says where this node stands. */
void agent__notify_joined(struct agent *a)
{
    char ranks[64] = "no ranks yet";
    if (a->have_assign)
        snprintf(ranks, sizeof(ranks), "generation %" PRIu64 ", %u ranks", a->assign.generation, a->assign.nranks);
    notify_sendf("%sSTATUS=joined daemon %s as %s, %s", a->told_ready ? "" : "READY=1\n", a->daemon,
                 a->cfg->node, ranks);
    a->told_ready = true;
}

void agent__link_lost(struct agent *a, const char *why)
{
    notify_sendf("STATUS=lost the daemon at %s: %s; rejoining", a->daemon, why);
    log_warn("lost the daemon at %s: %s; rejoining", a->daemon, why);
    agent__link_close(a);
    memrep_link_lost(&a->rep);
    agent__schedule_retry(a, NULL);
}

void agent__drop_stalled(struct agent *a)
{
    if (a->stalled) {
        fconn_close(a->stalled);
        a->stalled = NULL;
    }
    a->resume_until = 0;
}

uint64_t agent__stall_ms(const struct agent *a)
{
    return proto_stall_ms(a->heartbeat_timeout_ms);
}

/*
 * The connection is set aside (kept open, unread: see "Link stalls" in
 * agent_internal.h) and a new one resumes the session while the daemon's
 * deadline for this node has not passed: after a heartbeat went unanswered
 * for stall_ms, or a frame failed its MAC.
 */
static void set_aside(struct agent *a, uint64_t now)
{
    uv_timer_stop(&a->beat_timer);
    agent__drop_stalled(a);
    a->stalled = a->conn;
    a->stalled_at = now;
    a->conn = NULL;
    a->unanswered_since = 0;
    /* The daemon's deadline: heartbeat_timeout_ms after the last heartbeat it
     * heard, at the latest the last one sent (heartbeats that asked for no
     * answer may have been heard after its last frame). */
    a->resume_until = (a->last_beat_at > a->last_rx ? a->last_beat_at : a->last_rx) + a->heartbeat_timeout_ms;
    agent__link_set_state(a, LINK_IDLE);
    uv_timer_start(&a->retry_timer, agent__on_retry_timer, 0, 0);
}

void agent__link_stalled(struct agent *a, uint64_t now)
{
    log_warn("no answer from the daemon at %s for %" PRIu64 " ms (heartbeat sent %" PRIu64 " ms ago): "
             "resuming the session on a new connection",
             a->daemon, now - a->last_rx, now - a->unanswered_since);
    notify_sendf("STATUS=link to the daemon at %s stalled; resuming the session", a->daemon);
    set_aside(a, now);
}

/* 0, or the libuv error (UV_EPROTO: m could not be encoded, nothing was sent). */
int agent__send_to_daemon(struct agent *a, const struct proto_msg *m)
{
    if (!a->conn)
        return UV_ENOTCONN;
    int rc = fconn_send(a->conn, m);
    if (rc == 0)
        return 0;
    char why[160];
    if (rc == UV_EPROTO) {
        log_error("cannot encode %s for the daemon: %s", proto_type_name(m->type),
                  proto_strerror(a->conn->encode_err));
        return rc;
    }
    if (rc == UV_ENOBUFS)
        snprintf(why, sizeof(why), "write queue over %u bytes", FCONN_WRITE_QUEUE_MAX);
    else
        snprintf(why, sizeof(why), "cannot send %s: %s", proto_type_name(m->type), uv_strerror(rc));
    agent__link_lost(a, why);
    return rc;
}

void agent__schedule_retry(struct agent *a, const char *why)
{
    if (a->exiting)
        return;
    agent__link_set_state(a, LINK_IDLE);
    if (a->resume_until) {
        /* Resuming a session: every attempt counts before the daemon's deadline. */
        log_debug("resuming: %s; next attempt in %d ms", why ? why : "attempt failed", RESUME_RETRY_MS);
        uv_timer_start(&a->retry_timer, agent__on_retry_timer, RESUME_RETRY_MS, 0);
        return;
    }
    /* Several daemons: one of them leads, or will within the election's
     * lease; asked again soon (jittered), not after a growing backoff. */
    uint64_t delay = a->daemons.n > 1 ? FOLLOW_RETRY_MS / 2 + agent__rng_next(a) % FOLLOW_RETRY_MS
                                      : backoff_next(&a->backoff, agent__rng_next(a));
    if (why)
        log_warn("cannot reach daemon at %s: %s; retry %u in %.1f s", a->daemon, why, a->backoff.attempt,
                 (double)delay / 1000.0);
    else
        log_debug("rejoin attempt %u in %.1f s", a->backoff.attempt, (double)delay / 1000.0);
    uv_timer_start(&a->retry_timer, agent__on_retry_timer, delay, 0);
}

static void on_resolved(uv_getaddrinfo_t *req, int status, struct addrinfo *res)
{
    struct agent *a = req->data;
    a->gai_busy = false;
    if (a->exiting) {
        if (res)
            uv_freeaddrinfo(res);
        return;
    }
    if (status < 0) {
        char why[200];
        snprintf(why, sizeof(why), "cannot resolve %s: %s", a->host, uv_strerror(status));
        agent__schedule_retry(a, why);
        return;
    }
    a->ai_list = a->ai_next = res;
    a->last_connect_err = UV_EADDRNOTAVAIL;
    agent__try_next_addr(a);
}

void agent__on_retry_timer(uv_timer_t *t)
{
    struct agent *a = t->data;
    char port[8];
    snprintf(port, sizeof(port), "%u", a->port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    agent__link_set_state(a, LINK_RESOLVING);
    int rc = uv_getaddrinfo(a->loop, &a->gai, on_resolved, a->host, port, &hints);
    if (rc != 0) {
        char why[200];
        snprintf(why, sizeof(why), "cannot resolve %s: %s", a->host, uv_strerror(rc));
        agent__schedule_retry(a, why);
        return;
    }
    a->gai_busy = true;
}

static void daemon_fail(struct fconn *c, int err, const char *why)
{
    struct agent *a = c->data;
    if (c == a->stalled) {
        fconn_close(a->stalled);
        a->stalled = NULL;
        return;
    }
    if (c != a->conn)
        return;
    if (err == PROTO_E_MAC) {
        /* Someone on the path changed, added, replayed or reordered a frame:
         * it is not acted on, and nothing after it on this connection can be
         * trusted. A joined node resumes its session on a new connection (the
         * old one set aside unread, as after a stall: its close is no loss). */
        a->unproven++;
        log_warn("a frame from the daemon at %s failed authentication (forged, altered, replayed or reordered "
                 "on the way): not acted on; link reset (%" PRIu64 " refused so far)",
                 a->daemon, a->unproven);
        if (a->link == LINK_JOINED && a->session) {
            fconn_stop(c);
            set_aside(a, uv_now(a->loop));
            return;
        }
    }
    agent__link_lost(a, why);
}

int64_t agent__wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Device facts for HELLO, and the pre-flight promise: a node whose ranks
 * run already is past its pre-flight. */
static void hello_facts(struct agent *a, struct proto_hello *h)
{
    uint64_t total, avail;
    h->ngpus = a->ngpus;
    memcpy(h->gpus, a->gpus, sizeof(h->gpus[0]) * a->ngpus);
    h->device_mem_mb = a->ngpus ? a->gpus[0].total_mb : 0;
    for (uint32_t i = 1; i < a->ngpus; i++)
        if (a->gpus[i].total_mb < h->device_mem_mb)
            h->device_mem_mb = a->gpus[i].total_mb;
    h->host_mem_mb = preflight_host_memory(&total, &avail) == 0 ? total >> 20 : 0;
    h->preflight = !agent__ranks_live(a);
    a->preflight_promised = h->preflight;
    snprintf(h->domain, sizeof(h->domain), "%s", a->cfg->domain);
    a->hello_wall_ms = agent__wall_ms();
}

/* NVML's facts about the GPUs this node offers (none without the driver). */
void agent__probe_gpus(struct agent *a)
{
    struct gpu_fact g[PREFLIGHT_MAX_GPUS];
    char why[PREFLIGHT_WHY_MAX];
    const struct device_set *d = &a->cfg->devices;
    int n = d->kind == PROTO_DEV_GPU ? preflight_gpus(g, PREFLIGHT_MAX_GPUS, why, sizeof(why)) : 0;
    if (n < 0)
        log_info("no GPU facts: %s", why);
    for (uint32_t i = 0; n > 0 && i < d->n && d->ids[i] < (uint32_t)n; i++) {
        const struct gpu_fact *f = &g[d->ids[i]];
        snprintf(a->gpus[i].name, sizeof(a->gpus[i].name), "%s", f->name);
        proto_text_sanitize(a->gpus[i].name);
        a->gpus[i].total_mb = f->total >> 20;
        a->gpus[i].free_mb = f->free >> 20;
        a->ngpus = i + 1;
    }
    if (a->ngpus)
        log_info("gpus: %u x %s, %" PRIu64 " MiB", a->ngpus, a->gpus[0].name, a->gpus[0].total_mb);
}

static void send_hello(struct agent *a)
{
    struct proto_msg m;
    agent__msg_init(&m, PROTO_HELLO);
    struct proto_hello *h = &m.u.hello;
    snprintf(h->node, sizeof(h->node), "%s", a->cfg->node);
    snprintf(h->addr, sizeof(h->addr), "%s", a->cfg->addr[0] ? a->cfg->addr : a->local_addr);
    h->kind = a->cfg->devices.kind;
    h->ndevices = a->cfg->devices.n;
    memcpy(h->devices, a->cfg->devices.ids, sizeof(h->devices));
    /* A rank whose exit the daemon may have missed still counts: the exit follows WELCOME. */
    h->generation = agent__ranks_live(a) || (a->have_assign && exitq_holds(&a->exits, a->assign.generation))
                        ? a->assign.generation
                        : 0;
    hello_facts(a, h);
    agent__refresh_free_port(a);
    h->free_port = a->free_port;
    h->session = a->session;
    snprintf(h->agent_version, sizeof(h->agent_version), "%s", MUSTER_VERSION);
    log_debug("HELLO node %s addr %s generation %" PRIu64, h->node, h->addr, h->generation);
    /* The proofs cover the HELLO as sent: it is encoded here, once. */
    static uint8_t frame[PROTO_MAX_FRAME];
    int n = proto_nonce(h->nonce) == 0 ? proto_encode(&m, frame, sizeof(frame)) : PROTO_E_CRYPTO;
    if (n < 0 || proto_bind_hello(&a->bind, frame, (size_t)n, h) != 0) {
        log_error("cannot make the HELLO: %s", proto_strerror(n < 0 ? n : PROTO_E_CRYPTO));
        agent__link_lost(a, "cannot make the HELLO");
        return;
    }
    int rc = fconn_send_frame(a->conn, frame, (size_t)n);
    if (rc != 0) {
        char why[160];
        snprintf(why, sizeof(why), "cannot send HELLO: %s", uv_strerror(rc));
        agent__link_lost(a, why);
    }
}

static void on_connected(uv_connect_t *req, int status)
{
    struct agent *a = req->data;
    if (status == UV_ECANCELED || a->exiting)
        return;
    if (status < 0) {
        a->last_connect_err = status;
        fconn_close(a->conn);
        a->conn = NULL;
        agent__try_next_addr(a);
        return;
    }
    uv_timer_stop(&a->connect_timer);
    uv_freeaddrinfo(a->ai_list);
    a->ai_list = a->ai_next = NULL;

    struct sockaddr_storage ss;
    int len = sizeof(ss);
    a->local_addr[0] = '\0';
    if (uv_tcp_getsockname(&a->conn->h.tcp, (struct sockaddr *)&ss, &len) == 0) {
        if (ss.ss_family == AF_INET6)
            uv_ip6_name((struct sockaddr_in6 *)&ss, a->local_addr, sizeof(a->local_addr));
        else
            uv_ip4_name((struct sockaddr_in *)&ss, a->local_addr, sizeof(a->local_addr));
    }
    int rc = fconn_start(a->conn);
    if (rc != 0) {
        char why[160];
        snprintf(why, sizeof(why), "cannot read: %s", uv_strerror(rc));
        agent__link_close(a);
        agent__schedule_retry(a, why);
        return;
    }
    log_debug("connected to %s from %s", a->daemon, a->local_addr);
    agent__link_set_state(a, LINK_HELLO);
    send_hello(a);
}

/* Resuming: a SYN lost in the cut is retried by TCP only after a second; a new attempt goes at once. */
static void on_connect_deadline(uv_timer_t *t)
{
    struct agent *a = t->data;
    if (a->link != LINK_CONNECTING)
        return;
    a->last_connect_err = UV_ETIMEDOUT;
    fconn_close(a->conn);
    a->conn = NULL;
    agent__try_next_addr(a);
}

void agent__try_next_addr(struct agent *a)
{
    if (!a->ai_next && a->daemons.n > 1 && ++a->tried < a->daemons.n) {
        /* Another musterd of the job may lead: it is tried at once, the backoff
         * counting only a round through all of them. */
        log_info("cannot reach daemon at %s: %s; trying %s", a->daemon, uv_strerror(a->last_connect_err),
                 a->daemons.addr[(a->daemons.cur + 1) % a->daemons.n]);
        agent__link_close(a);
        daemon_list_next(&a->daemons);
        agent__use_daemon(a);
        agent__link_set_state(a, LINK_IDLE);
        uv_timer_start(&a->retry_timer, agent__on_retry_timer, 0, 0);
        return;
    }
    if (!a->ai_next) {
        char why[160];
        snprintf(why, sizeof(why), "%s", uv_strerror(a->last_connect_err));
        /* libuv's "connection refused" reads well; keep it lower-case like the rest. */
        if (why[0] >= 'A' && why[0] <= 'Z')
            why[0] = (char)(why[0] - 'A' + 'a');
        agent__link_close(a);
        agent__schedule_retry(a, why);
        /* The round through the daemons starts again with the next one. */
        a->tried = 0;
        daemon_list_next(&a->daemons);
        agent__use_daemon(a);
        return;
    }
    struct addrinfo *ai = a->ai_next;
    a->ai_next = ai->ai_next;
    a->conn = fconn_new_tcp(a->loop, a);
    if (!a->conn) {
        a->last_connect_err = UV_ENOMEM;
        agent__try_next_addr(a);
        return;
    }
    a->conn->on_msg = agent__daemon_msg;
    a->conn->on_bad = agent__daemon_bad;
    a->conn->on_fail = daemon_fail;
    a->connect_req.data = a;
    agent__link_set_state(a, LINK_CONNECTING);
    int rc = uv_tcp_connect(&a->connect_req, &a->conn->h.tcp, ai->ai_addr, on_connected);
    if (rc == 0 && a->resume_until)
        uv_timer_start(&a->connect_timer, on_connect_deadline, RESUME_CONNECT_MS, 0);
    else if (rc == 0 && a->daemons.n > 1)
        uv_timer_start(&a->connect_timer, on_connect_deadline, FOLLOW_CONNECT_MS, 0); /* a host gone: the next */
    if (rc != 0) {
        a->last_connect_err = rc;
        fconn_close(a->conn);
        a->conn = NULL;
        agent__try_next_addr(a);
    }
}

void agent__on_beat_timer(uv_timer_t *t)
{
    struct agent *a = t->data;
    if (a->link != LINK_JOINED)
        return;
    struct proto_msg m;
    proto_heartbeat_start(&m); /* the entries are copied in whole; the rest is not written */
    struct proto_heartbeat *hb = &m.u.heartbeat;
    hb->generation = a->cur_gen;
    hb->seq = ++a->beat_seq;
    agent__refresh_free_port(a);
    hb->free_port = a->free_port;
    memckpt_heartbeat(&a->mem, a->ranks, a->nranks, hb);
    memrep_heartbeat(&a->rep, hb);
    snprintf(hb->spare_note, sizeof(hb->spare_note), "%s", a->spare.note);
    memdrain_heartbeat(&a->drain, hb);
    const uint64_t now = uv_now(a->loop);
    for (uint32_t i = 0; i < a->nranks; i++) {
        struct agent_rank *r = a->ranks[i];
        if (!r || r->generation != a->cur_gen)
            continue;
        /* A running rank quiet for longer than its cadence (frozen): its last
         * entry is not news, and relaying it would make it look alive; the
         * daemon sees its age grow. Unless its process is stopped (SIGSTOP, a
         * debugger): then its last entry goes up marked so, which the daemon
         * does not count as hearing from it. A silent rank may be stopped too. */
        const bool q = agent__quiet(r, now);
        const bool stopped = (q || r->beat.silent) && rank_stopped(r->pid);
        if (q && !stopped)
            continue;
        struct proto_rank_beat *b = &hb->ranks[hb->nranks++];
        *b = r->beat;
        b->stopped = stopped;
        if (b->has_step_age && r->beat_ms) /* its age when it came, plus the time held here */
            b->step_age_ms += now - r->beat_ms;
        r->beat_unrelayed = false;
    }
    /* Ask for an answer once ack_every_ms of heartbeats went unanswered, or
     * while an exit waits for its confirmation. */
    a->beats_since_answer++;
    const bool ask = a->exits.n > 0 || proto_ack_due(a->beats_since_answer, a->heartbeat_interval_ms, a->ack_every_ms);
    hb->no_ack = !ask;
    if (ask && !a->unanswered_since)
        a->unanswered_since = now;
    a->last_beat_at = now;
    agent__send_to_daemon(a, &m);
}
