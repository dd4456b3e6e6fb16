/* daemon/rdv_form.c: forming generations: the rank layout, whether every member is fit and
 * agrees on its checkpoint, MASTER_PORT, ASSIGN, the unique id, and a generation that starts
 * running or never does (see rdv.h). */
#include "daemon/rdv_internal.h"
#include "daemon/fitness.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/batch.h"
#include "common/log.h"
#include "common/memtags.h"

static int cmp_names(const void *a, const void *b)
{
    const struct rdv_node *const *x = a, *const *y = b;
    return strcmp((*x)->name, (*y)->name);
}

/* Lays out rank blocks for the current members: name order, contiguous. */
int rdv__layout_members(struct rdv *r)
{
    struct rdv_node *order[RDV_MAX_NODES];
    uint32_t n = 0, world = 0;

    for (uint32_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].member)
            order[n++] = &r->nodes[i];
    qsort(order, n, sizeof(order[0]), cmp_names);
    for (uint32_t i = 0; i < n; i++) {
        order[i]->first_rank = world;
        world += order[i]->ndevices;
    }
    return (int)world;
}

/* (Re)builds the rank table from the members' blocks. */
int rdv__build_ranks(struct rdv *r)
{
    uint32_t world = 0;
    for (uint32_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].member)
            world += r->nodes[i].ndevices;
    struct rdv_rank *ranks = calloc(world ? world : 1, sizeof(*ranks));
    if (!ranks)
        return -ENOMEM;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!nd->member)
            continue;
        for (uint32_t l = 0; l < nd->ndevices; l++) {
            struct rdv_rank *rk = &ranks[nd->first_rank + l];
            rk->node = i;
            rk->local_rank = l;
            rk->device = nd->devices[l];
            rk->state = RDV_RANK_PENDING;
            rk->loss = NAN;
        }
    }
    free(r->ranks);
    r->ranks = ranks;
    r->world_size = world;
    memset(r->nranks_in, 0, sizeof(r->nranks_in));
    r->nranks_in[RDV_RANK_PENDING] = world;
    return 0;
}

/* The member that holds global rank 0. */
static const struct rdv_node *rank0_node(const struct rdv *r)
{
    return r->world_size ? &r->nodes[r->ranks[0].node] : NULL;
}

/* node_rank: the member's index in name order (torchrun's GROUP_RANK), of nnodes. */
static void send_assign(struct rdv *r, uint32_t node, uint32_t node_rank, uint32_t nnodes, uint32_t master_port)
{
    struct rdv_node *nd = &r->nodes[node];
    nd->assign_sent_gen = r->generation;
    struct proto_msg m; /* to each member: the assignment is zeroed, not the whole union */
    m.type = PROTO_ASSIGN;
    m.u.assign = (struct proto_assign){0};
    m.u.assign.generation = r->generation;
    m.u.assign.world_size = r->world_size;
    m.u.assign.nranks = nd->ndevices;
    for (uint32_t l = 0; l < nd->ndevices; l++) {
        m.u.assign.ranks[l].rank = nd->first_rank + l;
        m.u.assign.ranks[l].local_rank = l;
        m.u.assign.ranks[l].device = nd->devices[l];
    }
    m.u.assign.node_rank = node_rank;
    m.u.assign.nnodes = nnodes;
    m.u.assign.restart_count = r->restarts;
    snprintf(m.u.assign.master_addr, sizeof(m.u.assign.master_addr), "%s", rank0_node(r)->addr);
    m.u.assign.master_port = master_port;
    m.u.assign.job = r->job;
    m.u.assign.job_text = r->job_text;
    m.u.assign.term = r->term;
    /* named only when every member has said what it holds: an agent removes what is newer */
    if (r->spec->memory_checkpoint_mb)
        m.u.assign.has_memckpt = rdv_memckpt_common(r, m.u.assign.memckpt, sizeof(m.u.assign.memckpt)) >= 0;
    if (r->spec->memory_checkpoint_mb)
        rdv__memckpt_from(r, node, &m.u.assign); /* its files from its buddy, when it lost its own */
    rdv__send_to(r, node, &m);
    /* The generation's id may be known already: assigned again after musterd
     * restarted during a recovery, rank 0 (rejoining in place) sent it on
     * its first frames, before the other members were back. It follows the
     * ASSIGN; an agent that has it takes it again as a repeat. */
    rdv__send_unique_id(r, node);
    for (uint32_t l = 0; l < nd->ndevices; l++)
        rdv__set_rank_state(r, &r->ranks[nd->first_rank + l], RDV_RANK_STARTING);
}

