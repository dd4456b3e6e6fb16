#include "daemon/view_build.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/fitness.h"

_Static_assert(SNAP_RANK_NSTATES == RDV_RANK_NSTATES, "snap_rank states follow rdv_rank_state");
_Static_assert(SNAP_NODE_NSTATES == RDV_NODE_LEFT + 1, "snap_node states follow rdv_node_state");

static int rank_live(uint8_t state)
{
    return state == RDV_RANK_STARTING || state == RDV_RANK_RUNNING || state == RDV_RANK_STOPPING;
}

/* How badly a rank needs attention: 0 failed, 1 stale, hung or stopped, 2 waited for
 * (not yet or no longer running in a job that goes on), 3 fine. */
static int rank_severity(const struct snap_view *v, const struct snap_rank *rk)
{
    if (rk->state == RDV_RANK_EXITED && (!v->job_ended || rk->failed))
        return 0;
    if (rk->stale || rk->hung || (rk->stopped && rank_live(rk->state)))
        return 1;
    if (!v->job_ended && rk->state != RDV_RANK_RUNNING && rk->state != RDV_RANK_COMPLETED)
        return 2;
    return 3;
}

/* a comes before b in the failing list */
static int failing_before(const struct snap_view *v, uint32_t a, uint32_t b)
{
    const struct snap_rank *ra = &v->ranks[a], *rb = &v->ranks[b];
    int sa = rank_severity(v, ra), sb = rank_severity(v, rb);
    if (sa != sb)
        return sa < sb;
    if (ra->heartbeat_age_ms != rb->heartbeat_age_ms)
        return ra->heartbeat_age_ms > rb->heartbeat_age_ms;
    return a < b;
}

/* a comes before b in the slowest list */
static int slower(const struct snap_view *v, uint32_t a, uint32_t b)
{
    const struct snap_rank *ra = &v->ranks[a], *rb = &v->ranks[b];
    if (ra->step != rb->step)
        return ra->step < rb->step;
    if (ra->tokens_per_s != rb->tokens_per_s)
        return ra->tokens_per_s < rb->tokens_per_s;
    return a < b;
}

/* Keeps the SNAP_TOP_RANKS first ranks of an order in top[0..*n), sorted. */
static void top_insert(const struct snap_view *v, uint32_t *top, uint32_t *n, uint32_t rank,
                       int (*before)(const struct snap_view *, uint32_t, uint32_t))
{
    uint32_t at = *n;
    while (at > 0 && before(v, rank, top[at - 1]))
        at--;
    if (at >= SNAP_TOP_RANKS)
        return;
    uint32_t last = *n < SNAP_TOP_RANKS ? *n : SNAP_TOP_RANKS - 1;
    memmove(&top[at + 1], &top[at], (last - at) * sizeof(top[0]));
    top[at] = rank;
    if (*n < SNAP_TOP_RANKS)
        (*n)++;
}

static void node_rollup(struct snap_view *v, struct snap_node *nd)
{
    double loss_sum = 0, comm_sum = 0;
    uint32_t nloss = 0, nrun = 0;
    int any_failed = 0, any_stale = 0, any_waiting = 0;

    memset(nd->ranks_in, 0, sizeof(nd->ranks_in));
    nd->steps_known = 0;
    nd->step_min = nd->step_max = 0;
    nd->tokens_per_s = 0;
    nd->rank_heartbeat_age_max = -1;
    for (uint32_t i = nd->first_rank; i < nd->first_rank + nd->nranks && i < v->nranks; i++) {
        const struct snap_rank *rk = &v->ranks[i];
        int sev = rank_severity(v, rk);
        nd->ranks_in[rk->state]++;
        any_failed |= sev == 0;
        any_stale |= sev == 1;
        any_waiting |= sev == 2;
        if (!rk->silent && (rk->heartbeat_age_ms >= 0 || rk->step)) {
            if (!nd->steps_known || rk->step < nd->step_min)
                nd->step_min = rk->step;
            if (!nd->steps_known || rk->step > nd->step_max)
                nd->step_max = rk->step;
            nd->steps_known = 1;
        }
        if (isfinite(rk->loss)) {
            loss_sum += rk->loss;
            nloss++;
        }
        if (rk->state == RDV_RANK_RUNNING) {
            nd->tokens_per_s += rk->tokens_per_s;
            comm_sum += rk->comm_frac;
            nrun++;
        }
        if (rk->heartbeat_age_ms > nd->rank_heartbeat_age_max)
            nd->rank_heartbeat_age_max = rk->heartbeat_age_ms;
    }
    nd->loss = nloss ? loss_sum / nloss : NAN;
    nd->comm_frac = nrun ? comm_sum / nrun : 0;

    if (nd->state == RDV_NODE_LOST)
        nd->health = SNAP_HEALTH_LOST;
    else if (nd->state == RDV_NODE_LEFT)
        nd->health = SNAP_HEALTH_LEFT;
    else if (any_failed)
        nd->health = SNAP_HEALTH_FAILED;
    else if (nd->fit == SNAP_FIT_UNFIT)
        nd->health = SNAP_HEALTH_UNFIT;
    else if (any_stale || (nd->heartbeat_age_ms >= 0 && nd->heartbeat_age_ms > v->stale_after_ms))
        nd->health = SNAP_HEALTH_STALE;
    else if (any_waiting || nd->fit == SNAP_FIT_CHECKING)
        nd->health = SNAP_HEALTH_WAITING;
    else
        nd->health = SNAP_HEALTH_OK;
}

