#include "worker/agent/agent.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <uv.h>

#include "common/cmdline.h"
#include "common/jobspec.h"
#include "common/log.h"
#include "common/mkdirs.h"
#include "common/notify.h"
#include "common/ratelimit.h"
#include "worker/agent/agent_preflight.h"
#include "worker/agent/agent_rank.h"
#include "worker/agent/exit_queue.h"
#include "worker/agent/frame_conn.h"
#include "worker/agent/memckpt.h"
#include "worker/agent/memrep.h"
#include "worker/agent/rank_env.h"
#include "worker/agent/rank_stacks.h"
#include "worker/agent/rank_flight.h"
#include "worker/agent/nccl_ras.h"
#include "worker/agent/rank_failure.h"
#include "worker/agent/rank_log.h"
#include "worker/agent/spare.h"

extern char **environ;

/* A connect or handshake step that takes longer than this is abandoned. */
#define HANDSHAKE_TIMEOUT_MS 5000
/*
 * Link stalls. The agent asks the daemon to answer a heartbeat once every
 * proto_ack_every_ms (the other heartbeats say "ack": false and cost the
 * daemon no write), and on every heartbeat while a rank's exit waits to be
 * confirmed (exit_queue.h). A heartbeat that asked and that the daemon has
 * not answered within proto_stall_ms (a quarter of heartbeat_timeout_ms, at
 * least 200 ms) means the stream is stalled,
 * typically behind TCP's retransmission backoff after a brief cut. The agent
 * then reconnects at once and resumes its session (HELLO.session) while the
 * daemon still counts the node as joined: until heartbeat_timeout_ms after
 * the last frame heard, connection attempts are RESUME_RETRY_MS apart and
 * each is given RESUME_CONNECT_MS (a lost SYN is retried by TCP only after
 * a second). The stalled connection is kept open, unread, until the new one
 * is welcomed, so that the daemon never sees it close first.
 */
#define RESUME_RETRY_MS 50
/* A standby that names no leader (an election is under way) is asked again after this long. */
#define FOLLOW_RETRY_MS 250
/* Several daemons: a connection attempt that takes longer moves to the next. */
#define FOLLOW_CONNECT_MS 1000
#define RESUME_CONNECT_MS 50
/* Period of the lease / handshake watchdog. */
#define TICK_MS 100
/* A rank that has not spoken on its control socket this long after its start is
 * running by its process alone ("silent": step unknown, no hang detection). */
#define RANK_SILENT_GRACE_MS 1000
/* A log answer is refused ("busy") while this much waits to go to the daemon:
 * log pieces (up to ~130 KiB each) must never crowd out heartbeats or fill
 * the connection's write queue (FCONN_WRITE_QUEUE_MAX), which would drop it. */
#define LOG_SEND_QUEUE_MAX (1u << 20)
/* Generations whose rank directories are kept (error files, logs). */
#define KEEP_GENERATIONS 5

/* The link to the daemon. */
enum link_state {
    LINK_IDLE,       /* no connection; the retry timer runs */
    LINK_RESOLVING,  /* uv_getaddrinfo in flight */
    LINK_CONNECTING, /* uv_tcp_connect in flight (one address after another) */
    LINK_HELLO,      /* HELLO sent; waiting for CHALLENGE: the peer has proven nothing yet */
    LINK_AUTH,       /* the daemon proved the token, RESPONSE sent; waiting for WELCOME or
                      * REJECT; every frame either way sealed from here on */
    LINK_JOINED,     /* welcomed: heartbeats flow, assignments come */
    LINK_CLOSED,     /* shutting down: no more attempts */
};

static const char *const link_names[] = {"idle", "resolving", "connecting", "hello", "auth", "joined",
                                         "closed"};

struct agent {
    const struct agent_config *cfg;
    uv_loop_t *loop;

    /* the daemon joined or tried now (one of daemons) */
    struct daemon_list daemons;
    char daemon[DAEMON_ADDR_MAX];
    char host[HOSTPORT_HOST_MAX];
    uint16_t port;
    unsigned tried;  /* daemons tried since the last join (a round through the list) */
    bool followed;   /* a standby's REJECT named the leader since the last join */

    /* link to the daemon */
    enum link_state link;
    uint64_t link_since; /* uv_now when the state was entered */
    struct fconn *conn;
    uv_getaddrinfo_t gai;
    bool gai_busy;
    struct addrinfo *ai_list, *ai_next;
    int last_connect_err;
    uv_connect_t connect_req;
    uv_timer_t retry_timer, beat_timer, tick_timer;
    uv_timer_t connect_timer; /* while resuming: the deadline of one connection attempt */
    uv_signal_t sigterm, sigint;
    struct backoff backoff;
    uint64_t rng;
    uint64_t last_rx; /* uv_now of the last frame from the daemon */
    uint32_t heartbeat_interval_ms, heartbeat_timeout_ms, lease_ms;
    uint64_t beat_seq;
    uint64_t unanswered_since; /* first heartbeat that asked for an answer since the daemon's last frame; 0 = none */
    uint32_t ack_every_ms;     /* ask for an answer this often (proto_ack_every_ms) */
    uint64_t beats_since_answer; /* heartbeats sent since the daemon's last answer or WELCOME */
    uint64_t last_beat_at;     /* uv_now of the last heartbeat sent */
    uint64_t session;          /* WELCOME's, named in the next HELLO to resume it; 0 = none */
    struct fconn *stalled;     /* the stalled connection, kept until the session is resumed */
    uint64_t stalled_at;
    uint64_t resume_until;     /* quick reconnects until then (the daemon's deadline); 0 = not resuming */
    struct exitq exits;        /* RANK_EXITs the daemon may not have read (exit_queue.h) */
    struct proto_bind bind;    /* this connection's handshake (HELLO on) */
    uint64_t unproven;         /* peers refused: no proof of the token, or a frame before it */
    char local_addr[PROTO_NAME_MAX];

    /* generations and ranks */
    uint64_t cur_gen; /* newest generation heard of; older messages are ignored */
    bool have_assign;
    struct proto_assign assign; /* holds a reference to assign.job */
    struct job_spec spec;       /* the held job, parsed (defaults before any) */
    bool spawn_pending;         /* spawn the held assignment once no rank runs */
    struct agent_rank *ranks[PROTO_MAX_LOCAL_RANKS]; /* by slot of the held assignment */
    uint32_t nranks;
    struct agent_rank *all; /* every rank object not yet freed */
    struct spare_pool spare; /* the warm spare (job key warm_spares) */
    char spare_said[256];    /* why warm_spares is off, as last logged ("" = nothing said) */
    bool have_uid;
    struct proto_unique_id uid;
    /* The unique id rank 0 of this node created, as it was sent up: sent
     * again to a daemon that restarted before handing it out. */
    bool have_made_uid;
    struct proto_unique_id made_uid;
    uint64_t repeated_uids;  /* rank 0's unique ids of a generation after its first: not sent up */
    struct ratelimit daemon_ignored_log; /* lines about the daemon's ignored frames */

    bool told_ready; /* READY=1 sent to systemd (first join) */

    /* device facts (NVML, read once at start) and the pre-flight of the job */
    uint32_t ngpus;
    struct proto_gpu gpus[PROTO_MAX_LOCAL_RANKS];
    bool preflight_promised; /* the last HELLO said a PREFLIGHT would follow */
    int64_t hello_wall_ms;   /* wall clock when it was sent */
    bool trainer;            /* the held job's ranks are muster-train */
    char preflight_said[PROTO_REASON_MAX]; /* the verdict last logged ("" = fit) */
    bool preflight_logged;   /* since this join: repeats of the same verdict are not logged */
    char preflight_ckpt[PROTO_CKPT_NAME_MAX]; /* the latest checkpoint last reported; with */
    bool preflight_had_ckpt; /* whether one was: a fit node's same report again is not sent */
    struct agent_preflight pf;

    char state_dir[PATH_MAX]; /* "" = none usable: ranks get no error file */
    uint32_t free_port;       /* latest port found free for MASTER_PORT; 0 = none */
    bool port_warned;         /* "no free port" is in the log */

    /* COMMAND stacks being answered: one dump per rank of the generation (rank_stacks.h) */
    uv_timer_t stacks_timer;
    struct stacks_dump *stacks; /* malloc'd while a request is answered; NULL = none */
    struct flight_ask *flights; /* the same ranks' flight recorder summaries (rank_flight.h) */
    struct ras_query ras;       /* NCCL's RAS service asked about the job (nccl_ras.h) */
    uint32_t nstacks;
    uint64_t stacks_since;      /* uv_now when it began */

    /* the job's memory checkpoint directory (memckpt.h) */
    struct memckpt mem;
    struct memrep rep;         /* its copies at the buddy node and the buddy's here (memrep.h) */
    bool mem_drop;             /* the job is over (COMMAND shutdown): removed once the ranks are gone */

    /* shutdown */
    bool exiting;
    bool closed;
    int exit_code;
};

static void schedule_retry(struct agent *a, const char *why);
static void drop_stalled(struct agent *a);
static uint64_t stall_ms(const struct agent *a);
static void link_stalled(struct agent *a, uint64_t now);
static void on_retry_timer(uv_timer_t *t);
static void try_next_addr(struct agent *a);
static void maybe_finish(struct agent *a);

