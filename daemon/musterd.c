/*
 * musterd: the coordinator. One libuv loop owns all state (rdv + server);
 * the REST thread sees it only through the published snapshot, and admin
 * requests and rank log requests come back into the loop through a locked
 * queue and uv_async each.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <uv.h>

#include "common/hostport.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/notify.h"
#include "common/token.h"
#include "daemon/history.h"
#include "daemon/etcd_codec.h"
#include "daemon/http.h"
#include "daemon/http_host.h"
#include "daemon/logfetch.h"
#include "daemon/musterd_config.h"
#include "daemon/persist.h"
#include "daemon/rdv.h"
#include "daemon/server.h"
#include "daemon/snapshot.h"
#include "daemon/state.h"
#include "daemon/store_etcd.h"
#include "daemon/view_build.h"

#define TICK_MS 100
/* A tick this much later than the last: musterd was paused (see on_tick). */
#define PAUSE_MS 500
/* The status snapshot is rebuilt (O(ranks)) only when something changed:
 * a state change at the next tick; heartbeat figures (steps, losses) at
 * most every PUBLISH_FIGURES_MS while someone reads the status, and every
 * PUBLISH_IDLE_MS when nobody does (so a first reader sees figures at most
 * that old, and the next one fresh ones); ages and uptime at least every
 * PUBLISH_IDLE_MS when nothing else moves. */
#define PUBLISH_FIGURES_MS 1000
#define PUBLISH_IDLE_MS 5000
#define ADMIN_QUEUE 32
/* Open files musterd needs besides agent connections: REST connections
 * (HTTP_CONNECTION_LIMIT), the state file, logs, libuv's own. */
#define FD_RESERVE (HTTP_CONNECTION_LIMIT + 128)
/* The run's curve (GET /v1/history): a sample a second while the step moves,
 * at most HISTORY_POINTS points over the whole run. */
#define HISTORY_SAMPLE_MS 1000
#define STACKS_RENDER_MS 500
#define HISTORY_POINTS 1024

struct admin_req {
    enum http_admin_action action;
    char node[PROTO_NAME_MAX];
};

struct daemon {
    uv_loop_t loop;
    uv_timer_t tick;
    uv_timer_t watchdog;  /* WATCHDOG=1 at half of $WATCHDOG_USEC */
    char status_line[160]; /* last STATUS= sent to systemd */
    uv_signal_t sigterm, sigint;
    uv_async_t admin_async;
    struct logfetch logfetch; /* GET /v1/ranks/{rank}/log */
    struct rdv rdv;
    struct server *server;
    struct http_server *http;
    struct snapshot snap;
    struct history history;
    char *history_text;    /* its JSON as last rendered */
    uint64_t history_at;   /* when it was last sampled */
    uint64_t history_step; /* the step of that sample */
    struct snap_shared *stacks; /* GET /v1/stacks as last rendered, shared by the views */
    uint64_t stacks_version;    /* of rdv.stacks when rendered */
    uint64_t stacks_at;         /* when */
    const char *state_dir;
    struct persist persist; /* the state file, written off the loop (group commit) */
    struct store *store;  /* the job's state in etcd, NULL = the state file */
    int leading;          /* with a store: elected, state loaded, agents admitted */
    int dirty;            /* snapshot out of date: the job's state changed */
    uint64_t last_publish;
    int exit_on_end;
    int exit_code;
    int stopping;
    uint64_t end_seen_ms; /* when a terminal state was first seen (exit_on_end) */
    uint64_t last_tick;   /* uv_now at the last on_tick (0: none yet) */

    pthread_mutex_t admin_lock;
    struct admin_req admin[ADMIN_QUEUE];
    int nadmin;
};

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: musterd [--config FILE] [--job FILE] [OPTION]...\n"
            "Coordinate a training job: accept worker agents, hand out ranks, watch\n"
            "heartbeats, restart failed ranks in a new generation.\n\n"
            "  --config FILE            musterd.json (keys in docs/config.md); without it and\n"
            "                           without --job, $CONFIGURATION_DIRECTORY/musterd.json\n"
            "                           (or /etc/muster/musterd.json) is read when it exists;\n"
            "                           options given here override the file\n"
            "  --job FILE               job spec (JSON; keys in docs/jobspec.md)\n"
            "  --listen ADDR:PORT       control port for agents (default 0.0.0.0:29470)\n"
            "  --http ADDR:PORT         REST API and dashboard (default 127.0.0.1:29471)\n"
            "  --state-dir DIR          where the state file lives (default $STATE_DIRECTORY\n"
            "                           or /var/lib/muster)\n"
            "  --token-file FILE        cluster token agents must prove (default\n"
            "                           $CONFIGURATION_DIRECTORY/token or /etc/muster/token)\n"
            "  --admin-token-file FILE  token for admin REST calls (default: admin off)\n"
            "  --read-token-file FILE   token every REST GET but /healthz needs (default:\n"
            "                           reads open; a warning when --http is not loopback)\n"
            "                           (token files must be mode 0600: chmod 600 FILE)\n"
            "  --preauth-per-address N  unauthenticated control connections one address\n"
            "                           may hold (default 64; the oldest goes for a new one)\n"
            "  --store etcd://HOST:PORT[,HOST:PORT...]   (or https://: TLS)\n"
            "                           keep the job's state in etcd and lead the job only when\n"
            "                           elected among the musterd given the same store; the\n"
            "                           others stand by and take over (docs/operator-guide.md)\n"
            "  --advertise HOST:PORT    control address agents reach this musterd at (with\n"
            "                           --store; default: from --listen)\n"
            "  --exit-on-end            when the job completes (exit 0) or fails or stops\n"
            "                           (exit 1), shut the agents down and exit\n"
            "  --log-level LEVEL        error, warn, info (default), debug\n"
            "  --help, --version\n");
}