/* qsort_r order of node indices: health, worst first, then name */
static int by_health(const void *a, const void *b, void *ctx)
{
    const struct snap_view *v = ctx;
    const struct snap_node *na = &v->nodes[*(const uint32_t *)a];
    const struct snap_node *nb = &v->nodes[*(const uint32_t *)b];
    if (na->health != nb->health)
        return na->health < nb->health ? -1 : 1;
    return strcmp(na->name, nb->name);
}

void view_derive(struct snap_view *v)
{
    memset(v->ranks_in, 0, sizeof(v->ranks_in));
    memset(v->nodes_in, 0, sizeof(v->nodes_in));
    memset(v->nodes_health, 0, sizeof(v->nodes_health));
    v->nfailing = v->failing_total = v->nslowest = 0;

    for (uint32_t i = 0; i < v->nranks; i++) {
        const struct snap_rank *rk = &v->ranks[i];
        v->ranks_in[rk->state]++;
        if (rank_severity(v, rk) < 3) {
            v->failing_total++;
            top_insert(v, v->failing, &v->nfailing, i, failing_before);
        }
        if (rk->state == RDV_RANK_RUNNING && !rk->silent)
            top_insert(v, v->slowest, &v->nslowest, i, slower);
    }
    for (uint32_t i = 0; i < v->nnodes; i++) {
        struct snap_node *nd = &v->nodes[i];
        node_rollup(v, nd);
        v->nodes_in[nd->state]++;
        v->nodes_health[nd->health]++;
        v->node_order[i] = i;
    }
    qsort_r(v->node_order, v->nnodes, sizeof(v->node_order[0]), by_health, v);
}

/* Fitness and device facts of a node; an unfit node's reason is copied to *pool. */
static void node_facts(struct snap_node *nd, const struct rdv_node *src, char **pool)
{
    const char *why = fitness_reason(src);
    nd->fit = src->fitness == RDV_FIT_CHECKING ? SNAP_FIT_CHECKING : why[0] ? SNAP_FIT_UNFIT : SNAP_FIT_OK;
    if (nd->fit == SNAP_FIT_UNFIT) {
        size_t n = strlen(why) + 1;
        nd->unfit_reason = memcpy(*pool, why, n);
        *pool += n;
    }
    memcpy(nd->gpu_name, src->gpu_name, sizeof(nd->gpu_name));
    nd->device_mem_mb = src->gpu_total_mb ? src->gpu_total_mb : src->device_mem_mb;
    nd->device_free_mb = src->gpu_name[0] ? (int64_t)src->gpu_free_mb : -1;
    nd->host_mem_mb = src->host_mem_mb;
}

/* Room a rank's where or waiting takes in the view's pool: none when "". */
static size_t rank_said_len(const char *s)
{
    return s[0] ? strlen(s) + 1 : 0;
}

/* s copied to *pool, or NULL when "". */
static const char *rank_said(const char *s, char **pool)
{
    size_t n = rank_said_len(s);
    if (!n)
        return NULL;
    char *at = memcpy(*pool, s, n);
    *pool += n;
    return at;
}

