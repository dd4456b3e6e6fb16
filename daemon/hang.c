/* daemon/hang.c: the progress timeout that fits the job, and naming a hung rank (see hang.h). */
#include "daemon/hang.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "daemon/rdv.h"

void hang_steps_new_generation(struct hang_steps *h)
{
    h->seen = 0;
    h->top_step = 0;
    h->first_longest_s = 0;
}

/* The first index of a[0..n) (ascending) whose value is not below x. */
static uint32_t lower_bound(const double *a, uint32_t n, double x)
{
    uint32_t lo = 0, hi = n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (a[mid] < x)
            lo = mid + 1;
        else
            hi = mid;
    }
    return lo;
}

void hang_steps_note(struct hang_steps *h, uint64_t prev, uint64_t step, double step_s)
{
    const uint64_t from = prev > h->top_step ? prev : h->top_step;
    if (step > from) { /* a beat may bring many steps: each counts, from where the generation was first seen */
        uint64_t ran = step - from;
        h->seen = ran > UINT32_MAX - h->seen ? UINT32_MAX : h->seen + (uint32_t)ran;
        h->top_step = step;
    }
    if (!(step_s > 0) || !isfinite(step_s))
        return;
    if (h->seen <= HANG_JUDGE_STEPS) { /* a first step: loading, compiling */
        if (step_s > h->first_longest_s)
            h->first_longest_s = step_s;
        return;
    }
    uint32_t n = h->nrecent;
    if (n == HANG_SAMPLES) { /* the oldest time leaves the sorted copy */
        uint32_t at = lower_bound(h->sorted, n, h->recent[h->next]);
        memmove(&h->sorted[at], &h->sorted[at + 1], (n - at - 1) * sizeof(double));
        n--;
    }
    uint32_t at = lower_bound(h->sorted, n, step_s);
    memmove(&h->sorted[at + 1], &h->sorted[at], (n - at) * sizeof(double));
    h->sorted[at] = step_s;
    h->recent[h->next] = step_s;
    h->next = (h->next + 1) % HANG_SAMPLES;
    h->nrecent = n + 1;
    if (step_s > h->longest_s)
        h->longest_s = step_s;
}

double hang_median_step_s(const struct hang_steps *h)
{
    const double *s = h->sorted;
    const uint32_t n = h->nrecent;
    if (n == 0)
        return 0;
    return n % 2 ? s[n / 2] : (s[n / 2 - 1] + s[n / 2]) / 2;
}

static uint64_t ms_of(double s) { return s >= 1e12 ? UINT64_C(1000000000000000) : (uint64_t)ceil(s * 1000.0); }

uint64_t hang_timeout_ms(const struct hang_steps *h, int spec_ms)
{
    if (spec_ms >= 0)
        return (uint64_t)spec_ms;
    uint64_t t;
    if (h->seen <= HANG_JUDGE_STEPS || h->nrecent == 0) {
        t = HANG_START_MS;
        if (ms_of(HANG_LONGEST_TIMES * h->first_longest_s) > t)
            t = ms_of(HANG_LONGEST_TIMES * h->first_longest_s);
        return t;
    }
    t = HANG_FLOOR_MS;
    if (ms_of(HANG_MEDIAN_TIMES * hang_median_step_s(h)) > t)
        t = ms_of(HANG_MEDIAN_TIMES * hang_median_step_s(h));
    if (ms_of(HANG_LONGEST_TIMES * h->longest_s) > t)
        t = ms_of(HANG_LONGEST_TIMES * h->longest_s);
    return t;
}

/* Appends to out[0..cap) at *len, keeping it terminated; 0 once it no longer fits. */
static int append(char *out, size_t cap, size_t *len, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static int append(char *out, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len) {
        out[*len] = '\0';
        return 0;
    }
    *len += (size_t)n;
    return 1;
}

size_t hang_ranges(char *out, size_t cap, const uint32_t *ranks, uint32_t n)
{
    size_t len = 0;
    if (cap == 0)
        return 0;
    out[0] = '\0';
    if (!append(out, cap, &len, "%s ", n == 1 ? "rank" : "ranks"))
        return len;
    for (uint32_t i = 0; i < n;) {
        uint32_t j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1)
            j++;
        size_t before = len;
        int ok = j == i ? append(out, cap, &len, "%s%u", i ? ", " : "", ranks[i])
                        : append(out, cap, &len, "%s%u-%u", i ? ", " : "", ranks[i], ranks[j]);
        if (!ok || len + 6 > cap) { /* room for ", ..." */
            len = before;
            out[len] = '\0';
            append(out, cap, &len, ", ...");
            return len;
        }
        i = j + 1;
    }
    return len;
}

