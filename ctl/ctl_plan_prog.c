/*
 * ctl_plan_prog: the table of a program's plan (common/plan_prog.h's JSON,
 * "kind": "program"): memory per GPU by the ZeRO formulas, the bytes of a
 * gradient sync and of an optimizer step, and the time in communication.
 * Traffic is shown in decimal MB (10^6 bytes, as link speeds are counted),
 * memory in GiB (as GPUs are sized).
 */
#include "ctl/ctl_plan.h"

#include <string.h>

#include "common/plan.h"
#include "common/plan_prog.h"

static double num(const json_t *o, const char *key) { return json_number_value(json_object_get(o, key)); }
static long long integer(const json_t *o, const char *key) { return json_integer_value(json_object_get(o, key)); }

static void mem_row(FILE *f, const char *what, double bytes, const char *note)
{
    char b[32];
    fprintf(f, "  %-34s %12s  %s\n", what, plan_bytes_str(b, sizeof(b), bytes), note);
}

static void net_row(FILE *f, const char *what, double bytes, const char *note)
{
    fprintf(f, "  %-34s %9.1f MB%s%s\n", what, bytes / 1e6, *note ? "  " : "", note);
}

/* Per parameter: the ZeRO paper's bytes of weights + gradients + optimizer state at this stage. */
static void zero_formula(char *out, size_t len, int stage, int fp32)
{
    const int w = fp32 ? 4 : 2, k = fp32 ? 8 : 12;
    switch (stage) {
    case 0: snprintf(out, len, "%d + %d + %d = %d B per parameter", w, w, k, 2 * w + k); break;
    case 1: snprintf(out, len, "%d + %d/N B per parameter", 2 * w, k); break;
    case 2: snprintf(out, len, "%d + %d/N B per parameter", w, w + k); break;
    default: snprintf(out, len, "%d/N B per parameter", 2 * w + k); break;
    }
}

static const char *sync_note(const char *par, int stage)
{
    if (stage == 0)
        return "once per optimizer step: DDP under no_sync() for the micro-steps before the last "
               "(without no_sync it all-reduces every micro-step)";
    if (stage == 1)
        return "once per optimizer step: DeepSpeed ZeRO-1 reduces at the accumulation boundary";
    if (stage == 2)
        return strcmp(par, "fsdp-grad-op") == 0
                   ? "every micro-step: FSDP reduce-scatters each backward's gradients into the shards"
                   : "every micro-step: ZeRO-2 reduce-scatters each backward into the gradient partition "
                     "(DeepSpeed refuses no_sync at stage 2)";
    return "every micro-step: ZeRO-3/FSDP gathers the parameters in forward and backward and "
           "reduce-scatters the gradients, micro-step by micro-step";
}