/* ---- rdv ops --------------------------------------------------------- */

static void persist_state(struct daemon *d);

static void on_changed(void *ctx, int persist)
{
    struct daemon *d = ctx;
    d->dirty = 1;
    if (persist)
        persist_state(d); /* frames naming a new generation may follow: they wait for the write */
}

/* With a store, only a leader whose lease cannot have ended acts: a frame
 * rdv sends otherwise is dropped (and the store tells the loop it is deposed). */
static int acting(struct daemon *d)
{
    return !d->store || (d->leading && store_acting(d->store));
}

static void ops_send(void *ctx, const char *node, const struct proto_msg *m)
{
    struct daemon *d = ctx;
    if (!acting(d)) {
        log_debug("%s to %s not sent: this musterd does not lead", proto_type_name(m->type), node);
        return;
    }
    server_send(d->server, node, m);
}

static size_t ops_queued(void *ctx, const char *node)
{
    struct daemon *d = ctx;
    return server_queued(d->server, node);
}

static void ops_disconnect(void *ctx, const char *node, const char *why)
{
    struct daemon *d = ctx;
    server_disconnect(d->server, node, why);
}

/* ---- rank logs -------------------------------------------------------- */

/* The node holding rank in the current generation's layout. */
static int locate_rank(void *ctx, uint32_t rank, char node[PROTO_NAME_MAX], bool *connected, char *why,
                       size_t cap)
{
    struct daemon *d = ctx;
    const struct rdv *r = &d->rdv;
    if (r->world_size == 0) {
        snprintf(why, cap, "the job has no ranks yet (it is %s)", rdv_job_state_name(r->state));
        return -ENOENT;
    }
    if (rank >= r->world_size) {
        snprintf(why, cap, "rank %u is not in generation %llu, which has ranks 0..%u", rank,
                 (unsigned long long)r->generation, r->world_size - 1);
        return -ENOENT;
    }
    const struct rdv_node *nd = &r->nodes[r->ranks[rank].node];
    snprintf(node, PROTO_NAME_MAX, "%s", nd->name);
    *connected = nd->state == RDV_NODE_JOINED;
    return 0;
}

static void on_log_data(void *ctx, const char *node, const struct proto_log_data *ld)
{
    struct daemon *d = ctx;
    logfetch_data(&d->logfetch, node, ld);
}

static void on_node_gone(void *ctx, const char *node)
{
    struct daemon *d = ctx;
    logfetch_node_lost(&d->logfetch, node);
}

/* HTTP thread: queue only. */
static void log_from_http(void *ctx, struct logfetch_req *req)
{
    struct daemon *d = ctx;
    logfetch_submit(&d->logfetch, req);
}

/* ---- loop work ------------------------------------------------------- */

static void persist_state(struct daemon *d)
{
    if (d->store && !d->leading)
        return; /* a standby's rdv holds nothing of the job's */
    uint64_t seq = persist_request(&d->persist, &d->rdv);
    if (d->server)
        server_hold(d->server, seq);
}

static void on_durable(void *ctx, uint64_t seq)
{
    struct daemon *d = ctx;
    if (d->server && acting(d))
        server_release(d->server, seq);
}

/* ---- the store (several musterd for one job) --------------------------- */

/* persist's pool thread: the state to etcd, if this musterd still leads. */
static int store_sink(void *ctx, const struct rdv_saved *saved, char *err, size_t errlen)
{
    struct daemon *d = ctx;
    char *text = state_to_text(saved);
    if (!text) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = store_write_state(d->store, text, err, errlen);
    free(text);
    return rc;
}

/* A standby refuses every agent, naming the leader. */
static int admit(void *ctx, char code[32], char reason[PROTO_REASON_MAX])
{
    struct daemon *d = ctx;
    char leader[LEADER_ADDR_MAX];
    if (!d->store || d->leading)
        return 0;
    store_leader(d->store, leader, sizeof(leader));
    snprintf(code, 32, "%s", PROTO_REJECT_NOT_LEADER);
    if (leader[0])
        snprintf(reason, PROTO_REASON_MAX, "%s leads; this musterd stands by", leader);
    else
        snprintf(reason, PROTO_REASON_MAX, "no leader; this musterd stands by until one is elected");
    return -1;
}

static void begin_shutdown(struct daemon *d);

/* Elected: the job's state from etcd (none: a fresh job), then agents are admitted. */
static void take_over(struct daemon *d, struct store_event *ev)
{
    static struct rdv_saved saved;
    char err[1024];
#ifdef MUSTER_MUTANT_NO_STATE_RESTORE
    /* A broken failover for `make check-mutants` only (tests/mutants.sh): the new leader ignores the stored state. */
    ev->state = NULL;
#endif
    if (ev->state) {
        int rc = state_from_text(ev->state, "etcd key " STORE_PREFIX "<job>/state", &saved, err, sizeof(err));
        if (rc == 0 && strcmp(saved.job, d->rdv.spec->name) != 0) {
            snprintf(err, sizeof(err), "the stored state belongs to job '%s', not '%s'", saved.job,
                     d->rdv.spec->name);
            rc = -EINVAL;
        }
        if (rc == 0 && rdv_restore(&d->rdv, &saved, uv_now(&d->loop)) != 0) {
            snprintf(err, sizeof(err), "the stored state's membership is inconsistent");
            rc = -EINVAL;
        }
        if (rc != 0) {
            log_error("elected, but cannot lead: %s", err);
            d->exit_code = 1;
            begin_shutdown(d);
            return;
        }
    }
    d->leading = 1;
    d->rdv.term = (uint64_t)ev->term;
    log_info("leading job %s (term %lld): %s", d->rdv.spec->name, (long long)ev->term,
             ev->state ? "state loaded from etcd; agents resume their sessions" : "no stored state: a fresh job");
    char note[PROTO_REASON_MAX];
    snprintf(note, sizeof(note), "this musterd leads the job (term %lld)", (long long)ev->term);
    rdv_note(&d->rdv, "leader_elected", note);
    d->dirty = 1;
    persist_state(d);
}

