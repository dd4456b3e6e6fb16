/* daemon/rdv.c: the job state machine and its one setter, the event ring, what every file
 * of rdv shares (rdv_internal.h), and the entry points that hand each input to the file of
 * its idea: rdv_init, rdv_message, rdv_tick, rdv_admin (see rdv.h). */
#include "daemon/rdv_internal.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/log.h"

static const char *const job_state_names[] = {
    "waiting", "forming", "running", "recovering", "completed", "stopped", "failed",
};
static const char *const node_state_names[] = {"joined", "lost", "left"};
static const char *const rank_state_names[] = {
    "pending", "starting", "running", "stopping", "exited", "completed",
};

const char *rdv_job_state_name(enum rdv_job_state s) { return job_state_names[s]; }
const char *rdv_node_state_name(enum rdv_node_state s) { return node_state_names[s]; }
const char *rdv_rank_state_name(enum rdv_rank_state s) { return rank_state_names[s]; }

int rdv_job_state_parse(const char *name, enum rdv_job_state *out)
{
    for (int i = 0; i <= RDV_FAILED; i++) {
        if (strcmp(name, job_state_names[i]) == 0) {
            *out = (enum rdv_job_state)i;
            return 0;
        }
    }
    return -EINVAL;
}

int rdv_terminal(const struct rdv *r)
{
    return r->state == RDV_COMPLETED || r->state == RDV_STOPPED || r->state == RDV_FAILED;
}

/* The job state machine (rdv.h says why each transition exists): 1 where
 * a job in the row's state may go to the column's. */
static const unsigned char job_transitions[RDV_FAILED + 1][RDV_FAILED + 1] = {
    /*                waiting forming running recovering completed stopped failed */
    [RDV_WAITING]    = {0,    1,      0,      1,         1,        1,      1},
    [RDV_FORMING]    = {0,    0,      1,      1,         1,        1,      1},
    [RDV_RUNNING]    = {0,    0,      0,      1,         1,        1,      1},
    [RDV_RECOVERING] = {0,    1,      1,      1,         1,        1,      1},
    [RDV_COMPLETED]  = {0},
    [RDV_STOPPED]    = {0},
    [RDV_FAILED]     = {0},
};

int rdv__set_state(struct rdv *r, enum rdv_job_state to)
{
    if ((unsigned)to > RDV_FAILED || !job_transitions[r->state][to]) {
        log_error("job %s: refused state change %s -> %s (generation %llu)", r->spec->name,
                  job_state_names[r->state], (unsigned)to > RDV_FAILED ? "?" : job_state_names[to],
                  (unsigned long long)r->generation);
        return -EINVAL;
    }
    log_debug("job %s: %s -> %s (generation %llu)", r->spec->name, job_state_names[r->state], job_state_names[to],
              (unsigned long long)r->generation);
    r->state = to;
    return 0;
}

void rdv__event(struct rdv *r, const char *kind, int node, int rank, const char *fmt, ...)
{
    struct rdv_event *e = &r->events[r->nevents % RDV_EVENTS];
    struct timespec ts;
    va_list ap;

    clock_gettime(CLOCK_REALTIME, &ts);
    e->seq = ++r->nevents;
    e->wall_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    e->generation = r->generation;
    snprintf(e->kind, sizeof(e->kind), "%s", kind);
    snprintf(e->node, sizeof(e->node), "%s", node >= 0 ? r->nodes[node].name : "");
    e->rank = rank;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof(e->message), fmt, ap);
    va_end(ap);
    proto_text_sanitize(e->message); /* a rank's words cut short may end mid-character */
}

void rdv_note(struct rdv *r, const char *kind, const char *message)
{
    rdv__event(r, kind, -1, -1, "%s", message);
    r->ops.changed(r->ops.ctx, 0);
}

int rdv__find_node(const struct rdv *r, const char *name)
{
    uintptr_t idx;
    return namemap_get(&r->byname, name, &idx) == 0 ? (int)idx : -1;
}