struct snap_view *view_build(const struct rdv *r, uint64_t now_ms, char *events, char *history)
{
    struct snap_view *v = snap_view_new(r->nnodes, r->world_size);
    json_t *head = v ? rdv_summary_json(r, now_ms) : NULL;
    if (!head) {
        snap_view_unref(v);
        free(events);
        free(history);
        return NULL;
    }
    v->head = head;
    v->events = events;
    v->events_len = events ? strlen(events) : 0;
    v->history = history;
    v->history_len = history ? strlen(history) : 0;
    v->stale_after_ms = (int64_t)r->spec->heartbeat_timeout_ms / 2;
    v->job_ended = rdv_terminal(r);
    snprintf(v->state, sizeof(v->state), "%s", rdv_job_state_name(r->state));

    const struct rdv_failure *f = &r->last_failure;
    snprintf(v->failure_reason, sizeof(v->failure_reason), "%s", f->reason);
    size_t reasons = 0; /* bytes of the unfit nodes' reasons: a handful of nodes, usually none */
    for (uint32_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].fitness != RDV_FIT_CHECKING && fitness_reason(&r->nodes[i])[0])
            reasons += strlen(fitness_reason(&r->nodes[i])) + 1;
    if (reasons && !(v->strings = malloc(reasons))) {
        snap_view_unref(v);
        return NULL;
    }
    char *pool = v->strings;
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *src = &r->nodes[i];
        struct snap_node *nd = &v->nodes[i];
        memcpy(nd->name, src->name, sizeof(nd->name));
        memcpy(nd->addr, src->addr, sizeof(nd->addr));
        nd->state = (uint8_t)src->state;
        nd->gpu = src->kind == PROTO_DEV_GPU;
        nd->ndevices = src->ndevices;
        nd->first_rank = src->member ? src->first_rank : 0;
        nd->nranks = src->member ? src->ndevices : 0;
        nd->role = src->member ? SNAP_ROLE_MEMBER : rdv_is_spare(r, i) ? SNAP_ROLE_SPARE : SNAP_ROLE_IDLE;
        memcpy(nd->domain, src->domain, sizeof(nd->domain));
        nd->heartbeat_age_ms = src->state == RDV_NODE_JOINED ? (int64_t)(now_ms - src->last_seen_ms) : -1;
        node_facts(nd, src, &pool);
    }
    size_t said = 0; /* bytes of the ranks' where and waiting */
    for (uint32_t i = 0; i < r->world_size; i++)
        said += rank_said_len(r->ranks[i].where) + rank_said_len(r->ranks[i].waiting);
    if (said && !(v->rank_strings = malloc(said))) {
        snap_view_unref(v);
        return NULL;
    }
    pool = v->rank_strings;
    const int hang_failed = f->generation == r->generation && strcmp(f->how, "is hung") == 0;
    for (uint32_t i = 0; i < r->world_size; i++) {
        const struct rdv_rank *src = &r->ranks[i];
        struct snap_rank *rk = &v->ranks[i];
        rk->where = rank_said(src->where, &pool);
        rk->waiting = rank_said(src->waiting, &pool);
        rk->stopped = (uint8_t)src->stopped;
        rk->hung = (r->hang_pending && r->hang_rank == (int)i) || (hang_failed && f->rank == i);
        rk->step_s = src->step_s;
        rk->total_steps = src->total_steps;
        rk->split_s = src->split_s;
        rk->split_steps = src->split_steps;
        memcpy(rk->split, src->split, sizeof(rk->split));
        rk->slow = (uint8_t)src->slow.slow;
        rk->rank = i;
        rk->node = src->node;
        rk->local_rank = src->local_rank;
        rk->device = src->device;
        rk->state = (uint8_t)src->state;
        rk->silent = (uint8_t)src->silent;
        rk->failed = f->generation && f->rank == i && src->state == RDV_RANK_EXITED && f->reason[0];
        rk->step = src->step;
        rk->loss = src->loss;
        rk->tokens_per_s = src->tokens_per_s;
        rk->comm_frac = src->comm_frac;
        rk->heartbeat_age_ms = src->last_beat_ms ? (int64_t)(now_ms - src->last_beat_ms) : -1;
        rk->step_age_ms = !src->silent && src->progress_ms && src->progress_ms <= now_ms
                              ? (int64_t)(now_ms - src->progress_ms) : -1;
        rk->step_bytes = src->step_bytes;
        rk->peak_mem = src->peak_mem;
        rk->stale = rank_live(rk->state) && rk->heartbeat_age_ms > v->stale_after_ms;
    }
    view_derive(v);
    return v;
}
