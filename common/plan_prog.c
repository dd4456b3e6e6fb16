#include "common/plan_prog.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/batch.h"
#include "common/plan.h"

/* Typical figures: the bandwidth each way, and one hop's latency as a
 * collective's step sees it (TCP over Ethernet; RDMA over InfiniBand and
 * NVLink; PCIe 4.0 x16 between GPUs without NVLink). */
static const struct {
    const char *name;
    struct plan_link link;
} links[] = {
    {"1g", {1, 50}},      {"10g", {10, 20}},   {"25g", {25, 15}},      {"100g", {100, 10}}, {"400g", {400, 10}},
    {"hdr", {200, 2}},    {"ndr", {400, 2}},   {"nvlink", {3600, 2}}, {"pcie", {256, 5}},
};
#define NLINKS (sizeof(links) / sizeof(links[0]))

int plan_link_parse(const char *text, struct plan_link *link)
{
    for (size_t i = 0; i < NLINKS; i++)
        if (strcmp(text, links[i].name) == 0) {
            *link = links[i].link;
            return 0;
        }
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < 0.001 || v > 100000)
        return -EINVAL;
    link->gbit = v;
    return 0;
}

const char *plan_link_presets(void) { return "1g, 10g, 25g, 100g, 400g (Ethernet), hdr, ndr (InfiniBand), nvlink, pcie"; }

uint64_t plan_prog_params(int layers, int d_model, int vocab, int seq_len)
{
    const uint64_t L = (uint64_t)layers, h = (uint64_t)d_model;
    return (uint64_t)vocab * h + (uint64_t)seq_len * h + L * (12 * h * h + 13 * h) + 2 * h;
}

int plan_prog_input_from_spec(struct plan_prog_input *in, const struct job_spec *spec, int nodes, int gpus_per_node,
                              char *err, size_t errlen)
{
    memset(in, 0, sizeof(*in));
    if (strcmp(spec->parallelism, "muster-train") == 0) {
        snprintf(err, errlen, "parallelism: muster-train is planned by common/plan.h");
        return -ENOTSUP;
    }
    if (plan_par_parse(spec->parallelism, &in->par) || plan_prec_parse(spec->precision, &in->prec)) {
        snprintf(err, errlen, "parallelism %s, precision %s: not a program's", spec->parallelism, spec->precision);
        return -EINVAL;
    }
    struct gpt_config cfg = {0};
    if (spec->shape_given) {
        if (job_spec_model(spec, &cfg, err, errlen))
            return -EINVAL;
        in->layers = cfg.L;
        in->d_model = cfg.C;
        in->heads = cfg.NH;
        in->vocab = cfg.V;
    }
    in->params = (uint64_t)spec->params;
    in->seq_len = spec->seq_len ? spec->seq_len : spec->shape_given ? cfg.T : 0;
    if (!in->seq_len) {
        snprintf(err, errlen, "seq_len: the plan of a %s program needs its sequence length", spec->parallelism);
        return -EINVAL;
    }
    struct batch_plan bp;
    if (batch_plan(spec->batch, spec->micro_batch, nodes * gpus_per_node, &bp, err, errlen))
        return -EINVAL;
    in->micro_batch = bp.micro_batch;
    in->accum = bp.accum;
    in->act_ckpt = spec->activation_checkpointing;
    in->nodes = nodes;
    in->gpus_per_node = gpus_per_node;
    plan_link_parse("10g", &in->inter);
    plan_link_parse("nvlink", &in->intra);
    in->tflops = PLAN_DEFAULT_TFLOPS_GPU;
    return 0;
}

static int check_link(const struct plan_link *l, const char *what, char *err, size_t errlen)
{
    if (!(l->gbit >= 0.001 && l->gbit <= 100000))
        snprintf(err, errlen, "%s: expected 0.001 to 100000 Gbit/s, got %g", what, l->gbit);
    else if (!(l->latency_us >= 0 && l->latency_us <= 1e6))
        snprintf(err, errlen, "%s latency: expected 0 to 1000000 us, got %g", what, l->latency_us);
    else
        return 0;
    return -EINVAL;
}

