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

#include "common/plan.h"
#include "common/preflight.h"
#include "ctl/ctl_args.h"

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

    fprintf(f, "\ncommunication of one rank per step (sent; it receives as much)\n");
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

static int usage(const char *fmt, const char *arg)
{
    fputs("musterctl plan: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\nusage: musterctl plan [JOB|PRESET] [--nodes N] [--devices-per-node G] [--device cpu|gpu]\n"
          "       [--device-memory GB] [--network GBIT] [--tflops X] [--batch N] [--micro-batch N]\n"
          "       [--seq-len N] [--json]\n",
          stderr);
    return 2;
}

struct plan_args {
    const char *job;
    int nodes, devices, batch, micro_batch, seq_len;
    int device; /* -1: the job's own (cpu) */
    double mem_gb, gbit, tflops;
    int have_mem, have_gbit, have_tflops;
};

static int parse_args(int argc, char **argv, struct plan_args *a, int *json, const char **server)
{
    memset(a, 0, sizeof(*a));
    a->device = -1;
    int seen_cmd = 0;
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (strcmp(argv[i], "plan") == 0 && !seen_cmd) {
            seen_cmd = 1;
        } else if (strcmp(argv[i], "--json") == 0) {
            *json = 1;
        } else if ((v = ctl_option_value(argc, argv, &i, "--server", &missing))) {
            *server = v;
        } else if (ctl_option_value(argc, argv, &i, "--admin-token-file", &missing)) {
            continue; /* musterctl's option; plan reads nothing that needs it */
        } else if ((v = ctl_option_value(argc, argv, &i, "--nodes", &missing))) {
            if (parse_int(v, 1, PLAN_MAX_NODES, &a->nodes))
                return usage("--nodes: expected 1 to 4096, got '%s'", v);
        } else if ((v = ctl_option_value(argc, argv, &i, "--devices-per-node", &missing))) {
            if (parse_int(v, 1, PLAN_MAX_DEVICES, &a->devices))
                return usage("--devices-per-node: expected 1 to 64, got '%s'", v);
        } else if ((v = ctl_option_value(argc, argv, &i, "--device", &missing))) {
            if (strcmp(v, "cpu") && strcmp(v, "gpu"))
                return usage("--device: expected cpu or gpu, got '%s'", v);
            a->device = strcmp(v, "gpu") == 0 ? PLAN_GPU : PLAN_CPU;
        } else if ((v = ctl_option_value(argc, argv, &i, "--device-memory", &missing))) {
            if (parse_num(v, &a->mem_gb) || a->mem_gb <= 0 || a->mem_gb > 1e6)
                return usage("--device-memory: expected GiB above 0 and up to 1000000, got '%s'", v);
            a->have_mem = 1;
        } else if ((v = ctl_option_value(argc, argv, &i, "--network", &missing))) {
            if (parse_num(v, &a->gbit) || a->gbit < PLAN_MIN_GBIT || a->gbit > PLAN_MAX_GBIT)
                return usage("--network: expected Gbit/s from 0.001 (1 Mbit/s) to 100000, got '%s'", v);
            a->have_gbit = 1;
        } else if ((v = ctl_option_value(argc, argv, &i, "--tflops", &missing))) {
            if (parse_num(v, &a->tflops) || a->tflops < PLAN_MIN_TFLOPS || a->tflops > PLAN_MAX_TFLOPS)
                return usage("--tflops: expected effective TFLOPS per rank from 0.000001 to 100000, got '%s'", v);
            a->have_tflops = 1;
        } else if ((v = ctl_option_value(argc, argv, &i, "--batch", &missing))) {
            if (parse_int(v, 1, 1048576, &a->batch))
                return usage("--batch: expected 1 to 1048576, got '%s'", v);
        } else if ((v = ctl_option_value(argc, argv, &i, "--micro-batch", &missing))) {
            if (parse_int(v, 1, 65536, &a->micro_batch))
                return usage("--micro-batch: expected 1 to 65536, got '%s'", v);
        } else if ((v = ctl_option_value(argc, argv, &i, "--seq-len", &missing))) {
            if (parse_int(v, 1, GPT_MAX_CONTEXT, &a->seq_len))
                return usage("--seq-len: expected 1 to 65536, got '%s'", v);
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

/* The spec of JOB: a job spec file, or else a preset name with the defaults. */
static int load_job(const char *job, struct job_spec *spec)
{
    char err[1024];
    struct stat st;
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
    return 0;
}

static int plan_local(const struct plan_args *a, int json)
{
    struct job_spec spec;
    int rc = load_job(a->job, &spec);
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
    if (json) {
        char *text = json_dumps(doc, JSON_COMPACT);
        printf("%s\n", text);
        free(text);
    } else {
        render_plan(stdout, doc);
    }
    json_decref(doc);
    return p.fits == 0 ? 1 : 0;
}

int ctl_plan_main(int argc, char **argv, const char *server, ctl_get_fn get, void *get_ctx)
{
    struct plan_args a;
    int json = 0;
    int rc = parse_args(argc, argv, &a, &json, &server);
    if (rc)
        return rc;
    if (a.job)
        return plan_local(&a, json);
    if (a.nodes || a.devices || a.have_mem || a.batch || a.micro_batch || a.seq_len || a.device >= 0)
        return usage("%s", "the running job's plan takes its nodes, devices and batch from musterd: give a JOB "
                           "to plan another shape");
    char path[128];
    int n = snprintf(path, sizeof(path), "/v1/plan");
    if (a.have_gbit)
        n += snprintf(path + n, sizeof(path) - (size_t)n, "?network_gbit=%g", a.gbit);
    if (a.have_tflops)
        snprintf(path + n, sizeof(path) - (size_t)n, "%stflops=%g", a.have_gbit ? "&" : "?", a.tflops);
    json_t *doc = get(get_ctx, server, path);
    if (!doc)
        return 1;
    if (json) {
        char *text = json_dumps(doc, JSON_COMPACT);
        printf("%s\n", text);
        free(text);
    } else {
        render_plan(stdout, json_object_get(doc, "plan"));
        render_plan_measured(stdout, doc);
    }
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
