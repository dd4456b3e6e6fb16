#include "daemon/restdoc.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/sbuf.h"
#include "daemon/metrics.h"
#include "daemon/rdv.h"

/* A JSON number (shortest text that reads back the same double), or null. */
static void sb_num(struct sbuf *b, double v)
{
    if (!isfinite(v)) {
        sb_put(b, "null", 4);
        return;
    }
    char buf[40];
    int n = snprintf(buf, sizeof(buf), "%.15g", v);
    if (strtod(buf, NULL) != v)
        n = snprintf(buf, sizeof(buf), "%.17g", v);
    /* keep a real a real: 500 -> 500.0 */
    if (!strpbrk(buf, ".eEn"))
        n += snprintf(buf + n, sizeof(buf) - (size_t)n, ".0");
    sb_put(b, buf, (size_t)n);
}

static void sb_age(struct sbuf *b, int64_t ms)
{
    if (ms < 0)
        sb_put(b, "null", 4);
    else
        sb_printf(b, "%lld", (long long)ms);
}

/* ,"key":number and ,"key":age (milliseconds, null when negative) */
static void field_num(struct sbuf *b, const char *key, double v)
{
    sb_printf(b, ",\"%s\":", key);
    sb_num(b, v);
}

static void field_age(struct sbuf *b, const char *key, int64_t ms)
{
    sb_printf(b, ",\"%s\":", key);
    sb_age(b, ms);
}

/* ,"key":count, null when 0 (not reported) */
static void field_count(struct sbuf *b, const char *key, uint64_t n)
{
    if (n)
        sb_printf(b, ",\"%s\":%llu", key, (unsigned long long)n);
    else
        sb_printf(b, ",\"%s\":null", key);
}

/* ,"key":"text", null when NULL or "" */
static void field_str(struct sbuf *b, const char *key, const char *s)
{
    sb_printf(b, ",\"%s\":", key);
    if (s && s[0])
        sb_json_str(b, s);
    else
        sb_put(b, "null", 4);
}

/* ---- records ---------------------------------------------------------------- */

static void rank_json(struct sbuf *b, const struct snap_view *v, const struct snap_rank *rk)
{
    const char *node = rk->node < v->nnodes ? v->nodes[rk->node].name : "";
    sb_printf(b, "{\"rank\":%u,\"node\":", rk->rank);
    sb_json_str(b, node);
    sb_printf(b, ",\"local_rank\":%u,\"device\":%u,\"state\":\"%s\",\"step\":", rk->local_rank, rk->device,
              rdv_rank_state_name((enum rdv_rank_state)rk->state));
    if (rk->silent)
        sb_put(b, "null", 4);
    else
        sb_printf(b, "%llu", (unsigned long long)rk->step);
    field_num(b, "loss", rk->loss);
    field_num(b, "tokens_per_s", rk->tokens_per_s);
    field_num(b, "comm_frac", rk->comm_frac);
    field_age(b, "heartbeat_age_ms", rk->heartbeat_age_ms);
    field_age(b, "step_age_ms", rk->step_age_ms);
    sb_printf(b, ",\"stale\":%s,\"silent\":%s", rk->stale ? "true" : "false", rk->silent ? "true" : "false");
    field_str(b, "error", rk->failed ? v->failure_reason : NULL);
    field_count(b, "step_bytes", rk->step_bytes);
    field_count(b, "peak_mem", rk->peak_mem);
    field_str(b, "where", rk->where);
    field_str(b, "waiting", rk->waiting);
    sb_printf(b, ",\"stopped\":%s,\"hung\":%s", rk->stopped ? "true" : "false", rk->hung ? "true" : "false");
    field_num(b, "step_s", rk->step_s > 0 ? rk->step_s : NAN);
    field_count(b, "total_steps", rk->total_steps);
    /* the time split: shares of its latest window, and compute seconds per step when steps are known */
    if (rk->split_s > 0) {
        sb_printf(b, ",\"split\":{\"window_s\":%.6g,\"steps\":%llu,\"compute\":%.4f,\"collective\":%.4f,"
                  "\"gpu\":%.4f,\"data\":%.4f}", rk->split_s, (unsigned long long)rk->split_steps,
                  rk->split[PROTO_SPLIT_COMPUTE], rk->split[PROTO_SPLIT_COLLECTIVE], rk->split[PROTO_SPLIT_GPU],
                  rk->split[PROTO_SPLIT_DATA]);
        field_num(b, "compute_s", rk->split_steps ? rk->split[PROTO_SPLIT_COMPUTE] * rk->split_s /
                                                         (double)rk->split_steps : NAN);
    } else {
        sb_put(b, ",\"split\":null,\"compute_s\":null", 30);
    }
    sb_printf(b, ",\"slow\":%s}", rk->slow ? "true" : "false");
}