/* Forgets nodes[idx] (before formation: no rank refers to nodes by index). */
void rdv__remove_node(struct rdv *r, uint32_t idx)
{
    namemap_del(&r->byname, r->nodes[idx].name);
    r->nodes[idx] = r->nodes[--r->nnodes];
    if (idx < r->nnodes)
        namemap_put(&r->byname, r->nodes[idx].name, idx);
}

/* Every change of a rank's state goes through here, so nranks_in stays exact. */
void rdv__set_rank_state(struct rdv *r, struct rdv_rank *rk, enum rdv_rank_state to)
{
    r->nranks_in[rk->state]--;
    r->nranks_in[to]++;
    rk->state = to;
}

void rdv__send_to(struct rdv *r, uint32_t node, const struct proto_msg *m)
{
    r->ops.send(r->ops.ctx, r->nodes[node].name, m);
}

void rdv__send_command(struct rdv *r, uint32_t node, enum proto_command action)
{
    struct proto_msg m; /* sent to each node in turn: only the command is written, not the whole union */
    m.type = PROTO_COMMAND;
    m.u.command = (struct proto_command_msg){.generation = r->generation, .action = action, .term = r->term};
    rdv__send_to(r, node, &m);
}

void rdv__changed(struct rdv *r, int persist) { r->ops.changed(r->ops.ctx, persist); }

uint32_t rdv__member_count(const struct rdv *r)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < r->nnodes; i++)
        n += r->nodes[i].member;
    return n;
}

/* Members that are not connected, as "a, b" for messages. */
void rdv__missing_members(const struct rdv *r, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < r->nnodes && used < cap; i++) {
        if (r->nodes[i].member && r->nodes[i].state != RDV_NODE_JOINED)
            used += (size_t)snprintf(out + used, cap - used, "%s%s", used ? ", " : "", r->nodes[i].name);
    }
}

void rdv__command_all(struct rdv *r, enum proto_command action)
{
    for (uint32_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].member && r->nodes[i].state == RDV_NODE_JOINED)
            rdv__send_command(r, i, action);
}

void rdv__stop_all(struct rdv *r) { rdv__command_all(r, PROTO_CMD_STOP); }

int rdv_init(struct rdv *r, const struct job_spec *spec, json_t *job, const struct rdv_ops *ops,
             uint64_t now_ms)
{
    memset(r, 0, sizeof(*r));
    r->master_port_node = -1;
    r->spec = spec;
    r->job = json_incref(job);
    r->ops = *ops;
    if (!(r->job_text = json_dumps(job, JSON_COMPACT))) {
        json_decref(r->job);
        return -ENOMEM;
    }
    _Static_assert(RDV_WAITING == 0, "a zeroed rdv is waiting");
    r->started_ms = now_ms;
    r->last_checkpoint_step = -1;
    r->stacks.rank_max = RDV_STACKS_RANK_MAX;
    r->stacks.total_max = RDV_STACKS_TOTAL_MAX;
    if (namemap_init(&r->byname, RDV_MAX_NODES) != 0) {
        free(r->job_text);
        json_decref(r->job);
        return -ENOMEM;
    }
    if (spec->restart_window_s > 0 &&
        !(r->restart_times = calloc((size_t)spec->max_restarts + 1, sizeof(*r->restart_times)))) {
        namemap_free(&r->byname);
        free(r->job_text);
        json_decref(r->job);
        return -ENOMEM;
    }
    rdv__event(r, "daemon_started", -1, -1, "job %s: waiting for %d node%s", spec->name, spec->nodes,
               spec->nodes == 1 ? "" : "s");
    return 0;
}

void rdv_free(struct rdv *r)
{
    rdv__stacks_clear(&r->stacks);
    free(r->ranks);
    r->ranks = NULL;
    free(r->restart_times);
    r->restart_times = NULL;
    namemap_free(&r->byname);
    json_decref(r->job);
    r->job = NULL;
    free(r->job_text);
    r->job_text = NULL;
}

