/* daemon/rdv_status.c: the job's figures and its documents: GET /v1/status's job fields,
 * /v1/events and /v1/stacks (see rdv.h, docs/rest.md). */
#include "daemon/rdv_internal.h"
#include "daemon/fitness.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/memtags.h"
#include "common/sbuf.h"

/* Ranks that count for the job's figures: the running ones, or, when none
 * runs (recovering, ended), every rank that has reported. */
static int counts(const struct rdv *r, const struct rdv_rank *rk)
{
    if (rk->silent)
        return 0; /* its step is unknown, not 0 */
    if (r->nranks_in[RDV_RANK_RUNNING])
        return rk->state == RDV_RANK_RUNNING;
    return rk->last_beat_ms != 0 || rk->step != 0;
}

/* Some rank reports its step (not every rank is silent). */
static int step_known(const struct rdv *r)
{
    for (uint32_t i = 0; i < r->world_size; i++)
        if (counts(r, &r->ranks[i]))
            return 1;
    return 0;
}

uint64_t rdv_job_step(const struct rdv *r)
{
    uint64_t step = 0;
    int seen = 0;
    for (uint32_t i = 0; i < r->world_size; i++) {
        if (!counts(r, &r->ranks[i]))
            continue;
        if (!seen || r->ranks[i].step < step)
            step = r->ranks[i].step;
        seen = 1;
    }
    return step;
}

static json_t *num_or_null(double v) { return isfinite(v) ? json_real(v) : json_null(); }

/* The steps the job will run, when known: the job spec's `steps` (muster-train's), else the most any
 * rank says (total_steps); null otherwise. */
static json_t *total_steps_json(const struct rdv *r)
{
    if (json_object_get(r->job, "steps"))
        return json_integer(r->spec->steps);
    uint64_t most = 0;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (r->ranks[i].total_steps > most)
            most = r->ranks[i].total_steps;
    return most ? json_integer((json_int_t)most) : json_null();
}

/* o as JSON text without its closing brace, into b: for more members after it. */
static void put_open(struct sbuf *b, json_t *o)
{
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) {
        b->failed = 1;
        return;
    }
    size_t n = strlen(text);
    sb_put(b, text, n > 0 ? n - 1 : 0);
    free(text);
}

char *rdv_stacks_text(const struct rdv *r)
{
    const struct rdv_stacks *k = &r->stacks;
    char when[40] = "";
    if (k->generation) {
        time_t secs = (time_t)(k->wall_ms / 1000);
        struct tm tm;
        gmtime_r(&secs, &tm);
        size_t n = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(when + n, sizeof(when) - n, ".%03dZ", (int)(k->wall_ms % 1000));
    }
    enum { SUMMARY_MAX = 16384 };
    char *summary = k->generation ? malloc(SUMMARY_MAX) : NULL;
    if (summary)
        rdv__stacks_summary(r, summary, SUMMARY_MAX);
    char verdict[PROTO_REASON_MAX];
    uint32_t blamed = 0;
    int flight = rdv__flight_verdict(r, verdict, sizeof(verdict), &blamed) == 1;
    struct sbuf b = {0};
    put_open(&b, json_pack("{s:I, s:o, s:o, s:i, s:i, s:I, s:o, s:o}", "set", (json_int_t)k->asked, "generation",
                           k->generation ? json_integer((json_int_t)k->generation) : json_null(), "requested",
                           k->generation ? json_string(when) : json_null(), "answered", (int)k->nanswered,
                           "expected", (int)k->nranks, "cut", (json_int_t)k->cut, "summary",
                           summary && summary[0] ? json_string(summary) : json_null(), "flight_recorder",
                           flight ? json_pack("{s:i, s:s}", "rank", (int)blamed, "verdict", verdict) : json_null()));
    free(summary);
    sb_put(&b, ",\"ranks\":[", 10);
    for (uint32_t i = 0; i < k->nranks && !b.failed; i++) {
        const struct rdv_stack *e = &k->ranks[i];
        const struct rdv_rank *rk = i < r->world_size ? &r->ranks[i] : NULL;
        if (i)
            sb_put(&b, ",", 1);
        put_open(&b, json_pack("{s:i, s:o, s:b, s:o, s:b, s:o, s:o, s:o, s:i, s:o, s:o}", "rank", (int)i, "node",
                               rk ? json_string(r->nodes[rk->node].name) : json_null(), "answered", e->answered,
                               "pid", e->pid ? json_integer(e->pid) : json_null(), "stopped",
                               e->stopped || (rk && rk->stopped), "where",
                               rk && rk->where[0] ? json_string(rk->where) : json_null(), "waiting",
                               rk && rk->waiting[0] ? json_string(rk->waiting) : json_null(), "error",
                               e->error[0] ? json_string(e->error) : json_null(), "cut", (int)e->cut, "fr",
                               e->fr ? json_string(e->fr) : json_null(), "ras",
                               e->ras ? json_string(e->ras) : json_null()));
        sb_put(&b, ",\"text\":", 8);
        if (e->text)
            sb_put(&b, e->text, e->len); /* rendered once, when it came */
        else
            sb_put(&b, "null", 4);
        sb_put(&b, "}", 1);
    }
    sb_put(&b, "]}", 2);
    return sb_finish(&b, NULL);
}

