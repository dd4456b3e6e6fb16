#include "common/namemap.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static uint32_t hash(const char *s)
{
    uint32_t h = 2166136261u;
    for (; *s; s++) {
        h ^= (uint8_t)*s;
        h *= 16777619u;
    }
    return h;
}

int namemap_init(struct namemap *m, uint32_t capacity)
{
    uint32_t size = 16;
    while (size < capacity * 2)
        size *= 2;
    m->slots = calloc(size, sizeof(*m->slots));
    if (!m->slots)
        return -ENOMEM;
    m->mask = size - 1;
    m->count = 0;
    m->capacity = capacity;
    return 0;
}

void namemap_free(struct namemap *m)
{
    free(m->slots);
    m->slots = NULL;
    m->count = 0;
}

void namemap_clear(struct namemap *m)
{
    memset(m->slots, 0, ((size_t)m->mask + 1) * sizeof(*m->slots));
    m->count = 0;
}

/* The slot holding name, or the empty slot where it would go. */
static uint32_t probe(const struct namemap *m, const char *name)
{
    uint32_t i = hash(name) & m->mask;
    while (m->slots[i].used && strcmp(m->slots[i].key, name) != 0)
        i = (i + 1) & m->mask;
    return i;
}

int namemap_put(struct namemap *m, const char *name, uintptr_t value)
{
    if (strlen(name) >= NAMEMAP_KEY_MAX)
        return -ENAMETOOLONG;
    uint32_t i = probe(m, name);
    if (!m->slots[i].used) {
        if (m->count >= m->capacity)
            return -ENOSPC;
        m->slots[i].used = 1;
        strcpy(m->slots[i].key, name);
        m->count++;
    }
    m->slots[i].value = value;
    return 0;
}

int namemap_get(const struct namemap *m, const char *name, uintptr_t *value)
{
    uint32_t i = probe(m, name);
    if (!m->slots[i].used)
        return -ENOENT;
    *value = m->slots[i].value;
    return 0;
}

int namemap_del(struct namemap *m, const char *name)
{
    uint32_t i = probe(m, name);
    if (!m->slots[i].used)
        return -ENOENT;
    /* Backward shift: move later entries of the cluster into the hole when
     * their home slot does not lie (cyclically) between the hole and them. */
    uint32_t hole = i, j = i;
    for (;;) {
        j = (j + 1) & m->mask;
        if (!m->slots[j].used)
            break;
        uint32_t home = hash(m->slots[j].key) & m->mask;
        int between = hole <= j ? (hole < home && home <= j) : (hole < home || home <= j);
        if (!between) {
            m->slots[hole] = m->slots[j];
            hole = j;
        }
    }
    m->slots[hole].used = 0;
    m->slots[hole].key[0] = '\0';
    m->count--;
    return 0;
}
