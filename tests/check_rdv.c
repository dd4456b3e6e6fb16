/*
 * The rendezvous/heartbeat state machine, driven by a fake clock and ops
 * that record what rdv sends; no sockets.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cmdline.h"
#include "common/log.h"
#include "daemon/failure.h"
#include "daemon/rdv_internal.h"
#include "daemon/restdoc.h"
#include "daemon/state.h"
#include "daemon/view_build.h"

#define MAX_SENT 256

struct sent {
    char node[PROTO_NAME_MAX];
    struct proto_msg msg;
};

struct rec {
    struct sent sent[MAX_SENT];
    int nsent;
    char disconnected[8][PROTO_NAME_MAX];
    int ndisconnected;
    int persists;
    int changes; /* calls of ops.changed */
};

static struct rec rec;
static struct rdv rdv;
static struct job_spec spec;
static uint64_t now;
/* Test nodes report no free port for MASTER_PORT while set. */
static int no_port;
/* restart_window_s for the next setup_spec (then back to 0). */
static int spec_window;
/* A test of thousands of nodes counts the messages past MAX_SENT without keeping them. */
static int rec_overflow, rec_dropped;

static void rec_send(void *ctx, const char *node, const struct proto_msg *m)
{
    if (rec_overflow && rec.nsent == MAX_SENT - 1) { /* the last entry holds the last reject code */
        rec_dropped++;
        return;
    }
    ck_assert_int_lt(rec.nsent, MAX_SENT);
    struct sent *s = &rec.sent[rec.nsent++];
    snprintf(s->node, sizeof(s->node), "%s", node);
    /* the part in use: a heartbeat's unused rank entries are most of a message */
    memcpy(&s->msg, m, m->type == PROTO_HEARTBEAT ? offsetof(struct proto_msg, u.heartbeat.ranks) +
                                                         m->u.heartbeat.nranks * sizeof(m->u.heartbeat.ranks[0])
                                                   : sizeof(*m));
    if (m->type == PROTO_ASSIGN)
        s->msg.u.assign.job = NULL; /* not owned by the record */
}

static void rec_disconnect(void *ctx, const char *node, const char *why)
{
    snprintf(rec.disconnected[rec.ndisconnected++ % 8], PROTO_NAME_MAX, "%s", node);
}

static void rec_changed(void *ctx, int persist)
{
    rec.persists += persist;
    rec.changes++;
}

/* What beat() says of every rank besides its state and step: that it
 * rejoins in place, that it left its generation for a grow. */
static int beat_rejoin, beat_yielded;

static void setup_spec(int nodes, int max_restarts)
{
    rec.nsent = rec.ndisconnected = rec.persists = 0; /* a message is written whole before it is read */
    no_port = 0;
    rec_overflow = rec_dropped = 0;
    beat_rejoin = beat_yielded = 0;
    job_spec_defaults(&spec);
    snprintf(spec.name, sizeof(spec.name), "t");
    spec.nodes = nodes;
    spec.max_restarts = max_restarts;
    spec.restart_window_s = spec_window;
    spec_window = 0;
    now = 1000;
    json_t *job = json_pack("{s:s, s:i}", "name", "t", "nodes", nodes);
    struct rdv_ops ops = {.ctx = NULL, .send = rec_send, .disconnect = rec_disconnect, .changed = rec_changed};
    ck_assert_int_eq(rdv_init(&rdv, &spec, job, &ops, now), 0);
    json_decref(job);
}

static void teardown(void) { rdv_free(&rdv); }

/* The port node name reports free for MASTER_PORT: as an agent does, never
 * the current generation's (which one of its ranks may hold). */
static uint32_t node_port(const char *name)
{
    uint32_t port = 29500u + 2u * (uint32_t)(name[0] - 'a');
    return no_port ? 0 : port == rdv.master_port ? port + 1 : port;
}

/* A HELLO of node name with ndev devices 0..ndev-1. */
static void hello_of(struct proto_hello *h, const char *name, uint32_t ndev, uint64_t generation)
{
    memset(h, 0, sizeof(*h));
    snprintf(h->node, sizeof(h->node), "%s", name);
    snprintf(h->addr, sizeof(h->addr), "127.0.0.1");
    h->ndevices = ndev;
    for (uint32_t i = 0; i < ndev; i++)
        h->devices[i] = i;
    h->generation = generation;
    h->free_port = node_port(name);
}

/* An agent's HELLO; session 0 = none (a first join). */
static int join_session(const char *name, uint32_t ndev, uint64_t generation, uint64_t session)
{
    struct proto_hello h;
    char code[32], reason[PROTO_REASON_MAX];
    hello_of(&h, name, ndev, generation);
    h.session = session;
    int rc = rdv_join(&rdv, &h, now, code, reason);
    if (rc != 0)
        snprintf(rec.sent[MAX_SENT - 1].node, PROTO_NAME_MAX, "%s", code); /* last reject code */
    return rc;
}

static int join(const char *name, uint32_t ndev, uint64_t generation) { return join_session(name, ndev, generation, 0); }

static const char *last_reject_code(void) { return rec.sent[MAX_SENT - 1].node; }

/* The i-th message of a type sent to node since index from; NULL if none. */
static const struct proto_msg *find_sent(int from, const char *node, enum proto_type type)
{
    for (int i = from; i < rec.nsent; i++)
        if (strcmp(rec.sent[i].node, node) == 0 && rec.sent[i].msg.type == type)
            return &rec.sent[i].msg;
    return NULL;
}

/* A heartbeat with n zeroed rank entries, reused: zeroing a whole message
 * (room for 64 entries) for every beat would be most of a long test's time. */
static struct proto_msg *heartbeat_msg(uint32_t n)
{
    static struct proto_msg m;
    memset(&m, 0, offsetof(struct proto_msg, u.heartbeat.ranks) + n * sizeof(m.u.heartbeat.ranks[0]));
    m.type = PROTO_HEARTBEAT;
    m.u.heartbeat.nranks = n;
    return &m;
}

static void beat(const char *node, uint64_t generation, uint32_t first, uint32_t n, enum proto_rank_state st,
                 uint64_t step)
{
    struct proto_msg *m = heartbeat_msg(n);
    m->u.heartbeat.generation = generation;
    m->u.heartbeat.seq = now;
    m->u.heartbeat.free_port = node_port(node);
    for (uint32_t i = 0; i < n; i++) {
        m->u.heartbeat.ranks[i].rank = first + i;
        m->u.heartbeat.ranks[i].state = st;
        m->u.heartbeat.ranks[i].step = step;
        m->u.heartbeat.ranks[i].loss = 2.5;
        m->u.heartbeat.ranks[i].rejoin = beat_rejoin;
        m->u.heartbeat.ranks[i].yielded = beat_yielded;
    }
    rdv_message(&rdv, node, m, now);
}

static void rank_exit_said(const char *node, uint64_t generation, uint32_t rank, int code, int sig,
                           const char *reason, const char *detail)
{
    static struct proto_msg m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_RANK_EXIT;
    m.u.rank_exit.generation = generation;
    m.u.rank_exit.rank = rank;
    m.u.rank_exit.exit_code = code;
    m.u.rank_exit.signal = sig;
    snprintf(m.u.rank_exit.reason, sizeof(m.u.rank_exit.reason), "%s", reason);
    snprintf(m.u.rank_exit.detail, sizeof(m.u.rank_exit.detail), "%s", detail);
    rdv_message(&rdv, node, &m, now);
}

static void rank_exit(const char *node, uint64_t generation, uint32_t rank, int code, int sig)
{
    struct proto_msg m = {.type = PROTO_RANK_EXIT};
    m.u.rank_exit.generation = generation;
    m.u.rank_exit.rank = rank;
    m.u.rank_exit.exit_code = code;
    m.u.rank_exit.signal = sig;
    rdv_message(&rdv, node, &m, now);
}

/* What a REST client sees: /v1/status, with the "ranks" and "nodes" lists of
 * /v1/ranks and /v1/nodes, rendered from a snapshot view of rdv at time at. */
static json_t *rest_status(uint64_t at)
{
    struct snap_view *v = view_build(&rdv, at, strdup("{\"events\":[]}"), strdup("{}"));
    ck_assert_ptr_nonnull(v);
    size_t len;
    json_t *st = json_loads(restdoc_get(v, SNAP_DOC_STATUS, &len), 0, NULL);
    json_t *ranks = json_loads(restdoc_get(v, SNAP_DOC_RANKS, &len), 0, NULL);
    json_t *nodes = json_loads(restdoc_get(v, SNAP_DOC_NODES, &len), 0, NULL);
    ck_assert_msg(json_is_object(st) && json_is_object(ranks) && json_is_object(nodes), "documents are not JSON");
    json_object_set(st, "ranks", json_object_get(ranks, "ranks"));
    json_object_set(st, "nodes", json_object_get(nodes, "nodes"));
    json_decref(ranks);
    json_decref(nodes);
    snap_view_unref(v);
    return st;
}

/* The session of the last WELCOME sent to node. */
static uint64_t session_of(const char *node)
{
    for (int i = rec.nsent - 1; i >= 0; i--)
        if (strcmp(rec.sent[i].node, node) == 0 && rec.sent[i].msg.type == PROTO_WELCOME)
            return rec.sent[i].msg.u.welcome.session;
    return 0;
}

static int has_event(const char *kind)
{
    for (uint64_t i = 0; i < rdv.nevents && i < RDV_EVENTS; i++)
        if (strcmp(rdv.events[i].kind, kind) == 0)
            return 1;
    return 0;
}

/* Two nodes of two ranks each, generation 1 running. */
/* Node's agent answers COMMAND stacks for ranks first..first+n-1: a dump, or why there is none. */
static void answer_stacks(const char *node, uint64_t generation, uint32_t first, uint32_t n, const char *error)
{
    static struct proto_msg m;
    for (uint32_t i = 0; i < n; i++) {
        memset(&m, 0, sizeof(m));
        m.type = PROTO_STACKS;
        m.u.stacks.generation = generation;
        m.u.stacks.rank = first + i;
        if (error) {
            snprintf(m.u.stacks.error, sizeof(m.u.stacks.error), "%s", error);
        } else {
            m.u.stacks.pid = 1000 + first + i;
            m.u.stacks.text = "process 1000:\n  File \"train.py\", line 88 in compute_loss\n";
        }
        rdv_message(&rdv, node, &m, now);
    }
}

/* A hang found waits for its ranks' stacks (none answer here): its window runs out. */
static void settle_hang(void)
{
    ck_assert_msg(rdv.hang_pending, "no hang pending (state %d, generation %llu)", rdv.state,
                  (unsigned long long)rdv.generation);
    now += HANG_STACKS_WAIT_MS;
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.hang_pending, 0);
}

static void form_running(int max_restarts)
{
    setup_spec(2, max_restarts);
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(join("a", 2, 0), 0);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
}

START_TEST(forms_generation_one_in_name_order)
{
    setup_spec(2, 3);
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(rdv.state, RDV_WAITING);
    ck_assert_int_eq(rdv.generation, 0);
    ck_assert_ptr_nonnull(find_sent(0, "b", PROTO_WELCOME));
    ck_assert_ptr_null(find_sent(0, "b", PROTO_ASSIGN));
    ck_assert_int_eq(join("a", 2, 0), 0);
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    ck_assert_int_eq(rdv.generation, 1);
    ck_assert_int_eq(rdv.world_size, 4);
    const struct proto_msg *ma = find_sent(0, "a", PROTO_ASSIGN), *mb = find_sent(0, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(ma);
    ck_assert_ptr_nonnull(mb);
    ck_assert_int_eq(ma->u.assign.generation, 1);
    ck_assert_int_eq(ma->u.assign.world_size, 4);
    ck_assert_int_eq(ma->u.assign.nranks, 2);
    ck_assert_int_eq(ma->u.assign.ranks[0].rank, 0); /* "a" sorts first though it joined second */
    ck_assert_int_eq(ma->u.assign.ranks[1].rank, 1);
    ck_assert_int_eq(ma->u.assign.ranks[1].local_rank, 1);
    ck_assert_int_eq(mb->u.assign.ranks[0].rank, 2);
    ck_assert_int_eq(mb->u.assign.ranks[1].rank, 3);
    ck_assert_int_eq(mb->u.assign.ranks[1].device, 1);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_gt(rec.persists, 0);
}
END_TEST

START_TEST(unique_id_from_rank0_reaches_every_node)
{
    form_running(3);
    int mark = rec.nsent;
    struct proto_msg m = {.type = PROTO_UNIQUE_ID};
    m.u.unique_id.generation = 1;
    memset(m.u.unique_id.id, 0xab, PROTO_UID_LEN);
    rdv_message(&rdv, "a", &m, now);
    const struct proto_msg *ua = find_sent(mark, "a", PROTO_UNIQUE_ID), *ub = find_sent(mark, "b", PROTO_UNIQUE_ID);
    ck_assert_ptr_nonnull(ua);
    ck_assert_ptr_nonnull(ub);
    ck_assert_int_eq(ub->u.unique_id.generation, 1);
    ck_assert_int_eq(ub->u.unique_id.id[127], 0xab);
    /* Only the node holding rank 0 may provide it. */
    mark = rec.nsent;
    rdv_message(&rdv, "b", &m, now);
    const struct proto_msg *e = find_sent(mark, "b", PROTO_ERROR);
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->u.error.code, "not_rank0");
    ck_assert_ptr_null(find_sent(mark, "a", PROTO_UNIQUE_ID));
}
END_TEST

/* A rank 0 that sends its unique id again and again: the first is sent on,
 * the rest are counted, not sent on, not events; the next generation takes one. */
START_TEST(unique_id_taken_once_per_generation)
{
    form_running(3);
    struct proto_msg m = {.type = PROTO_UNIQUE_ID};
    m.u.unique_id.generation = 1;
    memset(m.u.unique_id.id, 0xab, PROTO_UID_LEN);
    rdv_message(&rdv, "a", &m, now);
    uint64_t events = rdv.nevents;
    int mark = rec.nsent, changes = rec.changes;
    memset(m.u.unique_id.id, 0xcd, PROTO_UID_LEN);
    /* stderr into a file meanwhile: one line for the repeats, then one with the count held back */
    fflush(stderr);
    FILE *cap = tmpfile();
    ck_assert_ptr_nonnull(cap);
    int saved = dup(STDERR_FILENO);
    dup2(fileno(cap), STDERR_FILENO);
    for (int i = 0; i < 999; i++)
        rdv_message(&rdv, "a", &m, now);
    rdv_message(&rdv, "a", &m, now + RATELIMIT_PEER_MS);
    fflush(stderr);
    dup2(saved, STDERR_FILENO);
    close(saved);
    char text[4096];
    rewind(cap);
    size_t n = fread(text, 1, sizeof(text) - 1, cap);
    text[n] = '\0';
    fclose(cap);
    int lines = 0;
    for (const char *p = text; (p = strstr(p, "again: ignored")) != NULL; p++)
        lines++;
    ck_assert_msg(lines == 2, "%d lines about the repeats:\n%s", lines, text);
    ck_assert_msg(strstr(text, "(998 more like it held back)") != NULL, "no count held back in:\n%s", text);
    ck_assert_int_eq(rec.nsent, mark);
    ck_assert_uint_eq(rdv.nevents, events);
    ck_assert_int_eq(rec.changes, changes);
    ck_assert_uint_eq(rdv.repeated_unique_ids, 1000);
    ck_assert_int_eq(rdv.uid.id[0], 0xab);
    json_t *st = rdv_summary_json(&rdv, now);
    ck_assert_int_eq(json_integer_value(json_object_get(st, "repeated_unique_ids")), 1000);
    json_decref(st);

    rank_exit("b", 1, 2, 1, 0);
    ck_assert_int_eq(rdv.generation, 2);
    mark = rec.nsent;
    m.u.unique_id.generation = 2;
    rdv_message(&rdv, "a", &m, now);
    const struct proto_msg *ub = find_sent(mark, "b", PROTO_UNIQUE_ID);
    ck_assert_ptr_nonnull(ub);
    ck_assert_int_eq(ub->u.unique_id.id[0], 0xcd);
    ck_assert_uint_eq(rdv.repeated_unique_ids, 1000);
}
END_TEST

START_TEST(crashed_rank_opens_next_generation)
{
    form_running(3);
    int mark = rec.nsent;
    rank_exit("b", 1, 3, -1, 9);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "rank 3 on node b was killed by signal 9 (SIGKILL)"));
    /* A failure parks the ranks (those that cannot rejoin in place stop). */
    const struct proto_msg *park = find_sent(mark, "a", PROTO_COMMAND);
    ck_assert_ptr_nonnull(park);
    ck_assert_int_eq(park->u.command.action, PROTO_CMD_PARK);
    ck_assert_int_eq(park->u.command.generation, 2);
    const struct proto_msg *as = find_sent(mark, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.generation, 2);
    ck_assert_int_eq(as->u.assign.ranks[0].rank, 2); /* same block */
    /* Heartbeats of the old generation do not count. */
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 5);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 5);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
}
END_TEST

START_TEST(stale_frames_are_refused)
{
    form_running(3);
    rank_exit("a", 1, 0, 1, 0);
    ck_assert_int_eq(rdv.generation, 2);
    /* A late exit of generation 1 must not cost another restart. */
    rank_exit("b", 1, 2, -1, 15);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_int_ge(rdv.stale_frames, 1);
    int mark = rec.nsent;
    struct proto_msg m = {.type = PROTO_UNIQUE_ID};
    m.u.unique_id.generation = 1;
    rdv_message(&rdv, "a", &m, now);
    const struct proto_msg *e = find_sent(mark, "a", PROTO_ERROR);
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->u.error.code, "stale_generation");
    ck_assert_ptr_null(find_sent(mark, "b", PROTO_UNIQUE_ID));
}
END_TEST

START_TEST(missed_heartbeats_lose_the_node_until_it_rejoins)
{
    form_running(3);
    now += 3000;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 10);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    now += 2500; /* b silent 5.5 s > 5 s; a silent 2.5 s */
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rec.ndisconnected, 1);
    ck_assert_str_eq(rec.disconnected[0], "b");
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "waiting for b to rejoin"));
    int mark = rec.nsent;
    ck_assert_ptr_null(find_sent(mark, "a", PROTO_ASSIGN));
    ck_assert_int_eq(join("b", 2, 1), 0);
    const struct proto_msg *as = find_sent(mark, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.ranks[0].rank, 2);
    ck_assert_int_eq(as->u.assign.generation, 2);
    ck_assert_ptr_nonnull(find_sent(mark, "a", PROTO_ASSIGN));
}
END_TEST

/* musterd starved: its tick comes 4 s late, but a's heartbeat was read
 * just before it (the sockets ran, the timer did not). The pause moves b's
 * silence on, and never a's last frame past now, which once made
 * now - last_seen wrap ("no heartbeat for 18446744073709552.0 s") and lost
 * the node that had just been heard. */
START_TEST(a_pause_never_loses_a_node_just_heard)
{
    form_running(3);
    now += 1000;
    rdv_tick(&rdv, now);
    now += 4000;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 10);
    rdv_paused(&rdv, 4000, now);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rec.ndisconnected, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    now += 100;
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rec.ndisconnected, 0);
    now += 4000; /* b: 1 s heard before the pause + 4.1 s after it > 5 s; a: 4.1 s */
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rec.ndisconnected, 1);
    ck_assert_str_eq(rec.disconnected[0], "b");
}
END_TEST

/* Any frame from a node counts as hearing from it: a node whose log pieces
 * come while its heartbeats are late is not lost. */
START_TEST(log_data_counts_as_hearing_from_the_node)
{
    form_running(3);
    now += 3000;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 10);
    struct proto_msg m = {.type = PROTO_LOG_DATA};
    rdv_message(&rdv, "b", &m, now);
    rdv_tick(&rdv, now);
    now += 2500; /* b's last heartbeat 5.5 s ago, its last log piece 2.5 s */
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 11);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rec.ndisconnected, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    now += 2600;
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rec.ndisconnected, 1);
    ck_assert_str_eq(rec.disconnected[0], "b");
}
END_TEST

START_TEST(closed_connection_is_lost_at_once)
{
    form_running(3);
    rdv_disconnected(&rdv, "a", "connection closed", now);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_int_eq(rdv.nodes[0].state == RDV_NODE_LOST || rdv.nodes[1].state == RDV_NODE_LOST, 1);
    ck_assert_int_eq(rdv.restarts, 1);
}
END_TEST

START_TEST(budget_spent_fails_the_job)
{
    form_running(1);
    rank_exit("a", 1, 1, 3, 0);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 0);
    rank_exit("a", 2, 1, 3, 0);
    ck_assert_int_eq(rdv.state, RDV_FAILED);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "rank 1 on node a exited with status 3"));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "max_restarts=1"));
    ck_assert_int_eq(rdv_terminal(&rdv), 1);
}
END_TEST

START_TEST(exit_zero_everywhere_completes)
{
    form_running(3);
    for (uint32_t r = 0; r < 4; r++) {
        ck_assert_int_eq(rdv.state, RDV_RUNNING);
        rank_exit(r < 2 ? "a" : "b", 1, r, 0, 0);
    }
    ck_assert_int_eq(rdv.state, RDV_COMPLETED);
    ck_assert_int_eq(rdv.restarts, 0);
}
END_TEST

START_TEST(joins_refused_with_reasons)
{
    form_running(3);
    ck_assert_int_eq(join("c", 2, 0), -1);
    ck_assert_str_eq(last_reject_code(), "full");
    ck_assert_int_eq(join("a", 2, 1), -1);
    ck_assert_str_eq(last_reject_code(), "duplicate");
    rdv_disconnected(&rdv, "a", "gone", now);
    ck_assert_int_eq(join("a", 3, 1), -1);
    ck_assert_str_eq(last_reject_code(), "bad_request");
    ck_assert_int_eq(join("a", 2, 1), 0);
}
END_TEST

START_TEST(restored_job_resumes_without_a_new_generation)
{
    form_running(3);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    ck_assert_int_eq(saved.nmembers, 2);
    rdv_free(&rdv);

    setup_spec(2, 3);
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_int_eq(rdv.generation, 1);
    ck_assert_int_eq(join("a", 2, 1), 0);
    ck_assert_int_eq(join("b", 2, 1), 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_eq(rdv.generation, 1);
    ck_assert_ptr_null(find_sent(0, "a", PROTO_ASSIGN));
}
END_TEST

START_TEST(restored_job_restarts_when_ranks_are_gone)
{
    form_running(3);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    rdv_free(&rdv);
    setup_spec(2, 3);
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(join("a", 2, 1), 0);
    ck_assert_int_eq(join("b", 2, 0), 0); /* fenced its ranks meanwhile */
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_ptr_nonnull(find_sent(0, "a", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(find_sent(0, "b", PROTO_ASSIGN));
}
END_TEST

START_TEST(restart_during_recovery_spends_nothing_more)
{
    form_running(3);
    rank_exit("a", 1, 0, 1, 0);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    rdv_free(&rdv);
    setup_spec(2, 3);
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(join("a", 2, 0), 0); /* ranks stopped meanwhile */
    ck_assert_int_eq(join("b", 2, 2), 0);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    const struct proto_msg *as = find_sent(0, "a", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.generation, 2);
}
END_TEST

static int has_event_with(const char *kind, const char *text);
/* musterd restarted during a recovery (generation 2 opened, not yet
 * running): rank 0's agent is back first and sends the generation's id
 * (0xcd...) at once; m is that UNIQUE_ID. */
static void rank0_back_first_in_a_restored_recovery(struct proto_msg *m)
{
    form_running(3);
    rank_exit("b", 1, 3, 0, 9);
    ck_assert_int_eq(rdv.generation, 2);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    rdv_free(&rdv);
    setup_spec(2, 3);
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(join("a", 2, 2), 0);
    *m = (struct proto_msg){.type = PROTO_UNIQUE_ID};
    m->u.unique_id.generation = 2;
    memset(m->u.unique_id.id, 0xcd, PROTO_UID_LEN);
    rdv_message(&rdv, "a", m, now);
}

/* b, back later, is assigned the generation again and must get that id
 * too, after its ASSIGN (heal_in_place 6: b's ranks waited 120 s for it). */
START_TEST(restored_recovery_gives_an_early_id_to_members_back_later)
{
    struct proto_msg m;
    rank0_back_first_in_a_restored_recovery(&m);
    ck_assert(has_event_with("unique_id", "sent to 1 of 2 nodes"));
    int mark = rec.nsent;
    ck_assert_int_eq(join("b", 2, 2), 0);
    ck_assert_int_eq(rdv.generation, 2);
    int assign = -1, uid = -1;
    for (int i = mark; i < rec.nsent; i++) {
        if (strcmp(rec.sent[i].node, "b") != 0)
            continue;
        if (rec.sent[i].msg.type == PROTO_ASSIGN && assign < 0)
            assign = i;
        if (rec.sent[i].msg.type == PROTO_UNIQUE_ID && uid < 0)
            uid = i;
    }
    ck_assert_int_ge(assign, 0);
    ck_assert_msg(uid > assign, "b's unique id at %d, its ASSIGN at %d", uid, assign);
    ck_assert_int_eq(rec.sent[uid].msg.u.unique_id.generation, 2);
    ck_assert_int_eq(rec.sent[uid].msg.u.unique_id.id[0], 0xcd);
}
END_TEST

/* The same restored recovery, but rank 0's agent, having sent its id, is
 * restarted (its ranks gone) and back with none before b: generation 2 is
 * still unassigned, so it is assigned again in place, rank 0 a new process
 * with a new id. The id kept from the old rank 0 must not reach the members,
 * and the new one must not be refused as a repeat. */
START_TEST(restored_recovery_drops_the_id_of_a_rank0_gone_since)
{
    struct proto_msg m;
    rank0_back_first_in_a_restored_recovery(&m);
    /* a's agent restarts: its old ranks (and their id) are gone */
    rdv_disconnected(&rdv, "a", "connection closed", now);
    ck_assert_int_eq(join("a", 2, 0), 0);
    int mark = rec.nsent;
    ck_assert_int_eq(join("b", 2, 2), 0);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_msg(find_sent(mark, "a", PROTO_ASSIGN) != NULL, "a was not assigned generation 2 again");
    for (int i = mark; i < rec.nsent; i++)
        if (rec.sent[i].msg.type == PROTO_UNIQUE_ID)
            ck_assert_msg(rec.sent[i].msg.u.unique_id.id[0] != 0xcd,
                          "%s got the id of generation 2 made by a rank 0 that is gone", rec.sent[i].node);
    /* the new rank 0 sends its own id: it must go to the members */
    mark = rec.nsent;
    memset(m.u.unique_id.id, 0xee, PROTO_UID_LEN);
    rdv_message(&rdv, "a", &m, now);
    const struct proto_msg *u = find_sent(mark, "b", PROTO_UNIQUE_ID);
    ck_assert_msg(u != NULL, "the new rank 0's id was refused as a repeat: b never gets it");
    ck_assert_int_eq(u->u.unique_id.id[0], 0xee);
}
END_TEST

/* Generation 1 assigned on a (ranks 0, 1) and b (2, 3), rank 3 still
 * starting, when musterd restarts: a new rdv restored from what the old one
 * saved, start_timeout_ms 1 s. */
static void restore_forming(void)
{
    setup_spec(2, 3);
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(join("a", 2, 0), 0);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 2, 1, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 3, 1, PROTO_RANK_STARTING, 0);
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    ck_assert_int_eq(saved.state, RDV_FORMING);
    rdv_free(&rdv);
    setup_spec(2, 3);
    spec.start_timeout_ms = 1000;
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
}

START_TEST(restored_forming_generation_waits_for_its_ranks)
{
    restore_forming();
    now += 200;
    ck_assert_int_eq(join("a", 2, 1), 0);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(join("b", 2, 1), 0);
    /* Every member is back, but rank 3 has not said it runs: not running yet. */
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    ck_assert(has_event("generation_resumed"));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "waiting for its ranks to report running"));
    beat("b", 1, 2, 1, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 3, 1, PROTO_RANK_STARTING, 0);
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    ck_assert(!has_event("generation_running"));
    now += 300;
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert(has_event("generation_running"));
    ck_assert_str_eq(rdv.reason, "");
    ck_assert_int_eq(rdv.generation, 1);
    ck_assert_int_eq(rdv.restarts, 0);
    ck_assert_ptr_null(find_sent(0, "a", PROTO_ASSIGN));
    ck_assert_ptr_null(find_sent(0, "b", PROTO_ASSIGN));
}
END_TEST

