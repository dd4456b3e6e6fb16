/* daemon/rdv_resume.c: the state file's part (rdv_save, rdv_restore) and a restored
 * generation that goes on once every member is back (see rdv.h). */
#include "daemon/rdv_internal.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

void rdv_save(const struct rdv *r, struct rdv_saved *out)
{
    /* Only the members in use are written: the table is large and this runs at every state change. */
    memset(out, 0, offsetof(struct rdv_saved, members));
    snprintf(out->job, sizeof(out->job), "%s", r->spec->name);
    /* A restored generation waiting for its members is kept as it was before
     * the restart, so that another restart meanwhile restores it alike. */
    out->state = r->resuming ? r->resume_to : r->state;
    snprintf(out->reason, sizeof(out->reason), "%s", r->reason);
    out->generation = r->generation;
    out->restarts = r->restarts;
    out->world_size = r->world_size;
    out->last_checkpoint_step = r->last_checkpoint_step;
    out->replacements = r->replacements;
    out->last_replacement = r->last_replacement;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        if (!r->nodes[i].member)
            continue;
        struct rdv_saved_member *m = &out->members[out->nmembers++];
        snprintf(m->name, sizeof(m->name), "%s", r->nodes[i].name);
        m->first_rank = r->nodes[i].first_rank;
        m->ndevices = r->nodes[i].ndevices;
    }
}

/*
 * After a daemon restart the members are known but not connected. A job
 * that was forming, running or recovering goes on in its generation: when
 * every member rejoins saying its ranks still run that generation, training
 * never noticed (a generation that was still forming then waits for its
 * ranks to report running, as in formation); a member that comes back
 * without them, or not in time, is a failure like any other.
 */
int rdv_restore(struct rdv *r, const struct rdv_saved *s, uint64_t now_ms)
{
    if (s->nmembers > RDV_MAX_NODES)
        return -EINVAL;
    snprintf(r->reason, sizeof(r->reason), "%s", s->reason);
    r->generation = s->generation;
    r->restarts = s->restarts;
    r->last_checkpoint_step = s->last_checkpoint_step;
    r->replacements = s->replacements;
    r->last_replacement = s->last_replacement;
    r->nnodes = 0;
    namemap_clear(&r->byname);
    uint32_t world = 0;
    for (uint32_t i = 0; i < s->nmembers; i++) {
        if (rdv__find_node(r, s->members[i].name) >= 0)
            return -EINVAL; /* a member named twice */
        struct rdv_node *nd = &r->nodes[r->nnodes++];
        memset(nd, 0, sizeof(*nd));
        snprintf(nd->name, sizeof(nd->name), "%s", s->members[i].name);
        nd->member = 1;
        nd->first_rank = s->members[i].first_rank;
        nd->ndevices = s->members[i].ndevices;
        if (nd->ndevices == 0 || nd->ndevices > PROTO_MAX_LOCAL_RANKS)
            return -EINVAL;
        for (uint32_t l = 0; l < nd->ndevices; l++)
            nd->devices[l] = l;
        nd->state = RDV_NODE_LOST;
        nd->restored = 1; /* absent since the restart, not lost: rdv_spare.c waits for it */
        nd->last_seen_ms = now_ms;
        world += nd->ndevices;
        if (namemap_put(&r->byname, nd->name, r->nnodes - 1) != 0)
            return -EINVAL;
    }
    if (world != s->world_size)
        return -EINVAL;
    /* Blocks must tile [0, world) exactly. */
    for (uint32_t i = 0; i < r->nnodes; i++) {
        if (r->nodes[i].first_rank + r->nodes[i].ndevices > world)
            return -EINVAL;
        for (uint32_t j = i + 1; j < r->nnodes; j++) {
            const struct rdv_node *a = &r->nodes[i], *b = &r->nodes[j];
            if (a->first_rank < b->first_rank + b->ndevices && b->first_rank < a->first_rank + a->ndevices)
                return -EINVAL;
        }
    }
    if (r->nnodes && rdv__build_ranks(r))
        return -ENOMEM;
    r->gen_opened_ms = now_ms;
    if (s->state == RDV_FORMING || s->state == RDV_RUNNING) {
        /* Ranks keep their generation until members tell us otherwise. */
        for (uint32_t i = 0; i < r->world_size; i++)
            rdv__set_rank_state(r, &r->ranks[i], RDV_RANK_STARTING);
        r->resume_to = s->state;
        rdv__set_state(r, RDV_RECOVERING);
        r->resuming = 1;
        snprintf(r->reason, sizeof(r->reason), "daemon restarted; waiting for members to rejoin");
    } else if (s->state != RDV_WAITING) { /* a fresh rdv is waiting already */
        rdv__set_state(r, s->state);
        /* Recovering: the failure was already paid for; this generation is assigned again once all are back. */
        if (s->state == RDV_RECOVERING)
            snprintf(r->reason, sizeof(r->reason), "daemon restarted during recovery; waiting for members to rejoin");
    }
    rdv__event(r, "state_restored", -1, -1, "restored job %s: %s, generation %llu, %u restarts, %u members",
               s->job, rdv_job_state_name(s->state), (unsigned long long)s->generation, s->restarts, s->nmembers);
    return 0;
}

/*
 * After a restore: every member back in the old generation means nothing
 * failed. A generation that ran before the restart runs on; one that was
 * still forming waits for its ranks to report running, as in formation
 * (check_running), its start_timeout_ms counted from now.
 */
void rdv__check_resumed(struct rdv *r, uint64_t now_ms)
{
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        if (nd->member && (nd->state != RDV_NODE_JOINED || nd->reported_generation != r->generation))
            return;
    }
    rdv__set_state(r, r->resume_to);
    r->resuming = 0;
    if (r->state == RDV_RUNNING) {
        r->reason[0] = '\0';
        rdv__event(r, "generation_resumed", -1, -1, "every member rejoined in generation %llu; training went on",
                   (unsigned long long)r->generation);
        rdv__changed(r, 1);
        rdv__grow_waiting(r, now_ms);
        return;
    }
    r->assigned_ms = now_ms;
    const uint32_t waiting = r->world_size - r->nranks_in[RDV_RANK_RUNNING] - r->nranks_in[RDV_RANK_COMPLETED];
    snprintf(r->reason, sizeof(r->reason), "daemon restarted while generation %llu was forming; every member "
             "rejoined, waiting for its ranks to report running", (unsigned long long)r->generation);
    rdv__event(r, "generation_resumed", -1, -1, "every member rejoined in generation %llu, which was forming: waiting "
               "for %u rank%s to report running (start_timeout_ms from now)", (unsigned long long)r->generation,
               waiting, waiting == 1 ? "" : "s");
    rdv__changed(r, 1);
    rdv__check_running(r, now_ms);
}
