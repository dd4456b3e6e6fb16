#include "daemon/metrics.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/sbuf.h"
#include "daemon/rdv.h"

/* Every job state, in life order; muster_job_state is one-hot over these. */
static const char *const job_states[] = {"waiting", "forming", "running", "recovering",
                                         "completed", "stopped", "failed"};

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

static void header(struct sbuf *b, const char *name, const char *type, const char *help)
{
    sb_printf(b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* " value\n": Go's ParseFloat spellings for the non-finite ones. */
static void value(struct sbuf *b, double v)
{
    if (isnan(v))
        sb_put(b, " NaN\n", 5);
    else if (isinf(v))
        sb_printf(b, " %sInf\n", v > 0 ? "+" : "-");
    else if (v == floor(v) && fabs(v) < 9007199254740992.0)
        sb_printf(b, " %.0f\n", v);
    else
        sb_printf(b, " %.10g\n", v);
}

/* A label value: backslash, double quote and line feed escaped. */
static void label_value(struct sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    for (; *s; s++) {
        if (*s == '\\')
            sb_put(b, "\\\\", 2);
        else if (*s == '"')
            sb_put(b, "\\\"", 2);
        else if (*s == '\n')
            sb_put(b, "\\n", 2);
        else
            sb_put(b, s, 1);
    }
    sb_put(b, "\"", 1);
}

/* One unlabelled sample of a number field of the job's head; left out (HELP
 * and TYPE kept) when the field is null. */
static void scalar(struct sbuf *b, const json_t *head, const char *key, const char *name, const char *type,
                   const char *help)
{
    header(b, name, type, help);
    json_t *j = json_object_get(head, key);
    if (json_is_number(j)) {
        sb_printf(b, "%s", name);
        value(b, json_number_value(j));
    }
}

static void job(struct sbuf *b, struct snap_view *v)
{
    pthread_mutex_lock(&v->head_lock);
    const json_t *head = v->head;
    const char *state = json_string_value(json_object_get(head, "state"));
    header(b, "muster_job_state", "gauge", "1 for the job's current state, 0 for the others");
    for (size_t i = 0; i < NELEMS(job_states); i++)
        sb_printf(b, "muster_job_state{state=\"%s\"} %d\n", job_states[i], state && strcmp(state, job_states[i]) == 0);
    scalar(b, head, "generation", "muster_generation", "gauge", "Current generation (bumped at every re-formation)");
    scalar(b, head, "world_size", "muster_world_size", "gauge", "Ranks in the current generation");
    scalar(b, head, "restarts", "muster_restarts_total", "counter", "Restarts (new generations after a failure) of the job");
    scalar(b, head, "max_restarts", "muster_max_restarts", "gauge", "Restarts allowed before the job is failed");
    scalar(b, head, "step", "muster_step", "gauge", "Training step of the job");
    scalar(b, head, "loss", "muster_loss", "gauge", "Training loss of the job");
    scalar(b, head, "tokens_per_s", "muster_tokens_per_second", "gauge", "Training throughput of the whole job");
    scalar(b, head, "comm_frac", "muster_comm_fraction", "gauge", "Fraction of step time spent in communication");
    scalar(b, head, "last_checkpoint_step", "muster_last_checkpoint_step", "gauge",
           "Step of the last committed checkpoint");
    scalar(b, head, "nodes_wanted", "muster_nodes_wanted", "gauge", "Nodes the job needs to form a generation");
    scalar(b, head, "stale_frames", "muster_stale_frames_total", "counter",
           "Frames refused because they carried an older generation");
    scalar(b, head, "uptime_s", "muster_uptime_seconds", "gauge", "Seconds since musterd started");
    const json_t *spares = json_object_get(head, "spares"); /* hot spare nodes (job key spare_nodes) */
    scalar(b, spares, "ready", "muster_spares_ready", "gauge", "Hot spare nodes joined and fit, ready to replace a lost node");
    scalar(b, spares, "replacements", "muster_spare_replacements_total", "counter",
           "Members replaced by a hot spare node");
    /* With an etcd store every musterd answers /metrics itself: say which leads. */
    const json_t *store = json_object_get(head, "store");
    if (json_is_object(store)) {
        const char *role = json_string_value(json_object_get(store, "role"));
        header(b, "muster_store_leader", "gauge", "1 when this musterd leads the job (etcd store), 0 on a standby");
        sb_printf(b, "muster_store_leader %d\n", role && strcmp(role, "leader") == 0);
        header(b, "muster_store_quorum", "gauge", "0 while etcd has no quorum and the leader holds the generation");
        sb_printf(b, "muster_store_quorum %d\n", json_is_true(json_object_get(store, "quorum")));
    }
    pthread_mutex_unlock(&v->head_lock);

    uint32_t slow = 0;
    for (uint32_t i = 0; i < v->nranks; i++)
        slow += v->ranks[i].slow;
    header(b, "muster_slow_ranks", "gauge", "Ranks musterd names slow (fail-slow: they compute longer than their peers)");
    sb_printf(b, "muster_slow_ranks %u\n", slow);
    header(b, "muster_ranks", "gauge", "Ranks of the current generation, by state");
    for (int s = 0; s < SNAP_RANK_NSTATES; s++)
        sb_printf(b, "muster_ranks{state=\"%s\"} %u\n", rdv_rank_state_name((enum rdv_rank_state)s), v->ranks_in[s]);
    header(b, "muster_nodes", "gauge", "Nodes known to the daemon, by state");
    for (int s = 0; s < SNAP_NODE_NSTATES; s++)
        sb_printf(b, "muster_nodes{state=\"%s\"} %u\n", rdv_node_state_name((enum rdv_node_state)s), v->nodes_in[s]);
    header(b, "muster_nodes_health", "gauge", "Nodes by health (lost, failed, unfit, stale, waiting, ok, left)");
    for (int h = 0; h < SNAP_NHEALTH; h++)
        sb_printf(b, "muster_nodes_health{health=\"%s\"} %u\n", snap_health_name((enum snap_health)h),
                  v->nodes_health[h]);
}

/* ---- node series ---------------------------------------------------------- */

/* A node's value; 0 when it has none (the sample is left out). */
typedef int (*node_value_fn)(const struct snap_node *nd, double *out);

static int node_devices(const struct snap_node *nd, double *out) { *out = nd->ndevices; return 1; }
static int node_up(const struct snap_node *nd, double *out) { *out = nd->state == RDV_NODE_JOINED; return 1; }
static int node_healthy(const struct snap_node *nd, double *out)
{
    *out = nd->health == SNAP_HEALTH_OK;
    return nd->state != RDV_NODE_LEFT;
}
static int node_age(const struct snap_node *nd, double *out)
{
    *out = (double)nd->heartbeat_age_ms / 1000.0;
    return nd->heartbeat_age_ms >= 0;
}
static int node_running(const struct snap_node *nd, double *out)
{
    *out = nd->ranks_in[RDV_RANK_RUNNING];
    return nd->nranks > 0;
}
static int node_step(const struct snap_node *nd, double *out)
{
    *out = (double)nd->step_min;
    return nd->steps_known;
}
static int node_loss(const struct snap_node *nd, double *out)
{
    *out = nd->loss;
    return isfinite(nd->loss);
}
static int node_tps(const struct snap_node *nd, double *out)
{
    *out = nd->tokens_per_s;
    return nd->nranks > 0;
}
static int node_comm(const struct snap_node *nd, double *out)
{
    *out = nd->comm_frac;
    return nd->ranks_in[RDV_RANK_RUNNING] > 0;
}

static const struct {
    const char *name;
    node_value_fn fn;
    const char *help;
} node_metrics[] = {
    {"muster_node_up", node_up, "1 while a node's agent is connected"},
    {"muster_node_healthy", node_healthy, "1 when a node's health is ok (see /v1/nodes health)"},
    {"muster_node_devices", node_devices, "Devices (GPUs or CPU slots) a node reported"},
    {"muster_node_heartbeat_age_seconds", node_age, "Seconds since the last heartbeat of a node's agent"},
    {"muster_node_ranks_running", node_running, "Ranks of a node that run"},
    {"muster_node_step", node_step, "Lowest step a rank of the node reported"},
    {"muster_node_loss", node_loss, "Mean of the last losses a node's ranks reported"},
    {"muster_node_tokens_per_second", node_tps, "Training throughput of a node's running ranks"},
    {"muster_node_comm_fraction", node_comm, "Mean fraction of step time a node's running ranks spend in communication"},
};

static void nodes(struct sbuf *b, const struct snap_view *v)
{
    for (size_t m = 0; m < NELEMS(node_metrics); m++) {
        header(b, node_metrics[m].name, "gauge", node_metrics[m].help);
        for (uint32_t i = 0; i < v->nnodes; i++) {
            double x;
            if (!node_metrics[m].fn(&v->nodes[i], &x))
                continue;
            sb_printf(b, "%s{node=", node_metrics[m].name);
            label_value(b, v->nodes[i].name);
            sb_put(b, "}", 1);
            value(b, x);
        }
    }
}

/* ---- rank series ---------------------------------------------------------- */

typedef int (*rank_value_fn)(const struct snap_rank *rk, double *out);

static int rank_step(const struct snap_rank *rk, double *out) { *out = (double)rk->step; return !rk->silent; }
static int rank_loss(const struct snap_rank *rk, double *out) { *out = rk->loss; return isfinite(rk->loss); }
static int rank_tps(const struct snap_rank *rk, double *out) { *out = rk->tokens_per_s; return 1; }
static int rank_comm(const struct snap_rank *rk, double *out) { *out = rk->comm_frac; return 1; }
static int rank_compute(const struct snap_rank *rk, double *out)
{
    *out = rk->split[PROTO_SPLIT_COMPUTE];
    return rk->split_s > 0;
}
static int rank_compute_s(const struct snap_rank *rk, double *out)
{
    *out = rk->split_steps ? rk->split[PROTO_SPLIT_COMPUTE] * rk->split_s / (double)rk->split_steps : 0;
    return rk->split_s > 0 && rk->split_steps;
}
static int rank_slow(const struct snap_rank *rk, double *out) { *out = rk->slow; return 1; }
static int rank_age(const struct snap_rank *rk, double *out)
{
    *out = (double)rk->heartbeat_age_ms / 1000.0;
    return rk->heartbeat_age_ms >= 0;
}

static const struct {
    const char *name;
    rank_value_fn fn;
    const char *help;
} rank_metrics[] = {
    {"muster_rank_step", rank_step, "Last step a rank reported"},
    {"muster_rank_loss", rank_loss, "Last training loss a rank reported"},
    {"muster_rank_tokens_per_second", rank_tps, "Training throughput of a rank"},
    {"muster_rank_comm_fraction", rank_comm, "Fraction of a rank's step time spent in communication"},
    {"muster_rank_heartbeat_age_seconds", rank_age, "Seconds since a rank's last heartbeat"},
    {"muster_rank_compute_fraction", rank_compute, "Share of a rank's wall time its main thread computes (not waiting)"},
    {"muster_rank_compute_seconds_per_step", rank_compute_s, "Seconds a rank's main thread computes per step"},
    {"muster_rank_slow", rank_slow, "1 while musterd names the rank slow (fail-slow)"},
};

static void ranks(struct sbuf *b, const struct snap_view *v)
{
    for (size_t m = 0; m < NELEMS(rank_metrics); m++) {
        header(b, rank_metrics[m].name, "gauge", rank_metrics[m].help);
        for (uint32_t i = 0; i < v->nranks; i++) {
            const struct snap_rank *rk = &v->ranks[i];
            double x;
            if (!rank_metrics[m].fn(rk, &x))
                continue;
            sb_printf(b, "%s{rank=\"%u\",node=", rank_metrics[m].name, rk->rank);
            label_value(b, rk->node < v->nnodes ? v->nodes[rk->node].name : "");
            sb_put(b, "}", 1);
            value(b, x);
        }
    }
}

char *metrics_render(struct snap_view *v, int with_ranks, size_t *len)
{
    struct sbuf b = {0};
    job(&b, v);
    nodes(&b, v);
    if (with_ranks)
        ranks(&b, v);
    return sb_finish(&b, len);
}
