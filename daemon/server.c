#include "daemon/server.h"

#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

#include "common/log.h"
#include "common/namemap.h"
#include "common/ratelimit.h"
#include "daemon/coalesce.h"

/* A connection's life; conn_set_state() checks and logs every transition. */
enum conn_state {
    CONN_HELLO,   /* accepted; waiting for HELLO within the handshake deadline */
    CONN_AUTH,    /* CHALLENGE (with musterd's proof) sent; waiting for the agent's RESPONSE */
    CONN_JOINED,  /* the agent proved the token; known to rdv under conn->node; every
                   * frame either way sealed (proto_seal) */
    CONN_CLOSING, /* shutdown/close issued; nothing more is read or sent */
};

static const char *const conn_state_names[] = {"hello", "auth", "joined", "closing"};

/*
 * Before its RESPONSE verifies, a connection is a stranger and costs only
 * this struct: it reads into the server's shared pre-authentication buffer,
 * keeps a partial frame in a small allocation, and holds its HELLO on the
 * heap. A stranger is in the pool (an age-ordered list, and one per address)
 * from which the oldest is evicted when the pool or its address is full;
 * once its HELLO names a node rdv knows, it is a claim instead (one per
 * name, in s->claims) that strangers cannot evict. The full-size read
 * buffer comes with CONN_JOINED.
 */
enum conn_class {
    CLASS_NONE,     /* joined or closing: in no pre-authentication list */
    CLASS_POOL,     /* unauthenticated stranger */
    CLASS_CLAIM,    /* unauthenticated, its HELLO names a node rdv knows */
};

struct addr_slot;

struct conn {
    uv_tcp_t tcp;
    struct server *srv;
    enum conn_state state;
    enum conn_class class;
    char peer[64];                 /* "ip:port" for logs */
    char node[PROTO_NAME_MAX];     /* after HELLO */
    struct proto_hello *hello;     /* from HELLO until RESPONSE */
    struct addr_slot *addr;        /* its address's pool entry (CLASS_POOL) */
    struct conn *pool_prev, *pool_next; /* the pool, oldest first (CLASS_POOL) */
    struct conn *addr_prev, *addr_next; /* its address's pool connections, oldest first */
    struct proto_bind bind;        /* the handshake: both nonces, the HELLO (from HELLO on) */
    struct proto_channel *ch;      /* the sealed channel; made when first needed */
    int tx_sealed;                 /* CHALLENGE sent: every later frame to the agent is sealed */
    int rx_sealed;                 /* RESPONSE read: every later frame from it is sealed */
    uint64_t accepted_ms;
    uint64_t closing_ms;           /* when CLOSING began: a stalled shutdown is cut short */
    char lost_why[PROTO_REASON_MAX]; /* rdv hears of the loss from on_closed, not re-entrantly */
    int tell_rdv_later;
    struct write_req *held, *held_tail; /* rdv's frames waiting for the state file (server_hold) */
    size_t held_bytes;
    size_t rlen;
    uint64_t noted;                /* coalesce_note's mark: counted once per loop iteration */
    struct ratelimit ignored_log;  /* lines about its skipped frames (common/ratelimit.h) */
    uint8_t *rbuf;                 /* NULL: nothing buffered before authentication */
    size_t rcap;
    struct conn *prev, *next;
};

/* A peer address's strangers in the pool. */
struct addr_slot {
    char key[INET6_ADDRSTRLEN];
    unsigned count;
    struct conn *oldest, *newest;
};

/* An address and node name whose failed authentication was an event lately. */
struct auth_note {
    char key[INET6_ADDRSTRLEN + PROTO_NAME_MAX]; /* "ip node"; "" = free */
    uint64_t at;   /* its last event */
    uint64_t held; /* failures since, not made events */
};

struct server {
    uv_loop_t *loop;
    uv_tcp_t listener;
    int listener_open;
    struct rdv *rdv;
    uint8_t *token;
    size_t token_len;
    uint16_t port;
    struct conn *conns;
    unsigned nconns;
    unsigned max_conns;
    struct namemap joined; /* node name -> its CONN_JOINED connection */
    /* Before authentication (see struct conn): */
    struct conn *pool_oldest, *pool_newest;
    unsigned npool, pool_max, per_addr_max;
    struct namemap addrs;  /* peer address -> struct addr_slot *, for addresses in the pool */
    struct namemap claims; /* node name -> its CLASS_CLAIM connection */
    uint8_t preauth_buf[SERVER_PREAUTH_FRAME_MAX]; /* every stranger's reads, one at a time */
    struct conn *joining; /* during rdv_join: the connection being admitted */
    struct conn *speaking; /* during rdv_message: the sender (its echo needs no lookup) */
    int closing_all;      /* server_close ran: rdv is no longer told anything */
    uint64_t gate;        /* rdv's frames wait until the state write of this number is durable */
    uint64_t durable;     /* newest state write number durable (server_release) */
    uint64_t held_since_ms; /* when frames began to wait for a state write (gate > durable); 0: none wait */
    void (*log_data)(void *ctx, const char *node, const struct proto_log_data *d);
    void (*node_gone)(void *ctx, const char *node);
    int (*admit)(void *ctx, char code[32], char reason[PROTO_REASON_MAX]);
    void *hook_ctx;
    struct coalesce batch; /* reads of one wakeup taken together under load */
    /* auth_failed events, coalesced (note_auth_failed): */
    struct auth_note auth_notes[SERVER_AUTH_NOTE_SLOTS];
    uint64_t auth_failures;     /* every failure since start */
    uint64_t auth_window_at;    /* the current interval's start */
    unsigned auth_window_notes; /* events made in it */
};

