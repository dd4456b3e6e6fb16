#include "common/plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "common/batch.h"
#include "common/gptlayout.h"
#include "common/zeroshard.h"

/* The GPU path (worker/train/gpu/gpu_zero.cu) rounds shards to 64 floats,
 * gathers bf16 copies of the weights, keeps a decay mask byte and a bf16
 * copy per float of state, rounds each activation buffer to 256 bytes and
 * holds a 32 MiB cuBLAS workspace. */
#define GPU_ALIGN_FLOATS 64
#define GPU_BLAS_WORKSPACE (32u << 20)
/* ... and computes the tied head over the vocabulary padded to a multiple
 * of 64, from a bf16 copy of wte with that many rows (gpu.h GPU_VOCAB_ALIGN). */
#define GPU_VOCAB_ALIGN 64
#define BF16 2

const char *plan_device_name(enum plan_device d) { return d == PLAN_GPU ? "gpu" : "cpu"; }

const char *plan_bytes_str(char *buf, size_t len, double b)
{
    static const char *const unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
    int u = 0;
    while (b >= 1024 && u < 4) {
        b /= 1024;
        u++;
    }
    snprintf(buf, len, u ? "%.2f %s" : "%.0f %s", b, unit[u]);
    return buf;
}

int plan_input_from_spec(struct plan_input *in, const struct job_spec *spec, char *err, size_t errlen)
{
    memset(in, 0, sizeof(*in));
    if (job_spec_model(spec, &in->cfg, err, errlen))
        return -EINVAL;
    in->batch = spec->batch;
    in->micro_batch = spec->micro_batch;
    in->seq_len = spec->seq_len;
    in->nodes = spec->nodes;
    in->devices_per_node = 1;
    in->network_gbit = PLAN_DEFAULT_GBIT;
    in->tflops = PLAN_DEFAULT_TFLOPS_CPU;
    in->replicate_every = spec->replicate_every;
    return 0;
}

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

/* Floats of the CPU trainer's activations (worker/train/model.c, carve_acts):
 * per block ln1, atty, attproj, res2, ln2, fcproj, res3 (B,T,C); qkv (B,T,3C);
 * fch, fch_gelu (B,T,4C); att (B,NH,T,T); four (B,T) statistics. Then the
 * embedding output, the final norm and its statistics, logits and
 * probabilities (B,T,V), the losses, and backward scratch: dres, dsmall
 * (B,T,C), dbig (B,T,4C), datt (B,NH,T,T). */
static uint64_t cpu_act_floats(const struct gpt_config *c, uint64_t B, uint64_t T)
{
    const uint64_t N = B * T, C = (uint64_t)c->C, att = B * (uint64_t)c->NH * T * T;
    const uint64_t block = 7 * N * C + 3 * N * C + 2 * 4 * N * C + att + 4 * N;
    return N * C + (uint64_t)c->L * block + N * C + 2 * N + 2 * N * (uint64_t)c->V + N +
           2 * N * C + 4 * N * C + att;
}

/* Bytes of the GPU path's activations (gpu_zero.cu, carve_acts): the same
 * buffers in bf16 or fp32 as that file says, each rounded up to 256 bytes. */
static uint64_t gpu_act_bytes(const struct gpt_config *c, uint64_t B, uint64_t T)
{
    const uint64_t N = B * T, C = (uint64_t)c->C, V = round_up((uint64_t)c->V, GPU_VOCAB_ALIGN);
    const uint64_t att = B * (uint64_t)c->NH * T * T, F = sizeof(float);
#define R(x) round_up((x), 256)
    uint64_t block = R(N * C * BF16) + 2 * R(N * F) + R(3 * N * C * BF16) + R(att * BF16) +
                     R(N * C * BF16) + R(N * C * F) + R(N * C * BF16) + 2 * R(N * F) +
                     R(4 * N * C * F) + R(4 * N * C * BF16) + R(N * C * F);
    uint64_t rest = R(N * C * F) + R(N * C * BF16) + 2 * R(N * F) + R(N * V * F) +
                    R(N * V * BF16) + R(N * F) + 2 * R(N * C * F) + R(4 * N * C * F) +
                    R(att * F) + R(3 * N * C * F) +
                    R((att > 4 * N * C ? att : 4 * N * C) * BF16) + R(3 * N * C * BF16);
#undef R
    return (uint64_t)c->L * block + rest;
}