static void on_store_event(void *ctx, struct store_event *ev)
{
    struct daemon *d = ctx;
    if (!d->stopping) {
        switch (ev->kind) {
        case STORE_ELECTED: take_over(d, ev); break;
        case STORE_STANDBY:
            d->dirty = 1; /* REST sends clients to the leader */
            log_info("standing by: %s leads job %s (term %lld)", ev->leader[0] ? ev->leader : "another musterd",
                     d->rdv.spec->name, (long long)ev->term);
            break;
        case STORE_NO_QUORUM: {
            /* Nobody can be elected meanwhile: the running generation goes on. */
            char note[PROTO_REASON_MAX];
            snprintf(note, sizeof(note),
                     "store: no quorum: %s; the running generation goes on, a new one waits for quorum", ev->why);
            log_warn("%s", note);
            notify_sendf("STATUS=leading, etcd without quorum: holding the running generation");
            rdv_note(&d->rdv, "store", note);
            break;
        }
        case STORE_QUORUM:
            log_info("store: %s", ev->why);
            rdv_note(&d->rdv, "store", ev->why);
            break;
        case STORE_DEPOSED:
            /* Never acts again: it goes, and comes back (systemd's Restart=) as a standby. */
            log_error("no longer leading job %s (term %lld): %s; stepping down", d->rdv.spec->name,
                      (long long)ev->term, ev->why);
            notify_sendf("STATUS=stepped down: %s", ev->why);
            d->exit_code = 1;
            begin_shutdown(d);
            break;
        }
    }
    free(ev->state);
}

/* JSON text of doc (a new reference, taken), or NULL after saying so. */
static char *render(json_t *doc, const char *what)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    if (!text)
        log_error("internal: cannot render the %s document", what);
    return text;
}

/* /v1/status "store": this musterd's part in the election and etcd's quorum. */
static json_t *store_status_json(struct daemon *d)
{
    char leader[LEADER_ADDR_MAX];
    store_leader(d->store, leader, sizeof(leader));
    uint64_t since = store_no_quorum_since(d->store);
    json_t *o = json_pack("{s:s, s:s?, s:b}", "role", d->leading ? "leader" : "standby", "leader",
                          leader[0] ? leader : NULL, "quorum", !since);
    if (o && d->leading)
        json_object_set_new(o, "term", json_integer((json_int_t)d->rdv.term));
    if (o && since) {
        uint64_t now = uv_hrtime() / 1000000; /* CLOCK_MONOTONIC, as the store's */
        json_object_set_new(o, "no_quorum_s", json_real((double)(now > since ? now - since : 0) / 1000.0));
    }
    return o;
}

static void publish(struct daemon *d)
{
    uint64_t now = uv_now(&d->loop);
    if (d->history.changed || !d->history_text) {
        char *h = render(history_json(&d->history), "history");
        if (h) {
            free(d->history_text);
            d->history_text = h;
        }
    }
    /* The set is put together from its dumps as rendered when they came (at
     * most RDV_STACKS_TOTAL_MAX): while its answers come, at most every
     * STACKS_RENDER_MS, and at once when the last one came; not again
     * until an answer changes it. */
    const struct rdv_stacks *k = &d->rdv.stacks;
    if (!d->stacks || (k->version != d->stacks_version &&
                       (k->nanswered >= k->nranks || now - d->stacks_at >= STACKS_RENDER_MS))) {
        d->stacks_at = now;
        char *text = rdv_stacks_text(&d->rdv);
        if (!text)
            log_error("internal: cannot render the stacks document");
        struct snap_shared *shared = text ? snap_shared_new(text) : NULL;
        free(text);
        if (shared) {
            snap_shared_unref(d->stacks);
            d->stacks = shared;
            d->stacks_version = k->version;
        }
    }
    char *events = render(rdv_events_json(&d->rdv), "events");
    char *history = d->history_text ? strdup(d->history_text) : NULL;
    struct snap_view *v = NULL;
    if (events && history) {
        v = view_build(&d->rdv, now, events, history); /* takes both */
    } else {
        free(events);
        free(history);
    }
    if (v && d->store) {
        json_object_set_new(v->head, "store", store_status_json(d));
        v->standby = !d->leading;
        if (v->standby)
            store_leader_rest(d->store, v->leader_rest, sizeof(v->leader_rest));
    }
    if (v && d->stacks) {
        snap_shared_ref(d->stacks);
        v->stacks = d->stacks;
    }
    if (v)
        snapshot_publish(&d->snap, v);
    else
        log_error("internal: out of memory for the REST snapshot; REST keeps the previous one");
    d->dirty = 0;
    d->rdv.figures_changed = 0;
    d->last_publish = now;

    /* systemd's STATUS=, e.g. "running gen 3, 16 ranks, step 1200". */
    char line[sizeof(d->status_line)];
    const struct rdv *r = &d->rdv;
    if (r->state == RDV_WAITING)
        snprintf(line, sizeof(line), "waiting: %u of %d nodes joined", r->nnodes, r->spec->nodes);
    else
        snprintf(line, sizeof(line), "%s gen %llu, %u ranks, step %llu%s%s", rdv_job_state_name(r->state),
                 (unsigned long long)r->generation, r->world_size, (unsigned long long)rdv_job_step(r),
                 r->reason[0] ? ": " : "", r->reason);
    if (strcmp(line, d->status_line) != 0) {
        memcpy(d->status_line, line, sizeof(line));
        notify_sendf("STATUS=%s", line);
    }
}

