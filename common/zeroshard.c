#include "common/zeroshard.h"

#include <string.h>

void zero_shards_init(struct zero_shards *s, const struct gpt_layout *lay, int world, size_t align)
{
    memset(s, 0, sizeof(*s));
    s->world = world;
    s->nunits = lay->nunits;
    for (int u = 0; u < lay->nunits; u++) {
        size_t S = (lay->numel[u] + (size_t)world - 1) / (size_t)world;
        s->shard[u] = (S + align - 1) / align * align;
        s->off[u] = s->total;
        s->total += s->shard[u];
        if (u > 0 && s->shard[u] > s->max_shard)
            s->max_shard = s->shard[u];
    }
}

size_t zero_shards_state_bytes(const struct zero_shards *s) { return 4 * sizeof(float) * s->total; }

size_t zero_shards_transient_bytes(const struct zero_shards *s)
{
    if (s->world == 1)
        return 0;
    return sizeof(float) * (size_t)s->world * (2 * s->shard[0] + 4 * s->max_shard);
}