static json_t *failure_json(const struct rdv_failure *f)
{
    if (!f->generation)
        return json_null();
    return json_pack("{s:I, s:i, s:s, s:s, s:s, s:o, s:o}", "generation", (json_int_t)f->generation, "rank",
                     (int)f->rank, "node", f->node, "how", f->how, "class",
                     failure_class_name((enum failure_class)f->cls), "reason",
                     f->reason[0] ? json_string(f->reason) : json_null(), "detail",
                     f->detail[0] ? json_string(f->detail) : json_null());
}

void rdv_figures(const struct rdv *r, struct rdv_figures *out)
{
    double loss_sum = 0;
    uint32_t nloss = 0;
    memset(out, 0, sizeof(*out));
    out->step_known = step_known(r);
    out->step = rdv_job_step(r);
    for (uint32_t i = 0; i < r->world_size; i++) {
        const struct rdv_rank *rk = &r->ranks[i];
        if (rk->state == RDV_RANK_RUNNING) {
            out->nrunning++;
            out->tokens_per_s += rk->tokens_per_s;
            out->comm_frac += rk->comm_frac;
        }
        if (counts(r, rk) && isfinite(rk->loss)) {
            loss_sum += rk->loss;
            nloss++;
        }
    }
    out->loss = nloss ? loss_sum / nloss : NAN;
    if (out->nrunning)
        out->comm_frac /= out->nrunning;
}

/* By node: the newest of each member's own complete memory checkpoints (drained: of those drained to
 * checkpoint_dir), null when it has none; a node that is no member shows only when it has some. */
static json_t *newest_by_node(const struct rdv *r, int drained)
{
    json_t *out = json_object();
    for (uint32_t i = 0; i < r->nnodes; i++) {
        const struct rdv_node *nd = &r->nodes[i];
        uint32_t n = drained ? nd->ndrained : nd->nmemckpt;
        const char *newest = !n ? NULL : drained ? nd->drained[n - 1] : nd->memckpt[n - 1];
        if (nd->member || n)
            json_object_set_new(out, nd->name, newest ? json_string(newest) : json_null());
    }
    return out;
}

/* memory_checkpoint: the newest complete on all members, each node's newest (and newest drained); null when the
 * job keeps none. */
static json_t *memckpt_json(const struct rdv *r)
{
    if (!r->spec->memory_checkpoint_mb)
        return json_null();
    char common[PROTO_CKPT_NAME_MAX];
    int have = rdv_memckpt_common(r, common, sizeof(common)) > 0;
    json_t *out = json_pack("{s:o, s:o, s:o, s:o}", "common", have ? json_string(common) : json_null(),
                            "common_step", have ? json_integer((json_int_t)memtags_step(common)) : json_null(),
                            "nodes", newest_by_node(r, 0), "replicas", rdv__memckpt_replicas_json(r));
    if (r->spec->memory_checkpoint_drain_steps)
        json_object_set_new(out, "drained", newest_by_node(r, 1));
    return out;
}

