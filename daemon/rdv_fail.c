/* daemon/rdv_fail.c: failures and the restart policy: a rank's exit, the next generation
 * (backoff, the restart budget, fatal classes), a failed job, and shrinking without members
 * that stay away (see rdv.h, daemon/failure.h). */
#include "daemon/rdv_internal.h"
#include "daemon/fitness.h"

#include <stdio.h>
#include <string.h>

#include "common/batch.h"

static void describe_exit(char *out, size_t cap, int32_t code, int32_t sig)
{
    if (sig > 0) {
        const char *name = sigabbrev_np(sig);
        snprintf(out, cap, "was killed by signal %d (SIG%s)", sig, name ? name : "?");
    } else {
        snprintf(out, cap, "exited with status %d", code);
    }
}

/* The job ended: ranks still alive are being stopped; their exits only settle their state. */
void rdv__settle_ranks(struct rdv *r)
{
    for (uint32_t i = 0; i < r->world_size; i++)
        if (r->ranks[i].state != RDV_RANK_COMPLETED && r->ranks[i].state != RDV_RANK_EXITED)
            rdv__set_rank_state(r, &r->ranks[i],
                                r->ranks[i].state == RDV_RANK_PENDING ? RDV_RANK_EXITED : RDV_RANK_STOPPING);
}

/* The job is failed for r->reason: persisted first, then every rank stopped. */
static void fail_job(struct rdv *r, int node, int rank)
{
    rdv__set_state(r, RDV_FAILED);
    r->resuming = 0;
    rdv__event(r, "job_failed", node, rank, "%s", r->reason);
    rdv__settle_ranks(r);
    rdv__changed(r, 1);
    rdv__stop_all(r);
}

/* Restarts that count toward max_restarts: all, or those of the last restart_window_s. */
static uint32_t restarts_counted(const struct rdv *r, uint64_t now_ms)
{
    if (r->spec->restart_window_s <= 0 || !r->restart_times)
        return r->restarts;
    const uint64_t window = (uint64_t)r->spec->restart_window_s * 1000;
    const uint32_t cap = (uint32_t)r->spec->max_restarts + 1;
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->nrestart_times && i < cap; i++)
        n += now_ms - r->restart_times[i] < window;
    return n;
}

static void spend_restart(struct rdv *r, uint64_t now_ms)
{
    r->restarts++;
    if (r->restart_times)
        r->restart_times[r->nrestart_times++ % ((uint32_t)r->spec->max_restarts + 1)] = now_ms;
}

/*
 * The generation is over: the members whose ranks start afresh (a rank that
 * is not running and able to rejoin in place, or every rank when they are
 * stopped rather than parked) report their latest checkpoint again before
 * the next one starts, when the job names checkpoint_latest and the node has
 * reported one before (its agent does so on COMMAND park or stop).
 */
static void want_checkpoints(struct rdv *r, int park)
{
    for (uint32_t i = 0; i < r->nnodes; i++) {
        struct rdv_node *nd = &r->nodes[i];
        nd->checkpoint_wanted = 0;
        if (!nd->member || !r->spec->checkpoint_latest[0] || !nd->reports_checkpoint)
            continue;
        int afresh = !park;
        for (uint32_t k = 0; k < r->world_size; k++) {
            const struct rdv_rank *rk = &r->ranks[k];
            if (rk->node == i)
                afresh |= rk->state != RDV_RANK_RUNNING || !rk->rejoin || rk->silent;
        }
        nd->checkpoint_wanted = afresh;
        nd->has_checkpoint = 0;
    }
}

/*
 * A failure in the current generation: open the next one (parking every
 * rank, which stops those that cannot rejoin in place, and assigning the
 * next generation once all members are back, after the backoff the
 * failure's class and the streak call for), or fail the job when the restart
 * budget is spent or retrying cannot help. An administrator's restart
 * (park 0) stops every rank instead: it asks for fresh processes.
 */