static void node_json(struct sbuf *b, const struct snap_node *nd)
{
    sb_put(b, "{\"name\":", 8);
    sb_json_str(b, nd->name);
    sb_printf(b, ",\"state\":\"%s\",\"health\":\"%s\",\"addr\":", rdv_node_state_name((enum rdv_node_state)nd->state),
              snap_health_name((enum snap_health)nd->health));
    sb_json_str(b, nd->addr);
    sb_printf(b, ",\"devices\":%u,\"kind\":\"%s\",\"ranks\":[", nd->ndevices, nd->gpu ? "gpu" : "cpu");
    for (uint32_t i = 0; i < nd->nranks; i++)
        sb_printf(b, "%s%u", i ? "," : "", nd->first_rank + i);
    sb_put(b, "]", 1);
    field_age(b, "heartbeat_age_ms", nd->heartbeat_age_ms);
    sb_put(b, ",\"rank_states\":{", 16);
    int first = 1;
    for (int s = 0; s < SNAP_RANK_NSTATES; s++) {
        if (!nd->ranks_in[s])
            continue;
        sb_printf(b, "%s\"%s\":%u", first ? "" : ",", rdv_rank_state_name((enum rdv_rank_state)s), nd->ranks_in[s]);
        first = 0;
    }
    sb_put(b, "},\"step_min\":", 13);
    if (nd->steps_known)
        sb_printf(b, "%llu,\"step_max\":%llu", (unsigned long long)nd->step_min, (unsigned long long)nd->step_max);
    else
        sb_put(b, "null,\"step_max\":null", 20);
    field_num(b, "loss", nd->loss);
    field_num(b, "tokens_per_s", nd->tokens_per_s);
    field_num(b, "comm_frac", nd->comm_frac);
    field_age(b, "rank_heartbeat_age_max_ms", nd->rank_heartbeat_age_max);
    sb_printf(b, ",\"role\":\"%s\"", snap_role_name((enum snap_role)nd->role));
    field_str(b, "domain", nd->domain[0] ? nd->domain : NULL);
    sb_printf(b, ",\"fit\":\"%s\"", snap_fit_name((enum snap_fit)nd->fit));
    field_str(b, "unfit_reason", nd->unfit_reason);
    field_str(b, "gpu_name", nd->gpu_name);
    sb_printf(b, ",\"device_mem_mb\":%llu", (unsigned long long)nd->device_mem_mb);
    if (nd->device_free_mb >= 0)
        sb_printf(b, ",\"device_free_mb\":%lld", (long long)nd->device_free_mb);
    else
        sb_put(b, ",\"device_free_mb\":null", 22);
    field_count(b, "host_mem_mb", nd->host_mem_mb);
    sb_put(b, "}", 1);
}

/* ---- /v1/status --------------------------------------------------------- */

