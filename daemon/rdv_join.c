/* daemon/rdv_join.c: nodes joining (WELCOME, a resumed session, a member back), their
 * pre-flight, and nodes lost (see rdv.h). */
#include "daemon/rdv_internal.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

/* A fresh session for a join: random, so that only the agent it was given to can resume it. */
static uint64_t new_session(void)
{
    uint8_t bytes[PROTO_NONCE_LEN];
    uint64_t s = 0;
    if (proto_nonce(bytes) == 0)
        memcpy(&s, bytes, sizeof(s));
    return s & PROTO_U64_MAX; /* 0 (no randomness to be had): this join cannot be resumed */
}

static void send_welcome(struct rdv *r, uint32_t node)
{
    struct proto_msg m = {.type = PROTO_WELCOME};
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    m.u.welcome.heartbeat_interval_ms = (uint32_t)r->spec->heartbeat_interval_ms;
    m.u.welcome.heartbeat_timeout_ms = (uint32_t)r->spec->heartbeat_timeout_ms;
    m.u.welcome.lease_ms = (uint32_t)r->spec->lease_ms;
    m.u.welcome.session = r->nodes[node].session;
    m.u.welcome.time_ms = (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
    m.u.welcome.job = r->job; /* for the agent's pre-flight; the message does not own it */
    m.u.welcome.term = r->term;
    rdv__send_to(r, node, &m);
}

/* Device facts and the pre-flight promise of a HELLO. */
static void take_facts(struct rdv_node *nd, const struct proto_hello *h, uint64_t now_ms)
{
    nd->gpu_name[0] = '\0';
    nd->gpu_total_mb = nd->gpu_free_mb = 0;
    for (uint32_t i = 0; i < h->ngpus; i++) {
        if (i == 0 || h->gpus[i].total_mb < nd->gpu_total_mb) {
            snprintf(nd->gpu_name, sizeof(nd->gpu_name), "%s", h->gpus[i].name);
            nd->gpu_total_mb = h->gpus[i].total_mb;
        }
        if (i == 0 || h->gpus[i].free_mb < nd->gpu_free_mb)
            nd->gpu_free_mb = h->gpus[i].free_mb;
    }
    nd->device_mem_mb = h->device_mem_mb;
    nd->host_mem_mb = h->host_mem_mb;
    nd->fitness = h->preflight ? RDV_FIT_CHECKING : RDV_FIT_UNCHECKED;
    nd->unfit_reason[0] = nd->plan_unfit[0] = '\0';
    nd->has_checkpoint = 0;
    nd->nmemckpt = 0; /* a new agent: what it holds comes in its heartbeats */
    nd->reports_memckpt = 0;
    nd->replica_of[0] = '\0';
    nd->spare_note[0] = '\0';
    nd->nreplica = 0;
    nd->ndrained = 0;
    nd->reports_drained = 0;
    nd->unfit_since_ms = now_ms;
}

/* s as one line of UTF-8 without control characters (C0, DEL, C1): each becomes a space. */
static void one_line(char *s)
{
    unsigned char *p = (unsigned char *)s;
    proto_text_sanitize(s);
    for (size_t i = 0; p[i]; i++) {
        if (p[i] < 0x20 || p[i] == 0x7f)
            p[i] = ' ';
        else if (p[i] == 0xc2 && p[i + 1] >= 0x80 && p[i + 1] <= 0x9f)
            p[i] = p[i + 1] = ' ';
    }
}

/* PREFLIGHT: the node's checks passed or failed; either may let the job go on. */
void rdv__on_preflight(struct rdv *r, uint32_t idx, const struct proto_preflight *p, uint64_t now_ms)
{
    struct rdv_node *nd = &r->nodes[idx];
    enum rdv_fitness was = nd->fitness;
    nd->trainer = p->trainer;
    nd->has_checkpoint = p->has_checkpoint;
    nd->reports_checkpoint |= p->has_checkpoint;
    snprintf(nd->checkpoint, sizeof(nd->checkpoint), "%s", p->has_checkpoint ? p->checkpoint : "");
    if (p->fit) {
        nd->fitness = RDV_FIT_OK;
        nd->unfit_reason[0] = '\0';
        if (was == RDV_FIT_UNFIT)
            rdv__event(r, "node_fit", (int)idx, -1, "node %s is fit: its pre-flight checks pass", nd->name);
    } else {
        /* the reason names the job's paths, which may hold any character: none reaches a terminal raw */
        char reason[sizeof(nd->unfit_reason)];
        snprintf(reason, sizeof(reason), "%s", p->reason);
        one_line(reason);
        if (was != RDV_FIT_UNFIT || strcmp(nd->unfit_reason, reason) != 0)
            rdv__event(r, "node_unfit", (int)idx, -1, "node %s is unfit: %s", nd->name, reason);
        if (was != RDV_FIT_UNFIT)
            nd->unfit_since_ms = now_ms;
        nd->fitness = RDV_FIT_UNFIT;
        snprintf(nd->unfit_reason, sizeof(nd->unfit_reason), "%s", reason);
    }
    rdv__maybe_form(r, now_ms);
    if (nd->member && !rdv_terminal(r) && (r->state == RDV_RECOVERING || r->state == RDV_FORMING))
        rdv__try_start_generation(r, now_ms);
    else if (!nd->member && nd->state == RDV_NODE_JOINED) {
        rdv__maybe_grow(r, idx, now_ms); /* a node that joined a running job counts once it is fit */
        if (!rdv_terminal(r))
            rdv__try_start_generation(r, now_ms); /* a spare, now ready, for a member the generation waits for */
    }
    rdv__changed(r, 0);
}

/*
 * A member is back on a new connection: rejoining after it was lost, or
 * resuming its session after a stalled link. It is given what it may have
 * missed; when its ranks of a running generation are gone, that generation
 * has failed.
 */
static void member_back(struct rdv *r, uint32_t idx, uint64_t its_generation, uint64_t now_ms)
{
    const struct rdv_node *nd = &r->nodes[idx];
    int pending = 0, expected = 0;
    for (uint32_t l = 0; l < nd->ndevices; l++) {
        enum rdv_rank_state st = r->ranks[nd->first_rank + l].state;
        pending |= st == RDV_RANK_PENDING;
        expected |= st == RDV_RANK_STARTING || st == RDV_RANK_RUNNING;
    }
    if (pending) {
        rdv__try_start_generation(r, now_ms);
        return;
    }
    if (!expected)
        return; /* its ranks are over (completed, exited, being stopped) */
    const int starting = r->state == RDV_FORMING || r->state == RDV_RECOVERING;
    if (its_generation == r->generation) {
        if (starting)
            rdv__send_unique_id(r, idx);
        return;
    }
    /* No master_port: the generation was assigned before musterd restarted,
     * and its ASSIGN cannot be told again. */
    if (starting && r->master_port) {
        rdv__resend_assign(r, idx);
        rdv__send_unique_id(r, idx);
        return;
    }
    char what[PROTO_REASON_MAX];
    snprintf(what, sizeof(what), "node %s came back without its ranks of generation %llu", nd->name,
             (unsigned long long)r->generation);
    rdv__fail_generation(r, now_ms, (int)idx, -1, what);
}

/*
 * The node table is full (spares of a pool come and go under new names): the
 * slot of the node gone longest that holds nothing (not a member, not
 * connected, not the one a grow waits for) is freed for a new name; -1 if
 * none. Its name is forgotten: if it comes back, it is a new node.
 */
static int forget_a_gone_node(struct rdv *r)
{
    int oldest = -1;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (nd->member || nd->state == RDV_NODE_JOINED || (r->yielding && r->grow_node == i))
            continue;
        if (oldest < 0 || nd->last_seen_ms < r->nodes[oldest].last_seen_ms)
            oldest = (int)i;
    }
    if (oldest >= 0)
        namemap_del(&r->byname, r->nodes[oldest].name);
    return oldest;
}

