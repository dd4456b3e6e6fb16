/*
 * ctl_plan: `musterctl plan`, what a job will cost before it runs
 * (common/plan.h), for a job spec file or a preset on the command line, or
 * for the running job through GET /v1/plan; and the table that shows it.
 */
#include "ctl/ctl_plan.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/batch.h"
#include "common/plan.h"
#include "common/plan_prog.h"
#include "common/preflight.h"
#include "ctl/ctl_args.h"

#define PLAN_MAX_BATCH 1048576 /* the job spec's bound on batch */

static double num(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }
static long long integer(const json_t *o, const char *key)
{
    return json_integer_value(json_object_get(o, key));
}

static void row(FILE *f, const char *what, double bytes, const char *note)
{
    char b[32];
    fprintf(f, "  %-40s %12s  %s\n", what, plan_bytes_str(b, sizeof(b), bytes), note ? note : "");
}

void render_plan(FILE *f, const json_t *plan)
{
    const json_t *mem = json_object_get(plan, "memory"), *comm = json_object_get(plan, "comm"),
                 *ck = json_object_get(plan, "checkpoint");
    const char *dev = json_string_value(json_object_get(plan, "device"));
    const int gpu = dev && strcmp(dev, "gpu") == 0;
    char note[160], b[32], b2[32];

    fprintf(f, "plan: %s (%.2f M parameters) on %lld node%s x %lld %s = %lld rank%s\n",
            json_string_value(json_object_get(plan, "model")), (double)integer(plan, "params") / 1e6,
            integer(plan, "nodes"), integer(plan, "nodes") == 1 ? "" : "s", integer(plan, "devices_per_node"),
            gpu ? "gpu" : "cpu", integer(plan, "world"), integer(plan, "world") == 1 ? "" : "s");
    fprintf(f, "batch %lld = micro_batch %lld x accum %lld x %lld ranks; seq_len %lld\n\n",
            integer(plan, "batch"), integer(plan, "micro_batch"), integer(plan, "accum"), integer(plan, "world"),
            integer(plan, "seq_len"));

    fprintf(f, "memory of one rank\n");
    snprintf(note, sizeof(note), "16 B x %lld shard floats", integer(plan, "shard_floats"));
    row(f, "model state (weights, 2 moments, grads)", num(mem, "state"), gpu ? "plus bf16 copy, decay mask" : note);
    row(f, "gathered units and full gradients", num(mem, "transient"), NULL);
    if (!gpu)
        row(f, "ring workspace", num(mem, "workspace"), NULL);
    snprintf(note, sizeof(note), "micro_batch %lld x seq_len %lld", integer(plan, "micro_batch"),
             integer(plan, "seq_len"));
    row(f, "activations", num(mem, "activations"), note);
    row(f, "token buffers", num(mem, "batch_buffers"), NULL);
    if (!gpu)
        row(f, "data set", num(mem, "data"), num(mem, "data") > 0 ? "2 B per token" : "data file not read");
    if (gpu)
        row(f, "cuBLAS workspace and scalars", num(mem, "fixed"), NULL);
    if (num(mem, "replicas") > 0)
        row(f, "peer replicas", num(mem, "replicas"), "replicate_every > 0: snapshot + 2 replica slots");
    row(f, "predicted peak", num(mem, "peak"), NULL);
    const json_t *dm = json_object_get(mem, "device_memory");
    if (json_is_integer(dm)) {
        long long sharing = integer(mem, "sharing");
        snprintf(note, sizeof(note), "%s%s; needs %s%s", json_is_true(json_object_get(mem, "fits")) ? "fits" : "DOES NOT FIT",
                 "", plan_bytes_str(b, sizeof(b), num(mem, "need")),
                 sharing > 1 ? " (the node's ranks together)" : "");
        row(f, gpu ? "device memory" : "host memory (shared by the node's ranks)", (double)json_integer_value(dm),
            note);
        const json_t *mm = json_object_get(mem, "max_micro_batch");
        if (json_integer_value(mm) > 0)
            fprintf(f, "  %-40s %12lld\n", "largest micro_batch that fits", (long long)json_integer_value(mm));
        else
            fprintf(f, "  %-40s %12s  %s\n", "largest micro_batch that fits", "none",
                    "even micro_batch 1 does not fit: use more ranks or a smaller model");
    } else {
        fprintf(f, "  %-40s %12s  %s\n", "device memory", "unknown", "--device-memory GB to check the fit");
    }

    fprintf(f, "\ncommunication of one rank per step (sent; it receives as much): muster-train's ZeRO-3 gathers\n"
               "and reduce-scatters on each of the %lld micro-step%s (a DDP program: --parallelism ddp)\n",
            integer(plan, "accum"), integer(plan, "accum") == 1 ? "" : "s");
    row(f, "all-gathers, forward", num(comm, "fwd_gather"), gpu ? "bf16" : "fp32");
    row(f, "all-gathers, backward", num(comm, "bwd_gather"), NULL);
    row(f, "reduce-scatters of gradients", num(comm, "reduce_scatter"), "fp32");
    row(f, "scalars (loss, gradient norm, vote)", num(comm, "scalars"), NULL);
    row(f, "total", num(comm, "sent_per_step"), NULL);
    fprintf(f, "  %-40s %10.4f s  at %g Gbit/s\n", "communication time", num(comm, "comm_s"),
            num(comm, "network_gbit"));
    fprintf(f, "  %-40s %10.4f s  %.3g TFLOP at %g TFLOPS effective\n", "compute time", num(comm, "compute_s"),
            num(comm, "flops_per_step") / 1e12, num(comm, "tflops"));
    fprintf(f, "  %-40s %10.1f %%  (no overlap assumed: an upper bound)\n", "communication fraction",
            100.0 * num(comm, "comm_frac"));

    fprintf(f, "\ncheckpoint: %s per checkpoint (%lld shard files of %s); free space needed: %s (2 checkpoints)\n",
            plan_bytes_str(b, sizeof(b), num(ck, "checkpoint")), integer(plan, "world"),
            plan_bytes_str(b2, sizeof(b2), num(ck, "rank_file")), plan_bytes_str(note, sizeof(note), num(ck, "free_needed")));
}

