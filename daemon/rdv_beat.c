/* daemon/rdv_beat.c: heartbeats: what each rank says of its state, progress and figures, and
 * what rank 0 says of checkpoints and restores (see rdv.h). */
#include "daemon/rdv_internal.h"

#include <string.h>

#include "common/memtags.h"

/* Rank 0 says where this generation's state came from (ranks that rejoin in place). */
static void note_restore(struct rdv *r, uint32_t node, const struct proto_rank_beat *b)
{
    const unsigned long long g = (unsigned long long)r->generation, step = (unsigned long long)b->restore_step;
    r->restore_noted = 1;
    r->restore_from = b->restore_from;
    r->restore_step = b->restore_step;
    switch (b->restore_from) {
    case PROTO_RESTORE_MEMORY:
        rdv__event(r, "state_restored", (int)node, 0, "generation %llu resumed at step %llu from memory: surviving "
                   "ranks kept their state, replaced ranks took their peers' replicas; no checkpoint read", g, step);
        break;
    case PROTO_RESTORE_DISK:
        if (g > 1)
            rdv__event(r, "state_from_checkpoint", (int)node, 0, "generation %llu resumed at step %llu from the last "
                       "committed checkpoint: no step was held in memory for every rank (a rank and the peer "
                       "holding its replica were both lost, or replicate_every is 0)", g, step);
        else
            rdv__event(r, "state_from_checkpoint", (int)node, 0, "generation 1 resumed at step %llu from the last "
                       "committed checkpoint", step);
        break;
    case PROTO_RESTORE_SEED:
        if (g > 1)
            rdv__event(r, "state_from_seed", (int)node, 0, "generation %llu started over from step 0: no step was held "
                       "in memory for every rank and there is no committed checkpoint", g);
        break;
    default:
        break;
    }
    rdv__changed(r, 0);
}

/*
 * When a rank's step last changed: now, or by its own clock now -
 * step_age_ms when it says (never later than now, never earlier than the
 * generation opened). A step change is a step time for the timeout
 * (hang.h): the rank's step_s, or else the time since its last change.
 */
static void note_progress(struct rdv *r, struct rdv_rank *rk, const struct proto_rank_beat *b, uint64_t now_ms)
{
    /* it began running or reporting, or went back (restored from an older step) */
    const int began = rk->state != RDV_RANK_RUNNING || (rk->silent && !b->silent) || b->step < rk->step;
    if (b->state != PROTO_RANK_RUNNING || (!began && b->step == rk->step))
        return;
    uint64_t at = now_ms;
    if (b->has_step_age)
        at = b->step_age_ms < now_ms - r->gen_opened_ms ? now_ms - b->step_age_ms : r->gen_opened_ms;
    if (began) {
        rk->progress_ms = at;
        rk->stepped = 0;
        return;
    }
    if (at < rk->progress_ms)
        at = rk->progress_ms; /* progress only moves later */
    double step_s = b->step_s;
    if (!(step_s > 0) && rk->stepped && b->step > rk->step)
        step_s = (double)(at - rk->progress_ms) / 1000.0 / (double)(b->step - rk->step);
    if (r->state == RDV_RUNNING && b->step > rk->step) {
        uint64_t before = hang_timeout_ms(&r->steps, r->spec->progress_timeout_ms);
        hang_steps_note(&r->steps, rk->step, b->step, step_s);
        if (hang_timeout_ms(&r->steps, r->spec->progress_timeout_ms) < before)
            r->hang_due_ms = 0; /* a shorter timeout: the next tick scans again */
    }
    rk->progress_ms = at;
    rk->stepped = 1;
}

/* One rank entry of a heartbeat of its node. An entry of a stopped process
 * (its agent relays the last one) is not news from the rank: it does not
 * count as hearing from it. */