START_TEST(restored_forming_rank_that_never_starts_fails_after_start_timeout)
{
    restore_forming();
    now += 800;
    ck_assert_int_eq(join("a", 2, 1), 0);
    ck_assert_int_eq(join("b", 2, 1), 0);
    /* start_timeout_ms counts from the moment every member was back, not from the restore. */
    now += 900;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 2, 1, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 3, 1, PROTO_RANK_STARTING, 0);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.generation, 1);
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    now += 200;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 2, 1, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 3, 1, PROTO_RANK_STARTING, 0);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "rank 3 on node b did not start within 1.0 s"));
}
END_TEST

/* A member whose agent comes back (on its session) without its ranks while
 * the restored generation forms: that generation's ASSIGN went out before the
 * restart and its MASTER_PORT is not known, so it has failed. */
START_TEST(restored_forming_member_back_without_ranks_fails_the_generation)
{
    restore_forming();
    ck_assert_int_eq(join("a", 2, 1), 0);
    ck_assert_int_eq(join("b", 2, 1), 0);
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    int mark = rec.nsent;
    ck_assert_int_eq(join_session("b", 2, 0, session_of("b")), 0);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "node b came back without its ranks of generation 1"));
    const struct proto_msg *as = find_sent(mark, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.generation, 2);
    ck_assert_uint_ne(as->u.assign.master_port, 0);
}
END_TEST

/* A running generation resumes running at once; while its members come back
 * the state file keeps it as running, so another restart meanwhile resumes
 * it alike. */
START_TEST(restored_running_generation_runs_at_once_across_two_restarts)
{
    form_running(3);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    rdv_free(&rdv);
    setup_spec(2, 3);
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(join("a", 2, 1), 0);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 5);
    rdv_save(&rdv, &saved); /* what a persisting change (a checkpoint, say) writes now */
    ck_assert_int_eq(saved.state, RDV_RUNNING);
    rdv_free(&rdv);

    setup_spec(2, 3);
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(join("a", 2, 1), 0);
    ck_assert_int_eq(join("b", 2, 1), 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert(has_event("generation_resumed"));
    ck_assert(!has_event("generation_running"));
    ck_assert_int_eq(rdv.generation, 1);
    ck_assert_int_eq(rdv.restarts, 0);
    ck_assert_ptr_null(find_sent(0, "a", PROTO_ASSIGN));
}
END_TEST

/* Generation 1 of a and b (min_nodes 1, batch 8): b is lost, a's ranks
 * join generation 2, b stays away past rejoin_timeout_ms, and generation 3
 * opens for a's two ranks alone. */
static void shrink_to_a(void)
{
    form_running(3);
    spec.min_nodes = 1;
    spec.rejoin_timeout_ms = 1000;
    spec.batch = 8;
    rdv_disconnected(&rdv, "b", "connection closed", now);
    now += 2000;
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 0);
    rdv_tick(&rdv, now);
}

/* A node that is no member joining a shrunk job while musterd waits for the
 * members after a restart: no failure; the job grows by it once it resumes. */
START_TEST(restored_shrunk_job_grows_by_a_node_that_joined_meanwhile)
{
    shrink_to_a();
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_eq(rdv.generation, 3);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    rdv_free(&rdv);

    setup_spec(2, 3);
    spec.min_nodes = 1;
    spec.batch = 8;
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(join("c", 2, 0), 0);
    ck_assert_int_eq(rdv.generation, 3);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_int_eq(join("a", 2, 3), 0);
    ck_assert(has_event("generation_resumed"));
    ck_assert_int_eq(rdv.generation, 4);
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "node c joined: growing"));
}
END_TEST

/* An administrator stops a restored job while musterd awaits its members: it
 * stays stopped, in the state file too, and the members coming back do not
 * bring the generation back. */
START_TEST(restored_job_stopped_while_members_are_awaited_stays_stopped)
{
    restore_forming();
    ck_assert_int_eq(join("a", 2, 1), 0);
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_STOP, NULL, now), 0);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    ck_assert_int_eq(saved.state, RDV_STOPPED);
    ck_assert_int_eq(join("b", 2, 1), 0);
    ck_assert_int_eq(rdv.state, RDV_STOPPED);
    now += 60000;
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.state, RDV_STOPPED);
    rdv_save(&rdv, &saved);
    ck_assert_int_eq(saved.state, RDV_STOPPED);
}
END_TEST

/* Every rank of a restored running generation finishes while a member that
 * had rejoined is away again: the job is completed, and saved as such. */
START_TEST(restored_job_completed_while_a_member_is_away_is_saved_completed)
{
    form_running(3);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    rdv_free(&rdv);
    setup_spec(2, 3);
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(join("a", 2, 1), 0);
    rank_exit("a", 1, 0, 0, 0);
    rank_exit("a", 1, 1, 0, 0);
    rdv_disconnected(&rdv, "a", "connection closed", now);
    ck_assert_int_eq(join("b", 2, 1), 0);
    rank_exit("b", 1, 2, 0, 0);
    rank_exit("b", 1, 3, 0, 0);
    ck_assert_int_eq(rdv.state, RDV_COMPLETED);
    rdv_save(&rdv, &saved);
    ck_assert_int_eq(saved.state, RDV_COMPLETED);
    ck_assert_int_eq(join("a", 2, 1), 0);
    ck_assert_int_eq(rdv.state, RDV_COMPLETED);
}
END_TEST

/* A state file as musterd has always written it (version 1): its "state"
 * says whether the generation had reached running, and nothing more is
 * needed. A forming one waits for its ranks once the members are back; a
 * running one runs at once. */
START_TEST(state_file_says_whether_the_generation_ran)
{
    static const char *const states[] = {"forming", "running"};
    for (int i = 0; i < 2; i++) {
        char dir[64], path[128];
        snprintf(dir, sizeof(dir), "/tmp/check-rdv.XXXXXX");
        ck_assert_ptr_nonnull(mkdtemp(dir));
        snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE_NAME);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fprintf(f, "{\"version\": 1, \"job\": \"t\", \"state\": \"%s\", \"reason\": \"\", \"generation\": 1, "
                   "\"restarts\": 0, \"world_size\": 4, \"last_checkpoint_step\": -1, \"members\": ["
                   "{\"name\": \"a\", \"first_rank\": 0, \"ndevices\": 2}, "
                   "{\"name\": \"b\", \"first_rank\": 2, \"ndevices\": 2}]}\n", states[i]);
        fclose(f);
        static struct rdv_saved saved;
        char err[512];
        int rc = state_read(dir, &saved, err, sizeof(err));
        unlink(path);
        rmdir(dir);
        ck_assert_msg(rc == 0, "%s", err);

        setup_spec(2, 3);
        ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
        ck_assert_int_eq(join("a", 2, 1), 0);
        ck_assert_int_eq(join("b", 2, 1), 0);
        ck_assert_int_eq(rdv.state, i == 0 ? RDV_FORMING : RDV_RUNNING);
        beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 0);
        beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 0);
        ck_assert_int_eq(rdv.state, RDV_RUNNING);
        ck_assert_int_eq(has_event("generation_running"), i == 0);
        ck_assert_int_eq(rdv.generation, 1);
        rdv_free(&rdv);
    }
    setup_spec(2, 3); /* for the teardown */
}
END_TEST

START_TEST(ended_job_settles_rank_states)
{
    form_running(3);
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_STOP, NULL, now), 0);
    ck_assert_int_eq(rdv.ranks[0].state, RDV_RANK_STOPPING);
    rank_exit("a", 1, 0, 0, 15);
    ck_assert_int_eq(rdv.ranks[0].state, RDV_RANK_EXITED);
    ck_assert_int_eq(rdv.state, RDV_STOPPED);
    ck_assert_int_eq(rdv.restarts, 0);
    json_t *st = rest_status(now);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(st, "ranks"), 1), "state")),
                     "stopping");
    /* The ended job keeps its last step and loss. */
    ck_assert_int_eq(json_integer_value(json_object_get(st, "step")), 1);
    ck_assert_double_eq_tol(json_real_value(json_object_get(st, "loss")), 2.5, 1e-12);
    json_decref(st);
}
END_TEST

START_TEST(absent_member_shrinks_the_job_to_min_nodes)
{
    form_running(3);
    spec.min_nodes = 1;
    spec.rejoin_timeout_ms = 10000;
    spec.batch = 8;
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_int_eq(rdv.generation, 2);
    for (int i = 0; i < 9; i++) { /* a stays alive; nothing can be assigned without b */
        now += 1000;
        beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 0);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_int_eq(rdv.generation, 2);
    int mark = rec.nsent;
    now += 2000;
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 0);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.generation, 3);
    ck_assert_int_eq(rdv.world_size, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "shrinking from 4 to 2 ranks on 1 nodes"));
    const struct proto_msg *as = find_sent(mark, "a", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.world_size, 2);
    ck_assert_int_eq(as->u.assign.generation, 3);
    ck_assert_int_eq(as->u.assign.ranks[1].rank, 1);
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);

    /* b comes back: the job grows to its wanted size in generation 4, the
     * ranks are parked (not stopped: they rejoin in place), no restart spent. */
    mark = rec.nsent;
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(rdv.generation, 4);
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "node b joined: growing from 2 to 4 ranks on 2 nodes"));
    const struct proto_msg *park = find_sent(mark, "a", PROTO_COMMAND);
    ck_assert_ptr_nonnull(park);
    ck_assert_int_eq(park->u.command.action, PROTO_CMD_PARK);
    as = find_sent(mark, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.world_size, 4);
    ck_assert_int_eq(as->u.assign.ranks[0].rank, 2);
    beat("a", 4, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("b", 4, 2, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    /* a stranger is still refused: the job has its nodes */
    ck_assert_int_eq(join("c", 2, 0), -1);
    ck_assert_str_eq(last_reject_code(), "full");
}
END_TEST

/* A job below its size takes a new node too, and one that joins while the
 * job recovers is taken once it runs again; a batch that cannot be split
 * over the larger world leaves the node idle. */
START_TEST(new_node_grows_a_job_below_its_size)
{
    shrink_to_a();
    ck_assert_int_eq(rdv.world_size, 2);
    ck_assert_int_eq(rdv.generation, 3);
    ck_assert_int_eq(join("c", 2, 0), 0); /* while generation 3 forms: taken when it runs */
    ck_assert_int_eq(rdv.generation, 3);
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.generation, 4);
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    beat("a", 4, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("c", 4, 2, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    /* b returns to a full job: it stays idle */
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(rdv.generation, 4);
}
END_TEST

/* Generation 3 running on node a alone (b gone, the job shrank to min_nodes),
 * its ranks saying rejoin or not; node c then joins. */
static void shrunk_to_a_then_c_joins(int rejoin)
{
    form_running(3);
    spec.min_nodes = 1;
    spec.rejoin_timeout_ms = 1000;
    spec.batch = 8;
    beat_rejoin = rejoin;
    rdv_disconnected(&rdv, "b", "connection closed", now);
    now += 2000;
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 0);
    rdv_tick(&rdv, now);
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 5);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_eq(rdv.generation, 3);
    ck_assert_int_eq(join("c", 2, 0), 0);
}

/* A grow of ranks that rejoin in place first asks them to leave their
 * generation at a step boundary, and opens the grown one once all have. */
START_TEST(grow_waits_for_the_ranks_to_leave_at_a_step_boundary)
{
    shrunk_to_a_then_c_joins(1);
    const struct proto_msg *y = NULL;
    for (int i = 0; i < rec.nsent && !y; i++)
        if (!strcmp(rec.sent[i].node, "a") && rec.sent[i].msg.type == PROTO_COMMAND &&
            rec.sent[i].msg.u.command.action == PROTO_CMD_YIELD)
            y = &rec.sent[i].msg;
    ck_assert_ptr_nonnull(y);
    ck_assert_int_eq(y->u.command.generation, 3);
    ck_assert(has_event("job_growing"));
    ck_assert_msg(strstr(rdv.reason, "leave it at the next step boundary"), "%s", rdv.reason); /* status says so */
    ck_assert_int_eq(rdv.generation, 3); /* nothing opens before they have left */
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    now += 500;
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 6);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.generation, 3);
    beat_yielded = 1; /* both ranks left after step 7 */
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 7);
    ck_assert_int_eq(rdv.generation, 4);
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "node c joined: growing from 2 to 4 ranks on 2 nodes"));
    ck_assert(!has_event("grow_unyielded"));
    beat_yielded = 0;
    beat("a", 4, 0, 2, PROTO_RANK_RUNNING, 7);
    beat("c", 4, 2, 2, PROTO_RANK_RUNNING, 7);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_eq(rdv.generation, 4);
}
END_TEST

/* Ranks that do not leave within min(progress_timeout_ms, 30 s) are parked
 * as after a failure. */
START_TEST(grow_parks_ranks_that_did_not_leave_in_time)
{
    shrunk_to_a_then_c_joins(1);
    spec.progress_timeout_ms = 4000;
    for (int i = 0; i < 9 && rdv.generation == 3; i++) {
        now += 500;
        beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 6);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.generation, 4);
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert(has_event("grow_unyielded"));
    ck_assert(!has_event("rank_hung")); /* the ranks stood still on purpose */
}
END_TEST

/* A grow whose node left while the ranks were leaving opens a generation of
 * the old members: the parked ranks need one. */
START_TEST(grow_whose_node_left_goes_on_without_it)
{
    shrunk_to_a_then_c_joins(1);
    ck_assert(has_event("job_growing"));
    const uint32_t restarts = rdv.restarts;
    rdv_disconnected(&rdv, "c", "connection closed", now);
    beat_yielded = 1;
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 6);
    ck_assert_int_eq(rdv.generation, 4);
    ck_assert_int_eq(rdv.world_size, 2);
    ck_assert_int_eq(rdv.restarts, restarts);
}
END_TEST

/* Ranks that cannot rejoin in place are not asked to yield: the grow opens
 * its generation at once. */
START_TEST(grow_of_ranks_that_cannot_rejoin_is_at_once)
{
    shrunk_to_a_then_c_joins(0);
    ck_assert(!has_event("job_growing"));
    ck_assert_int_eq(rdv.generation, 4);
    ck_assert_int_eq(rdv.world_size, 4);
}
END_TEST

/* Ranks that say they yielded while no grow waits (musterd restarted in
 * the middle of one) get a generation of the same members, the reason
 * saying so. */
START_TEST(yielded_ranks_without_a_grow_go_on_in_the_same_shape)
{
    form_running(3);
    ck_assert_int_eq(rdv.world_size, 4);
    const uint32_t restarts = rdv.restarts;
    beat_rejoin = beat_yielded = 1;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 9);
    ck_assert_int_eq(rdv.generation, 1); /* not before every rank has */
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 9);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert_int_eq(rdv.restarts, restarts);
    ck_assert_msg(strstr(rdv.reason, "no longer waits for"), "%s", rdv.reason);
}
END_TEST

/* A frozen rank stops its heartbeats (its agent leaves it out) and holds up
 * every other rank: the hang report names it, not the first stuck rank. */
START_TEST(hang_names_the_rank_whose_heartbeats_stopped)
{
    form_running(3);
    spec.progress_timeout_ms = 2000;
    spec.heartbeat_interval_ms = 200;
    for (int i = 0; i < 6; i++) { /* all stuck at step 4; rank 3 is not heard from */
        now += 500;
        beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 4);
        beat("b", 1, 2, 1, PROTO_RANK_RUNNING, 4);
        rdv_tick(&rdv, now);
    }
    settle_hang();
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_msg(strstr(rdv.reason, "rank 3 on node b is hung: no heartbeat from it for"), "%s", rdv.reason);
}
END_TEST

START_TEST(absent_member_fails_a_job_that_may_not_shrink)
{
    form_running(3);
    spec.rejoin_timeout_ms = 10000; /* min_nodes 0: never shrink */
    rdv_disconnected(&rdv, "b", "connection closed", now);
    for (int i = 0; i < 11; i++) {
        now += 1000;
        beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 0);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.state, RDV_FAILED);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "b did not rejoin within 10 s"));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "min_nodes is 2"));
}
END_TEST

START_TEST(ranks_that_never_run_are_a_failure)
{
    setup_spec(2, 3);
    spec.start_timeout_ms = 1000;
    ck_assert_int_eq(join("a", 2, 0), 0);
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    now += 600;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 2, 2, PROTO_RANK_STARTING, 0);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.generation, 1);
    now += 600;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 2, 2, PROTO_RANK_STARTING, 0);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "rank 2 on node b did not start within 1.0 s"));
}
END_TEST

START_TEST(inconsistent_saved_state_is_refused)
{
    setup_spec(2, 3);
    static struct rdv_saved saved;
    memset(&saved, 0, sizeof(saved));
    saved.state = RDV_RUNNING;
    saved.generation = 1;
    saved.world_size = 4;
    saved.nmembers = 2;
    snprintf(saved.members[0].name, PROTO_NAME_MAX, "a");
    saved.members[0].ndevices = 2;
    snprintf(saved.members[1].name, PROTO_NAME_MAX, "b");
    saved.members[1].first_rank = 1; /* overlaps a's block */
    saved.members[1].ndevices = 2;
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), -EINVAL);
}
END_TEST

START_TEST(status_document_has_the_promised_fields)
{
    form_running(3);
    now += 250;
    json_t *st = rest_status(now);
    ck_assert_str_eq(json_string_value(json_object_get(st, "state")), "running");
    ck_assert_int_eq(json_integer_value(json_object_get(st, "generation")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(st, "world_size")), 4);
    ck_assert_int_eq(json_integer_value(json_object_get(st, "restarts")), 0);
    json_t *ranks = json_object_get(st, "ranks"), *nodes = json_object_get(st, "nodes");
    ck_assert_int_eq(json_array_size(ranks), 4);
    ck_assert_int_eq(json_array_size(nodes), 2);
    json_t *r3 = json_array_get(ranks, 3);
    ck_assert_str_eq(json_string_value(json_object_get(r3, "node")), "b");
    ck_assert_int_eq(json_integer_value(json_object_get(r3, "local_rank")), 1);
    ck_assert_str_eq(json_string_value(json_object_get(r3, "state")), "running");
    ck_assert_int_eq(json_integer_value(json_object_get(r3, "heartbeat_age_ms")), 250);
    ck_assert_double_eq_tol(json_real_value(json_object_get(r3, "loss")), 2.5, 1e-12);
    json_t *nb = json_array_get(nodes, 0);
    ck_assert_int_eq(json_array_size(json_object_get(nb, "ranks")), 2);
    json_decref(st);
    json_t *ev = rdv_events_json(&rdv);
    ck_assert_int_ge(json_array_size(json_object_get(ev, "events")), 4);
    json_decref(ev);
}
END_TEST

/* The daemon answers the heartbeats that ask (no "ack": false), with the
 * same seq and its generation, and no other. */
START_TEST(heartbeat_is_answered_only_when_asked)
{
    form_running(3);
    struct proto_msg m = {.type = PROTO_HEARTBEAT};
    m.u.heartbeat.generation = 1;
    m.u.heartbeat.seq = 77;
    m.u.heartbeat.no_ack = 1;
    int mark = rec.nsent;
    rdv_message(&rdv, "a", &m, now);
    ck_assert_ptr_null(find_sent(mark, "a", PROTO_HEARTBEAT));
    m.u.heartbeat.seq = 78;
    m.u.heartbeat.no_ack = 0;
    rdv_message(&rdv, "a", &m, now);
    const struct proto_msg *ack = find_sent(mark, "a", PROTO_HEARTBEAT);
    ck_assert_ptr_nonnull(ack);
    ck_assert_uint_eq(ack->u.heartbeat.seq, 78);
    ck_assert_uint_eq(ack->u.heartbeat.generation, 1);
    ck_assert_uint_eq(ack->u.heartbeat.nranks, 0);
    ck_assert_ptr_null(find_sent(mark, "b", PROTO_HEARTBEAT));
}
END_TEST

/* rdv_tick scans nodes and ranks only when one can be due: a node's loss
 * and a rank's hang still come at the first tick past their deadlines,
 * whatever the ticks before saw, in a later generation too. */
START_TEST(tick_deadlines_are_exact_across_ticks_and_generations)
{
    form_running(3);
    spec.progress_timeout_ms = 3000;
    for (int i = 0; i < 40; i++) { /* ticks every 100 ms while both nodes beat and progress */
        now += 100;
        if (i % 10 == 0) {
            beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 2 + (uint64_t)i);
            beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 2 + (uint64_t)i);
        }
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    /* now = 5000; last beats at 4000 (step 32). b goes silent, a beats on at the same step. */
    const uint64_t progressed = now - 1000 + 100;
    while (!rdv.hang_pending && now < progressed + 5000) {
        now += 100;
        beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 32);
        rdv_tick(&rdv, now);
    }
    /* Progress stood still since 4100: hung at the first tick past 7100. */
    ck_assert_uint_eq(now, progressed + 3100);
    answer_stacks("a", 1, 0, 2, NULL); /* every rank's stacks: failed at once */
    ck_assert_int_eq(rdv.generation, 1);
    answer_stacks("b", 1, 2, 2, "no dump within 1.0 s");
    ck_assert_int_eq(rdv.hang_pending, 0);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rec.ndisconnected, 0);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "hung"));
    /* Generation 2 runs on both nodes; then b is heard no more. */
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 40);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 40);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    const uint64_t heard = now;
    while (now < heard + 5000) {
        now += 100;
        if ((now - heard) % 1000 == 0)
            beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 41 + (now - heard) / 1000);
        rdv_tick(&rdv, now);
        ck_assert_int_eq(rec.ndisconnected, 0); /* b is lost only past its 5 s */
    }
    now += 100;
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rec.ndisconnected, 1);
    ck_assert_str_eq(rec.disconnected[0], "b");
}
END_TEST

/* ---- rdv_tick's skipped scans against scanning every tick ---- */

static uint64_t rnd_state;
static int restarts;
static uint32_t rnd(uint32_t n)
{
    rnd_state = rnd_state * 6364136223846793005ULL + 1442695040888963407ULL;
    return (uint32_t)(rnd_state >> 33) % n;
}

/* One random run of three to four nodes that join, beat, progress, hang,
 * go quiet or silent, yield, exit and leave, with musterd restarting now and
 * then; trace gets the job's state after each tick. full: scan every tick
 * (deadlines forgotten), else skip scans as rdv_tick does. */