static int check_input(const struct plan_prog_input *in, char *err, size_t errlen)
{
    if ((unsigned)in->par > PLAN_PAR_FSDP_GRAD_OP)
        snprintf(err, errlen, "parallelism: expected one of %s", plan_par_list());
    else if ((unsigned)in->prec > PLAN_FP16)
        snprintf(err, errlen, "precision: expected fp32, bf16 or fp16");
    else if (in->params > PLAN_PROG_MAX_PARAMS)
        snprintf(err, errlen, "params: expected at most 10^15, got %llu", (unsigned long long)in->params);
    else if (in->layers < 0 || in->layers > 100000)
        snprintf(err, errlen, "layers: expected 1 to 100000, got %d", in->layers);
    else if (in->d_model < 0 || in->d_model > 1048576)
        snprintf(err, errlen, "d_model: expected 1 to 1048576, got %d", in->d_model);
    else if (in->heads < 0 || (in->heads && in->d_model && in->d_model % in->heads))
        snprintf(err, errlen, "heads: expected a divisor of d_model %d, got %d", in->d_model, in->heads);
    else if (in->vocab < 0 || in->vocab > 16777216)
        snprintf(err, errlen, "vocab: expected 1 to 16777216, got %d", in->vocab);
    else if (!in->params && !(in->layers && in->d_model && in->vocab))
        snprintf(err, errlen, "params: give the parameter count, or the model's layers, d_model and vocab");
    else if (in->seq_len < 1 || in->seq_len > 1048576)
        snprintf(err, errlen, "seq_len: expected 1 to 1048576, got %d", in->seq_len);
    else if (in->micro_batch < 1 || in->micro_batch > PLAN_PROG_MAX_MICRO_BATCH)
        snprintf(err, errlen, "micro_batch: expected 1 to %d, got %d", PLAN_PROG_MAX_MICRO_BATCH, in->micro_batch);
    else if (in->accum < 1 || in->accum > 1000000)
        snprintf(err, errlen, "accum: expected 1 to 1000000, got %d", in->accum);
    else if (in->nodes < 1 || in->nodes > 4096)
        snprintf(err, errlen, "nodes: expected 1 to 4096, got %d", in->nodes);
    else if (in->gpus_per_node < 1 || in->gpus_per_node > 64)
        snprintf(err, errlen, "gpus per node: expected 1 to 64, got %d", in->gpus_per_node);
    else if (check_link(&in->inter, "network", err, errlen) || check_link(&in->intra, "intra-node link", err, errlen))
        return -EINVAL;
    else if (!(in->step_time >= 0 && in->step_time <= 1e6))
        snprintf(err, errlen, "step time: expected 0 to 1000000 s, got %g", in->step_time);
    else if (!(in->tflops >= 1e-6 && in->tflops <= 100000))
        snprintf(err, errlen, "tflops: expected 0.000001 to 100000, got %g", in->tflops);
    else
        return 0;
    return -EINVAL;
}

/* Bytes of activations of one sequence (micro-batch 1), as a double so that a
 * huge shape is refused rather than wrapped. Per layer, 16-bit activations
 * without parallelism (Korthikanti et al., 2022): s·h·34 + 5·a·s² (the
 * attention scores, softmax and its dropout); fp32 doubles it. With
 * checkpointing each layer keeps its input (2·s·h) and one layer at a time is
 * recomputed whole during the backward. The logits in fp32 for the loss: 4·s·V. */
static double acts_per_seq(const struct plan_prog_input *in)
{
    const double s = in->seq_len, h = in->d_model, a = in->heads, L = in->layers;
    const double f = in->prec == PLAN_FP32 ? 2 : 1;
    const double layer = f * (34 * s * h + 5 * a * s * s);
    const double blocks = in->act_ckpt ? L * f * 2 * s * h + layer : L * layer;
    return blocks + 4 * s * in->vocab;
}

