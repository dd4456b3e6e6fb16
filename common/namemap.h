/*
 * namemap: node names to small values in O(1): open addressing with linear
 * probing over a power-of-two table sized at twice the capacity, FNV-1a
 * hash, backward-shift deletion (no tombstones, so a table that sees many
 * joins and losses never degrades). Names are copied in; they are at most
 * NAMEMAP_KEY_MAX - 1 bytes (node names: PROTO_NAME_MAX).
 *
 * Used by rdv (node name -> index into its node table) and by the control
 * server (node name -> joined connection), so that a frame costs no scan
 * of every node.
 */
#ifndef MUSTER_NAMEMAP_H
#define MUSTER_NAMEMAP_H

#include <stdint.h>

#define NAMEMAP_KEY_MAX 64

struct namemap_slot {
    uintptr_t value;
    int used;
    char key[NAMEMAP_KEY_MAX];
};

struct namemap {
    struct namemap_slot *slots;
    uint32_t mask;     /* table size - 1 */
    uint32_t count;
    uint32_t capacity; /* most entries accepted */
};

/* Room for capacity entries. Returns 0 or -ENOMEM. */
int namemap_init(struct namemap *m, uint32_t capacity);
void namemap_free(struct namemap *m);
void namemap_clear(struct namemap *m);

/* Inserts or replaces. Returns 0, -ENOSPC (full) or -ENAMETOOLONG. */
int namemap_put(struct namemap *m, const char *name, uintptr_t value);
/* 0 with *value set, or -ENOENT. */
int namemap_get(const struct namemap *m, const char *name, uintptr_t *value);
/* 0, or -ENOENT when the name was not there. */
int namemap_del(struct namemap *m, const char *name);

#endif