static void diff_run(uint64_t seed, int full, char *trace, size_t cap)
{
    size_t len = 0;
    setup_spec(3, 50);
    spec.heartbeat_timeout_ms = 1000 + (int)(seed % 5) * 300;
    spec.progress_timeout_ms = (seed % 3) ? 1500 + (int)(seed % 7) * 200 : 0;
    spec.rejoin_timeout_ms = 3000;
    spec.batch = 48;
    spec.min_nodes = 2;
    rnd_state = seed;
    static const char *const names[] = {"a", "b", "c", "d"};
    uint64_t steps[4] = {0};
    int silent[4] = {0};
    uint64_t mute_until[4] = {0}, yield_gen[4] = {0};
    const int rejoin = (int)(seed % 2);
    for (int t = 0; t < 600; t++) {
        now += 50 + rnd(100);
        for (int i = 0; i < rec.nsent; i++)
            if (rec.sent[i].msg.type == PROTO_COMMAND && rec.sent[i].msg.u.command.action == PROTO_CMD_YIELD)
                for (int k = 0; k < 4; k++)
                    if (!strcmp(rec.sent[i].node, names[k]))
                        yield_gen[k] = rdv.generation;
        rec.nsent = 0;
        if (rnd(400) == 0) { /* musterd restarts */
            static struct rdv_saved saved;
            rdv_save(&rdv, &saved);
            rdv_free(&rdv);
            json_t *job = json_pack("{s:s, s:i}", "name", "t", "nodes", 3);
            struct rdv_ops ops = {.ctx = NULL, .send = rec_send, .disconnect = rec_disconnect, .changed = rec_changed};
            ck_assert_int_eq(rdv_init(&rdv, &spec, job, &ops, now), 0);
            json_decref(job);
            ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
            restarts++;
        }
        for (int k = 0; k < 4; k++) {
            uint32_t r = rnd(1000);
            int idx = -1;
            for (uint32_t i = 0; i < rdv.nnodes; i++)
                if (!strcmp(rdv.nodes[i].name, names[k]))
                    idx = (int)i;
            int is_joined = idx >= 0 && rdv.nodes[idx].state == RDV_NODE_JOINED;
            if (!is_joined) {
                if (r < 30)
                    join(names[k], 2, rdv.generation);
                continue;
            }
            if (r < 4) {
                rdv_disconnected(&rdv, names[k], "test", now);
                continue;
            }
            if (r < 60u + (uint32_t)k * 100u) /* node d is the quietest, a the loudest: some go silent */
                continue;
            if (now < mute_until[k])
                continue;
            if (rnd(150) == 0) {
                mute_until[k] = now + rnd(3000);
                continue;
            }
            const struct rdv_node *nd = &rdv.nodes[idx];
            if (rnd(10) < 6)
                steps[k]++;
            if (rnd(50) == 0)
                silent[k] = !silent[k];
            if (nd->member && rdv.world_size) {
                struct proto_msg *m = heartbeat_msg(nd->ndevices);
                m->u.heartbeat.generation = rdv.generation;
                m->u.heartbeat.seq = now;
                m->u.heartbeat.free_port = node_port(names[k]);
                for (uint32_t i = 0; i < nd->ndevices; i++) {
                    m->u.heartbeat.ranks[i].rank = nd->first_rank + i;
                    m->u.heartbeat.ranks[i].state = rnd(40) ? PROTO_RANK_RUNNING : PROTO_RANK_STARTING;
                    m->u.heartbeat.ranks[i].step = (k == 1 && (t / 100) % 2) ? 7 : steps[k]; /* b hangs at times */
                    m->u.heartbeat.ranks[i].loss = 2.5;
                    m->u.heartbeat.ranks[i].silent = silent[k];
                    m->u.heartbeat.ranks[i].rejoin = rejoin;
                    m->u.heartbeat.ranks[i].yielded = yield_gen[k] == rdv.generation && rnd(3) == 0;
                }
                rdv_message(&rdv, names[k], m, now);
                if (rnd(300) == 0) {
                    struct proto_msg x = {.type = PROTO_RANK_EXIT};
                    x.u.rank_exit.generation = rdv.generation;
                    x.u.rank_exit.rank = nd->first_rank;
                    x.u.rank_exit.exit_code = 1;
                    rdv_message(&rdv, names[k], &x, now);
                }
            } else {
                struct proto_msg *m = heartbeat_msg(0);
                m->u.heartbeat.generation = rdv.generation;
                m->u.heartbeat.seq = now;
                m->u.heartbeat.free_port = node_port(names[k]);
                rdv_message(&rdv, names[k], m, now);
            }
        }
        if (full)
            rdv.lost_due_ms = rdv.hang_due_ms = 0;
        rdv_tick(&rdv, now);
        int n = snprintf(trace + len, cap - len, "%llu g%llu s%d n%u d%d r%s|", (unsigned long long)now,
                         (unsigned long long)rdv.generation, (int)rdv.state, rdv.nnodes, rec.ndisconnected, rdv.reason);
        if (n > 0 && (size_t)n < cap - len)
            len += (size_t)n;
    }
    rdv_free(&rdv);
}

/* The same random runs, skipping scans and scanning every tick, take the
 * same course tick by tick; and they exercise what the deadlines guard. */
START_TEST(tick_skipping_agrees_with_scanning_every_tick)
{
    static char a[1 << 20], b[1 << 20];
    int gens = 0, hung = 0, lost = 0;
    restarts = 0;
    const enum log_level level = log_threshold;
    log_threshold = LOG_ERROR; /* 800 runs' info lines (~235,000 writes) cost most of its time */
    for (uint64_t seed = 1; seed <= 400; seed++) {
        memset(a, 0, sizeof(a)); memset(b, 0, sizeof(b));
        diff_run(seed, 0, a, sizeof(a));
        uint64_t g = rdv.generation;
        lost += rec.ndisconnected;
        diff_run(seed, 1, b, sizeof(b));
        gens += (int)g;
        for (const char *q = a; (q = strstr(q, "hung")); q++)
            hung++;
        if (strcmp(a, b) != 0) {
            size_t i = 0;
            while (a[i] == b[i]) i++;
            while (i > 0 && a[i - 1] != '|') i--;
            ck_abort_msg("seed %llu differs:\nskip: %.300s\nfull: %.300s", (unsigned long long)seed, a + i, b + i);
        }
    }
    log_threshold = level;
    ck_assert_int_gt(gens, 400);
    ck_assert_int_gt(hung, 0);
    ck_assert_int_gt(lost, 100);
    ck_assert_int_gt(restarts, 50);
    setup_spec(3, 1); /* teardown frees */
}
END_TEST

/* Before formation a lost node is forgotten and the last node takes its
 * place in the table: a tick still loses every node that is due. */
START_TEST(tick_loses_every_silent_node_before_formation)
{
    setup_spec(4, 3);
    ck_assert_int_eq(join("a", 2, 0), 0);
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(join("c", 2, 0), 0);
    now += 2000;
    beat("a", 0, 0, 0, PROTO_RANK_RUNNING, 0);
    rdv_tick(&rdv, now);
    now += 3100; /* b and c silent 5.1 s, a 3.1 s */
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rec.ndisconnected, 2);
    ck_assert_int_eq(rdv.nnodes, 1);
    ck_assert_str_eq(rdv.nodes[0].name, "a");
}
END_TEST

/* One rank's entry, as its agent relays it: age_ms < 0 = no step_age_ms. */
static void beat_one(const char *node, uint32_t rank, uint64_t step, int64_t age_ms, const char *where,
                     const char *waiting, int stopped, int silent)
{
    static struct proto_msg m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_HEARTBEAT;
    m.u.heartbeat.generation = rdv.generation;
    m.u.heartbeat.seq = now;
    m.u.heartbeat.free_port = node_port(node);
    m.u.heartbeat.nranks = 1;
    struct proto_rank_beat *b = &m.u.heartbeat.ranks[0];
    b->rank = rank;
    b->state = PROTO_RANK_RUNNING;
    b->step = step;
    b->loss = silent ? NAN : 2.5;
    b->silent = silent;
    b->stopped = stopped;
    b->has_step_age = age_ms >= 0;
    b->step_age_ms = age_ms >= 0 ? (uint64_t)age_ms : 0;
    snprintf(b->where, sizeof(b->where), "%s", where ? where : "");
    snprintf(b->waiting, sizeof(b->waiting), "%s", waiting ? waiting : "");
    rdv_message(&rdv, node, &m, now);
}

#define AR "all_reduce (distributed_c10d.py)"

/* (a) A stopped process is named before the quiet and the waiting ones, with
 * where it is; the generation fails once every rank's stacks came. */
START_TEST(hang_names_the_stopped_rank_with_where_it_is)
{
    form_running(3);
    spec.progress_timeout_ms = 2000;
    spec.heartbeat_interval_ms = 200;
    for (int i = 0; i < 30 && !rdv.hang_pending; i++) {
        now += 100;
        for (uint32_t k = 0; k < 3; k++)
            beat_one(k < 2 ? "a" : "b", k, 4, -1, "distributed_c10d.py:2050 in all_reduce", AR, 0, 0);
        beat_one("b", 3, 4, -1, "train.py:88 in compute_loss", "", 1, 0); /* relayed: stopped */
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.hang_pending, 1);
    ck_assert_msg(strstr(rdv.hang_what, "rank 3 on node b is hung: its process is stopped (SIGSTOP or a debugger) at "
                                        "train.py:88 in compute_loss; ranks 0-2 wait in " AR),
                  "%s", rdv.hang_what);
    const struct proto_msg *cmd = find_sent(0, "b", PROTO_COMMAND);
    for (int i = 0; i < rec.nsent; i++) /* the stacks asked of both nodes, for this generation */
        if (rec.sent[i].msg.type == PROTO_COMMAND && rec.sent[i].msg.u.command.action == PROTO_CMD_STACKS)
            cmd = &rec.sent[i].msg;
    ck_assert_ptr_nonnull(cmd);
    ck_assert_int_eq(cmd->u.command.action, PROTO_CMD_STACKS);
    ck_assert_uint_eq(cmd->u.command.generation, 1);
    /* Some answers: it waits for the rest, up to 2 s. */
    answer_stacks("a", 1, 0, 2, NULL);
    now += HANG_STACKS_WAIT_MS - 100;
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.generation, 1);
    /* REST flags the hung rank while its stacks are collected, with where each rank is. */
    json_t *st = rest_status(now);
    const json_t *r0 = json_array_get(json_object_get(st, "ranks"), 0);
    const json_t *r3 = json_array_get(json_object_get(st, "ranks"), 3);
    ck_assert(json_is_true(json_object_get(r3, "hung")) && json_is_true(json_object_get(r3, "stopped")));
    ck_assert(json_is_false(json_object_get(r0, "hung")) && json_is_false(json_object_get(r0, "stopped")));
    ck_assert_str_eq(json_string_value(json_object_get(r0, "waiting")), AR);
    ck_assert_str_eq(json_string_value(json_object_get(r3, "where")), "train.py:88 in compute_loss");
    ck_assert(json_is_null(json_object_get(r3, "waiting")));
    /* how long its step stood still, and it leads the ranks needing attention */
    ck_assert_int_gt(json_integer_value(json_object_get(r3, "step_age_ms")), spec.progress_timeout_ms);
    const json_t *worst = json_array_get(json_object_get(st, "failing_ranks"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(worst, "rank")), 3);
    ck_assert(json_is_true(json_object_get(worst, "hung")));
    json_decref(st);
    answer_stacks("b", 1, 2, 2, NULL); /* the last ones: failed at once */
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_msg(strstr(rdv.last_failure.detail, "rank 3 (node b, pid 1003, stopped): train.py:88 in compute_loss"),
                  "%s", rdv.last_failure.detail);
    ck_assert_msg(strstr(rdv.last_failure.detail, "ranks 0-2: waiting in " AR), "%s", rdv.last_failure.detail);
    ck_assert_str_eq(rdv.last_failure.how, "is hung");
    ck_assert_uint_eq(rdv.last_failure.rank, 3);
    ck_assert(has_event("rank_hung"));
    char *text = rdv_stacks_text(&rdv);
    json_t *k = json_loads(text, 0, NULL);
    ck_assert_msg(k != NULL, "not JSON: %s", text);
    free(text);
    ck_assert_int_eq(json_integer_value(json_object_get(k, "answered")), 4);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(k, "ranks"), 3), "text")),
                     "process 1000:\n  File \"train.py\", line 88 in compute_loss\n");
    json_decref(k);
}
END_TEST

/* One rank's STACKS answer with text. */
static void answer_text(const char *node, uint32_t rank, const char *text)
{
    static struct proto_msg m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_STACKS;
    m.u.stacks.generation = rdv.generation;
    m.u.stacks.rank = rank;
    m.u.stacks.pid = 100 + rank;
    m.u.stacks.text = (char *)text;
    rdv_message(&rdv, node, &m, now);
}

/* Dumps are kept within a rank's limit and the set's (here 100 bytes and
 * 450 of JSON text), cut at a character boundary, the cut said at the end of
 * the text and counted in "cut"; an answer again replaces the one before. */
START_TEST(stacks_kept_within_budget)
{
    form_running(3);
    rdv.stacks.rank_max = 100;
    rdv.stacks.total_max = 450;
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_STACKS, NULL, now), 0);
    static char big[PROTO_STACKS_MAX + 1];
    big[0] = 'a';
    size_t n = 1;
    while (n + 2 < sizeof(big)) { /* "é", two bytes: byte 100 is inside one */
        big[n++] = (char)0xc3;
        big[n++] = (char)0xa9;
    }
    big[n] = '\0';
    answer_text("a", 0, big);
    ck_assert_uint_eq(rdv.stacks.ranks[0].cut, n - 99);
    ck_assert_uint_le(rdv.stacks.bytes, 450);
    answer_text("a", 1, "short\n");
    ck_assert_uint_eq(rdv.stacks.ranks[1].cut, 0);
    answer_text("b", 2, big);
    answer_text("b", 3, big);
    ck_assert_uint_le(rdv.stacks.bytes, 450);
    ck_assert_uint_eq(rdv.stacks.ranks[3].cut, n); /* no room left for it */

    char *text = rdv_stacks_text(&rdv);
    json_error_t jerr;
    json_t *doc = json_loads(text, 0, &jerr);
    ck_assert_msg(doc != NULL, "not JSON (%s): %.200s", jerr.text, text);
    free(text);
    json_t *ranks = json_object_get(doc, "ranks");
    const char *t0 = json_string_value(json_object_get(json_array_get(ranks, 0), "text"));
    ck_assert_ptr_nonnull(t0);
    ck_assert_int_eq(strncmp(t0, big, 99), 0);
    ck_assert_msg(strstr(t0, "[musterd cut ") && strstr(t0, " bytes of this dump: it keeps 100 bytes a rank, 450 in all]"),
                  "no note of the cut: %s", t0);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(ranks, 1), "text")), "short\n");
    ck_assert(json_is_null(json_object_get(json_array_get(ranks, 3), "text")));
    ck_assert_int_eq(json_integer_value(json_object_get(json_array_get(ranks, 3), "cut")), (json_int_t)n);
    uint64_t cut = rdv.stacks.ranks[0].cut + rdv.stacks.ranks[2].cut + rdv.stacks.ranks[3].cut;
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "cut")), (json_int_t)cut);
    ck_assert_int_eq(json_integer_value(json_object_get(doc, "answered")), 4);
    json_decref(doc);

    /* rank 0 again, short: its room goes back to the set */
    size_t before = rdv.stacks.bytes;
    answer_text("a", 0, "again\n");
    ck_assert_uint_lt(rdv.stacks.bytes, before);
    ck_assert_uint_eq(rdv.stacks.ranks[0].cut, 0);
    ck_assert_uint_eq(rdv.stacks.cut, rdv.stacks.ranks[2].cut + rdv.stacks.ranks[3].cut);
    answer_text("b", 3, "now it fits\n");
    ck_assert_uint_eq(rdv.stacks.ranks[3].cut, 0);
    ck_assert_uint_le(rdv.stacks.bytes, 450);
    /* a new set starts empty */
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_STACKS, NULL, now), 0);
    ck_assert_uint_eq(rdv.stacks.bytes, 0);
    ck_assert_uint_eq(rdv.stacks.cut, 0);
}
END_TEST

/* (c) The rank outside any collective while the others wait in one is named,
 * not the first stuck one; (d) when all wait, the stuck one, with the call. */
START_TEST(hang_names_the_rank_not_in_a_collective)
{
    for (int all_wait = 0; all_wait < 2; all_wait++) {
        if (all_wait)
            teardown();
        form_running(3);
        spec.progress_timeout_ms = 2000;
        spec.heartbeat_interval_ms = 200;
        for (int i = 0; i < 30 && !rdv.hang_pending; i++) {
            now += 100;
            for (uint32_t k = 0; k < 4; k++)
                beat_one(k < 2 ? "a" : "b", k, 4, -1, k == 2 ? "train.py:12 in spin" : "c10d.py:1 in all_reduce",
                         k == 2 && !all_wait ? "" : AR, 0, 0);
            rdv_tick(&rdv, now);
        }
        settle_hang();
        const char *want = all_wait ? "rank 0 on node a is hung: stuck at step 4 for"
                                    : "rank 2 on node b is hung: it is not in a collective (at train.py:12 in spin) "
                                      "while ranks 0-1, 3 wait in " AR;
        ck_assert_msg(strstr(rdv.last_failure.reason, want), "%s", rdv.last_failure.reason);
        if (all_wait)
            ck_assert_msg(strstr(rdv.last_failure.reason, "; ranks 0-3 wait in " AR), "%s", rdv.last_failure.reason);
        ck_assert_uint_eq(rdv.last_failure.rank, all_wait ? 0 : 2);
    }
}
END_TEST

/* Every rank waits in a collective: the rules can only name the rank found
 * stuck, but the ranks' flight recorder summaries (STACKS fr) name the one
 * behind, once every running rank sent one that parses. */
START_TEST(hang_is_named_by_the_flight_recorders)
{
    static const char *const fr[4] = {"0 default_pg 31 30 31:all_reduce", "0 default_pg 30 30 30:broadcast",
                                      "0 default_pg 31 30 31:all_reduce", "0 default_pg 31 30 31:all_reduce"};
    for (int mode = 0; mode < 3; mode++) { /* 0: all four; 1: rank 3 sends none; 2: rank 3's is garbage */
        if (mode)
            teardown();
        form_running(3);
        spec.progress_timeout_ms = 2000;
        spec.heartbeat_interval_ms = 200;
        for (int i = 0; i < 30 && !rdv.hang_pending; i++) {
            now += 100;
            for (uint32_t k = 0; k < 4; k++)
                beat_one(k < 2 ? "a" : "b", k, 4, -1, "c10d.py:1 in all_reduce", AR, 0, 0);
            rdv_tick(&rdv, now);
        }
        ck_assert_int_eq(rdv.hang_pending, 1);
        static struct proto_msg m;
        for (uint32_t k = 0; k < 4; k++) {
            memset(&m, 0, sizeof(m));
            m.type = PROTO_STACKS;
            m.u.stacks.generation = rdv.generation;
            m.u.stacks.rank = k;
            m.u.stacks.pid = 1000 + k;
            m.u.stacks.text = "process 1000:\n  File \"c10d.py\", line 1 in all_reduce\n";
            m.u.stacks.fr = (char *)(k == 3 && mode == 1 ? NULL : k == 3 && mode == 2 ? "0 default_pg x 1" : fr[k]);
            rdv_message(&rdv, k < 2 ? "a" : "b", &m, now);
        }
        rdv_tick(&rdv, now);
        ck_assert_int_eq(rdv.hang_pending, 0);
        if (mode == 0) {
            ck_assert_str_eq(rdv.last_failure.reason, "rank 1 on node a is hung: rank 1 never entered all_reduce #31 "
                                                      "(its last is broadcast #30); ranks 0, 2-3 wait in it (torch's "
                                                      "flight recorder)");
            ck_assert_uint_eq(rdv.last_failure.rank, 1);
            ck_assert_msg(strncmp(rdv.last_failure.detail, "flight recorder: rank 1 never entered all_reduce #31",
                                  52) == 0, "%s", rdv.last_failure.detail);
        } else { /* a rank without a summary may be the one behind: no verdict */
            ck_assert_msg(strstr(rdv.last_failure.reason, "rank 0 on node a is hung: stuck at step 4"), "%s",
                          rdv.last_failure.reason);
            ck_assert_ptr_null(strstr(rdv.last_failure.detail, "flight recorder"));
        }
    }
}
END_TEST

/* A silent rank (no reports of its own) whose process stays stopped longer
 * than the progress timeout is hung; a shorter stop is not. */
START_TEST(silent_rank_stopped_past_the_timeout_is_hung)
{
    form_running(3);
    spec.progress_timeout_ms = 2000;
    for (int i = 0; i < 10; i++) { /* 1 s stopped, then it continues: nothing */
        now += 100;
        beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 2 + (uint64_t)i);
        beat_one("b", 2, 0, -1, NULL, NULL, 0, 1);
        beat_one("b", 3, 0, -1, NULL, NULL, 1, 1);
        rdv_tick(&rdv, now);
    }
    beat_one("b", 3, 0, -1, NULL, NULL, 0, 1);
    for (int i = 0; i < 30 && !rdv.hang_pending; i++) {
        now += 100;
        beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 20 + (uint64_t)i);
        beat_one("b", 2, 0, -1, NULL, NULL, 0, 1);
        beat_one("b", 3, 0, -1, NULL, NULL, 1, 1);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.hang_pending, 1);
    settle_hang();
    ck_assert_msg(strstr(rdv.last_failure.reason, "rank 3 on node b is hung: its process is stopped"), "%s",
                  rdv.last_failure.reason);
}
END_TEST

/* Issue 27 F5: a stop of 2.4 s under a 3 s timeout, whose next step reaches
 * musterd 1.2 s late, is never a hang: the stall is judged by the ranks' own
 * clock (step_age_ms) as of their latest entry. */
START_TEST(step_seen_late_is_not_a_stall)
{
    form_running(3);
    spec.progress_timeout_ms = 3000;
    spec.heartbeat_interval_ms = 1000;
    const uint64_t t0 = now;
    for (uint32_t k = 0; k < 4; k++)
        beat_one(k < 2 ? "a" : "b", k, 10, 0, NULL, NULL, 0, 0);
    while (now < t0 + 3600) { /* keepalives with the age grown, every second at +900 */
        now += 100;
        if ((now - t0) % 1000 == 900 && now < t0 + 3600)
            for (uint32_t k = 0; k < 4; k++)
                beat_one(k < 2 ? "a" : "b", k, 10, (int64_t)(now - t0), NULL, AR, 0, 0);
        rdv_tick(&rdv, now);
        ck_assert_msg(!rdv.hang_pending && rdv.state == RDV_RUNNING, "hung at +%llu ms: %s",
                      (unsigned long long)(now - t0), rdv.hang_what);
    }
    for (uint32_t k = 0; k < 4; k++) /* stepped at +2400, heard at +3600 */
        beat_one(k < 2 ? "a" : "b", k, 11, 1200, NULL, NULL, 0, 0);
    ck_assert_uint_eq(rdv.ranks[3].progress_ms, t0 + 2400);
    for (int i = 0; i < 20; i++) {
        now += 100;
        rdv_tick(&rdv, now);
        ck_assert_int_eq(rdv.hang_pending, 0);
    }
    /* Without step_age_ms the same entries would have been a stall by now. */
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
}
END_TEST

/* A stopped rank whose peers wait is named after HANG_STOPPED_MS of its own,
 * not after the progress timeout (300 s at the start: the job's first steps). */
START_TEST(hang_names_a_stopped_rank_before_the_progress_timeout)
{
    form_running(3);
    spec.progress_timeout_ms = -1; /* auto: the start allowance, 300 s */
    spec.heartbeat_interval_ms = 200;
    const uint64_t stop = now;
    uint64_t named = 0;
    for (int i = 0; i < 100 && !rdv.hang_pending; i++) {
        now += 100;
        for (uint32_t k = 0; k < 3; k++) /* they finish the step under way, then wait */
            beat_one(k < 2 ? "a" : "b", k, now - stop < 300 ? 2 : 3, -1, "distributed_c10d.py:2050 in all_reduce",
                     AR, 0, 0);
        beat_one("b", 3, 2, -1, "train.py:88 in compute_loss", "", 1, 0);
        rdv_tick(&rdv, now);
        if (rdv.hang_pending)
            named = now - stop;
    }
    ck_assert_int_eq(rdv.hang_pending, 1);
    /* HANG_STOPPED_MS after the peers' last step (at 0.3 s), not before, and long before 300 s */
    ck_assert_uint_ge(named, 300 + HANG_STOPPED_MS);
    ck_assert_uint_le(named, 300 + HANG_STOPPED_MS + 200);
    ck_assert_msg(strstr(rdv.hang_what, "rank 3 on node b is hung: its process is stopped (SIGSTOP or a debugger) at "
                                        "train.py:88 in compute_loss; ranks 0-2 wait in " AR),
                  "%s", rdv.hang_what);
}
END_TEST

/* A stopped rank whose peers go on stepping (they do not wait for it) is not hung by the rule. */
START_TEST(stopped_rank_with_peers_stepping_waits_for_the_timeout)
{
    form_running(3);
    spec.progress_timeout_ms = -1;
    spec.heartbeat_interval_ms = 200;
    for (int i = 0; i < 40; i++) {
        now += 200;
        for (uint32_t k = 0; k < 3; k++)
            beat_one(k < 2 ? "a" : "b", k, 2 + (uint64_t)i, -1, "train.py:50 in step", "", 0, 0);
        beat_one("b", 3, 2, -1, "train.py:88 in compute_loss", "", 1, 0);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.hang_pending, 0);
}
END_TEST

/* A rank that exits on a collective's timeout while a peer is stopped: the peer is the cause. */
START_TEST(collective_error_is_put_down_to_the_stopped_peer)
{
    form_running(3);
    spec.heartbeat_interval_ms = 200;
    for (int i = 0; i < 5; i++) {
        now += 100;
        beat_one("b", 3, 2, -1, "train.py:88 in compute_loss", "", 1, 0);
    }
    rank_exit_said("a", 1, 1, 1, 0, "RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] Timed out "
                   "waiting 60000ms for recv operation to complete (ddp.py:40)", "");
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_msg(strstr(rdv.reason, "rank 1 on node a exited with status 1 waiting for rank 3 (node b), "
                                     "whose process is stopped (SIGSTOP or a debugger): RuntimeError: "),
                  "%s", rdv.reason);
    /* an error of the rank's own is its own, stopped peer or not */
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 3);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 3);
    beat_one("b", 3, 3, -1, "train.py:88 in compute_loss", "", 1, 0);
    rank_exit_said("a", 2, 0, 1, 0, "ValueError: bad batch (train.py:12)", "");
    ck_assert_msg(strstr(rdv.reason, "rank 0 on node a exited with status 1: ValueError"), "%s", rdv.reason);
}
END_TEST

