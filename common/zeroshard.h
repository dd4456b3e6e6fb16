/*
 * zeroshard: how ZeRO-3 cuts the model's units over N ranks, and what that
 * costs each rank in memory. The one place this arithmetic lives: the CPU
 * trainer (worker/train/zero.c) allocates by it and the planner
 * (common/plan.h) predicts from it, so the two cannot drift apart.
 *
 * Unit u of P_u floats is cut into N shards of S_u = ceil(P_u / N) floats,
 * rounded up to a multiple of `align` floats; rank r owns floats [r*S_u,
 * (r+1)*S_u) of the unit, zero past P_u. The CPU trainer (align 1) cuts the
 * embedding (unit 0, V + T rows of C floats) at whole rows instead:
 * R = ceil((V + T) / N) rows, S_0 = R * C, and gathers it a chunk of rows at
 * a time (worker/train/zero.h).
 */
#ifndef MUSTER_ZEROSHARD_H
#define MUSTER_ZEROSHARD_H

#include <stddef.h>

#include "common/gptlayout.h"

/* The CPU trainer's slots for gathered units, embedding chunks and full gradients. */
#define ZERO_SLOTS 3

struct zero_shards {
    int world;
    int nunits;
    size_t shard[GPT_MAX_UNITS]; /* S_u, floats */
    size_t off[GPT_MAX_UNITS];   /* where unit u's shard starts in a rank's shard buffers */
    size_t total;                /* sum of S_u */
    size_t max_shard;            /* largest S_u of the block and norm units (u >= 1) */
    /* the CPU trainer (align 1) */
    size_t rows;                 /* R: embedding rows per rank (S_0 = R * C) */
    size_t chunk_rows;           /* k: of them, gathered at a time (N * k * C fits a slot) */
    int chunks;                  /* ceil(R / k) */
    size_t slot;                 /* floats per slot: N * max_shard (0 at world 1) */
};

/* Shards of lay over world ranks, each S_u a multiple of align floats (>= 1);
 * align 1 is the CPU trainer's cut (whole embedding rows). */
void zero_shards_init(struct zero_shards *s, const struct gpt_layout *lay, int world, size_t align);

/*
 * Model state of one rank of the CPU trainer, bytes: fp32 weights, the two
 * AdamW moments and the gradient shard, 4 x 4 bytes x total. Every unit is
 * sharded, the tied embedding included.
 */
size_t zero_shards_state_bytes(const struct zero_shards *s);

/*
 * Transient buffers of one rank of the CPU trainer (0 at world 1), bytes:
 * ZERO_SLOTS slots of N x max_shard floats, through which every gathered
 * unit, embedding chunk and full gradient passes; the embedding is never
 * whole: 4 x 3 x N x max_shard.
 */
size_t zero_shards_transient_bytes(const struct zero_shards *s);

#endif