int plan_prog_compute(const struct plan_prog_input *in, struct plan_prog *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
    if (check_input(in, err, errlen))
        return -EINVAL;
    p->in = *in;
    p->world = in->nodes * in->gpus_per_node;
    p->params = in->params ? in->params : plan_prog_params(in->layers, in->d_model, in->vocab, in->seq_len);
    if (p->params > PLAN_PROG_MAX_PARAMS) {
        snprintf(err, errlen, "params: the shape has more than 10^15 parameters");
        return -EINVAL;
    }
    p->shape_known = in->layers > 0 && in->d_model > 0 && in->heads > 0;

    /* bytes per parameter: weights and gradients in the compute precision;
     * Adam's state: fp32 master, momentum and variance (K = 12) in mixed
     * precision, the two moments (8) in fp32 */
    const uint64_t N = (uint64_t)p->world, P = p->params, shard = (P + N - 1) / N;
    const uint64_t w = in->prec == PLAN_FP32 ? 4 : 2, g = w, K = in->prec == PLAN_FP32 ? 8 : 12;
    const int stage = plan_par_stage(in->par);
    p->weights = w * (stage >= 3 ? shard : P);
    p->grads = g * (stage >= 2 ? shard : P);
    p->optim = K * (stage >= 1 ? shard : P);
    const uint64_t state = p->weights + p->grads + p->optim;

    p->max_micro_batch = -1;
    if (p->shape_known) {
        const double per = acts_per_seq(in);
        if (per * in->micro_batch > 4.6e18 - (double)state) {
            snprintf(err, errlen, "micro_batch %d x seq_len %d of this shape needs more than 2^62 bytes per GPU: "
                     "the plan cannot hold it", in->micro_batch, in->seq_len);
            return -EINVAL;
        }
        p->acts_per_seq = (uint64_t)per;
        p->acts = p->acts_per_seq * (uint64_t)in->micro_batch;
        if (in->gpu_mem) {
            uint64_t b = in->gpu_mem > state ? (in->gpu_mem - state) / p->acts_per_seq : 0;
            p->max_micro_batch = b > PLAN_PROG_MAX_MICRO_BATCH ? PLAN_PROG_MAX_MICRO_BATCH : (int)b;
        }
    }
    p->peak = state + p->acts;
    p->fits = in->gpu_mem ? p->peak <= in->gpu_mem : -1;

    /* ring collectives: a reduce-scatter or all-gather sends (N-1) blocks of
     * ceil(P/N) elements, an all-reduce twice that; each takes N-1 hops (an
     * all-reduce 2(N-1)). Per step: DDP all-reduces once (no_sync while
     * accumulating); ZeRO-1 reduce-scatters once and all-gathers the updated
     * weights; ZeRO-2 reduce-scatters every micro-step and all-gathers once;
     * ZeRO-3 gathers in forward and backward and reduce-scatters every
     * micro-step. */
    const uint64_t A = (uint64_t)in->accum, blk = (N - 1) * shard, hops = N - 1;
    const uint64_t reduces = stage >= 2 ? A : 1, per_reduce = stage == 0 ? 2 : 1;
    const uint64_t gathers = stage == 0 ? 0 : stage == 3 ? 2 * A : 1;
    /* bytes beyond 2^62 a GPU could wrap: refuse the plan instead */
    if ((double)blk * ((double)reduces * per_reduce * g + (double)gathers * w) > 4.6e18) {
        snprintf(err, errlen, "%d micro-steps of %llu parameters over %d ranks move more than 2^62 bytes per step: "
                 "the plan cannot count them", in->accum, (unsigned long long)P, p->world);
        return -EINVAL;
    }
    p->grad_bytes = g * P;
    p->syncs_per_step = (int)reduces;
    p->sync_sent = per_reduce * blk * g;
    p->reduce_sent = reduces * p->sync_sent;
    p->gather_sent = gathers * blk * w;
    p->ring_steps = (int64_t)((reduces * per_reduce + gathers) * hops);
    p->step_sent = p->reduce_sent + p->gather_sent;
    /* a ring laid out node by node crosses each node's link with one rank's
     * bytes each way: the slowest link bounds it */
    const struct plan_link *l = in->nodes > 1 ? &in->inter : &in->intra;
    p->comm_s = N > 1 ? (double)p->step_sent * 8.0 / (l->gbit * 1e9) + p->ring_steps * l->latency_us * 1e-6 : 0;

    /* 6 flops per parameter and token (forward 2, backward 4), attention's
     * 12·L·s·h per token, a third more forward when checkpointing recomputes */
    const double tokens = (double)A * in->micro_batch * in->seq_len;
    p->flops = tokens * (6.0 * (double)P + (p->shape_known ? 12.0 * in->layers * in->seq_len * in->d_model : 0));
    if (in->act_ckpt)
        p->flops *= 4.0 / 3.0;
    p->compute_s = p->flops / (in->tflops * 1e12);
    if (in->step_time > 0) {
        p->comm_over_step = p->comm_s > in->step_time;
        p->comm_frac = p->comm_over_step ? 1 : p->comm_s / in->step_time;
    } else {
        p->comm_frac = p->comm_s + p->compute_s > 0 ? p->comm_s / (p->comm_s + p->compute_s) : 0;
    }
    return 0;
}

static json_t *opt_int(int64_t v, int known) { return known ? json_integer((json_int_t)v) : json_null(); }