static uint32_t rng_next(struct agent *a)
{
    /* xorshift64*: enough for jitter. */
    a->rng ^= a->rng >> 12;
    a->rng ^= a->rng << 25;
    a->rng ^= a->rng >> 27;
    return (uint32_t)((a->rng * 0x2545F4914F6CDD1DULL) >> 32);
}

static void link_set_state(struct agent *a, enum link_state s)
{
    if (a->link == LINK_CLOSED && s != LINK_CLOSED) {
        log_error("internal: link state change closed -> %s refused", link_names[s]);
        return;
    }
    if (a->link != s)
        log_debug("link: %s -> %s", link_names[a->link], link_names[s]);
    a->link = s;
    a->link_since = uv_now(a->loop);
}

static void msg_init(struct proto_msg *m, enum proto_type type)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
}

/* ---- ranks ------------------------------------------------------------- */

static bool any_running(const struct agent *a)
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
static bool quiet(const struct agent_rank *r, uint64_t now)
{
    const uint64_t wait = 2 * r->frame_gap_ms > RANK_QUIET_MS ? 2 * r->frame_gap_ms : RANK_QUIET_MS;
    return r->running && !r->stopping && r->frame_gap_ms && now - r->heard_ms > wait;
}

static bool responsive(const struct agent *a, const struct agent_rank *r)
{
    return r->heard_ms && uv_now(a->loop) - r->heard_ms <= RANK_SILENT_MS;
}

/* Some rank runs that the held assignment does not keep: it is being stopped,
 * and its slot is started again once it is gone. */
static bool any_outgoing(const struct agent *a)
{
    for (const struct agent_rank *r = a->all; r; r = r->next)
        if (r->running && (!a->have_assign || r->generation != a->assign.generation))
            return true;
    return false;
}

/* Some rank runs and has not been told to stop. */
static bool any_unstopped(const struct agent *a)
{
    for (const struct agent_rank *r = a->all; r; r = r->next)
        if (r->running && !r->stopping)
            return true;
    return false;
}

/* Ranks running, not being stopped, for the held assignment. */
static bool ranks_live(const struct agent *a)
{
    if (!a->have_assign || a->nranks == 0)
        return false;
    for (uint32_t i = 0; i < a->nranks; i++)
        if (!a->ranks[i] || !a->ranks[i]->running || a->ranks[i]->stopping)
            return false;
    return true;
}

static void stop_all(struct agent *a, uint64_t generation)
{
    for (struct agent_rank *r = a->all; r; r = r->next)
        rank_stop(r, generation, (uint64_t)a->spec.stop_grace_ms);
}

static int send_to_daemon(struct agent *a, const struct proto_msg *m);

/*
 * A rank ended: tell the daemon, and keep the exit until the echo of a later
 * heartbeat shows it was read (exit_queue.h). Without a joined link it waits
 * for the next WELCOME (send_unread_exits), unless the agent stopped the rank
 * itself (stopped): that exit is news to nobody, or it is the agent's own
 * fencing, which the daemon learns from HELLO (its ranks run no generation).
 */
static void send_rank_exit(struct agent *a, uint64_t generation, uint32_t rank, int code, int sig,
                           const char *reason, const char *detail, bool stopped)
{
    static struct proto_msg m; /* ~5 KiB of text: not on the loop's stack */
    msg_init(&m, PROTO_RANK_EXIT);
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
        send_to_daemon(a, &m);
    else
        log_info("rank %u's exit is sent once the daemon is reachable again", rank);
}

/* A new connection was welcomed: the exits the daemon may not have read go (again). */
static void send_unread_exits(struct agent *a)
{
    static struct proto_msg m;
    exitq_drop_before(&a->exits, a->cur_gen);
    if (a->exits.n)
        log_info("sending %u rank exit(s) the daemon may not have read (the link was down)", a->exits.n);
    for (uint32_t i = 0; i < a->exits.n && a->link == LINK_JOINED; i++) {
        msg_init(&m, PROTO_RANK_EXIT);
        m.u.rank_exit = a->exits.e[i].x;
        exitq_sent(&a->exits, i, a->beat_seq);
        send_to_daemon(a, &m);
    }
}

static void on_beat_timer(uv_timer_t *t);

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

static void rank_on_msg(struct agent_rank *r, struct proto_msg *msg)
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
                on_beat_timer(&a->beat_timer);
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
    send_to_daemon(a, msg);
}

static void spawn_all(struct agent *a);

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

static void rank_on_exit(struct agent_rank *r, int code, int sig)
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
        on_beat_timer(&a->beat_timer);
    send_rank_exit(a, gen, r->rank, code, sig, reason, detail, r->stopping);
    memckpt_rank_exit(&a->mem, a->ranks, a->nranks);
    if (a->exiting)
        maybe_finish(a);
    else if (a->spawn_pending && !any_outgoing(a))
        spawn_all(a);
}

/* mkdir -p, then the directory must be ours to write. */
static int make_dirs(const char *path, mode_t mode)
{
    int rc = mkdirs(path, mode);
    if (rc)
        return rc;
    return access(path, W_OK | X_OK) == 0 ? 0 : -errno;
}

/* Keeps the rank directories of the last KEEP_GENERATIONS generations up to gen. */
static void prune_generations(const struct agent *a, uint64_t gen)
{
    if (gen <= KEEP_GENERATIONS)
        return;
    /* By descriptor from the state directory down: the ranks write in these
     * trees, and a directory swapped for a link must not take the removal elsewhere. */
    int sd = open(a->state_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sd < 0)
        return;
    uv_fs_t req;
    if (uv_fs_scandir(NULL, &req, a->state_dir, 0, NULL) < 0) {
        uv_fs_req_cleanup(&req);
        close(sd);
        return;
    }
    uv_dirent_t ent;
    while (uv_fs_scandir_next(&req, &ent) != UV_EOF) {
        uint64_t g;
        if (!rank_log_generation(ent.name, &g) || g + KEEP_GENERATIONS > gen)
            continue;
        int rc = rmtree_at(sd, ent.name);
        if (rc)
            log_warn_limited("pruning %s/%s: %s", a->state_dir, ent.name, strerror(-rc));
    }
    uv_fs_req_cleanup(&req);
    close(sd);
}

/* The rank user may pass from the configured state directory (the node's directory's parent) down to dir. */
static int grant_rank_dir(const struct agent *a, const char *dir)
{
    char base[PATH_MAX];
    snprintf(base, sizeof(base), "%s", a->state_dir);
    char *slash = strrchr(base, '/');
    if (slash && slash != base)
        *slash = '\0';
    return rank_user_grant_dir(&a->cfg->rank_user, base, dir);
}

/* <state>/<node>/gen-G/rank-R, made if missing; "" when there is no usable state directory. */
static void rank_dir(const struct agent *a, uint64_t gen, uint32_t rank, char *out, size_t cap)
{
    out[0] = '\0';
    if (!a->state_dir[0])
        return;
    char dir[PATH_MAX];
    if (rank_log_dir(dir, sizeof(dir), a->state_dir, gen, rank) != 0)
        return;
    int rc = make_dirs(dir, 0700);
    if (rc == 0)
        rc = grant_rank_dir(a, dir);
    if (rc != 0) {
        log_warn("cannot create rank directory %s: %s; rank %u gets no error file", dir, strerror(-rc), rank);
        return;
    }
    snprintf(out, cap, "%s", dir);
}

/* The signal on which a Python rank's start-up hook dumps its stacks (MUSTER_STACKS_SIGNAL):
 * a real-time one, which no library uses by default. */
#define STACKS_SIGNAL (SIGRTMIN + 5)

static bool runs_trainer(const struct agent *a, const struct job_spec *spec);

/* PYTHONPATH's head for the ranks of spec: muster's start-up hook and client, or "" for none
 * (muster-train ranks, python_hook off, or no client beside the agent). */
static void python_hook_path(const struct agent *a, const struct job_spec *spec, bool trainer, char *out,
                             size_t cap)
{
    out[0] = '\0';
    if (spec->python_hook && !trainer && a->cfg->python_dir[0] &&
        (size_t)snprintf(out, cap, "%s/startup:%s", a->cfg->python_dir, a->cfg->python_dir) >= cap)
        out[0] = '\0';
}

/* The program of the ranks: the agent's command line, else the job's rank_cmd, else the agent's. */
static char **rank_command(const struct agent *a, const struct job_spec *spec, bool *from_job)
{
    *from_job = !a->cfg->rank_argv_pinned && cmdline_set(spec->rank_cmd);
    return *from_job ? cmdline_argv(spec->rank_cmd) : a->cfg->rank_argv;
}

/* Cores for each local rank's OpenMP threads: torchrun's OMP_NUM_THREADS, but from the cores. */
static uint32_t omp_threads(uint32_t local_ranks)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t t = cores > 0 ? (uint32_t)cores / (local_ranks ? local_ranks : 1) : 1;
    return t ? t : 1;
}

static void release_ranks(struct agent *a)
{
    for (uint32_t i = 0; i < a->nranks; i++) {
        if (a->ranks[i])
            rank_release(a->ranks[i]);
        a->ranks[i] = NULL;
    }
    a->nranks = 0;
}

/* A rank of the held assignment's slot i that rejoined it in place. */
static bool kept(const struct agent *a, uint32_t i)
{
    const struct agent_rank *r = i < a->nranks ? a->ranks[i] : NULL;
    return r && r->running && !r->stopping && r->generation == a->assign.generation;
}