/*
 * The open-file soft limit raised to the hard one (a unit sets the hard one
 * with LimitNOFILE=), and the connections the job needs checked against it:
 * as many joined as server_conn_limit, and as many unauthenticated again
 * (their own pool, daemon/server.h). Returns the limit to use for each.
 */
static unsigned fit_connection_limit(const struct job_spec *spec)
{
    unsigned want = server_conn_limit(spec->nodes);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
        return want;
    if (rl.rlim_cur < rl.rlim_max) {
        rlim_t before = rl.rlim_cur;
        rl.rlim_cur = rl.rlim_max;
        if (setrlimit(RLIMIT_NOFILE, &rl) != 0)
            rl.rlim_cur = before;
    }
    if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur < 2 * (rlim_t)want + FD_RESERVE) {
        unsigned fit = rl.rlim_cur > FD_RESERVE + 2 ? (unsigned)(rl.rlim_cur - FD_RESERVE) / 2 : 1;
        log_warn("the open-file limit (%llu) allows %u agent connections (and as many unauthenticated); job %s "
                 "needs %u (%d nodes + margin): raise it (LimitNOFILE= in musterd.service, or ulimit -n)",
                 (unsigned long long)rl.rlim_cur, fit, spec->name, want, spec->nodes);
        return fit;
    }
    return want;
}

static void flush_changes(struct daemon *d)
{
    static enum rdv_job_state last_state = RDV_WAITING;
    static uint64_t last_gen = 0;
    if (d->rdv.state != last_state || d->rdv.generation != last_gen) {
        log_info("job %s: %s, generation %llu, %u ranks%s%s", d->rdv.spec->name,
                 rdv_job_state_name(d->rdv.state), (unsigned long long)d->rdv.generation, d->rdv.world_size,
                 d->rdv.reason[0] ? ": " : "", d->rdv.reason);
        last_state = d->rdv.state;
        last_gen = d->rdv.generation;
    }
    uint64_t since = uv_now(&d->loop) - d->last_publish;
    if (d->dirty || since >= PUBLISH_IDLE_MS ||
        (d->rdv.figures_changed && since >= PUBLISH_FIGURES_MS && snapshot_was_read(&d->snap)))
        publish(d);
}

/* A history sample once a second while some rank reports a step that moved. */
static void sample_history(struct daemon *d, uint64_t now)
{
    if (now - d->history_at < HISTORY_SAMPLE_MS)
        return;
    d->history_at = now;
    struct rdv_figures fig;
    rdv_figures(&d->rdv, &fig);
    if (!fig.step_known || !fig.nrunning || (d->history.samples && fig.step == d->history_step))
        return;
    d->history_step = fig.step;
    history_add(&d->history, fig.step, fig.loss, fig.tokens_per_s, (double)(now - d->rdv.started_ms) / 1000.0,
                d->rdv.generation);
}

static void on_tick(uv_timer_t *t)
{
    struct daemon *d = t->data;
    uint64_t now = uv_now(&d->loop);
    /* A tick this late means musterd itself did not run (libuv runs timers
     * before it reads the sockets): the agents' heartbeats of that time are
     * waiting unread, and their silence is musterd's, not theirs. */
    if (d->last_tick && now - d->last_tick > PAUSE_MS) {
        log_warn_limited("musterd did not run for %.1f s (stopped or starved): that time does not count toward the "
                 "nodes' heartbeat timeout",
                 (double)(now - d->last_tick - TICK_MS) / 1000.0);
        rdv_paused(&d->rdv, now - d->last_tick - TICK_MS, now);
    }
    d->last_tick = now;
    server_tick(d->server);
    rdv_tick(&d->rdv, now);
    logfetch_tick(&d->logfetch, now);
    log_limit_flush(0);
    sample_history(d, now);
    flush_changes(d);
    if (d->exit_on_end && rdv_terminal(&d->rdv)) {
        /* The job is over and so is this daemon: agents shut down with it,
         * told by a command. The command waits, as every frame of rdv's, for
         * the terminal state to be durable (server_hold), which a loaded disk
         * can take seconds over: closing the links before it has left would
         * drop it, and leave the agents retrying a daemon gone. So musterd
         * goes once every joined agent's queue is empty (the command is in
         * the kernel, which delivers it before the close), and no sooner than
         * 500 ms; at the latest after lease_ms, when agents not told fence
         * themselves anyway. */
        if (!d->end_seen_ms) {
            d->end_seen_ms = now;
            struct proto_msg m = {.type = PROTO_COMMAND};
            m.u.command.generation = d->rdv.generation;
            m.u.command.action = PROTO_CMD_SHUTDOWN;
            m.u.command.term = d->rdv.term;
            for (uint32_t i = 0; i < d->rdv.nnodes; i++)
                if (d->rdv.nodes[i].state == RDV_NODE_JOINED)
                    server_send(d->server, d->rdv.nodes[i].name, &m);
        } else if (now - d->end_seen_ms >= 500) {
            uint32_t untold = 0;
            for (uint32_t i = 0; i < d->rdv.nnodes; i++)
                if (d->rdv.nodes[i].state == RDV_NODE_JOINED && server_queued(d->server, d->rdv.nodes[i].name) > 0)
                    untold++;
            const uint64_t most = d->rdv.spec->lease_ms > 500 ? d->rdv.spec->lease_ms : 500;
            if (untold == 0 || now - d->end_seen_ms >= most) {
                if (untold)
                    log_warn("job %s is over; %u node(s) not yet sent the shutdown after %llu ms (the state "
                             "write before it is not durable): exiting, they fence themselves",
                             d->rdv.spec->name, untold, (unsigned long long)(now - d->end_seen_ms));
                d->exit_code = d->rdv.state == RDV_COMPLETED ? 0 : 1;
                begin_shutdown(d);
            }
        }
    }
}