json_t *rdv_summary_json(const struct rdv *r, uint64_t now_ms)
{
    struct rdv_figures fig;
    rdv_figures(r, &fig);
    int known = fig.step_known; /* some rank reports steps; else step and steps mean nothing */
    json_t *restored = r->restore_noted ? json_pack("{s:s, s:I}", "from", proto_restore_name(r->restore_from), "step",
                                                     (json_int_t)r->restore_step)
                                         : json_null();
    json_t *st = json_pack("{s:s, s:s, s:o, s:I, s:i, s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:f, s:f, s:o, s:o, s:I, s:o}",
                           "job", r->spec->name, "state", rdv_job_state_name(r->state), "reason",
                           r->reason[0] ? json_string(r->reason) : json_null(), "generation",
                           (json_int_t)r->generation, "world_size", (int)r->world_size, "nodes_wanted",
                           r->spec->nodes, "restarts", (int)r->restarts, "max_restarts", r->spec->max_restarts,
                           "step", known ? json_integer((json_int_t)fig.step) : json_null(), "steps",
                           total_steps_json(r), "loss", num_or_null(fig.loss),
                           "tokens_per_s", num_or_null(fig.tokens_per_s), "comm_frac", fig.comm_frac, "uptime_s",
                           (double)(now_ms - r->started_ms) / 1000.0, "last_checkpoint_step",
                           r->last_checkpoint_step >= 0 ? json_integer(r->last_checkpoint_step) : json_null(),
                           "restored", restored, "stale_frames", (json_int_t)r->stale_frames, "last_failure",
                           failure_json(&r->last_failure));
    json_object_set_new(st, "repeated_unique_ids", json_integer((json_int_t)r->repeated_unique_ids));
    json_object_update_new(st, fitness_plan_json(r)); /* plan, plan_note, measured */
    json_object_set_new(st, "memory_checkpoint", memckpt_json(r));
    json_object_set_new(st, "spares", rdv_spares_json(r));
    double slowest = 0; /* the job steps at its slowest rank's pace */
    for (uint32_t i = 0; i < r->world_size; i++)
        if (r->ranks[i].state == RDV_RANK_RUNNING && r->ranks[i].step_s > slowest)
            slowest = r->ranks[i].step_s;
    json_object_set_new(st, "step_s", slowest > 0 ? json_real(slowest) : json_null());
    json_object_set_new(st, "slow_ranks", rdv_slow_json(r, now_ms));
    const uint64_t limit = hang_timeout_ms(&r->steps, r->spec->progress_timeout_ms);
    const double median = hang_median_step_s(&r->steps);
    json_object_set_new(st, "progress_timeout",
                        json_pack("{s:I, s:s, s:o}", "ms", (json_int_t)limit, "basis",
                                  r->spec->progress_timeout_ms >= 0 ? "fixed"
                                  : r->steps.seen <= HANG_JUDGE_STEPS || !r->steps.nrecent ? "start"
                                                                                          : "steps",
                                  "median_step_s", median > 0 ? json_real(median) : json_null()));
    return st;
}

json_t *rdv_events_json(const struct rdv *r)
{
    json_t *arr = json_array();
    uint64_t first = r->nevents > RDV_EVENTS ? r->nevents - RDV_EVENTS : 0;

    for (uint64_t s = first; s < r->nevents; s++) {
        const struct rdv_event *e = &r->events[s % RDV_EVENTS];
        char when[40];
        time_t secs = (time_t)(e->wall_ms / 1000);
        struct tm tm;
        gmtime_r(&secs, &tm);
        size_t n = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
        snprintf(when + n, sizeof(when) - n, ".%03dZ", (int)(e->wall_ms % 1000));
        json_array_append_new(
            arr, json_pack("{s:I, s:s, s:I, s:s, s:o, s:o, s:s}", "seq", (json_int_t)e->seq, "time", when,
                           "generation", (json_int_t)e->generation, "kind", e->kind, "node",
                           e->node[0] ? json_string(e->node) : json_null(),
                           "rank", e->rank >= 0 ? json_integer(e->rank) : json_null(), "message", e->message));
    }
    return json_pack("{s:o}", "events", arr);
}
