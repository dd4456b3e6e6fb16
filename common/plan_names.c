/* common/plan_names.c: the parallelism and precision names (see plan_names.h). */
#include "common/plan_names.h"

#include <errno.h>
#include <stddef.h>
#include <string.h>

static const struct {
    const char *name;
    int stage;
} pars[] = {
    [PLAN_PAR_DDP] = {"ddp", 0},   [PLAN_PAR_ZERO1] = {"zero1", 1}, [PLAN_PAR_ZERO2] = {"zero2", 2},
    [PLAN_PAR_ZERO3] = {"zero3", 3}, [PLAN_PAR_FSDP] = {"fsdp", 3},   [PLAN_PAR_FSDP_GRAD_OP] = {"fsdp-grad-op", 2},
};
#define NPARS (sizeof(pars) / sizeof(pars[0]))

static const char *const precs[] = {[PLAN_FP32] = "fp32", [PLAN_BF16] = "bf16", [PLAN_FP16] = "fp16"};

int plan_par_parse(const char *name, enum plan_par *par)
{
    for (size_t i = 0; i < NPARS; i++)
        if (strcmp(name, pars[i].name) == 0) {
            *par = (enum plan_par)i;
            return 0;
        }
    return -EINVAL;
}

const char *plan_par_name(enum plan_par par) { return (size_t)par < NPARS ? pars[par].name : "?"; }
int plan_par_stage(enum plan_par par) { return (size_t)par < NPARS ? pars[par].stage : 0; }
const char *plan_par_list(void) { return "ddp, zero1, zero2, zero3, fsdp (= zero3), fsdp-grad-op (= zero2)"; }

int plan_prec_parse(const char *name, enum plan_prec *prec)
{
    for (size_t i = 0; i < sizeof(precs) / sizeof(precs[0]); i++)
        if (strcmp(name, precs[i]) == 0) {
            *prec = (enum plan_prec)i;
            return 0;
        }
    return -EINVAL;
}

const char *plan_prec_name(enum plan_prec prec) { return (size_t)prec < 3 ? precs[prec] : "?"; }