struct write_req {
    uv_write_t req;
    struct write_req *next; /* while held */
    uint64_t after;         /* while held: the state write it waits for */
    size_t len;
    uint8_t data[];
};

static void conn_close(struct conn *c, const char *why, int tell_rdv);
static void conn_lost_later(struct conn *c, const char *why);

/* ---- before authentication: the pool and the claims ------------------- */

static void pool_add(struct conn *c, const char *ip)
{
    struct server *s = c->srv;
    uintptr_t v;
    struct addr_slot *a;
    if (namemap_get(&s->addrs, ip, &v) == 0) {
        a = (struct addr_slot *)v;
    } else {
        a = calloc(1, sizeof(*a));
        if (!a || namemap_put(&s->addrs, ip, (uintptr_t)a) != 0) {
            free(a);
            return; /* left out of the pool: the handshake deadline still applies */
        }
        snprintf(a->key, sizeof(a->key), "%s", ip);
    }
    c->class = CLASS_POOL;
    c->addr = a;
    c->addr_prev = a->newest;
    if (a->newest)
        a->newest->addr_next = c;
    else
        a->oldest = c;
    a->newest = c;
    a->count++;
    c->pool_prev = s->pool_newest;
    if (s->pool_newest)
        s->pool_newest->pool_next = c;
    else
        s->pool_oldest = c;
    s->pool_newest = c;
    s->npool++;
}

/* Out of the pool or the claims; idempotent. */
static void class_leave(struct conn *c)
{
    struct server *s = c->srv;
    if (c->class == CLASS_CLAIM) {
        uintptr_t v;
        if (namemap_get(&s->claims, c->node, &v) == 0 && (struct conn *)v == c)
            namemap_del(&s->claims, c->node);
    } else if (c->class == CLASS_POOL) {
        struct addr_slot *a = c->addr;
        if (c->addr_prev)
            c->addr_prev->addr_next = c->addr_next;
        else
            a->oldest = c->addr_next;
        if (c->addr_next)
            c->addr_next->addr_prev = c->addr_prev;
        else
            a->newest = c->addr_prev;
        if (--a->count == 0) {
            namemap_del(&s->addrs, a->key);
            free(a);
        }
        if (c->pool_prev)
            c->pool_prev->pool_next = c->pool_next;
        else
            s->pool_oldest = c->pool_next;
        if (c->pool_next)
            c->pool_next->pool_prev = c->pool_prev;
        else
            s->pool_newest = c->pool_prev;
        s->npool--;
    }
    c->class = CLASS_NONE;
    c->addr = NULL;
    c->pool_prev = c->pool_next = c->addr_prev = c->addr_next = NULL;
}

static void evict(struct conn *c, const char *why)
{
    conn_lost_later(c, why); /* nothing of ours is queued: no graceful shutdown */
}

/* Room for a new stranger from a: its address's oldest goes first, then the pool's. */
static void pool_make_room(struct server *s, const char *ip)
{
    uintptr_t v;
    if (namemap_get(&s->addrs, ip, &v) == 0 && ((struct addr_slot *)v)->count >= s->per_addr_max)
        evict(((struct addr_slot *)v)->oldest, "evicted: its address holds the most unauthenticated connections "
                                               "allowed per address");
    if (s->npool >= s->pool_max && s->pool_oldest)
        evict(s->pool_oldest, "evicted: the oldest of the unauthenticated connections when their pool was full");
}

/*
 * A HELLO that names a node rdv knows: out of the strangers' reach, while
 * no other claim holds the name. Nothing is proven before the RESPONSE, so
 * a newer claim takes the name from an older one only when it names the
 * node's current session: WELCOME gives it sealed, so only that node's
 * agent knows it, and the older claim is a dead attempt of the same agent.
 * A HELLO without it (a first join, a restarted agent, or anyone who knows
 * the name) stays in the pool instead: a stranger cannot evict a member's
 * pending claim.
 */
static void claim(struct conn *c, uint64_t session)
{
    struct server *s = c->srv;
    uintptr_t v, idx;
    if (namemap_get(&s->rdv->byname, c->node, &idx) != 0)
        return;
    int resumes = session && s->rdv->nodes[idx].session == session;
    if (namemap_get(&s->claims, c->node, &v) == 0) {
        if (!resumes)
            return;
        evict((struct conn *)v, "a newer connection resumes the same node's session");
    }
    class_leave(c);
    if (namemap_put(&s->claims, c->node, (uintptr_t)c) == 0)
        c->class = CLASS_CLAIM;
}

static void conn_set_state(struct conn *c, enum conn_state to)
{
    static const int allowed[4][4] = {
        /* from HELLO  */ {0, 1, 0, 1},
        /* from AUTH   */ {0, 0, 1, 1},
        /* from JOINED */ {0, 0, 0, 1},
        /* from CLOSING*/ {0, 0, 0, 0},
    };
    if (!allowed[c->state][to]) {
        log_error("connection %s: bad transition %s -> %s", c->peer, conn_state_names[c->state],
                  conn_state_names[to]);
        return;
    }
    log_debug("connection %s%s%s: %s -> %s", c->peer, c->node[0] ? " " : "", c->node,
              conn_state_names[c->state], conn_state_names[to]);
    if (to == CONN_JOINED || to == CONN_CLOSING)
        class_leave(c);
    /* rdv refuses a second connection under a joined name, so names are unique here. */
    if (to == CONN_JOINED)
        namemap_put(&c->srv->joined, c->node, (uintptr_t)c);
    else if (c->state == CONN_JOINED)
        namemap_del(&c->srv->joined, c->node);
    c->state = to;
}