static char *render_status(struct snap_view *v, size_t *len)
{
    struct sbuf b = {0};
    pthread_mutex_lock(&v->head_lock);
    char *head = json_dumps(v->head, JSON_COMPACT);
    pthread_mutex_unlock(&v->head_lock);
    size_t hl = head ? strlen(head) : 0;
    if (hl < 2 || head[hl - 1] != '}') {
        free(head);
        return NULL;
    }
    sb_put(&b, head, hl - 1);
    free(head);
    sb_printf(&b, "%s\"version\":%lu,\"ranks_by_state\":{", hl > 2 ? "," : "", v->version);
    for (int s = 0; s < SNAP_RANK_NSTATES; s++)
        sb_printf(&b, "%s\"%s\":%u", s ? "," : "", rdv_rank_state_name((enum rdv_rank_state)s), v->ranks_in[s]);
    sb_put(&b, "},\"nodes_by_state\":{", 20);
    for (int s = 0; s < SNAP_NODE_NSTATES; s++)
        sb_printf(&b, "%s\"%s\":%u", s ? "," : "", rdv_node_state_name((enum rdv_node_state)s), v->nodes_in[s]);
    sb_put(&b, "},\"nodes_by_health\":{", 21);
    for (int h = 0; h < SNAP_NHEALTH; h++)
        sb_printf(&b, "%s\"%s\":%u", h ? "," : "", snap_health_name((enum snap_health)h), v->nodes_health[h]);
    uint32_t unhealthy = 0;
    for (int h = 0; h < SNAP_HEALTH_OK; h++)
        unhealthy += v->nodes_health[h];
    sb_printf(&b, "},\"unhealthy_nodes_total\":%u,\"unhealthy_nodes\":[", unhealthy);
    for (uint32_t i = 0; i < unhealthy && i < SNAP_TOP_NODES; i++) {
        if (i)
            sb_put(&b, ",", 1);
        node_json(&b, &v->nodes[v->node_order[i]]);
    }
    sb_printf(&b, "],\"failing_ranks_total\":%u,\"failing_ranks\":[", v->failing_total);
    for (uint32_t i = 0; i < v->nfailing; i++) {
        if (i)
            sb_put(&b, ",", 1);
        rank_json(&b, v, &v->ranks[v->failing[i]]);
    }
    sb_put(&b, "],\"slowest_ranks\":[", 19);
    for (uint32_t i = 0; i < v->nslowest; i++) {
        if (i)
            sb_put(&b, ",", 1);
        rank_json(&b, v, &v->ranks[v->slowest[i]]);
    }
    sb_put(&b, "]}", 2);
    return sb_finish(&b, len);
}

/* ---- lists ---------------------------------------------------------------- */

int restdoc_find_node(const struct snap_view *v, const char *name)
{
    for (uint32_t i = 0; i < v->nnodes; i++)
        if (strcmp(v->nodes[i].name, name) == 0)
            return (int)i;
    return -1;
}

static int rank_matches(const struct snap_rank *rk, const struct restdoc_query *q)
{
    return !q->states || (q->states & (1u << rk->state));
}

static int node_matches(const struct snap_node *nd, const struct restdoc_query *q)
{
    return (!q->states || (q->states & (1u << nd->state))) && (!q->healths || (q->healths & (1u << nd->health))) &&
           (!q->node[0] || strcmp(nd->name, q->node) == 0);
}

/* Ranks q may match: all of them, or the block of the node it names. */
static void rank_range(const struct snap_view *v, const struct restdoc_query *q, uint32_t *lo, uint32_t *hi)
{
    *lo = 0;
    *hi = v->nranks;
    if (!q->node[0])
        return;
    int n = restdoc_find_node(v, q->node);
    if (n < 0 || !v->nodes[n].nranks) {
        *hi = 0;
        return;
    }
    *lo = v->nodes[n].first_rank < v->nranks ? v->nodes[n].first_rank : v->nranks;
    *hi = *lo + v->nodes[n].nranks < v->nranks ? *lo + v->nodes[n].nranks : v->nranks;
}

