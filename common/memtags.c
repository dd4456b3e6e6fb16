#include "common/memtags.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int memtags_cmp(const char *a, const char *b)
{
    return strverscmp(a, b);
}

static int holds(const char *list, uint32_t count, size_t stride, const char *name)
{
    for (uint32_t i = 0; i < count; i++)
        if (strcmp(list + (size_t)i * stride, name) == 0)
            return 1;
    return 0;
}

int memtags_common(const char *const *lists, const uint32_t *counts, size_t n, size_t stride, char *out,
                   size_t cap)
{
    out[0] = '\0';
    if (n == 0)
        return 0;
    int found = 0;
    for (uint32_t i = 0; i < counts[0]; i++) {
        const char *name = lists[0] + (size_t)i * stride;
        if (found && memtags_cmp(name, out) <= 0)
            continue;
        size_t j = 1;
        while (j < n && holds(lists[j], counts[j], stride, name))
            j++;
        if (j == n && strlen(name) < cap) {
            snprintf(out, cap, "%s", name);
            found = 1;
        }
    }
    return found;
}

uint64_t memtags_step(const char *name)
{
    size_t n = strlen(name), d = n;
    while (d > 0 && name[d - 1] >= '0' && name[d - 1] <= '9' && n - d < 19)
        d--;
    uint64_t v = 0;
    for (size_t i = d; i < n; i++)
        v = v * 10 + (uint64_t)(name[i] - '0');
    return v;
}

/* Node indices ordered by domain, each domain's nodes in index order; a
 * NULL domain is a node's alone (after the named ones, by index). */
static int by_domain(const void *x, const void *y, void *arg)
{
    const char *const *domains = arg;
    size_t i = *(const size_t *)x, j = *(const size_t *)y;
    const char *a = domains[i], *b = domains[j];
    int c = 0;
    if (a && b)
        c = strcmp(a, b);
    else if (a || b)
        c = a ? -1 : 1;
    return c ? c : (i > j) - (i < j);
}

static int same_domain(const char *const *domains, size_t i, size_t j)
{
    return domains[i] && domains[j] && strcmp(domains[i], domains[j]) == 0;
}

/* Domains, as runs of by_domain's order, ordered by their first (lowest) node. */
struct run {
    size_t at, size; /* its nodes: order[at .. at+size) */
};

static int by_first(const void *x, const void *y, void *arg)
{
    const size_t *order = arg;
    size_t a = order[((const struct run *)x)->at], b = order[((const struct run *)y)->at];
    return (a > b) - (a < b);
}

/*
 * The deal, without dealing: node i is the r-th of its domain, so it is
 * dealt in round r; the next node dealt is the r-th of the next domain (in
 * first-node order) that has more than r nodes, else the (r+1)-th of the
 * first domain with more than r+1, else the deal starts over at node 0.
 * O(n log n), for musterd asks for every piece it relays.
 */
size_t memtags_buddy(const char *const *domains, size_t n, size_t i)
{
    if (n < 2 || i >= n)
        return n;
    if (!domains)
        return (i + 1) % n;
    size_t *order = malloc(n * sizeof(*order));
    struct run *runs = malloc(n * sizeof(*runs));
    if (!order || !runs) {
        free(order);
        free(runs);
        return (i + 1) % n; /* the plain rule rather than none */
    }
    for (size_t k = 0; k < n; k++)
        order[k] = k;
    qsort_r(order, n, sizeof(*order), by_domain, (void *)domains);
    size_t nruns = 0;
    for (size_t k = 0; k < n; k++)
        if (k > 0 && same_domain(domains, order[k - 1], order[k]))
            runs[nruns - 1].size++;
        else
            runs[nruns++] = (struct run){.at = k, .size = 1};
    qsort_r(runs, nruns, sizeof(*runs), by_first, order);
    size_t d = 0, r = 0;
    for (size_t k = 0; k < nruns; k++)
        for (size_t m = 0; m < runs[k].size; m++)
            if (order[runs[k].at + m] == i) {
                d = k;
                r = m;
            }
    size_t buddy = 0; /* the deal starts over */
    size_t k = d + 1;
    while (k < nruns && runs[k].size <= r)
        k++;
    if (k < nruns) {
        buddy = order[runs[k].at + r];
    } else { /* round r is over: round r+1 */
        for (k = 0; k < nruns && runs[k].size <= r + 1; k++)
            ;
        if (k < nruns)
            buddy = order[runs[k].at + r + 1];
    }
    free(order);
    free(runs);
    return buddy;
}