/* A rank's ASSIGN, then its generation's unique id when it came already. */
static void hand_assignment(struct agent *a, struct agent_rank *r, const struct proto_msg *assign_msg)
{
    rank_send(r, assign_msg);
    if (a->have_uid && a->uid.generation == assign_msg->u.assign.generation) {
        struct proto_msg u;
        msg_init(&u, PROTO_UNIQUE_ID);
        u.u.unique_id = a->uid;
        rank_send(r, &u);
    }
}

/* The devices a rank of the held assignment sees, in LOCAL_RANK order (torchrun's view), into
 * out[PROTO_MAX_LOCAL_RANKS]; 0 = its own alone (muster-train, or the job's visible_devices "own"). */
static uint32_t visible_devices(const struct agent *a, uint32_t *out)
{
    const struct proto_assign *as = &a->assign;
#ifdef MUSTER_MUTANT_ONE_DEVICE
    /* A broken device contract for `make check-mutants` only (tests/mutants.sh): one device per rank, always. */
    return 0;
#endif
    if (a->cfg->devices.kind != PROTO_DEV_GPU || strcmp(a->spec.visible_devices, "node") != 0 ||
        runs_trainer(a, &a->spec))
        return 0;
    for (uint32_t j = 0; j < as->nranks; j++) /* local ranks are 0..nranks-1, each once (proto_check) */
        out[as->ranks[j].local_rank] = as->ranks[j].device;
    return as->nranks;
}

/* The identity of slot i of the held assignment; visible[PROTO_MAX_LOCAL_RANKS] holds its devices. */
static struct rank_identity slot_identity(const struct agent *a, uint32_t i, const char *error_file,
                                          const char *dir, const char *pypath, uint32_t *visible)
{
    const struct proto_assign *as = &a->assign;
    const struct proto_rank_slot *slot = &as->ranks[i];
    const struct job_spec *spec = &a->spec;
    struct rank_identity id = {
        .rank = slot->rank,
        .local_rank = slot->local_rank,
        .world_size = as->world_size,
        .local_world_size = as->nranks,
        .node_rank = as->node_rank,
        .nnodes = as->nnodes,
        .generation = as->generation,
        .restart_count = as->restart_count,
        .max_restarts = (uint32_t)spec->max_restarts,
        .run_id = spec->name,
        .master_addr = as->master_addr,
        .master_port = as->master_port,
        .error_file = error_file,
        .omp_threads = omp_threads(as->nranks),
        .node = a->cfg->node,
        .python_path = pypath,
        .rank_dir = dir,
        .stacks_signal = pypath[0] && dir[0] ? STACKS_SIGNAL : 0,
        .fr_buffer = pypath[0] && dir[0] ? (uint32_t)spec->flight_recorder : 0,
        .kind = a->cfg->devices.kind,
        .device = slot->device,
        .visible = visible,
        .nvisible = visible_devices(a, visible),
    };
    return id;
}

/* After the ranks started: a warm spare for the next one when the job wants it and can have it. */
static void keep_spare(struct agent *a, char *const *argv, const char *pypath)
{
    char why[sizeof(a->spare_said)];
    if (!spare_usable(&a->spec, argv, pypath, why, sizeof(why))) {
        if (why[0] && strcmp(why, a->spare_said) != 0)
            log_warn("warm_spares is off for this job: %s", why);
        snprintf(a->spare_said, sizeof(a->spare_said), "%s", why);
        spare_drop(&a->spare);
        return;
    }
    a->spare_said[0] = '\0';
    uint32_t visible[PROTO_MAX_LOCAL_RANKS];
    struct rank_identity id = slot_identity(a, 0, "", "", pypath, visible);
    spare_want(&a->spare, argv, rank_env_build(environ, &id), a->spec.warm_imports);
}

/* Spawns one rank per slot of the held assignment that has none (a rank that
 * rejoined in place keeps its slot), the warm spare becoming the first one when
 * there is one; no other rank may be running. */
static void spawn_all(struct agent *a)
{
    const struct proto_assign *as = &a->assign;
    if (memrep_waits(&a->rep, as))
        return; /* its memory checkpoint comes from the buddy first: spawn_pending stays */
    a->spawn_pending = false;
    for (uint32_t i = 0; i < a->nranks; i++) {
        if (!kept(a, i) && a->ranks[i]) {
            rank_release(a->ranks[i]);
            a->ranks[i] = NULL;
        }
    }
    const struct job_spec *spec = &a->spec;
    bool own_argv;
    char **argv = rank_command(a, spec, &own_argv);
    if (a->state_dir[0])
        prune_generations(a, as->generation);
    char pypath[2 * sizeof(a->cfg->python_dir) + 16];
    python_hook_path(a, spec, runs_trainer(a, spec), pypath, sizeof(pypath));
    static struct proto_msg assign_msg;
    msg_init(&assign_msg, PROTO_ASSIGN);
    assign_msg.u.assign = *as;
    assign_msg.u.assign.has_memckpt = 0; /* the agent's to act on, not the ranks' */
    assign_msg.u.assign.memckpt_from[0] = '\0';
    bool any_kept = false;
    for (uint32_t i = 0; i < a->nranks; i++)
        any_kept |= kept(a, i);
    memckpt_ready(&a->mem, as, a->ranks, a->nranks, any_kept);
    for (uint32_t i = 0; i < as->nranks; i++) {
        const struct proto_rank_slot *slot = &as->ranks[i];
        if (kept(a, i))
            continue;
        char dir[PATH_MAX], error_file[PATH_MAX + 16] = "";
        rank_dir(a, as->generation, slot->rank, dir, sizeof(dir));
        if (dir[0]) {
            snprintf(error_file, sizeof(error_file), "%s/error.json", dir);
            unlink(error_file);
        }
        uint32_t visible[PROTO_MAX_LOCAL_RANKS];
        struct rank_identity id = slot_identity(a, i, error_file, dir, pypath, visible);
        struct rank_callbacks cb = {.data = a, .on_msg = rank_on_msg, .on_exit = rank_on_exit};
        char **env = rank_env_build(environ, &id);
        if (a->mem.on)
            env = memckpt_env(env, a->mem.dir);
        int err_code = UV_ENOMEM;
        struct agent_rank *r = env && argv ? spare_take(&a->spare, argv, env) : NULL;
        const bool warm = r != NULL;
        if (warm)
            rank_take_up(r, &a->all, &id, &cb);
        else if (env && argv) {
            char **run = rank_user_argv(&a->cfg->rank_user, argv);
            r = run ? rank_spawn(a->loop, &a->all, run, env, &id, &cb, &err_code) : NULL;
            cmdline_free(run);
        }
        cmdline_free(env);
        a->ranks[i] = r;
        if (!r) {
            char why[PROTO_REASON_MAX], cmd[200] = "";
            if (argv)
                cmdline_describe(own_argv ? spec->rank_cmd : "", cmd, sizeof(cmd));
            snprintf(why, sizeof(why), "cannot run %s%s%s: %s (%s)", argv ? "'" : "the rank command",
                     argv ? argv[0] : "", argv ? "'" : "", uv_strerror(err_code),
                     own_argv ? "the job's rank_cmd" : a->cfg->rank_argv_pinned ? "the agent's command line"
                                                                               : "the agent's rank command");
            log_error("cannot start rank %u: %s", slot->rank, why);
            send_rank_exit(a, as->generation, slot->rank, 127, 0, why, cmd, false);
            continue;
        }
        snprintf(r->error_file, sizeof(r->error_file), "%s", error_file);
        /* Its output is read from the next loop iteration on: no line comes before the log is open. */
        rank_log_open(&r->log, dir, slot->rank, a->cfg->log_max_bytes);
        log_info("started rank %u (local rank %u, %s %u, pid %d) for generation %" PRIu64 "%s", slot->rank,
                 slot->local_rank, a->cfg->devices.kind == PROTO_DEV_GPU ? "gpu" : "cpu", slot->device, r->pid,
                 as->generation, warm ? ": the warm spare took it up" : "");
        hand_assignment(a, r, &assign_msg);
    }
    a->nranks = as->nranks;
    keep_spare(a, argv, pypath);
    if (own_argv)
        cmdline_free(argv);
}

/* memrep's link (memrep.h): frames to musterd, what waits on it, the ranks' files back from the buddy. */
static int rep_send(void *ctx, const struct proto_msg *m)
{
    struct agent *a = ctx;
    return a->link == LINK_JOINED ? send_to_daemon(a, m) : UV_ENOTCONN;
}

static size_t rep_queued(void *ctx)
{
    struct agent *a = ctx;
    return a->conn ? a->conn->wq_bytes : 0;
}

static void rep_fetched(void *ctx)
{
    struct agent *a = ctx;
    if (a->spawn_pending && !any_outgoing(a))
        spawn_all(a);
}

/* ---- MASTER_PORT ------------------------------------------------------- */

