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

/* Whether domain d is the same as the domain of an earlier node. */
static int seen_before(const char *const *domains, size_t d)
{
    for (size_t j = 0; j < d; j++)
        if (strcmp(domains[j], domains[d]) == 0)
            return 1;
    return 0;
}

size_t memtags_buddy(const char *const *domains, size_t n, size_t i)
{
    if (n < 2 || i >= n)
        return n;
    if (!domains)
        return (i + 1) % n;
    size_t *dealt = malloc(n * sizeof(*dealt));
    unsigned char *taken = calloc(n, 1);
    if (!dealt || !taken) {
        free(dealt);
        free(taken);
        return (i + 1) % n; /* the plain rule rather than none */
    }
    size_t k = 0;
    while (k < n) /* one round: the next untaken node of each domain, domains in first-node order */
        for (size_t d = 0; d < n; d++) {
            if (seen_before(domains, d))
                continue;
            for (size_t j = 0; j < n; j++)
                if (!taken[j] && strcmp(domains[j], domains[d]) == 0) {
                    taken[j] = 1;
                    dealt[k++] = j;
                    break;
                }
        }
    size_t buddy = n;
    for (k = 0; k < n; k++)
        if (dealt[k] == i)
            buddy = dealt[(k + 1) % n];
    free(dealt);
    free(taken);
    return buddy;
}