char *restdoc_list(const struct snap_view *v, enum restdoc_list list, const struct restdoc_query *q, size_t *len)
{
    struct sbuf b = {0};
    uint64_t matched = 0, shown = 0, end = q->limit ? q->offset + q->limit : UINT64_MAX;
    int ranks = list == RESTDOC_RANKS;

    sb_printf(&b, "{\"version\":%lu,\"total\":%u,\"%s\":[", v->version, ranks ? v->nranks : v->nnodes,
              ranks ? "ranks" : "nodes");
    if (ranks) {
        uint32_t lo, hi;
        rank_range(v, q, &lo, &hi);
        for (uint32_t i = lo; i < hi; i++) {
            if (!rank_matches(&v->ranks[i], q))
                continue;
            if (matched >= q->offset && matched < end) {
                if (shown++)
                    sb_put(&b, ",", 1);
                rank_json(&b, v, &v->ranks[i]);
            }
            matched++;
        }
    } else {
        for (uint32_t k = 0; k < v->nnodes; k++) {
            uint32_t i = q->by_health ? v->node_order[k] : k;
            if (!node_matches(&v->nodes[i], q))
                continue;
            if (matched >= q->offset && matched < end) {
                if (shown++)
                    sb_put(&b, ",", 1);
                node_json(&b, &v->nodes[i]);
            }
            matched++;
        }
    }
    sb_printf(&b, "],\"matched\":%llu,\"offset\":%llu,\"next_offset\":", (unsigned long long)matched,
              (unsigned long long)q->offset);
    if (end < matched)
        sb_printf(&b, "%llu}", (unsigned long long)end);
    else
        sb_put(&b, "null}", 5);
    return sb_finish(&b, len);
}

/* ---- query parameters ------------------------------------------------------ */

enum { P_STATE, P_NODE, P_OFFSET, P_LIMIT, P_HEALTH, P_ORDER };
static const char *const param_names[] = {"state", "node", "offset", "limit", "health", "order"};