/* ---- arguments ---------------------------------------------------------- */

static int parse_int(const char *s, int lo, int hi, int *out)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi)
        return -1;
    *out = (int)v;
    return 0;
}

static int parse_num(const char *s, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !isfinite(v))
        return -1;
    *out = v;
    return 0;
}

/* "50M", "50.3M", "1.3B", "124439808": a count with an optional K, M, B (or G), T. */
static int parse_count(const char *s, uint64_t *out)
{
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    double mul = 1;
    if (*end && !end[1]) {
        switch (*end | 0x20) {
        case 'k': mul = 1e3; break;
        case 'm': mul = 1e6; break;
        case 'b':
        case 'g': mul = 1e9; break;
        case 't': mul = 1e12; break;
        default: return -1;
        }
        end++;
    }
    v *= mul;
    if (errno || end == s || *end || !isfinite(v) || v < 1 || v > (double)PLAN_PROG_MAX_PARAMS)
        return -1;
    *out = (uint64_t)(v + 0.5);
    return 0;
}

void ctl_plan_usage(FILE *f)
{
    fputs("usage: musterctl plan [JOB|PRESET] [options]      plan a job before it runs\n"
          "       musterctl plan [--network N] [--tflops X]  the running job's plan beside what it measures\n"
          "what runs:\n"
          "  --parallelism P         muster-train (default: its own ZeRO-3), or the program's: ddp, zero1,\n"
          "                          zero2, zero3 (DeepSpeed ZeRO stages), fsdp (FULL_SHARD = zero3),\n"
          "                          fsdp-grad-op (SHARD_GRAD_OP = zero2)\n"
          "  --params N              the program's parameters (50M, 1.3B, 124439808)\n"
          "  --layers L --d-model H --heads A --vocab V   its transformer shape (parameters and activations)\n"
          "  --precision P           fp32, bf16 or fp16 (mixed, fp32 master weights); programs only\n"
          "  --activation-checkpointing   the program recomputes activations in the backward\n"
          "  --batch N               global batch (sequences per optimizer step)\n"
          "  --micro-batch N         sequences per rank per micro-step\n"
          "  --accum N               micro-steps per optimizer step (gradient accumulation)\n"
          "  --seq-len N             tokens per sequence\n"
          "where it runs:\n"
          "  --nodes N  --gpus-per-node G (= --devices-per-node)  --device cpu|gpu (muster-train)\n"
          "  --device-memory GB      memory of one GPU in GiB (muster-train on cpu: the node's)\n"
          "  --network NET           between nodes: Gbit/s, or 1g, 10g, 25g, 100g, 400g (Ethernet), hdr, ndr\n"
          "                          (InfiniBand); default 10g\n"
          "  --latency US            one hop between nodes, microseconds (default: the preset's)\n"
          "  --intra NET             between the GPUs of a node: nvlink (default), pcie or Gbit/s\n"
          "  --intra-latency US      one hop inside a node\n"
          "how fast:\n"
          "  --step-time S           measured seconds per optimizer step (with --server and no --step-time,\n"
          "                          the running job's own step time)\n"
          "  --tflops X              effective TFLOPS per rank, for the estimate without a step time\n"
          "  --server URL  --json  --help\n"
          "Exit status: 0, 1 when the plan does not fit, 2 on bad input (docs/plan.md).\n",
          f);
}