/* Token ids of a micro-batch: on the CPU the model's copies of inputs and
 * targets and the trainer's own (4 x B x T ints); on the GPU the device
 * copies of inputs and targets. */
static uint64_t ids_bytes(enum plan_device dev, int B, int T)
{
    return (dev == PLAN_GPU ? 2 : 4) * (uint64_t)B * (uint64_t)T * sizeof(int);
}

uint64_t plan_act_bytes(const struct gpt_config *cfg, enum plan_device dev, int B, int T)
{
    const uint64_t ids = ids_bytes(dev, B, T);
    if (dev == PLAN_GPU)
        return gpu_act_bytes(cfg, (uint64_t)B, (uint64_t)T) + ids;
    return sizeof(float) * cpu_act_floats(cfg, (uint64_t)B, (uint64_t)T) + ids;
}

static int check_input(const struct plan_input *in, char *err, size_t errlen)
{
    if (gpt_config_check(&in->cfg, err, errlen))
        return -EINVAL;
    if (in->nodes < 1 || in->nodes > PLAN_MAX_NODES)
        snprintf(err, errlen, "nodes: expected 1 to %d, got %d", PLAN_MAX_NODES, in->nodes);
    else if (in->devices_per_node < 1 || in->devices_per_node > PLAN_MAX_DEVICES)
        snprintf(err, errlen, "devices per node: expected 1 to %d, got %d", PLAN_MAX_DEVICES,
                 in->devices_per_node);
    else if (!(in->network_gbit >= PLAN_MIN_GBIT && in->network_gbit <= PLAN_MAX_GBIT))
        snprintf(err, errlen, "network: expected %g to %g Gbit/s, got %g", PLAN_MIN_GBIT, PLAN_MAX_GBIT,
                 in->network_gbit);
    else if (!(in->tflops >= PLAN_MIN_TFLOPS && in->tflops <= PLAN_MAX_TFLOPS))
        snprintf(err, errlen, "tflops: expected %g to %g, got %g", PLAN_MIN_TFLOPS, PLAN_MAX_TFLOPS,
                 in->tflops);
    else if (in->seq_len < 0 || in->seq_len > in->cfg.T)
        snprintf(err, errlen, "seq_len: expected 1 to the model's context %d, got %d", in->cfg.T,
                 in->seq_len);
    else if (in->batch < 1)
        snprintf(err, errlen, "batch: expected at least 1, got %d", in->batch);
    else
        return 0;
    return -EINVAL;
}

