/*
 * gpu-check: the GPU path (worker/train/gpu/) against the CPU reference. Needs a
 * CUDA device; without one it says "no GPU: skipped" and exits 0, or 1 when
 * REQUIRE_GPU=1. Usage: gpu-check DATA_FILE (a text file for `small`).
 *
 *   1. tiny forward and backward, same weights and batch, GPU vs CPU:
 *      loss within 2e-2 relative; every tensor's gradient within 5e-2 in
 *      normalised L2 (|g_gpu - g_cpu| / |g_cpu|); again with a vocabulary
 *      of 129, which the GPU's head pads to 192 (gpu.h GPU_VOCAB_ALIGN):
 *      the padding's logits leaking into the softmax would move the loss by
 *      ~8% (log(192/129) over ~ln(129)) and every gradient with it; padded
 *      head rows left unset (NaN under cuemu) would make them NaN. Why these bounds: the GPU
 *      rounds weights and matrix-product inputs to bf16 (8 bits of mantissa,
 *      relative rounding 2^-9 = 2e-3 per value); through ~10 chained
 *      products and the softmax the errors add up to about 1e-2 on the
 *      gradients, measured on random inputs; fp32 throughout would sit at
 *      1e-5. A layout or indexing bug gives errors of order 1.
 *   2. `small` (or --train-model), 50 steps (or --train-steps) of training
 *      from the same seed on the same data, two micro-steps per step:
 *      the mean loss of the last 10 steps on the GPU within 5% of the CPU's
 *      (--curve-bound; under cuemu, with no atomics reordering, 0.5%: an
 *      input staged too early moved it 1.7%), and both below the first
 *      step's loss by at least 0.5 nats.
 *   3. NCCL world 1 through the whole ZeRO-3 path (all-gather of bf16 units,
 *      reduce-scatter of fp32 gradients): same loss and gradients as the
 *      path without a communicator, to 1e-5 (atomics reorder fp32 sums).
 *   4. ncclCommAbort on that communicator: the next forward fails with
 *      -ECANCELED, and freeing works.
 *   0. the planner's GPU figures (common/plan.h, docs/plan.md): its predicted
 *      peak of a rank equals gpu_zero_estimate_bytes, what the GPU path
 *      itself says it allocates, for tiny, small and gpt2-124m at world
 *      1, 2, 3, 8 and micro-batches 1 and 4.
 *   5. checkpoints, tiny: a CPU checkpoint loads into the GPU trainer and a
 *      GPU checkpoint into the CPU trainer and into a fresh GPU trainer,
 *      weights and both moments bit for bit (the files carry fp32 master
 *      state; nothing is rounded on the way); the GPU path samples the same
 *      tokens as the CPU path from the same weights; the NCCL all-gather
 *      that checkpoints agree through returns every rank's words.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/jobspec.h"
#include "common/plan.h"
#include "tests/gpu-check-lib.h"
#include "worker/train/gpu/gpu.h"
#include "worker/train/gpu/gpu_train.h"
#include "worker/train/layers.h"
#include "worker/train/model.h"
#include "worker/train/rng.h"
#include "worker/train/train.h"

/* One forward and backward on the GPU; gradients into grads. */
static int gpu_fwd_bwd(struct gpu_zero *z, const int *inp, const int *tgt, int B, int T,
                       double *loss, float *grads)
{
    double norm;
    int rc = gpu_zero_zero_grad(z);
    if (!rc)
        rc = gpu_zero_forward(z, inp, tgt, B, T, NULL);
    if (!rc)
        rc = gpu_zero_backward(z, 1.0f);
    if (!rc)
        rc = gpu_zero_step_stats(z, loss, &norm);
    if (!rc)
        rc = gpu_zero_read_grads(z, grads);
    if (rc)
        printf("  gpu: %s\n", gpu_zero_error(z));
    return rc;
}

/* vocab 0: tiny's own (256), then NCCL world 1 and an abort; otherwise tiny
 * with that vocabulary, which the GPU pads (GPU_VOCAB_ALIGN). */