static void take_beat(struct rdv *r, struct rdv_rank *rk, const struct proto_rank_beat *b, uint64_t now_ms)
{
    note_progress(r, rk, b, now_ms);
    switch (b->state) {
    case PROTO_RANK_STARTING: rdv__set_rank_state(r, rk, RDV_RANK_STARTING); break;
    case PROTO_RANK_RUNNING: rdv__set_rank_state(r, rk, RDV_RANK_RUNNING); break;
    case PROTO_RANK_STOPPING: rdv__set_rank_state(r, rk, RDV_RANK_STOPPING); break;
    case PROTO_RANK_EXITED: break; /* RANK_EXIT carries the verdict */
    }
    if (b->stopped && !rk->stopped) {
        rk->stopped_since_ms = now_ms;
        if (r->hang_due_ms > now_ms + HANG_STOPPED_MS) /* the stopped rule's bound (rdv_hang.c) */
            r->hang_due_ms = now_ms + HANG_STOPPED_MS;
    }
    rk->stopped = b->stopped;
    if (!b->stopped)
        rk->stopped_since_ms = 0;
    rk->entry_ms = now_ms;
    rk->timed = b->has_step_age;
    rk->loss = b->loss;
    rk->tokens_per_s = b->tokens_per_s;
    rk->comm_frac = b->comm_frac;
    rk->step_bytes = b->step_bytes;
    rk->peak_mem = b->peak_mem;
    rk->step = b->step;
    rk->silent = b->silent;
    rk->rejoin = b->rejoin;
    rk->yielded = b->yielded;
    rk->step_s = b->step_s;
    rk->total_steps = b->total_steps;
    memcpy(rk->where, b->where, strlen(b->where) + 1); /* proto_check: NUL-terminated in its array */
    memcpy(rk->waiting, b->waiting, strlen(b->waiting) + 1);
    rdv__note_split(r, rk, b, now_ms);
    if (!b->stopped)
        rk->last_beat_ms = now_ms;
    else if (!rk->last_beat_ms) /* stopped before its first entry came: quiet since now */
        rk->last_beat_ms = now_ms;
    r->figures_changed = 1;
}

/* A new spare_note of node: an event, unless RDV_SPARE_NOTES were made in this window already. */
static void spare_note_event(struct rdv *r, uint32_t node, uint64_t now_ms)
{
    struct rdv_node *nd = &r->nodes[node];
    if (now_ms - nd->spare_note_window_ms >= RDV_SPARE_NOTE_WINDOW_MS || now_ms < nd->spare_note_window_ms) {
        nd->spare_note_window_ms = now_ms;
        nd->spare_note_events = 0;
    }
    if (nd->spare_note_events >= RDV_SPARE_NOTES) {
        nd->spare_note_held++;
        return;
    }
    nd->spare_note_events++;
    char held[64] = "";
    if (nd->spare_note_held)
        snprintf(held, sizeof(held), " (%u earlier notes held back)", nd->spare_note_held);
    nd->spare_note_held = 0;
    rdv__event(r, "warm_spare_unfit", (int)node, -1, "node %s: warm spare: %s%s", nd->name, nd->spare_note, held);
}