uint64_t hang_stopped_due(const struct rdv *r, uint32_t i)
{
    const struct rdv_rank *rk = &r->ranks[i];
    if (rk->state != RDV_RANK_RUNNING || !rk->stopped)
        return 0;
    uint64_t since = rk->stopped_since_ms;
    int peers = 0;
    for (uint32_t j = 0; j < r->world_size; j++) {
        const struct rdv_rank *p = &r->ranks[j];
        if (j == i || p->state != RDV_RANK_RUNNING || p->silent || p->stopped)
            continue;
        if (p->progress_ms > since) /* it stepped since: it has waited only from then on */
            since = p->progress_ms;
        peers++;
    }
    return peers ? since + HANG_STOPPED_MS : 0;
}

int hang_blame_peer(const struct rdv *r, uint32_t exited, uint64_t now_ms, const char **why)
{
    for (uint32_t j = 0; j < r->world_size; j++)
        if (j != exited && r->ranks[j].state == RDV_RANK_RUNNING && r->ranks[j].stopped) {
            *why = "whose process is stopped (SIGSTOP or a debugger)";
            return (int)j;
        }
    for (uint32_t j = 0; j < r->world_size; j++)
        if (j != exited && hang_rank_quiet(r, j, now_ms)) {
            *why = "from which no heartbeat came while its node answers";
            return (int)j;
        }
    return -1;
}

int hang_rank_quiet(const struct rdv *r, uint32_t i, uint64_t now_ms)
{
    const uint64_t quiet = 3 * (uint64_t)r->spec->heartbeat_interval_ms;
    const struct rdv_rank *rk = &r->ranks[i];
    return rk->state == RDV_RANK_RUNNING && !rk->silent && rk->last_beat_ms && now_ms - rk->last_beat_ms > quiet &&
           now_ms - r->nodes[rk->node].last_seen_ms <= quiet;
}

/* The running ranks inside a collective, and the call the lowest of them is in. */
static uint32_t waiting_ranks(const struct rdv *r, uint32_t *out, const char **call)
{
    uint32_t n = 0;
    *call = NULL;
    for (uint32_t i = 0; i < r->world_size; i++) {
        const struct rdv_rank *rk = &r->ranks[i];
        if (rk->state != RDV_RANK_RUNNING || !rk->waiting[0] || rk->stopped)
            continue;
        if (!*call)
            *call = rk->waiting;
        out[n++] = i;
    }
    return n;
}

/* "; ranks 0-2 wait in all_reduce (distributed_c10d.py)" when some do. */
static void waiting_tail(const struct rdv *r, char *out, size_t cap, uint32_t *scratch)
{
    const char *call;
    uint32_t n = waiting_ranks(r, scratch, &call);
    out[0] = '\0';
    if (n == 0)
        return;
    char ranks[160];
    hang_ranges(ranks, sizeof(ranks), scratch, n);
    snprintf(out, cap, "; %s %s in %s", ranks, n == 1 ? "waits" : "wait", call);
}

/* " at train.py:88 in compute_loss" when the rank said where it is. */
static void at(const struct rdv_rank *rk, char *out, size_t cap)
{
    if (rk->where[0])
        snprintf(out, cap, " at %s", rk->where);
    else
        out[0] = '\0';
}

