#include "common/gptcfg.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

/* A preset is a named set of dimensions. */
static const struct {
    const char *name;
    struct gpt_config cfg;
} presets[] = {
    {"tiny", {.L = 2, .NH = 2, .C = 16, .T = 32, .V = 256}},
    {"small", {.L = 4, .NH = 4, .C = 128, .T = 128, .V = 256}},
    {"gpt2-124m", {.L = 12, .NH = 12, .C = 768, .T = 1024, .V = 50257}},
};

int gpt_preset(const char *name, struct gpt_config *cfg)
{
    for (size_t i = 0; i < sizeof(presets) / sizeof(presets[0]); i++)
        if (strcmp(presets[i].name, name) == 0) {
            *cfg = presets[i].cfg;
            return 0;
        }
    return -ENOENT;
}

const char *gpt_preset_list(void) { return "tiny, small, gpt2-124m"; }

int gpt_config_check(const struct gpt_config *c, char *err, size_t errlen)
{
    if (c->L < 1 || c->L > GPT_MAX_LAYERS)
        snprintf(err, errlen, "n_layer: expected 1 to %d, got %d", GPT_MAX_LAYERS, c->L);
    else if (c->NH < 1 || c->C < 1 || c->C % c->NH)
        snprintf(err, errlen, "n_embd (%d) must be a positive multiple of n_head (%d): the head dimension "
                 "is n_embd / n_head", c->C, c->NH);
    else if (c->T < 1 || c->T > GPT_MAX_CONTEXT)
        snprintf(err, errlen, "context: expected 1 to %d, got %d", GPT_MAX_CONTEXT, c->T);
    else if (c->V < 2 || c->V > GPT_MAX_VOCAB)
        snprintf(err, errlen, "vocab: expected 2 to %d, got %d", GPT_MAX_VOCAB, c->V);
    else
        return 0;
    return -EINVAL;
}

int gpt_config_resolve(const char *preset, int n_layer, int n_head, int n_embd, int context, int vocab,
                       struct gpt_config *cfg, char *err, size_t errlen)
{
    if (gpt_preset(preset, cfg)) {
        snprintf(err, errlen, "model: unknown preset \"%s\" (expected one of %s)", preset, gpt_preset_list());
        return -EINVAL;
    }
    if (n_layer)
        cfg->L = n_layer;
    if (n_head)
        cfg->NH = n_head;
    if (n_embd)
        cfg->C = n_embd;
    if (context)
        cfg->T = context;
    if (vocab)
        cfg->V = vocab;
    return gpt_config_check(cfg, err, errlen);
}

size_t gpt_param_count(const struct gpt_config *c)
{
    size_t C = (size_t)c->C;
    size_t block = 2 * C + 3 * C * C + 3 * C + C * C + C + 2 * C + 4 * C * C + 4 * C + 4 * C * C + C;
    return (size_t)c->V * C + (size_t)c->T * C + (size_t)c->L * block + 2 * C;
}