/* Through rdv: a generation first seen at step 1 whose next beat brings step 10 has run 9 steps. */
START_TEST(auto_timeout_counts_the_steps_a_beat_brings)
{
    form_running(3); /* every rank running at step 1 */
    ck_assert_uint_eq(hang_timeout_ms(&rdv.steps, -1), HANG_START_MS);
    now += 1000;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 10);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 10);
    ck_assert_uint_eq(rdv.steps.seen, 9);
    now += 1000; /* a step time is known from here: 10 steps in 1 s */
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 20);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 20);
    ck_assert_uint_eq(rdv.steps.seen, 19);
    ck_assert_uint_eq(hang_timeout_ms(&rdv.steps, -1), HANG_FLOOR_MS); /* 20 x 0.1 s < 30 s */
}
END_TEST

/* The automatic timeout: the start allowance until 5 steps, then the floor,
 * 20 x the median, 3 x the longest after the first steps. */
START_TEST(auto_timeout_follows_the_steps)
{
    struct hang_steps h;
    memset(&h, 0, sizeof(h));
    ck_assert_uint_eq(hang_timeout_ms(&h, 4000), 4000);
    ck_assert_uint_eq(hang_timeout_ms(&h, 0), 0);
    ck_assert_uint_eq(hang_timeout_ms(&h, -1), HANG_START_MS);
    hang_steps_note(&h, 0, 1, 200.0); /* a first step that compiles: 3 x 200 s */
    ck_assert_uint_eq(hang_timeout_ms(&h, -1), 600000);
    for (uint64_t s = 2; s <= 5; s++)
        hang_steps_note(&h, s - 1, s, 1.0);
    ck_assert_uint_eq(hang_timeout_ms(&h, -1), 600000); /* 5 steps: still starting */
    for (uint64_t s = 6; s <= 20; s++)
        hang_steps_note(&h, s - 1, s, 1.0);
    ck_assert_uint_eq(hang_timeout_ms(&h, -1), HANG_FLOOR_MS); /* 20 x 1 s < 30 s */
    for (uint64_t s = 21; s <= 60; s++)
        hang_steps_note(&h, s - 1, s, 2.5);
    ck_assert_uint_eq(hang_timeout_ms(&h, -1), 50000); /* 20 x the median 2.5 s */
    hang_steps_note(&h, 60, 61, 30.0); /* an evaluation step */
    ck_assert_uint_eq(hang_timeout_ms(&h, -1), 90000); /* 3 x 30 s */
    hang_steps_new_generation(&h);
    ck_assert_uint_eq(hang_timeout_ms(&h, -1), HANG_START_MS);
    /* Steps are counted, not the beats that bring them: 0.06 s steps, a beat a second. */
    hang_steps_note(&h, 99, 101, 0.06); /* first seen at 99 (resumed there), 2 steps in the next beat */
    ck_assert_uint_eq(hang_timeout_ms(&h, -1), HANG_START_MS);
    hang_steps_note(&h, 101, 117, 0.06); /* 16 steps in one beat: past the first 5, derived */
    ck_assert_uint_eq(hang_timeout_ms(&h, -1), 90000); /* 3 x the longest seen, 30 s, in any generation */
    hang_steps_new_generation(&h);

    /* Through rdv: steps of 0.5 s as the ranks measured them. */
    form_running(3);
    spec.progress_timeout_ms = -1;
    for (uint64_t s = 2; s <= 12; s++) {
        now += 500;
        for (uint32_t k = 0; k < 4; k++)
            beat_one(k < 2 ? "a" : "b", k, s, 0, NULL, NULL, 0, 0);
        rdv_tick(&rdv, now);
    }
    json_t *st = rdv_summary_json(&rdv, now);
    json_t *pt = json_object_get(st, "progress_timeout");
    ck_assert_int_eq(json_integer_value(json_object_get(pt, "ms")), HANG_FLOOR_MS);
    ck_assert_str_eq(json_string_value(json_object_get(pt, "basis")), "steps");
    ck_assert(json_is_null(json_object_get(st, "steps"))); /* no steps key, no rank said */
    json_decref(st);
}
END_TEST

static int cmp_seconds(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The median kept sorted as times come and go is the median of the last
 * HANG_SAMPLES times, sorted afresh, through repeats and the ring's turns. */
START_TEST(median_is_of_the_last_samples)
{
    struct hang_steps h;
    double last[HANG_SAMPLES], sorted[HANG_SAMPLES];
    memset(&h, 0, sizeof(h));
    uint64_t step = HANG_JUDGE_STEPS + 1, x = 12345;
    for (uint64_t s = 1; s < step; s++)
        hang_steps_note(&h, s - 1, s, 1.0); /* the first steps are not samples */
    ck_assert_double_eq(hang_median_step_s(&h), 0);
    for (uint32_t i = 0; i < 1000; i++, step++) {
        x = x * 6364136223846793005u + 1442695040888963407u;
        const double t = (double)(x >> 58) / 4.0 + 0.25; /* 64 values: many repeats */
        hang_steps_note(&h, step - 1, step, t);
        last[i % HANG_SAMPLES] = t;
        const uint32_t n = i + 1 < HANG_SAMPLES ? i + 1 : HANG_SAMPLES;
        memcpy(sorted, last, n * sizeof(double));
        qsort(sorted, n, sizeof(double), cmp_seconds);
        const double want = n % 2 ? sorted[n / 2] : (sorted[n / 2 - 1] + sorted[n / 2]) / 2;
        ck_assert_msg(hang_median_step_s(&h) == want, "after %u times: %g, want %g", i + 1, hang_median_step_s(&h),
                      want);
    }
}
END_TEST

START_TEST(rank_ranges_compress)
{
    char out[64];
    const uint32_t a[] = {0, 1, 2, 5, 7, 8};
    hang_ranges(out, sizeof(out), a, 6);
    ck_assert_str_eq(out, "ranks 0-2, 5, 7-8");
    hang_ranges(out, sizeof(out), a + 3, 1);
    ck_assert_str_eq(out, "rank 5");
    uint32_t many[40];
    for (uint32_t i = 0; i < 40; i++)
        many[i] = 3 * i;
    hang_ranges(out, 40, many, 40);
    ck_assert_msg(strlen(out) < 40 && strstr(out, ", ..."), "%s", out);
}
END_TEST

START_TEST(stalled_step_is_a_hang)
{
    form_running(3);
    spec.progress_timeout_ms = 2000;
    for (int i = 0; i < 5; i++) { /* a advances, b heartbeats but stays at step 1 */
        now += 500;
        beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 2 + (uint64_t)i);
        beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 1);
        rdv_tick(&rdv, now);
    }
    settle_hang();
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "rank 2 on node b is hung: stuck at step 1"));
}
END_TEST

START_TEST(rejoined_ranks_wait_for_a_slow_replacement_without_a_hang)
{
    form_running(3);
    spec.progress_timeout_ms = 2000;
    rank_exit_said("b", 1, 3, 0, 9, "", "");
    ck_assert_int_eq(rdv.generation, 2);
    /* Ranks 0-2 rejoin in place and report running at their old step at once;
     * rank 3's new process takes 5 s to start (the old one's SIGKILL grace). */
    for (int i = 0; i < 10; i++) {
        now += 500;
        beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 10);
        beat("b", 2, 2, 1, PROTO_RANK_RUNNING, 10);
        beat("b", 2, 3, 1, PROTO_RANK_STARTING, 0);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    now += 100;
    beat("b", 2, 3, 1, PROTO_RANK_RUNNING, 10);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    now += 500; /* the generation has run 0.5 s: nobody is stuck yet */
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 10);
    rdv_tick(&rdv, now);
    ck_assert_msg(rdv.state == RDV_RUNNING && rdv.generation == 2, "generation %llu: %s",
                  (unsigned long long)rdv.generation, rdv.reason);
    for (int i = 0; i < 5; i++) { /* still the hang detection once it runs: rank 3 stays at step 10 */
        now += 500;
        beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 11 + (uint64_t)i);
        beat("b", 2, 2, 1, PROTO_RANK_RUNNING, 11 + (uint64_t)i);
        beat("b", 2, 3, 1, PROTO_RANK_RUNNING, 10);
        rdv_tick(&rdv, now);
    }
    settle_hang();
    ck_assert_int_eq(rdv.generation, 3);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "rank 3 on node b is hung"));
}
END_TEST

START_TEST(rank0_reports_committed_checkpoints)
{
    form_running(3);
    ck_assert_int_eq(rdv.last_checkpoint_step, -1);
    struct proto_msg m = {.type = PROTO_HEARTBEAT};
    m.u.heartbeat.generation = 1;
    m.u.heartbeat.nranks = 2;
    m.u.heartbeat.ranks[0] = (struct proto_rank_beat){.rank = 0, .state = PROTO_RANK_RUNNING, .step = 120, .loss = 2.0, .tokens_per_s = 1, .checkpoint_step = 100};
    m.u.heartbeat.ranks[1] = (struct proto_rank_beat){.rank = 1, .state = PROTO_RANK_RUNNING, .step = 120, .loss = 2.0, .tokens_per_s = 1, .checkpoint_step = 100};
    int before = rec.persists;
    rdv_message(&rdv, "a", &m, now);
    ck_assert_int_eq(rdv.last_checkpoint_step, 100);
    ck_assert_int_gt(rec.persists, before);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    ck_assert_int_eq(saved.last_checkpoint_step, 100);
    /* Only rank 0 speaks for the checkpoint; an older step never lowers it. */
    m.u.heartbeat.ranks[0].checkpoint_step = 50;
    rdv_message(&rdv, "a", &m, now);
    ck_assert_int_eq(rdv.last_checkpoint_step, 100);
}
END_TEST

START_TEST(admin_stop_and_restart)
{
    form_running(0);
    int mark = rec.nsent;
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_RESTART, NULL, now), 0);
    ck_assert_int_eq(rdv.generation, 2);
    /* An asked-for restart means fresh processes: stop, not park. */
    const struct proto_msg *stop = find_sent(mark, "a", PROTO_COMMAND);
    ck_assert_ptr_nonnull(stop);
    ck_assert_int_eq(stop->u.command.action, PROTO_CMD_STOP);
    ck_assert_int_eq(rdv.restarts, 0); /* asked-for restarts are free */
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_DRAIN, "zz", now), -ENOENT);
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_STOP, NULL, now), 0);
    ck_assert_int_eq(rdv.state, RDV_STOPPED);
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_STOP, NULL, now), -EINVAL);
}
END_TEST


START_TEST(assign_names_rank0_address_port_and_restarts)
{
    form_running(3);
    const struct proto_msg *a = find_sent(0, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(a);
    ck_assert_str_eq(a->u.assign.master_addr, "127.0.0.1");
    ck_assert_uint_eq(a->u.assign.master_port, 29500); /* node a holds rank 0 */
    ck_assert_uint_eq(a->u.assign.node_rank, 1);
    ck_assert_uint_eq(a->u.assign.nnodes, 2);
    ck_assert_uint_eq(a->u.assign.restart_count, 0);
    int from = rec.nsent;
    rank_exit("b", 1, 3, 1, 0);
    a = find_sent(from, "a", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->u.assign.generation, 2);
    ck_assert_uint_eq(a->u.assign.node_rank, 0);
    ck_assert_uint_eq(a->u.assign.restart_count, 1);
}
END_TEST

START_TEST(no_free_port_holds_the_generation)
{
    setup_spec(2, 3);
    no_port = 1;
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(join("a", 2, 0), 0);
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    ck_assert_ptr_null(find_sent(0, "a", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "node a (rank 0) to find a free port for MASTER_PORT"));
    ck_assert_str_eq(rdv.events[(rdv.nevents - 1) % RDV_EVENTS].kind, "no_master_port");
    /* b's port does not help: rank 0 is on a. */
    no_port = 0;
    beat("b", 0, 0, 0, PROTO_RANK_STARTING, 0);
    ck_assert_ptr_null(find_sent(0, "b", PROTO_ASSIGN));
    beat("a", 0, 0, 0, PROTO_RANK_STARTING, 0);
    const struct proto_msg *a = find_sent(0, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->u.assign.master_port, 29500);
}
END_TEST

/* Two generations within one heartbeat: node a's last report, sent before
 * it had generation 2's ASSIGN, names generation 2's port. Generation 3
 * waits for another: a survivor may hold the old one with the old store.
 * The same port reported by an agent that knows generation 2 (no rank of it
 * lives: a one-port range) is taken. */
static void beat_port(const char *node, uint64_t generation, uint32_t port)
{
    struct proto_msg *m = heartbeat_msg(0);
    m->u.heartbeat.generation = generation;
    m->u.heartbeat.free_port = port;
    rdv_message(&rdv, node, m, now);
}

START_TEST(next_generation_never_gets_a_port_reported_before_the_last_assign)
{
    form_running(3);
    spec.restart_backoff_ms = 0; /* failures in a row start at once */
    int from = rec.nsent;
    rank_exit("b", 1, 3, 1, 0);
    const struct proto_msg *a = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->u.assign.generation, 2);
    const uint32_t port2 = a->u.assign.master_port;
    beat_port("a", 1, port2); /* sent before a had generation 2's ASSIGN */
    from = rec.nsent;
    rank_exit("b", 2, 3, 1, 0);
    ck_assert_uint_eq(rdv.generation, 3);
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert_ptr_null(find_sent(from, "b", PROTO_ASSIGN));
    ck_assert_msg(strstr(rdv.reason, "other than the last generation's") != NULL, "reason: %s", rdv.reason);
    /* Not the event of a node without any free port. */
    ck_assert_str_ne(rdv.events[(rdv.nevents - 1) % RDV_EVENTS].kind, "no_master_port");
    beat_port("a", 2, port2 + 7);
    a = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->u.assign.generation, 3);
    ck_assert_uint_eq(a->u.assign.master_port, port2 + 7);

    /* Reported again by an agent that had generation 3's ASSIGN: free for it. */
    beat_port("a", 3, port2 + 7);
    from = rec.nsent;
    rank_exit("b", 3, 3, 1, 0);
    a = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->u.assign.generation, 4);
    ck_assert_uint_eq(a->u.assign.master_port, port2 + 7);
}
END_TEST

/* The same report from an agent that rejoined on a new session since
 * generation 2's ASSIGN (its link dropped, the ASSIGN with it): it never had
 * generation 2, no rank of it holds the port, and it names the same port,
 * still free, on every heartbeat. Generation 3 takes it; waiting for
 * another held the job for ever (gpu_shrink_new_rank_emulated under load). */
START_TEST(a_rejoined_agent_that_never_had_the_last_assign_gives_its_port)
{
    form_running(3);
    spec.restart_backoff_ms = 0;
    int from = rec.nsent;
    rank_exit("b", 1, 3, 1, 0);
    const struct proto_msg *a = find_sent(from, "a", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(a);
    ck_assert_uint_eq(a->u.assign.generation, 2);
    const uint32_t port2 = a->u.assign.master_port;
    now += 100;
    rdv_disconnected(&rdv, "a", "connection closed", now);
    ck_assert_uint_eq(rdv.generation, 3);
    from = rec.nsent;
    struct proto_hello h;
    char code[32], reason[PROTO_REASON_MAX];
    hello_of(&h, "a", 2, 1); /* generation 1: generation 2's ASSIGN never reached it */
    h.free_port = port2;
    now += 100;
    ck_assert_int_eq(rdv_join(&rdv, &h, now, code, reason), 0);
    beat_port("a", 1, port2);
    a = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_msg(a != NULL, "generation 3 not assigned: %s", rdv.reason);
    ck_assert_uint_eq(a->u.assign.generation, 3);
    ck_assert_uint_eq(a->u.assign.master_port, port2);
}
END_TEST

START_TEST(silent_rank_is_never_hung)
{
    form_running(3);
    spec.progress_timeout_ms = 2000;
    struct proto_msg m = {.type = PROTO_HEARTBEAT};
    m.u.heartbeat.generation = 1;
    m.u.heartbeat.free_port = 29501;
    m.u.heartbeat.nranks = 2;
    for (uint32_t i = 0; i < 2; i++)
        m.u.heartbeat.ranks[i] = (struct proto_rank_beat){.rank = 2 + i, .state = PROTO_RANK_RUNNING,
                                                          .loss = NAN, .silent = 1};
    for (int i = 0; i < 20; i++) { /* 10 s at step 0 */
        now += 500;
        beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 2 + (uint64_t)i);
        rdv_message(&rdv, "b", &m, now);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    json_t *st = rest_status(now);
    json_t *r2 = json_array_get(json_object_get(st, "ranks"), 2);
    ck_assert(json_is_null(json_object_get(r2, "step")));
    ck_assert(json_is_true(json_object_get(r2, "silent")));
    ck_assert(json_is_integer(json_object_get(json_array_get(json_object_get(st, "ranks"), 0), "step")));
    json_decref(st);

    /* Its first report, at step 0, starts the hang clock afresh: not hung at once. */
    now += 500;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 30);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 0);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    now += 1500;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 31);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 0);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    now += 1000; /* 2.5 s at step 0 since it spoke: hung */
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 32);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 0);
    rdv_tick(&rdv, now);
    settle_hang();
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
}
END_TEST

START_TEST(failure_reason_reaches_status_and_events)
{
    form_running(3);
    rank_exit_said("b", 1, 3, 1, 0, "ValueError: bad batch (train.py:120)", "Traceback ...\nValueError: bad batch\n");
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_str_eq(rdv.reason, "rank 3 on node b exited with status 1: ValueError: bad batch (train.py:120)");
    json_t *st = rest_status(now);
    json_t *f = json_object_get(st, "last_failure");
    ck_assert_str_eq(json_string_value(json_object_get(f, "reason")), "ValueError: bad batch (train.py:120)");
    ck_assert_str_eq(json_string_value(json_object_get(f, "node")), "b");
    ck_assert_int_eq(json_integer_value(json_object_get(f, "rank")), 3);
    ck_assert_ptr_nonnull(strstr(json_string_value(json_object_get(f, "detail")), "Traceback"));
    json_decref(st);
    st = rdv_events_json(&rdv);
    int found = 0;
    json_t *e;
    size_t i;
    json_array_foreach(json_object_get(st, "events"), i, e)
        found |= strstr(json_string_value(json_object_get(e, "message")), "ValueError: bad batch") != NULL;
    ck_assert(found);
    json_decref(st);

    /* A reason that fills its buffer, cut inside a multi-byte character, stays valid UTF-8. */
    char big[PROTO_REASON_MAX];
    size_t n = 0;
    while (n + 2 < sizeof(big) - 1) {
        big[n++] = '\xc3';
        big[n++] = '\xa9'; /* é */
    }
    big[n] = '\0';
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 1);
    rank_exit_said("a", 2, 0, 1, 0, big, "");
    st = rest_status(now);
    ck_assert_ptr_nonnull(st); /* json_pack fails on invalid UTF-8 */
    ck_assert_ptr_nonnull(json_string_value(json_object_get(st, "reason")));
    json_decref(st);
}
END_TEST

START_TEST(overflowing_sums_keep_status_valid)
{
    /* Finite per rank, infinite summed: the document must still render. */
    form_running(3);
    struct proto_msg m = {.type = PROTO_HEARTBEAT};
    m.u.heartbeat.generation = 1;
    m.u.heartbeat.nranks = 2;
    for (uint32_t i = 0; i < 2; i++)
        m.u.heartbeat.ranks[i] = (struct proto_rank_beat){.rank = i, .state = PROTO_RANK_RUNNING, .step = 5,
                                                          .loss = 1e308, .tokens_per_s = 1.7e308};
    rdv_message(&rdv, "a", &m, now);
    json_t *st = rest_status(now);
    ck_assert_ptr_nonnull(st);
    ck_assert(json_is_null(json_object_get(st, "loss")));
    ck_assert(json_is_null(json_object_get(st, "tokens_per_s")));
    json_decref(st);
}
END_TEST

START_TEST(failure_streaks_back_off)
{
    form_running(10);
    spec.restart_backoff_ms = 1000;
    spec.restart_backoff_max_ms = 8000;
    /* 1st failure: the next generation is assigned at once. */
    int from = rec.nsent;
    rank_exit("b", 1, 3, 1, 0);
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    /* 2nd in a row: waits restart_backoff_ms, then rdv_tick assigns it. */
    now += 100;
    from = rec.nsent;
    rank_exit("b", 2, 3, 1, 0);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "generation 3 starts in 1.0 s (restart backoff, failure 2 in a row)"));
    now += 900;
    beat("a", 2, 0, 2, PROTO_RANK_STOPPING, 1); /* frames meanwhile do not start it early */
    rdv_tick(&rdv, now);
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
    now += 100;
    rdv_tick(&rdv, now);
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 3, 2, 2, PROTO_RANK_RUNNING, 1);
    /* 3rd in a row: 2 s. */
    from = rec.nsent;
    rank_exit("a", 3, 0, 1, 0);
    now += 1999;
    rdv_tick(&rdv, now);
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
    now += 1;
    rdv_tick(&rdv, now);
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    beat("a", 4, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 4, 2, 2, PROTO_RANK_RUNNING, 1);
    /* A generation that runs restart_backoff_max_ms ends the streak: immediate again. */
    now += 8000;
    from = rec.nsent;
    rank_exit("a", 4, 1, 1, 0);
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
}
END_TEST

START_TEST(failures_are_classified)
{
    form_running(10);
    spec.restart_backoff_max_ms = 30000;
    int from = rec.nsent;
    rank_exit_said("b", 1, 2, 1, 0, "OSError: [Errno 28] No space left on device: '/ckpt/s100' (ckpt.py:40)", "");
    /* A full disk does not go away by itself: the longest wait, at once. */
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "starts in 30.0 s (the cause will not go away by itself"));
    json_t *st = rest_status(now);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(st, "last_failure"), "class")), "disk_full");
    json_decref(st);
    for (int i = 0; i < 30; i++) { /* the agents heartbeat while the generation waits */
        ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
        now += 1000;
        beat("a", 1, 0, 0, PROTO_RANK_EXITED, 0);
        beat("b", 1, 0, 0, PROTO_RANK_EXITED, 0);
        rdv_tick(&rdv, now);
    }
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 1);
    /* A program that cannot run: the job fails at once, restarts left or not. */
    rank_exit_said("a", 2, 1, 127, 0, "cannot run 'pyhton3': no such file or directory (the job's rank_cmd)", "");
    ck_assert_int_eq(rdv.state, RDV_FAILED);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "not retried"));
    ck_assert_int_eq(rdv.restarts, 1);

    struct proto_rank_exit x = {.exit_code = -1, .signal = 9};
    ck_assert_int_eq(failure_classify(&x), FAILURE_SIGNAL);
    x = (struct proto_rank_exit){.exit_code = 1};
    snprintf(x.reason, sizeof(x.reason), "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB");
    ck_assert_int_eq(failure_classify(&x), FAILURE_OOM);
    snprintf(x.reason, sizeof(x.reason), "RuntimeError: [gloo/transport/tcp/pair.cc:598] Connection closed by peer");
    ck_assert_int_eq(failure_classify(&x), FAILURE_COMM);
    snprintf(x.reason, sizeof(x.reason), "ValueError: bad shape");
    ck_assert_int_eq(failure_classify(&x), FAILURE_EXIT);
    x.exit_code = 2;
    snprintf(x.reason, sizeof(x.reason), "train.py: error: unrecognized arguments: --lrr");
    ck_assert_int_eq(failure_classify(&x), FAILURE_CONFIG);
}
END_TEST

START_TEST(restart_window_forgets_old_restarts)
{
    spec_window = 10;
    form_running(1);
    spec.restart_backoff_ms = 0;
    rank_exit("b", 1, 3, 1, 0);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 1);
    now += 11000; /* the first restart leaves the 10 s window */
    rank_exit("b", 2, 3, 1, 0);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_int_eq(rdv.restarts, 2);
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 3, 2, 2, PROTO_RANK_RUNNING, 1);
    now += 1000; /* the second is still in it */
    rank_exit("b", 3, 3, 1, 0);
    ck_assert_int_eq(rdv.state, RDV_FAILED);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "gave up after 1 restart in 10 s (max_restarts=1, restart_window_s=10)"));
}
END_TEST

/* rdv__set_state(&rdv, to), what it wrote to stderr meanwhile into said. */
static int set_state_said(enum rdv_job_state to, char *said, size_t cap)
{
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    fflush(stderr);
    const int keep = dup(STDERR_FILENO);
    ck_assert_int_ge(dup2(fileno(f), STDERR_FILENO), 0);
    const int rc = rdv__set_state(&rdv, to);
    fflush(stderr);
    dup2(keep, STDERR_FILENO);
    close(keep);
    rewind(f);
    said[fread(said, 1, cap - 1, f)] = '\0';
    fclose(f);
    return rc;
}

/* A job's life through the one setter of its state: each step a transition
 * of the machine (rdv.h), each refused one leaving the state as it was. */
START_TEST(job_state_changes_only_along_the_machine)
{
    char said[512];
    setup_spec(2, 3);
    ck_assert_int_eq(set_state_said(RDV_RUNNING, said, sizeof(said)), -EINVAL); /* not before forming */
    ck_assert_str_eq(rdv_job_state_name(rdv.state), "waiting");
    ck_assert_msg(strstr(said, "job t: refused state change waiting -> running (generation 0)"), "logged: %s", said);
    static const enum rdv_job_state life[] = {
        RDV_FORMING, RDV_RUNNING, RDV_RECOVERING, RDV_RECOVERING, /* a second failure before it ran */
        RDV_FORMING, /* every member back after a daemon restart, the generation was forming */
        RDV_RUNNING, RDV_COMPLETED,
    };
    for (size_t i = 0; i < sizeof(life) / sizeof(life[0]); i++) {
        ck_assert_int_eq(rdv__set_state(&rdv, life[i]), 0);
        ck_assert_str_eq(rdv_job_state_name(rdv.state), rdv_job_state_name(life[i]));
    }
    for (int to = RDV_WAITING; to <= RDV_FAILED; to++) { /* an ended job stays ended */
        ck_assert_int_eq(set_state_said((enum rdv_job_state)to, said, sizeof(said)), -EINVAL);
        ck_assert_str_eq(rdv_job_state_name(rdv.state), "completed");
    }
    ck_assert_int_eq(set_state_said((enum rdv_job_state)(RDV_FAILED + 1), said, sizeof(said)), -EINVAL);
    ck_assert_str_eq(rdv_job_state_name(rdv.state), "completed");
}
END_TEST

