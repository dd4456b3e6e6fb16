/*
 * zeroshard: how ZeRO-3 cuts the model's units over N ranks, and what that
 * costs each rank in memory. The one place this arithmetic lives: the CPU
 * trainer (worker/train/zero.c) allocates by it and the planner
 * (common/plan.h) predicts from it, so the two cannot drift apart.
 *
 * Unit u of P_u floats is cut into N shards of S_u = ceil(P_u / N) floats,
 * rounded up to a multiple of `align` floats (1 for the CPU trainer); rank r
 * owns floats [r*S_u, (r+1)*S_u) of the unit, zero past P_u.
 */
#ifndef MUSTER_ZEROSHARD_H
#define MUSTER_ZEROSHARD_H

#include <stddef.h>

#include "common/gptlayout.h"

struct zero_shards {
    int world;
    int nunits;
    size_t shard[GPT_MAX_UNITS]; /* S_u, floats */
    size_t off[GPT_MAX_UNITS];   /* where unit u's shard starts in a rank's shard buffers */
    size_t total;                /* sum of S_u */
    size_t max_shard;            /* largest S_u of the block and norm units (u >= 1) */
};

/* Shards of lay over world ranks, each S_u a multiple of align floats (>= 1). */
void zero_shards_init(struct zero_shards *s, const struct gpt_layout *lay, int world, size_t align);

/*
 * Model state of one rank of the CPU trainer, bytes: fp32 weights, the two
 * AdamW moments and the gradient shard, 4 x 4 bytes x total. (Every unit is
 * sharded, the tied embedding included: were one unit kept whole on every
 * rank, this is the one function to change.)
 */
size_t zero_shards_state_bytes(const struct zero_shards *s);

/*
 * Transient buffers of one rank of the CPU trainer (0 at world 1), bytes:
 * the gathered embedding and its full gradient (N x S_0 floats each, held
 * from the forward through the backward for the tied head) and two slots
 * each for gathered blocks and their full gradients (N x max_shard floats
 * each): 4 x N x (2 S_0 + 4 max_shard).
 */
size_t zero_shards_transient_bytes(const struct zero_shards *s);

#endif