static void on_write(uv_write_t *req, int status)
{
    struct write_req *w = (struct write_req *)req;
    if (status < 0 && status != UV_ECANCELED)
        log_debug("write failed: %s", uv_strerror(status));
    free(w);
}

static void conn_submit(struct conn *c, struct write_req *w)
{
    uv_buf_t buf = uv_buf_init((char *)w->data, (unsigned)w->len);
    int rc = uv_write(&w->req, (uv_stream_t *)&c->tcp, &buf, 1, on_write);
    if (rc < 0) {
        free(w);
        conn_lost_later(c, uv_strerror(rc));
    }
}

/* The channel, derived from the token and the handshake when first needed
 * (a stranger that never answers the challenge costs no keys). */
static struct proto_channel *conn_channel(struct conn *c)
{
    if (!c->ch)
        c->ch = proto_channel_new(c->srv->token, c->srv->token_len, &c->bind, PROTO_SIDE_DAEMON);
    return c->ch;
}

/* frame[0..len) sealed in place (cap bytes of room): its new length, or < 0
 * with the connection dropped. */
static int conn_seal(struct conn *c, uint8_t *frame, size_t len, size_t cap)
{
    struct proto_channel *ch = conn_channel(c);
    int n = ch ? proto_seal(ch, frame, len, cap) : PROTO_E_CRYPTO;
    if (n < 0) {
        log_error("cannot seal a frame for %s: %s", c->peer, proto_strerror(n));
        conn_lost_later(c, "the channel's crypto failed");
    }
    return n;
}

/* after != 0: the frame waits until state write `after` is durable (server_hold). */
static void conn_write(struct conn *c, const struct proto_msg *m, uint64_t after)
{
    if (c->state == CONN_CLOSING)
        return;
    /* Called from inside rdv: a failure closes now but tells rdv later (on_closed). */
    if (uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + c->held_bytes > SERVER_MAX_WRITE_QUEUE) {
        conn_lost_later(c, "peer does not read its frames (write queue full)");
        return;
    }
    static uint8_t scratch[PROTO_MAX_SEALED]; /* the loop thread is the only user */
    int n = proto_encode(m, scratch, sizeof(scratch) - PROTO_MAC_LEN);
    if (n < 0) {
        log_error("cannot encode %s for %s: %s", proto_type_name(m->type), c->peer, proto_strerror(n));
        return;
    }
    size_t sent = 0;
    /* A frame is sealed when it is handed to the stream (now, or when a held
     * one is released), so that the channel's count follows the wire's order. */
    if (!after && c->tx_sealed && (n = conn_seal(c, scratch, (size_t)n, sizeof(scratch))) < 0)
        return;
    if (!after) {
        /* Nearly every frame (a heartbeat's echo) goes out whole at once: no
         * request, no allocation, no poll change. uv_try_write answers
         * UV_EAGAIN while earlier frames wait, so the order holds. */
        uv_buf_t buf = uv_buf_init((char *)scratch, (unsigned)n);
        int k = uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
        if (k == n)
            return;
        if (k < 0 && k != UV_EAGAIN) {
            conn_lost_later(c, uv_strerror(k));
            return;
        }
        sent = k > 0 ? (size_t)k : 0;
    }
    struct write_req *w = malloc(sizeof(*w) + (size_t)n - sent + (after ? PROTO_MAC_LEN : 0));
    if (!w) {
        conn_lost_later(c, "out of memory");
        return;
    }
    memcpy(w->data, scratch + sent, (size_t)n - sent);
    w->len = (size_t)n - sent;
    if (!after) {
        conn_submit(c, w);
        return;
    }
    w->after = after;
    w->next = NULL;
    if (c->held_tail)
        c->held_tail->next = w;
    else
        c->held = w;
    c->held_tail = w;
    c->held_bytes += w->len;
}

static void conn_send(struct conn *c, const struct proto_msg *m) { conn_write(c, m, 0); }

static void on_closed(uv_handle_t *h)
{
    struct conn *c = h->data;
    struct server *s = c->srv;
    if (c->tell_rdv_later && !s->closing_all)
        rdv_disconnected(s->rdv, c->node, c->lost_why, uv_now(s->loop));
    class_leave(c);
    free(c->hello);
    free(c->rbuf);
    proto_channel_free(c->ch);
    while (c->held) {
        struct write_req *w = c->held;
        c->held = w->next;
        free(w);
    }
    if (c->prev)
        c->prev->next = c->next;
    else
        s->conns = c->next;
    if (c->next)
        c->next->prev = c->prev;
    s->nconns--;
    free(c);
}

static void on_shutdown(uv_shutdown_t *req, int status)
{
    struct conn *c = req->data;
    free(req);
    if (!uv_is_closing((uv_handle_t *)&c->tcp))
        uv_close((uv_handle_t *)&c->tcp, on_closed);
}

/*
 * Idempotent. Queued frames (a REJECT, say) go out before the FIN. rdv hears
 * of it only when the node had joined and the close did not come from rdv.
 */