void rdv__on_heartbeat(struct rdv *r, uint32_t node, const struct proto_heartbeat *hb, uint64_t now_ms)
{
    struct rdv_node *nd = &r->nodes[node];
    /* The answer, when the agent asks for it (it asks as often as it needs
     * to see a stalled stream in time: proto_ack_every_ms). */
    if (!hb->no_ack) {
        struct proto_msg *ack = &r->ack; /* no rank entries: only its head is written */
        proto_heartbeat_start(ack);
        ack->u.heartbeat.generation = r->generation;
        ack->u.heartbeat.seq = hb->seq;
        rdv__send_to(r, node, ack);
    }
    if (hb->free_port != nd->free_port || hb->generation != nd->free_port_gen) {
        nd->free_port = hb->free_port;
        nd->free_port_gen = hb->generation;
        if (nd->member && nd->free_port && r->port_wait != RDV_PORT_WAIT_NO)
            rdv__try_start_generation(r, now_ms);
    }
    /* before memory_checkpoints, whose first report may open the generation: it counts these too */
    if (hb->has_drained && (!nd->reports_drained || hb->ndrained != nd->ndrained ||
                            memcmp(hb->drained, nd->drained, hb->ndrained * sizeof(hb->drained[0])) != 0)) {
        /* a newer one than the agent had before: drained just now (a new agent's first list is no news) */
        if (nd->reports_drained && hb->ndrained &&
            (!nd->ndrained || memtags_cmp(hb->drained[hb->ndrained - 1], nd->drained[nd->ndrained - 1]) > 0))
            rdv__event(r, "memory_drained", (int)node, -1, "node %s drained memory checkpoint step %llu (%s) to "
                       "checkpoint_dir", nd->name, (unsigned long long)memtags_step(hb->drained[hb->ndrained - 1]),
                       hb->drained[hb->ndrained - 1]);
        nd->reports_drained = 1;
        nd->ndrained = hb->ndrained;
        memcpy(nd->drained, hb->drained, hb->ndrained * sizeof(hb->drained[0]));
        rdv__changed(r, 0);
    }
    if (hb->has_memckpt && (!nd->reports_memckpt || hb->nmemckpt != nd->nmemckpt ||
                            memcmp(hb->memckpt, nd->memckpt, hb->nmemckpt * sizeof(hb->memckpt[0])) != 0)) {
        nd->reports_memckpt = 1;
        nd->nmemckpt = hb->nmemckpt;
        memcpy(nd->memckpt, hb->memckpt, hb->nmemckpt * sizeof(hb->memckpt[0]));
        rdv__changed(r, 0);
        if (r->memckpt_wait_ms)
            rdv__try_start_generation(r, now_ms); /* it was waited for */
    }
    if (strcmp(hb->spare_note, nd->spare_note) != 0) {
        snprintf(nd->spare_note, sizeof(nd->spare_note), "%s", hb->spare_note);
        if (nd->spare_note[0])
            spare_note_event(r, node, now_ms);
    }
    if (strcmp(hb->replica_of, nd->replica_of) != 0 || hb->nreplica != nd->nreplica ||
        memcmp(hb->replica, nd->replica, hb->nreplica * sizeof(hb->replica[0])) != 0) {
        snprintf(nd->replica_of, sizeof(nd->replica_of), "%s", hb->replica_of);
        nd->nreplica = hb->nreplica;
        memcpy(nd->replica, hb->replica, hb->nreplica * sizeof(hb->replica[0]));
        rdv__changed(r, 0);
    }
    if (hb->generation != r->generation || !nd->member)
        return;
    for (uint32_t i = 0; i < hb->nranks; i++) {
        const struct proto_rank_beat *b = &hb->ranks[i];
        if (b->rank < nd->first_rank || b->rank >= nd->first_rank + nd->ndevices)
            continue; /* not this node's rank: ignore rather than trust */
        struct rdv_rank *rk = &r->ranks[b->rank];
        if (rk->state == RDV_RANK_COMPLETED || rk->state == RDV_RANK_EXITED || rk->state == RDV_RANK_PENDING)
            continue;
        if (b->rank == 0 && b->checkpoint_step && (int64_t)b->checkpoint_step > r->last_checkpoint_step) {
            r->last_checkpoint_step = (int64_t)b->checkpoint_step;
            rdv__event(r, "checkpoint_committed", (int)node, 0, "checkpoint of step %llu committed",
                       (unsigned long long)b->checkpoint_step);
            rdv__changed(r, 1);
        }
        if (b->rank == 0 && b->restore_from != PROTO_RESTORE_NONE && !r->restore_noted)
            note_restore(r, node, b);
        take_beat(r, rk, b, now_ms);
    }
    if (r->state == RDV_RUNNING && rdv__all_yielded(r)) {
        rdv__finish_yield(r, now_ms, 0);
        return;
    }
    rdv__check_running(r, now_ms);
}