static void on_admin(uv_async_t *a)
{
    struct daemon *d = a->data;
    struct admin_req reqs[ADMIN_QUEUE];
    int n;

    pthread_mutex_lock(&d->admin_lock);
    n = d->nadmin;
    memcpy(reqs, d->admin, sizeof(reqs[0]) * (size_t)n);
    d->nadmin = 0;
    pthread_mutex_unlock(&d->admin_lock);
    for (int i = 0; i < n; i++) {
        static const enum rdv_admin map[] = {
            [HTTP_ADMIN_STOP] = RDV_ADMIN_STOP,
            [HTTP_ADMIN_RESTART] = RDV_ADMIN_RESTART,
            [HTTP_ADMIN_DRAIN] = RDV_ADMIN_DRAIN,
            [HTTP_ADMIN_CHECKPOINT] = RDV_ADMIN_CHECKPOINT,
            [HTTP_ADMIN_STACKS] = RDV_ADMIN_STACKS,
        };
        static const char *const names[] = {
            [HTTP_ADMIN_STOP] = "stop",
            [HTTP_ADMIN_RESTART] = "restart",
            [HTTP_ADMIN_DRAIN] = "drain",
            [HTTP_ADMIN_CHECKPOINT] = "checkpoint",
            [HTTP_ADMIN_STACKS] = "stacks",
        };
        int rc = rdv_admin(&d->rdv, map[reqs[i].action], reqs[i].node[0] ? reqs[i].node : NULL,
                           uv_now(&d->loop));
        if (rc != 0)
            log_warn("admin request %s%s%s not carried out: %s", names[reqs[i].action],
                     reqs[i].node[0] ? " of " : "", reqs[i].node,
                     rc == -ENOENT    ? "no such node"
                     : rc == -ENOTSUP ? "the job has no checkpoint_dir"
                                      : "not possible in this job state");
    }
    flush_changes(d);
}

/* HTTP thread: queue only. */
static void admin_from_http(void *ctx, enum http_admin_action action, const char *node)
{
    struct daemon *d = ctx;
    pthread_mutex_lock(&d->admin_lock);
    if (d->nadmin < ADMIN_QUEUE) {
        d->admin[d->nadmin].action = action;
        snprintf(d->admin[d->nadmin].node, sizeof(d->admin[0].node), "%s", node ? node : "");
        d->nadmin++;
    }
    pthread_mutex_unlock(&d->admin_lock);
    uv_async_send(&d->admin_async);
}

static void begin_shutdown(struct daemon *d)
{
    if (d->stopping)
        return;
    d->stopping = 1;
    notify_send("STOPPING=1");
    flush_changes(d);
    persist_state(d);
    persist_close(&d->persist); /* the loop runs until the last write is done */
    uv_timer_stop(&d->tick);
    uv_close((uv_handle_t *)&d->tick, NULL);
    uv_close((uv_handle_t *)&d->watchdog, NULL);
    uv_close((uv_handle_t *)&d->sigterm, NULL);
    uv_close((uv_handle_t *)&d->sigint, NULL);
    uv_close((uv_handle_t *)&d->admin_async, NULL);
    /* Before the server: every log request waiting on a node is answered now. */
    logfetch_close(&d->logfetch);
    server_close(d->server);
}

static void on_watchdog(uv_timer_t *t) { notify_send("WATCHDOG=1"); }

static void on_signal(uv_signal_t *s, int signum)
{
    struct daemon *d = s->data;
    log_info("%s received: shutting down", signum == SIGTERM ? "SIGTERM" : "SIGINT");
    /* A launcher waiting on the job's outcome must not read an interrupted job as success. */
    if (d->exit_on_end && d->rdv.state != RDV_COMPLETED)
        d->exit_code = 1;
    begin_shutdown(d);
}

