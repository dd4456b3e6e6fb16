/*
 * daemon/rdv_grow.c: growing a job that runs below its size, after its
 * ranks leave their generation at a step boundary when they can (see rdv.h).
 *
 * A node that is not a member joined (a new one, or one that was dropped
 * when the job shrank): while the job runs below spec->nodes it is admitted
 * in a new generation, once it is fit (its pre-flight passed, on_preflight)
 * and the plan of the larger world fits its memory. The members' ranks are
 * parked (those that rejoin in place keep their state and re-slice it for
 * the larger world; others are restarted from the last checkpoint); no
 * restart is spent. A job that is forming or recovering takes the node at
 * its next generation instead.
 */
#include "daemon/rdv_internal.h"
#include "daemon/fitness.h"

#include <stdio.h>

#include "common/batch.h"

/* The longest a grow waits for the ranks to leave at a step boundary. */
#define YIELD_WAIT_MS 30000

/* A node that joined while the job was forming, recovering or resuming is taken now it runs. */
void rdv__grow_waiting(struct rdv *r, uint64_t now_ms)
{
    for (uint32_t i = 0; i < r->nnodes && r->state == RDV_RUNNING; i++)
        if (!r->nodes[i].member && r->nodes[i].state == RDV_NODE_JOINED)
            rdv__maybe_grow(r, i, now_ms);
}

/* How long a grow waits for the ranks to leave their generation at a step
 * boundary: min(progress_timeout_ms, 30 s); a step takes less than that. */
uint64_t rdv__yield_wait_ms(const struct rdv *r)
{
    const uint64_t limit = hang_timeout_ms(&r->steps, r->spec->progress_timeout_ms);
    return limit && limit < YIELD_WAIT_MS ? limit : YIELD_WAIT_MS;
}

/* Takes node idx into the running job: a generation with it, the ranks of
 * the one before parked (any still training abort their step). */
static void grow_now(struct rdv *r, uint32_t idx, uint64_t now_ms)
{
    struct rdv_node *nd = &r->nodes[idx];
    uint32_t before = r->world_size;
    nd->member = 1;
    rdv__check_plan(r, 0);
    if (nd->plan_unfit[0]) { /* it stays idle, shown unfit with the plan's figures */
        nd->member = 0;
        rdv__check_plan(r, 0);
        return;
    }
    rdv__layout_members(r);
    if (rdv__build_ranks(r) != 0) {
        nd->member = 0;
        rdv__layout_members(r);
        return;
    }
    r->generation++;
    r->gen_opened_ms = now_ms;
    r->assigned_ms = 0;
    r->running_since_ms = 0;
    r->restore_noted = 0;
    r->yielding = 0;
    rdv__set_state(r, RDV_RECOVERING);
    snprintf(r->reason, sizeof(r->reason), "node %s joined: growing from %u to %u ranks on %u nodes", nd->name,
             before, r->world_size, rdv__member_count(r));
    rdv__event(r, "job_grew", (int)idx, -1, "generation %llu: %s", (unsigned long long)r->generation, r->reason);
    /* Persisted before any frame names the new generation (see rdv_ops.changed). */
    rdv__changed(r, 1);
    rdv__command_all(r, PROTO_CMD_PARK);
    rdv__try_start_generation(r, now_ms);
}

/* Whether every rank of the generation runs and can rejoin in place: then
 * they can leave it together at a step boundary. */
int rdv__all_rejoin(const struct rdv *r)
{
    if (r->nranks_in[RDV_RANK_RUNNING] != r->world_size)
        return 0;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (!r->ranks[i].rejoin || r->ranks[i].silent)
            return 0;
    return 1;
}

/* Whether every rank of the generation has left it at a step boundary. */
int rdv__all_yielded(const struct rdv *r)
{
    if (r->world_size == 0 || r->nranks_in[RDV_RANK_RUNNING] != r->world_size)
        return 0;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (!r->ranks[i].yielded)
            return 0;
    return 1;
}