static int usage(const char *fmt, const char *arg)
{
    fputs("musterctl plan: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\nTry 'musterctl plan --help'.\n", stderr);
    return 2;
}

struct plan_args {
    const char *job;
    int nodes, devices, batch, micro_batch, seq_len, accum;
    int device; /* -1: the job's own (cpu) */
    double mem_gb, gbit, tflops, step_time;
    int have_mem, have_gbit, have_tflops, have_step_time;
    /* a program's */
    const char *program_flag; /* the first flag only a program's plan takes */
    int program;              /* --parallelism names a program's */
    enum plan_par par;
    enum plan_prec prec;
    int have_prec, act_ckpt, layers, d_model, heads, vocab;
    uint64_t params;
    struct plan_link inter, intra;
    int have_inter, have_intra;
    double latency, intra_latency;
    int have_latency, have_intra_latency;
    int server_given;
};

/* flag describes a program's plan (muster-train's refuses it): the first such is named */
static void program_only(struct plan_args *a, const char *flag)
{
    if (!a->program_flag)
        a->program_flag = flag;
}

/* A latency in microseconds; 0, or the usage error's status. */
static int latency_opt(const char *name, const char *v, double *out, int *have)
{
    if (parse_num(v, out) || *out < 0 || *out > 1e6) {
        char fmt[96];
        snprintf(fmt, sizeof(fmt), "%s: expected 0 to 1000000 microseconds, got '%%s'", name);
        return usage(fmt, v);
    }
    *have = 1;
    return 0;
}

/* An option whose value is an int in [lo, hi]; 1 when argv[*i] was it, -1 on a bad value. */
static int int_opt(int argc, char **argv, int *i, const char *name, int lo, int hi, int *out, int *missing, int *rc)
{
    const char *v = ctl_option_value(argc, argv, i, name, missing);
    if (!v)
        return 0;
    if (parse_int(v, lo, hi, out)) {
        char fmt[128];
        snprintf(fmt, sizeof(fmt), "%s: expected %d to %d, got '%%s'", name, lo, hi);
        *rc = usage(fmt, v);
        return -1;
    }
    return 1;
}