static void conn_close(struct conn *c, const char *why, int tell_rdv)
{
    if (c->state == CONN_CLOSING)
        return;
    int joined = c->state == CONN_JOINED;
    conn_set_state(c, CONN_CLOSING);
    c->closing_ms = uv_now(c->srv->loop);
    if (c->node[0])
        log_info_limited("connection %s (node %s) closed: %s", c->peer, c->node, why);
    else
        log_info_limited("connection %s closed: %s", c->peer, why);
    uv_read_stop((uv_stream_t *)&c->tcp);
    uv_shutdown_t *req = malloc(sizeof(*req));
    if (req) {
        req->data = c;
        if (uv_shutdown(req, (uv_stream_t *)&c->tcp, on_shutdown) == 0)
            goto told;
        free(req);
    }
    uv_close((uv_handle_t *)&c->tcp, on_closed);
told:
    if (joined && c->srv->node_gone)
        c->srv->node_gone(c->srv->hook_ctx, c->node);
    if (joined && tell_rdv)
        rdv_disconnected(c->srv->rdv, c->node, why, uv_now(c->srv->loop));
}

/* For failures met while rdv is on the stack (inside a send): no re-entry. */
static void conn_lost_later(struct conn *c, const char *why)
{
    if (c->state == CONN_CLOSING)
        return;
    if (c->state == CONN_JOINED) {
        c->tell_rdv_later = 1;
        snprintf(c->lost_why, sizeof(c->lost_why), "%s", why);
    }
    conn_close(c, why, 0);
    uv_close((uv_handle_t *)&c->tcp, on_closed); /* no graceful shutdown for a peer that does not read */
}

static void send_reject(struct conn *c, const char *code, const char *reason)
{
    struct proto_msg m = {.type = PROTO_REJECT};
    snprintf(m.u.reject.code, sizeof(m.u.reject.code), "%s", code);
    snprintf(m.u.reject.reason, sizeof(m.u.reject.reason), "%s", reason);
    conn_send(c, &m);
    conn_close(c, reason, 0);
}

/*
 * HELLO (frame[0..len) as read): musterd answers its challenge with its own
 * nonce and its proof of the token over both nonces and the HELLO, so that
 * the agent can tell musterd from a stranger before it answers anything.
 */
/*
 * A failed authentication: logged (rate-limited) and counted, and an
 * auth_failed event at most once per address and node name per
 * SERVER_AUTH_NOTE_MS, SERVER_AUTH_NOTES_MAX in all per interval, naming
 * the failures held back: a churn of wrong answers must not push node_lost,
 * rank_failed or hang events out of the event ring.
 */
static void note_auth_failed(struct conn *c, const char *what)
{
    struct server *s = c->srv;
    uint64_t now = uv_now(s->loop);
    char key[sizeof(s->auth_notes[0].key)], note[PROTO_REASON_MAX + 160];
    const char *colon = strrchr(c->peer, ':');
    int iplen = colon ? (int)(colon - c->peer) : (int)strlen(c->peer);

    s->auth_failures++;
    snprintf(key, sizeof(key), "%.*s %s", iplen, c->peer, c->node);
    log_warn_limited("node %s from %s failed authentication: %s", c->node, c->peer, what);
    struct auth_note *slot = NULL, *oldest = &s->auth_notes[0];
    for (unsigned i = 0; i < SERVER_AUTH_NOTE_SLOTS; i++) {
        struct auth_note *n = &s->auth_notes[i];
        if (n->key[0] && strcmp(n->key, key) == 0) {
            slot = n;
            break;
        }
        if (!n->key[0] || n->at < oldest->at)
            oldest = n;
    }
    if (now - s->auth_window_at >= SERVER_AUTH_NOTE_MS) {
        s->auth_window_at = now;
        s->auth_window_notes = 0;
    }
    if ((slot && now - slot->at < SERVER_AUTH_NOTE_MS) || s->auth_window_notes >= SERVER_AUTH_NOTES_MAX) {
        if (slot)
            slot->held++;
        return;
    }
    uint64_t held = slot ? slot->held : 0;
    if (!slot) {
        slot = oldest;
        snprintf(slot->key, sizeof(slot->key), "%s", key);
    }
    slot->at = now;
    slot->held = 0;
    s->auth_window_notes++;
    snprintf(note, sizeof(note),
             "node %s from %s failed authentication: %s (%" PRIu64 " more from that address and name since its "
             "last such event; %" PRIu64 " failures since musterd started)",
             c->node, c->peer, what, held, s->auth_failures);
    rdv_note(s->rdv, "auth_failed", note);
}

static void on_hello(struct conn *c, const struct proto_msg *m, const uint8_t *frame, size_t len)
{
    struct proto_msg ch = {.type = PROTO_CHALLENGE};

    c->hello = malloc(sizeof(*c->hello));
    if (!c->hello) {
        send_reject(c, "internal", "musterd is out of memory");
        return;
    }
    *c->hello = m->u.hello;
    snprintf(c->node, sizeof(c->node), "%s", m->u.hello.node);
    claim(c, m->u.hello.session);
    if (proto_bind_hello(&c->bind, frame, len, &m->u.hello) != 0 || proto_nonce(c->bind.daemon_nonce) != 0 ||
        proto_proof(c->srv->token, c->srv->token_len, &c->bind, PROTO_SIDE_DAEMON, ch.u.challenge.hmac) != 0) {
        send_reject(c, "internal", "musterd could not draw a nonce or compute its proof");
        return;
    }
    memcpy(ch.u.challenge.nonce, c->bind.daemon_nonce, PROTO_NONCE_LEN);
    conn_set_state(c, CONN_AUTH);
    conn_send(c, &ch);
    c->tx_sealed = 1;
}