void rdv__open_next_generation(struct rdv *r, uint64_t now_ms, int node, int rank, const char *what,
                                 int spend, enum failure_class cls, int park)
{
    if (rdv_terminal(r) || r->state == RDV_WAITING)
        return;
#ifdef MUSTER_MUTANT_NO_PARK
    /* A broken heal for `make check-mutants` only (tests/mutants.sh): every failure stops every rank. */
    park = 0;
#endif
    r->resuming = 0;
    r->yielding = 0;
    r->swapping = 0;
    r->hang_pending = 0;
    if (spend && failure_fatal(cls)) {
        snprintf(r->reason, sizeof(r->reason), "%s; not retried: the rank's program cannot run as configured "
                 "(%s failure)", what, failure_class_name(cls));
        proto_text_sanitize(r->reason);
        fail_job(r, node, rank);
        return;
    }
    uint32_t counted = restarts_counted(r, now_ms);
    if (spend && counted >= (uint32_t)r->spec->max_restarts) {
        if (r->spec->restart_window_s > 0)
            snprintf(r->reason, sizeof(r->reason), "%s; gave up after %u restart%s in %d s (max_restarts=%d, "
                     "restart_window_s=%d)", what, counted, counted == 1 ? "" : "s", r->spec->restart_window_s,
                     r->spec->max_restarts, r->spec->restart_window_s);
        else
            snprintf(r->reason, sizeof(r->reason), "%s; gave up after %u restart%s (max_restarts=%d)", what,
                     counted, counted == 1 ? "" : "s", r->spec->max_restarts);
        proto_text_sanitize(r->reason);
        fail_job(r, node, rank);
        return;
    }
    /* A generation that ran restart_backoff_max_ms was healthy: the streak starts over. */
    if (r->running_since_ms && now_ms - r->running_since_ms >= (uint64_t)r->spec->restart_backoff_max_ms)
        r->streak = 0;
    r->running_since_ms = 0;
    uint64_t wait = 0;
    if (spend) {
        spend_restart(r, now_ms);
        r->streak++;
        wait = failure_backoff_ms(r->spec, r->streak, cls);
    }
    r->generation++;
    r->gen_opened_ms = now_ms;
    r->assigned_ms = 0;
    r->restart_at_ms = wait ? now_ms + wait : 0;
    rdv__set_state(r, RDV_RECOVERING);
    if (wait)
        snprintf(r->reason, sizeof(r->reason), "%s; generation %llu starts in %.1f s (%s, failure %u in a row)",
                 what, (unsigned long long)r->generation, (double)wait / 1000.0,
                 cls == FAILURE_DISK_FULL || cls == FAILURE_OOM ? "the cause will not go away by itself"
                                                                 : "restart backoff",
                 r->streak);
    else
        snprintf(r->reason, sizeof(r->reason), "%s", what);
    proto_text_sanitize(r->reason);
    want_checkpoints(r, park);
    for (uint32_t i = 0; i < r->world_size; i++) {
        rdv__set_rank_state(r, &r->ranks[i], RDV_RANK_PENDING);
        r->ranks[i].last_beat_ms = 0;
        r->ranks[i].yielded = 0;
    }
    rdv__event(r, "generation_opened", node, rank, "generation %llu opened: %s (restart %u of %d%s)",
               (unsigned long long)r->generation, what, r->restarts, r->spec->max_restarts,
               wait ? ", after a backoff" : "");
    if (wait)
        rdv__event(r, "restart_backoff", node, rank, "generation %llu waits %.1f s: %s failure %u in a row",
                   (unsigned long long)r->generation, (double)wait / 1000.0, failure_class_name(cls), r->streak);
    r->restore_noted = 0;
    /* Persisted before any frame names the new generation (see rdv_ops.changed). */
    rdv__changed(r, 1);
    rdv__command_all(r, park ? PROTO_CMD_PARK : PROTO_CMD_STOP);
    rdv__try_start_generation(r, now_ms);
}

void rdv__fail_generation(struct rdv *r, uint64_t now_ms, int node, int rank, const char *what)
{
    rdv__open_next_generation(r, now_ms, node, rank, what, 1, FAILURE_EXIT, 1);
}

static void record_failure(struct rdv *r, const struct rdv_node *nd, const struct proto_rank_exit *x,
                           const char *how, enum failure_class cls)
{
    struct rdv_failure *f = &r->last_failure;
    f->cls = (int)cls;
    f->generation = x->generation;
    f->rank = x->rank;
    snprintf(f->node, sizeof(f->node), "%s", nd->name);
    snprintf(f->how, sizeof(f->how), "%s", how);
    snprintf(f->reason, sizeof(f->reason), "%s", x->reason);
    snprintf(f->detail, sizeof(f->detail), "%s", x->detail);
}