static void check_tiny(int vocab)
{
    struct gpt_config cfg;
    gpt_preset("tiny", &cfg);
    if (vocab)
        cfg.V = vocab;
    const int Vp = (cfg.V + GPU_VOCAB_ALIGN - 1) / GPU_VOCAB_ALIGN * GPU_VOCAB_ALIGN;
    printf("tiny (vocab %d, %d on the GPU) forward/backward, GPU (bf16) vs CPU (fp32):\n", cfg.V, Vp);
    const int B = 4, T = cfg.T;
    struct gpt cpu;
    if (gpt_create(&cpu, &cfg, B, T)) {
        CHECK(0, "gpt_create");
        return;
    }
    gpt_init_weights(&cpu, 1234);
    int *inp = malloc(sizeof(int) * B * T), *tgt = malloc(sizeof(int) * B * T);
    float *g_gpu = calloc(cpu.layout.total, sizeof(float));
    float *g_nccl = calloc(cpu.layout.total, sizeof(float));
    for (int i = 0; i < B * T; i++) {
        inp[i] = (int)(rng_hash(7, 1, (uint64_t)i, 0, 0) % (uint64_t)cfg.V);
        tgt[i] = (int)(rng_hash(7, 2, (uint64_t)i, 0, 0) % (uint64_t)cfg.V);
    }
    double loss_cpu = gpt_forward(&cpu, inp, tgt, B, T);
    gpt_zero_grad(&cpu);
    gpt_backward(&cpu, 1.0f);

    char err[1024], name[96];
    struct gpu_zero *z;
    if (gpu_zero_init(&z, &cfg, B, T, 0, 1, NULL, NULL, err, sizeof(err))) {
        CHECK(0, "gpu_zero_init: %s", err);
        goto out;
    }
    double loss_gpu = 0, loss_eval = 0;
    int rc = gpu_zero_load_params(z, cpu.params);
    if (!rc)
        rc = gpu_fwd_bwd(z, inp, tgt, B, T, &loss_gpu, g_gpu);
    if (!rc)
        rc = gpu_zero_forward(z, inp, tgt, B, T, &loss_eval);
    CHECK(rc == 0, "forward and backward ran");
    if (!rc) {
        double rel = fabs(loss_gpu - loss_cpu) / loss_cpu;
        CHECK(rel <= 2e-2, "loss GPU %.6f CPU %.6f: relative error %.2e (bound 2e-2)", loss_gpu,
              loss_cpu, rel);
        CHECK(fabs(loss_eval - loss_gpu) <= 1e-6 * loss_gpu,
              "forward alone gives the same loss (%.6f)", loss_eval);
        double e = worst_tensor_error(&cpu, g_gpu, cpu.grads, name, sizeof(name));
        CHECK(e <= 5e-2, "gradients: worst normalised L2 error %.2e in %s (bound 5e-2)", e, name);
    }
    gpu_zero_free(z);
    if (vocab)
        goto out;

    printf("NCCL world 1 through the ZeRO-3 path, then abort:\n");
    uint8_t id[GPU_ID_BYTES];
    if (gpu_unique_id(id) == -ENOTSUP) {
        printf("  skipped: built without NCCL\n");
        goto out;
    }
    if (gpu_zero_init(&z, &cfg, B, T, 0, 1, id, NULL, err, sizeof(err))) {
        CHECK(0, "gpu_zero_init with NCCL: %s", err);
        goto out;
    }
    double loss_nccl = 0;
    rc = gpu_zero_load_params(z, cpu.params);
    if (!rc)
        rc = gpu_fwd_bwd(z, inp, tgt, B, T, &loss_nccl, g_nccl);
    CHECK(rc == 0, "forward and backward over NCCL ran");
    if (!rc) {
        CHECK(fabs(loss_nccl - loss_gpu) <= 1e-5 * loss_gpu, "loss %.6f (without NCCL %.6f)",
              loss_nccl, loss_gpu);
        double e = worst_tensor_error(&cpu, g_nccl, g_gpu, name, sizeof(name));
        CHECK(e <= 1e-5, "gradients match the path without NCCL: worst %.2e in %s", e, name);
    }
    gpu_zero_abort(z);
    double unused;
    rc = gpu_zero_forward(z, inp, tgt, B, T, &unused);
    CHECK(rc == -ECANCELED, "after ncclCommAbort a forward fails with -ECANCELED (got %d: %s)", rc,
          gpu_zero_error(z));
    gpu_zero_free(z);
    CHECK(1, "an aborted communicator frees");
out:
    free(inp);
    free(tgt);
    free(g_gpu);
    free(g_nccl);
    gpt_destroy(&cpu);
}