/* An agent that cannot verify musterd's proof says so (ERROR auth) and
 * leaves: its token is not musterd's (or musterd is not the one it meant). */
static void on_proof_refused(struct conn *c)
{
    note_auth_failed(c, "it refused musterd's proof (its cluster token differs)");
    conn_close(c, "the agent refused musterd's proof of the token", 0);
}

static void on_response(struct conn *c, const struct proto_msg *m)
{
    struct server *s = c->srv;
    char code[32], reason[PROTO_REASON_MAX];

    if (!conn_channel(c)) {
        conn_close(c, "the channel's crypto failed", 0);
        return;
    }
    c->rx_sealed = 1;
    if (!proto_proof_verify(s->token, s->token_len, &c->bind, PROTO_SIDE_AGENT, m->u.response.hmac)) {
        note_auth_failed(c, "wrong cluster token");
        send_reject(c, "auth", "wrong cluster token (the agent's proof does not verify)");
        return;
    }
    if (s->admit && s->admit(s->hook_ctx, code, reason) != 0) {
        log_debug("node %s from %s refused: %s: %s", c->node, c->peer, code, reason);
        send_reject(c, code, reason);
        return;
    }
    uintptr_t known;
    if (namemap_get(&s->rdv->byname, c->node, &known) != 0 && s->joined.count >= s->max_conns) {
        /* Only a node rdv does not know can be turned away for room: members always have theirs. */
        snprintf(reason, sizeof(reason),
                 "musterd is at its limit of %u joined connections (job %s: %d node%s + %d spare); retry "
                 "later, or check for agents that are not part of this job",
                 s->max_conns, s->rdv->spec->name, s->rdv->spec->nodes, s->rdv->spec->nodes == 1 ? "" : "s",
                 (int)s->max_conns - s->rdv->spec->nodes);
        LOG_LIMITED(LOG_WARN, "node %s from %s refused: %s", c->node, c->peer, reason);
        send_reject(c, PROTO_REJECT_FULL, reason);
        return;
    }
    s->joining = c;
    int rc = rdv_join(s->rdv, c->hello, uv_now(s->loop), code, reason);
    s->joining = NULL;
    if (rc != 0) {
        log_warn_limited("node %s from %s refused: %s: %s", c->node, c->peer, code, reason);
        send_reject(c, code, reason);
        return;
    }
    free(c->hello);
    c->hello = NULL;
    conn_set_state(c, CONN_JOINED);
}

static void on_frame(struct conn *c, const struct proto_msg *m, const uint8_t *frame, size_t len)
{
    switch (c->state) {
    case CONN_HELLO:
        if (m->type != PROTO_HELLO) {
            send_reject(c, "bad_request", "expected HELLO first");
            return;
        }
        on_hello(c, m, frame, len);
        return;
    case CONN_AUTH:
        if (m->type == PROTO_ERROR && strcmp(m->u.error.code, PROTO_REJECT_AUTH) == 0) {
            on_proof_refused(c);
            return;
        }
        if (m->type != PROTO_RESPONSE) {
            send_reject(c, "bad_request", "expected RESPONSE to the challenge");
            return;
        }
        on_response(c, m);
        return;
    case CONN_JOINED:
        switch (m->type) {
        case PROTO_HEARTBEAT:
        case PROTO_UNIQUE_ID:
        case PROTO_RANK_EXIT:
        case PROTO_ERROR:
        case PROTO_PREFLIGHT:
        case PROTO_STACKS:
        case PROTO_MEM_FILE:
            c->srv->speaking = c;
            rdv_message(c->srv->rdv, c->node, m, uv_now(c->srv->loop));
            c->srv->speaking = NULL;
            return;
        case PROTO_LOG_DATA:
            /* Heard from the node (any frame counts); the piece itself goes to the log fetcher. */
            rdv_message(c->srv->rdv, c->node, m, uv_now(c->srv->loop));
            if (c->srv->log_data)
                c->srv->log_data(c->srv->hook_ctx, c->node, &m->u.log_data);
            return;
        default: {
            struct proto_msg e = {.type = PROTO_ERROR};
            unsigned long held;
            char note[64];
            snprintf(e.u.error.code, sizeof(e.u.error.code), "bad_request");
            snprintf(e.u.error.reason, sizeof(e.u.error.reason), "%s is not expected from an agent",
                     proto_type_name(m->type));
            if (ratelimit_pass(&c->ignored_log, uv_now(c->srv->loop), RATELIMIT_PEER_MS, &held))
                log_warn("node %s sent %s, which agents do not send: ignored%s", c->node, proto_type_name(m->type),
                         ratelimit_note(held, note, sizeof(note)));
            conn_send(c, &e);
            return;
        }
        }
    case CONN_CLOSING:
        return;
    }
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct conn *c = h->data;
    if (!c->rbuf) { /* a stranger with nothing buffered: the shared buffer */
        buf->base = (char *)c->srv->preauth_buf;
        buf->len = sizeof(c->srv->preauth_buf);
        return;
    }
    buf->base = (char *)c->rbuf + c->rlen;
    buf->len = c->rcap - c->rlen;
}

/*
 * After a read: what is left of a frame moves out of the shared buffer into
 * the connection's own, sized by what it may still send: the largest frame
 * once joined, SERVER_PREAUTH_FRAME_MAX before. A stranger's own buffer goes
 * as soon as it is empty. 0, or -1 when out of memory.
 */