int rdv_join(struct rdv *r, const struct proto_hello *h, uint64_t now_ms, char code[32],
             char reason[PROTO_REASON_MAX])
{
    int idx = rdv__find_node(r, h->node);
    /* A connected node whose agent names its session: the same agent on a new connection. */
    const int resumes = idx >= 0 && r->nodes[idx].state == RDV_NODE_JOINED && h->session &&
                        h->session == r->nodes[idx].session;

    if (idx >= 0 && r->nodes[idx].state == RDV_NODE_JOINED && !resumes) {
        snprintf(code, 32, "duplicate");
        snprintf(reason, PROTO_REASON_MAX, "a node named %s is already connected (from %s)", h->node,
                 r->nodes[idx].addr);
        rdv__event(r, "join_refused", idx, -1, "node %s refused: %s", h->node, reason);
        return -1;
    }
    if (idx >= 0 && r->nodes[idx].member && r->nodes[idx].ndevices != h->ndevices) {
        snprintf(code, 32, "bad_request");
        snprintf(reason, PROTO_REASON_MAX,
                 "node %s holds a block of %u ranks in this job but came back with %u devices", h->node,
                 r->nodes[idx].ndevices, h->ndevices);
        rdv__event(r, "join_refused", idx, -1, "node %s refused: %s", h->node, reason);
        return -1;
    }
    /* Before generation 1, the first spec->nodes + spare_nodes names; after
     * it, a new name only while the job runs below its wanted size (it grows:
     * maybe_grow) or has fewer than spare_nodes spares not found unfit
     * (rdv_spare.c). */
    const uint32_t wanted = (uint32_t)r->spec->nodes, spares = (uint32_t)r->spec->spare_nodes;
    if (idx < 0 && (r->generation > 0 ? (rdv__member_count(r) >= wanted && rdv__spare_places(r) >= spares) ||
                                            rdv_terminal(r)
                                      : r->nnodes >= wanted + spares)) {
        snprintf(code, 32, "full");
        if (r->generation > 0 && rdv_terminal(r))
            snprintf(reason, PROTO_REASON_MAX, "job %s is %s; %s has nothing to join", r->spec->name,
                     rdv_job_state_name(r->state), h->node);
        else if (spares)
            snprintf(reason, PROTO_REASON_MAX, "job %s already has its %d node%s and %d spare%s; %s is not one of them",
                     r->spec->name, r->spec->nodes, r->spec->nodes == 1 ? "" : "s", r->spec->spare_nodes,
                     r->spec->spare_nodes == 1 ? "" : "s", h->node);
        else
            snprintf(reason, PROTO_REASON_MAX, "job %s already has its %d node%s; %s is not one of them",
                     r->spec->name, r->spec->nodes, r->spec->nodes == 1 ? "" : "s", h->node);
        rdv__event(r, "join_refused", -1, -1, "node %s refused: %s", h->node, reason);
        return -1;
    }
    const int fresh = idx < 0;
    if (idx < 0 && r->nnodes >= RDV_MAX_NODES)
        idx = forget_a_gone_node(r);
    if (idx < 0) {
        if (r->nnodes >= RDV_MAX_NODES) {
            snprintf(code, 32, "full");
            snprintf(reason, PROTO_REASON_MAX, "musterd holds at most %d nodes, all of them members or connected",
                     RDV_MAX_NODES);
            rdv__event(r, "join_refused", -1, -1, "node %s refused: %s", h->node, reason);
            return -1;
        }
        idx = (int)r->nnodes++;
    }
    if (fresh) {
        memset(&r->nodes[idx], 0, sizeof(r->nodes[idx]));
        snprintf(r->nodes[idx].name, sizeof(r->nodes[idx].name), "%s", h->node);
        namemap_put(&r->byname, r->nodes[idx].name, (uintptr_t)idx);
    }

    struct rdv_node *nd = &r->nodes[idx];
    const uint64_t silence_ms = now_ms - nd->last_seen_ms;
    if (resumes)
        r->ops.disconnect(r->ops.ctx, nd->name, "replaced by the agent's new connection (session resumed)");
    nd->session = new_session();
    if (!resumes)
        nd->assign_sent_gen = 0; /* nothing was sent on the new session yet */
    snprintf(nd->addr, sizeof(nd->addr), "%s", h->addr);
    nd->free_port = h->free_port;
    nd->free_port_gen = h->generation;
    nd->kind = h->kind;
    nd->ndevices = h->ndevices;
    memcpy(nd->devices, h->devices, sizeof(nd->devices));
    nd->state = RDV_NODE_JOINED;
    nd->last_seen_ms = now_ms;
    nd->joined_ms = now_ms;
    nd->reported_generation = h->generation;
    nd->restored = 0;
    snprintf(nd->domain, sizeof(nd->domain), "%s", h->domain);
    take_facts(nd, h, now_ms);
    if (nd->member) {
        /* A returning member keeps its block; devices may be renumbered. */
        for (uint32_t l = 0; l < nd->ndevices && r->ranks; l++)
            r->ranks[nd->first_rank + l].device = nd->devices[l];
    }
    const int spare = r->generation > 0 && rdv_is_spare(r, (uint32_t)idx) && rdv__member_count(r) >= wanted;
    if (resumes)
        rdv__event(r, "node_resumed", idx, -1, "node %s resumed its session from %s on a new connection, %.1f s "
                   "after its last frame", nd->name, nd->addr, (double)silence_ms / 1000.0);
    else
        rdv__event(r, "node_joined", idx, -1, "node %s joined from %s with %u %s device%s%s", nd->name, nd->addr,
                   nd->ndevices, nd->kind == PROTO_DEV_GPU ? "gpu" : "cpu", nd->ndevices == 1 ? "" : "s",
                   nd->member ? " (rejoined its rank block)" : spare ? " as a spare" : "");
    send_welcome(r, (uint32_t)idx);
    /* A spare whose ranks still run (a replaced member whose agent survived
     * its lost connection): they hold no block of this generation, nobody
     * leads them any more; they stop, and the node waits empty as a spare. */
    if (spare && h->generation) {
        rdv__event(r, "spare_ranks_stopped", idx, -1, "node %s is a spare but its ranks still run generation %llu: "
                   "stopped", nd->name, (unsigned long long)h->generation);
        rdv__send_command(r, (uint32_t)idx, PROTO_CMD_STOP);
    }

    if (r->state == RDV_WAITING) {
        rdv__maybe_form(r, now_ms);
    } else if (r->resuming && nd->member) {
        if (h->generation == r->generation) {
            rdv__check_resumed(r, now_ms);
        } else {
            char what[PROTO_REASON_MAX];
            snprintf(what, sizeof(what), "node %s rejoined the restarted daemon without its ranks", nd->name);
            rdv__fail_generation(r, now_ms, idx, -1, what);
        }
    } else if (nd->member && !rdv_terminal(r)) {
        member_back(r, (uint32_t)idx, h->generation, now_ms);
    } else if (!nd->member) {
        rdv__maybe_grow(r, (uint32_t)idx, now_ms);
        rdv__try_start_generation(r, now_ms); /* a spare for a member the generation waits for */
    }
    /* A join alone changes nothing the state file keeps; what it sets off persists itself. */
    rdv__changed(r, 0);
    return 0;
}