json_t *plan_prog_json(const struct plan_prog *p)
{
    const struct plan_prog_input *in = &p->in;
    json_t *shape = json_pack("{s:i, s:i, s:i, s:i}", "layers", in->layers, "d_model", in->d_model, "heads",
                              in->heads, "vocab", in->vocab);
    json_t *mem = json_pack("{s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:o, s:o}", "weights", (json_int_t)p->weights,
                            "gradients", (json_int_t)p->grads, "optimizer", (json_int_t)p->optim, "activations",
                            (json_int_t)p->acts, "activations_per_seq", (json_int_t)p->acts_per_seq, "peak",
                            (json_int_t)p->peak, "device_memory", opt_int((int64_t)in->gpu_mem, in->gpu_mem > 0),
                            "fits", p->fits < 0 ? json_null() : json_boolean(p->fits), "max_micro_batch",
                            opt_int(p->max_micro_batch, p->max_micro_batch >= 0));
    json_t *comm = json_pack(
        "{s:I, s:I, s:i, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:f, s:o, s:b}",
        "gradient_bytes", (json_int_t)p->grad_bytes, "sync_sent", (json_int_t)p->sync_sent, "syncs_per_step",
        p->syncs_per_step, "reduce_sent", (json_int_t)p->reduce_sent, "gather_sent", (json_int_t)p->gather_sent,
        "sent_per_step", (json_int_t)p->step_sent, "recv_per_step", (json_int_t)p->step_sent, "ring_steps",
        (json_int_t)p->ring_steps, "network_gbit", in->inter.gbit, "latency_us", in->inter.latency_us, "intra_gbit",
        in->intra.gbit, "intra_latency_us", in->intra.latency_us, "comm_s", p->comm_s, "tflops", in->tflops,
        "flops_per_step", p->flops, "compute_s", p->compute_s, "step_time",
        in->step_time > 0 ? json_real(in->step_time) : json_null(), "comm_over_step", p->comm_over_step);
    json_object_set_new(comm, "comm_frac", json_real(p->comm_frac));
    return json_pack("{s:s, s:s, s:i, s:s, s:I, s:o, s:b, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:o}", "kind",
                     "program", "parallelism", plan_par_name(in->par), "zero_stage", plan_par_stage(in->par),
                     "precision", plan_prec_name(in->prec), "params", (json_int_t)p->params, "shape", shape,
                     "activation_checkpointing", in->act_ckpt, "nodes", in->nodes, "gpus_per_node",
                     in->gpus_per_node, "world", p->world, "micro_batch", in->micro_batch, "accum", in->accum,
                     "seq_len", in->seq_len, "memory", mem, "comm", comm);
}

int plan_prog_input_from_json(const json_t *obj, struct plan_prog_input *in)
{
    const json_t *shape = json_object_get(obj, "shape"), *mem = json_object_get(obj, "memory"),
                 *comm = json_object_get(obj, "comm");
    const char *par = json_string_value(json_object_get(obj, "parallelism")),
               *prec = json_string_value(json_object_get(obj, "precision"));
    memset(in, 0, sizeof(*in));
    if (!json_is_object(shape) || !json_is_object(mem) || !json_is_object(comm) || !par || !prec ||
        plan_par_parse(par, &in->par) || plan_prec_parse(prec, &in->prec))
        return -EINVAL;
#define I(o, k) (int)json_integer_value(json_object_get((o), (k)))
#define D(o, k) json_number_value(json_object_get((o), (k)))
    in->params = (uint64_t)json_integer_value(json_object_get(obj, "params"));
    in->layers = I(shape, "layers");
    in->d_model = I(shape, "d_model");
    in->heads = I(shape, "heads");
    in->vocab = I(shape, "vocab");
    in->seq_len = I(obj, "seq_len");
    in->micro_batch = I(obj, "micro_batch");
    in->accum = I(obj, "accum");
    in->act_ckpt = json_is_true(json_object_get(obj, "activation_checkpointing"));
    in->nodes = I(obj, "nodes");
    in->gpus_per_node = I(obj, "gpus_per_node");
    in->gpu_mem = (uint64_t)json_integer_value(json_object_get(mem, "device_memory"));
    in->inter = (struct plan_link){D(comm, "network_gbit"), D(comm, "latency_us")};
    in->intra = (struct plan_link){D(comm, "intra_gbit"), D(comm, "intra_latency_us")};
    in->step_time = D(comm, "step_time");
    in->tflops = D(comm, "tflops");
#undef I
#undef D
    return 0;
}