/* fitness_check, and an event for each node the plan newly finds unfit. */
void rdv__check_plan(struct rdv *r, int candidates)
{
    uint8_t was[RDV_MAX_NODES];
    for (uint32_t i = 0; i < r->nnodes; i++)
        was[i] = r->nodes[i].plan_unfit[0] != '\0';
    if (fitness_check(r, candidates) == 0)
        return;
    for (uint32_t i = 0; i < r->nnodes; i++)
        if (!was[i] && r->nodes[i].plan_unfit[0])
            rdv__event(r, "node_unfit", (int)i, -1, "node %s is unfit: %s", r->nodes[i].name, r->nodes[i].plan_unfit);
}

/*
 * Whose latest checkpoints are compared: after a failure, the members whose
 * ranks start afresh (those that rejoin in place keep their state); at
 * formation, every member that reported one.
 */
static int compared(const struct rdv *r, const struct rdv_node *nd)
{
    if (!r->spec->checkpoint_latest[0] || !nd->member || !nd->has_checkpoint)
        return 0; /* a job that names no rule compares nothing, whatever an agent sends */
    for (uint32_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].member && r->nodes[i].checkpoint_wanted)
            return nd->checkpoint_wanted;
    return 1;
}

/*
 * The compared members agree on their latest checkpoint (checkpoint_latest),
 * or what says who has what: "node a has global_step40, node b has none".
 */
static int checkpoints_agree(const struct rdv *r, char *what, size_t cap)
{
    const struct rdv_node *first = NULL;
    int agree = 1;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!compared(r, nd))
            continue;
        if (!first)
            first = nd;
        else if (strcmp(first->checkpoint, nd->checkpoint) != 0)
            agree = 0;
    }
    if (agree)
        return 1;
    size_t n = 0;
    what[0] = '\0';
    for (uint32_t i = 0; i < r->nnodes && n < cap; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!compared(r, nd))
            continue;
        int w = snprintf(what + n, cap - n, "%snode %s has %s", n ? ", " : "", nd->name,
                         nd->checkpoint[0] ? nd->checkpoint : "none");
        n += w > 0 ? (size_t)w : 0;
    }
    proto_text_sanitize(what); /* cut short, it may end mid-character: the status must stay UTF-8 */
    return 0;
}

/*
 * The members' latest checkpoints agree, or checkpoint_diverged_ok lets them
 * differ: reported once per difference in the events, and in r->reason while
 * the generation waits for an operator to make them agree. After a failure
 * the members whose ranks start afresh are waited for until they report.
 */