void render_plan_prog(FILE *f, const json_t *plan)
{
    const json_t *mem = json_object_get(plan, "memory"), *comm = json_object_get(plan, "comm"),
                 *shape = json_object_get(plan, "shape");
    const char *par = json_string_value(json_object_get(plan, "parallelism"));
    const char *prec = json_string_value(json_object_get(plan, "precision"));
    const int stage = (int)integer(plan, "zero_stage"), fp32 = prec && strcmp(prec, "fp32") == 0;
    const long long world = integer(plan, "world"), accum = integer(plan, "accum");
    const double params = num(plan, "params");
    char note[256], b[32];

    fprintf(f, "plan: %s, %s%s, %.2f M parameters on %lld node%s x %lld GPU%s = %lld rank%s\n", par ? par : "?",
            prec ? prec : "?", fp32 ? "" : " (mixed, fp32 master weights)", params / 1e6, integer(plan, "nodes"),
            integer(plan, "nodes") == 1 ? "" : "s", integer(plan, "gpus_per_node"),
            integer(plan, "gpus_per_node") == 1 ? "" : "s", world, world == 1 ? "" : "s");
    fprintf(f, "micro_batch %lld x seq_len %lld per GPU, %lld micro-step%s per optimizer step\n",
            integer(plan, "micro_batch"), integer(plan, "seq_len"), accum, accum == 1 ? "" : "s");
    const long long L = integer(shape, "layers"), h = integer(shape, "d_model"), V = integer(shape, "vocab");
    if (L > 0 && h > 0 && V > 0) { /* --params beside a shape: say which counts what when they differ */
        const double of_shape = (double)plan_prog_params((int)L, (int)h, (int)V, (int)integer(plan, "seq_len"));
        if (of_shape != params)
            fprintf(f, "(params %.2f M count the memory and traffic; the shape, %lld layers x d_model %lld x "
                       "vocab %lld = %.2f M, the activations)\n", params / 1e6, L, h, V, of_shape / 1e6);
    }
    fputc('\n', f);

    zero_formula(note, sizeof(note), stage, fp32);
    fprintf(f, "memory of one GPU (ZeRO: %s, N = %lld)\n", note, world);
    snprintf(note, sizeof(note), "%d B x params%s", fp32 ? 4 : 2, stage >= 3 ? " / N" : "");
    mem_row(f, "weights", num(mem, "weights"), note);
    snprintf(note, sizeof(note), "%d B x params%s", fp32 ? 4 : 2, stage >= 2 ? " / N" : "");
    mem_row(f, "gradients", num(mem, "gradients"), note);
    snprintf(note, sizeof(note), "%s x params%s", fp32 ? "8 B (Adam's 2 moments)" : "12 B (fp32 master, 2 moments)",
             stage >= 1 ? " / N" : "");
    mem_row(f, "optimizer state (Adam)", num(mem, "optimizer"), note);
    if (integer(shape, "heads") > 0) {
        snprintf(note, sizeof(note), "micro_batch %lld x %s per sequence%s", integer(plan, "micro_batch"),
                 plan_bytes_str(b, sizeof(b), num(mem, "activations_per_seq")),
                 json_is_true(json_object_get(plan, "activation_checkpointing")) ? ", checkpointed" : "");
        mem_row(f, "activations", num(mem, "activations"), note);
        fprintf(f, "  %-34s %12s  %s\n", "", "",
                json_is_true(json_object_get(plan, "activation_checkpointing"))
                    ? "(per layer 2·s·h kept, one layer's s·h·(34 + 5·a·s/h) recomputed, + 4·s·V logits)"
                    : "(per layer s·h·(34 + 5·a·s/h) in 16 bits, Korthikanti et al. 2022, + 4·s·V logits)");
    } else {
        fprintf(f, "  %-34s %12s  %s\n", "activations", "unknown",
                "give --layers, --d-model, --heads and --vocab (or a preset) to count them");
    }
    mem_row(f, "predicted peak", num(mem, "peak"), "(not counted: CUDA context, allocator slack, buffers)");
    const json_t *dm = json_object_get(mem, "device_memory");
    if (json_is_integer(dm)) {
        mem_row(f, "GPU memory", (double)json_integer_value(dm),
                json_is_true(json_object_get(mem, "fits")) ? "fits" : "DOES NOT FIT");
        const json_t *mm = json_object_get(mem, "max_micro_batch");
        if (json_integer_value(mm) > 0)
            fprintf(f, "  %-34s %12lld\n", "largest micro_batch that fits", (long long)json_integer_value(mm));
        else if (json_is_integer(mm))
            fprintf(f, "  %-34s %12s  %s\n", "largest micro_batch that fits", "none",
                    "even micro_batch 1 does not fit: shard more (zero2, zero3), checkpoint activations or add GPUs");
    } else {
        fprintf(f, "  %-34s %12s  %s\n", "GPU memory", "unknown", "--device-memory GB to check the fit");
    }

    fprintf(f, "\ncommunication of one GPU (ring collectives; it receives as much as it sends)\n");
    snprintf(note, sizeof(note), "%.2f M x %d B (%s)", params / 1e6, fp32 ? 4 : 2, prec ? prec : "?");
    net_row(f, "gradients of one sync", num(comm, "gradient_bytes"), note);
    snprintf(note, sizeof(note), "%s; sent + received = %.1f MB moved per GPU",
             stage == 0 ? "all-reduce: 2(N-1)/N x gradients" : "reduce-scatter: (N-1)/N x gradients",
             2 * num(comm, "sync_sent") / 1e6);
    net_row(f, "one gradient sync, sent", num(comm, "sync_sent"), note);
    fprintf(f, "  %-34s %12lld  %s\n", "gradient syncs per optimizer step", integer(comm, "syncs_per_step"),
            sync_note(par ? par : "", stage));
    if (stage >= 1)
        net_row(f, "parameter all-gathers per step", num(comm, "gather_sent"),
                stage >= 3 ? "2 per micro-step (forward, backward), (N-1)/N x weights each"
                           : "1, of the updated weights: (N-1)/N x weights");
    net_row(f, "sent per optimizer step", num(comm, "sent_per_step"), "");
    const int multi = integer(plan, "nodes") > 1;
    snprintf(note, sizeof(note), "over the %s at %g Gbit/s, %lld hops x %g us", multi ? "network" : "intra-node link",
             num(comm, multi ? "network_gbit" : "intra_gbit"), integer(comm, "ring_steps"),
             num(comm, multi ? "latency_us" : "intra_latency_us"));
    fprintf(f, "  %-34s %10.3f s  %s\n", "communication time per step", num(comm, "comm_s"), note);
    const json_t *st = json_object_get(comm, "step_time");
    if (json_is_number(st)) {
        fprintf(f, "  %-34s %10.3f s  %s\n", "step time", json_number_value(st),
                json_is_true(json_object_get(plan, "step_time_measured")) ? "measured by the running job"
                                                                           : "given (--step-time)");
        if (json_is_true(json_object_get(comm, "comm_over_step")))
            fprintf(f, "  %-34s %12s  %s\n", "communication fraction", "> 100 %",
                    "the predicted communication exceeds the step: the link is faster than given, or "
                    "the program does not sync as planned");
        else
            fprintf(f, "  %-34s %10.1f %%  of the step (communication not hidden behind compute)\n",
                    "communication fraction", 100.0 * num(comm, "comm_frac"));
    } else {
        fprintf(f, "  %-34s %10.3f s  %.3g TFLOP at %g TFLOPS effective (estimate: give --step-time)\n",
                "compute time per step", num(comm, "compute_s"), num(comm, "flops_per_step") / 1e12,
                num(comm, "tflops"));
        fprintf(f, "  %-34s %10.1f %%  (no overlap assumed: an upper bound)\n", "communication fraction",
                100.0 * num(comm, "comm_frac"));
    }
}