/* Free: a listener could bind it now, on IPv4 and (where there is IPv6) on IPv6. */
static bool port_free(uint16_t port)
{
    int fams[2] = {AF_INET, AF_INET6};
    for (int i = 0; i < 2; i++) {
        int fd = socket(fams[i], SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue; /* no such family here */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof(ss));
        socklen_t len;
        if (fams[i] == AF_INET) {
            struct sockaddr_in *in = (struct sockaddr_in *)&ss;
            in->sin_family = AF_INET;
            in->sin_port = htons(port);
            len = sizeof(*in);
        } else {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
            in6->sin6_family = AF_INET6;
            in6->sin6_port = htons(port);
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
            len = sizeof(*in6);
        }
        int rc = bind(fd, (struct sockaddr *)&ss, len);
        int e = errno;
        close(fd);
        if (rc != 0 && e == EADDRINUSE)
            return false;
    }
    return true;
}

/*
 * A port of master_port_range that is free and is not the current
 * generation's (whose rank 0 may still hold it while it is being stopped).
 * Reported in HELLO and every heartbeat; musterd gives the one that rank 0's
 * node reported last to the next generation as MASTER_PORT. The candidate
 * stays while it is free; a new one is searched from a random point of the
 * range, so that jobs sharing a machine (several agents, test clusters) do
 * not all offer the range's first port: a rank binds it only seconds later,
 * after its imports, and two jobs on one port would meet in one store.
 */
static void refresh_free_port(struct agent *a)
{
    /* The running generation's port, while any rank (its rank 0 among them) still lives. */
    uint32_t skip = a->have_assign && any_running(a) ? a->assign.master_port : 0, found = 0;
    uint32_t lo = a->cfg->port_lo, span = lo ? (uint32_t)a->cfg->port_hi - lo + 1 : 0;
    if (a->free_port && a->free_port != skip && port_free((uint16_t)a->free_port)) {
        found = a->free_port;
    } else if (span) {
        uint32_t start = rng_next(a) % span;
        for (uint32_t k = 0; k < span && !found; k++) {
            uint32_t p = lo + (start + k) % span;
            if (p != skip && port_free((uint16_t)p))
                found = p;
        }
    }
    if (!found && !a->port_warned)
        log_warn("no free port in master_port_range %u-%u (every one is in use%s); this node cannot hold "
                 "rank 0 until one is free",
                 a->cfg->port_lo, a->cfg->port_hi, skip ? ", or is the running generation's" : "");
    else if (found && a->port_warned)
        log_info("port %u of master_port_range is free again", found);
    a->port_warned = !found;
    a->free_port = found;
}

/* The state directory: the configured one, else a system one, else a private one under $TMPDIR. */
static void choose_state_dir(struct agent *a)
{
    const char *tmp = getenv("TMPDIR");
    char fallback[PATH_MAX];
    snprintf(fallback, sizeof(fallback), "%s/muster-worker-%s", tmp && tmp[0] ? tmp : "/tmp", a->cfg->node);
    const char *candidates[3] = {a->cfg->state_dir[0] ? a->cfg->state_dir : NULL,
                                 a->cfg->state_dir[0] ? NULL : "/var/lib/muster-worker",
                                 a->cfg->state_dir[0] ? NULL : fallback};
    for (int i = 0; i < 3; i++) {
        if (!candidates[i])
            continue;
        /* One subdirectory per node: agents of several nodes may share a machine and a directory. */
        char dir[PATH_MAX], why[160] = "";
        int rc = snprintf(dir, sizeof(dir), "%s/%s", candidates[i], a->cfg->node) < (int)sizeof(dir)
                     ? make_dirs(dir, 0700)
                     : -ENAMETOOLONG;
        /* $TMPDIR is everyone's: a muster-worker-NODE found there may be a stranger's, with links
         * planted in it. It and the node's directory must be this agent's alone. */
        if (rc == 0 && candidates[i] == fallback && dir_private(candidates[i], why, sizeof(why)) != 0) {
            log_error("state directory %s refused: %s (someone else's directory could redirect the ranks' "
                      "files); remove it or give --state-dir DIR", candidates[i], why);
            continue;
        }
        if (rc == 0 && dir_private(dir, why, sizeof(why)) != 0) {
            log_error("state directory %s refused: %s; remove it or give --state-dir DIR", dir, why);
            continue;
        }
        if (rc == 0) {
            snprintf(a->state_dir, sizeof(a->state_dir), "%s", dir);
            log_info("rank directories (error files, logs) under %s", a->state_dir);
            return;
        }
        log_warn("state directory %s: %s", candidates[i], strerror(-rc));
    }
    a->state_dir[0] = '\0';
    log_error("no usable state directory: ranks get no TORCHELASTIC_ERROR_FILE (give --state-dir DIR)");
}

/* ---- the daemon link --------------------------------------------------- */

/* The current entry of the daemon list becomes the daemon joined. */
static void use_daemon(struct agent *a)
{
    char err[160];
    snprintf(a->daemon, sizeof(a->daemon), "%s", a->daemons.addr[a->daemons.cur]);
    hostport_parse(a->daemon, a->host, &a->port, err, sizeof(err)); /* valid: daemon_list_parse checked it */
}

static void link_close(struct agent *a)
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
static void notify_joined(struct agent *a)
{
    char ranks[64] = "no ranks yet";
    if (a->have_assign)
        snprintf(ranks, sizeof(ranks), "generation %" PRIu64 ", %u ranks", a->assign.generation, a->assign.nranks);
    notify_sendf("%sSTATUS=joined daemon %s as %s, %s", a->told_ready ? "" : "READY=1\n", a->daemon,
                 a->cfg->node, ranks);
    a->told_ready = true;
}

static void link_lost(struct agent *a, const char *why)
{
    notify_sendf("STATUS=lost the daemon at %s: %s; rejoining", a->daemon, why);
    log_warn("lost the daemon at %s: %s; rejoining", a->daemon, why);
    link_close(a);
    memrep_link_lost(&a->rep);
    schedule_retry(a, NULL);
}

static void drop_stalled(struct agent *a)
{
    if (a->stalled) {
        fconn_close(a->stalled);
        a->stalled = NULL;
    }
    a->resume_until = 0;
}

static uint64_t stall_ms(const struct agent *a)
{
    return proto_stall_ms(a->heartbeat_timeout_ms);
}

/*
 * The connection is set aside (kept open, unread: see "Link stalls" at the
 * top) and a new one resumes the session while the daemon's deadline for
 * this node has not passed: after a heartbeat went unanswered for stall_ms,
 * or a frame failed its MAC.
 */
static void set_aside(struct agent *a, uint64_t now)
{
    uv_timer_stop(&a->beat_timer);
    drop_stalled(a);
    a->stalled = a->conn;
    a->stalled_at = now;
    a->conn = NULL;
    a->unanswered_since = 0;
    /* The daemon's deadline: heartbeat_timeout_ms after the last heartbeat it
     * heard, at the latest the last one sent (heartbeats that asked for no
     * answer may have been heard after its last frame). */
    a->resume_until = (a->last_beat_at > a->last_rx ? a->last_beat_at : a->last_rx) + a->heartbeat_timeout_ms;
    link_set_state(a, LINK_IDLE);
    uv_timer_start(&a->retry_timer, on_retry_timer, 0, 0);
}

static void link_stalled(struct agent *a, uint64_t now)
{
    log_warn("no answer from the daemon at %s for %" PRIu64 " ms (heartbeat sent %" PRIu64 " ms ago): "
             "resuming the session on a new connection",
             a->daemon, now - a->last_rx, now - a->unanswered_since);
    notify_sendf("STATUS=link to the daemon at %s stalled; resuming the session", a->daemon);
    set_aside(a, now);
}

/* 0, or the libuv error (UV_EPROTO: m could not be encoded, nothing was sent). */
static int send_to_daemon(struct agent *a, const struct proto_msg *m)
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
    link_lost(a, why);
    return rc;
}

static void schedule_retry(struct agent *a, const char *why)
{
    if (a->exiting)
        return;
    link_set_state(a, LINK_IDLE);
    if (a->resume_until) {
        /* Resuming a session: every attempt counts before the daemon's deadline. */
        log_debug("resuming: %s; next attempt in %d ms", why ? why : "attempt failed", RESUME_RETRY_MS);
        uv_timer_start(&a->retry_timer, on_retry_timer, RESUME_RETRY_MS, 0);
        return;
    }
    /* Several daemons: one of them leads, or will within the election's
     * lease; asked again soon (jittered), not after a growing backoff. */
    uint64_t delay = a->daemons.n > 1 ? FOLLOW_RETRY_MS / 2 + rng_next(a) % FOLLOW_RETRY_MS
                                      : backoff_next(&a->backoff, rng_next(a));
    if (why)
        log_warn("cannot reach daemon at %s: %s; retry %u in %.1f s", a->daemon, why, a->backoff.attempt,
                 (double)delay / 1000.0);
    else
        log_debug("rejoin attempt %u in %.1f s", a->backoff.attempt, (double)delay / 1000.0);
    uv_timer_start(&a->retry_timer, on_retry_timer, delay, 0);
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
        schedule_retry(a, why);
        return;
    }
    a->ai_list = a->ai_next = res;
    a->last_connect_err = UV_EADDRNOTAVAIL;
    try_next_addr(a);
}

static void on_retry_timer(uv_timer_t *t)
{
    struct agent *a = t->data;
    char port[8];
    snprintf(port, sizeof(port), "%u", a->port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof(hints));
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    link_set_state(a, LINK_RESOLVING);
    int rc = uv_getaddrinfo(a->loop, &a->gai, on_resolved, a->host, port, &hints);
    if (rc != 0) {
        char why[200];
        snprintf(why, sizeof(why), "cannot resolve %s: %s", a->host, uv_strerror(rc));
        schedule_retry(a, why);
        return;
    }
    a->gai_busy = true;
}

