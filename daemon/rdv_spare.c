/*
 * daemon/rdv_spare.c: hot spare nodes (job key spare_nodes, docs/spares.md).
 *
 * Up to spare_nodes agents beyond the job's nodes join as spares: they are
 * welcomed, authenticated and pre-flighted like any node, and hold no rank
 * block (member 0). A spare is ready when fitness_ready says so.
 *
 * When a generation waits to start (forming or recovering, nothing assigned
 * yet) and one of its members is gone (lost, left) or unfit, a ready spare
 * with as many devices of the same kind takes the member's place at once:
 * the spare becomes the member holding the same first_rank (so the same node
 * rank and rank layout, the same world size), and the lost node stops being
 * a member. No rejoin_timeout_ms is waited and nothing shrinks; the
 * survivors rejoin in place as after any failure (their ranks are parked),
 * the spare's ranks start afresh and take their state from peers.
 *
 * Placement: a spare of the lost node's domain (HELLO.domain, the agent's
 * `domain` label) is taken before one of another domain; among equals, the
 * one that joined first. A replaced node that comes back is a spare (it is
 * no longer a member, and the job is at its size).
 *
 * The membership change is persisted as any other (the new member is in
 * rdv_saved.members), with the last replacement, before ASSIGN goes out.
 */
#include "daemon/rdv_internal.h"
#include "daemon/fitness.h"

#include <stdio.h>
#include <string.h>
#include <time.h>

uint32_t rdv__spare_count(const struct rdv *r)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->nnodes; i++)
        n += rdv_is_spare(r, i);
    return n;
}

uint32_t rdv__spare_places(const struct rdv *r)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        n += rdv_is_spare(r, i) && nd->fitness != RDV_FIT_UNFIT && !nd->plan_unfit[0];
    }
    return n;
}

int rdv_is_spare(const struct rdv *r, uint32_t idx)
{
    const struct rdv_node *nd = &r->nodes[idx];
    return r->spec->spare_nodes > 0 && !nd->member && nd->state == RDV_NODE_JOINED;
}

int rdv__spare_ready(const struct rdv *r, uint32_t idx)
{
    return rdv_is_spare(r, idx) && fitness_ready(&r->nodes[idx]);
}

/* Spare i joined before spare j (the table's order is not the joining order:
 * slots are reused). */
static int joined_before(const struct rdv *r, uint32_t i, int j)
{
    return j < 0 || r->nodes[i].joined_ms < r->nodes[j].joined_ms;
}

int rdv__pick_spare(const struct rdv *r, uint32_t lost)
{
    const struct rdv_node *ln = &r->nodes[lost];
    int same = -1, any = -1;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (i == lost || !rdv__spare_ready(r, i) || nd->ndevices != ln->ndevices || nd->kind != ln->kind)
            continue;
        if (ln->domain[0] && strcmp(nd->domain, ln->domain) == 0 && joined_before(r, i, same))
            same = (int)i;
        if (joined_before(r, i, any))
            any = (int)i;
    }
    return same >= 0 ? same : any;
}

/* The node rank of a member: its place in rank-block order (as ASSIGN numbers them). */
static uint32_t node_rank_of(const struct rdv *r, uint32_t idx)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->nnodes; i++)
        n += r->nodes[i].member && r->nodes[i].first_rank < r->nodes[idx].first_rank;
    return n;
}

/* Whether member nd cannot take part in the generation waiting to start. A
 * member restored from the state file that has not reconnected yet is only
 * slower than others to find the restarted musterd: it is gone once it has
 * been silent heartbeat_timeout_ms since the restore, as any other node. */
static int member_gone(const struct rdv *r, const struct rdv_node *nd, uint64_t now_ms)
{
    if (nd->state != RDV_NODE_JOINED)
        return !nd->restored || now_ms - nd->last_seen_ms > (uint64_t)r->spec->heartbeat_timeout_ms;
    return nd->fitness == RDV_FIT_UNFIT || nd->plan_unfit[0] || nd->swap_out;
}

