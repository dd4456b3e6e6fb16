/*
 * gptlayout: where the GPT model's parameters live, as units of flat floats
 * (the granule ZeRO-3 shards, gathers and releases; worker/train/model.h
 * draws the picture). Pure arithmetic on struct gpt_config, shared by
 * muster-train, which allocates by it, and by the planner (common/plan.h),
 * which predicts what muster-train will allocate from the same functions.
 */
#ifndef MUSTER_GPTLAYOUT_H
#define MUSTER_GPTLAYOUT_H

#include <stddef.h>

#include "common/gptcfg.h"

#define GPT_MAX_UNITS (GPT_MAX_LAYERS + 2)
#define GPT_MAX_UNIT_TENSORS 12

struct gpt_tensor {
    const char *name;
    size_t offset; /* floats from the start of the unit */
    size_t numel;
    int decay;     /* 1 = weight decay applies (matrices); 0 = biases, gains */
};

enum gpt_unit_kind { GPT_UNIT_EMBED, GPT_UNIT_BLOCK, GPT_UNIT_NORM };

struct gpt_layout {
    int nunits;                   /* L + 2 */
    size_t offset[GPT_MAX_UNITS]; /* floats from the start of the flat buffer */
    size_t numel[GPT_MAX_UNITS];
    size_t total;
    size_t row;                   /* C: the embedding (unit 0) is V + T rows of this many floats */
};

void gpt_layout_init(struct gpt_layout *lay, const struct gpt_config *cfg);
enum gpt_unit_kind gpt_unit_kind(const struct gpt_config *cfg, int unit);
/* "embed", "block", "norm". */
const char *gpt_unit_kind_name(enum gpt_unit_kind k);
/* Writes the unit's tensors into out (GPT_MAX_UNIT_TENSORS); returns how many. */
int gpt_unit_tensors(const struct gpt_config *cfg, int unit, struct gpt_tensor *out);

#endif
