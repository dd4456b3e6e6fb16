#include "common/gptlayout.h"

#include <string.h>

enum gpt_unit_kind gpt_unit_kind(const struct gpt_config *cfg, int unit)
{
    if (unit == 0)
        return GPT_UNIT_EMBED;
    return unit <= cfg->L ? GPT_UNIT_BLOCK : GPT_UNIT_NORM;
}

const char *gpt_unit_kind_name(enum gpt_unit_kind k)
{
    switch (k) {
    case GPT_UNIT_EMBED: return "embed";
    case GPT_UNIT_BLOCK: return "block";
    case GPT_UNIT_NORM: return "norm";
    }
    return "?";
}

int gpt_unit_tensors(const struct gpt_config *cfg, int unit, struct gpt_tensor *out)
{
    const size_t C = (size_t)cfg->C;
    struct {
        const char *name;
        size_t numel;
        int decay;
    } embed[] = {{"wte", (size_t)cfg->V * C, 1}, {"wpe", (size_t)cfg->T * C, 1}},
      block[] = {{"ln1w", C, 0},          {"ln1b", C, 0},      {"qkvw", 3 * C * C, 1},
                 {"qkvb", 3 * C, 0},      {"attprojw", C * C, 1}, {"attprojb", C, 0},
                 {"ln2w", C, 0},          {"ln2b", C, 0},      {"fcw", 4 * C * C, 1},
                 {"fcb", 4 * C, 0},       {"fcprojw", 4 * C * C, 1}, {"fcprojb", C, 0}},
      norm[] = {{"lnfw", C, 0}, {"lnfb", C, 0}};
    int n;
    size_t off = 0;
    switch (gpt_unit_kind(cfg, unit)) {
    case GPT_UNIT_EMBED:
        n = 2;
        for (int i = 0; i < n; i++)
            out[i] = (struct gpt_tensor){embed[i].name, 0, embed[i].numel, embed[i].decay};
        break;
    case GPT_UNIT_BLOCK:
        n = 12;
        for (int i = 0; i < n; i++)
            out[i] = (struct gpt_tensor){block[i].name, 0, block[i].numel, block[i].decay};
        break;
    default:
        n = 2;
        for (int i = 0; i < n; i++)
            out[i] = (struct gpt_tensor){norm[i].name, 0, norm[i].numel, norm[i].decay};
        break;
    }
    for (int i = 0; i < n; i++) {
        out[i].offset = off;
        off += out[i].numel;
    }
    return n;
}

void gpt_layout_init(struct gpt_layout *lay, const struct gpt_config *cfg)
{
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    memset(lay, 0, sizeof(*lay));
    lay->nunits = cfg->L + 2;
    lay->row = (size_t)cfg->C;
    for (int u = 0; u < lay->nunits; u++) {
        int n = gpt_unit_tensors(cfg, u, t);
        lay->offset[u] = lay->total;
        lay->numel[u] = t[n - 1].offset + t[n - 1].numel;
        lay->total += lay->numel[u];
    }
}