static int members_agree(struct rdv *r, uint64_t now_ms)
{
    for (uint32_t i = 0; i < r->nnodes; i++) {
        struct rdv_node *nd = &r->nodes[i];
        if (!nd->member || !nd->checkpoint_wanted || nd->has_checkpoint)
            continue;
        if (!r->checkpoint_wait_ms)
            r->checkpoint_wait_ms = now_ms;
        if (now_ms - r->checkpoint_wait_ms < (uint64_t)r->spec->heartbeat_timeout_ms) {
            snprintf(r->reason, sizeof(r->reason), "waiting for node %s to report its latest checkpoint "
                     "(checkpoint_latest)", nd->name);
            rdv__changed(r, 0);
            return 0;
        }
        /* its report went astray (a link that broke as the generation ended): not compared */
        nd->checkpoint_wanted = 0;
        rdv__event(r, "checkpoint_unreported", (int)i, -1, "node %s did not report its latest checkpoint within "
                   "%.1f s: not compared", nd->name, (double)r->spec->heartbeat_timeout_ms / 1000.0);
    }
    r->checkpoint_wait_ms = 0;
    char what[PROTO_REASON_MAX - 160];
    if (checkpoints_agree(r, what, sizeof(what))) {
        r->diverged_said[0] = '\0';
        return 1;
    }
    int ok = r->spec->checkpoint_diverged_ok;
    if (strcmp(r->diverged_said, what) != 0) {
        rdv__event(r, "checkpoint_diverged", -1, -1, "checkpoint_dir differs between nodes: %s; %s", what,
                   ok ? "starting anyway (checkpoint_diverged_ok)" : "generation not started");
        snprintf(r->diverged_said, sizeof(r->diverged_said), "%s", what);
    }
    if (ok)
        return 1;
    snprintf(r->reason, sizeof(r->reason), "checkpoint_dir differs between nodes: %s; copy the latest checkpoint "
             "to every node (or set checkpoint_diverged_ok)", what);
    rdv__changed(r, 0);
    return 0;
}

/* r->reason: the job waits for nd's pre-flight (its reason, cut to fit, still UTF-8). */
static void waiting_for_fitness(struct rdv *r, const struct rdv_node *nd)
{
    if (nd->fitness == RDV_FIT_CHECKING)
        snprintf(r->reason, sizeof(r->reason), "waiting for node %s's pre-flight checks", nd->name);
    else
        snprintf(r->reason, sizeof(r->reason), "waiting for node %s: unfit: %s", nd->name, fitness_reason(nd));
    proto_text_sanitize(r->reason);
}

/*
 * Every member is fit (its pre-flight passed, the plan fits its memory), or
 * r->reason says which is not and why: the generation waits, spending nothing.
 */
static int members_fit(struct rdv *r)
{
    rdv__check_plan(r, 0);
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!nd->member || fitness_ready(nd))
            continue;
        waiting_for_fitness(r, nd);
        rdv__changed(r, 0);
        return 0;
    }
    return 1;
}

/*
 * Assigns the current generation to every member once all are connected.
 * Called whenever a member joins while a generation waits to start.
 */