void rdv_message(struct rdv *r, const char *name, const struct proto_msg *m, uint64_t now_ms)
{
    int idx = rdv__find_node(r, name);
    uint64_t gen = 0;

    if (idx < 0 || r->nodes[idx].state != RDV_NODE_JOINED)
        return;
    r->nodes[idx].last_seen_ms = now_ms;
    switch (m->type) {
    case PROTO_HEARTBEAT:
        rdv__on_heartbeat(r, (uint32_t)idx, &m->u.heartbeat, now_ms);
        return;
    case PROTO_UNIQUE_ID: gen = m->u.unique_id.generation; break;
    case PROTO_RANK_EXIT: gen = m->u.rank_exit.generation; break;
    case PROTO_ERROR:
        rdv__event(r, "node_error", idx, -1, "node %s reports: %s: %s", name, m->u.error.code, m->u.error.reason);
        return;
    case PROTO_PREFLIGHT:
        rdv__on_preflight(r, (uint32_t)idx, &m->u.preflight, now_ms);
        return;
    case PROTO_MEM_FILE:
        rdv__on_mem_file(r, (uint32_t)idx, &m->u.mem_file, now_ms);
        return;
    case PROTO_STACKS:
        rdv__on_stacks(r, (uint32_t)idx, &m->u.stacks);
        if (r->hang_pending && rdv__stacks_complete(r))
            rdv__finish_hang(r, now_ms);
        return;
    default:
        return; /* LOG_DATA: the node is heard, nothing more here */
    }
    if (gen == r->generation && rdv_terminal(r) && m->type == PROTO_RANK_EXIT) {
        const struct proto_rank_exit *x = &m->u.rank_exit;
        const struct rdv_node *nd = &r->nodes[idx];
        if (nd->member && x->rank >= nd->first_rank && x->rank < nd->first_rank + nd->ndevices &&
            r->ranks[x->rank].state != RDV_RANK_COMPLETED) {
            rdv__set_rank_state(r, &r->ranks[x->rank], RDV_RANK_EXITED);
            rdv__changed(r, 0);
        }
        return;
    }
    if (gen != r->generation || rdv_terminal(r)) {
        r->stale_frames++;
        if (m->type == PROTO_UNIQUE_ID) {
            struct proto_msg e = {.type = PROTO_ERROR};
            snprintf(e.u.error.code, sizeof(e.u.error.code), "stale_generation");
            snprintf(e.u.error.reason, sizeof(e.u.error.reason),
                     "unique id for generation %llu refused: current generation is %llu",
                     (unsigned long long)gen, (unsigned long long)r->generation);
            rdv__send_to(r, (uint32_t)idx, &e);
        }
        return;
    }
    if (m->type == PROTO_UNIQUE_ID) {
        if (!rdv__on_unique_id(r, (uint32_t)idx, &m->u.unique_id, now_ms))
            return;
    } else
        rdv__on_rank_exit(r, (uint32_t)idx, &m->u.rank_exit, now_ms);
    rdv__changed(r, 0);
}

void rdv_tick(struct rdv *r, uint64_t now_ms)
{
    const uint64_t timeout = (uint64_t)r->spec->heartbeat_timeout_ms;
    rdv__check_lost(r, now_ms);
    if (rdv__spares_fill(r, now_ms)) /* a restored member silent too long: a spare takes its place */
        rdv__try_start_generation(r, now_ms);
    if ((r->restart_at_ms && now_ms >= r->restart_at_ms) ||
        (r->checkpoint_wait_ms && now_ms - r->checkpoint_wait_ms >= (uint64_t)r->spec->heartbeat_timeout_ms) ||
        (r->memckpt_wait_ms && now_ms - r->memckpt_wait_ms >= (uint64_t)r->spec->heartbeat_timeout_ms))
        rdv__try_start_generation(r, now_ms);
    rdv__maybe_form(r, now_ms);
    if (r->yielding && r->state == RDV_RUNNING && now_ms - r->yield_since_ms >= rdv__yield_wait_ms(r))
        rdv__finish_yield(r, now_ms, 1);
    rdv__check_progress(r, now_ms);
    rdv__check_slow(r, now_ms);
    rdv__maybe_swap_slow(r, now_ms);
    rdv__check_start(r, now_ms);
    rdv__check_rejoin(r, now_ms);
    if (r->resuming && now_ms - r->gen_opened_ms > timeout) {
        char missing[PROTO_REASON_MAX], what[PROTO_REASON_MAX];
        rdv__missing_members(r, missing, sizeof(missing));
        snprintf(what, sizeof(what), "after the daemon restarted, %s did not rejoin within %.1f s", missing,
                 (double)timeout / 1000.0);
        rdv__fail_generation(r, now_ms, -1, -1, what);
    }
}