/* Every pair of states against the transitions rdv.h lists. */
START_TEST(job_state_machine_is_the_documented_one)
{
    static const struct {
        enum rdv_job_state from, to;
    } listed[] = {
        {RDV_WAITING, RDV_FORMING},       {RDV_WAITING, RDV_FAILED},        {RDV_WAITING, RDV_STOPPED},
        {RDV_WAITING, RDV_RECOVERING},    {RDV_WAITING, RDV_COMPLETED},     {RDV_FORMING, RDV_RUNNING},
        {RDV_FORMING, RDV_RECOVERING},    {RDV_RUNNING, RDV_RECOVERING},    {RDV_RECOVERING, RDV_RUNNING},
        {RDV_RECOVERING, RDV_FORMING},    {RDV_RECOVERING, RDV_RECOVERING}, {RDV_FORMING, RDV_COMPLETED},
        {RDV_RUNNING, RDV_COMPLETED},     {RDV_RECOVERING, RDV_COMPLETED},  {RDV_FORMING, RDV_STOPPED},
        {RDV_RUNNING, RDV_STOPPED},       {RDV_RECOVERING, RDV_STOPPED},    {RDV_FORMING, RDV_FAILED},
        {RDV_RUNNING, RDV_FAILED},        {RDV_RECOVERING, RDV_FAILED},
    };
    char said[512];
    setup_spec(2, 3);
    for (int from = RDV_WAITING; from <= RDV_FAILED; from++) {
        for (int to = RDV_WAITING; to <= RDV_FAILED; to++) {
            int want = 0;
            for (size_t i = 0; i < sizeof(listed) / sizeof(listed[0]); i++)
                want |= (int)listed[i].from == from && (int)listed[i].to == to;
            rdv.state = (enum rdv_job_state)from; /* the test places the job; rdv itself only uses the setter */
            int rc = set_state_said((enum rdv_job_state)to, said, sizeof(said));
            ck_assert_msg(rc == (want ? 0 : -EINVAL), "%s -> %s: %d, want %d", rdv_job_state_name(from),
                          rdv_job_state_name(to), rc, want ? 0 : -EINVAL);
            ck_assert_str_eq(rdv_job_state_name(rdv.state), rdv_job_state_name(want ? to : from));
        }
    }
}
END_TEST

/* rdv's per-state rank counters against a count of the rank table. */
static void assert_counters_exact(void)
{
    uint32_t n[RDV_RANK_NSTATES] = {0};
    for (uint32_t i = 0; i < rdv.world_size; i++)
        n[rdv.ranks[i].state]++;
    for (int s = 0; s < RDV_RANK_NSTATES; s++)
        ck_assert_msg(rdv.nranks_in[s] == n[s], "ranks %s: counter says %u, the table holds %u",
                      rdv_rank_state_name((enum rdv_rank_state)s), rdv.nranks_in[s], n[s]);
}

START_TEST(rank_counters_follow_every_state_change)
{
    setup_spec(2, 3);
    spec.restart_backoff_ms = 0; /* two failures in a row below: no wait between them */
    ck_assert_int_eq(join("b", 2, 0), 0);
    assert_counters_exact();
    ck_assert_int_eq(join("a", 2, 0), 0);
    assert_counters_exact();
    ck_assert_uint_eq(rdv.nranks_in[RDV_RANK_STARTING], 4);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 1);
    assert_counters_exact();
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    beat("b", 1, 2, 1, PROTO_RANK_RUNNING, 1);
    beat("b", 1, 3, 1, PROTO_RANK_STARTING, 0);
    assert_counters_exact();
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_uint_eq(rdv.nranks_in[RDV_RANK_RUNNING], 4);
    assert_counters_exact();
    /* An exit opens generation 2: every rank pending, then starting once assigned. */
    rank_exit("b", 1, 3, 1, 0);
    ck_assert_uint_eq(rdv.generation, 2);
    assert_counters_exact();
    ck_assert_uint_eq(rdv.nranks_in[RDV_RANK_STARTING], 4);
    /* A lost node during recovery, then its return. */
    rdv_disconnected(&rdv, "a", "connection closed", now);
    assert_counters_exact();
    ck_assert_int_eq(join("a", 2, 2), 0);
    assert_counters_exact();
    beat("a", rdv.generation, 0, 2, PROTO_RANK_RUNNING, 2);
    beat("b", rdv.generation, 2, 2, PROTO_RANK_RUNNING, 2);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    assert_counters_exact();
    /* Ranks finish one by one; the job completes when the counter says all did. */
    for (uint32_t r = 0; r < 4; r++) {
        ck_assert_int_eq(rdv.state, RDV_RUNNING);
        rank_exit(r < 2 ? "a" : "b", rdv.generation, r, 0, 0);
        assert_counters_exact();
    }
    ck_assert_int_eq(rdv.state, RDV_COMPLETED);
    ck_assert_uint_eq(rdv.nranks_in[RDV_RANK_COMPLETED], 4);
}
END_TEST

START_TEST(rank_counters_survive_stop_restore_and_shrink)
{
    form_running(3);
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_RESTART, NULL, now), 0);
    assert_counters_exact();
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_STOP, NULL, now), 0);
    assert_counters_exact();
    rank_exit("a", rdv.generation, 0, -1, 15);
    assert_counters_exact();

    /* A restored job: every rank starting until members say otherwise. */
    static struct rdv_saved saved;
    rdv_free(&rdv); /* the job above; form_running sets up a new one */
    form_running(3);
    rdv_save(&rdv, &saved);
    rdv_free(&rdv);
    setup_spec(2, 3);
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    assert_counters_exact();
    ck_assert_uint_eq(rdv.nranks_in[RDV_RANK_STARTING], 4);
    ck_assert_int_eq(join("a", 2, 1), 0);
    ck_assert_int_eq(join("b", 2, 1), 0);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 3);
    assert_counters_exact();

    /* A member that stays away: the job shrinks and the table is rebuilt. */
    rdv_free(&rdv);
    setup_spec(2, 3);
    spec.min_nodes = 1;
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(join("a", 2, 0), 0);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 1);
    rdv_disconnected(&rdv, "b", "connection closed", now);
    now += (uint64_t)spec.rejoin_timeout_ms + 1;
    beat("a", rdv.generation, 0, 2, PROTO_RANK_RUNNING, 1);
    rdv_tick(&rdv, now);
    ck_assert_uint_eq(rdv.world_size, 2);
    assert_counters_exact();
}
END_TEST

static int find_index(const char *name)
{
    uintptr_t idx;
    return namemap_get(&rdv.byname, name, &idx) == 0 ? (int)idx : -1;
}

/* The node table is found by name through a hash: joins, losses before
 * formation (entries move) and drains keep every name findable. */
START_TEST(node_lookup_by_name_survives_removals)
{
    char name[16];
    setup_spec(300, 3);
    for (int i = 0; i < 200; i++) {
        snprintf(name, sizeof(name), "n%03d", i);
        ck_assert_int_eq(join(name, 1, 0), 0);
    }
    ck_assert_uint_eq(rdv.byname.count, 200);
    /* Lose every third node while waiting: the last entry moves into each hole. */
    for (int i = 0; i < 200; i += 3) {
        snprintf(name, sizeof(name), "n%03d", i);
        rdv_disconnected(&rdv, name, "connection closed", now);
    }
    ck_assert_int_eq(rdv_admin(&rdv, RDV_ADMIN_DRAIN, "n001", now), 0);
    ck_assert_uint_eq(rdv.byname.count, rdv.nnodes);
    for (uint32_t i = 0; i < rdv.nnodes; i++) {
        uintptr_t idx = 99999;
        ck_assert_int_eq(namemap_get(&rdv.byname, rdv.nodes[i].name, &idx), 0);
        ck_assert_uint_eq(idx, i);
    }
    for (int i = 0; i < 200; i++) {
        uintptr_t idx;
        snprintf(name, sizeof(name), "n%03d", i);
        ck_assert_int_eq(namemap_get(&rdv.byname, name, &idx), (i % 3 == 0 || i == 1) ? -ENOENT : 0);
    }
    /* Lost names may join again; a connected name is still refused as a duplicate. */
    ck_assert_int_eq(join("n000", 1, 0), 0);
    ck_assert_int_ne(join("n002", 1, 0), 0);
    ck_assert_str_eq(last_reject_code(), "duplicate");
    /* Frames reach the right node after the moves: a heartbeat refreshes its own entry only. */
    uint32_t k = (uint32_t)find_index("n199");
    now += 50;
    beat("n199", 0, 0, 0, PROTO_RANK_RUNNING, 0);
    ck_assert_uint_eq(rdv.nodes[k].last_seen_ms, now);
}
END_TEST

START_TEST(namemap_deletes_without_losing_colliding_names)
{
    /* A small table (64 entries in 128 slots) churned until clusters wrap:
     * after every step it holds exactly what a plain array says it should. */
    struct namemap m;
    char name[16];
    uintptr_t v;
    int want[97];
    memset(want, 0, sizeof(want));
    ck_assert_int_eq(namemap_init(&m, 64), 0);
    for (int round = 0; round < 200; round++) {
        int k = (round * 31 + 7) % 97;
        snprintf(name, sizeof(name), "x%d", k);
        if (want[k] || m.count < 64) {
            ck_assert_int_eq(namemap_put(&m, name, (uintptr_t)round), 0);
            want[k] = round + 1;
        } else {
            ck_assert_int_eq(namemap_put(&m, name, 1), -ENOSPC);
        }
        int d = (round * 13) % 97;
        if (round % 3 == 2) {
            snprintf(name, sizeof(name), "x%d", d);
            ck_assert_int_eq(namemap_del(&m, name), want[d] ? 0 : -ENOENT);
            want[d] = 0;
        }
        for (int i = 0; i < 97; i++) {
            snprintf(name, sizeof(name), "x%d", i);
            int rc = namemap_get(&m, name, &v);
            ck_assert_msg(rc == (want[i] ? 0 : -ENOENT), "round %d: x%d %s", round, i, want[i] ? "lost" : "ghost");
            if (want[i])
                ck_assert_uint_eq(v, (uintptr_t)(want[i] - 1));
        }
    }
    char longname[NAMEMAP_KEY_MAX + 1];
    memset(longname, 'y', sizeof(longname) - 1);
    longname[NAMEMAP_KEY_MAX] = '\0';
    ck_assert_int_eq(namemap_put(&m, longname, 1), -ENAMETOOLONG);
    namemap_free(&m);
}
END_TEST

/* ---- fitness: pre-flight and the plan (daemon/fitness.h) ---- */

/* HELLO of a node that promises a PREFLIGHT; gpu_mb > 0: a GPU node with that much per GPU. */
static int join_checked(const char *name, uint32_t ndev, uint64_t gpu_mb)
{
    struct proto_hello h;
    char code[32], reason[PROTO_REASON_MAX];
    hello_of(&h, name, ndev, 0);
    h.preflight = 1;
    h.host_mem_mb = 65536;
    if (gpu_mb) {
        h.kind = PROTO_DEV_GPU;
        h.ngpus = ndev;
        for (uint32_t i = 0; i < ndev; i++)
            h.gpus[i] = (struct proto_gpu){"NVIDIA Test GPU", gpu_mb, gpu_mb};
    }
    return rdv_join(&rdv, &h, now, code, reason);
}

static void preflight(const char *node, int fit, const char *reason)
{
    struct proto_msg m = {.type = PROTO_PREFLIGHT};
    m.u.preflight.fit = fit;
    m.u.preflight.trainer = 1;
    snprintf(m.u.preflight.reason, sizeof(m.u.preflight.reason), "%s", reason);
    rdv_message(&rdv, node, &m, now);
}

/* /v1/nodes' node name, its key as a string ("" when absent or not a string). */
static void node_field(const char *name, const char *key, char *out, size_t len)
{
    json_t *st = rest_status(now), *n;
    size_t i;
    out[0] = '\0';
    json_array_foreach(json_object_get(st, "nodes"), i, n)
        if (strcmp(json_string_value(json_object_get(n, "name")), name) == 0 &&
            json_string_value(json_object_get(n, key)))
            snprintf(out, len, "%s", json_string_value(json_object_get(n, key)));
    json_decref(st);
}

/* The health /v1/status gives node name among its unhealthy nodes ("" when not there). */
static const char *unhealthy_as(const char *name)
{
    static char health[16];
    json_t *st = rest_status(now), *n;
    size_t i;
    health[0] = '\0';
    json_array_foreach(json_object_get(st, "unhealthy_nodes"), i, n)
        if (strcmp(json_string_value(json_object_get(n, "name")), name) == 0)
            snprintf(health, sizeof(health), "%s", json_string_value(json_object_get(n, "health")));
    json_decref(st);
    return health;
}

static int has_event_with(const char *kind, const char *text)
{
    for (uint64_t i = 0; i < rdv.nevents && i < RDV_EVENTS; i++)
        if (strcmp(rdv.events[i].kind, kind) == 0 && strstr(rdv.events[i].message, text))
            return 1;
    return 0;
}

START_TEST(unfit_node_holds_formation_without_spending_restarts)
{
    char v[PROTO_REASON_MAX];
    setup_spec(2, 3);
    ck_assert_int_eq(join_checked("a", 1, 0), 0);
    ck_assert_int_eq(join_checked("b", 1, 0), 0);
    ck_assert_int_eq(rdv.state, RDV_WAITING); /* both still checking */
    ck_assert_ptr_nonnull(strstr(rdv.reason, "pre-flight checks"));
    node_field("a", "fit", v, sizeof(v));
    ck_assert_str_eq(v, "checking");
    preflight("a", 1, "");
    preflight("b", 0, "data d.bin: No such file or directory");
    ck_assert_int_eq(rdv.state, RDV_WAITING);
    ck_assert_uint_eq(rdv.generation, 0);
    ck_assert_uint_eq(rdv.restarts, 0);
    ck_assert_str_eq(rdv.reason, "waiting for node b: unfit: data d.bin: No such file or directory");
    node_field("b", "fit", v, sizeof(v));
    ck_assert_str_eq(v, "unfit");
    node_field("b", "unfit_reason", v, sizeof(v));
    ck_assert_str_eq(v, "data d.bin: No such file or directory");
    ck_assert(has_event_with("node_unfit", "node b is unfit: data d.bin"));
    ck_assert_str_eq(unhealthy_as("b"), "unfit");
    int from = rec.nsent;
    preflight("b", 1, "");
    ck_assert_uint_eq(rdv.generation, 1);
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(find_sent(from, "b", PROTO_ASSIGN));
    ck_assert_uint_eq(rdv.restarts, 0);
    ck_assert(has_event_with("node_fit", "node b is fit"));
}
END_TEST

START_TEST(unfit_reason_with_control_characters_reaches_no_terminal_raw)
{
    char v[PROTO_REASON_MAX];
    setup_spec(2, 3);
    ck_assert_int_eq(join_checked("a", 1, 0), 0);
    ck_assert_int_eq(join_checked("b", 1, 0), 0);
    preflight("a", 1, "");
    /* the job's require_readable path holds an escape sequence, a newline and a C1 CSI */
    preflight("b", 0, "require_readable /d\x1b]0;owned\x07\n\xc2\x9b" "2J\x7f\xff: No such file or directory");
    node_field("b", "unfit_reason", v, sizeof(v));
    ck_assert_str_eq(v, "require_readable /d ]0;owned    2J ?: No such file or directory");
    ck_assert(has_event_with("node_unfit", "node b is unfit: require_readable /d ]0;owned    2J ?: No such"));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "/d ]0;owned    2J ?: No such"));
    /* a reason as long as PREFLIGHT allows, not ASCII: cut to fit the job's, still UTF-8 */
    char longer[PROTO_REASON_MAX] = "require_readable /x"; /* odd: the cut falls mid-character */
    while (strlen(longer) + 2 < sizeof(longer))
        strcat(longer, "\xc3\xa9");
    preflight("b", 0, longer);
    json_t *st = rest_status(now);
    const char *why = json_string_value(json_object_get(st, "reason"));
    ck_assert_ptr_nonnull(why);
    ck_assert_ptr_nonnull(strstr(why, "unfit: require_readable /x\xc3\xa9"));
    json_decref(st);
    preflight("b", 0, "require_readable /d\x1b]0;owned\x07\n\xc2\x9b" "2J\x7f\xff: No such file or directory");
    uint64_t events = rdv.nevents;
    preflight("b", 0, "require_readable /d\x1b]0;owned\x07\n\xc2\x9b" "2J\x7f\xff: No such file or directory");
    ck_assert_uint_eq(rdv.nevents, events); /* the same reason again: no new event */
}
END_TEST

/* A fit PREFLIGHT of a rank_cmd node that read its latest checkpoint ("" = none there). */
static void preflight_ckpt(const char *node, const char *checkpoint)
{
    struct proto_msg m = {.type = PROTO_PREFLIGHT};
    m.u.preflight.fit = 1;
    m.u.preflight.has_checkpoint = 1;
    snprintf(m.u.preflight.checkpoint, sizeof(m.u.preflight.checkpoint), "%s", checkpoint);
    rdv_message(&rdv, node, &m, now);
}

/* A 2-node rank_cmd job that compares checkpoints by rule; nodes a and b joined, their pre-flight pending. */
static void ckpt_job(const char *rule)
{
    setup_spec(2, 3);
    spec.restart_backoff_ms = 0;
    ck_assert_int_eq(cmdline_from_string("python3 train.py", spec.rank_cmd, sizeof(spec.rank_cmd)), 0);
    snprintf(spec.checkpoint_dir, sizeof(spec.checkpoint_dir), "ckpt");
    snprintf(spec.checkpoint_latest, sizeof(spec.checkpoint_latest), "%s", rule);
    ck_assert_int_eq(join_checked("a", 1, 0), 0);
    ck_assert_int_eq(join_checked("b", 1, 0), 0);
}

/* Node's heartbeat naming its complete memory checkpoints (n of mem, oldest first) and, nd >= 0, the nd of
 * drained it drained to checkpoint_dir. */
static void beat_drained(const char *node, uint64_t generation, uint32_t n, const char *const *mem, int nd,
                         const char *const *drained)
{
    struct proto_msg *m = heartbeat_msg(0);
    m->u.heartbeat.generation = generation;
    m->u.heartbeat.free_port = node_port(node);
    m->u.heartbeat.has_memckpt = 1;
    m->u.heartbeat.nmemckpt = n;
    for (uint32_t i = 0; i < n; i++)
        snprintf(m->u.heartbeat.memckpt[i], sizeof(m->u.heartbeat.memckpt[i]), "%s", mem[i]);
    m->u.heartbeat.has_drained = nd >= 0;
    m->u.heartbeat.ndrained = nd >= 0 ? (uint32_t)nd : 0;
    for (int i = 0; i < nd; i++)
        snprintf(m->u.heartbeat.drained[i], sizeof(m->u.heartbeat.drained[i]), "%s", drained[i]);
    rdv_message(&rdv, node, m, now);
}

static void beat_mem(const char *node, uint64_t generation, uint32_t n, const char *const *names)
{
    beat_drained(node, generation, n, names, -1, NULL);
}

/* memory_checkpoint_mb: ASSIGN names the newest checkpoint every member holds, once every
 * member has said what it holds; status shows each node's newest and the common one. */
START_TEST(memory_checkpoint_common_to_every_member_goes_in_assign)
{
    setup_spec(2, 3);
    spec.memory_checkpoint_mb = 64;
    spec.restart_backoff_ms = 0;
    int from = rec.nsent;
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(join("a", 2, 0), 0);
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN)); /* no member has said what it holds */
    ck_assert_ptr_nonnull(strstr(rdv.reason, "to report its memory checkpoints"));
    char common[PROTO_CKPT_NAME_MAX];
    ck_assert_int_eq(rdv_memckpt_common(&rdv, common, sizeof(common)), -1);
    beat_mem("a", 0, 0, NULL);
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN)); /* b has not said */
    beat_mem("b", 0, 0, NULL);
    const struct proto_msg *as = find_sent(from, "a", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.has_memckpt, 1);
    ck_assert_str_eq(as->u.assign.memckpt, ""); /* none on every node: each starts afresh */
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 11);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 11);
    static const char *const a_has[] = {"step5", "step10", "step15"}, *const b_has[] = {"step5", "step10"};
    beat_mem("a", 1, 3, a_has);
    beat_mem("b", 1, 2, b_has);
    ck_assert_int_eq(rdv_memckpt_common(&rdv, common, sizeof(common)), 1);
    ck_assert_str_eq(common, "step10");
    json_t *st = rest_status(now);
    json_t *mem = json_object_get(st, "memory_checkpoint");
    ck_assert_str_eq(json_string_value(json_object_get(mem, "common")), "step10");
    ck_assert_int_eq(json_integer_value(json_object_get(mem, "common_step")), 10);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(mem, "nodes"), "a")), "step15");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(mem, "nodes"), "b")), "step10");
    json_decref(st);
    from = rec.nsent;
    rank_exit("b", 1, 3, -1, 9);
    as = find_sent(from, "a", PROTO_ASSIGN);
    const struct proto_msg *bs = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_ptr_nonnull(bs);
    ck_assert_int_eq(as->u.assign.has_memckpt, 1);
    ck_assert_str_eq(as->u.assign.memckpt, "step10");
    ck_assert_str_eq(bs->u.assign.memckpt, "step10");
    ck_assert(has_event_with("memory_resumed", "generation 2 resumed from memory checkpoint step 10 "
                                                           "(step10, the newest complete on all 2 nodes)"));
    /* none in common: ASSIGN says so ("" : every node starts afresh) */
    static const char *const b_other[] = {"step3"};
    beat_mem("b", 2, 1, b_other);
    ck_assert_int_eq(rdv_memckpt_common(&rdv, common, sizeof(common)), 0);
    ck_assert_str_eq(common, "");
    /* a job without memory checkpoints: nothing in ASSIGN or status, lists or not */
    spec.memory_checkpoint_mb = 0;
    st = rest_status(now);
    ck_assert(json_is_null(json_object_get(st, "memory_checkpoint")));
    json_decref(st);
}
END_TEST

/* A member that never reports its memory checkpoints holds the generation for heartbeat_timeout_ms, no longer. */
START_TEST(memory_checkpoint_report_is_waited_for_a_bounded_time)
{
    setup_spec(2, 3);
    spec.memory_checkpoint_mb = 64;
    int from = rec.nsent;
    ck_assert_int_eq(join("a", 1, 0), 0);
    ck_assert_int_eq(join("b", 1, 0), 0);
    beat_mem("a", 0, 0, NULL);
    ck_assert_ptr_null(find_sent(from, "b", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "waiting for node b to report its memory checkpoints"));
    now += (uint64_t)spec.heartbeat_timeout_ms;
    rdv_tick(&rdv, now);
    const struct proto_msg *bs = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(bs);
    ck_assert_int_eq(bs->u.assign.has_memckpt, 0); /* none named: each node keeps what it has */
}
END_TEST

/* The events of kind so far, the last one's message in last (when any). */
static int events_of(const char *kind, const char **last)
{
    int n = 0;
    for (uint64_t i = 0; i < rdv.nevents && i < RDV_EVENTS; i++)
        if (strcmp(rdv.events[i].kind, kind) == 0) {
            n++;
            *last = rdv.events[i].message;
        }
    return n;
}

/* HEARTBEAT spare_note: one event warm_spare_unfit per new note, none for the same one again or for none. */
START_TEST(spare_note_becomes_an_event)
{
    setup_spec(1, 1);
    ck_assert_int_eq(join("a", 1, 0), 0);
    const char *last = NULL;
    const char *notes[] = {"importing cupy (warm_imports) touched the CUDA driver (libcuda.so.1 mapped)",
                           "importing cupy (warm_imports) touched the CUDA driver (libcuda.so.1 mapped)", "",
                           "importing torch touched the CUDA driver (torch.cuda initialised)"};
    const int after[] = {1, 1, 1, 2};
    for (size_t i = 0; i < sizeof(notes) / sizeof(notes[0]); i++) {
        struct proto_msg *m = heartbeat_msg(0);
        snprintf(m->u.heartbeat.spare_note, sizeof(m->u.heartbeat.spare_note), "%s", notes[i]);
        rdv_message(&rdv, "a", m, now);
        ck_assert_int_eq(events_of("warm_spare_unfit", &last), after[i]);
    }
    ck_assert_str_eq(last, "node a: warm spare: importing torch touched the CUDA driver (torch.cuda initialised)");
}
END_TEST

/* An agent that changes its spare_note in every heartbeat: RDV_SPARE_NOTES events a window, the rest held
 * back and counted in the first event of the next window; the event ring keeps the other events. */