static int parse_args(int argc, char **argv, struct plan_args *a, int *json, const char **server)
{
    memset(a, 0, sizeof(*a));
    a->device = -1;
    plan_link_parse("10g", &a->inter);
    plan_link_parse("nvlink", &a->intra);
    int seen_cmd = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0, rc = 0, r;
        const char *v;
        if (strcmp(argv[i], "plan") == 0 && !seen_cmd) {
            seen_cmd = 1;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            ctl_plan_usage(stdout);
            return -1;
        } else if (strcmp(argv[i], "--json") == 0) {
            *json = 1;
        } else if (strcmp(argv[i], "--activation-checkpointing") == 0) {
            a->act_ckpt = 1;
            program_only(a, argv[i]);
        } else if ((v = ctl_option_value(argc, argv, &i, "--server", &missing))) {
            *server = v;
            a->server_given = 1;
        } else if (ctl_option_value(argc, argv, &i, "--admin-token-file", &missing)) {
            continue; /* musterctl's option; plan reads nothing that needs it */
        } else if ((r = int_opt(argc, argv, &i, "--nodes", 1, PLAN_MAX_NODES, &a->nodes, &missing, &rc)) ||
                   (r = int_opt(argc, argv, &i, "--devices-per-node", 1, PLAN_MAX_DEVICES, &a->devices, &missing,
                                &rc)) ||
                   (r = int_opt(argc, argv, &i, "--gpus-per-node", 1, PLAN_MAX_DEVICES, &a->devices, &missing, &rc)) ||
                   (r = int_opt(argc, argv, &i, "--batch", 1, PLAN_MAX_BATCH, &a->batch, &missing, &rc)) ||
                   (r = int_opt(argc, argv, &i, "--micro-batch", 1, 65536, &a->micro_batch, &missing, &rc)) ||
                   (r = int_opt(argc, argv, &i, "--seq-len", 1, 1048576, &a->seq_len, &missing, &rc)) ||
                   (r = int_opt(argc, argv, &i, "--accum", 1, 1000000, &a->accum, &missing, &rc))) {
            if (r < 0)
                return rc;
        } else if ((r = int_opt(argc, argv, &i, "--layers", 1, 100000, &a->layers, &missing, &rc)) ||
                   (r = int_opt(argc, argv, &i, "--d-model", 1, 1048576, &a->d_model, &missing, &rc)) ||
                   (r = int_opt(argc, argv, &i, "--heads", 1, 65536, &a->heads, &missing, &rc)) ||
                   (r = int_opt(argc, argv, &i, "--vocab", 1, 16777216, &a->vocab, &missing, &rc))) {
            if (r < 0)
                return rc;
            program_only(a, argv[i - (strchr(argv[i], '=') ? 0 : 1)]);
        } else if ((v = ctl_option_value(argc, argv, &i, "--parallelism", &missing))) {
            if (strcmp(v, "muster-train") == 0)
                a->program = 0;
            else if (plan_par_parse(v, &a->par))
                return usage("--parallelism: expected muster-train, ddp, zero1, zero2, zero3, fsdp or fsdp-grad-op, "
                             "got '%s'", v);
            else
                a->program = 1;
        } else if ((v = ctl_option_value(argc, argv, &i, "--precision", &missing))) {
            if (plan_prec_parse(v, &a->prec))
                return usage("--precision: expected fp32, bf16 or fp16, got '%s'", v);
            a->have_prec = 1;
            program_only(a, "--precision");
        } else if ((v = ctl_option_value(argc, argv, &i, "--params", &missing))) {
            if (parse_count(v, &a->params))
                return usage("--params: expected a parameter count from 1 to 10^15 (50M, 1.3B, 124439808), got '%s'", v);
            program_only(a, "--params");
        } else if ((v = ctl_option_value(argc, argv, &i, "--device", &missing))) {
            if (strcmp(v, "cpu") && strcmp(v, "gpu"))
                return usage("--device: expected cpu or gpu, got '%s'", v);
            a->device = strcmp(v, "gpu") == 0 ? PLAN_GPU : PLAN_CPU;
        } else if ((v = ctl_option_value(argc, argv, &i, "--device-memory", &missing))) {
            /* below 0.001 GiB (1 MiB) the bytes would round to 0, which the plan reads as unknown */
            if (parse_num(v, &a->mem_gb) || a->mem_gb < 0.001 || a->mem_gb > 1e6)
                return usage("--device-memory: expected GiB from 0.001 to 1000000, got '%s'", v);
            a->have_mem = 1;
        } else if ((v = ctl_option_value(argc, argv, &i, "--network", &missing))) {
            if (plan_link_parse(v, &a->inter))
                return usage("--network: expected Gbit/s from 0.001 (1 Mbit/s) to 100000, or one of 1g, 10g, 25g, "
                             "100g, 400g, hdr, ndr, got '%s'", v);
            a->gbit = a->inter.gbit;
            a->have_gbit = a->have_inter = 1;
        } else if ((v = ctl_option_value(argc, argv, &i, "--intra", &missing))) {
            if (plan_link_parse(v, &a->intra))
                return usage("--intra: expected nvlink, pcie or Gbit/s from 0.001 to 100000, got '%s'", v);
            a->have_intra = 1;
            program_only(a, "--intra");
        } else if ((v = ctl_option_value(argc, argv, &i, "--latency", &missing))) {
            if ((rc = latency_opt("--latency", v, &a->latency, &a->have_latency)))
                return rc;
            program_only(a, "--latency");
        } else if ((v = ctl_option_value(argc, argv, &i, "--intra-latency", &missing))) {
            if ((rc = latency_opt("--intra-latency", v, &a->intra_latency, &a->have_intra_latency)))
                return rc;
            program_only(a, "--intra-latency");
        } else if ((v = ctl_option_value(argc, argv, &i, "--tflops", &missing))) {
            if (parse_num(v, &a->tflops) || a->tflops < PLAN_MIN_TFLOPS || a->tflops > PLAN_MAX_TFLOPS)
                return usage("--tflops: expected effective TFLOPS per rank from 0.000001 to 100000, got '%s'", v);
            a->have_tflops = 1;
        } else if ((v = ctl_option_value(argc, argv, &i, "--step-time", &missing))) {
            if (parse_num(v, &a->step_time) || a->step_time <= 0 || a->step_time > 1e6)
                return usage("--step-time: expected seconds per optimizer step above 0 and up to 1000000, got '%s'",
                             v);
            a->have_step_time = 1;
            program_only(a, "--step-time");
        } else if (missing) {
            return usage("option '%s' needs a value", argv[i]);
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            return usage("unknown option '%s'", argv[i]);
        } else if (!a->job) {
            a->job = argv[i];
        } else {
            return usage("one JOB only (got another: '%s')", argv[i]);
        }
    }
    return 0;
}