void rdv__try_start_generation(struct rdv *r, uint64_t now_ms)
{
    char missing[PROTO_REASON_MAX];

    if (r->state != RDV_FORMING && r->state != RDV_RECOVERING)
        return;
    rdv__spares_fill(r, now_ms); /* a member gone or unfit: a ready spare takes its place at once */
    if (r->restart_at_ms && now_ms < r->restart_at_ms)
        return; /* backing off; rdv_tick starts it when the time comes */
    r->restart_at_ms = 0;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        if (!r->nodes[i].member)
            continue;
        if (r->nodes[i].state != RDV_NODE_JOINED) {
            rdv__missing_members(r, missing, sizeof(missing));
            snprintf(r->reason, sizeof(r->reason), "waiting for %s to rejoin", missing);
            return;
        }
        if (r->ranks[r->nodes[i].first_rank].state != RDV_RANK_PENDING)
            return; /* already assigned */
    }
    if (!members_fit(r) || !members_agree(r, now_ms) || !rdv__memckpt_reported(r, now_ms))
        return;
    /* MASTER_PORT: the port rank 0's agent last reported free on its node,
     * but not the last generation's in a report sent before the agent had
     * that generation's ASSIGN (two generations within one heartbeat): a
     * survivor kept in place may still hold it, and torch's env:// store is
     * multi-tenant, so a new rank 0 binding that port would join the old
     * store, whose keys send the new group to the old one's addresses. An
     * agent that knows the generation never reports its port while a rank of
     * it lives; its next heartbeat names another. But the node that held
     * rank 0 then, rejoined since on a new session (the old connection, and
     * the ASSIGN on it, is gone) and naming an older generation, never had
     * that ASSIGN: no rank 0 of it ever bound the port, and it may name the
     * same port, free still, for ever. Its report stands. */
    const struct rdv_node *n0 = rank0_node(r);
    if (n0->free_port == 0) {
        snprintf(r->reason, sizeof(r->reason),
                 "waiting for node %s (rank 0) to find a free port for MASTER_PORT: every port of its "
                 "master_port_range is in use", n0->name);
        if (r->port_wait != RDV_PORT_WAIT_NONE_FREE)
            rdv__event(r, "no_master_port", (int)r->ranks[0].node, 0, "%s", r->reason);
        r->port_wait = RDV_PORT_WAIT_NONE_FREE;
        rdv__changed(r, 0);
        return;
    }
    const int rejoined_since = (int32_t)r->ranks[0].node == r->master_port_node &&
                               n0->assign_sent_gen < r->master_port_gen;
    if (n0->free_port == r->master_port && n0->free_port_gen < r->master_port_gen && !rejoined_since) {
        snprintf(r->reason, sizeof(r->reason),
                 "waiting for node %s (rank 0) to report a free port for MASTER_PORT other than the last "
                 "generation's (%u)", n0->name, r->master_port);
        r->port_wait = RDV_PORT_WAIT_NEW;
        rdv__changed(r, 0);
        return;
    }
    /* An id taken before this assignment (musterd restored during a recovery,
     * rank 0 back first with the ranks that made it) stands only while rank
     * 0's node came back with those ranks: it keeps them (same layout). A
     * rank 0 that comes now is a new process with a new id. */
    if (r->uid.generation == r->generation && n0->reported_generation != r->generation)
        r->uid.generation = 0;
    r->port_wait = RDV_PORT_WAIT_NO;
    r->master_port = n0->free_port;
    r->master_port_gen = r->generation;
    r->master_port_node = (int32_t)r->ranks[0].node;
    /* Rank blocks are contiguous in name order: walking them block by block visits the
     * members in that order, which numbers them. */
    const uint32_t nnodes = rdv__member_count(r);
    uint32_t node_rank = 0;
    for (uint32_t rank = 0; rank < r->world_size;) {
        const uint32_t node = r->ranks[rank].node;
        send_assign(r, node, node_rank++, nnodes, r->master_port);
        while (rank < r->world_size && r->ranks[rank].node == node)
            rank++;
    }
    r->assigned_ms = now_ms;
    for (uint32_t i = 0; i < r->nnodes; i++) /* what they have changes as the generation runs */
        r->nodes[i].has_checkpoint = r->nodes[i].checkpoint_wanted = 0;
    r->checkpoint_wait_ms = r->memckpt_wait_ms = 0;
    rdv__event(r, "generation_assigned", -1, -1, "generation %llu assigned: %u ranks on %u nodes",
               (unsigned long long)r->generation, r->world_size, nnodes);
    char mem[PROTO_CKPT_NAME_MAX], from[512];
    if (r->spec->memory_checkpoint_mb && rdv_memckpt_common(r, mem, sizeof(mem)) > 0) {
        uint32_t drained = rdv__memckpt_sources(r, mem, from, sizeof(from));
        if (drained == nnodes) /* every member lost it from memory, its own and its buddy's copy */
            rdv__event(r, "memory_resumed", -1, -1, "generation %llu resumed from the drained durable checkpoint "
                       "step %llu (%s in checkpoint_dir, the newest complete on all %u nodes: no node or buddy "
                       "holds it in memory)", (unsigned long long)r->generation,
                       (unsigned long long)memtags_step(mem), mem, nnodes);
        else
            rdv__event(r, "memory_resumed", -1, -1, "generation %llu resumed from memory checkpoint step %llu "
                       "(%s, the newest complete on all %u nodes%s%s)", (unsigned long long)r->generation,
                       (unsigned long long)memtags_step(mem), mem, nnodes, from[0] ? "; " : "", from);
    }
    rdv__changed(r, 1);
}

/* Opens generation 1 with the first spec->nodes fit nodes to join; the
 * others are spares (spare_nodes, rdv_spare.c). */
