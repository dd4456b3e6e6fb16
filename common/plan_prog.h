/*
 * plan_prog: what the programs users bring (a PyTorch DDP, FSDP or DeepSpeed
 * ZeRO script) will cost per GPU before they run. Where common/plan.h models
 * muster-train buffer by buffer, this models the published accounting of
 * data-parallel training:
 *
 *   - memory per GPU from the ZeRO paper's formulas (Rajbhandari et al.,
 *     2020): weights, gradients and optimizer state per parameter, sharded
 *     over N ranks as the stage says; mixed-precision Adam keeps K = 12 bytes
 *     (fp32 master, two moments), so DDP holds 16 bytes per parameter, ZeRO-1
 *     4 + 12/N, ZeRO-2 2 + 14/N, ZeRO-3 16/N; fp32 Adam 4 + 4 + 8;
 *   - activations from the transformer estimate of Korthikanti et al. (2022):
 *     s·b·h·(34 + 5·a·s/h) bytes per layer in 16 bits, 2·s·b·h per layer with
 *     activation checkpointing (plus one layer recomputed), and the logits;
 *   - bytes per gradient sync and per optimizer step for ring collectives
 *     (an all-reduce sends 2(N-1)/N of the buffer, a reduce-scatter or
 *     all-gather (N-1)/N), and their time over the slowest link a ring crosses.
 *
 * docs/plan.md gives every formula and the guides' worked example; the
 * tests (tests/check_plan.c) hold them to hand-computed cases.
 */
#ifndef MUSTER_PLAN_PROG_H
#define MUSTER_PLAN_PROG_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/jobspec.h"
#include "common/plan_names.h"

/* A link the ring's traffic crosses. */
struct plan_link {
    double gbit;       /* bandwidth each way, 10^9 bit/s */
    double latency_us; /* one hop */
};

#define PLAN_PROG_MAX_PARAMS 1000000000000000ULL /* 10^15: no model is larger */
#define PLAN_PROG_MAX_MICRO_BATCH 1048576

struct plan_prog_input {
    enum plan_par par;
    enum plan_prec prec;
    uint64_t params;       /* 0: from the shape (layers, d_model, vocab, seq_len) */
    int layers, d_model, heads, vocab; /* the transformer's shape; 0 = unknown */
    int seq_len;           /* tokens per sequence */
    int micro_batch;       /* sequences per GPU per micro-step */
    int accum;             /* micro-steps per optimizer step */
    int act_ckpt;          /* activation checkpointing */
    int nodes, gpus_per_node;
    struct plan_link inter; /* between nodes */
    struct plan_link intra; /* between the GPUs of a node */
    uint64_t gpu_mem;      /* bytes per GPU; 0 = unknown */
    double step_time;      /* measured seconds per optimizer step; 0 = unknown */
    double tflops;         /* effective per GPU, for the estimate without a step time */
};

struct plan_prog {
    struct plan_prog_input in;
    int world;
    uint64_t params;
    int shape_known;        /* layers, d_model and heads given: activations predicted */
    /* memory of one GPU, bytes */
    uint64_t weights, grads, optim;
    uint64_t acts;          /* of one micro-batch; 0 when the shape is unknown */
    uint64_t acts_per_seq;  /* activations grow by this per sequence of the micro-batch */
    uint64_t peak;
    int fits;               /* 1, 0, or -1 when gpu_mem is unknown */
    int max_micro_batch;    /* largest that fits; 0 none; -1 unknown (no memory or no shape) */
    /* traffic of one GPU (it receives as much as it sends), bytes */
    uint64_t grad_bytes;    /* the gradients one sync reduces: params x gradient bytes */
    uint64_t sync_sent;     /* one gradient sync (all-reduce, or reduce-scatter + all-gather) */
    int syncs_per_step;     /* 1 (DDP no_sync, ZeRO-1) or accum (ZeRO-2, ZeRO-3 reduce every micro-step) */
    uint64_t reduce_sent;   /* per step: all-reduces or reduce-scatters of gradients */
    uint64_t gather_sent;   /* per step: all-gathers of parameters (ZeRO-1/2 after the update, ZeRO-3 per micro-step) */
    uint64_t step_sent;     /* the sum */
    int64_t ring_steps;     /* hops of every collective in a step (the latency term) */
    double comm_s;          /* step_sent over the slowest link, plus the hops' latency */
    double flops, compute_s; /* the estimate at tflops */
    double comm_frac;       /* comm_s / step_time, or comm_s / (comm_s + compute_s) */
    int comm_over_step;     /* the predicted communication exceeds the measured step */
};


/* A network preset ("1g", "10g", "25g", "100g", "400g" Ethernet, "hdr", "ndr"
 * InfiniBand, "nvlink", "pcie") or a bandwidth in Gbit/s; 0 or -EINVAL. A
 * number keeps *link's latency. */
int plan_link_parse(const char *text, struct plan_link *link);
/* The presets, for messages: "1g, 10g, ...". */
const char *plan_link_presets(void);

/* Parameters of a GPT-style transformer: V·h + s·h (embeddings, tied head)
 * + L·(12·h² + 13·h) + 2·h. */
uint64_t plan_prog_params(int layers, int d_model, int vocab, int seq_len);

/*
 * Fills *in from a job spec whose parallelism is a program's (not
 * muster-train): params or the model keys' shape, precision, seq_len,
 * micro_batch and accumulation (batch / (micro_batch x world), as
 * muster-train splits it), at nodes x gpus_per_node ranks; the links, memory
 * and times are the caller's (defaults: 10g, nvlink, unknown). 0, -ENOTSUP
 * for a muster-train spec, or -EINVAL with why.
 */
int plan_prog_input_from_spec(struct plan_prog_input *in, const struct job_spec *spec, int nodes, int gpus_per_node,
                              char *err, size_t errlen);

/* Checks the input (each bad value named) and computes. 0 or -EINVAL. */
int plan_prog_compute(const struct plan_prog_input *in, struct plan_prog *p, char *err, size_t errlen);

/* The plan as JSON ("kind": "program"; docs/plan.md lists the keys). */
json_t *plan_prog_json(const struct plan_prog *p);
/* The input back from plan_prog_json's object; 0 or -EINVAL. */
int plan_prog_input_from_json(const json_t *obj, struct plan_prog_input *in);

#endif