static void daemon_msg(struct fconn *c, struct proto_msg *msg);
static void daemon_bad(struct fconn *c, int err);

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
    link_lost(a, why);
}

static int64_t wall_ms(void)
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
    h->preflight = !ranks_live(a);
    a->preflight_promised = h->preflight;
    a->hello_wall_ms = wall_ms();
}

/* NVML's facts about the GPUs this node offers (none without the driver). */
static void probe_gpus(struct agent *a)
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
    msg_init(&m, PROTO_HELLO);
    struct proto_hello *h = &m.u.hello;
    snprintf(h->node, sizeof(h->node), "%s", a->cfg->node);
    snprintf(h->addr, sizeof(h->addr), "%s", a->cfg->addr[0] ? a->cfg->addr : a->local_addr);
    h->kind = a->cfg->devices.kind;
    h->ndevices = a->cfg->devices.n;
    memcpy(h->devices, a->cfg->devices.ids, sizeof(h->devices));
    /* A rank whose exit the daemon may have missed still counts: the exit follows WELCOME. */
    h->generation = ranks_live(a) || (a->have_assign && exitq_holds(&a->exits, a->assign.generation))
                        ? a->assign.generation
                        : 0;
    hello_facts(a, h);
    refresh_free_port(a);
    h->free_port = a->free_port;
    h->session = a->session;
    snprintf(h->agent_version, sizeof(h->agent_version), "%s", MUSTER_VERSION);
    log_debug("HELLO node %s addr %s generation %" PRIu64, h->node, h->addr, h->generation);
    /* The proofs cover the HELLO as sent: it is encoded here, once. */
    static uint8_t frame[PROTO_MAX_FRAME];
    int n = proto_nonce(h->nonce) == 0 ? proto_encode(&m, frame, sizeof(frame)) : PROTO_E_CRYPTO;
    if (n < 0 || proto_bind_hello(&a->bind, frame, (size_t)n, h) != 0) {
        log_error("cannot make the HELLO: %s", proto_strerror(n < 0 ? n : PROTO_E_CRYPTO));
        link_lost(a, "cannot make the HELLO");
        return;
    }
    int rc = fconn_send_frame(a->conn, frame, (size_t)n);
    if (rc != 0) {
        char why[160];
        snprintf(why, sizeof(why), "cannot send HELLO: %s", uv_strerror(rc));
        link_lost(a, why);
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
        try_next_addr(a);
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
        link_close(a);
        schedule_retry(a, why);
        return;
    }
    log_debug("connected to %s from %s", a->daemon, a->local_addr);
    link_set_state(a, LINK_HELLO);
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
    try_next_addr(a);
}

static void try_next_addr(struct agent *a)
{
    if (!a->ai_next && a->daemons.n > 1 && ++a->tried < a->daemons.n) {
        /* Another musterd of the job may lead: it is tried at once, the backoff
         * counting only a round through all of them. */
        log_info("cannot reach daemon at %s: %s; trying %s", a->daemon, uv_strerror(a->last_connect_err),
                 a->daemons.addr[(a->daemons.cur + 1) % a->daemons.n]);
        link_close(a);
        daemon_list_next(&a->daemons);
        use_daemon(a);
        link_set_state(a, LINK_IDLE);
        uv_timer_start(&a->retry_timer, on_retry_timer, 0, 0);
        return;
    }
    if (!a->ai_next) {
        char why[160];
        snprintf(why, sizeof(why), "%s", uv_strerror(a->last_connect_err));
        /* libuv's "connection refused" reads well; keep it lower-case like the rest. */
        if (why[0] >= 'A' && why[0] <= 'Z')
            why[0] = (char)(why[0] - 'A' + 'a');
        link_close(a);
        schedule_retry(a, why);
        /* The round through the daemons starts again with the next one. */
        a->tried = 0;
        daemon_list_next(&a->daemons);
        use_daemon(a);
        return;
    }
    struct addrinfo *ai = a->ai_next;
    a->ai_next = ai->ai_next;
    a->conn = fconn_new_tcp(a->loop, a);
    if (!a->conn) {
        a->last_connect_err = UV_ENOMEM;
        try_next_addr(a);
        return;
    }
    a->conn->on_msg = daemon_msg;
    a->conn->on_bad = daemon_bad;
    a->conn->on_fail = daemon_fail;
    a->connect_req.data = a;
    link_set_state(a, LINK_CONNECTING);
    int rc = uv_tcp_connect(&a->connect_req, &a->conn->h.tcp, ai->ai_addr, on_connected);
    if (rc == 0 && a->resume_until)
        uv_timer_start(&a->connect_timer, on_connect_deadline, RESUME_CONNECT_MS, 0);
    else if (rc == 0 && a->daemons.n > 1)
        uv_timer_start(&a->connect_timer, on_connect_deadline, FOLLOW_CONNECT_MS, 0); /* a host gone: the next */
    if (rc != 0) {
        a->last_connect_err = rc;
        fconn_close(a->conn);
        a->conn = NULL;
        try_next_addr(a);
    }
}

static void on_beat_timer(uv_timer_t *t)
{
    struct agent *a = t->data;
    if (a->link != LINK_JOINED)
        return;
    struct proto_msg m;
    proto_heartbeat_start(&m); /* the entries are copied in whole; the rest is not written */
    struct proto_heartbeat *hb = &m.u.heartbeat;
    hb->generation = a->cur_gen;
    hb->seq = ++a->beat_seq;
    refresh_free_port(a);
    hb->free_port = a->free_port;
    memckpt_heartbeat(&a->mem, a->ranks, a->nranks, hb);
    memrep_heartbeat(&a->rep, hb);
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
        const bool q = quiet(r, now);
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
    send_to_daemon(a, &m);
}

/* ---- messages from the daemon ------------------------------------------ */

static bool stale(struct agent *a, const char *what, uint64_t gen)
{
    if (gen >= a->cur_gen)
        return false;
    log_debug("%s of generation %" PRIu64 " from the daemon ignored (current %" PRIu64 ")", what, gen, a->cur_gen);
    return true;
}

static void send_error(struct agent *a, const char *code, const char *reason)
{
    struct proto_msg m;
    msg_init(&m, PROTO_ERROR);
    snprintf(m.u.error.code, sizeof(m.u.error.code), "%s", code);
    snprintf(m.u.error.reason, sizeof(m.u.error.reason), "%s", reason);
    send_to_daemon(a, &m);
}

static int check_assign(const struct agent *a, const struct proto_assign *as, struct job_spec *spec, char *err,
                        size_t errlen)
{
    if (!as->job || job_spec_from_json(as->job, "ASSIGN job", spec, err, errlen) != 0) {
        if (!as->job)
            snprintf(err, errlen, "ASSIGN carries no job");
        return -1;
    }
    if (as->nranks == 0 || as->nranks > a->cfg->devices.n) {
        snprintf(err, errlen, "ASSIGN gives %u ranks to node %s, which has %u devices", as->nranks, a->cfg->node,
                 a->cfg->devices.n);
        return -1;
    }
    for (uint32_t i = 0; i < as->nranks; i++) {
        const struct proto_rank_slot *s = &as->ranks[i];
        if (!devices_contains(&a->cfg->devices, s->device) || s->local_rank >= as->nranks ||
            s->rank >= as->world_size) {
            snprintf(err, errlen, "ASSIGN slot %u (rank %u, local rank %u, device %u) does not fit node %s", i,
                     s->rank, s->local_rank, s->device, a->cfg->node);
            return -1;
        }
    }
    return 0;
}

static bool same_layout(const struct proto_assign *x, const struct proto_assign *y)
{
    return x->generation == y->generation && x->world_size == y->world_size && x->nranks == y->nranks &&
           memcmp(x->ranks, y->ranks, x->nranks * sizeof(x->ranks[0])) == 0;
}

/*
 * The held assignment is a new generation of the same slots (local ranks and
 * devices): each rank that said it can rejoin (heartbeat "rejoin") and runs
 * on gets the new ASSIGN and becomes that generation's rank of its slot (its
 * global rank may change), its output going to the new generation's log
 * from now on. Returns how many did.
 */
static uint32_t rejoin_ranks(struct agent *a)
{
    const struct proto_assign *as = &a->assign;
    static struct proto_msg assign_msg;
    uint32_t n = 0;
    msg_init(&assign_msg, PROTO_ASSIGN);
    assign_msg.u.assign = *as;
    for (uint32_t i = 0; i < as->nranks; i++) {
        struct agent_rank *r = i < a->nranks ? a->ranks[i] : NULL;
        if (!r || !r->running || r->stopping || !r->beat.rejoin || !r->ctl || r->local_rank != as->ranks[i].local_rank ||
            !responsive(a, r))
            continue;
        if (r->rank != as->ranks[i].rank)
            log_info("rank %u (pid %d) becomes rank %u of %u", r->rank, r->pid, as->ranks[i].rank, as->world_size);
        r->rejoined_from = r->generation;
        r->generation = as->generation;
        r->rank = as->ranks[i].rank;
        r->beat.rank = r->rank;
        /* Until the rank's own heartbeat of this generation: nothing restored yet (its last
         * report was of the generation before, and the daemon takes rank 0's as this one's). */
        r->beat.restore_from = PROTO_RESTORE_NONE;
        r->beat.restore_step = 0;
        r->beat.yielded = 0;
        char dir[PATH_MAX];
        rank_dir(a, as->generation, r->rank, dir, sizeof(dir));
        rank_log_close(&r->log);
        rank_log_open(&r->log, dir, r->rank, a->cfg->log_max_bytes);
        hand_assignment(a, r, &assign_msg);
        log_info("rank %u (pid %d) rejoins in place for generation %" PRIu64, r->rank, r->pid, as->generation);
        n++;
    }
    return n;
}