START_TEST(spare_note_flood_is_held_back)
{
    setup_spec(1, 1);
    ck_assert_int_eq(join("a", 1, 0), 0);
    int before = (int)rdv.nevents;
    const char *last = NULL;
    for (int i = 0; i < 3 * RDV_EVENTS; i++) {
        struct proto_msg *m = heartbeat_msg(0);
        snprintf(m->u.heartbeat.spare_note, sizeof(m->u.heartbeat.spare_note), "note %d", i);
        m->u.heartbeat.no_ack = 1;
        rdv_message(&rdv, "a", m, now);
        now += 10;
    }
    ck_assert_int_eq(events_of("warm_spare_unfit", &last), RDV_SPARE_NOTES);
    ck_assert_int_eq((int)rdv.nevents - before, RDV_SPARE_NOTES);
    ck_assert_str_eq(last, "node a: warm spare: note 3");
    now += RDV_SPARE_NOTE_WINDOW_MS;
    struct proto_msg *m = heartbeat_msg(0);
    snprintf(m->u.heartbeat.spare_note, sizeof(m->u.heartbeat.spare_note), "the last");
    rdv_message(&rdv, "a", m, now);
    ck_assert_int_eq(events_of("warm_spare_unfit", &last), RDV_SPARE_NOTES + 1);
    char want[128];
    snprintf(want, sizeof(want), "node a: warm spare: the last (%d earlier notes held back)",
             3 * RDV_EVENTS - RDV_SPARE_NOTES);
    ck_assert_str_eq(last, want);
}
END_TEST

/* A holder's heartbeat: what it holds of whose. */
static void beat_replicas(const char *node, uint64_t generation, const char *of, uint32_t n, const char *const *names)
{
    struct proto_msg *m = heartbeat_msg(0);
    m->u.heartbeat.generation = generation;
    m->u.heartbeat.free_port = node_port(node);
    snprintf(m->u.heartbeat.replica_of, sizeof(m->u.heartbeat.replica_of), "%s", of);
    m->u.heartbeat.nreplica = n;
    for (uint32_t i = 0; i < n; i++)
        snprintf(m->u.heartbeat.replica[i], sizeof(m->u.heartbeat.replica[i]), "%s", names[i]);
    rdv_message(&rdv, node, m, now);
}

static void mem_file(const char *from_node, const char *owner, int restore)
{
    struct proto_msg m = {.type = PROTO_MEM_FILE};
    snprintf(m.u.mem_file.owner, sizeof(m.u.mem_file.owner), "%s", owner);
    snprintf(m.u.mem_file.tag, sizeof(m.u.mem_file.tag), "step10");
    snprintf(m.u.mem_file.path, sizeof(m.u.mem_file.path), "rank1.bin");
    m.u.mem_file.restore = restore;
    m.u.mem_file.size = 10;
    rdv_message(&rdv, from_node, &m, now);
}

/* The buddy map, the relay's rules, and a replaced node resuming from its buddy's copy. */
START_TEST(memory_checkpoint_replica_comes_from_the_buddy)
{
    setup_spec(3, 3);
    spec.memory_checkpoint_mb = 64;
    spec.restart_backoff_ms = 0;
    spec.batch = 3;
    int from = rec.nsent;
    ck_assert_int_eq(join("c", 1, 0), 0);
    ck_assert_int_eq(join("a", 1, 0), 0);
    ck_assert_int_eq(join("b", 1, 0), 0);
    /* next member in name order: a -> b -> c -> a */
    ck_assert_str_eq(rdv.nodes[rdv__buddy(&rdv, (uint32_t)find_index("a"))].name, "b");
    ck_assert_str_eq(rdv.nodes[rdv__buddy(&rdv, (uint32_t)find_index("b"))].name, "c");
    ck_assert_str_eq(rdv.nodes[rdv__buddy(&rdv, (uint32_t)find_index("c"))].name, "a");
    static const char *const has[] = {"step5", "step10"};
    beat_mem("a", 0, 2, has);
    beat_mem("b", 0, 2, has);
    beat_mem("c", 0, 2, has);
    beat_replicas("c", 0, "b", 2, has); /* c holds b's */
    ck_assert_msg(find_sent(from, "a", PROTO_ASSIGN) != NULL, "no ASSIGN: %s", rdv.reason);
    json_t *st = rest_status(now);
    json_t *reps = json_object_get(json_object_get(st, "memory_checkpoint"), "replicas");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(reps, "b"), "buddy")), "c");
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(reps, "b"), "newest")), "step10");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(reps, "b"), "lag_steps")), 0);
    ck_assert(json_is_null(json_object_get(json_object_get(reps, "a"), "lag_steps"))); /* b holds none of a's */
    json_decref(st);
    static const char *const b_more[] = {"step10", "step15"};
    beat_mem("b", 1, 2, b_more);
    st = rest_status(now);
    reps = json_object_get(json_object_get(st, "memory_checkpoint"), "replicas");
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(reps, "b"), "lag_steps")), 5);
    json_decref(st);
    beat_mem("b", 1, 2, has);

    /* the relay: b's own replica to its buddy c; nothing else passes */
    int mark = rec.nsent;
    mem_file("b", "b", 0);
    const struct proto_msg *f = find_sent(mark, "c", PROTO_MEM_FILE);
    ck_assert_ptr_nonnull(f);
    ck_assert_str_eq(f->u.mem_file.owner, "b");
    mark = rec.nsent;
    mem_file("b", "a", 0); /* another node's files as a replica */
    mem_file("a", "b", 1); /* a restore from a node that holds none of b's */
    ck_assert_int_eq(rec.nsent, mark);

    /* b is replaced: a fresh agent holds nothing; its step10 comes from c */
    rdv_disconnected(&rdv, "b", "connection closed", now);
    from = rec.nsent;
    ck_assert_int_eq(join("b", 1, 0), 0);
    beat_mem("a", 1, 2, has); /* rank 0's node: its next free port */
    beat_mem("b", 0, 0, NULL);
    const struct proto_msg *bs = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_msg(bs != NULL, "no ASSIGN: %s", rdv.reason);
    ck_assert_str_eq(bs->u.assign.memckpt, "step10");
    ck_assert_str_eq(bs->u.assign.memckpt_from, "c");
    const struct proto_msg *q = find_sent(from, "c", PROTO_MEM_FETCH);
    ck_assert_ptr_nonnull(q);
    ck_assert_str_eq(q->u.mem_fetch.owner, "b");
    ck_assert_str_eq(q->u.mem_fetch.tag, "step10");
    const struct proto_msg *as = find_sent(from, "a", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_str_eq(as->u.assign.memckpt_from, ""); /* a has its own */
    ck_assert(has_event_with("memory_resumed", "resumed from memory checkpoint step 10 (step10, the newest complete "
                                               "on all 3 nodes; node b's files from node c)"));
    mark = rec.nsent;
    mem_file("c", "b", 1); /* the holder gives them back: to b */
    ck_assert_ptr_nonnull(find_sent(mark, "b", PROTO_MEM_FILE));
}
END_TEST

/* memory_checkpoint_drain_steps: a drain is an event and in status; nodes that lost their memory copies and
 * their buddies' resume from the newest checkpoint drained on every node, and ASSIGN says to copy it back. */
START_TEST(memory_checkpoint_drained_is_resumed_when_memory_is_lost)
{
    setup_spec(2, 3);
    spec.memory_checkpoint_mb = 64;
    spec.memory_checkpoint_drain_steps = 10;
    snprintf(spec.checkpoint_dir, sizeof(spec.checkpoint_dir), "ckpt");
    spec.restart_backoff_ms = 0;
    int from = rec.nsent;
    ck_assert_int_eq(join("a", 1, 0), 0);
    ck_assert_int_eq(join("b", 1, 0), 0);
    beat_drained("a", 0, 0, NULL, 0, NULL);
    beat_drained("b", 0, 0, NULL, 0, NULL);
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    static const char *const mem[] = {"step20", "step25"}, *const d10[] = {"step10"},
                             *const d20[] = {"step10", "step20"}, *const a_d[] = {"step20", "step30"};
    beat_drained("a", 1, 2, mem, 1, d10);
    beat_drained("b", 1, 2, mem, 1, d10);
    ck_assert(has_event_with("memory_drained", "node b drained memory checkpoint step 10 (step10) to checkpoint_dir"));
    beat_drained("a", 1, 2, mem, 2, d20);
    beat_drained("b", 1, 2, mem, 2, d20);
    json_t *st = rest_status(now);
    json_t *dr = json_object_get(json_object_get(st, "memory_checkpoint"), "drained");
    ck_assert_str_eq(json_string_value(json_object_get(dr, "b")), "step20");
    json_decref(st);
    /* both nodes lost with their memory; the fresh agents hold none in memory, a drained step30 alone */
    rdv_disconnected(&rdv, "a", "connection closed", now);
    rdv_disconnected(&rdv, "b", "connection closed", now);
    from = rec.nsent;
    ck_assert_int_eq(join("a", 1, 0), 0);
    ck_assert_int_eq(join("b", 1, 0), 0);
    beat_drained("a", 0, 0, NULL, 2, a_d);
    uint64_t events = rdv.nevents;
    beat_drained("b", 0, 0, NULL, 2, d20);
    const struct proto_msg *as = find_sent(from, "a", PROTO_ASSIGN), *bs = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_msg(as != NULL && bs != NULL, "no ASSIGN: %s", rdv.reason);
    ck_assert_str_eq(as->u.assign.memckpt, "step20"); /* the newest drained on both, not a's step30 */
    ck_assert_int_eq(as->u.assign.memckpt_drained, 1);
    ck_assert_int_eq(bs->u.assign.memckpt_drained, 1);
    ck_assert_str_eq(bs->u.assign.memckpt_from, "");
    ck_assert(has_event_with("memory_resumed", "resumed from the drained durable checkpoint step 20 (step20 in "
                                               "checkpoint_dir, the newest complete on all 2 nodes"));
    ck_assert(!has_event_with("memory_drained", "node a drained memory checkpoint step 30")); /* a new agent's list */
    ck_assert_uint_ge(rdv.nevents, events);
    /* a node that still has it in memory uses that: only the other copies back */
    uint64_t g = rdv.generation;
    beat("a", g, 0, 1, PROTO_RANK_RUNNING, 21);
    beat("b", g, 1, 1, PROTO_RANK_RUNNING, 21);
    static const char *const a_mem[] = {"step20"};
    beat_drained("a", g, 1, a_mem, 2, a_d);
    from = rec.nsent;
    rank_exit("b", g, 1, -1, 9);
    as = find_sent(from, "a", PROTO_ASSIGN);
    bs = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_ptr_nonnull(bs);
    ck_assert_int_eq(as->u.assign.memckpt_drained, 0);
    ck_assert_int_eq(bs->u.assign.memckpt_drained, 1);
    ck_assert(has_event_with("memory_resumed", "resumed from memory checkpoint step 20 (step20, the newest complete "
                                               "on all 2 nodes; node b's files from its drained copy in checkpoint_dir)"));
}
END_TEST

START_TEST(diverging_checkpoints_hold_the_generation_naming_each_node)
{
    ckpt_job("file:latest");
    int from = rec.nsent;
    preflight_ckpt("a", "global_step40");
    preflight_ckpt("b", "");
    ck_assert_uint_eq(rdv.generation, 1); /* opened, not assigned */
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert_ptr_null(find_sent(from, "b", PROTO_ASSIGN));
    ck_assert_uint_eq(rdv.restarts, 0);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "checkpoint_dir differs between nodes: node a has global_step40, "
                                             "node b has none; copy the latest checkpoint"));
    ck_assert(has_event_with("checkpoint_diverged", "node a has global_step40, node b has none"));
    uint64_t events = rdv.nevents;
    preflight_ckpt("b", ""); /* the same again, every 2 s: one event */
    ck_assert_uint_eq(rdv.nevents, events);
    preflight_ckpt("b", "global_step40"); /* the operator copied it */
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(find_sent(from, "b", PROTO_ASSIGN));
    /* what they have changes as the generation runs: its reports are not kept for the next */
    ck_assert_int_eq(rdv.nodes[find_index("a")].has_checkpoint, 0);
}
END_TEST

START_TEST(checkpoints_a_job_does_not_ask_for_are_not_compared)
{
    ckpt_job("file:latest");
    spec.checkpoint_latest[0] = '\0'; /* an agent (an old build, a forged one) sends them anyway */
    int from = rec.nsent;
    preflight_ckpt("a", "global_step40");
    preflight_ckpt("b", "");
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(find_sent(from, "b", PROTO_ASSIGN));
    ck_assert(!has_event_with("checkpoint_diverged", "node a"));
}
END_TEST

START_TEST(long_checkpoint_names_cut_short_stay_utf8)
{
    ckpt_job("file:latest");
    char a[PROTO_CKPT_NAME_MAX] = "", b[PROTO_CKPT_NAME_MAX] = "";
    for (int i = 0; i < 100; i++) { /* 200 bytes each: the reason cannot hold both */
        strcat(a, "\xc3\xa9");
        strcat(b, "\xc3\xbc");
    }
    preflight_ckpt("a", a);
    preflight_ckpt("b", b);
    json_t *st = rest_status(now); /* a reason that is not UTF-8 would not be JSON */
    const char *reason = json_string_value(json_object_get(st, "reason"));
    ck_assert_ptr_nonnull(reason);
    ck_assert_ptr_nonnull(strstr(reason, "checkpoint_dir differs between nodes: node a has \xc3\xa9"));
    json_decref(st);
    ck_assert(has_event_with("checkpoint_diverged", "node a has"));
}
END_TEST

START_TEST(diverging_checkpoints_may_be_accepted)
{
    ckpt_job("glob:step_*");
    spec.checkpoint_diverged_ok = 1;
    int from = rec.nsent;
    preflight_ckpt("a", "step_2");
    preflight_ckpt("b", "step_1");
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert(has_event_with("checkpoint_diverged", "node a has step_2, node b has step_1; starting anyway"));
}
END_TEST

START_TEST(after_a_failure_fresh_starters_report_their_checkpoint_again)
{
    ckpt_job("file:latest");
    preflight_ckpt("a", "");
    preflight_ckpt("b", "");
    beat("a", 1, 0, 1, PROTO_RANK_RUNNING, 50);
    beat("b", 1, 1, 1, PROTO_RANK_RUNNING, 50);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    /* rank 1 dies; every rank restarts from its node's checkpoint_dir (none rejoins in place) */
    int from = rec.nsent;
    rank_exit("b", 1, 1, 1, 0);
    ck_assert_uint_eq(rdv.generation, 2);
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "to report its latest checkpoint"));
    preflight_ckpt("a", "global_step40");
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN)); /* b has not said yet */
    preflight_ckpt("b", ""); /* its checkpoint_dir was lost: it would start from step 0 */
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert(has_event_with("checkpoint_diverged", "node a has global_step40, node b has none"));
    ck_assert_uint_eq(rdv.restarts, 1); /* the failure's restart, no more */
    preflight_ckpt("b", "global_step40");
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
    ck_assert_ptr_nonnull(find_sent(from, "b", PROTO_ASSIGN));

    /* generation 3: b's report goes astray; after heartbeat_timeout_ms it is not waited for */
    beat("a", 2, 0, 1, PROTO_RANK_RUNNING, 60);
    beat("b", 2, 1, 1, PROTO_RANK_RUNNING, 60);
    from = rec.nsent;
    rank_exit("a", 2, 0, 1, 0);
    preflight_ckpt("a", "global_step60");
    ck_assert_ptr_null(find_sent(from, "a", PROTO_ASSIGN));
    for (int i = 0; i < 2; i++) { /* b is alive (it beats), its report just never comes */
        now += (uint64_t)spec.heartbeat_timeout_ms / 2 + 1;
        beat("a", 2, 0, 0, PROTO_RANK_RUNNING, 0);
        beat("b", 2, 1, 0, PROTO_RANK_RUNNING, 0);
        rdv_tick(&rdv, now);
    }
    ck_assert_msg(has_event_with("checkpoint_unreported", "node b did not report its latest checkpoint"),
                  "reason: %s", rdv.reason);
    ck_assert_ptr_nonnull(find_sent(from, "a", PROTO_ASSIGN));
}
END_TEST

START_TEST(ranks_that_rejoin_in_place_are_not_compared)
{
    ckpt_job("glob:step_*");
    preflight_ckpt("a", "step_1");
    preflight_ckpt("b", "step_1");
    beat_rejoin = 1; /* the ranks can heal in place (the Elastic API) */
    beat("a", 1, 0, 1, PROTO_RANK_RUNNING, 50);
    beat("b", 1, 1, 1, PROTO_RANK_RUNNING, 50);
    int from = rec.nsent;
    rank_exit("b", 1, 1, 1, 0); /* b's rank starts afresh, a's keeps its state */
    ck_assert_uint_eq(rdv.generation, 2);
    preflight_ckpt("a", "step_9"); /* a survivor's directory is not what its rank resumes from */
    ck_assert_ptr_null(find_sent(from, "b", PROTO_ASSIGN)); /* b's report is awaited */
    preflight_ckpt("b", "step_1");
    ck_assert_ptr_nonnull(find_sent(from, "b", PROTO_ASSIGN));
    ck_assert(!has_event_with("checkpoint_diverged", "step_9"));
}
END_TEST

START_TEST(plan_that_does_not_fit_is_refused_naming_the_device)
{
    setup_spec(1, 3);
    snprintf(spec.model, sizeof(spec.model), "gpt2-124m");
    spec.batch = 8;
    ck_assert_int_eq(join_checked("a", 8, 1024), 0); /* 8 GPUs of 1 GiB */
    preflight("a", 1, "");
    ck_assert_int_eq(rdv.state, RDV_WAITING);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "waiting for node a: unfit: the plan does not fit: a rank needs"));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "gpu NVIDIA Test GPU has 1.00 GiB"));
    ck_assert_ptr_nonnull(strstr(rdv.reason, "micro_batch 1 x seq_len 1024"));
    ck_assert(has_event_with("node_unfit", "node a is unfit: the plan does not fit"));
    char v[PROTO_REASON_MAX];
    node_field("a", "fit", v, sizeof(v));
    ck_assert_str_eq(v, "unfit");
    /* the same job as a program of the user's is not planned: it forms */
    ck_assert_int_eq(cmdline_from_string("python3 train.py", spec.rank_cmd, sizeof(spec.rank_cmd)), 0);
    rdv_tick(&rdv, now += 100);
    ck_assert_uint_eq(rdv.generation, 1);
}
END_TEST

START_TEST(min_nodes_forms_without_an_unfit_node_after_the_window)
{
    setup_spec(2, 3);
    spec.min_nodes = 1;
    spec.rejoin_timeout_ms = 1000;
    ck_assert_int_eq(join_checked("a", 2, 0), 0);
    ck_assert_int_eq(join_checked("b", 2, 0), 0);
    preflight("a", 1, "");
    preflight("b", 0, "checkpoint_dir /ck: not writable: Read-only file system");
    rdv_tick(&rdv, now += 500);
    ck_assert_int_eq(rdv.state, RDV_WAITING);
    rdv_tick(&rdv, now += 600);
    ck_assert_uint_eq(rdv.generation, 1);
    ck_assert_uint_eq(rdv.world_size, 2); /* node a's two ranks */
    ck_assert_int_eq(rdv.nodes[find_index("b")].member, 0);
    ck_assert(has_event_with("forming_without", "b stayed unfit"));
    ck_assert_uint_eq(rdv.restarts, 0);
}
END_TEST

START_TEST(new_node_grows_the_job_once_it_is_fit)
{
    shrink_to_a();
    beat("a", 3, 0, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_eq(rdv.world_size, 2);
    ck_assert_int_eq(join_checked("c", 2, 0), 0);
    ck_assert_int_eq(rdv.generation, 3); /* its pre-flight is under way */
    preflight("c", 0, "data d.bin: No such file or directory");
    ck_assert_int_eq(rdv.generation, 3);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_str_eq(unhealthy_as("c"), "unfit");
    preflight("c", 1, "");
    ck_assert_int_eq(rdv.generation, 4);
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert(has_event_with("job_grew", "node c joined"));
}
END_TEST

START_TEST(resumed_session_keeps_the_generation)
{
    form_running(3);
    spec.heartbeat_timeout_ms = 2000;
    uint64_t session = session_of("a");
    ck_assert_uint_ne(session, 0);
    now += 1500; /* a stalled link: nothing heard from a, b beats on */
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 2);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rec.ndisconnected, 0);
    int mark = rec.nsent;
    ck_assert_int_eq(join_session("a", 2, 1, session), 0);
    ck_assert_int_eq(rec.ndisconnected, 1); /* the old connection, replaced */
    ck_assert_str_eq(rec.disconnected[0], "a");
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_eq(rdv.generation, 1);
    ck_assert_int_eq(rdv.restarts, 0);
    ck_assert_int_eq(has_event("node_resumed"), 1);
    ck_assert_ptr_null(find_sent(mark, "a", PROTO_ASSIGN));
    const struct proto_msg *w = find_sent(mark, "a", PROTO_WELCOME);
    ck_assert_ptr_nonnull(w);
    ck_assert_uint_ne(w->u.welcome.session, session); /* each join its own */
    /* The deadline counts from the resume: 1.9 s later the node is still in. */
    now += 1900;
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 3);
    rdv_tick(&rdv, now);
    for (uint32_t i = 0; i < rdv.nnodes; i++)
        ck_assert_int_eq(rdv.nodes[i].state, RDV_NODE_JOINED);
    ck_assert_int_eq(rdv.generation, 1);
}
END_TEST

START_TEST(another_session_is_a_duplicate)
{
    form_running(3);
    uint64_t session = session_of("a");
    ck_assert_int_eq(join_session("a", 2, 1, session ^ 1), -1);
    ck_assert_str_eq(last_reject_code(), "duplicate");
    ck_assert_int_eq(join_session("a", 2, 1, 0), -1);
    ck_assert_str_eq(last_reject_code(), "duplicate");
    ck_assert_int_eq(rec.ndisconnected, 0);
    ck_assert_int_eq(rdv.generation, 1);
}
END_TEST

START_TEST(resume_while_forming_gives_back_what_was_missed)
{
    setup_spec(2, 3);
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_int_eq(join("a", 2, 0), 0);
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    struct proto_msg u = {.type = PROTO_UNIQUE_ID};
    u.u.unique_id.generation = 1;
    memset(u.u.unique_id.id, 0x5c, PROTO_UID_LEN);
    rdv_message(&rdv, "a", &u, now);
    /* b's link stalled before its ASSIGN and the unique id got through: its ranks never started. */
    int mark = rec.nsent;
    ck_assert_int_eq(join_session("b", 2, 0, session_of("b")), 0);
    const struct proto_msg *as = find_sent(mark, "b", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.generation, 1);
    ck_assert_int_eq(as->u.assign.node_rank, 1);
    ck_assert_int_eq(as->u.assign.nnodes, 2);
    ck_assert_int_eq(as->u.assign.ranks[0].rank, 2);
    ck_assert_int_eq(as->u.assign.master_port, rdv.master_port); /* the same ASSIGN again */
    ck_assert_int_eq(as->u.assign.master_port, 29500);
    const struct proto_msg *ub = find_sent(mark, "b", PROTO_UNIQUE_ID);
    ck_assert_ptr_nonnull(ub);
    ck_assert_int_eq(ub->u.unique_id.id[0], 0x5c);
    ck_assert_ptr_null(find_sent(mark, "a", PROTO_ASSIGN));
    ck_assert_int_eq(rdv.generation, 1);
    ck_assert_int_eq(rdv.restarts, 0);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 0);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
}
END_TEST

START_TEST(resume_without_its_ranks_fails_the_generation)
{
    form_running(3);
    ck_assert_int_eq(join_session("a", 2, 0, session_of("a")), 0); /* its ranks died meanwhile */
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.restarts, 1);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "node a came back without its ranks of generation 1"));
}
END_TEST

/* One test case per file of rdv, each test in the case of the idea it checks. */
/* Hot spares (daemon/rdv_spare.c): a join with a placement label. */
static int join_domain(const char *name, uint32_t ndev, const char *domain)
{
    struct proto_hello h;
    char code[32], reason[PROTO_REASON_MAX];
    hello_of(&h, name, ndev, 0);
    snprintf(h.domain, sizeof(h.domain), "%s", domain);
    int rc = rdv_join(&rdv, &h, now, code, reason);
    if (rc != 0)
        snprintf(rec.sent[MAX_SENT - 1].node, PROTO_NAME_MAX, "%s", code);
    return rc;
}

/* The index of node name in rdv.nodes (it must be there). */
static uint32_t node_index(const char *name)
{
    int i = rdv__find_node(&rdv, name);
    ck_assert_msg(i >= 0, "no node %s", name);
    return (uint32_t)i;
}

/* The member that holds name's memory checkpoint copies. */
static const char *buddy_of(const char *name)
{
    uint32_t b = rdv__buddy(&rdv, node_index(name));
    ck_assert_uint_lt(b, rdv.nnodes);
    return rdv.nodes[b].name;
}

/* Failure domains in the buddy map: racks r1 = {a, b}, r2 = {c, d} deal a c b d, so every copy is kept in
 * the other rack; the relay, status and a replaced node's restore follow that map. */