/* A node is gone: forget it before formation, fail its generation after. */
static void node_lost(struct rdv *r, uint32_t idx, const char *why, uint64_t now_ms)
{
    struct rdv_node *nd = &r->nodes[idx];
    char what[PROTO_REASON_MAX];

    nd->state = RDV_NODE_LOST;
    rdv__event(r, "node_lost", (int)idx, -1, "node %s lost: %s", nd->name, why);
    if (!nd->member) {
        if (r->state == RDV_WAITING)
            rdv__remove_node(r, idx);
        rdv__changed(r, 0);
        return;
    }
    if (rdv_terminal(r)) {
        rdv__changed(r, 0);
        return;
    }
    if (r->resuming) {
        rdv__changed(r, 0);
        return;
    }
    snprintf(what, sizeof(what), "node %s lost: %s", nd->name, why);
    /* Already recovering and nothing assigned yet: the same failure continues. */
    if (r->state == RDV_RECOVERING && r->ranks[nd->first_rank].state == RDV_RANK_PENDING) {
        rdv__try_start_generation(r, now_ms);
        rdv__changed(r, 1);
        return;
    }
    rdv__fail_generation(r, now_ms, (int)idx, -1, what);
}

void rdv_disconnected(struct rdv *r, const char *name, const char *why, uint64_t now_ms)
{
    int idx = rdv__find_node(r, name);
    if (idx < 0 || r->nodes[idx].state != RDV_NODE_JOINED)
        return;
    node_lost(r, (uint32_t)idx, why, now_ms);
}