int main(int argc, char **argv)
{
    static struct daemon d; /* large (rdv holds the node table) */
    static const struct option opts[] = {
        {"config", required_argument, NULL, 'c'},
        {"job", required_argument, NULL, 'j'},
        {"listen", required_argument, NULL, 'l'},
        {"http", required_argument, NULL, 'H'},
        {"state-dir", required_argument, NULL, 's'},
        {"token-file", required_argument, NULL, 't'},
        {"admin-token-file", required_argument, NULL, 'a'},
        {"read-token-file", required_argument, NULL, 'r'},
        {"preauth-per-address", required_argument, NULL, 'P'},
        {"exit-on-end", no_argument, NULL, 'x'},
        {"store", required_argument, NULL, 'S'},
        {"advertise", required_argument, NULL, 'A'},
        {"log-level", required_argument, NULL, 'L'},
        {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},
        {NULL, 0, NULL, 0},
    };
    /* Flags as given (NULL = not given); they override the configuration file. */
    const char *config_path = NULL, *job_flag = NULL, *listen_flag = NULL, *http_flag = NULL;
    const char *state_flag = NULL, *token_flag = NULL, *admin_flag = NULL, *level_flag = NULL;
    const char *read_flag = NULL, *per_addr_flag = NULL;
    const char *store_flag = NULL, *advertise_flag = NULL;
    static struct musterd_config cfg;
    char listen_host[HOSTPORT_HOST_MAX], http_host[HOSTPORT_HOST_MAX], err[1024];
    uint16_t listen_port, http_portnum;
    static uint8_t token[TOKEN_MAX], admin[TOKEN_MAX + 1], reader[TOKEN_MAX + 1];
    size_t token_len = 0, admin_len = 0, reader_len = 0;
    struct job_spec spec;
    json_t *job = NULL;
    int c;

    log_set_prog("musterd");
    /* A peer that resets its connection must cost an error code, not the daemon. */
    signal(SIGPIPE, SIG_IGN);
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'c': config_path = optarg; break;
        case 'j': job_flag = optarg; break;
        case 'l': listen_flag = optarg; break;
        case 'H': http_flag = optarg; break;
        case 's': state_flag = optarg; break;
        case 't': token_flag = optarg; break;
        case 'a': admin_flag = optarg; break;
        case 'r': read_flag = optarg; break;
        case 'P':
            if (musterd_valid_count(optarg) != 0) {
                fprintf(stderr, "musterd: --preauth-per-address: expected an integer 1..1000000, got '%s'\n", optarg);
                return 2;
            }
            per_addr_flag = optarg;
            break;
        case 'x': d.exit_on_end = 1; break;
        case 'S': store_flag = optarg; break;
        case 'A': advertise_flag = optarg; break;
        case 'L':
            if (conf_valid_log_level(optarg) != 0) {
                fprintf(stderr, "musterd: --log-level: expected error, warn, info or debug, got '%s'\n", optarg);
                return 2;
            }
            level_flag = optarg;
            break;
        case 'h': usage(stdout); return 0;
        case 'V': printf("musterd %s\n", MUSTER_VERSION); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc) {
        fprintf(stderr, "musterd: unexpected argument '%s'\n", argv[optind]);
        return 2;
    }
    musterd_config_defaults(&cfg);
    static char default_config[PATH_MAX];
    if (!config_path && !job_flag) {
        musterd_config_default_path(default_config, sizeof(default_config));
        if (access(default_config, F_OK) == 0)
            config_path = default_config;
    }
    if (config_path && conf_load(config_path, musterd_config_keys, musterd_config_nkeys, &cfg, err,
                                 sizeof(err)) != 0) {
        log_error("%s", err);
        return 1;
    }
    log_set_level_name(level_flag ? level_flag : cfg.log_level);
    const char *job_path = job_flag ? job_flag : cfg.job;
    const char *listen = listen_flag ? listen_flag : cfg.listen;
    const char *http = http_flag ? http_flag : cfg.http;
    const char *token_path = token_flag ? token_flag : cfg.token_file;
    const char *admin_path = admin_flag ? admin_flag : cfg.admin_token_file[0] ? cfg.admin_token_file : NULL;
    const char *read_path = read_flag ? read_flag : cfg.read_token_file[0] ? cfg.read_token_file : NULL;
    unsigned per_addr = (unsigned)atoi(per_addr_flag ? per_addr_flag : cfg.preauth_per_address);
    d.state_dir = state_flag ? state_flag : cfg.state_dir;
    const char *store_url = store_flag ? store_flag : cfg.store;
    const char *advertise = advertise_flag ? advertise_flag : cfg.advertise;
    struct etcd_endpoints store_ep;
    if (store_url[0] && etcd_endpoints_parse(store_url, &store_ep, err, sizeof(err)) != 0) {
        fprintf(stderr, "musterd: --store: %s\n", err);
        return 2;
    }
    const char *tls_files[][2] = {{"store_ca_file", cfg.store_ca_file}, {"store_cert_file", cfg.store_cert_file},
                                  {"store_key_file", cfg.store_key_file}};
    for (size_t i = 0; i < sizeof(tls_files) / sizeof(tls_files[0]); i++) {
        if (!tls_files[i][1][0])
            continue;
        if (!store_url[0] || !store_ep.tls) {
            fprintf(stderr, "musterd: %s is for an https:// store (store is '%s')\n", tls_files[i][0], store_url);
            return 2;
        }
        if (access(tls_files[i][1], R_OK) != 0) {
            fprintf(stderr, "musterd: %s: %s: %s\n", tls_files[i][0], tls_files[i][1], strerror(errno));
            return 2;
        }
    }
    /* The client key proves musterd to etcd: nobody else on the host (no rank) may read it. */
    if (cfg.store_key_file[0]) {
        int krc = token_check_private(cfg.store_key_file, err, sizeof(err));
        if (krc < 0) {
            fprintf(stderr, "musterd: store_key_file: %s\n", err);
            return 2;
        }
        if (krc == 1)
            log_warn("store_key_file: %s", err);
    }
    if (!cfg.store_cert_file[0] != !cfg.store_key_file[0]) {
        fprintf(stderr, "musterd: store_cert_file and store_key_file go together: give both or neither\n");
        return 2;
    }
    if (!cfg.store_user[0] != !cfg.store_password_file[0] || (cfg.store_user[0] && !store_url[0])) {
        fprintf(stderr, "musterd: store_user and store_password_file go together, with a store\n");
        return 2;
    }
    /* etcd's auth sends the password (and then its token, which is as good)
     * with the requests: over http:// anyone on the path would read it. */
    if (cfg.store_user[0] && !store_ep.tls) {
        fprintf(stderr, "musterd: store_user: etcd's password would cross the network in the clear to %s; "
                        "use https:// endpoints (with store_ca_file), or no store_user\n", store_url);
        return 2;
    }
    char hp_host[HOSTPORT_HOST_MAX], hp_err[320];
    uint16_t hp_port;
    if (advertise[0] && hostport_parse(advertise, hp_host, &hp_port, hp_err, sizeof(hp_err)) != 0) {
        fprintf(stderr, "musterd: --advertise: %s\n", hp_err);
        return 2;
    }
    if (!job_path[0]) {
        fprintf(stderr, "musterd: no job: give --job FILE, or \"job\" in musterd.json (--config FILE)\n");
        usage(stderr);
        return 2;
    }
    if (hostport_parse_flags(listen, HOSTPORT_PORT_ZERO, listen_host, &listen_port, hp_err, sizeof(hp_err)) != 0) {
        fprintf(stderr, "musterd: --listen: %s\n", hp_err);
        return 2;
    }
    if (hostport_parse_flags(http, HOSTPORT_PORT_ZERO, http_host, &http_portnum, hp_err, sizeof(hp_err)) != 0) {
        fprintf(stderr, "musterd: --http: %s\n", hp_err);
        return 2;
    }
    /* The cluster token is not optional: without it anyone could join. */
    int trc = token_read(token_path, token, sizeof(token), &token_len, err, sizeof(err));
    if (trc != 0) {
        log_error("%s", err);
        if (trc != -EPERM)
            log_error("agents prove the cluster token to join; create one with `musterctl token new %s` "
                      "(and copy it to every node) or pass --token-file", token_path);
        return 1;
    }
    if (admin_path && token_read(admin_path, admin, TOKEN_MAX, &admin_len, err, sizeof(err)) != 0) {
        log_error("admin token: %s", err);
        return 1;
    }
    admin[admin_len] = '\0';
    if (read_path && token_read(read_path, reader, TOKEN_MAX, &reader_len, err, sizeof(err)) != 0) {
        log_error("read token: %s", err);
        return 1;
    }
    reader[reader_len] = '\0';
    if (job_spec_load(job_path, &spec, &job, err, sizeof(err)) != 0) {
        log_error("%s", err);
        return 1;
    }
    if (mkdir(d.state_dir, 0700) != 0 && errno != EEXIST) {
        log_error("%s: cannot create the state directory: %s", d.state_dir, strerror(errno));
        return 1;
    }

    uv_loop_init(&d.loop);
    if (persist_init(&d.persist, &d.loop, d.state_dir, on_durable, &d) != 0) {
        log_error("out of memory");
        return 1;
    }
    pthread_mutex_init(&d.admin_lock, NULL);
    snapshot_init(&d.snap);
    if (history_init(&d.history, HISTORY_POINTS) != 0) {
        log_error("out of memory for the run's history");
        return 1;
    }
    struct rdv_ops ops = {.ctx = &d, .send = ops_send, .disconnect = ops_disconnect, .changed = on_changed,
                          .queued = ops_queued};
    rdv_init(&d.rdv, &spec, job, &ops, uv_now(&d.loop));
    json_decref(job);

    static struct rdv_saved saved;
    /* With a store, the state comes from etcd once elected (take_over). */
    int rc = store_url[0] ? -ENOENT : state_read(d.state_dir, &saved, err, sizeof(err));
    if (rc == 0 && strcmp(saved.job, spec.name) != 0) {
        log_error("%s/%s belongs to job '%s', not '%s': use another --state-dir or move the file away",
                  d.state_dir, STATE_FILE_NAME, saved.job, spec.name);
        return 1;
    }
    if (rc == 0 && rdv_restore(&d.rdv, &saved, uv_now(&d.loop)) != 0) {
        log_error("%s/%s: inconsistent membership; move it away to start afresh", d.state_dir, STATE_FILE_NAME);
        return 1;
    }
    if (rc != 0 && rc != -ENOENT) {
        log_error("%s", err);
        return 1;
    }

    struct server_config scfg = {.addr = listen_host, .port = listen_port, .token = token, .token_len = token_len,
                                 .max_conns = fit_connection_limit(&spec), .preauth_per_addr = per_addr,
                                 .log_data = on_log_data,
                                 .node_gone = on_node_gone, .admit = store_url[0] ? admit : NULL,
                                 .hook_ctx = &d};
    rc = server_start(&d.server, &d.loop, &scfg, &d.rdv, err, sizeof(err));
    if (rc != 0) {
        log_error("%s", err);
        if (d.server) {
            server_close(d.server);
            uv_run(&d.loop, UV_RUN_DEFAULT);
            server_free(d.server);
        }
        return 1;
    }
    /* Admin and log requests can arrive as soon as the REST port serves: their ways in come first. */
    uv_async_init(&d.loop, &d.admin_async, on_admin);
    d.admin_async.data = &d;
    struct logfetch_ops lops = {.ctx = &d, .locate = locate_rank, .send = ops_send};
    rc = logfetch_init(&d.logfetch, &d.loop, &lops);
    if (rc != 0) {
        log_error("cannot set up rank log requests: %s", uv_strerror(rc));
        uv_close((uv_handle_t *)&d.admin_async, NULL);
        server_close(d.server);
        uv_run(&d.loop, UV_RUN_DEFAULT);
        server_free(d.server);
        return 1;
    }
    if (!read_path && strncmp(http_host, "127.", 4) != 0)
        log_warn("REST (%s:%u) is reachable beyond this host and its reads are open: status, nodes and rank logs "
                 "answer anyone who reaches it; set read_token_file (or --read-token-file), or bind 127.0.0.1",
                 http_host, http_portnum);
    /* Names REST answers to beyond its address (daemon/http_host.h): rest_hosts, and,
     * bound to every address, the names a standby's redirect or a user may use for
     * this host (its host name, the advertised name). */
    static char rest_hosts[sizeof(cfg.rest_hosts) + 2 * 300];
    snprintf(rest_hosts, sizeof(rest_hosts), "%s", cfg.rest_hosts);
    if (strcmp(http_host, "0.0.0.0") == 0) {
        char name[256];
        if (gethostname(name, sizeof(name)) == 0 && http_hosts_valid_list(name) == 0)
            snprintf(rest_hosts + strlen(rest_hosts), sizeof(rest_hosts) - strlen(rest_hosts), "%s%s",
                     rest_hosts[0] ? "," : "", name);
        const char *colon = advertise[0] ? strrchr(advertise, ':') : NULL;
        if (colon && colon - advertise < (long)sizeof(name)) {
            snprintf(name, sizeof(name), "%.*s", (int)(colon - advertise), advertise);
            if (http_hosts_valid_list(name) == 0)
                snprintf(rest_hosts + strlen(rest_hosts), sizeof(rest_hosts) - strlen(rest_hosts), "%s%s",
                         rest_hosts[0] ? "," : "", name);
        }
    }
    struct http_config hcfg = {.addr = http_host, .port = http_portnum, .hosts = rest_hosts,
                               .admin_token = admin_path ? (char *)admin : NULL,
                               .read_token = read_path ? (char *)reader : NULL,
                               .log = log_from_http, .log_ctx = &d, .checkpoints = spec.checkpoint_dir[0] != '\0'};
    rc = http_start(&d.http, &hcfg, &d.snap, admin_from_http, &d, err, sizeof(err));
    if (rc != 0) {
        log_error("%s", err);
        uv_close((uv_handle_t *)&d.admin_async, NULL);
        logfetch_close(&d.logfetch);
        server_close(d.server);
        uv_run(&d.loop, UV_RUN_DEFAULT);
        server_free(d.server);
        logfetch_destroy(&d.logfetch);
        return 1;
    }
    if (store_url[0]) {
        char adv[LEADER_ADDR_MAX], host[256];
        if (advertise[0])
            snprintf(adv, sizeof(adv), "%s", advertise);
        else if (strcmp(listen_host, "0.0.0.0") != 0)
            snprintf(adv, sizeof(adv), "%s:%u", listen_host, server_port(d.server));
        else if (gethostname(host, sizeof(host)) == 0)
            snprintf(adv, sizeof(adv), "%s:%u", host, server_port(d.server));
        else
            snprintf(adv, sizeof(adv), "localhost:%u", server_port(d.server));
        /* Clients a standby sends to the leader reach its REST port at the
         * address it listens on, or, listening on every address, the host
         * agents reach it at. */
        char rest[LEADER_ADDR_MAX + 16];
        if (strcmp(http_host, "0.0.0.0") != 0)
            snprintf(rest, sizeof(rest), "http://%s:%u", http_host, http_port(d.http));
        else
            snprintf(rest, sizeof(rest), "http://%.*s:%u", (int)(strrchr(adv, ':') - adv), adv, http_port(d.http));
        static uint8_t password[STORE_PASSWORD_MAX];
        size_t password_len = 0;
        if (cfg.store_user[0] &&
            token_read(cfg.store_password_file, password, sizeof(password) - 1, &password_len, err, sizeof(err)) != 0) {
            log_error("store_password_file: %s", err);
            return 1;
        }
        password[password_len] = '\0';
        struct store_config stc = {.endpoints = store_url, .job = spec.name, .advertise = adv, .rest = rest,
                                   .ttl_s = atoi(cfg.store_lease_s), .ca = cfg.store_ca_file,
                                   .cert = cfg.store_cert_file, .key = cfg.store_key_file, .user = cfg.store_user,
                                   .password = (const char *)password};
        rc = store_open(&d.store, &d.loop, &stc, on_store_event, &d, err, sizeof(err));
        OPENSSL_cleanse(password, sizeof(password));
        if (rc != 0) {
            log_error("store %s: %s", store_url, err);
            return 1;
        }
        persist_set_sink(&d.persist, store_sink, &d);
        log_info("job %s: state in etcd (%s), lease %s s; running for leader as %s (REST %s)", spec.name,
                 store_url, cfg.store_lease_s, adv, rest);
    }
    uv_timer_init(&d.loop, &d.tick);
    d.tick.data = &d;
    uv_timer_start(&d.tick, on_tick, TICK_MS, TICK_MS);
    uv_signal_init(&d.loop, &d.sigterm);
    uv_signal_init(&d.loop, &d.sigint);
    d.sigterm.data = d.sigint.data = &d;
    uv_signal_start(&d.sigterm, on_signal, SIGTERM);
    uv_signal_start(&d.sigint, on_signal, SIGINT);
    /* The keep-alive comes from the loop itself, so a stuck loop is restarted. */
    uv_timer_init(&d.loop, &d.watchdog);
    uint64_t wd_usec = notify_watchdog_usec();
    if (wd_usec)
        uv_timer_start(&d.watchdog, on_watchdog, 0, wd_usec / 2000 ? wd_usec / 2000 : 1);
    publish(&d);
    /* Both ports listen and the state file is loaded: now we serve. */
    notify_send("READY=1");
    log_info("job %s: control %s:%u, REST http://%s:%u, state %s/%s", spec.name, listen_host,
             server_port(d.server), http_host, http_port(d.http), d.state_dir, STATE_FILE_NAME);

    uv_run(&d.loop, UV_RUN_DEFAULT);
    /* After the last state write: the lease goes (a standby leads at once). */
    if (d.store) {
        store_close(d.store);
        uv_run(&d.loop, UV_RUN_DEFAULT);
        store_free(d.store);
    }

    http_stop(d.http);
    logfetch_destroy(&d.logfetch);
    server_free(d.server);
    rdv_free(&d.rdv);
    snapshot_destroy(&d.snap);
    history_free(&d.history);
    free(d.history_text);
    snap_shared_unref(d.stacks);
    persist_free(&d.persist);
    pthread_mutex_destroy(&d.admin_lock);
    rc = uv_loop_close(&d.loop);
    if (rc != 0) {
        log_error("event loop not closed cleanly: %s", uv_strerror(rc));
        return 1;
    }
    log_limit_flush(1);
    log_info("stopped cleanly");
    return d.exit_code;
}
