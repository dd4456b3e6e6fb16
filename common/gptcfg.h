/*
 * gptcfg: the shape of the GPT model a job trains, from its spec: a preset
 * (tiny, small, gpt2-124m) and the dimension keys that override it
 * (n_layer, n_head, n_embd, context, vocab; 0 = the preset's). Shared by
 * musterd and muster-worker, which refuse a job whose model cannot be built
 * before any rank starts, and by muster-train, which builds it.
 */
#ifndef MUSTER_GPTCFG_H
#define MUSTER_GPTCFG_H

#include <stddef.h>

#define GPT_MAX_LAYERS 64
#define GPT_MAX_CONTEXT 65536
#define GPT_MAX_VOCAB 65536 /* token files hold uint16 tokens */

struct gpt_config {
    int L;  /* blocks */
    int NH; /* heads */
    int C;  /* channels */
    int T;  /* maximum sequence length (positions in wpe) */
    int V;  /* vocabulary */
};

/* Fills *cfg for "tiny", "small" or "gpt2-124m"; -ENOENT otherwise. */
int gpt_preset(const char *name, struct gpt_config *cfg);
/* "tiny, small, gpt2-124m", for messages. */
const char *gpt_preset_list(void);

/* 0, or -EINVAL with the reason in err, naming the job key (n_embd, ...). */
int gpt_config_check(const struct gpt_config *cfg, char *err, size_t errlen);

/*
 * The preset with the given overrides (0 = keep the preset's), checked.
 * Returns 0, or -EINVAL with "model: ..." or the offending key in err.
 */
int gpt_config_resolve(const char *preset, int n_layer, int n_head, int n_embd, int context, int vocab,
                       struct gpt_config *cfg, char *err, size_t errlen);

/* Parameters of the model (tied embedding counted once). */
size_t gpt_param_count(const struct gpt_config *cfg);

#endif