static void on_assign(struct agent *a, struct proto_assign *as)
{
    if (stale(a, "ASSIGN", as->generation))
        return;
    struct job_spec spec;
    char err[300];
    if (check_assign(a, as, &spec, err, sizeof(err)) != 0) {
        log_error("refusing assignment of generation %" PRIu64 ": %s", as->generation, err);
        send_error(a, PROTO_REJECT_BAD_REQUEST, err);
        return;
    }
    a->cur_gen = as->generation;
    agent_preflight_stop(&a->pf);
    if (a->have_uid && a->uid.generation < as->generation)
        a->have_uid = false;
    if (ranks_live(a) && same_layout(&a->assign, as)) {
        log_info("generation %" PRIu64 ": ranks already running; keeping them", as->generation);
        /* Rank 0 sends its id once: a daemon that restarted before handing it
         * out gets it again, or the generation never forms. */
        if (a->have_made_uid && a->made_uid.generation == as->generation &&
            !(a->have_uid && a->uid.generation == as->generation)) {
            log_info("sending rank 0's unique id of generation %" PRIu64 " again (never handed out)", as->generation);
            struct proto_msg m;
            msg_init(&m, PROTO_UNIQUE_ID);
            m.u.unique_id = a->made_uid;
            send_to_daemon(a, &m);
        }
        return;
    }
    /* Ranks that can rejoin keep their process when their slot (local rank and
     * device) stays; the global rank and world size may change (the job grew
     * or shrank: the rank re-slices its state). */
    bool same_slots = a->have_assign && a->assign.nranks == as->nranks;
    for (uint32_t i = 0; same_slots && i < as->nranks; i++)
        same_slots = a->assign.ranks[i].local_rank == as->ranks[i].local_rank &&
                     a->assign.ranks[i].device == as->ranks[i].device;
    if (a->have_assign)
        json_decref(a->assign.job);
    a->assign = *as;
    json_incref(a->assign.job);
    a->have_assign = true;
    a->spec = spec;
    memckpt_job(&a->mem, &a->spec);
    int shared = a->cfg->rank_user.set ? memckpt_share(&a->mem, a->cfg->rank_user.gid) : 0;
    if (shared) { /* ranks that cannot write it get none, rather than one others may */
        log_error("memory checkpoint directory %s: cannot give it to rank_group %u: %s; the ranks get no %s",
                  a->mem.dir, (unsigned)a->cfg->rank_user.gid, strerror(-shared), MEMCKPT_ENV);
        memckpt_close(&a->mem);
    }
    memrep_job(&a->rep, &a->spec, as->nnodes);
    uint32_t rejoined = same_slots ? rejoin_ranks(a) : 0;
    log_info("generation %" PRIu64 ": %u rank(s) of world size %u on this node (ranks %u..%u)%s", as->generation,
             as->nranks, as->world_size, as->ranks[0].rank, as->ranks[as->nranks - 1].rank,
             rejoined == as->nranks ? ", every one rejoining in place" : rejoined ? ", some rejoining in place" : "");
    for (struct agent_rank *r = a->all; r; r = r->next)
        if (r->generation != as->generation)
            rank_stop(r, as->generation, (uint64_t)a->spec.stop_grace_ms);
    a->spawn_pending = true;
    if (!any_outgoing(a))
        spawn_all(a);
    notify_joined(a);
}

static void on_unique_id(struct agent *a, const struct proto_unique_id *u)
{
    if (stale(a, "UNIQUE_ID", u->generation))
        return;
    if (a->have_uid && a->uid.generation == u->generation && memcmp(a->uid.id, u->id, PROTO_UID_LEN) == 0) {
        log_debug("unique id of generation %" PRIu64 " again (sent again after a resumed session); ranks have it",
                  u->generation);
        return;
    }
    a->uid = *u;
    a->have_uid = true;
    struct proto_msg m;
    msg_init(&m, PROTO_UNIQUE_ID);
    m.u.unique_id = *u;
    unsigned n = 0;
    for (uint32_t i = 0; i < a->nranks; i++) {
        struct agent_rank *r = a->ranks[i];
        if (r && r->running && r->generation == u->generation) {
            rank_send(r, &m);
            n++;
        }
    }
    log_info("unique id of generation %" PRIu64 " handed to %u rank(s)", u->generation, n);
}

/* Any generation's: logs are what an operator reads after a restart, so they are not fenced. */
static void on_log_request(struct agent *a, const struct proto_log_request *q)
{
    struct proto_msg m;
    msg_init(&m, PROTO_LOG_DATA);
    if (a->conn && a->conn->wq_bytes > LOG_SEND_QUEUE_MAX) {
        struct proto_log_data *d = &m.u.log_data;
        d->id = q->id;
        d->rank = q->rank;
        d->generation = q->generation;
        d->error = PROTO_LOG_BUSY;
        snprintf(d->reason, sizeof(d->reason), "node %s has %zu bytes waiting to go to musterd; ask again",
                 a->cfg->node, a->conn->wq_bytes);
        send_to_daemon(a, &m);
        return;
    }
    rank_log_serve(a->state_dir, a->cfg->node, a->cfg->log_max_bytes == 0, q, &m.u.log_data);
    log_debug("log of rank %u, generation %" PRIu64 ": %" PRIu64 "..%" PRIu64 " of %" PRIu64 " bytes%s%s", q->rank,
              m.u.log_data.generation, m.u.log_data.offset, m.u.log_data.next_offset, m.u.log_data.size,
              m.u.log_data.error ? ": " : "", m.u.log_data.reason);
    if (send_to_daemon(a, &m) == UV_EPROTO) {
        /* The request is answered all the same, or it holds a daemon slot until its deadline. */
        int why = a->conn->encode_err;
        proto_msg_clear(&m);
        msg_init(&m, PROTO_LOG_DATA);
        m.u.log_data.id = q->id;
        m.u.log_data.rank = q->rank;
        m.u.log_data.error = PROTO_LOG_UNREADABLE;
        snprintf(m.u.log_data.reason, sizeof(m.u.log_data.reason), "node %s could not encode its answer: %s",
                 a->cfg->node, proto_strerror(why));
        send_to_daemon(a, &m);
    }
    proto_msg_clear(&m);
}

static void agent_exit(struct agent *a, int code);

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
        send_to_daemon(a, &m);
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
        if (!stacks_poll(&a->stacks[i]) || !flight_ask_poll(&a->flights[i]))
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
        rank_dir(a, r->generation, r->rank, dir, sizeof(dir));
        if (stacks_begin(d, dir, r->pid, STACKS_SIGNAL))
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

static void recheck_checkpoint(struct agent *a);