static void check_train(const char *data, const char *model, int steps, double bound)
{
    printf("%s, %d steps, GPU vs CPU loss curves (%s):\n", model, steps, data);
    struct job_spec spec;
    struct gpt_config cfg;
    job_spec_defaults(&spec);
    snprintf(spec.model, sizeof(spec.model), "%s", model);
    snprintf(spec.data, sizeof(spec.data), "%s", data);
    gpt_preset(model, &cfg);
    spec.steps = steps;
    spec.batch = 8;
    spec.micro_batch = 4; /* two micro-steps: accumulation and input staging */
    spec.seq_len = cfg.T < 64 ? cfg.T : 64;
    spec.lr = cfg.C < 64 ? 1e-2 : 1e-3; /* tiny learns slowly at 1e-3 */
    spec.lr_min = 1e-4;
    spec.warmup_steps = 5;
    spec.eval_every = 0;
    spec.checkpoint_dir[0] = '\0';
    char err[1024];
    struct trainer cpu;
    struct gpu_trainer gpu;
    layers_set_threads(2);
    if (trainer_init(&cpu, &spec, 0, 1, NULL, err, sizeof(err))) {
        CHECK(0, "CPU trainer: %s", err);
        return;
    }
    if (gpu_trainer_init(&gpu, &spec, 0, 1, NULL, NULL, err, sizeof(err))) {
        CHECK(0, "GPU trainer: %s", err);
        trainer_free(&cpu);
        return;
    }
    double first_c = 0, first_g = 0, last_c = 0, last_g = 0;
    int rc = 0;
    for (int s = 0; s < spec.steps && !rc; s++) {
        struct train_step_info ic, ig;
        rc = trainer_step(&cpu, &ic, err, sizeof(err));
        if (!rc)
            rc = gpu_trainer_step(&gpu, &ig, err, sizeof(err));
        if (rc)
            break;
        if (s == 0) {
            first_c = ic.loss;
            first_g = ig.loss;
        }
        if (s >= spec.steps - 10) {
            last_c += ic.loss / 10;
            last_g += ig.loss / 10;
        }
        if (s % 10 == 0 || s == spec.steps - 1)
            printf("        step %2d loss CPU %.4f GPU %.4f\n", s + 1, ic.loss, ig.loss);
    }
    CHECK(rc == 0, "%d steps ran on both%s%s", steps, rc ? ": " : "", rc ? err : "");
    if (!rc) {
        double rel = fabs(last_g - last_c) / last_c;
        CHECK(rel <= bound, "mean loss of the last 10 steps GPU %.4f CPU %.4f: %.2f%% apart "
                            "(bound %.2g%%)", last_g, last_c, 100 * rel, 100 * bound);
        CHECK(first_c - last_c >= 0.5 && first_g - last_g >= 0.5,
              "both learn: CPU %.3f -> %.3f, GPU %.3f -> %.3f", first_c, last_c, first_g, last_g);
    }
    gpu_trainer_free(&gpu);
    trainer_free(&cpu);
}

/* The GPU trainer's fp32 state (world 1) in the whole model's layout. */
static int gpu_state(struct gpu_trainer *g, const struct gpt_layout *lay, float *full[3])
{
    size_t shard[GPT_MAX_UNITS], off[GPT_MAX_UNITS];
    const size_t total = gpu_zero_shard_layout(g->z, shard, off);
    float *h = malloc(3 * sizeof(float) * total);
    int rc = h ? gpu_zero_read_state(g->z, h, h + total, h + 2 * total) : -ENOMEM;
    for (int k = 0; k < 3 && !rc; k++)
        for (int u = 0; u < lay->nunits; u++)
            memcpy(full[k] + lay->offset[u], h + k * total + off[u], sizeof(float) * lay->numel[u]);
    if (rc)
        printf("  gpu: %s\n", h ? gpu_zero_error(g->z) : "out of host memory");
    free(h);
    return rc;
}

/* Whether the CPU trainer (world 1) holds exactly full's weights and moments. */
static int same_state(const struct trainer *c, float *full[3])
{
    const size_t n = sizeof(float) * c->model.layout.total;
    return !memcmp(c->zero.params, full[0], n) && !memcmp(c->zero.m, full[1], n) &&
           !memcmp(c->zero.v, full[2], n);
}