void rdv__on_rank_exit(struct rdv *r, uint32_t node, const struct proto_rank_exit *x, uint64_t now_ms)
{
    struct rdv_node *nd = &r->nodes[node];
    char how[96], what[PROTO_REASON_MAX];

    if (!nd->member || x->rank < nd->first_rank || x->rank >= nd->first_rank + nd->ndevices)
        return;
    struct rdv_rank *rk = &r->ranks[x->rank];
    if (rk->state == RDV_RANK_PENDING)
        return; /* a rank of the generation before, reported late */
    if (rk->state == RDV_RANK_COMPLETED)
        return; /* told again by an agent that could not know it was read (a resumed session) */
    describe_exit(how, sizeof(how), x->exit_code, x->signal);
    if (x->signal == 0 && x->exit_code == 0) {
        rdv__set_rank_state(r, rk, RDV_RANK_COMPLETED);
        if (rk->silent)
            rdv__event(r, "rank_completed", (int)node, (int)x->rank, "rank %u on %s finished", x->rank, nd->name);
        else
            rdv__event(r, "rank_completed", (int)node, (int)x->rank, "rank %u on %s finished at step %llu", x->rank,
                       nd->name, (unsigned long long)rk->step);
        if (r->nranks_in[RDV_RANK_COMPLETED] != r->world_size) {
            rdv__changed(r, 0);
            return;
        }
        rdv__set_state(r, RDV_COMPLETED);
        r->resuming = 0; /* every rank finished while a member was still awaited after a restart */
        r->reason[0] = '\0';
        rdv__event(r, "job_completed", -1, -1, "job %s completed in generation %llu after %u restart%s",
                   r->spec->name, (unsigned long long)r->generation, r->restarts, r->restarts == 1 ? "" : "s");
        rdv__changed(r, 1);
        return;
    }
    rdv__set_rank_state(r, rk, RDV_RANK_EXITED);
    enum failure_class cls = failure_classify(x);
    record_failure(r, nd, x, how, cls);
    const char *why;
    uint32_t cause_node = node;
    int peer = cls == FAILURE_COMM ? rdv__blame_peer(r, x->rank, now_ms, &why) : -1;
    if (peer >= 0) { /* the collective waited for that peer: it is the cause */
        const struct rdv_rank *p = &r->ranks[peer];
        snprintf(what, sizeof(what), "rank %u on node %s %s waiting for rank %d (node %s), %s: %s", x->rank,
                 nd->name, how, peer, r->nodes[p->node].name, why, x->reason[0] ? x->reason : "no reason given");
        cause_node = p->node;
    } else if (x->reason[0]) {
        snprintf(what, sizeof(what), "rank %u on node %s %s: %s", x->rank, nd->name, how, x->reason);
    } else {
        snprintf(what, sizeof(what), "rank %u on node %s %s", x->rank, nd->name, how);
    }
    proto_text_sanitize(what);
    if (rk->silent || rk->last_beat_ms == 0) /* its step is unknown */
        rdv__event(r, "rank_failed", (int)node, (int)x->rank, "%s", what);
    else
        rdv__event(r, "rank_failed", (int)node, (int)x->rank, "%s (at step %llu)", what, (unsigned long long)rk->step);
    rdv__open_next_generation(r, now_ms, (int)cause_node, peer >= 0 ? peer : (int)x->rank, what, 1, cls, 1);
}

/*
 * Members that stay away longer than rejoin_timeout_ms: the job goes on
 * without them when at least min_nodes remain (ranks are laid out anew and
 * the ranks re-slice the ZeRO-3 checkpoint for the smaller world), and
 * fails otherwise. Shrinking spends no restart: the failure already did.
 */
void rdv__check_rejoin(struct rdv *r, uint64_t now_ms)
{
    if (r->state != RDV_RECOVERING || r->resuming || now_ms - r->gen_opened_ms <= (uint64_t)r->spec->rejoin_timeout_ms)
        return;
    uint32_t present = 0, missing = 0;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        if (!r->nodes[i].member)
            continue;
        if (fitness_ready(&r->nodes[i]))
            present++;
        else
            missing++;
    }
    if (missing == 0)
        return;
    char names[PROTO_REASON_MAX], what[PROTO_REASON_MAX];
    rdv__missing_members(r, names, sizeof(names));
    uint32_t floor = (uint32_t)(r->spec->min_nodes ? r->spec->min_nodes : r->spec->nodes);
    if (present == 0 || present < floor) {
        snprintf(r->reason, sizeof(r->reason),
                 "%s did not rejoin within %.0f s (rejoin_timeout_ms); %u node%s left, min_nodes is %u", names,
                 (double)r->spec->rejoin_timeout_ms / 1000.0, present, present == 1 ? "" : "s", floor);
        fail_job(r, -1, -1);
        return;
    }
    for (uint32_t i = 0; i < r->nnodes; i++) {
        if (r->nodes[i].member && !fitness_ready(&r->nodes[i])) {
            r->nodes[i].member = 0;
            if (r->nodes[i].state != RDV_NODE_JOINED)
                r->nodes[i].state = RDV_NODE_LEFT;
        }
    }
    uint32_t before = r->world_size;
    rdv__layout_members(r);
    if (rdv__build_ranks(r) != 0)
        return;
    struct batch_plan plan;
    char why[PROTO_REASON_MAX];
    if (batch_plan(r->spec->batch, r->spec->micro_batch, (int)r->world_size, &plan, why, sizeof(why)) != 0) {
        snprintf(r->reason, sizeof(r->reason), "cannot shrink without %s: %s", names, why);
        fail_job(r, -1, -1);
        return;
    }
    snprintf(what, sizeof(what), "%s did not rejoin within %.0f s: shrinking from %u to %u ranks on %u nodes", names,
             (double)r->spec->rejoin_timeout_ms / 1000.0, before, r->world_size, present);
    rdv__event(r, "job_shrunk", -1, -1, "%s", what);
    r->generation++;
    r->gen_opened_ms = now_ms;
    r->assigned_ms = 0;
    snprintf(r->reason, sizeof(r->reason), "%s", what);
    rdv__changed(r, 1);
    rdv__try_start_generation(r, now_ms);
}