/* Memory of one rank at micro-batch B (the fields state .. peak of p). */
static void memory(struct plan *p, const struct zero_shards *zs, int B)
{
    const struct plan_input *in = &p->in;
    const uint64_t N = (uint64_t)p->world;
    if (in->device == PLAN_GPU) {
        /* fp32 weights, moments, gradients, a decay byte and a bf16 copy per float */
        p->state = zs->total * (4 * sizeof(float) + 1 + BF16);
        /* three slots (embedding, two blocks) of bf16 units and fp32 full gradients,
         * and their reduce-scatter results when there is a communicator */
        const uint64_t three = zs->shard[0] + 2 * zs->max_shard;
        p->transient = N * three * (BF16 + sizeof(float)) + (N > 1 ? three * sizeof(float) : 0);
        p->workspace = 0; /* NCCL's buffers are its own and not predicted */
        p->fixed = GPU_BLAS_WORKSPACE + 4 * sizeof(double) +
                   round_up((uint64_t)in->cfg.V, GPU_VOCAB_ALIGN) * (uint64_t)in->cfg.C * BF16;
    } else {
        p->state = zero_shards_state_bytes(zs);
        p->transient = zero_shards_transient_bytes(zs);
        /* the ring's partial sums: an in-place reduce-scatter of the largest span
         * (a block; an embedding chunk is no larger) takes three buffers of its shard */
        p->workspace = N > 1 ? 3 * sizeof(float) * zs->max_shard : 0;
        p->fixed = 0;
    }
    const uint64_t all = plan_act_bytes(&in->cfg, in->device, B, p->seq_len);
    p->batch_bufs = ids_bytes(in->device, B, p->seq_len);
    p->acts = all - p->batch_bufs;
    p->data = in->device == PLAN_GPU ? 0 : 2 * in->data_tokens;
    /* worker/train/replica.h: a second block of weights and both moments (the
     * snapshot) and two slots of a peer's, 3 x shard floats each */
    p->replicas = in->device == PLAN_CPU && N > 1 && in->replicate_every > 0 ? 9 * sizeof(float) * zs->total : 0;
    p->peak = p->state + p->transient + p->workspace + p->acts + p->batch_bufs + p->data + p->fixed + p->replicas;
    p->need = p->peak * (uint64_t)p->sharing;
}

/* Bytes one rank sends per step (ring collectives: each of N-1 steps moves
 * one rank's block): an all-gather or reduce-scatter of shard S of e-byte
 * elements sends (N-1) x S x e. */
static void traffic(struct plan *p, const struct zero_shards *zs)
{
    const uint64_t N = (uint64_t)p->world, A = (uint64_t)p->accum;
    const int L = p->in.cfg.L;
    const int gpu = p->in.device == PLAN_GPU;
    const uint64_t ge = gpu ? BF16 : sizeof(float), re = sizeof(float);
    uint64_t fwd = zs->total, bwd = 0;
    if (gpu) {
        for (int u = 1; u <= L - 1; u++) /* the backward gathers blocks L-1 .. 1 again */
            bwd += zs->shard[u];
    } else {
        /* CPU: the embedding is gathered in chunks for the lookup and again
         * for the logits; the backward gathers it once more for the head's
         * input gradient, then the norm and every block */
        fwd += zs->shard[0];
        bwd = zs->total;
    }
    p->fwd_gather = A * (N - 1) * fwd * ge;
    p->bwd_gather = A * (N - 1) * bwd * ge;
    p->reduce_scatter = A * (N - 1) * zs->total * re;
    /* CPU: three all-gathers of one double per rank (loss, squared gradient
     * norm, the stop/checkpoint vote). GPU: all-reduces of two doubles and
     * of one, each sending 2 (N-1) blocks of ceil(n/N) doubles. */
    if (gpu)
        p->scalars = 2 * (N - 1) * 8 * ((2 + N - 1) / N + (1 + N - 1) / N);
    else
        p->scalars = 3 * (N - 1) * sizeof(double);
    p->sent = p->fwd_gather + p->bwd_gather + p->reduce_scatter + p->scalars;
    p->recv = p->sent;
}