static int keep_rest(struct conn *c, const uint8_t *data)
{
    size_t want = c->state == CONN_JOINED ? PROTO_MAX_SEALED : SERVER_PREAUTH_FRAME_MAX;
    if (c->state != CONN_JOINED && c->rlen == 0) {
        free(c->rbuf);
        c->rbuf = NULL;
        c->rcap = 0;
        return 0;
    }
    if (c->rcap < want) {
        uint8_t *b = malloc(want);
        if (!b)
            return -1;
        memcpy(b, data, c->rlen);
        free(c->rbuf);
        c->rbuf = b;
        c->rcap = want;
    } else if (data != c->rbuf) {
        memmove(c->rbuf, data, c->rlen); /* data may lie inside c->rbuf */
    }
    return 0;
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf)
{
    struct conn *c = stream->data;
    char why[PROTO_REASON_MAX];
    /* Frames start at data: the connection's own buffer, or the shared one. */
    uint8_t *data = c->rbuf ? c->rbuf : c->srv->preauth_buf;

    if (nread == UV_EOF) {
        conn_close(c, c->rlen ? "connection closed inside a frame" : "connection closed", 1);
        return;
    }
    if (nread < 0) {
        conn_close(c, uv_strerror((int)nread), 1);
        return;
    }
    c->rlen += (size_t)nread;
    if (nread > 0) /* 0: libuv found the socket drained and hands the buffer back */
        coalesce_note(&c->srv->batch, &c->noted);
    while (c->state != CONN_CLOSING) {
        struct proto_msg m;
        size_t used = 0;
        int rc = c->rx_sealed ? proto_open(c->ch, data, c->rlen, &m, &used) : proto_decode(data, c->rlen, &m, &used);
        if (rc == PROTO_NEED_MORE) {
            if (c->state != CONN_JOINED && c->rlen >= SERVER_PREAUTH_FRAME_MAX) {
                snprintf(why, sizeof(why), "a frame before authentication is limited to %u bytes",
                         (unsigned)SERVER_PREAUTH_FRAME_MAX);
                send_reject(c, PROTO_REJECT_BAD_REQUEST, why);
                return;
            }
            break;
        }
        if (rc < 0) {
            snprintf(why, sizeof(why), "bad frame: %s", proto_strerror(rc));
            if (c->state == CONN_JOINED && used > 0) {
                /* A whole frame with a bad payload: say so, skip it, keep the node. */
                struct proto_msg e = {.type = PROTO_ERROR};
                snprintf(e.u.error.code, sizeof(e.u.error.code), "bad_request");
                snprintf(e.u.error.reason, sizeof(e.u.error.reason), "%s (frame skipped)", why);
                unsigned long held;
                char note[64];
                if (ratelimit_pass(&c->ignored_log, uv_now(c->srv->loop), RATELIMIT_PEER_MS, &held))
                    log_warn("node %s sent a %s%s", c->node, e.u.error.reason, ratelimit_note(held, note, sizeof(note)));
                conn_send(c, &e);
                data += used;
                c->rlen -= used;
                continue;
            }
            if (rc == PROTO_E_MAC) {
                char note[PROTO_REASON_MAX];
                snprintf(note, sizeof(note),
                         "a frame from node %s (%s) failed authentication (forged, altered, replayed or "
                         "reordered on the way): link reset",
                         c->node, c->peer);
                log_warn_limited("%s", note);
                rdv_note(c->srv->rdv, "bad_mac", note);
            }
            if (c->state == CONN_JOINED) {
                conn_close(c, why, 1);
            } else {
                send_reject(c, rc == PROTO_E_VERSION ? "version" : "bad_request", why);
            }
            return;
        }
        on_frame(c, &m, data, used);
        proto_msg_clear(&m);
        data += used;
        c->rlen -= used;
    }
    if (c->state != CONN_CLOSING && keep_rest(c, data) != 0)
        conn_close(c, "out of memory for its read buffer", 1);
}

