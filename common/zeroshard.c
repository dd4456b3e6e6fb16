#include "common/zeroshard.h"

#include <string.h>

void zero_shards_init(struct zero_shards *s, const struct gpt_layout *lay, int world, size_t align)
{
    memset(s, 0, sizeof(*s));
    const size_t W = (size_t)world, C = lay->row;
    s->world = world;
    s->nunits = lay->nunits;
    s->rows = (lay->numel[0] / C + W - 1) / W;
    for (int u = 0; u < lay->nunits; u++) {
        size_t S = (lay->numel[u] + W - 1) / W;
        s->shard[u] = align == 1 && u == 0 ? s->rows * C : (S + align - 1) / align * align;
        s->off[u] = s->total;
        s->total += s->shard[u];
        if (u > 0 && s->shard[u] > s->max_shard)
            s->max_shard = s->shard[u];
    }
    /* a chunk of the embedding fits where a block fits, and holds a row at least */
    const size_t k = s->max_shard / C;
    s->chunk_rows = k < 1 ? 1 : k < s->rows ? k : s->rows;
    s->chunks = (int)((s->rows + s->chunk_rows - 1) / s->chunk_rows);
    if (world > 1)
        s->slot = W * (s->max_shard > s->chunk_rows * C ? s->max_shard : s->chunk_rows * C);
}

size_t zero_shards_state_bytes(const struct zero_shards *s) { return 4 * sizeof(float) * s->total; }

size_t zero_shards_transient_bytes(const struct zero_shards *s)
{
    return ZERO_SLOTS * sizeof(float) * s->slot;
}