int plan_compute(const struct plan_input *in, struct plan *p, char *err, size_t errlen)
{
    memset(p, 0, sizeof(*p));
    if (check_input(in, err, errlen))
        return -EINVAL;
    p->in = *in;
    p->world = in->nodes * in->devices_per_node;
    struct batch_plan bp;
    if (batch_plan(in->batch, in->micro_batch, p->world, &bp, err, errlen))
        return -EINVAL;
    p->micro_batch = bp.micro_batch;
    p->accum = bp.accum;
    p->seq_len = in->seq_len ? in->seq_len : in->cfg.T;
    p->params = gpt_param_count(&in->cfg);

    struct gpt_layout lay;
    struct zero_shards zs;
    gpt_layout_init(&lay, &in->cfg);
    zero_shards_init(&zs, &lay, p->world, in->device == PLAN_GPU ? GPU_ALIGN_FLOATS : 1);
    p->shard_floats = zs.total;
    p->sharing = in->device == PLAN_CPU ? in->devices_per_node : 1;

    /* figures beyond 2^56 bytes a rank could wrap: refuse the shape instead */
    const double N = (double)p->micro_batch * p->seq_len;
    const double acts = 4.0 * (N * in->cfg.C * (18.0 * in->cfg.L + 8) +
                               N * in->cfg.NH * p->seq_len * (in->cfg.L + 1.0) + 2.0 * N * in->cfg.V);
    if (acts + 20.0 * (double)p->params > 7.2e16) { /* x 64 ranks sharing still fits 2^62 */
        snprintf(err, errlen, "micro_batch %d x seq_len %d of this model needs more than 2^56 bytes per rank: "
                 "the plan cannot hold it", p->micro_batch, p->seq_len);
        return -EINVAL;
    }
    if ((double)p->accum * (double)p->params * 12.0 > 4.6e18) { /* each rank's bytes per step, bounded by */
        snprintf(err, errlen, "%d micro-steps of this model move more than 2^62 bytes per step: the plan "
                 "cannot count them", p->accum);
        return -EINVAL;
    }
    /* the largest micro-batch that fits and splits the batch evenly: a divisor
     * b of q = batch / world (memory grows with b), largest first: q/d for
     * d = 1 .. sqrt(q), then d for d = sqrt(q) .. 1 */
    p->max_micro_batch = in->device_mem ? 0 : -1;
    const int q = in->batch / p->world;
    int r = 1;
    while ((r + 1) * (r + 1) <= q)
        r++;
    for (int k = 0; in->device_mem && p->max_micro_batch == 0 && k < 2 * r; k++) {
        const int d = k < r ? k + 1 : 2 * r - k, b = k < r ? q / d : d;
        if (q % d)
            continue;
        memory(p, &zs, b);
        if (p->need <= in->device_mem)
            p->max_micro_batch = b;
    }
    memory(p, &zs, p->micro_batch);
    p->fits = in->device_mem ? p->need <= in->device_mem : -1;

    traffic(p, &zs);
    const double tokens = (double)p->accum * p->micro_batch * p->seq_len;
    p->flops = tokens * (6.0 * (double)p->params +
                         12.0 * in->cfg.L * (double)p->seq_len * in->cfg.C);
    p->compute_s = p->flops / (in->tflops * 1e12);
    p->comm_s = (double)p->sent * 8.0 / (in->network_gbit * 1e9);
    p->comm_frac = p->comm_s + p->compute_s > 0 ? p->comm_s / (p->comm_s + p->compute_s) : 0;

    /* shard file: magic, four uint32, a uint64 per unit, then weights and
     * both moments of every unit's shard (worker/train/ckpt.h) */
    p->ckpt_rank_file = 8 + 4 * 4 + 8 * (uint64_t)lay.nunits + 3 * sizeof(float) * zs.total;
    p->ckpt_bytes = (uint64_t)p->world * p->ckpt_rank_file + PLAN_MANIFEST_BYTES;
    return 0;
}

