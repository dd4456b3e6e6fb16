/*
 * plan_names: the names of a program's parallelism and precision (the job
 * spec's "parallelism" and "precision"), apart from the plan that costs
 * them (common/plan_prog.h), so that the job spec checks them without
 * depending on the plan, which reads the job spec.
 */
#ifndef MUSTER_PLAN_NAMES_H
#define MUSTER_PLAN_NAMES_H

/* How the program spreads the model over its ranks. */
enum plan_par {
    PLAN_PAR_DDP,          /* replicated; one all-reduce per optimizer step (no_sync while accumulating) */
    PLAN_PAR_ZERO1,        /* DeepSpeed ZeRO stage 1: optimizer state sharded */
    PLAN_PAR_ZERO2,        /* stage 2: and gradients */
    PLAN_PAR_ZERO3,        /* stage 3: and parameters */
    PLAN_PAR_FSDP,         /* FSDP FULL_SHARD: ZeRO-3's accounting */
    PLAN_PAR_FSDP_GRAD_OP, /* FSDP SHARD_GRAD_OP: ZeRO-2's */
};

enum plan_prec {
    PLAN_FP32,
    PLAN_BF16, /* bf16 weights, gradients and activations, fp32 master and moments */
    PLAN_FP16, /* the same in fp16 (loss scaling) */
};

/* "ddp", "zero1".."zero3", "fsdp", "fsdp-grad-op" -> *par; 0 or -EINVAL. */
int plan_par_parse(const char *name, enum plan_par *par);
const char *plan_par_name(enum plan_par par);
/* The ZeRO stage whose accounting applies: 0 (DDP) to 3. */
int plan_par_stage(enum plan_par par);
/* The names, for messages: "ddp, zero1, ...". */
const char *plan_par_list(void);
/* "fp32", "bf16", "fp16" -> *prec; 0 or -EINVAL. */
int plan_prec_parse(const char *name, enum plan_prec *prec);
const char *plan_prec_name(enum plan_prec prec);

#endif