static void check_checkpoints(const char *data)
{
    printf("checkpoints between the CPU and GPU paths, tiny:\n");
    struct job_spec spec;
    job_spec_defaults(&spec);
    snprintf(spec.model, sizeof(spec.model), "tiny");
    snprintf(spec.data, sizeof(spec.data), "%s", data);
    spec.steps = 20;
    spec.batch = 8;
    spec.micro_batch = 4;
    spec.eval_every = 0;
    char dir[] = "/tmp/gpu-check-ckpt-XXXXXX", from_cpu[64], from_gpu[64], err[1024];
    if (!mkdtemp(dir)) {
        CHECK(0, "mkdtemp: %s", strerror(errno));
        return;
    }
    snprintf(from_cpu, sizeof(from_cpu), "%s/cpu", dir);
    snprintf(from_gpu, sizeof(from_gpu), "%s/gpu", dir);
    struct trainer cpu;
    struct gpu_trainer gpu, again;
    struct gpt_config cfg;
    struct gpt_layout lay;
    gpt_preset("tiny", &cfg);
    gpt_layout_init(&lay, &cfg);
    float *full[3];
    for (int k = 0; k < 3; k++)
        full[k] = calloc(lay.total, sizeof(float));
    int rc = trainer_init(&cpu, &spec, 0, 1, NULL, err, sizeof(err));
    for (int s = 0; s < 5 && !rc; s++)
        rc = trainer_step(&cpu, NULL, err, sizeof(err));
    if (!rc)
        rc = trainer_save(&cpu, from_cpu, NULL, 0, err, sizeof(err));
    CHECK(rc == 0, "CPU trainer: 5 steps and a checkpoint%s%s", rc ? ": " : "", rc ? err : "");
    if (rc)
        goto out;
    rc = gpu_trainer_init(&gpu, &spec, 0, 1, NULL, NULL, err, sizeof(err));
    if (!rc)
        rc = gpu_trainer_load(&gpu, from_cpu, err, sizeof(err));
    CHECK(rc == 0, "the GPU trainer loads the CPU checkpoint%s%s", rc ? ": " : "", rc ? err : "");
    if (rc)
        goto out_cpu;
    CHECK(gpu.step == 5 && gpu.last_checkpoint_step == 5, "at step %ld (checkpoint %ld)",
          gpu.step, gpu.last_checkpoint_step);
    CHECK(gpu_state(&gpu, &lay, full) == 0 && same_state(&cpu, full),
          "GPU weights and moments are the CPU's, bit for bit");
    int tc[16], tg[16];
    trainer_sample(&cpu, '\n', tc, 16);
    rc = gpu_trainer_sample(&gpu, '\n', tg, 16, err, sizeof(err));
    CHECK(rc == 0 && memcmp(tc, tg, sizeof(tc)) == 0,
          "the GPU path samples the CPU's 16 tokens from the same weights%s%s", rc ? ": " : "",
          rc ? err : "");
    for (int s = 0; s < 5 && !rc; s++)
        rc = gpu_trainer_step(&gpu, NULL, err, sizeof(err));
    if (!rc)
        rc = gpu_trainer_save(&gpu, from_gpu, NULL, 0, err, sizeof(err));
    CHECK(rc == 0 && gpu.last_checkpoint_step == 10, "GPU: 5 more steps and a checkpoint%s%s",
          rc ? ": " : "", rc ? err : "");
    if (!rc)
        rc = gpu_state(&gpu, &lay, full);
    if (!rc)
        rc = trainer_load(&cpu, from_gpu, err, sizeof(err));
    CHECK(rc == 0 && cpu.step == 10 && same_state(&cpu, full),
          "the CPU trainer loads the GPU checkpoint at step 10, bit for bit%s%s", rc ? ": " : "",
          rc ? err : "");
    if (!rc && (rc = gpu_trainer_init(&again, &spec, 0, 1, NULL, NULL, err, sizeof(err))) == 0) {
        rc = gpu_trainer_load(&again, from_gpu, err, sizeof(err));
        float *mine[3];
        for (int k = 0; k < 3; k++)
            mine[k] = calloc(lay.total, sizeof(float));
        if (!rc)
            rc = gpu_state(&again, &lay, mine);
        int same = !rc;
        for (int k = 0; k < 3; k++) {
            same = same && memcmp(mine[k], full[k], sizeof(float) * lay.total) == 0;
            free(mine[k]);
        }
        CHECK(same && again.step == 10, "a fresh GPU trainer resumes it, bit for bit%s%s",
              rc ? ": " : "", rc ? err : "");
        gpu_trainer_free(&again);
    }
    uint8_t id[GPU_ID_BYTES];
    struct gpu_zero *z;
    if (gpu_unique_id(id) == -ENOTSUP) {
        printf("  skipped the NCCL all-gather: built without NCCL\n");
    } else if (gpu_zero_init(&z, &cfg, 1, cfg.T, 0, 1, id, NULL, err, sizeof(err)) == 0) {
        const uint64_t words[3] = {~0ull, 12345, 1ull << 60};
        uint64_t got[3] = {0};
        rc = gpu_zero_gather_u64(z, words, 3, got);
        CHECK(rc == 0 && memcmp(words, got, sizeof(got)) == 0,
              "NCCL all-gather of 64-bit words (world 1)%s%s", rc ? ": " : "",
              rc ? gpu_zero_error(z) : "");
        gpu_zero_free(z);
    } else {
        CHECK(0, "gpu_zero_init with NCCL: %s", err);
    }
    gpu_trainer_free(&gpu);
out_cpu:
    trainer_free(&cpu);
out:
    for (int k = 0; k < 3; k++)
        free(full[k]);
    char cmd[64];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    if (system(cmd) != 0)
        printf("  could not remove %s\n", dir);
}