void hang_describe(const struct rdv *r, uint32_t stuck, uint64_t now_ms, uint64_t limit_ms, uint32_t *culprit,
                   char *what, size_t cap)
{
    uint32_t *scratch = malloc((size_t)r->world_size * sizeof(uint32_t));
    uint32_t *others = malloc((size_t)r->world_size * sizeof(uint32_t));
    const struct rdv_rank *st = &r->ranks[stuck];
    char tail[320], where[PROTO_WHERE_MAX + 8], timing[96];
    snprintf(timing, sizeof(timing), "every rank stuck at step %llu for %.1f s (progress timeout %.1f s)",
             (unsigned long long)st->step, (double)(now_ms - st->progress_ms) / 1000.0, (double)limit_ms / 1000.0);
    if (!scratch || !others) { /* out of memory: the plain wording, no lists */
        *culprit = stuck;
        snprintf(what, cap, "rank %u on node %s is hung: %s", stuck, r->nodes[st->node].name, timing);
        free(scratch);
        free(others);
        return;
    }
    waiting_tail(r, tail, sizeof(tail), scratch);

    /* (a) a process seen stopped */
    uint32_t nstopped = 0;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (r->ranks[i].state == RDV_RANK_RUNNING && r->ranks[i].stopped)
            others[nstopped++] = i;
    if (nstopped) {
        const struct rdv_rank *q = &r->ranks[others[0]];
        *culprit = others[0];
        at(q, where, sizeof(where));
        /* found by the stopped rule or the progress timeout: both facts hold */
        snprintf(timing, sizeof(timing), "seen stopped for %.1f s, every rank stuck at step %llu for %.1f s",
                 (double)(now_ms - q->stopped_since_ms) / 1000.0, (unsigned long long)st->step,
                 (double)(now_ms - st->progress_ms) / 1000.0);
        if (nstopped == 1) {
            snprintf(what, cap, "rank %u on node %s is hung: its process is stopped (SIGSTOP or a debugger)%s%s; %s",
                     others[0], r->nodes[q->node].name, where, tail, timing);
        } else {
            char ranks[160];
            hang_ranges(ranks, sizeof(ranks), others, nstopped);
            snprintf(what, cap, "%s are hung: their processes are stopped (SIGSTOP or a debugger; rank %u on node "
                     "%s%s)%s; %s", ranks, others[0], r->nodes[q->node].name, where, tail, timing);
        }
        goto done;
    }
    /* (b) quiet: its agent stopped hearing from it while the node beats */
    uint32_t quietest = r->world_size;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (hang_rank_quiet(r, i, now_ms) &&
            (quietest == r->world_size || r->ranks[i].last_beat_ms < r->ranks[quietest].last_beat_ms))
            quietest = i;
    if (quietest < r->world_size) {
        const struct rdv_rank *q = &r->ranks[quietest];
        *culprit = quietest;
        at(q, where, sizeof(where));
        snprintf(what, cap, "rank %u on node %s is hung: no heartbeat from it for %.1f s while its node answers%s, "
                 "and %s%s", quietest, r->nodes[q->node].name, (double)(now_ms - q->last_beat_ms) / 1000.0, where,
                 timing, tail);
        goto done;
    }
    /* (c) outside any collective while others wait in one */
    const char *call;
    uint32_t nwait = waiting_ranks(r, scratch, &call), nout = 0;
    if (nwait) {
        for (uint32_t i = 0; i < r->world_size; i++)
            if (r->ranks[i].state == RDV_RANK_RUNNING && !r->ranks[i].silent && !r->ranks[i].waiting[0])
                others[nout++] = i;
    }
    if (nwait && nout) {
        const struct rdv_rank *q = &r->ranks[others[0]];
        *culprit = others[0];
        char waiters[160];
        hang_ranges(waiters, sizeof(waiters), scratch, nwait);
        if (q->where[0])
            snprintf(where, sizeof(where), "at %s", q->where);
        else
            snprintf(where, sizeof(where), "where is not known");
        if (nout == 1) {
            snprintf(what, cap, "rank %u on node %s is hung: it is not in a collective (%s) while %s %s in %s; %s",
                     others[0], r->nodes[q->node].name, where, waiters, nwait == 1 ? "waits" : "wait", call, timing);
        } else {
            char ranks[160];
            hang_ranges(ranks, sizeof(ranks), others, nout);
            snprintf(what, cap, "%s are hung: not in a collective (rank %u on node %s %s) while %s %s in %s; %s",
                     ranks, others[0], r->nodes[q->node].name, where, waiters, nwait == 1 ? "waits" : "wait", call,
                     timing);
        }
        goto done;
    }
    /* (d) the rank found stuck */
    *culprit = stuck;
    at(st, where, sizeof(where));
    snprintf(what, cap, "rank %u on node %s is hung: stuck at step %llu for %.1f s (progress timeout %.1f s)%s%s",
             stuck, r->nodes[st->node].name, (unsigned long long)st->step,
             (double)(now_ms - st->progress_ms) / 1000.0, (double)limit_ms / 1000.0, st->waiting[0] ? "" : where,
             tail);
done:
    free(scratch);
    free(others);
}