static void on_connection(uv_stream_t *listener, int status)
{
    struct server *s = listener->data;
    struct sockaddr_storage ss;
    int sslen = sizeof(ss);
    char ip[INET6_ADDRSTRLEN] = "?";

    if (status < 0) {
        log_warn_limited("accept failed: %s", uv_strerror(status));
        return;
    }
    struct conn *c = calloc(1, sizeof(*c));
    if (!c)
        return;
    c->srv = s;
    uv_tcp_init(s->loop, &c->tcp);
    c->tcp.data = c;
    c->next = s->conns;
    if (s->conns)
        s->conns->prev = c;
    s->conns = c;
    s->nconns++;
    if (uv_accept(listener, (uv_stream_t *)&c->tcp) != 0) {
        c->state = CONN_CLOSING;
        uv_close((uv_handle_t *)&c->tcp, on_closed);
        return;
    }
    if (uv_tcp_getpeername(&c->tcp, (struct sockaddr *)&ss, &sslen) == 0 && ss.ss_family == AF_INET) {
        struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
        uv_ip4_name(sin, ip, sizeof(ip));
        snprintf(c->peer, sizeof(c->peer), "%s:%u", ip, ntohs(sin->sin_port));
    } else {
        snprintf(c->peer, sizeof(c->peer), "?");
    }
    c->accepted_ms = uv_now(s->loop);
    uv_tcp_nodelay(&c->tcp, 1);
    /* Strangers make room among themselves; members' slots are not theirs. */
    pool_make_room(s, ip);
    pool_add(c, ip);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

/* The node's established connection. */
static struct conn *find_established(struct server *s, const char *node)
{
    uintptr_t c;
    return namemap_get(&s->joined, node, &c) == 0 ? (struct conn *)c : NULL;
}

/* Where frames to the node go: during rdv_join, the connection being admitted. */
static struct conn *find_joined(struct server *s, const char *node)
{
    if (s->joining && strcmp(s->joining->node, node) == 0)
        return s->joining;
    if (s->speaking && s->speaking->state == CONN_JOINED && strcmp(s->speaking->node, node) == 0)
        return s->speaking;
    return find_established(s, node);
}

/*
 * rdv's frames wait for the state write that precedes them (server_hold),
 * so that no agent acts on a decision a crash would forget. Two kinds carry
 * no decision and go at once, or a disk slow to make a write durable (a
 * loaded one takes seconds for an fsync) would silence musterd for as long:
 * the agents, hearing no answer to their heartbeats, take the link for
 * stalled, resume their sessions, and lose them as the WELCOME waits too.
 *   - WELCOME, on a connection where nothing waits before it: a join
 *     persists nothing (what it sets off waits as usual).
 *   - A heartbeat's answer, as a liveness echo of sequence number 0, which
 *     confirms no exit (exitq: an exit is confirmed by the echo of a beat
 *     sent after it); the real echo waits, and confirms once durable.
 * Both only while the writes progress: a state write waiting for lease_ms
 * (etcd full, a write it refuses, a disk gone) means nothing more is
 * decided, and the agents are let to see it and fence themselves.
 */
void server_send(void *ctx, const char *node, const struct proto_msg *msg)
{
    struct server *s = ctx;
    struct conn *c = find_joined(s, node);
    if (!c)
        return;
    uint64_t after = s->gate > s->durable ? s->gate : 0;
    const int progressing = after && uv_now(s->loop) - s->held_since_ms < (uint64_t)s->rdv->spec->lease_ms;
    if (progressing && msg->type == PROTO_WELCOME && !c->held)
        after = 0;
    if (progressing && msg->type == PROTO_HEARTBEAT) {
        static struct proto_msg alive; /* the loop thread's; only its head is written */
        proto_heartbeat_start(&alive);
        alive.u.heartbeat.generation = msg->u.heartbeat.generation;
        alive.u.heartbeat.seq = 0;
        conn_write(c, &alive, 0);
    }
    conn_write(c, msg, after);
}

size_t server_queued(struct server *s, const char *node)
{
    struct conn *c = find_joined(s, node);
    return c ? uv_stream_get_write_queue_size((uv_stream_t *)&c->tcp) + c->held_bytes : 0;
}

void server_hold(struct server *s, uint64_t seq)
{
    if (seq > s->gate) {
        if (s->gate <= s->durable)
            s->held_since_ms = uv_now(s->loop);
        s->gate = seq;
    }
}

/*
 * The frames a durable write let go (a new generation's COMMAND and ASSIGN,
 * typically), in order, with one writev where the socket takes them: at
 * 4096 agents a recovery is then 4096 system calls, not 8192.
 */
#define RELEASE_BATCH 16
static void conn_flush(struct conn *c, struct write_req **ws, unsigned n)
{
    uv_buf_t bufs[RELEASE_BATCH];
    for (unsigned i = 0; i < n; i++)
        bufs[i] = uv_buf_init((char *)ws[i]->data, (unsigned)ws[i]->len);
    int k = uv_try_write((uv_stream_t *)&c->tcp, bufs, n);
    if (k < 0 && k != UV_EAGAIN) {
        for (unsigned i = 0; i < n; i++)
            free(ws[i]);
        conn_lost_later(c, uv_strerror(k));
        return;
    }
    size_t sent = k > 0 ? (size_t)k : 0;
    for (unsigned i = 0; i < n; i++) {
        struct write_req *w = ws[i];
        if (sent >= w->len) {
            sent -= w->len;
            free(w);
            continue;
        }
        if (sent) { /* the rest of a frame cut short goes first */
            memmove(w->data, w->data + sent, w->len - sent);
            w->len -= sent;
            sent = 0;
        }
        conn_submit(c, w);
    }
}

void server_release(struct server *s, uint64_t seq)
{
    if (seq > s->durable)
        s->durable = seq;
    if (s->durable >= s->gate)
        s->held_since_ms = 0;
    else if (seq == s->durable)
        s->held_since_ms = uv_now(s->loop); /* the next write's wait, from now */
    for (struct conn *c = s->conns; c; c = c->next) {
        while (c->held && c->held->after <= s->durable) {
            struct write_req *ws[RELEASE_BATCH];
            unsigned n = 0;
            while (n < RELEASE_BATCH && c->held && c->held->after <= s->durable) {
                struct write_req *w = c->held;
                c->held = w->next;
                if (!c->held)
                    c->held_tail = NULL;
                c->held_bytes -= w->len;
                ws[n++] = w;
            }
            for (unsigned i = 0; i < n && c->state != CONN_CLOSING; i++) {
                int k = c->tx_sealed ? conn_seal(c, ws[i]->data, ws[i]->len, ws[i]->len + PROTO_MAC_LEN)
                                     : (int)ws[i]->len;
                if (k > 0)
                    ws[i]->len = (size_t)k;
            }
            if (c->state == CONN_CLOSING) {
                for (unsigned i = 0; i < n; i++)
                    free(ws[i]);
                continue;
            }
            conn_flush(c, ws, n);
        }
    }
}

/* Never the connection being admitted: rdv refuses that one by its answer; a
 * node resuming its session on it has its old connection closed here. */
void server_disconnect(void *ctx, const char *node, const char *why)
{
    struct conn *c = find_established(ctx, node);
    if (c)
        conn_close(c, why, 0);
}

void server_tick(struct server *s)
{
    if (s->nconns == s->joined.count)
        return; /* every connection is joined: no deadline to watch */
    uint64_t now = uv_now(s->loop);
    for (struct conn *c = s->conns; c; c = c->next) {
        if (c->state == CONN_HELLO && now - c->accepted_ms > SERVER_HELLO_MS)
            conn_close(c, "no HELLO in time", 0);
        else if (c->state == CONN_AUTH && now - c->accepted_ms > SERVER_HANDSHAKE_MS)
            conn_close(c, "handshake not finished in time", 0);
        /* A peer that does not read keeps a graceful shutdown pending for ever. */
        if (c->state == CONN_CLOSING && now - c->closing_ms > SERVER_CLOSE_MS && !uv_is_closing((uv_handle_t *)&c->tcp))
            uv_close((uv_handle_t *)&c->tcp, on_closed);
    }
}

unsigned server_conn_limit(int nodes) { return (unsigned)nodes + (unsigned)nodes / 4 + SERVER_CONN_MARGIN; }

/* The system's largest listen backlog: listen() caps what it is given at it. */
static int listen_backlog(void)
{
    int n = 0;
    FILE *f = fopen("/proc/sys/net/core/somaxconn", "r");
    if (f) {
        if (fscanf(f, "%d", &n) != 1)
            n = 0;
        fclose(f);
    }
    return n > SOMAXCONN ? n : SOMAXCONN;
}

int server_start(struct server **out, uv_loop_t *loop, const struct server_config *cfg, struct rdv *rdv,
                 char *err, size_t errlen)
{
    struct sockaddr_in sin;
    struct server *s = calloc(1, sizeof(*s));
    int rc;

    if (!s)
        return -ENOMEM;
    s->loop = loop;
    s->rdv = rdv;
    s->token = malloc(cfg->token_len ? cfg->token_len : 1);
    if (!s->token) {
        free(s);
        return -ENOMEM;
    }
    memcpy(s->token, cfg->token, cfg->token_len);
    s->token_len = cfg->token_len;
    s->max_conns = cfg->max_conns ? cfg->max_conns : server_conn_limit(rdv->spec->nodes);
    s->pool_max = cfg->preauth_max ? cfg->preauth_max : s->max_conns;
    s->per_addr_max = cfg->preauth_per_addr ? cfg->preauth_per_addr : SERVER_PREAUTH_PER_ADDR;
    if (namemap_init(&s->joined, s->max_conns + 1) != 0 || namemap_init(&s->addrs, s->pool_max + 1) != 0 ||
        namemap_init(&s->claims, RDV_MAX_NODES) != 0) {
        namemap_free(&s->joined);
        namemap_free(&s->addrs);
        free(s->token);
        free(s);
        return -ENOMEM;
    }
    s->log_data = cfg->log_data;
    s->node_gone = cfg->node_gone;
    s->admit = cfg->admit;
    s->hook_ctx = cfg->hook_ctx;
    if ((rc = uv_ip4_addr(cfg->addr, cfg->port, &sin)) != 0) {
        snprintf(err, errlen, "--listen: %s is not an IPv4 address", cfg->addr);
        namemap_free(&s->joined);
        namemap_free(&s->addrs);
        namemap_free(&s->claims);
        free(s->token);
        free(s);
        return -EINVAL;
    }
    uv_tcp_init(loop, &s->listener);
    s->listener.data = s;
    s->listener_open = 1;
    coalesce_start(&s->batch, loop, SERVER_COALESCE_MIN, SERVER_COALESCE_US); /* fails only on a bad loop */
    rc = uv_tcp_bind(&s->listener, (const struct sockaddr *)&sin, 0);
    if (rc == 0)
        rc = uv_listen((uv_stream_t *)&s->listener, listen_backlog(), on_connection);
    if (rc != 0) {
        if (rc == UV_EADDRINUSE)
            snprintf(err, errlen,
                     "control port %s:%u is already in use (another musterd? `ss -ltnp 'sport = :%u'` "
                     "shows the process)",
                     cfg->addr, cfg->port, cfg->port);
        else
            snprintf(err, errlen, "cannot listen on %s:%u: %s", cfg->addr, cfg->port, uv_strerror(rc));
        *out = s; /* the caller closes it like a running one */
        return rc == UV_EADDRINUSE ? -EADDRINUSE : rc;
    }
    struct sockaddr_storage bound;
    int blen = sizeof(bound);
    uv_tcp_getsockname(&s->listener, (struct sockaddr *)&bound, &blen);
    s->port = ntohs(((struct sockaddr_in *)&bound)->sin_port);
    *out = s;
    return 0;
}

uint16_t server_port(const struct server *s) { return s->port; }


void server_close(struct server *s)
{
    if (s->listener_open) {
        uv_close((uv_handle_t *)&s->listener, NULL);
        s->listener_open = 0;
        coalesce_close(&s->batch);
    }
    s->closing_all = 1;
    for (struct conn *c = s->conns; c; c = c->next) {
        if (c->state != CONN_CLOSING)
            conn_set_state(c, CONN_CLOSING);
        if (!uv_is_closing((uv_handle_t *)&c->tcp))
            uv_close((uv_handle_t *)&c->tcp, on_closed);
    }
}

void server_free(struct server *s)
{
    if (!s)
        return;
    namemap_free(&s->joined);
    namemap_free(&s->addrs);
    namemap_free(&s->claims);
    free(s->token);
    free(s);
}