/* Nodes silent for heartbeat_timeout_ms are lost. */
void rdv__check_lost(struct rdv *r, uint64_t now_ms)
{
    const uint64_t timeout = (uint64_t)r->spec->heartbeat_timeout_ms;
    if (now_ms < r->lost_due_ms)
        return;
    uint64_t oldest = now_ms;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        struct rdv_node *nd = &r->nodes[i];
        if (nd->state != RDV_NODE_JOINED)
            continue;
        if (now_ms > nd->last_seen_ms && now_ms - nd->last_seen_ms > timeout) {
            char why[96];
            snprintf(why, sizeof(why), "no heartbeat for %.1f s (heartbeat_timeout_ms=%llu)",
                     (double)(now_ms - nd->last_seen_ms) / 1000.0, (unsigned long long)timeout);
            r->ops.disconnect(r->ops.ctx, nd->name, why);
            const uint32_t before = r->nnodes;
            node_lost(r, i, why, now_ms);
            if (r->nnodes < before)
                i--; /* removed (before formation): the last node took its place */
        } else if (nd->last_seen_ms < oldest) {
            oldest = nd->last_seen_ms;
        }
    }
    /* A node's last frame only moves later, and a node that joins is heard now. */
    r->lost_due_ms = oldest + timeout + 1;
}

void rdv_paused(struct rdv *r, uint64_t ms, uint64_t now_ms)
{
    for (uint32_t i = 0; i < r->nnodes; i++) {
        struct rdv_node *nd = &r->nodes[i];
        if (nd->state == RDV_NODE_JOINED)
            nd->last_seen_ms = nd->last_seen_ms + ms < now_ms ? nd->last_seen_ms + ms : now_ms;
    }
    r->lost_due_ms = 0; /* the next check finds the oldest again */
}