static int form_first_generation(struct rdv *r, uint64_t now_ms)
{
    uint32_t taken = 0;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        r->nodes[i].member = taken < (uint32_t)r->spec->nodes && fitness_ready(&r->nodes[i]);
        taken += (uint32_t)r->nodes[i].member;
    }
    rdv__layout_members(r);
    if (rdv__build_ranks(r))
        return -ENOMEM;
    /* The world size is known now: a batch that cannot be split fails the job
     * here, before any rank starts, rather than in every rank at step 1. */
    struct batch_plan plan;
    char why[PROTO_REASON_MAX];
    if (batch_plan(r->spec->batch, r->spec->micro_batch, (int)r->world_size, &plan, why, sizeof(why)) != 0) {
        snprintf(r->reason, sizeof(r->reason), "%s", why);
        rdv__set_state(r, RDV_FAILED);
        rdv__event(r, "job_failed", -1, -1, "job refused at formation: %s", why);
        rdv__changed(r, 1);
        return 0;
    }
    r->generation = 1;
    r->gen_opened_ms = now_ms;
    rdv__set_state(r, RDV_FORMING);
    r->reason[0] = '\0';
    rdv__event(r, "generation_opened", -1, -1, "generation 1 opened: %u nodes joined, world size %u",
               rdv__member_count(r), r->world_size);
    rdv__changed(r, 1);
    rdv__try_start_generation(r, now_ms);
    return 0;
}

/* A forming or recovering generation runs once every rank reports running
 * (or has finished); a restored one, not before every member is back. */
void rdv__check_running(struct rdv *r, uint64_t now_ms)
{
    if ((r->state != RDV_FORMING && r->state != RDV_RECOVERING) || r->resuming ||
        r->nranks_in[RDV_RANK_RUNNING] + r->nranks_in[RDV_RANK_COMPLETED] != r->world_size)
        return;
    rdv__set_state(r, RDV_RUNNING);
    r->running_since_ms = now_ms;
    /* The hang clock starts with the generation: a rank that rejoined in
     * place reported running (at its old step) while the others were still
     * starting, and was not stuck for that wait. */
    for (uint32_t i = 0; i < r->world_size; i++) {
        r->ranks[i].progress_ms = now_ms;
        r->ranks[i].stepped = 0;
    }
    hang_steps_new_generation(&r->steps);
    r->hang_due_ms = 0;
    r->reason[0] = '\0';
    rdv__event(r, "generation_running", -1, -1, "generation %llu running: %u ranks on %u nodes, %llu ms after it "
               "opened", (unsigned long long)r->generation, r->world_size, rdv__member_count(r),
               (unsigned long long)(now_ms - r->gen_opened_ms));
    rdv__changed(r, 1);
    rdv__grow_waiting(r, now_ms);
}

/*
 * Generation 1 forms once spec->nodes nodes are fit. When every slot is
 * taken but some node is unfit (or still checking) for rejoin_timeout_ms,
 * the job forms without it if min_nodes allows.
 */
void rdv__maybe_form(struct rdv *r, uint64_t now_ms)
{
    if (r->state != RDV_WAITING || r->nnodes < (uint32_t)r->spec->nodes)
        return;
    uint32_t ready = 0, waited = 1;
    const struct rdv_node *late = NULL;
    rdv__check_plan(r, 1);
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (fitness_ready(nd)) {
            ready++;
            continue;
        }
        late = late ? late : nd;
        if (nd->state == RDV_NODE_JOINED && now_ms - nd->unfit_since_ms < (uint64_t)r->spec->rejoin_timeout_ms)
            waited = 0;
    }
    const uint32_t floor = (uint32_t)(r->spec->min_nodes ? r->spec->min_nodes : r->spec->nodes);
    if (ready >= (uint32_t)r->spec->nodes || (ready >= floor && ready > 0 && waited)) {
        if (ready < (uint32_t)r->spec->nodes)
            rdv__event(r, "forming_without", -1, -1, "forming with %u of %d nodes (min_nodes %u): %s stayed unfit for "
                       "%.0f s (rejoin_timeout_ms)", ready, r->spec->nodes, floor, late->name,
                       (double)r->spec->rejoin_timeout_ms / 1000.0);
        form_first_generation(r, now_ms);
        return;
    }
    if (late)
        waiting_for_fitness(r, late);
}