/* The spec of JOB: a job spec file, or else a preset name with the defaults
 * (*preset set). */
static int load_job(const char *job, struct job_spec *spec, int *preset)
{
    char err[1024];
    struct stat st;
    *preset = 0;
    if (stat(job, &st) == 0) {
        if (job_spec_load(job, spec, NULL, err, sizeof(err))) {
            fprintf(stderr, "musterctl plan: %s\n", err);
            return 2;
        }
        return 0;
    }
    struct gpt_config cfg;
    if (strchr(job, '/') || strstr(job, ".json") || gpt_preset(job, &cfg)) {
        fprintf(stderr,
                "musterctl plan: %s: no such job file, and not a model preset (expected a job spec file or "
                "one of %s)\n",
                job, gpt_preset_list());
        return 2;
    }
    job_spec_defaults(spec);
    snprintf(spec->model, sizeof(spec->model), "%s", job);
    spec->shape_given = 1;
    *preset = 1;
    return 0;
}

static void print_doc(json_t *doc, int json, void (*render)(FILE *, const json_t *))
{
    if (json) {
        char *text = json_dumps(doc, JSON_COMPACT);
        printf("%s\n", text);
        free(text);
    } else {
        render(stdout, doc);
    }
}

/* The global batch that accum micro-steps of *micro sequences on ranks ranks
 * make, at most a job's batch (1048576); with --batch too the two must
 * agree, and a *micro of 0 is what they imply. 0, or the usage status. */
