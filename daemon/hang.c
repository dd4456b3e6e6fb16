/* daemon/hang.c: the progress timeout that fits the job, and rank lists as ranges (see hang.h). */
#include "daemon/hang.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

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