/* Spare s takes member lost's rank block. */
static void replace(struct rdv *r, uint32_t lost, uint32_t s)
{
    struct rdv_node *ln = &r->nodes[lost], *sn = &r->nodes[s];
    const uint32_t node_rank = node_rank_of(r, lost);
    char why[48];
    if (ln->state != RDV_NODE_JOINED)
        snprintf(why, sizeof(why), "lost");
    else if (ln->fitness == RDV_FIT_UNFIT || ln->plan_unfit[0])
        snprintf(why, sizeof(why), "unfit");
    else
        snprintf(why, sizeof(why), "slow");
    if (ln->swap_out && ln->state == RDV_NODE_JOINED)
        rdv__send_command(r, lost, PROTO_CMD_STOP); /* its parked ranks go: it is a spare now */
    ln->swap_out = 0;
    sn->member = 1;
    sn->first_rank = ln->first_rank;
    /* the lost member's memory checkpoint copies at its buddy are the spare's now (rdv_memrep.c) */
    snprintf(sn->heir_of, sizeof(sn->heir_of), "%s", ln->heir_of[0] ? ln->heir_of : ln->name);
    ln->heir_of[0] = '\0';
    sn->checkpoint_wanted = 0; /* it has no state to compare: it takes its peers' */
    ln->member = 0;
    ln->checkpoint_wanted = 0;
    for (uint32_t l = 0; l < sn->ndevices; l++) {
        struct rdv_rank *rk = &r->ranks[sn->first_rank + l];
        rk->node = s;
        rk->device = sn->devices[l];
        /* a new node: what the fail-slow rule knew of the slot was the old one's */
        rk->split_s = 0;
        rk->split_ms = 0;
        memset(&rk->slow, 0, sizeof(rk->slow));
        rk->slow_named_ms = 0;
    }
    struct rdv_replacement *x = &r->last_replacement;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    x->generation = r->generation;
    x->wall_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    snprintf(x->lost, sizeof(x->lost), "%s", ln->name);
    snprintf(x->spare, sizeof(x->spare), "%s", sn->name);
    snprintf(x->why, sizeof(x->why), "%s", why);
    x->node_rank = node_rank;
    x->first_rank = sn->first_rank;
    x->nranks = sn->ndevices;
    x->same_domain = ln->domain[0] && strcmp(ln->domain, sn->domain) == 0;
    r->replacements++;
    char where[PROTO_NAME_MAX + 32] = "";
    if (ln->domain[0])
        snprintf(where, sizeof(where), x->same_domain ? ", domain %s" : ", from outside domain %s", ln->domain);
    rdv__event(r, "node_replaced", (int)s, -1, "node %s %s: spare node %s took its place (node rank %u, ranks %u-%u%s) "
               "in generation %llu", ln->name, why, sn->name, node_rank, sn->first_rank,
               sn->first_rank + sn->ndevices - 1, where, (unsigned long long)r->generation);
}

int rdv__spares_fill(struct rdv *r, uint64_t now_ms)
{
    if (r->spec->spare_nodes == 0 || r->resuming || (r->state != RDV_FORMING && r->state != RDV_RECOVERING) ||
        !r->ranks)
        return 0;
    int n = 0;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (!nd->member || !member_gone(r, nd, now_ms) || r->ranks[nd->first_rank].state != RDV_RANK_PENDING)
            continue;
        int s = rdv__pick_spare(r, i);
        if (s < 0) {
            if (nd->state == RDV_NODE_JOINED && nd->swap_out) /* the spare went meanwhile: it keeps its place */
                r->nodes[i].swap_out = 0;
            continue;
        }
        replace(r, i, (uint32_t)s);
        n++;
    }
    if (n)
        rdv__changed(r, 1); /* the new membership is durable before ASSIGN names it */
    return n;
}