static int accum_batch(const struct plan_args *a, int accum, int *micro, int ranks, int *batch)
{
    char msg[320];
    const long long steps = (long long)accum * ranks; /* sequences per step per sequence of micro-batch */
    if (!*micro && a->batch) {
        if (a->batch % steps) {
            snprintf(msg, sizeof(msg), "--batch %d does not split into %d micro-steps over %d ranks: give a multiple "
                     "of %lld", a->batch, accum, ranks, steps);
            return usage("%s", msg);
        }
        *micro = (int)(a->batch / steps);
    }
    const long long b = steps * *micro;
    if (b > PLAN_MAX_BATCH) {
        snprintf(msg, sizeof(msg), "accum %d x micro_batch %d x %d ranks = %lld sequences per step: expected at "
                 "most %d (a job's batch); give a smaller --accum or --micro-batch", accum, *micro, ranks, b,
                 PLAN_MAX_BATCH);
        return usage("%s", msg);
    }
    if (a->batch && a->batch != b) {
        snprintf(msg, sizeof(msg), "--batch %d disagrees with --accum %d x micro_batch %d x %d ranks = %lld: give "
                 "one of --batch and --accum, or figures that agree", a->batch, accum, *micro, ranks, b);
        return usage("%s", msg);
    }
    *batch = (int)b;
    return 0;
}

static int plan_local(const struct plan_args *a, int json)
{
    if (a->program_flag)
        return usage("%s describes a program's plan: give --parallelism ddp, zero1, zero2, zero3 or fsdp "
                     "(muster-train computes in bf16 on GPUs and fp32 on CPUs, with its own model presets)",
                     a->program_flag);
    struct job_spec spec;
    int preset, rc = load_job(a->job, &spec, &preset);
    if (rc)
        return rc;
    if (a->batch)
        spec.batch = a->batch;
    if (a->micro_batch)
        spec.micro_batch = a->micro_batch;
    if (a->seq_len)
        spec.seq_len = a->seq_len;
    struct plan_input in;
    char err[1024];
    if (plan_input_from_spec(&in, &spec, err, sizeof(err))) {
        fprintf(stderr, "musterctl plan: %s\n", err);
        return 2;
    }
    if (a->nodes)
        in.nodes = a->nodes;
    if (a->devices)
        in.devices_per_node = a->devices;
    if (a->accum) { /* muster-train splits its global batch: batch = accum x micro_batch x ranks */
        int micro = spec.micro_batch;
        if (!micro && !a->batch)
            return usage("%s", "--accum: muster-train derives accumulation from batch / (micro_batch x ranks): give "
                               "--micro-batch too, or --batch");
        if ((rc = accum_batch(a, a->accum, &micro, in.nodes * in.devices_per_node, &in.batch)))
            return rc;
        in.micro_batch = micro;
    }
    in.device = a->device < 0 ? PLAN_CPU : (enum plan_device)a->device;
    in.tflops = a->have_tflops ? a->tflops : in.device == PLAN_GPU ? PLAN_DEFAULT_TFLOPS_GPU : PLAN_DEFAULT_TFLOPS_CPU;
    if (a->have_gbit)
        in.network_gbit = a->gbit;
    if (a->have_mem)
        in.device_mem = (uint64_t)(a->mem_gb * 1024.0 * 1024.0 * 1024.0);
    if (spec.data[0]) {
        struct preflight_data d;
        if (preflight_data_tokens(spec.data, &d) == 0)
            in.data_tokens = d.tokens;
    }
    struct plan p;
    if (plan_compute(&in, &p, err, sizeof(err))) {
        fprintf(stderr, "musterctl plan: %s\n", err);
        return 2;
    }
    json_t *doc = plan_json(&p, spec.model);
    print_doc(doc, json, render_plan);
    json_decref(doc);
    return p.fits == 0 ? 1 : 0;
}

/* The running job's step time (GET /v1/status: the slowest rank's step_s, or
 * else the median of the steps musterd saw), or 0 when it has none. */
static double measured_step_time(const char *server, ctl_get_fn get, void *ctx)
{
    json_t *st = get(ctx, server, "/v1/status");
    const char *state = json_string_value(json_object_get(st, "state"));
    double s = 0;
    if (state && strcmp(state, "running") == 0) {
        s = json_number_value(json_object_get(st, "step_s"));
        if (!(s > 0))
            s = json_number_value(json_object_get(json_object_get(st, "progress_timeout"), "median_step_s"));
    }
    json_decref(st);
    return s > 0 ? s : 0;
}

