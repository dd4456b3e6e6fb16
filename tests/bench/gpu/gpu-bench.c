/*
 * gpu-bench: muster's GPU path on one GPU, gpt2-124m (or MODEL), bf16 with
 * fp32 master weights, ZeRO-3 at world 1 (no communicator). Random tokens:
 * the speed does not depend on them. Prints tokens/s, MFU and peak memory as
 * one JSON line (for tests/bench/gpu/run.sh) after a human line.
 *
 * MFU = 6 * N * tokens/s / peak, N = parameters (tied head counted once),
 * peak = the device's dense bf16 tensor throughput from the table below
 * (vendor datasheet figures without sparsity); an unknown device gets no MFU.
 * Environment: MODEL (gpt2-124m), MICRO_BATCH (8), SEQ_LEN (1024), STEPS (10
 * timed, after 3 warm-up steps). Without a GPU: "no GPU: skipped" (exit 0,
 * or 1 with REQUIRE_GPU=1).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "worker/train/gpu/gpu.h"
#include "worker/train/rng.h"

static const struct {
    const char *match; /* substring of the device name */
    double tflops;     /* dense bf16 */
} peaks[] = {
    {"H200", 989.4}, {"H100 PCIe", 756.0}, {"H100", 989.4}, {"A100", 312.0},
    {"L40S", 362.05}, {"A10", 125.0},
};

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int env_int(const char *name, int def)
{
    const char *v = getenv(name);
    return v && atoi(v) > 0 ? atoi(v) : def;
}

int main(void)
{
    char why[256], name[128], err[1024];
    const char *req = getenv("REQUIRE_GPU");
    if (gpu_device_count(why, sizeof(why)) < 1) {
        printf("gpu-bench: no GPU (%s): skipped\n", why);
        return req && strcmp(req, "1") == 0 ? 1 : 0;
    }
    gpu_device_name(name, sizeof(name));
    const char *model = getenv("MODEL") ? getenv("MODEL") : "gpt2-124m";
    struct gpt_config cfg;
    if (gpt_preset(model, &cfg)) {
        fprintf(stderr, "gpu-bench: MODEL: unknown preset %s (%s)\n", model, gpt_preset_list());
        return 2;
    }
    const int B = env_int("MICRO_BATCH", 8), T = env_int("SEQ_LEN", cfg.T < 1024 ? cfg.T : 1024);
    const int steps = env_int("STEPS", 10), warm = 3;
    struct gpt_layout lay;
    gpt_layout_init(&lay, &cfg);

    struct gpu_zero *z;
    if (gpu_zero_init(&z, &cfg, B, T, 0, 1, NULL, NULL, err, sizeof(err))) {
        fprintf(stderr, "gpu-bench: %s\n", err);
        return 1;
    }
    int *inp = malloc(sizeof(int) * B * T), *tgt = malloc(sizeof(int) * B * T);
    for (int i = 0; i < B * T; i++) {
        inp[i] = (int)(rng_hash(3, 1, (uint64_t)i, 0, 0) % (uint64_t)cfg.V);
        tgt[i] = (int)(rng_hash(3, 2, (uint64_t)i, 0, 0) % (uint64_t)cfg.V);
    }
    int rc = gpu_zero_init_weights(z, 1);
    double t0 = 0, loss = 0, norm = 0;
    for (int s = 0; s < warm + steps && !rc; s++) {
        if (s == warm)
            t0 = now_s();
        struct adamw h = {3e-4f, 0.9f, 0.95f, 1e-8f, 0.1f, s + 1};
        rc = gpu_zero_zero_grad(z);
        if (!rc)
            rc = gpu_zero_forward(z, inp, tgt, B, T, NULL);
        if (!rc)
            rc = gpu_zero_backward(z, 1.0f);
        if (!rc)
            rc = gpu_zero_step_stats(z, &loss, &norm); /* waits: the step is done */
        if (!rc)
            rc = gpu_zero_adamw(z, &h, 1.0f);
    }
    double dt = now_s() - t0;
    if (rc) {
        fprintf(stderr, "gpu-bench: %s\n", gpu_zero_error(z));
        gpu_zero_free(z);
        return 1;
    }
    const double tps = (double)B * T * steps / dt;
    double peak = 0;
    for (size_t i = 0; i < sizeof(peaks) / sizeof(peaks[0]) && peak == 0; i++)
        if (strstr(name, peaks[i].match))
            peak = peaks[i].tflops;
    const double mfu = peak > 0 ? 6.0 * (double)lay.total * tps / (peak * 1e12) : NAN;
    const double G = 1073741824.0;
    const size_t est = gpu_zero_estimate_bytes(&cfg, B, T, 1);
    printf("muster %s on %s: micro_batch %d seq_len %d: %.0f tokens/s, %.1f ms/step, MFU %.1f%% "
           "(6N, N=%.1fM, peak %.1f TFLOPS bf16 dense); last loss %.4f; peak memory %.2f GiB "
           "(device-wide), allocated %.2f GiB, ZeRO-3 estimate %.2f GiB\n",
           model, name, B, T, tps, 1e3 * dt / steps, 100 * mfu, lay.total / 1e6, peak, loss,
           gpu_zero_peak_bytes(z) / G, gpu_zero_alloc_bytes(z) / G, est / G);
    printf("{\"impl\": \"muster\", \"device\": \"%s\", \"model\": \"%s\", \"micro_batch\": %d, "
           "\"seq_len\": %d, \"tokens_per_s\": %.1f, \"mfu\": %.4f, \"peak_tflops\": %.1f, "
           "\"params\": %zu, \"peak_mem_bytes\": %zu, \"alloc_bytes\": %zu, \"estimate_bytes\": %zu}\n",
           name, model, B, T, tps, isnan(mfu) ? 0.0 : mfu, peak, lay.total, gpu_zero_peak_bytes(z),
           gpu_zero_alloc_bytes(z), est);
    free(inp);
    free(tgt);
    gpu_zero_free(z);
    return 0;
}