json_t *plan_json(const struct plan *p, const char *model)
{
    const struct plan_input *in = &p->in;
    json_t *mem = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:o, s:i, s:I, s:o, s:o}", "state", (json_int_t)p->state,
        "transient", (json_int_t)p->transient, "workspace", (json_int_t)p->workspace, "activations",
        (json_int_t)p->acts, "batch_buffers", (json_int_t)p->batch_bufs, "data", (json_int_t)p->data, "fixed",
        (json_int_t)p->fixed, "replicas", (json_int_t)p->replicas, "peak", (json_int_t)p->peak, "device_memory",
        in->device_mem ? json_integer((json_int_t)in->device_mem) : json_null(), "sharing", p->sharing,
        "need", (json_int_t)p->need, "fits", p->fits < 0 ? json_null() : json_boolean(p->fits),
        "max_micro_batch", p->max_micro_batch < 0 ? json_null() : json_integer(p->max_micro_batch));
    json_t *comm = json_pack(
        "{s:I, s:I, s:I, s:I, s:I, s:I, s:f, s:f, s:f, s:f, s:f, s:f}", "fwd_gather",
        (json_int_t)p->fwd_gather, "bwd_gather", (json_int_t)p->bwd_gather, "reduce_scatter",
        (json_int_t)p->reduce_scatter, "scalars", (json_int_t)p->scalars, "sent_per_step",
        (json_int_t)p->sent, "recv_per_step", (json_int_t)p->recv, "network_gbit", in->network_gbit,
        "tflops", in->tflops, "flops_per_step", p->flops, "compute_s", p->compute_s, "comm_s", p->comm_s,
        "comm_frac", p->comm_frac);
    json_t *ckpt = json_pack("{s:I, s:I, s:I}", "rank_file", (json_int_t)p->ckpt_rank_file, "checkpoint",
                             (json_int_t)p->ckpt_bytes, "free_needed", (json_int_t)(2 * p->ckpt_bytes));
    json_t *shape = json_pack("{s:i, s:i, s:i, s:i, s:i}", "n_layer", in->cfg.L, "n_head", in->cfg.NH,
                              "n_embd", in->cfg.C, "context", in->cfg.T, "vocab", in->cfg.V);
    return json_pack("{s:s, s:o, s:I, s:s, s:i, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:o, s:o, s:o}", "model",
                     model ? model : "", "shape", shape, "params", (json_int_t)p->params, "device",
                     plan_device_name(in->device), "nodes", in->nodes, "devices_per_node",
                     in->devices_per_node, "world", p->world, "batch", in->batch, "micro_batch",
                     p->micro_batch, "accum", p->accum, "seq_len", p->seq_len, "shard_floats",
                     (json_int_t)p->shard_floats, "memory", mem, "comm", comm, "checkpoint", ckpt);
}

int plan_input_from_json(const json_t *plan, struct plan_input *in)
{
    const json_t *shape = json_object_get(plan, "shape"), *mem = json_object_get(plan, "memory"),
                 *comm = json_object_get(plan, "comm");
    const char *dev = json_string_value(json_object_get(plan, "device"));
    if (!json_is_object(shape) || !json_is_object(mem) || !json_is_object(comm) || !dev)
        return -EINVAL;
    memset(in, 0, sizeof(*in));
    in->cfg.L = (int)json_integer_value(json_object_get(shape, "n_layer"));
    in->cfg.NH = (int)json_integer_value(json_object_get(shape, "n_head"));
    in->cfg.C = (int)json_integer_value(json_object_get(shape, "n_embd"));
    in->cfg.T = (int)json_integer_value(json_object_get(shape, "context"));
    in->cfg.V = (int)json_integer_value(json_object_get(shape, "vocab"));
    in->nodes = (int)json_integer_value(json_object_get(plan, "nodes"));
    in->devices_per_node = (int)json_integer_value(json_object_get(plan, "devices_per_node"));
    in->device = strcmp(dev, "gpu") == 0 ? PLAN_GPU : PLAN_CPU;
    in->batch = (int)json_integer_value(json_object_get(plan, "batch"));
    in->micro_batch = (int)json_integer_value(json_object_get(plan, "micro_batch"));
    in->seq_len = (int)json_integer_value(json_object_get(plan, "seq_len"));
    in->device_mem = (uint64_t)json_integer_value(json_object_get(mem, "device_memory"));
    in->data_tokens = (uint64_t)json_integer_value(json_object_get(mem, "data")) / 2;
    in->network_gbit = json_number_value(json_object_get(comm, "network_gbit"));
    in->tflops = json_number_value(json_object_get(comm, "tflops"));
    return 0;
}