static int plan_program(const struct plan_args *a, int json, const char *server, ctl_get_fn get, void *ctx)
{
    struct plan_prog_input in;
    char err[1024];
    const int nodes = a->nodes ? a->nodes : 1, gpus = a->devices ? a->devices : 1;
    if (a->device == PLAN_CPU)
        return usage("%s", "--device cpu: a program's plan is for GPUs (muster-train plans cpu ranks)");
    if (a->job) {
        struct job_spec spec;
        int preset, rc = load_job(a->job, &spec, &preset);
        if (rc)
            return rc;
        /* a muster-train spec's model is meaningful: plan it as this program */
        if (strcmp(spec.parallelism, "muster-train") == 0)
            spec.shape_given = 1;
        snprintf(spec.parallelism, sizeof(spec.parallelism), "%s", plan_par_name(a->par));
        if (a->batch)
            spec.batch = a->batch;
        if (a->micro_batch)
            spec.micro_batch = a->micro_batch;
        if (a->seq_len)
            spec.seq_len = a->seq_len;
        const int spec_nodes = a->nodes ? a->nodes : spec.nodes;
        if (a->accum || (preset && !a->batch)) { /* the global batch that many micro-steps make (a preset: 1) */
            if (!a->batch && !spec.micro_batch)
                spec.micro_batch = 1;
            if ((rc = accum_batch(a, a->accum ? a->accum : 1, &spec.micro_batch, spec_nodes * gpus, &spec.batch)))
                return rc;
        }
        if (plan_prog_input_from_spec(&in, &spec, spec_nodes, gpus, err, sizeof(err))) {
            fprintf(stderr, "musterctl plan: %s\n", err);
            return 2;
        }
        if (a->have_prec)
            in.prec = a->prec;
    } else {
        memset(&in, 0, sizeof(in));
        in.prec = PLAN_BF16;
        in.seq_len = 1024;
        in.micro_batch = 1;
        in.accum = 1;
        in.nodes = nodes;
        in.gpus_per_node = gpus;
        in.tflops = PLAN_DEFAULT_TFLOPS_GPU;
        if (a->have_prec)
            in.prec = a->prec;
        if (a->seq_len)
            in.seq_len = a->seq_len;
        if (a->micro_batch)
            in.micro_batch = a->micro_batch;
        if (a->batch && a->accum) {
            int micro = a->micro_batch, batch, rc = accum_batch(a, a->accum, &micro, nodes * gpus, &batch);
            if (rc)
                return rc;
            in.micro_batch = micro;
        } else if (a->batch) {
            struct batch_plan bp;
            if (batch_plan(a->batch, a->micro_batch, nodes * gpus, &bp, err, sizeof(err))) {
                fprintf(stderr, "musterctl plan: --batch: %s\n", err);
                return 2;
            }
            in.micro_batch = bp.micro_batch;
            in.accum = bp.accum;
        }
    }
    /* the flags given override the JOB's figures */
    in.par = a->par;
    in.params = a->params ? a->params : in.params;
    in.layers = a->layers ? a->layers : in.layers;
    in.d_model = a->d_model ? a->d_model : in.d_model;
    in.heads = a->heads ? a->heads : in.heads;
    in.vocab = a->vocab ? a->vocab : in.vocab;
    in.accum = a->accum ? a->accum : in.accum;
    in.act_ckpt |= a->act_ckpt;
    in.inter = a->inter;
    in.intra = a->intra;
    in.inter.latency_us = a->have_latency ? a->latency : in.inter.latency_us;
    in.intra.latency_us = a->have_intra_latency ? a->intra_latency : in.intra.latency_us;
    in.gpu_mem = a->have_mem ? (uint64_t)(a->mem_gb * 1024.0 * 1024.0 * 1024.0) : in.gpu_mem;
    in.tflops = a->have_tflops ? a->tflops : in.tflops;
    int measured = 0;
    if (a->have_step_time)
        in.step_time = a->step_time;
    else if (a->server_given && (in.step_time = measured_step_time(server, get, ctx)) > 0)
        measured = 1;
    struct plan_prog p;
    if (plan_prog_compute(&in, &p, err, sizeof(err))) {
        fprintf(stderr, "musterctl plan: %s\n", err);
        return 2;
    }
    json_t *doc = plan_prog_json(&p);
    json_object_set_new(doc, "step_time_measured", json_boolean(measured));
    print_doc(doc, json, render_plan_prog);
    json_decref(doc);
    return p.fits == 0 ? 1 : 0;
}