static void check_plan_estimate(void)
{
    static const char *const presets[] = {"tiny", "small", "gpt2-124m"};
    static const int worlds[] = {1, 2, 3, 8}, batches[] = {1, 4};
    int same = 0, total = 0;
    for (size_t m = 0; m < 3; m++)
        for (size_t w = 0; w < 4; w++)
            for (size_t b = 0; b < 2; b++) {
                struct plan_input in = {.nodes = worlds[w], .devices_per_node = 1, .device = PLAN_GPU,
                                        .batch = batches[b] * worlds[w], .micro_batch = batches[b],
                                        .network_gbit = 10, .tflops = 100};
                struct plan p;
                char err[256];
                gpt_preset(presets[m], &in.cfg);
                in.seq_len = in.cfg.T > 256 ? 256 : in.cfg.T;
                size_t est = gpu_zero_estimate_bytes(&in.cfg, batches[b], in.seq_len, worlds[w]);
                total++;
                if (plan_compute(&in, &p, err, sizeof(err)) == 0 && p.peak == est)
                    same++;
                else
                    printf("  plan of %s, world %d, micro_batch %d: %llu B, the GPU path estimates %zu B\n",
                           presets[m], worlds[w], batches[b], (unsigned long long)p.peak, est);
            }
    CHECK(same == total, "the planner's GPU peak equals gpu_zero_estimate_bytes in %d of %d shapes", same, total);
}

int main(int argc, char **argv)
{
    char why[256];
    const char *req = getenv("REQUIRE_GPU");
    if (gpu_device_count(why, sizeof(why)) < 1) {
        printf("gpu-check: no GPU (%s): skipped\n", why);
        return req && strcmp(req, "1") == 0 ? 1 : 0;
    }
    const char *model = "small";
    int steps = 50;
    double bound = 0.05;
    for (; argc > 2 && strncmp(argv[1], "--", 2) == 0; argc -= 2, argv += 2) {
        if (strcmp(argv[1], "--train-model") == 0)
            model = argv[2];
        else if (strcmp(argv[1], "--train-steps") == 0)
            steps = atoi(argv[2]);
        else if (strcmp(argv[1], "--curve-bound") == 0)
            bound = atof(argv[2]);
        else
            break;
    }
    struct gpt_config probe;
    if (argc != 2 || gpt_preset(model, &probe) != 0 || steps < 20 || !(bound > 0)) {
        fprintf(stderr, "usage: gpu-check [--train-model PRESET] [--train-steps N>=20] "
                        "[--curve-bound FRACTION] DATA_FILE\n");
        return 2;
    }
    char name[128];
    gpu_device_name(name, sizeof(name));
    printf("gpu-check on %s\n", name);
    check_plan_estimate();
    check_tiny(0);
    check_tiny(129); /* padded to 192: unmasked, the 63 zero logits would add ~0.4 nats to the loss */
    check_train(argv[1], model, steps, bound);
    check_checkpoints(argv[1]);
    printf("gpu-check: %s (%d failure%s)\n", failures ? "FAILED" : "passed", failures,
           failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