START_TEST(memory_checkpoint_buddy_is_in_another_domain)
{
    setup_spec(4, 3);
    spec.memory_checkpoint_mb = 64;
    spec.restart_backoff_ms = 0;
    spec.batch = 4;
    int from = rec.nsent;
    ck_assert_int_eq(join_domain("d", 1, "r2"), 0);
    ck_assert_int_eq(join_domain("b", 1, "r1"), 0);
    ck_assert_int_eq(join_domain("a", 1, "r1"), 0);
    ck_assert_int_eq(join_domain("c", 1, "r2"), 0);
    static const char *const names[] = {"a", "b", "c", "d"}, *const buddies[] = {"c", "d", "b", "a"};
    for (int i = 0; i < 4; i++) {
        ck_assert_str_eq(buddy_of(names[i]), buddies[i]);
        ck_assert_str_ne(rdv.nodes[node_index(buddies[i])].domain, rdv.nodes[node_index(names[i])].domain);
    }
    static const char *const has[] = {"step5", "step10"};
    for (int i = 0; i < 4; i++)
        beat_mem(names[i], 0, 2, has);
    beat_replicas("d", 0, "b", 2, has); /* d holds b's */
    ck_assert_msg(find_sent(from, "a", PROTO_ASSIGN) != NULL, "no ASSIGN: %s", rdv.reason);
    json_t *st = rest_status(now);
    json_t *reps = json_object_get(json_object_get(st, "memory_checkpoint"), "replicas");
    for (int i = 0; i < 4; i++)
        ck_assert_str_eq(json_string_value(json_object_get(json_object_get(reps, names[i]), "buddy")), buddies[i]);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(reps, "b"), "newest")), "step10");
    json_decref(st);

    /* a's copies go to c, in the other rack, not to b beside it */
    int mark = rec.nsent;
    mem_file("a", "a", 0);
    ck_assert_ptr_nonnull(find_sent(mark, "c", PROTO_MEM_FILE));
    ck_assert_ptr_null(find_sent(mark, "b", PROTO_MEM_FILE));

    /* b is replaced by a fresh agent in its rack: its step10 comes from d */
    rdv_disconnected(&rdv, "b", "connection closed", now);
    from = rec.nsent;
    ck_assert_int_eq(join_domain("b", 1, "r1"), 0);
    beat_mem("a", 1, 2, has); /* rank 0's node: its next free port */
    beat_mem("b", 0, 0, NULL);
    const struct proto_msg *bs = find_sent(from, "b", PROTO_ASSIGN);
    ck_assert_msg(bs != NULL, "no ASSIGN: %s", rdv.reason);
    ck_assert_str_eq(bs->u.assign.memckpt, "step10");
    ck_assert_str_eq(bs->u.assign.memckpt_from, "d");
    const struct proto_msg *q = find_sent(from, "d", PROTO_MEM_FETCH);
    ck_assert_ptr_nonnull(q);
    ck_assert_str_eq(q->u.mem_fetch.owner, "b");
    ck_assert_str_eq(q->u.mem_fetch.tag, "step10");
    mark = rec.nsent;
    mem_file("b", "b", 0); /* b's next copies go to d again */
    ck_assert_ptr_nonnull(find_sent(mark, "d", PROTO_MEM_FILE));
}
END_TEST

/* Unlabelled nodes in a labelled job are each a domain of its own, so the map stays a rotation: r1 = {a, c},
 * b and d alone, dealt a b d c (unlabelled nodes taken as one domain would deal a b c d). */
START_TEST(memory_checkpoint_buddy_map_is_total_with_some_unlabelled)
{
    setup_spec(4, 3);
    spec.memory_checkpoint_mb = 64;
    ck_assert_int_eq(join_domain("a", 1, "r1"), 0);
    ck_assert_int_eq(join("b", 1, 0), 0);
    ck_assert_int_eq(join_domain("c", 1, "r1"), 0);
    ck_assert_int_eq(join("d", 1, 0), 0);
    ck_assert_str_eq(buddy_of("a"), "b");
    ck_assert_str_eq(buddy_of("b"), "d");
    ck_assert_str_eq(buddy_of("d"), "c");
    ck_assert_str_eq(buddy_of("c"), "a");
}
END_TEST

/* /v1/status's "spares" key (an integer of it). */
static json_int_t spares_figure(const char *key)
{
    json_t *st = rest_status(now);
    json_int_t n = json_integer_value(json_object_get(json_object_get(st, "spares"), key));
    json_decref(st);
    return n;
}

/* Nodes a and b (domains r1 and r2) run generation 1 of a 2-node job with
 * spare_nodes spares; the spares named join after it formed. */
static void form_with_spares(int spare_nodes, const char *const *spares, const char *const *domains, int nspares)
{
    setup_spec(2, 5);
    spec.spare_nodes = spare_nodes;
    ck_assert_int_eq(join_domain("b", 2, "r2"), 0);
    ck_assert_int_eq(join_domain("a", 2, "r1"), 0);
    for (int i = 0; i < nspares; i++)
        ck_assert_int_eq(join_domain(spares[i], 2, domains[i]), 0);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
}

/* Agents beyond nodes join as spares, up to spare_nodes: welcomed, never
 * given ranks, shown as spare and ready; one more is refused "full". */
START_TEST(spares_join_beyond_nodes_without_ranks)
{
    static const char *const names[] = {"s"}, *const domains[] = {"r1"};
    form_with_spares(1, names, domains, 1);
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert_int_eq(rdv__member_count(&rdv), 2);
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 0);
    ck_assert_ptr_nonnull(find_sent(0, "s", PROTO_WELCOME));
    ck_assert_ptr_null(find_sent(0, "s", PROTO_ASSIGN));
    char role[16];
    node_field("s", "role", role, sizeof(role));
    ck_assert_str_eq(role, "spare");
    node_field("a", "role", role, sizeof(role));
    ck_assert_str_eq(role, "member");
    ck_assert_int_eq(spares_figure("joined"), 1);
    ck_assert_int_eq(spares_figure("ready"), 1);
    ck_assert_int_eq(join("t", 2, 0), -1); /* the job has its nodes and its spare */
    ck_assert_str_eq(last_reject_code(), "full");
    /* a generation opened for another cause leaves the spare idle */
    rank_exit("a", 1, 0, 1, 0);
    ck_assert_int_eq(rdv.generation, 2);
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_ptr_null(find_sent(0, "s", PROTO_ASSIGN));
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 0);
}
END_TEST

/* Node's two ranks' entries with a time split: a window of 10 steps in 5 s
 * of which each computed compute[i] seconds per step (check_failslow's form). */
static void beat_split(const char *node, uint64_t generation, uint32_t first, uint64_t step, int w,
                       const double *compute)
{
    struct proto_msg *m = heartbeat_msg(2);
    m->u.heartbeat.generation = generation;
    m->u.heartbeat.seq = now;
    m->u.heartbeat.free_port = node_port(node);
    for (uint32_t i = 0; i < 2; i++) {
        struct proto_rank_beat *b = &m->u.heartbeat.ranks[i];
        b->rank = first + i;
        b->state = PROTO_RANK_RUNNING;
        b->step = step;
        b->loss = 2.5;
        b->rejoin = beat_rejoin;
        b->yielded = beat_yielded;
        b->split_s = 5.0 + 1e-3 * w; /* each window's figures differ a little */
        b->split_steps = 10;
        b->split[PROTO_SPLIT_COMPUTE] = compute[i] * 10 / b->split_s;
        b->split[PROTO_SPLIT_COLLECTIVE] = 1 - b->split[PROTO_SPLIT_COMPUTE];
    }
    rdv_message(&rdv, node, m, now);
}

/* slow_policy swap: a rank named slow for slow_swap_after_s makes its node
 * leave its place to the spare at a step boundary: the ranks yield, the
 * spare takes the block in a generation that spends no restart, the slow
 * node's parked ranks are stopped and it is the new spare; with the policy
 * off the rank is only named. */
static void slow_b_for(int windows, uint64_t *step, int *w)
{
    static const double fast[] = {0.30, 0.30}, slow[] = {0.31, 0.42};
    for (int k = 0; k < windows; k++) {
        now += 5000;
        *step += 10;
        ++*w;
        beat_split("a", rdv.generation, 0, *step, *w, fast);
        beat_split("b", rdv.generation, 2, *step, *w, slow);
        beat("s", rdv.generation, 0, 0, PROTO_RANK_RUNNING, 0); /* the spare beats too, with no ranks */
        rdv_tick(&rdv, now);
    }
}
START_TEST(slow_node_is_swapped_for_the_spare_at_a_step_boundary)
{
    static const char *const names[] = {"s"}, *const domains[] = {"r2"};
    for (int policy = 0; policy < 2; policy++) {
        form_with_spares(1, names, domains, 1);
        snprintf(spec.slow_policy, sizeof(spec.slow_policy), "%s", policy ? "swap" : "off");
        spec.slow_swap_after_s = 10;
        beat_rejoin = 1;
        uint64_t step = 1;
        int w = 0;
        slow_b_for(FAILSLOW_WINDOWS, &step, &w);
        ck_assert(has_event("rank_slow"));
        ck_assert(!has_event("node_swapping")); /* named, not yet for slow_swap_after_s */
        int mark = rec.nsent;
        slow_b_for(3, &step, &w);
        if (!policy) {
            ck_assert(!has_event("node_swapping"));
            ck_assert_int_eq(rdv.generation, 1);
            rdv_free(&rdv);
            continue;
        }
        ck_assert_msg(has_event("node_swapping"), "gen %llu state %d yielding %d named %llu now %llu slow %d spare %d",
                      (unsigned long long)rdv.generation, rdv.state, rdv.yielding,
                      (unsigned long long)rdv.ranks[3].slow_named_ms, (unsigned long long)now, rdv.ranks[3].slow.slow,
                      rdv__pick_spare(&rdv, node_index("b")));
        const struct proto_msg *y = find_sent(mark, "a", PROTO_COMMAND);
        ck_assert_ptr_nonnull(y);
        ck_assert_int_eq(y->u.command.action, PROTO_CMD_YIELD);
        ck_assert_int_eq(rdv.generation, 1);
        /* every rank leaves generation 1 after the same step */
        mark = rec.nsent;
        beat_yielded = 1;
        beat("a", 1, 0, 2, PROTO_RANK_RUNNING, step);
        beat("b", 1, 2, 2, PROTO_RANK_RUNNING, step);
        beat_yielded = 0;
        ck_assert_int_eq(rdv.generation, 2);
        ck_assert_int_eq(rdv.restarts, 0); /* a swap is no failure */
        ck_assert_int_eq(rdv.world_size, 4);
        ck_assert_int_eq(rdv.nodes[node_index("b")].member, 0);
        ck_assert_int_eq(rdv.nodes[node_index("s")].member, 1);
        const struct proto_msg *as = find_sent(mark, "s", PROTO_ASSIGN);
        ck_assert_ptr_nonnull(as);
        ck_assert_int_eq(as->u.assign.ranks[0].rank, 2);
        ck_assert_int_eq(as->u.assign.node_rank, 1);
        ck_assert_ptr_null(find_sent(mark, "b", PROTO_ASSIGN));
        int stopped = 0;
        for (int i = mark; i < rec.nsent; i++)
            stopped |= strcmp(rec.sent[i].node, "b") == 0 && rec.sent[i].msg.type == PROTO_COMMAND &&
                       rec.sent[i].msg.u.command.action == PROTO_CMD_STOP;
        ck_assert_msg(stopped, "the slow node's parked ranks were not stopped");
        ck_assert_str_eq(rdv.last_replacement.why, "slow");
        ck_assert(has_event_with("node_replaced",
                                 "node b slow: spare node s took its place (node rank 1, ranks 2-3, domain r2)"));
        ck_assert_int_eq(rdv.ranks[3].slow_named_ms, 0); /* the slot's slowness was the old node's */
        char role[16];
        node_field("b", "role", role, sizeof(role));
        ck_assert_str_eq(role, "spare");
        beat("a", 2, 0, 2, PROTO_RANK_RUNNING, step);
        beat("s", 2, 2, 2, PROTO_RANK_RUNNING, step);
        ck_assert_int_eq(rdv.state, RDV_RUNNING);
    }
}
END_TEST

/* Before generation 1: nodes + spare_nodes names at most; generation 1
 * forms once nodes of them are fit, with those; the others are spares. */
START_TEST(spares_before_formation_are_bounded)
{
    setup_spec(2, 3);
    spec.spare_nodes = 1;
    ck_assert_int_eq(join_checked("a", 2, 0), 0);
    ck_assert_int_eq(join_checked("b", 2, 0), 0);
    ck_assert_int_eq(join_checked("c", 2, 0), 0);
    ck_assert_int_eq(join("d", 2, 0), -1);
    ck_assert_str_eq(last_reject_code(), "full");
    preflight("c", 1, "");
    ck_assert_int_eq(rdv.state, RDV_WAITING);
    preflight("a", 1, "");
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    ck_assert_int_eq(rdv.nodes[node_index("a")].member, 1);
    ck_assert_int_eq(rdv.nodes[node_index("c")].member, 1);
    ck_assert_int_eq(rdv.nodes[node_index("b")].member, 0);
    ck_assert_int_eq(rdv.world_size, 4);
    preflight("b", 1, "");
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert_ptr_null(find_sent(0, "b", PROTO_ASSIGN));
    ck_assert_int_eq(spares_figure("ready"), 1);
}
END_TEST

/* A member lost: the spare takes its rank block and node rank in the next
 * generation at once (no rejoin wait, no shrink); the survivors are parked;
 * the lost node coming back is the new spare. */
START_TEST(lost_member_is_replaced_by_a_spare_at_once)
{
    static const char *const names[] = {"s"}, *const domains[] = {"r9"};
    form_with_spares(1, names, domains, 1);
    spec.min_nodes = 1;
    int mark = rec.nsent;
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_int_eq(rdv.world_size, 4);
    const struct proto_msg *as = find_sent(mark, "s", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.generation, 2);
    ck_assert_int_eq(as->u.assign.world_size, 4);
    ck_assert_int_eq(as->u.assign.nranks, 2);
    ck_assert_int_eq(as->u.assign.ranks[0].rank, 2);
    ck_assert_int_eq(as->u.assign.ranks[1].rank, 3);
    ck_assert_int_eq(as->u.assign.node_rank, 1);
    ck_assert_int_eq(as->u.assign.nnodes, 2);
    const struct proto_msg *park = find_sent(mark, "a", PROTO_COMMAND);
    ck_assert_ptr_nonnull(park);
    ck_assert_int_eq(park->u.command.action, PROTO_CMD_PARK);
    ck_assert_ptr_nonnull(find_sent(mark, "a", PROTO_ASSIGN));
    ck_assert_int_eq(rdv.nodes[node_index("b")].member, 0);
    ck_assert(has_event("node_replaced"));
    ck_assert_str_eq(rdv.last_replacement.lost, "b");
    ck_assert_str_eq(rdv.last_replacement.spare, "s");
    ck_assert_int_eq(rdv.last_replacement.node_rank, 1);
    ck_assert_int_eq(rec.persists > 0, 1);
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 5);
    beat("s", 2, 2, 2, PROTO_RANK_RUNNING, 5);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    /* far past rejoin_timeout_ms: nothing shrinks */
    now += (uint64_t)spec.rejoin_timeout_ms + 1000;
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 6);
    beat("s", 2, 2, 2, PROTO_RANK_RUNNING, 6);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert(!has_event("job_shrunk"));
    /* b back: a spare, without ranks */
    mark = rec.nsent;
    ck_assert_int_eq(join("b", 2, 1), 0);
    ck_assert_int_eq(rdv.generation, 2);
    ck_assert_ptr_null(find_sent(mark, "b", PROTO_ASSIGN));
    char role[16];
    node_field("b", "role", role, sizeof(role));
    ck_assert_str_eq(role, "spare");
    ck_assert_int_eq(spares_figure("ready"), 1);
    ck_assert_int_eq(spares_figure("replacements"), 1);
}
END_TEST

/* Placement: a spare of the lost node's domain is taken before one that
 * joined earlier in another domain; with none free there, any ready spare. */
START_TEST(replacement_comes_from_the_lost_nodes_domain)
{
    static const char *const names[] = {"s", "t"}, *const domains[] = {"r1", "r2"};
    form_with_spares(2, names, domains, 2);
    rdv_disconnected(&rdv, "b", "connection closed", now); /* b is in r2 */
    ck_assert_str_eq(rdv.last_replacement.spare, "t");
    ck_assert_int_eq(rdv.last_replacement.same_domain, 1);
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 0);
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 5);
    beat("t", 2, 2, 2, PROTO_RANK_RUNNING, 5);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    rdv_disconnected(&rdv, "t", "connection closed", now); /* r2 has no spare left: s of r1 */
    ck_assert_str_eq(rdv.last_replacement.spare, "s");
    ck_assert_str_eq(rdv.last_replacement.lost, "t");
    ck_assert_int_eq(rdv.last_replacement.same_domain, 0);
    ck_assert_int_eq(rdv.last_replacement.first_rank, 2);
    ck_assert_int_eq(rdv.replacements, 2);
}
END_TEST

/* A spare of another device count cannot take the block; an unfit member
 * is replaced as a lost one, by a spare that becomes ready later. */
START_TEST(spare_must_match_and_replaces_an_unfit_member)
{
    setup_spec(2, 5);
    spec.spare_nodes = 2;
    ck_assert_int_eq(join("a", 2, 0), 0);
    ck_assert_int_eq(join("b", 2, 0), 0);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(join("w", 4, 0), 0); /* four devices: no match for b's two */
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "waiting for b to rejoin"));
    ck_assert_int_eq(rdv.nodes[node_index("w")].member, 0);
    /* b comes back unfit */
    ck_assert_int_eq(join_checked("b", 2, 0), 0);
    preflight("b", 0, "torch: not importable");
    ck_assert_int_eq(rdv.nodes[node_index("b")].member, 1);
    /* a spare that matches joins and passes its pre-flight: it takes b's place */
    int mark = rec.nsent;
    ck_assert_int_eq(join_checked("s", 2, 0), 0);
    ck_assert_ptr_null(find_sent(mark, "s", PROTO_ASSIGN)); /* not before its pre-flight */
    preflight("s", 1, "");
    const struct proto_msg *as = find_sent(mark, "s", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.ranks[0].rank, 2);
    ck_assert_str_eq(rdv.last_replacement.why, "unfit");
    ck_assert_int_eq(rdv.nodes[node_index("b")].member, 0);
    ck_assert_int_eq(rdv.world_size, 4);
}
END_TEST

/* Without spare_nodes nothing changes: a stranger is refused, a lost
 * member is waited for. */
START_TEST(no_spares_without_the_key)
{
    form_running(3);
    ck_assert_int_eq(join("s", 2, 0), -1);
    ck_assert_str_eq(last_reject_code(), "full");
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_ptr_nonnull(strstr(rdv.reason, "waiting for b to rejoin"));
    ck_assert_int_eq(spares_figure("wanted"), 0);
}
END_TEST

/* The replacement is in the state the leader persists: a restored daemon
 * (after a failover) has the spare as the member holding b's block, and the
 * last replacement. */
START_TEST(replacement_survives_a_restore)
{
    static const char *const names[] = {"s"}, *const domains[] = {"r2"};
    form_with_spares(1, names, domains, 1);
    rdv_disconnected(&rdv, "b", "connection closed", now);
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 5);
    beat("s", 2, 2, 2, PROTO_RANK_RUNNING, 5);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    static struct rdv_saved saved, back;
    rdv_save(&rdv, &saved);
    char *text = state_to_text(&saved);
    ck_assert_ptr_nonnull(text);
    char err[256];
    int rc = state_from_text(text, "test", &back, err, sizeof(err));
    free(text);
    ck_assert_msg(rc == 0, "%s", err);
    rdv_free(&rdv);

    setup_spec(2, 5);
    spec.spare_nodes = 1;
    ck_assert_int_eq(rdv_restore(&rdv, &back, now), 0);
    ck_assert_int_eq(rdv.replacements, 1);
    ck_assert_str_eq(rdv.last_replacement.spare, "s");
    ck_assert_int_eq(rdv.last_replacement.same_domain, 1);
    ck_assert_int_eq(rdv.nodes[node_index("s")].first_rank, 2);
    ck_assert_int_eq(join("a", 2, 2), 0);
    ck_assert_int_eq(join("b", 2, 0), 0); /* the old member: a spare now */
    ck_assert_int_eq(join("s", 2, 2), 0);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_eq(rdv.nodes[node_index("b")].member, 0);
    ck_assert_int_eq(join("t", 2, 0), -1);
    json_t *st = rest_status(now);
    json_t *x = json_object_get(json_object_get(st, "spares"), "last_replacement");
    ck_assert_str_eq(json_string_value(json_object_get(x, "lost")), "b");
    ck_assert_int_eq(json_integer_value(json_object_get(x, "node_rank")), 1);
    json_decref(st);
    /* a malformed spares entry is refused with a reason */
    rc = state_from_text("{\"version\": 1, \"job\": \"t\", \"state\": \"running\", \"reason\": \"\", \"generation\": 2, "
                         "\"restarts\": 1, \"world_size\": 0, \"last_checkpoint_step\": -1, \"members\": [], "
                         "\"spares\": {\"replacements\": 1}}", "test", &back, err, sizeof(err));
    ck_assert_int_eq(rc, -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "spares: unexpected content"));
}
END_TEST

/* Attack: a replaced node whose agent comes back with its ranks of the
 * generation it lost still running (its connection closed, its agent and
 * ranks did not die) is a spare: it holds no block, so those ranks are told
 * to stop, not left training in a generation nobody leads. */
START_TEST(replaced_node_back_with_live_ranks_has_them_stopped)
{
    static const char *const names[] = {"s"}, *const domains[] = {"r9"};
    form_with_spares(1, names, domains, 1);
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_str_eq(rdv.last_replacement.spare, "s");
    int mark = rec.nsent;
    ck_assert_int_eq(join("b", 2, 1), 0); /* its ranks still run generation 1 */
    const struct proto_msg *stop = find_sent(mark, "b", PROTO_COMMAND);
    ck_assert_msg(stop != NULL, "the replaced node's ranks of generation 1 were not told to stop");
    ck_assert_int_eq(stop->u.command.action, PROTO_CMD_STOP);
    ck_assert_int_eq(stop->u.command.generation, 2);
    ck_assert_ptr_null(find_sent(mark, "b", PROTO_ASSIGN));
    ck_assert_int_eq(rdv.nodes[node_index("b")].member, 0);
    /* a spare that holds nothing is told nothing */
    rdv_disconnected(&rdv, "b", "connection closed", now);
    mark = rec.nsent;
    ck_assert_int_eq(join("b", 2, 0), 0);
    ck_assert_ptr_null(find_sent(mark, "b", PROTO_COMMAND));
    /* b gone again with live ranks; s lost: generation 3 waits for s; b, back,
     * is told to stop its old ranks before it is assigned s's block */
    rdv_disconnected(&rdv, "b", "connection closed", now);
    rdv_disconnected(&rdv, "s", "connection closed", now);
    ck_assert_int_eq(rdv.generation, 3);
    mark = rec.nsent;
    ck_assert_int_eq(join("b", 2, 1), 0);
    ck_assert_int_eq(rdv.nodes[node_index("b")].member, 1);
    now += (uint64_t)spec.restart_backoff_ms; /* failure 2 in a row: it backs off */
    beat("a", 2, 0, 2, PROTO_RANK_STOPPING, 1);
    beat("b", 1, 2, 2, PROTO_RANK_STOPPING, 1);
    rdv_tick(&rdv, now);
    int stop_at = -1, assign_at = -1;
    for (int m = mark; m < rec.nsent; m++) {
        if (strcmp(rec.sent[m].node, "b") != 0)
            continue;
        if (rec.sent[m].msg.type == PROTO_COMMAND && stop_at < 0)
            stop_at = m;
        if (rec.sent[m].msg.type == PROTO_ASSIGN && assign_at < 0)
            assign_at = m;
    }
    ck_assert_int_ge(stop_at, 0);
    ck_assert_int_gt(assign_at, stop_at); /* a STOP after it would stop the new ranks */
    ck_assert_int_eq(rec.sent[assign_at].msg.u.assign.generation, 3);
    ck_assert_int_eq(rdv.nodes[node_index("b")].first_rank, 2);
}
END_TEST

/* Attack: musterd restarted while a generation waited to start (recovering):
 * the members are known but none has reconnected yet. A spare that happens
 * to reconnect first must not take the block of a member that is only slower
 * to come back; a member still absent heartbeat_timeout_ms after the restart
 * is lost, and then a spare takes its place. */
START_TEST(restored_recovery_keeps_members_that_are_slow_to_rejoin)
{
    form_with_spares(1, NULL, NULL, 0);
    rdv_disconnected(&rdv, "b", "connection closed", now); /* no spare yet: generation 2 waits for b */
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    static struct rdv_saved saved;
    rdv_save(&rdv, &saved);
    rdv_free(&rdv);

    setup_spec(2, 5);
    spec.spare_nodes = 1;
    ck_assert_int_eq(rdv_restore(&rdv, &saved, now), 0);
    ck_assert_int_eq(rdv.state, RDV_RECOVERING);
    int mark = rec.nsent;
    ck_assert_int_eq(join("s", 2, 0), 0); /* the spare is back first */
    ck_assert_msg(rdv.nodes[node_index("s")].member == 0, "spare s took the block of a member not back yet");
    ck_assert_int_eq(rdv.nodes[node_index("a")].member, 1);
    ck_assert_ptr_null(find_sent(mark, "s", PROTO_ASSIGN));
    ck_assert_int_eq(rdv.replacements, 0);
    ck_assert_int_eq(join("a", 2, 1), 0); /* a's ranks are parked in place */
    ck_assert_int_eq(rdv.nodes[node_index("a")].member, 1);
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 0);
    /* b never comes back: past heartbeat_timeout_ms it is lost, and s takes its block */
    now += (uint64_t)spec.heartbeat_timeout_ms / 2;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("s", 1, 0, 0, PROTO_RANK_RUNNING, 0);
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 0);
    now += (uint64_t)spec.heartbeat_timeout_ms / 2 + 1;
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("s", 1, 0, 0, PROTO_RANK_RUNNING, 0);
    mark = rec.nsent;
    rdv_tick(&rdv, now);
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 1);
    ck_assert_str_eq(rdv.last_replacement.lost, "b");
    ck_assert_int_eq(rdv.nodes[node_index("s")].first_rank, 2);
    ck_assert_ptr_nonnull(find_sent(mark, "s", PROTO_ASSIGN));
    ck_assert_int_eq(rdv.world_size, 4);
}
END_TEST

/* The invariants a replacement must keep in the 2-node, 4-rank job of
 * form_with_spares: the world size, two members whose blocks tile [0, 4),
 * every rank on the member holding its block, and no ASSIGN since message
 * from to a node that is not a member or for ranks outside its block. */