/* Decimal digits only, at most max; 0 or -EINVAL. */
static int parse_count(const char *s, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (!*s || strlen(s) > 20)
        return -EINVAL;
    for (; *s; s++) {
        if (*s < '0' || *s > '9')
            return -EINVAL;
        uint64_t d = (uint64_t)(*s - '0');
        if (v > (max - d) / 10)
            return -EINVAL;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* A comma-separated list of names into a bit set; -EINVAL on an unknown or empty one. */
static int parse_set(const char *s, int (*lookup)(const char *name, size_t len), uint32_t *out)
{
    uint32_t set = 0;
    for (;;) {
        size_t n = strcspn(s, ",");
        int bit = n ? lookup(s, n) : -1;
        if (bit < 0)
            return -EINVAL;
        set |= 1u << bit;
        if (!s[n])
            break;
        s += n + 1;
    }
    *out = set;
    return 0;
}

static int lookup_in(const char *name, size_t len, const char *(*names)(int), int n)
{
    for (int i = 0; i < n; i++)
        if (strlen(names(i)) == len && memcmp(names(i), name, len) == 0)
            return i;
    return -1;
}

static const char *rank_state_at(int i) { return rdv_rank_state_name((enum rdv_rank_state)i); }
static const char *node_state_at(int i) { return rdv_node_state_name((enum rdv_node_state)i); }
static int rank_state_bit(const char *name, size_t len) { return lookup_in(name, len, rank_state_at, SNAP_RANK_NSTATES); }
static int node_state_bit(const char *name, size_t len) { return lookup_in(name, len, node_state_at, SNAP_NODE_NSTATES); }
static int health_bit(const char *name, size_t len)
{
    enum snap_health h;
    return snap_health_parse(name, len, &h) == 0 ? (int)h : -1;
}

/* 1..63 characters of [A-Za-z0-9._-], the node names agents may use. */
static int node_name_valid(const char *s)
{
    size_t len = strlen(s);
    return len >= 1 && len < PROTO_NAME_MAX &&
           strspn(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-") == len;
}

int restdoc_query_param(struct restdoc_query *q, enum restdoc_list list, const char *key, const char *value,
                        char *err, size_t errlen)
{
    int ranks = list == RESTDOC_RANKS;
    int nparams = ranks ? P_LIMIT + 1 : P_ORDER + 1;
    int p = 0;
    while (p < nparams && strcmp(key, param_names[p]) != 0)
        p++;
    if (p == nparams) {
        snprintf(err, errlen, "unknown parameter '%.40s' (%s)", key,
                 ranks ? "state, node, offset, limit" : "state, health, node, order, offset, limit");
        return -EINVAL;
    }
    if (q->seen & (1u << p)) {
        snprintf(err, errlen, "%s: given twice", key);
        return -EINVAL;
    }
    q->seen |= 1u << p;
    q->any = 1;
    if (!value)
        value = "";
    uint64_t n;
    switch (p) {
    case P_STATE:
        if (parse_set(value, ranks ? rank_state_bit : node_state_bit, &q->states) == 0)
            return 0;
        snprintf(err, errlen, "state: expected %s (one or more, separated by commas), got '%.40s'",
                 ranks ? "pending, starting, running, stopping, exited, completed" : "joined, lost, left", value);
        return -EINVAL;
    case P_HEALTH:
        if (parse_set(value, health_bit, &q->healths) == 0)
            return 0;
        snprintf(err, errlen,
                 "health: expected lost, failed, unfit, stale, waiting, ok, left (one or more, separated by commas), "
                 "got '%.40s'",
                 value);
        return -EINVAL;
    case P_NODE:
        if (node_name_valid(value)) {
            snprintf(q->node, sizeof(q->node), "%s", value);
            return 0;
        }
        snprintf(err, errlen, "node: expected a node name (1 to 63 of A-Z a-z 0-9 . _ -), got '%.40s'", value);
        return -EINVAL;
    case P_ORDER:
        if (strcmp(value, "name") == 0 || strcmp(value, "health") == 0) {
            q->by_health = value[0] == 'h';
            return 0;
        }
        snprintf(err, errlen, "order: expected name or health, got '%.40s'", value);
        return -EINVAL;
    case P_OFFSET:
        if (parse_count(value, UINT32_MAX, &n) == 0) {
            q->offset = n;
            return 0;
        }
        snprintf(err, errlen, "offset: expected a number 0..4294967295, got '%.40s'", value);
        return -EINVAL;
    default:
        if (parse_count(value, RESTDOC_LIMIT_MAX, &n) == 0 && n >= 1) {
            q->limit = (uint32_t)n;
            return 0;
        }
        snprintf(err, errlen, "limit: expected a number 1..%d, got '%.40s'", RESTDOC_LIMIT_MAX, value);
        return -EINVAL;
    }
}

/* ---- cached documents ------------------------------------------------------- */

static char *render(struct snap_view *v, enum snap_doc which, size_t *len)
{
    static const struct restdoc_query all;
    switch (which) {
    case SNAP_DOC_STATUS: return render_status(v, len);
    case SNAP_DOC_RANKS: return restdoc_list(v, RESTDOC_RANKS, &all, len);
    case SNAP_DOC_NODES: return restdoc_list(v, RESTDOC_NODES, &all, len);
    case SNAP_DOC_METRICS: return metrics_render(v, 0, len);
    case SNAP_DOC_METRICS_RANKS: return metrics_render(v, 1, len);
    default: return NULL;
    }
}

const char *restdoc_get(struct snap_view *v, enum snap_doc which, size_t *len)
{
    struct snap_text *t = &v->doc[which];
    pthread_mutex_lock(&t->lock);
    if (!t->text)
        t->text = render(v, which, &t->len);
    const char *text = t->text;
    *len = t->len;
    pthread_mutex_unlock(&t->lock);
    return text;
}