int rdv_admin(struct rdv *r, enum rdv_admin action, const char *name, uint64_t now_ms)
{
    switch (action) {
    case RDV_ADMIN_STOP:
        if (rdv_terminal(r))
            return -EINVAL;
        rdv__set_state(r, RDV_STOPPED);
        r->resuming = 0; /* members still awaited after a restart bring nothing back */
        snprintf(r->reason, sizeof(r->reason), "stopped by an administrator");
        rdv__event(r, "job_stopped", -1, -1, "job %s stopped by an administrator", r->spec->name);
        rdv__settle_ranks(r);
        rdv__stop_all(r);
        rdv__changed(r, 1);
        return 0;
    case RDV_ADMIN_RESTART:
        if (r->state != RDV_RUNNING && r->state != RDV_RECOVERING && r->state != RDV_FORMING)
            return -EINVAL;
        /* An asked-for restart does not spend the failure budget. */
        rdv__open_next_generation(r, now_ms, -1, -1, "restart requested by an administrator", 0, FAILURE_EXIT, 0);
        return 0;
    case RDV_ADMIN_CHECKPOINT:
        if (!r->spec->checkpoint_dir[0])
            return -ENOTSUP;
        if (r->state != RDV_RUNNING)
            return -EINVAL;
        for (uint32_t i = 0; i < r->nnodes; i++)
            if (r->nodes[i].member && r->nodes[i].state == RDV_NODE_JOINED)
                rdv__send_command(r, i, PROTO_CMD_CHECKPOINT);
        rdv__event(r, "checkpoint_requested", -1, -1,
                   "checkpoint requested by an administrator: taken at the next step boundary");
        rdv__changed(r, 0);
        return 0;
    case RDV_ADMIN_STACKS:
        if (r->state != RDV_RUNNING && r->state != RDV_FORMING)
            return -EINVAL;
        if (r->hang_pending)
            return 0; /* a hang's stacks are being collected: that set answers */
        if (rdv__ask_stacks(r) != 0)
            return -ENOMEM;
        rdv__event(r, "stacks_requested", -1, -1, "stacks of generation %llu requested by an administrator",
                   (unsigned long long)r->generation);
        rdv__changed(r, 0);
        return 0;
    case RDV_ADMIN_DRAIN: {
        int idx = name ? rdv__find_node(r, name) : -1;
        if (idx < 0)
            return -ENOENT;
        struct rdv_node *nd = &r->nodes[idx];
        if (nd->member && !rdv_terminal(r) && r->state != RDV_WAITING)
            return -EINVAL; /* shrinking a running job needs resharding (issue 4) */
        if (nd->state == RDV_NODE_JOINED) {
            rdv__send_command(r, (uint32_t)idx, PROTO_CMD_SHUTDOWN);
            r->ops.disconnect(r->ops.ctx, nd->name, "drained");
        }
        nd->state = RDV_NODE_LEFT;
        rdv__event(r, "node_drained", idx, -1, "node %s drained by an administrator", nd->name);
        if (r->state == RDV_WAITING)
            rdv__remove_node(r, (uint32_t)idx);
        rdv__changed(r, 1);
        return 0;
    }
    }
    return -EINVAL;
}