static void assert_layout_kept(int from)
{
    ck_assert_int_eq(rdv.world_size, 4);
    ck_assert_int_eq(rdv__member_count(&rdv), 2);
    int covered[4] = {0};
    for (uint32_t i = 0; i < rdv.nnodes; i++) {
        const struct rdv_node *nd = &rdv.nodes[i];
        if (!nd->member)
            continue;
        ck_assert_int_eq(nd->ndevices, 2);
        ck_assert_uint_le(nd->first_rank + nd->ndevices, 4);
        for (uint32_t l = 0; l < nd->ndevices; l++) {
            covered[nd->first_rank + l]++;
            ck_assert_uint_eq(rdv.ranks[nd->first_rank + l].node, i);
        }
    }
    for (int k = 0; k < 4; k++)
        ck_assert_int_eq(covered[k], 1);
    for (int m = from; m < rec.nsent; m++) {
        if (rec.sent[m].msg.type != PROTO_ASSIGN)
            continue;
        const struct rdv_node *nd = &rdv.nodes[node_index(rec.sent[m].node)];
        const struct proto_assign *as = &rec.sent[m].msg.u.assign;
        if (as->generation != rdv.generation)
            continue; /* an older generation's, told while that node was a member */
        ck_assert_msg(nd->member, "ASSIGN of generation %llu sent to %s, not a member", (unsigned long long)as->generation,
                      nd->name);
        ck_assert_int_eq(as->world_size, 4);
        for (uint32_t l = 0; l < as->nranks; l++)
            ck_assert_uint_eq(as->ranks[l].rank, nd->first_rank + l);
    }
}

/* Attack: the spare dies at the moment it is chosen. While the generation
 * backs off (its ASSIGN not sent yet), the next spare takes the dead one's
 * place; once assigned, its death is a failure, and the replaced node, back
 * as a spare, takes the block again. Two members lost at once with one spare:
 * one is replaced, the other awaited. Through all of it the world size and
 * layout hold and no spare is told ranks. */
START_TEST(spare_dying_when_chosen_keeps_the_layout)
{
    static const char *const names[] = {"s"}, *const domains[] = {"r2"};
    form_with_spares(2, names, domains, 1);
    spec.restart_backoff_ms = 1000;
    spec.restart_backoff_max_ms = 8000;
    int from = rec.nsent;
    rank_exit("a", 1, 0, 1, 0); /* failure 1: generation 2 at once */
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 2, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    /* failure 2 in a row: b lost, generation 3 backs off; s is chosen at once */
    now += 100;
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_int_eq(rdv.generation, 3);
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 1);
    ck_assert_ptr_null(find_sent(from, "s", PROTO_ASSIGN));
    assert_layout_kept(from);
    /* s dies before its ASSIGN: t, joining now, takes b's block in its stead */
    rdv_disconnected(&rdv, "s", "connection closed", now);
    ck_assert_int_eq(rdv.generation, 3);
    ck_assert_int_eq(join_domain("t", 2, "r1"), 0);
    ck_assert_int_eq(rdv.nodes[node_index("t")].member, 1);
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 0);
    ck_assert_str_eq(rdv.last_replacement.lost, "s");
    ck_assert_int_eq(rdv.replacements, 2);
    assert_layout_kept(from);
    now += 1000;
    rdv_tick(&rdv, now);
    const struct proto_msg *as = find_sent(from, "t", PROTO_ASSIGN);
    ck_assert_ptr_nonnull(as);
    ck_assert_int_eq(as->u.assign.generation, 3);
    ck_assert_int_eq(as->u.assign.node_rank, 1);
    assert_layout_kept(from);
    /* t dies after its ASSIGN: generation 4; b, back as a spare, takes the block */
    rdv_disconnected(&rdv, "t", "connection closed", now);
    ck_assert_int_eq(rdv.generation, 4);
    ck_assert_int_eq(join_domain("b", 2, "r2"), 0);
    for (int k = 0; k < 4; k++) { /* the longest backoff, the nodes heard meanwhile */
        now += 2000;
        beat("a", 3, 0, 2, PROTO_RANK_STOPPING, 1);
        beat("b", 0, 0, 0, PROTO_RANK_RUNNING, 0);
        rdv_tick(&rdv, now);
    }
    ck_assert_int_eq(rdv.nodes[node_index("b")].member, 1);
    ck_assert_int_eq(rdv.nodes[node_index("b")].first_rank, 2);
    ck_assert_ptr_nonnull(find_sent(from, "b", PROTO_ASSIGN));
    assert_layout_kept(from);
    beat("a", 4, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 4, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    /* two members lost at once, one spare (s, back): one replaced, the other awaited */
    ck_assert_int_eq(join_domain("s", 2, "r1"), 0);
    from = rec.nsent;
    rdv_disconnected(&rdv, "a", "connection closed", now);
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 1);
    ck_assert_int_eq(rdv.nodes[node_index("s")].first_rank, 0);
    ck_assert_int_eq(rdv.nodes[node_index("b")].member, 1); /* awaited (after the backoff) */
    ck_assert_int_eq(rdv.nodes[node_index("a")].member, 0);
    assert_layout_kept(from);
}
END_TEST

/* Attack: spares come and go while the job runs, each under a new name (as
 * nodes of a cloud pool do), more of them than musterd holds nodes. The job
 * runs on untouched, and a spare is still admitted after them all. */
START_TEST(spares_coming_and_going_do_not_fill_the_node_table)
{
    form_with_spares(1, NULL, NULL, 0);
    char name[32];
    for (int i = 0; i < RDV_MAX_NODES + 8; i++) {
        rec.nsent = 0;
        snprintf(name, sizeof(name), "pool-%d", i);
        ck_assert_msg(join(name, 2, 0) == 0, "spare %s refused: %s", name, last_reject_code());
        rdv_disconnected(&rdv, name, "connection closed", now);
    }
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    ck_assert_int_eq(rdv.generation, 1);
    ck_assert_int_eq(join("s", 2, 0), 0);
    ck_assert_int_eq(spares_figure("joined"), 1);
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_str_eq(rdv.last_replacement.spare, "s");
    assert_layout_kept(0);
}
END_TEST

/* Attack: a state document (the state file, the etcd key) whose "spares"
 * object is hostile or damaged is refused with an error naming what is
 * wrong, never half taken. */
START_TEST(hostile_spares_in_a_state_document_are_refused)
{
    static const char head[] = "{\"version\": 1, \"job\": \"t\", \"state\": \"running\", \"reason\": \"\", "
                               "\"generation\": 3, \"restarts\": 1, \"world_size\": 4, \"last_checkpoint_step\": -1, "
                               "\"members\": [{\"name\": \"a\", \"first_rank\": 0, \"ndevices\": 2}, "
                               "{\"name\": \"s\", \"first_rank\": 2, \"ndevices\": 2}], \"spares\": ";
    static char long_name[2000];
    memset(long_name, 'x', sizeof(long_name) - 1);
    static char huge[sizeof(long_name) + 400];
    snprintf(huge, sizeof(huge), "{\"replacements\": 1, \"last_replacement\": {\"generation\": 2, \"wall_ms\": 1, "
             "\"lost\": \"%s\", \"spare\": \"s\", \"why\": \"lost\", \"node_rank\": 1, \"first_rank\": 2, "
             "\"nranks\": 2, \"same_domain\": false}}", long_name);
#define LAST(gen, lost, why, nr, first, n) "\"last_replacement\": {\"generation\": " gen ", \"wall_ms\": 1, " \
    "\"lost\": \"" lost "\", \"spare\": \"s\", \"why\": \"" why "\", \"node_rank\": " nr ", \"first_rank\": " first \
    ", \"nranks\": " n ", \"same_domain\": false}"
    static const struct {
        const char *spares, *says;
    } cases[] = {
        {"{\"replacements\": -1, " LAST("2", "b", "lost", "1", "2", "2") "}", "spares: replacements"},
        {"{\"replacements\": 0, " LAST("2", "b", "lost", "1", "2", "2") "}", "spares: replacements"},
        {"{\"replacements\": 4294967296, " LAST("2", "b", "lost", "1", "2", "2") "}", "spares: replacements"},
        {"{\"replacements\": 1, " LAST("9", "b", "lost", "1", "2", "2") "}", "spares: last_replacement.generation"},
        {"{\"replacements\": 1, " LAST("0", "b", "lost", "1", "2", "2") "}", "spares: last_replacement.generation"},
        {"{\"replacements\": 1, " LAST("2", "b c", "lost", "1", "2", "2") "}", "spares: last_replacement.lost"},
        {"{\"replacements\": 1, " LAST("2", "b", "bored", "1", "2", "2") "}", "spares: last_replacement.why"},
        {"{\"replacements\": 1, " LAST("2", "b", "lost", "-1", "2", "2") "}", "spares: last_replacement.node_rank"},
        {"{\"replacements\": 1, " LAST("2", "b", "lost", "1", "-2", "2") "}", "spares: last_replacement.first_rank"},
        {"{\"replacements\": 1, " LAST("2", "b", "lost", "1", "2", "0") "}", "spares: last_replacement.nranks"},
        {"{\"replacements\": 1, " LAST("2", "b", "lost", "1", "2", "99999") "}", "spares: last_replacement.nranks"},
        {"{\"replacements\": 1}", "spares: "},
        {"{\"replacements\": 1, " LAST("2", "b", "lost", "1", "2", "2") ", \"extra\": 1}", "spares: "},
        {"[]", "spares: "},
        {"\"lots\"", "spares: "},
        {huge, "spares: last_replacement.lost"},
    };
#undef LAST
    static char text[sizeof(huge) + sizeof(head) + 16];
    static struct rdv_saved back;
    char err[512];
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        snprintf(text, sizeof(text), "%s%s}", head, cases[i].spares);
        int rc = state_from_text(text, "etcd /muster/t/state", &back, err, sizeof(err));
        ck_assert_msg(rc == -EINVAL, "case %zu taken: %s", i, cases[i].spares);
        ck_assert_msg(strstr(err, cases[i].says) && strstr(err, "etcd /muster/t/state"),
                      "case %zu: the error does not say '%s': %s", i, cases[i].says, err);
    }
    /* the same document with a sound entry is taken, the lost node a stranger to members as it must be */
    snprintf(text, sizeof(text), "%s{\"replacements\": 7, \"last_replacement\": {\"generation\": 3, \"wall_ms\": 1, "
             "\"lost\": \"gone-for-good\", \"spare\": \"s\", \"why\": \"unfit\", \"node_rank\": 1, \"first_rank\": 2, "
             "\"nranks\": 2, \"same_domain\": true}}}", head);
    ck_assert_msg(state_from_text(text, "test", &back, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(back.replacements, 7);
    ck_assert_str_eq(back.last_replacement.lost, "gone-for-good");
}
END_TEST

/* Attack: a job at the limit, nodes + spare_nodes = the most musterd holds.
 * It forms with its nodes, the last agent a spare; a member lost is
 * replaced, and a stranger then finds room as the new spare. */
START_TEST(spares_at_the_node_limit)
{
    setup_spec(RDV_MAX_NODES - 1, 5);
    spec.spare_nodes = 1;
    spec.batch = RDV_MAX_NODES - 1;
    rec_overflow = 1;
    char name[32];
    for (int i = 0; i < RDV_MAX_NODES; i++) {
        rec.nsent = 0;
        snprintf(name, sizeof(name), "n%04d", i);
        ck_assert_msg(join(name, 1, 0) == 0, "%s refused: %s", name, last_reject_code());
    }
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    ck_assert_int_eq(rdv.world_size, RDV_MAX_NODES - 1);
    ck_assert_int_eq(rdv.nodes[node_index("n4095")].member, 0);
    ck_assert_int_ge(rec_dropped, RDV_MAX_NODES - 1 - MAX_SENT); /* an ASSIGN each */
    rec.nsent = 0;
    ck_assert_int_eq(join("stranger", 1, 0), -1);
    ck_assert_str_eq(last_reject_code(), "full");
    rec.nsent = 0;
    rdv_disconnected(&rdv, "n0007", "connection closed", now);
    ck_assert_int_eq(rdv.nodes[node_index("n4095")].member, 1);
    ck_assert_int_eq(rdv.nodes[node_index("n4095")].first_rank, 7);
    ck_assert_int_eq(rdv.world_size, RDV_MAX_NODES - 1);
    rec.nsent = 0;
    ck_assert_int_eq(join("stranger", 1, 0), 0);
    ck_assert_int_eq(rdv_is_spare(&rdv, node_index("stranger")), 1);
}
END_TEST

/* Attack: a member replaced because it is unfit stays connected (its agent
 * is fine, its pre-flight is not). It holds no spare's place: a healthy
 * agent joining after it is the job's spare, not refused "full". */
START_TEST(unfit_replaced_node_does_not_hold_the_spare_place)
{
    form_with_spares(1, NULL, NULL, 0);
    ck_assert_int_eq(join_checked("s", 2, 0), 0);
    preflight("s", 1, "");
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_int_eq(rdv.nodes[node_index("s")].member, 1);
    beat("a", 2, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("s", 2, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(join_checked("b", 2, 0), 0); /* back, as the spare, but unfit */
    preflight("b", 0, "torch: not importable");
    ck_assert_int_eq(spares_figure("ready"), 0);
    rec.nsent = 0;
    ck_assert_msg(join_checked("t", 2, 0) == 0, "a healthy spare refused while the unfit b holds the place");
    preflight("t", 1, "");
    ck_assert_int_eq(spares_figure("ready"), 1);
    ck_assert_int_eq(join_checked("u", 2, 0), -1); /* one ready spare is all the job wants */
    rdv_disconnected(&rdv, "s", "connection closed", now);
    ck_assert_str_eq(rdv.last_replacement.spare, "t");
}
END_TEST

/* Among ready spares of no better domain, the one that joined first takes
 * the place, however the node table was reordered (a node that left before
 * formation gives its slot to the last one). */
START_TEST(first_spare_to_join_is_taken_whatever_its_slot)
{
    setup_spec(2, 5);
    spec.spare_nodes = 3;
    const char *const order[] = {"a", "b", "s", "t", "u"};
    for (int i = 0; i < 5; i++) {
        now += 10;
        ck_assert_int_eq(join_checked(order[i], 2, 0), 0);
    }
    rdv_disconnected(&rdv, "s", "connection closed", now); /* before formation: u takes s's slot */
    for (int i = 0; i < 5; i++)
        if (i != 2)
            preflight(order[i], 1, "");
    ck_assert_int_eq(rdv.state, RDV_FORMING);
    beat("a", 1, 0, 2, PROTO_RANK_RUNNING, 1);
    beat("b", 1, 2, 2, PROTO_RANK_RUNNING, 1);
    ck_assert_int_eq(rdv.state, RDV_RUNNING);
    rdv_disconnected(&rdv, "b", "connection closed", now);
    ck_assert_str_eq(rdv.last_replacement.spare, "t");
}
END_TEST

/* A stranger joining a finished job is told that the job is over, not that
 * it has its nodes and spares (which it may not: they finished and left). */
START_TEST(join_after_the_job_finished_says_so)
{
    form_with_spares(1, NULL, NULL, 0);
    for (uint32_t k = 0; k < 4; k++)
        rank_exit(k < 2 ? "a" : "b", 1, k, 0, 0);
    ck_assert_int_eq(rdv.state, RDV_COMPLETED);
    struct proto_hello h;
    char code[32], reason[PROTO_REASON_MAX];
    hello_of(&h, "late", 2, 0);
    ck_assert_int_eq(rdv_join(&rdv, &h, now, code, reason), -1);
    ck_assert_str_eq(code, "full");
    ck_assert_msg(strstr(reason, "job t is completed") != NULL, "reason: %s", reason);
}
END_TEST

static TCase *rdv_case(Suite *s, const char *name)
{
    TCase *tc = tcase_create(name);
    tcase_set_timeout(tc, 10);
    tcase_add_checked_fixture(tc, NULL, teardown);
    suite_add_tcase(s, tc);
    return tc;
}

Suite *make_rdv_suite(void)
{
    Suite *s = suite_create("rdv");
    TCase *tc;

    tc = rdv_case(s, "state"); /* the job state machine and the rank counters (rdv.c) */
    tcase_add_test(tc, job_state_changes_only_along_the_machine);
    tcase_add_test(tc, job_state_machine_is_the_documented_one);
    tcase_add_test(tc, rank_counters_follow_every_state_change);
    tcase_add_test(tc, rank_counters_survive_stop_restore_and_shrink);

    tc = rdv_case(s, "join"); /* nodes joining, resuming sessions, lost (rdv_join.c) */
    tcase_add_test(tc, missed_heartbeats_lose_the_node_until_it_rejoins);
    tcase_add_test(tc, a_pause_never_loses_a_node_just_heard);
    tcase_add_test(tc, tick_loses_every_silent_node_before_formation);
    tcase_add_test(tc, closed_connection_is_lost_at_once);
    tcase_add_test(tc, log_data_counts_as_hearing_from_the_node);
    tcase_add_test(tc, resumed_session_keeps_the_generation);
    tcase_add_test(tc, another_session_is_a_duplicate);
    tcase_add_test(tc, resume_while_forming_gives_back_what_was_missed);
    tcase_add_test(tc, resume_without_its_ranks_fails_the_generation);
    tcase_add_test(tc, joins_refused_with_reasons);
    tcase_add_test(tc, node_lookup_by_name_survives_removals);
    tcase_add_test(tc, namemap_deletes_without_losing_colliding_names);
    tcase_add_test(tc, unfit_reason_with_control_characters_reaches_no_terminal_raw);

    tc = rdv_case(s, "form"); /* forming: layout, fitness, checkpoints, MASTER_PORT, unique id (rdv_form.c) */
    tcase_add_test(tc, forms_generation_one_in_name_order);
    tcase_add_test(tc, unique_id_from_rank0_reaches_every_node);
    tcase_add_test(tc, unique_id_taken_once_per_generation);
    tcase_add_test(tc, stacks_kept_within_budget);
    tcase_add_test(tc, stale_frames_are_refused);
    tcase_add_test(tc, ranks_that_never_run_are_a_failure);
    tcase_add_test(tc, assign_names_rank0_address_port_and_restarts);
    tcase_add_test(tc, no_free_port_holds_the_generation);
    tcase_add_test(tc, next_generation_never_gets_a_port_reported_before_the_last_assign);
    tcase_add_test(tc, a_rejoined_agent_that_never_had_the_last_assign_gives_its_port);
    tcase_add_test(tc, memory_checkpoint_common_to_every_member_goes_in_assign);
    tcase_add_test(tc, memory_checkpoint_report_is_waited_for_a_bounded_time);
    tcase_add_test(tc, memory_checkpoint_replica_comes_from_the_buddy);
    tcase_add_test(tc, memory_checkpoint_buddy_is_in_another_domain);
    tcase_add_test(tc, memory_checkpoint_buddy_map_is_total_with_some_unlabelled);
    tcase_add_test(tc, spare_note_becomes_an_event);
    tcase_add_test(tc, memory_checkpoint_drained_is_resumed_when_memory_is_lost);
    tcase_add_test(tc, spare_note_flood_is_held_back);
    tcase_add_test(tc, unfit_node_holds_formation_without_spending_restarts);
    tcase_add_test(tc, plan_that_does_not_fit_is_refused_naming_the_device);
    tcase_add_test(tc, diverging_checkpoints_hold_the_generation_naming_each_node);
    tcase_add_test(tc, diverging_checkpoints_may_be_accepted);
    tcase_add_test(tc, checkpoints_a_job_does_not_ask_for_are_not_compared);
    tcase_add_test(tc, long_checkpoint_names_cut_short_stay_utf8);
    tcase_add_test(tc, ranks_that_rejoin_in_place_are_not_compared);
    tcase_add_test(tc, min_nodes_forms_without_an_unfit_node_after_the_window);

    tc = rdv_case(s, "beat"); /* heartbeats and the tick's deadlines (rdv_beat.c) */
    tcase_add_test(tc, heartbeat_is_answered_only_when_asked);
    tcase_add_test(tc, tick_deadlines_are_exact_across_ticks_and_generations);
    tcase_add_test(tc, tick_skipping_agrees_with_scanning_every_tick);
    tcase_add_test(tc, rank0_reports_committed_checkpoints);

    tc = rdv_case(s, "fail"); /* failures, the restart policy, shrinking, the job's end (rdv_fail.c) */
    tcase_add_test(tc, crashed_rank_opens_next_generation);
    tcase_add_test(tc, budget_spent_fails_the_job);
    tcase_add_test(tc, exit_zero_everywhere_completes);
    tcase_add_test(tc, ended_job_settles_rank_states);
    tcase_add_test(tc, absent_member_shrinks_the_job_to_min_nodes);
    tcase_add_test(tc, absent_member_fails_a_job_that_may_not_shrink);
    tcase_add_test(tc, admin_stop_and_restart);
    tcase_add_test(tc, failure_reason_reaches_status_and_events);
    tcase_add_test(tc, failure_streaks_back_off);
    tcase_add_test(tc, failures_are_classified);
    tcase_add_test(tc, restart_window_forgets_old_restarts);
    tcase_add_test(tc, after_a_failure_fresh_starters_report_their_checkpoint_again);

    tc = rdv_case(s, "grow"); /* growing by a node, the yield at a step boundary (rdv_grow.c) */
    tcase_add_test(tc, new_node_grows_a_job_below_its_size);
    tcase_add_test(tc, grow_waits_for_the_ranks_to_leave_at_a_step_boundary);
    tcase_add_test(tc, grow_parks_ranks_that_did_not_leave_in_time);
    tcase_add_test(tc, grow_whose_node_left_goes_on_without_it);
    tcase_add_test(tc, grow_of_ranks_that_cannot_rejoin_is_at_once);
    tcase_add_test(tc, yielded_ranks_without_a_grow_go_on_in_the_same_shape);
    tcase_add_test(tc, new_node_grows_the_job_once_it_is_fit);

    tc = rdv_case(s, "hang"); /* hangs, their timeout and naming, stacks (rdv_hang.c, hang.c) */
    tcase_add_test(tc, hang_names_the_rank_whose_heartbeats_stopped);
    tcase_add_test(tc, stalled_step_is_a_hang);
    tcase_add_test(tc, hang_names_the_stopped_rank_with_where_it_is);
    tcase_add_test(tc, hang_names_a_stopped_rank_before_the_progress_timeout);
    tcase_add_test(tc, stopped_rank_with_peers_stepping_waits_for_the_timeout);
    tcase_add_test(tc, collective_error_is_put_down_to_the_stopped_peer);
    tcase_add_test(tc, auto_timeout_counts_the_steps_a_beat_brings);
    tcase_add_test(tc, hang_names_the_rank_not_in_a_collective);
    tcase_add_test(tc, hang_is_named_by_the_flight_recorders);
    tcase_add_test(tc, silent_rank_stopped_past_the_timeout_is_hung);
    tcase_add_test(tc, step_seen_late_is_not_a_stall);
    tcase_add_test(tc, auto_timeout_follows_the_steps);
    tcase_add_test(tc, median_is_of_the_last_samples);
    tcase_add_test(tc, rank_ranges_compress);
    tcase_add_test(tc, silent_rank_is_never_hung);
    tcase_add_test(tc, rejoined_ranks_wait_for_a_slow_replacement_without_a_hang);

    tc = rdv_case(s, "resume"); /* the state file and a restored generation (rdv_resume.c) */
    tcase_add_test(tc, restored_job_resumes_without_a_new_generation);
    tcase_add_test(tc, restored_job_restarts_when_ranks_are_gone);
    tcase_add_test(tc, restart_during_recovery_spends_nothing_more);
    tcase_add_test(tc, restored_recovery_gives_an_early_id_to_members_back_later);
    tcase_add_test(tc, restored_recovery_drops_the_id_of_a_rank0_gone_since);
    tcase_add_test(tc, restored_forming_generation_waits_for_its_ranks);
    tcase_add_test(tc, restored_forming_rank_that_never_starts_fails_after_start_timeout);
    tcase_add_test(tc, restored_forming_member_back_without_ranks_fails_the_generation);
    tcase_add_test(tc, restored_running_generation_runs_at_once_across_two_restarts);
    tcase_add_test(tc, restored_shrunk_job_grows_by_a_node_that_joined_meanwhile);
    tcase_add_test(tc, restored_job_stopped_while_members_are_awaited_stays_stopped);
    tcase_add_test(tc, restored_job_completed_while_a_member_is_away_is_saved_completed);
    tcase_add_test(tc, state_file_says_whether_the_generation_ran);
    tcase_add_test(tc, inconsistent_saved_state_is_refused);

    tc = rdv_case(s, "spare"); /* hot spare nodes (rdv_spare.c) */
    tcase_add_test(tc, spares_join_beyond_nodes_without_ranks);
    tcase_add_test(tc, spares_before_formation_are_bounded);
    tcase_add_test(tc, lost_member_is_replaced_by_a_spare_at_once);
    tcase_add_test(tc, slow_node_is_swapped_for_the_spare_at_a_step_boundary);
    tcase_add_test(tc, replacement_comes_from_the_lost_nodes_domain);
    tcase_add_test(tc, spare_must_match_and_replaces_an_unfit_member);
    tcase_add_test(tc, no_spares_without_the_key);
    tcase_add_test(tc, replacement_survives_a_restore);
    tcase_add_test(tc, replaced_node_back_with_live_ranks_has_them_stopped);
    tcase_add_test(tc, restored_recovery_keeps_members_that_are_slow_to_rejoin);
    tcase_add_test(tc, spare_dying_when_chosen_keeps_the_layout);
    tcase_add_test(tc, spares_coming_and_going_do_not_fill_the_node_table);
    tcase_add_test(tc, hostile_spares_in_a_state_document_are_refused);
    tcase_add_test(tc, spares_at_the_node_limit);
    tcase_add_test(tc, unfit_replaced_node_does_not_hold_the_spare_place);
    tcase_add_test(tc, first_spare_to_join_is_taken_whatever_its_slot);
    tcase_add_test(tc, join_after_the_job_finished_says_so);

    tc = rdv_case(s, "status"); /* the status document (rdv_status.c) */
    tcase_add_test(tc, status_document_has_the_promised_fields);
    tcase_add_test(tc, overflowing_sums_keep_status_valid);
    return s;
}