/* The current generation's unique id, to a node that may have missed it. */
void rdv__send_unique_id(struct rdv *r, uint32_t node)
{
    if (r->generation == 0 || r->uid.generation != r->generation)
        return;
    struct proto_msg m;
    m.type = PROTO_UNIQUE_ID;
    m.u.unique_id = r->uid;
    m.u.unique_id.term = r->term;
    rdv__send_to(r, node, &m);
}

/* The current generation's ASSIGN again, to a member that may have missed it. */
void rdv__resend_assign(struct rdv *r, uint32_t node)
{
    uint32_t node_rank = 0;
    for (uint32_t i = 0; i < r->nnodes; i++)
        node_rank += r->nodes[i].member && r->nodes[i].first_rank < r->nodes[node].first_rank;
    send_assign(r, node, node_rank, rdv__member_count(r), r->master_port);
}

/*
 * Rank 0's unique id is taken once per generation: a repeat (a rank that
 * sends it in a loop, or again after it already went out) is counted and
 * logged at a limited rate, and neither sent on to every member nor made an
 * event, so that it costs the members nothing and leaves the events ring
 * alone. A rank 0 that needs a new id is in a new generation.
 */
int rdv__on_unique_id(struct rdv *r, uint32_t node, const struct proto_unique_id *u, uint64_t now_ms)
{
    struct rdv_node *nd = &r->nodes[node];

    if (!nd->member || r->world_size == 0 || r->ranks[0].node != node) {
        struct proto_msg e = {.type = PROTO_ERROR};
        snprintf(e.u.error.code, sizeof(e.u.error.code), "not_rank0");
        snprintf(e.u.error.reason, sizeof(e.u.error.reason),
                 "unique id refused: node %s does not hold rank 0", nd->name);
        rdv__send_to(r, node, &e);
        return 0;
    }
    if (r->uid.generation == r->generation) {
        unsigned long held;
        char note[64];
        r->repeated_unique_ids++;
        if (ratelimit_pass(&nd->ignored_log, now_ms, RATELIMIT_PEER_MS, &held))
            log_warn("node %s sent the unique id of generation %llu again: ignored (%llu repeats in all)%s", nd->name,
                     (unsigned long long)r->generation, (unsigned long long)r->repeated_unique_ids,
                     ratelimit_note(held, note, sizeof(note)));
        return 0;
    }
    r->uid.generation = r->generation;
    memcpy(r->uid.id, u->id, PROTO_UID_LEN);
    uint32_t sent = 0; /* a member not connected now gets it with its ASSIGN or when it is back */
    for (uint32_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].member && r->nodes[i].state == RDV_NODE_JOINED) {
            rdv__send_unique_id(r, i);
            sent++;
        }
    rdv__event(r, "unique_id", (int)node, 0, "generation %llu: unique id from rank 0 sent to %u of %u nodes",
               (unsigned long long)r->generation, sent, rdv__member_count(r));
    return 1;
}

/* Assigned ranks that never report running (stuck loading, stuck forming the communicator). */
void rdv__check_start(struct rdv *r, uint64_t now_ms)
{
    const uint64_t limit = (uint64_t)r->spec->start_timeout_ms;
    if (limit == 0 || r->assigned_ms == 0 || (r->state != RDV_FORMING && r->state != RDV_RECOVERING) ||
        now_ms - r->assigned_ms <= limit)
        return;
    for (uint32_t i = 0; i < r->world_size; i++) {
        if (r->ranks[i].state == RDV_RANK_STARTING) {
            char what[PROTO_REASON_MAX];
            snprintf(what, sizeof(what), "rank %u on node %s did not start within %.1f s (start_timeout_ms)", i,
                     r->nodes[r->ranks[i].node].name, (double)limit / 1000.0);
            rdv__fail_generation(r, now_ms, (int)r->ranks[i].node, (int)i, what);
            return;
        }
    }
}
