/* daemon/rdv_slow.c: fail-slow: the ranks' time splits as their heartbeats
 * bring them, the rule of failslow.h applied to them once a new window came
 * (at most every FAILSLOW_EVAL_MS), the events when a rank starts and stops being slow,
 * and the sentence that says so with the evidence (see rdv.h). */
#include "daemon/rdv_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rdv__note_split(struct rdv *r, struct rdv_rank *rk, const struct proto_rank_beat *b, uint64_t now_ms)
{
    if (!(b->split_s > 0))
        return; /* none in this entry: the latest one stands */
    if (b->split_s == rk->split_s && b->split_steps == rk->split_steps &&
        memcmp(b->split, rk->split, sizeof(rk->split)) == 0)
        return; /* the same window again (a keepalive) */
    rk->split_s = b->split_s;
    rk->split_steps = b->split_steps;
    memcpy(rk->split, b->split, sizeof(rk->split));
    rk->split_ms = now_ms;
    rk->split_seq++;
    r->split_news = 1;
}

/* A rank whose split counts now: running, not stopped, its window recent
 * (within three windows, and at least 3 s). */
static int judged(const struct rdv_rank *rk, uint64_t now_ms)
{
    if (rk->state != RDV_RANK_RUNNING || rk->stopped || !rk->split_ms)
        return 0;
    double fresh_ms = 3000.0 * rk->split_s;
    if (fresh_ms < 3000)
        fresh_ms = 3000;
    return (double)(now_ms - rk->split_ms) <= fresh_ms;
}

/* "rank 5 on node c is slow: computes 0.42 s per step where its peers compute
 * 0.3 s (1.4x), for the last 120 steps"; with shares, "computes 62% of its
 * time where its peers compute 41% (1.5x), for the last 12 s". Once it ends
 * (ended), "is no longer slow: ... (1x); it was slow for 120 steps". */
static void sentence(const struct rdv *r, uint32_t rank, const struct rdv_rank *rk, uint64_t now_ms, int ended,
                     char *out, size_t cap)
{
    const double ratio = rk->slow_peers > 0 ? rk->slow_x / rk->slow_peers : 0;
    const char *node = r->nodes[rk->node].name, *verb = ended ? "is no longer slow" : "is slow";
    const char *tail = ended ? "; it was slow for" : ", for the last";
    if (rk->slow_per_step)
        snprintf(out, cap, "rank %u on node %s %s: computes %.3g s per step where its peers compute %.3g s "
                 "(%.2gx)%s %llu steps", rank, node, verb, rk->slow_x, rk->slow_peers, ratio, tail,
                 (unsigned long long)(rk->step > rk->slow.since ? rk->step - rk->slow.since : 0));
    else
        snprintf(out, cap, "rank %u on node %s %s: computes %.0f%% of its time where its peers compute %.0f%% "
                 "(%.2gx)%s %.0f s", rank, node, verb, 100 * rk->slow_x, 100 * rk->slow_peers, ratio, tail,
                 (double)(now_ms > rk->slow.since ? now_ms - rk->slow.since : 0) / 1000.0);
}

/* A rank's figure: compute seconds per step, or its compute share. */
static double figure(const struct rdv_rank *rk, int per_step)
{
    const double share = rk->split[PROTO_SPLIT_COMPUTE];
    return per_step ? share * rk->split_s / (double)rk->split_steps : share;
}

void rdv__check_slow(struct rdv *r, uint64_t now_ms)
{
    if (r->state != RDV_RUNNING || !r->split_news || now_ms - r->slow_judged_ms < FAILSLOW_EVAL_MS ||
        !r->world_size)
        return;
    r->slow_judged_ms = now_ms;
    r->split_news = 0;
    uint32_t *idx = malloc(r->world_size * sizeof(*idx));
    double *x = calloc(r->world_size, sizeof(*x));
    uint8_t *out = malloc(r->world_size);
    uint32_t n = 0;
    int per_step = 1;
    if (!idx || !x || !out)
        goto done;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (judged(&r->ranks[i], now_ms)) {
            idx[n++] = i;
            per_step &= r->ranks[i].split_steps > 0;
        }
    for (uint32_t j = 0; j < n; j++)
        x[j] = figure(&r->ranks[idx[j]], per_step);
    double median, spread;
    if (failslow_outliers(x, n, out, &median, &spread) < 0)
        goto done;
    for (uint32_t j = 0; j < n; j++) {
        struct rdv_rank *rk = &r->ranks[idx[j]];
        if (rk->split_judged == rk->split_seq)
            continue; /* no new window since its last verdict */
        rk->split_judged = rk->split_seq;
        const double peers = n >= 2 ? failslow_peers(x, n, j) : 0;
        if (peers < 0)
            goto done;
        /* where this window began: its first step (or ms), for "for the last ..." */
        const uint64_t began = per_step ? (rk->step > rk->split_steps ? rk->step - rk->split_steps : 0)
                                        : now_ms - (uint64_t)(rk->split_s * 1000.0);
        if (per_step != rk->slow_per_step && rk->slow.slow)
            rk->slow.since = began; /* the figures changed kind: count from here */
        rk->slow_x = x[j];
        rk->slow_peers = peers;
        rk->slow_per_step = per_step;
        char what[PROTO_REASON_MAX];
        switch (failslow_note(&rk->slow, out[j], began)) {
        case FAILSLOW_STARTS:
            rk->slow_named_ms = now_ms;
            sentence(r, idx[j], rk, now_ms, 0, what, sizeof(what));
            rdv__event(r, "rank_slow", (int)rk->node, (int)idx[j], "%s", what);
            rdv__changed(r, 0);
            break;
        case FAILSLOW_ENDS:
            rk->slow_named_ms = 0;
            sentence(r, idx[j], rk, now_ms, 1, what, sizeof(what));
            rdv__event(r, "rank_slow_ended", (int)rk->node, (int)idx[j], "%s", what);
            rdv__changed(r, 0);
            break;
        case FAILSLOW_SAME:
            break;
        }
    }
done:
    free(idx);
    free(x);
    free(out);
}

json_t *rdv_slow_json(const struct rdv *r, uint64_t now_ms)
{
    json_t *arr = json_array();
    for (uint32_t i = 0; i < r->world_size && arr; i++) {
        const struct rdv_rank *rk = &r->ranks[i];
        if (!rk->slow.slow)
            continue;
        char what[PROTO_REASON_MAX];
        sentence(r, i, rk, now_ms, 0, what, sizeof(what));
        const uint64_t since = rk->slow.since;
        json_array_append_new(
            arr, json_pack("{s:i, s:s, s:f, s:f, s:f, s:b, s:I, s:s}", "rank", (int)i, "node", r->nodes[rk->node].name,
                           "compute", rk->slow_x, "peers", rk->slow_peers,
                           "ratio", rk->slow_peers > 0 ? rk->slow_x / rk->slow_peers : 0.0, "per_step",
                           rk->slow_per_step, rk->slow_per_step ? "steps" : "ms",
                           (json_int_t)(rk->slow_per_step ? (rk->step > since ? rk->step - since : 0)
                                                          : (now_ms > since ? now_ms - since : 0)),
                           "message", what));
    }
    return arr;
}