void rdv__maybe_swap_slow(struct rdv *r, uint64_t now_ms)
{
    if (strcmp(r->spec->slow_policy, "swap") != 0 || r->state != RDV_RUNNING || r->yielding || !r->ranks)
        return;
    const uint64_t after_ms = (uint64_t)r->spec->slow_swap_after_s * 1000;
    for (uint32_t i = 0; i < r->world_size; i++) {
        const struct rdv_rank *rk = &r->ranks[i];
        if (!rk->slow_named_ms || now_ms - rk->slow_named_ms < after_ms || rk->node >= r->nnodes)
            continue;
        const uint32_t node = rk->node;
        const int s = rdv__pick_spare(r, node);
        if (s < 0)
            continue; /* none ready that fits: it stays named, and is swapped once one is */
        const struct rdv_node *nd = &r->nodes[node];
        if (!rdv__all_rejoin(r)) { /* the ranks cannot leave at a step boundary: at once, from their checkpoint */
            rdv__swap_now(r, node, now_ms);
            return;
        }
        r->yielding = 1;
        r->swapping = 1;
        r->swap_node = node;
        r->yield_since_ms = now_ms;
        snprintf(r->reason, sizeof(r->reason), "rank %u on node %s was slow for %.0f s (slow_policy swap): the ranks of "
                 "generation %llu leave it at the next step boundary, then spare node %s takes node %s's place", i,
                 nd->name, (double)(now_ms - rk->slow_named_ms) / 1000.0, (unsigned long long)r->generation,
                 r->nodes[s].name, nd->name);
        rdv__event(r, "node_swapping", (int)node, (int)i, "%s", r->reason);
        rdv__command_all(r, PROTO_CMD_YIELD);
        rdv__changed(r, 0);
        return;
    }
}

void rdv__swap_now(struct rdv *r, uint32_t node, uint64_t now_ms)
{
    struct rdv_node *nd = &r->nodes[node];
    char what[PROTO_REASON_MAX];
    if (!nd->member || nd->state != RDV_NODE_JOINED || rdv__pick_spare(r, node) < 0) {
        /* the node or the spare went meanwhile: the parked ranks need a generation to go on in */
        snprintf(what, sizeof(what), "the swap of slow node %s is off (it, or the spare for it, is gone); the ranks "
                 "that left their generation for it go on", nd->name);
        rdv__open_next_generation(r, now_ms, (int)node, -1, what, 0, FAILURE_EXIT, 1);
        return;
    }
    nd->swap_out = 1; /* rdv__spares_fill, from the generation's start, gives its block to the spare */
    snprintf(what, sizeof(what), "node %s is slow: a spare takes its place (slow_policy swap)", nd->name);
    rdv__open_next_generation(r, now_ms, (int)node, -1, what, 0, FAILURE_EXIT, 1);
}

json_t *rdv_spares_json(const struct rdv *r)
{
    uint32_t ready = 0;
    for (uint32_t i = 0; i < r->nnodes; i++)
        ready += rdv__spare_ready(r, i);
    json_t *o = json_pack("{s:i, s:i, s:i, s:I}", "wanted", r->spec->spare_nodes, "joined",
                          (int)rdv__spare_count(r), "ready", (int)ready, "replacements",
                          (json_int_t)r->replacements);
    const struct rdv_replacement *x = &r->last_replacement;
    if (o && x->generation)
        json_object_set_new(o, "last_replacement",
                            json_pack("{s:s, s:s, s:s, s:i, s:i, s:i, s:I, s:I, s:b}", "lost", x->lost, "spare",
                                      x->spare, "why", x->why, "node_rank", (int)x->node_rank, "first_rank",
                                      (int)x->first_rank, "nranks", (int)x->nranks, "generation",
                                      (json_int_t)x->generation, "wall_ms", (json_int_t)x->wall_ms, "same_domain",
                                      x->same_domain));
    else if (o)
        json_object_set_new(o, "last_replacement", json_null());
    return o;
}