static void on_command(struct agent *a, const struct proto_command_msg *c)
{
    if (stale(a, "COMMAND", c->generation))
        return;
    switch (c->action) {
    case PROTO_CMD_STOP:
        log_info("daemon: stop (generation %" PRIu64 ")", c->generation);
        a->cur_gen = c->generation;
        a->spawn_pending = false;
        stop_all(a, c->generation);
        recheck_checkpoint(a);
        break;
    case PROTO_CMD_PARK: {
        log_info("daemon: generation over, park (generation %" PRIu64 " is next)", c->generation);
        a->cur_gen = c->generation;
        a->spawn_pending = false;
        struct proto_msg m;
        msg_init(&m, PROTO_COMMAND);
        m.u.command = *c;
        for (struct agent_rank *r = a->all; r; r = r->next) {
            if (!r->running || r->stopping)
                continue;
            if (r->beat.rejoin && r->ctl && responsive(a, r)) {
                rank_send(r, &m); /* it aborts its communicator and waits for the next ASSIGN */
                continue;
            }
            if (r->beat.rejoin)
                log_warn("rank %u (pid %d) has said nothing for %.1f s: stopped, not parked", r->rank, r->pid,
                         r->heard_ms ? (double)(uv_now(a->loop) - r->heard_ms) / 1000.0 : 0.0);
            rank_stop(r, c->generation, (uint64_t)a->spec.stop_grace_ms);
        }
        recheck_checkpoint(a);
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
        stop_all(a, c->generation);
        a->spawn_pending = true;
        if (!any_running(a))
            spawn_all(a);
        break;
    case PROTO_CMD_SHUTDOWN:
        log_info("daemon: shutdown");
        a->mem_drop = true;
        agent_exit(a, 0);
        break;
    case PROTO_CMD_CHECKPOINT: {
        struct proto_msg m;
        msg_init(&m, PROTO_COMMAND);
        m.u.command = *c;
        for (uint32_t i = 0; i < a->nranks; i++)
            if (a->ranks[i] && a->ranks[i]->running && a->ranks[i]->generation == c->generation)
                rank_send(a->ranks[i], &m);
        log_info("daemon: checkpoint (generation %" PRIu64 ") forwarded to the ranks", c->generation);
        break;
    }
    case PROTO_CMD_YIELD: { /* the job grows: ranks that rejoin leave the generation at a step boundary */
        struct proto_msg m;
        msg_init(&m, PROTO_COMMAND);
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
    use_daemon(a);
    bool named = strncmp(rj->reason, a->daemon, strlen(a->daemon)) == 0;
    log_info("daemon at %s stands by (%s): trying %s%s", was, rj->reason, a->daemon,
             named ? "" : " in a moment");
    link_close(a);
    link_set_state(a, LINK_IDLE);
    /* At once to a leader named for the first time since the last join; a
     * name that failed already (its lease has not ended yet) waits. */
    bool at_once = named && !a->followed;
    a->followed = true;
    uv_timer_start(&a->retry_timer, on_retry_timer, at_once ? 0 : FOLLOW_RETRY_MS, 0);
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
    link_close(a);
    if (fatal)
        agent_exit(a, 1);
    else
        schedule_retry(a, NULL);
}

static void on_preflight_done(struct agent_preflight *p, bool fit, const char *reason)
{
    struct agent *a = p->data;
    if (a->link != LINK_JOINED)
        return;
    struct proto_msg m;
    msg_init(&m, PROTO_PREFLIGHT);
    m.u.preflight.fit = fit;
    m.u.preflight.trainer = a->trainer;
    snprintf(m.u.preflight.reason, sizeof(m.u.preflight.reason), "%s", fit ? "" : reason);
    proto_text_sanitize(m.u.preflight.reason);
    m.u.preflight.has_checkpoint = fit && p->res.has_checkpoint;
    if (m.u.preflight.has_checkpoint) {
        snprintf(m.u.preflight.checkpoint, sizeof(m.u.preflight.checkpoint), "%s", p->res.checkpoint);
        proto_text_sanitize(m.u.preflight.checkpoint);
    }
    bool same = a->preflight_logged && strcmp(a->preflight_said, m.u.preflight.reason) == 0;
    if (!same) {
        if (fit)
            log_info("pre-flight checks pass");
        else
            log_warn("unfit for the job: %s (checking again every %d s)", reason, PREFLIGHT_RETRY_MS / 1000);
    }
    /* a fit node checks again only to follow its latest checkpoint: musterd hears of changes */
    if (same && fit && a->preflight_had_ckpt == (bool)m.u.preflight.has_checkpoint &&
        strcmp(a->preflight_ckpt, m.u.preflight.checkpoint) == 0)
        return;
    snprintf(a->preflight_said, sizeof(a->preflight_said), "%s", m.u.preflight.reason);
    snprintf(a->preflight_ckpt, sizeof(a->preflight_ckpt), "%s", m.u.preflight.checkpoint);
    a->preflight_had_ckpt = m.u.preflight.has_checkpoint;
    a->preflight_logged = true;
    send_to_daemon(a, &m);
}

/* The ranks are muster-train when the program they run is (docs/rank-env.md). */
static bool runs_trainer(const struct agent *a, const struct job_spec *spec)
{
    bool from_job;
    char **argv = rank_command(a, spec, &from_job);
    const char *prog = argv && argv[0] ? argv[0] : "";
    const char *base = strrchr(prog, '/');
    bool trainer = strcmp(base ? base + 1 : prog, "muster-train") == 0;
    if (from_job)
        cmdline_free(argv);
    return trainer;
}

/* What a pre-flight of spec checks on this node (the clock aside). */
static void preflight_inputs_of(struct agent *a, const struct job_spec *spec, struct preflight_inputs *in)
{
    memset(in, 0, sizeof(*in));
    in->spec = *spec;
    a->trainer = runs_trainer(a, spec);
    in->trainer = a->trainer;
    in->kind = a->cfg->devices.kind;
    in->ndevices = a->cfg->devices.n;
    memcpy(in->devices, a->cfg->devices.ids, sizeof(in->devices));
    bool from_job;
    char **argv = rank_command(a, spec, &from_job);
    int argc = 0;
    while (argv && argv[argc])
        argc++;
    if (argc == 0 || cmdline_from_argv(argc, argv, in->cmd, sizeof(in->cmd)) != 0)
        in->cmd[0] = in->cmd[1] = '\0';
    if (from_job)
        cmdline_free(argv);
    python_hook_path(a, spec, a->trainer, in->python_path, sizeof(in->python_path));
    snprintf(in->node, sizeof(in->node), "%s", a->cfg->node);
    in->user = &a->cfg->rank_user;
}

/* The pre-flight HELLO promised, of the job WELCOME carries. */
static void start_preflight(struct agent *a, const struct proto_welcome *w)
{
    static struct preflight_inputs in; /* large; the loop thread's alone */
    struct job_spec spec;
    char err[PREFLIGHT_WHY_MAX];
    a->preflight_logged = false;
    if (!w->job || job_spec_from_json(w->job, "WELCOME", &spec, err, sizeof(err)) != 0) {
        if (!w->job)
            snprintf(err, sizeof(err), "musterd sent no job to check");
        a->trainer = false;
        on_preflight_done(&a->pf, !w->job, err);
        return;
    }
    memckpt_welcome(&a->mem, &spec); /* its list goes from the first heartbeat: musterd waits for every member's */
    preflight_inputs_of(a, &spec, &in);
    if (w->time_ms) {
        int64_t now = wall_ms();
        in.have_clock = true;
        in.rtt_ms = now - a->hello_wall_ms;
        in.skew_ms = now - (int64_t)w->time_ms;
    }
    agent_preflight_start(&a->pf, &in);
}

/*
 * A generation is over (COMMAND park or stop) and the job names
 * checkpoint_latest: the node checks again and reports the latest checkpoint
 * it has now, which musterd compares before the next generation starts.
 */
static void recheck_checkpoint(struct agent *a)
{
    static struct preflight_inputs in;
    if (!a->have_assign || !a->spec.checkpoint_latest[0])
        return;
    preflight_inputs_of(a, &a->spec, &in);
    a->preflight_logged = false; /* the report goes out even when it is what it was */
    agent_preflight_start(&a->pf, &in);
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
    drop_stalled(a);
    a->session = w->session;
    a->unanswered_since = 0;
    a->beats_since_answer = 0;
    link_set_state(a, LINK_JOINED);
    char term[48] = "";
    if (a->daemons.term)
        snprintf(term, sizeof(term), "; leader's term %" PRIu64, a->daemons.term);
    log_info("joined daemon at %s as node %s (%u %s device(s), address %s; heartbeat %u ms, lease %u ms%s)",
             a->daemon, a->cfg->node, a->cfg->devices.n,
             a->cfg->devices.kind == PROTO_DEV_GPU ? "gpu" : "cpu", a->cfg->addr[0] ? a->cfg->addr : a->local_addr,
             a->heartbeat_interval_ms, a->lease_ms, term);
    send_unread_exits(a);
    uv_timer_start(&a->beat_timer, on_beat_timer, 0, a->heartbeat_interval_ms);
    notify_joined(a);
    if (a->preflight_promised)
        start_preflight(a, w);
}

static void protocol_violation(struct agent *a, const struct proto_msg *msg)
{
    char why[160];
    snprintf(why, sizeof(why), "unexpected %s in state %s", proto_type_name(msg->type), link_names[a->link]);
    link_lost(a, why);
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
    link_lost(a, "it sent a frame of a deposed leader's term");
    if (a->daemons.n > 1) {
        daemon_list_next(&a->daemons); /* the retry goes there */
        use_daemon(a);
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
    link_close(a);
    if (a->daemons.n > 1) {
        daemon_list_next(&a->daemons);
        use_daemon(a);
    }
    schedule_retry(a, NULL);
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
        link_close(a);
        schedule_retry(a, NULL);
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
        msg_init(&e, PROTO_ERROR);
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
    msg_init(&r, PROTO_RESPONSE);
    if (!ch || proto_proof(a->cfg->token, a->cfg->token_len, &a->bind, PROTO_SIDE_AGENT, r.u.response.hmac) != 0) {
        proto_channel_free(ch);
        log_error("cannot compute the proof or the channel's keys (crypto library failure)");
        link_lost(a, "crypto failure");
        return;
    }
    fconn_seal_rx(a->conn, ch); /* every later frame from the daemon is sealed */
    link_set_state(a, LINK_AUTH);
    if (send_to_daemon(a, &r) == 0)
        fconn_seal_tx(a->conn); /* and every later frame to it */
}

static void daemon_msg(struct fconn *c, struct proto_msg *msg)
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
        on_assign(a, &msg->u.assign);
        /* The port it reported free is now the generation's MASTER_PORT, and
         * musterd gives the next generation another: one beat says which at
         * once, so that a generation breaking now does not wait for it. */
        if (a->have_assign && a->free_port == a->assign.master_port)
            on_beat_timer(&a->beat_timer);
        break;
    case PROTO_UNIQUE_ID:
        on_unique_id(a, &msg->u.unique_id);
        break;
    case PROTO_HEARTBEAT:
        exitq_confirm(&a->exits, msg->u.heartbeat.seq); /* the echo: and last_rx, above */
        a->beats_since_answer = 0;
        break;
    case PROTO_COMMAND:
        on_command(a, &msg->u.command);
        break;
    case PROTO_LOG_REQUEST:
        on_log_request(a, &msg->u.log_request);
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

static void daemon_bad(struct fconn *c, int err)
{
    struct agent *a = c->data;
    if (c != a->conn)
        return;
    log_warn("daemon sent a frame that does not decode (%s); skipped", proto_strerror(err));
    send_error(a, PROTO_REJECT_BAD_REQUEST, proto_strerror(err));
}

/* ---- watchdog: lease, handshake deadlines ------------------------------- */

/* Ranks that never spoke are running once their process has lived RANK_SILENT_GRACE_MS. */
static void settle_silent_ranks(struct agent *a, uint64_t now)
{
    bool news = false;
    for (uint32_t i = 0; i < a->nranks; i++) {
        struct agent_rank *r = a->ranks[i];
        if (r && r->running && !r->reaped && !r->stopping && !r->spoke &&
            r->beat.state == PROTO_RANK_STARTING && now - r->spawned_ms >= RANK_SILENT_GRACE_MS) {
            r->beat.state = PROTO_RANK_RUNNING;
            r->beat.silent = 1;
            r->beat.loss = NAN;
            news = true;
            log_info("rank %u (pid %d) is running (alive %d ms, silent: no progress reports)", r->rank, r->pid,
                     RANK_SILENT_GRACE_MS);
        }
    }
    if (news)
        on_beat_timer(&a->beat_timer);
}

static void on_tick(uv_timer_t *t)
{
    struct agent *a = t->data;
    if (a->exiting)
        return;
    uint64_t now = uv_now(a->loop);
    settle_silent_ranks(a, now);
    uint64_t silent = now - a->last_rx;
    if (a->resume_until && now >= a->resume_until) {
        log_warn("could not resume the session with the daemon at %s within heartbeat_timeout_ms (%u ms); "
                 "rejoining", a->daemon, a->heartbeat_timeout_ms);
        drop_stalled(a);
    }
    /* Several daemons: one that does not answer (stopped, or its host gone) gives way to the next soon. */
    uint64_t handshake_ms = a->daemons.n > 1 ? FOLLOW_CONNECT_MS : HANDSHAKE_TIMEOUT_MS;
    if (a->link == LINK_CONNECTING && now - a->link_since > handshake_ms) {
        a->last_connect_err = UV_ETIMEDOUT;
        fconn_close(a->conn);
        a->conn = NULL;
        try_next_addr(a);
    } else if ((a->link == LINK_HELLO || a->link == LINK_AUTH) && now - a->link_since > handshake_ms) {
        link_lost(a, "handshake timed out");
        daemon_list_next(&a->daemons);
        use_daemon(a);
    } else if (a->link == LINK_JOINED && silent >= a->lease_ms) {
        char why[160];
        snprintf(why, sizeof(why), "no frame from the daemon for %" PRIu64 " ms (lease %u ms)", silent, a->lease_ms);
        link_lost(a, why);
    } else if (a->link == LINK_JOINED && a->session && a->unanswered_since &&
               now - a->unanswered_since >= stall_ms(a)) {
        link_stalled(a, now); /* a daemon that gave no session cannot take it back: wait on TCP then */
    }
    if (a->link != LINK_JOINED && silent >= a->lease_ms && any_unstopped(a)) {
        log_error("SELF-FENCING: daemon at %s unreachable for %" PRIu64 " ms, longer than the lease (%u ms); "
                  "stopping the ranks of generation %" PRIu64,
                  a->daemon, silent, a->lease_ms, a->cur_gen);
        a->spawn_pending = false;
        stop_all(a, a->cur_gen);
    }
}

/* ---- shutdown ---------------------------------------------------------- */

static void maybe_finish(struct agent *a)
{
    if (!a->exiting || a->closed || any_running(a) || spare_running(&a->spare))
        return;
    a->closed = true;
    log_debug("no rank running; closing every handle");
    link_close(a);
    drop_stalled(a);
    if (a->gai_busy)
        uv_cancel((uv_req_t *)&a->gai);
    uv_close((uv_handle_t *)&a->retry_timer, NULL);
    uv_close((uv_handle_t *)&a->beat_timer, NULL);
    uv_close((uv_handle_t *)&a->tick_timer, NULL);
    uv_close((uv_handle_t *)&a->connect_timer, NULL);
    uv_close((uv_handle_t *)&a->stacks_timer, NULL);
    free(a->stacks);
    free(a->flights);
    ras_end(&a->ras);
    a->stacks = NULL;
    a->flights = NULL;
    agent_preflight_close(&a->pf);
    uv_close((uv_handle_t *)&a->sigterm, NULL);
    uv_close((uv_handle_t *)&a->sigint, NULL);
    release_ranks(a);
    for (struct agent_rank *r = a->all; r; r = r->next)
        rank_close(r);
    spare_close(&a->spare);
    memrep_close(&a->rep, a->mem_drop);
    if (a->mem_drop)
        memckpt_close(&a->mem); /* an agent stopped by a signal leaves it to the next one */
}

static void spare_gone(void *data)
{
    maybe_finish(data);
}

static void agent_exit(struct agent *a, int code)
{
    if (a->exiting)
        return;
    a->exiting = true;
    a->exit_code = code;
    notify_send("STOPPING=1");
    a->spawn_pending = false;
    link_close(a);
    uv_timer_stop(&a->retry_timer);
    link_set_state(a, LINK_CLOSED);
    if (any_running(a))
        log_info("stopping ranks (grace %" PRIu64 " ms)", (uint64_t)a->spec.stop_grace_ms);
    stop_all(a, a->cur_gen);
    spare_stop(&a->spare);
    maybe_finish(a);
}

static void on_signal(uv_signal_t *s, int signum)
{
    struct agent *a = s->data;
    if (!a->exiting) {
        log_info("received %s: stopping ranks and exiting", strsignal(signum));
        agent_exit(a, 0);
        return;
    }
    log_warn("received %s again: killing ranks now", strsignal(signum));
    for (struct agent_rank *r = a->all; r; r = r->next)
        rank_kill(r);
}

int agent_run(const struct agent_config *cfg)
{
    uv_loop_t loop;
    int rc = uv_loop_init(&loop);
    if (rc != 0) {
        log_error("cannot create the event loop: %s", uv_strerror(rc));
        return 1;
    }
    struct agent *a = calloc(1, sizeof(*a));
    if (!a) {
        log_error("out of memory");
        uv_loop_close(&loop);
        return 1;
    }
    a->cfg = cfg;
    if (cfg->daemons.n) {
        a->daemons = cfg->daemons;
    } else {
        a->daemons.n = 1;
        snprintf(a->daemons.addr[0], sizeof(a->daemons.addr[0]), "%s", cfg->daemon);
    }
    use_daemon(a);
    a->loop = &loop;
    a->rng = uv_hrtime() ^ ((uint64_t)getpid() << 32) ^ 0x9E3779B97F4A7C15ULL;
    a->heartbeat_interval_ms = 1000;
    a->lease_ms = 10000;
    a->heartbeat_timeout_ms = 5000;
    a->gai.data = a;
    job_spec_defaults(&a->spec);
    backoff_init(&a->backoff, BACKOFF_BASE_MS, BACKOFF_CAP_MS);
    choose_state_dir(a);
    probe_gpus(a);
    agent_preflight_init(&a->pf, &loop, on_preflight_done, a);
    spare_init(&a->spare, &loop, spare_gone, a);
    a->spare.user = &a->cfg->rank_user;
    memrep_init(&a->rep, &loop, &a->mem, cfg->node,
                &(struct memrep_link){.ctx = a, .send = rep_send, .queued = rep_queued, .fetched = rep_fetched});

    uv_timer_init(&loop, &a->retry_timer);
    uv_timer_init(&loop, &a->beat_timer);
    uv_timer_init(&loop, &a->tick_timer);
    uv_timer_init(&loop, &a->connect_timer);
    uv_timer_init(&loop, &a->stacks_timer);
    a->connect_timer.data = a->stacks_timer.data = a;
    a->ras.fd = -1; /* no RAS query (nccl_ras.h) */
    a->ras.phase = RAS_DONE;
    uv_signal_init(&loop, &a->sigterm);
    uv_signal_init(&loop, &a->sigint);
    a->retry_timer.data = a->beat_timer.data = a->tick_timer.data = a;
    a->sigterm.data = a->sigint.data = a;
    uv_signal_start(&a->sigterm, on_signal, SIGTERM);
    uv_signal_start(&a->sigint, on_signal, SIGINT);
    uv_timer_start(&a->tick_timer, on_tick, TICK_MS, TICK_MS);
    a->last_rx = uv_now(&loop);

    link_set_state(a, LINK_IDLE);
    log_info("muster-worker %s: node %s, %u %s device(s), daemon %s", MUSTER_VERSION, cfg->node, cfg->devices.n,
             cfg->devices.kind == PROTO_DEV_GPU ? "gpu" : "cpu", cfg->daemon);
    uv_timer_start(&a->retry_timer, on_retry_timer, 0, 0);

    uv_run(&loop, UV_RUN_DEFAULT);

    if (a->have_assign)
        json_decref(a->assign.job);
    int code = a->exit_code;
    free(a);
    rc = uv_loop_close(&loop);
    if (rc != 0) {
        log_error("internal: event loop closed with handles still open: %s", uv_strerror(rc));
        return 1;
    }
    return code;
}