/* The running job's plan: either kind, beside what its ranks measure. */
static void render_running(FILE *f, const json_t *doc)
{
    const json_t *plan = json_object_get(doc, "plan");
    const char *kind = json_string_value(json_object_get(plan, "kind"));
    if (!json_is_object(plan)) {
        const char *note = json_string_value(json_object_get(doc, "plan_note"));
        fprintf(f, "no plan: %s\n", note ? note : "musterd has none");
        return;
    }
    if (kind && strcmp(kind, "program") == 0)
        render_plan_prog(f, plan);
    else
        render_plan(f, plan);
    render_plan_measured(f, doc);
}

int ctl_plan_main(int argc, char **argv, const char *server, ctl_get_fn get, void *get_ctx)
{
    struct plan_args a;
    int json = 0;
    int rc = parse_args(argc, argv, &a, &json, &server);
    if (rc)
        return rc < 0 ? 0 : rc;
    if (a.program)
        return plan_program(&a, json, server, get, get_ctx);
    if (a.job)
        return plan_local(&a, json);
    if (a.nodes || a.devices || a.have_mem || a.batch || a.micro_batch || a.seq_len || a.device >= 0 || a.accum ||
        a.program_flag)
        return usage("%s", "the running job's plan takes its shape from musterd and the job spec: give a JOB, or "
                           "--parallelism and the program's figures, to plan another");
    char path[128];
    int n = snprintf(path, sizeof(path), "/v1/plan");
    if (a.have_gbit)
        n += snprintf(path + n, sizeof(path) - (size_t)n, "?network_gbit=%g", a.gbit);
    if (a.have_tflops)
        snprintf(path + n, sizeof(path) - (size_t)n, "%stflops=%g", a.have_gbit ? "&" : "?", a.tflops);
    json_t *doc = get(get_ctx, server, path);
    if (!doc)
        return 1;
    print_doc(doc, json, render_running);
    json_decref(doc);
    return 0;
}

/* One "predicted | measured" line; a measured figure of null is "not yet". */
static void versus(FILE *f, const char *what, const json_t *pred, const json_t *meas, int percent)
{
    char a[32], b[32];
    if (percent) {
        snprintf(a, sizeof(a), "%.1f %%", 100.0 * json_number_value(pred));
        snprintf(b, sizeof(b), "%.1f %%", 100.0 * json_number_value(meas));
    } else {
        plan_bytes_str(a, sizeof(a), json_number_value(pred));
        plan_bytes_str(b, sizeof(b), json_number_value(meas));
    }
    fprintf(f, "  %-40s %12s  %12s\n", what, json_is_number(pred) ? a : "-", json_is_number(meas) ? b : "not yet");
}

void render_plan_measured(FILE *f, const json_t *doc)
{
    const json_t *plan = json_object_get(doc, "plan"), *m = json_object_get(doc, "measured");
    const json_t *mem = json_object_get(plan, "memory"), *comm = json_object_get(plan, "comm");
    fprintf(f, "\npredicted beside measured (largest over the running ranks)\n");
    fprintf(f, "  %-40s %12s  %12s\n", "", "predicted", "measured");
    versus(f, "communication fraction", json_object_get(comm, "comm_frac"), json_object_get(m, "comm_frac"), 1);
    versus(f, "bytes sent per step", json_object_get(comm, "sent_per_step"), json_object_get(m, "sent_per_step"), 0);
    versus(f, "peak memory of a rank", json_object_get(mem, "peak"), json_object_get(m, "peak_mem"), 0);
}