/*
 * A node that joined (or came back to) a job running below its wanted size,
 * once it is fit. When every rank can rejoin in place the ranks first leave
 * the generation at the next step boundary (COMMAND yield; finish_yield
 * goes on once all have said `yielded`, or at the deadline), so that no
 * step in flight is lost; otherwise the generation opens at once.
 */
void rdv__maybe_grow(struct rdv *r, uint32_t idx, uint64_t now_ms)
{
    struct rdv_node *nd = &r->nodes[idx];
    if (r->state != RDV_RUNNING || r->yielding || rdv__member_count(r) >= (uint32_t)r->spec->nodes ||
        !fitness_ready(nd))
        return;
    uint32_t world = r->world_size + nd->ndevices;
    struct batch_plan plan;
    char why[PROTO_REASON_MAX];
    if (batch_plan(r->spec->batch, r->spec->micro_batch, (int)world, &plan, why, sizeof(why)) != 0) {
        rdv__event(r, "grow_refused", (int)idx, -1, "node %s stays idle: the job cannot grow to %u ranks: %s", nd->name,
                   world, why);
        return;
    }
    if (!rdv__all_rejoin(r)) {
        grow_now(r, idx, now_ms);
        return;
    }
    r->yielding = 1;
    r->grow_node = idx;
    r->yield_since_ms = now_ms;
    snprintf(r->reason, sizeof(r->reason), "node %s joined: the ranks of generation %llu leave it at the next step "
             "boundary, then the job grows to %u ranks", nd->name, (unsigned long long)r->generation, world);
    rdv__event(r, "job_growing", (int)idx, -1, "%s", r->reason);
    rdv__command_all(r, PROTO_CMD_YIELD);
    rdv__changed(r, 0);
}

/* The ranks left the generation at a step boundary (or the wait is over):
 * the grow goes on, or, when the node it was for is gone or unfit now, a
 * generation of the same members (the parked ranks need one to go on in). */
void rdv__finish_yield(struct rdv *r, uint64_t now_ms, int timed_out)
{
    /* Ranks that say they yielded while no grow waits (musterd restarted
     * meanwhile): a generation of the same members; the node, when it
     * comes back, asks for the grow again. */
    if (r->yielding && r->swapping) {
        r->yielding = r->swapping = 0;
        if (timed_out)
            rdv__event(r, "grow_unyielded", (int)r->swap_node, -1, "not every rank left generation %llu at a step "
                       "boundary within %.1f s: the step in flight is given up", (unsigned long long)r->generation,
                       (double)rdv__yield_wait_ms(r) / 1000.0);
        rdv__swap_now(r, r->swap_node, now_ms);
        return;
    }
    const uint32_t idx = r->yielding ? r->grow_node : r->nnodes;
    const int waited = r->yielding;
    r->yielding = 0;
    if (timed_out)
        rdv__event(r, "grow_unyielded", (int)idx, -1, "not every rank left generation %llu at a step boundary within "
                   "%.1f s: the step in flight is given up", (unsigned long long)r->generation,
                   (double)rdv__yield_wait_ms(r) / 1000.0);
    if (idx < r->nnodes && !r->nodes[idx].member && r->nodes[idx].state == RDV_NODE_JOINED &&
        fitness_ready(&r->nodes[idx]) && rdv__member_count(r) < (uint32_t)r->spec->nodes) {
        grow_now(r, idx, now_ms);
        if (r->state == RDV_RECOVERING)
            return;
    }
    rdv__open_next_generation(r, now_ms, -1, -1,
                              waited ? "the node the job was to grow by is gone; the ranks that left their generation "
                                  "for it go on"
                                : "the ranks left their generation for a grow that musterd, restarted since, no "
                                  "longer waits for; they go on",
                              0, FAILURE_EXIT, 1);
}
