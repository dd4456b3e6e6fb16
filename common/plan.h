/*
 * plan: what a job will cost before it runs. From the model's shape, the
 * batch and the devices it gets, the planner predicts each rank's memory
 * (ZeRO-3 model state, gathered units, activations of one micro-batch) and
 * the bytes each rank sends and receives per optimizer step, and from a
 * network bandwidth and a device speed the time spent communicating.
 *
 * The figures come from the code that allocates and communicates: the unit
 * layout (common/gptlayout.h) and the shard arithmetic (common/zeroshard.h)
 * that muster-train itself uses, and the collectives a step runs
 * (worker/train/train.c, zero.c). docs/plan.md gives every formula; the
 * tests (tests/check_plan.c) hold them to what the CPU trainer allocates
 * and what the ring backend counts, byte for byte.
 *
 * Used by musterctl plan, GET /v1/plan, musterd's refusal to form a
 * generation that does not fit, the agent's pre-flight and musterctl doctor.
 */
#ifndef MUSTER_PLAN_H
#define MUSTER_PLAN_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "common/gptcfg.h"
#include "common/jobspec.h"

#define PLAN_MAX_NODES 4096
#define PLAN_MAX_DEVICES 64      /* per node (= PROTO_MAX_LOCAL_RANKS) */
#define PLAN_MIN_GBIT 0.001      /* 1 Mbit/s */
#define PLAN_MAX_GBIT 100000.0   /* 100 Tbit/s: no link is faster */
#define PLAN_MIN_TFLOPS 1e-6
#define PLAN_MAX_TFLOPS 100000.0
#define PLAN_DEFAULT_GBIT 10.0
/* Effective (not peak) speeds a rank's compute is predicted with. */
#define PLAN_DEFAULT_TFLOPS_CPU 0.02
#define PLAN_DEFAULT_TFLOPS_GPU 200.0
/* A checkpoint's manifest is small; this bounds it for free-space needs. */
#define PLAN_MANIFEST_BYTES (64u * 1024u)

enum plan_device { PLAN_CPU, PLAN_GPU };

struct plan_input {
    struct gpt_config cfg;
    int nodes;               /* 1..PLAN_MAX_NODES */
    int devices_per_node;    /* 1..PLAN_MAX_DEVICES */
    enum plan_device device;
    int batch;               /* global batch, sequences per step */
    int micro_batch;         /* 0: batch / world */
    int seq_len;             /* 0: the model's context */
    uint64_t device_mem;     /* bytes per device (CPU: the node's memory, shared by its
                              * ranks); 0 = unknown */
    double network_gbit;     /* link bandwidth each rank's ring traffic crosses */
    double tflops;           /* effective compute per rank */
    uint64_t data_tokens;    /* tokens in the data file; 0 = unknown */
    int replicate_every;     /* the job's peer replicas (muster-train, CPU path, world > 1); 0 = off */
};

struct plan {
    struct plan_input in;
    int world;
    int micro_batch, accum, seq_len;
    uint64_t params;         /* model parameters */
    uint64_t shard_floats;   /* sum of this rank's shards */
    /* memory of one rank, bytes */
    uint64_t state;          /* weights, moments, gradient shard */
    uint64_t transient;      /* gathered units and full gradients */
    uint64_t workspace;      /* the collectives' own buffers */
    uint64_t acts;           /* activations of one micro-batch */
    uint64_t batch_bufs;     /* token buffers of one micro-batch */
    uint64_t data;           /* the data set held in memory (0 when unknown) */
    uint64_t fixed;          /* GPU: library workspace and small buffers */
    uint64_t replicas;       /* peer replicas: the snapshot block and two replica slots */
    uint64_t peak;           /* the sum: predicted peak of one rank */
    int sharing;             /* ranks that share device_mem (CPU: the node's) */
    uint64_t need;           /* peak * sharing */
    int fits;                /* 1, 0, or -1 when device_mem is unknown */
    int max_micro_batch;     /* largest micro-batch that fits and divides the batch;
                              * 0: none; -1: device_mem unknown */
    /* bytes one rank sends per optimizer step (it receives as many) */
    uint64_t fwd_gather, bwd_gather, reduce_scatter, scalars;
    uint64_t sent, recv;
    double flops;            /* per rank per step */
    double compute_s, comm_s, comm_frac;
    /* checkpoints */
    uint64_t ckpt_rank_file; /* one rank's shard file */
    uint64_t ckpt_bytes;     /* one whole checkpoint: world files and the manifest */
};

/* Fills *in from a job spec: model, batch, micro_batch, seq_len; the rest
 * is the caller's (nodes, devices, memory, bandwidth, speed, data). */
int plan_input_from_spec(struct plan_input *in, const struct job_spec *spec, char *err, size_t errlen);

/*
 * Checks the input (each bad value named: "nodes: expected 1 to 4096, got
 * 0") and computes the plan. Returns 0 or -EINVAL with the reason in err.
 */
int plan_compute(const struct plan_input *in, struct plan *p, char *err, size_t errlen);

/* Bytes of activations (and the token buffers) of one micro-batch of B x T
 * on the given device path: what muster-train allocates for them. */
uint64_t plan_act_bytes(const struct gpt_config *cfg, enum plan_device dev, int B, int T);

/* The plan as JSON (docs/plan.md lists the keys); a new reference. */
json_t *plan_json(const struct plan *p, const char *model);

/* The input back from plan_json's object (to plan it again at another
 * bandwidth or speed). 0, or -EINVAL when obj is not such an object. */
int plan_input_from_json(const json_t *obj, struct plan_input *in);

const char *plan_device_name(enum plan_device d);

/* "1.23 GiB", "456.00 MiB", "789 B" (binary units) into buf; returns buf. */
const char *plan_bytes_str(char *buf, size_t len, double bytes);

#endif
