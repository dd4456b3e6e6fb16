/*
 * The model against PyTorch: tests/reference/tiny.fixture holds weights, one
 * batch, PyTorch's logits, loss, every gradient and the losses of 10 AdamW
 * steps (tests/reference/gen_fixture.py). Tolerances, all fp32 on both sides:
 *   logits, loss      rel 1e-5: float rounding in a different summation order
 *                     (sgemm blocking, LayerNorm in double here) moves the
 *                     last bits only, ~1e-7 per operation over a few dozen;
 *   gradients         1e-4 of the tensor's largest |gradient| (max-abs
 *                     normalised): a backward chains twice as many products
 *                     and small gradients carry cancellation noise;
 *   10-step losses    rel 1e-5 each: AdamW divides by sqrt(v), which
 *                     amplifies the gradient noise early on, still far below
 *                     the change the steps make (~1e-2 per step).
 * The embedding and the tied head taken over windows of rows (ZeRO-3's
 * chunks) are checked against the whole-unit passes on the same batch.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "worker/train/layers.h"
#include "worker/train/model.h"
#include "worker/train/optim.h"

#ifndef FIXTURE_DIR
#define FIXTURE_DIR "tests/reference"
#endif

#define TOL_LOSS 1e-5
#define TOL_LOGITS 1e-5
#define TOL_GRAD 1e-4
#define TOL_STEPS 1e-5

struct fixture {
    int L, NH, C, T, V, B, S, steps, P;
    float lr, lr_min, warmup, beta1, beta2, eps, wd, clip;
    float *params, *logits, *grads, *losses, loss;
    int *inputs, *targets;
};

static void read_exact(FILE *f, void *buf, size_t size, const char *what)
{
    ck_assert_msg(fread(buf, 1, size, f) == size, "fixture truncated at %s", what);
}

/* MUSTER_FIXTURE runs the suite against another fixture written by
 * gen_fixture.py (other dimensions); the default is the committed one. */
static const char *fixture_path(void)
{
    const char *p = getenv("MUSTER_FIXTURE");
    return p && *p ? p : FIXTURE_DIR "/tiny.fixture";
}

static void fixture_load(struct fixture *fx)
{
    const char *path = fixture_path();
    FILE *f = fopen(path, "rb");
    ck_assert_msg(f != NULL, "cannot open %s (run from the repository root)", path);
    int32_t h[16];
    float hp[16];
    read_exact(f, h, sizeof(h), "header");
    read_exact(f, hp, sizeof(hp), "hyper-parameters");
    ck_assert_int_eq(h[0], 0x4D465854);
    ck_assert_int_eq(h[1], 1);
    fx->L = h[2], fx->NH = h[3], fx->C = h[4], fx->T = h[5], fx->V = h[6];
    fx->B = h[7], fx->S = h[8], fx->steps = h[9], fx->P = h[10];
    fx->lr = hp[0], fx->lr_min = hp[1], fx->warmup = hp[2], fx->beta1 = hp[3];
    fx->beta2 = hp[4], fx->eps = hp[5], fx->wd = hp[6], fx->clip = hp[7];
    size_t n = (size_t)fx->B * fx->S;
    fx->params = malloc(sizeof(float) * fx->P);
    fx->grads = malloc(sizeof(float) * fx->P);
    fx->logits = malloc(sizeof(float) * n * fx->V);
    fx->losses = malloc(sizeof(float) * fx->steps);
    fx->inputs = malloc(sizeof(int) * n);
    fx->targets = malloc(sizeof(int) * n);
    read_exact(f, fx->params, sizeof(float) * fx->P, "params");
    read_exact(f, fx->inputs, sizeof(int) * n, "inputs");
    read_exact(f, fx->targets, sizeof(int) * n, "targets");
    read_exact(f, fx->logits, sizeof(float) * n * fx->V, "logits");
    read_exact(f, &fx->loss, sizeof(float), "loss");
    read_exact(f, fx->grads, sizeof(float) * fx->P, "grads");
    read_exact(f, fx->losses, sizeof(float) * fx->steps, "losses");
    ck_assert_int_eq(fgetc(f), EOF);
    fclose(f);
}

static void fixture_free(struct fixture *fx)
{
    free(fx->params), free(fx->grads), free(fx->logits), free(fx->losses);
    free(fx->inputs), free(fx->targets);
}

static void model_from_fixture(struct gpt *m, const struct fixture *fx)
{
    struct gpt_config cfg = {fx->L, fx->NH, fx->C, fx->T, fx->V}, tiny;
    if (!getenv("MUSTER_FIXTURE")) { /* the committed fixture is the tiny preset's */
        ck_assert_int_eq(gpt_preset("tiny", &tiny), 0);
        ck_assert_int_eq(memcmp(&cfg, &tiny, sizeof(cfg)), 0);
    }
    ck_assert_int_eq(gpt_create(m, &cfg, fx->B, fx->S), 0);
    ck_assert_uint_eq(m->layout.total, (size_t)fx->P);
    memcpy(m->params, fx->params, sizeof(float) * fx->P);
}

static double max_abs(const float *x, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs(x[i]));
    return mx;
}

static double max_abs_diff(const float *a, const float *b, size_t n)
{
    double mx = 0;
    for (size_t i = 0; i < n; i++)
        mx = fmax(mx, fabs((double)a[i] - b[i]));
    return mx;
}

START_TEST(forward_matches_pytorch)
{
    struct fixture fx;
    struct gpt m;
    fixture_load(&fx);
    model_from_fixture(&m, &fx);
    double loss = gpt_forward(&m, fx.inputs, fx.targets, fx.B, fx.S);
    size_t nl = (size_t)fx.B * fx.S * fx.V;
    double dl = max_abs_diff(m.acts.logits, fx.logits, nl) / max_abs(fx.logits, nl);
    ck_assert_msg(dl <= TOL_LOGITS, "logits: max-abs-normalised difference %.3g > %.0e", dl,
                  TOL_LOGITS);
    double rel = fabs(loss - fx.loss) / fabs(fx.loss);
    ck_assert_msg(rel <= TOL_LOSS, "loss: C %.8f, PyTorch %.8f, rel %.3g > %.0e", loss,
                  fx.loss, rel, TOL_LOSS);
    printf("model: loss C %.8f PyTorch %.8f rel %.2e; logits rel %.2e\n", loss, fx.loss, rel,
           dl);
    gpt_destroy(&m);
    fixture_free(&fx);
}
END_TEST

START_TEST(backward_matches_pytorch)
{
    struct fixture fx;
    struct gpt m;
    fixture_load(&fx);
    model_from_fixture(&m, &fx);
    gpt_zero_grad(&m);
    gpt_forward(&m, fx.inputs, fx.targets, fx.B, fx.S);
    gpt_backward(&m, 1.0f);
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    double worst = 0;
    for (int u = 0; u < m.layout.nunits; u++) {
        int n = gpt_unit_tensors(&m.cfg, u, t);
        for (int i = 0; i < n; i++) {
            size_t off = m.layout.offset[u] + t[i].offset;
            double ref = max_abs(fx.grads + off, t[i].numel);
            ck_assert_msg(ref > 0, "unit %d %s: reference gradient is all zero", u, t[i].name);
            double d = max_abs_diff(m.grads + off, fx.grads + off, t[i].numel) / ref;
            ck_assert_msg(d <= TOL_GRAD, "unit %d (%s) %s: gradient differs by %.3g of its max > %.0e",
                          u, gpt_unit_kind_name(gpt_unit_kind(&m.cfg, u)), t[i].name, d, TOL_GRAD);
            worst = fmax(worst, d);
        }
    }
    printf("model: gradients worst max-abs-normalised difference %.2e\n", worst);
    gpt_destroy(&m);
    fixture_free(&fx);
}
END_TEST

/* The same update train.c makes, spelled out: clip by the global norm, then
 * AdamW tensor by tensor with decay on matrices only. */
static void adamw_all(struct gpt *m, float *mom, float *vel, const struct adamw *h, float gscale)
{
    struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
    for (int u = 0; u < m->layout.nunits; u++) {
        int n = gpt_unit_tensors(&m->cfg, u, t);
        for (int i = 0; i < n; i++) {
            size_t off = m->layout.offset[u] + t[i].offset;
            adamw_update(m->params + off, m->grads + off, mom + off, vel + off, t[i].numel, h,
                         t[i].decay, gscale);
        }
    }
}

START_TEST(adamw_steps_match_pytorch)
{
    struct fixture fx;
    struct gpt m;
    fixture_load(&fx);
    model_from_fixture(&m, &fx);
    float *mom = calloc(fx.P, sizeof(float)), *vel = calloc(fx.P, sizeof(float));
    struct lr_schedule s = {fx.lr, fx.lr_min, (int)fx.warmup, fx.steps};
    double worst = 0;
    for (int step = 0; step < fx.steps; step++) {
        gpt_zero_grad(&m);
        double loss = gpt_forward(&m, fx.inputs, fx.targets, fx.B, fx.S);
        gpt_backward(&m, 1.0f);
        double norm = sqrt(sum_squares(m.grads, m.layout.total));
        struct adamw h = {(float)lr_at(&s, step), fx.beta1, fx.beta2, fx.eps, fx.wd, step + 1};
        adamw_all(&m, mom, vel, &h, clip_scale(norm, fx.clip));
        double rel = fabs(loss - fx.losses[step]) / fabs(fx.losses[step]);
        ck_assert_msg(rel <= TOL_STEPS, "step %d: loss C %.8f, PyTorch %.8f, rel %.3g > %.0e",
                      step, loss, fx.losses[step], rel, TOL_STEPS);
        worst = fmax(worst, rel);
    }
    /* the steps must have trained: otherwise the comparison proves little */
    ck_assert_float_lt(fx.losses[fx.steps - 1], fx.losses[0] - 0.5f);
    printf("model: 10 AdamW steps, loss %.6f -> %.6f, worst rel %.2e\n", fx.losses[0],
           fx.losses[fx.steps - 1], worst);
    free(mom), free(vel);
    gpt_destroy(&m);
    fixture_free(&fx);
}
END_TEST

/* Two micro-batches of one sequence, each scaled by 1/2, give the gradient
 * of the batch of two (up to summation order). */
START_TEST(accumulation_equals_full_batch)
{
    struct fixture fx;
    struct gpt m;
    fixture_load(&fx);
    model_from_fixture(&m, &fx);
    gpt_zero_grad(&m);
    gpt_forward(&m, fx.inputs, fx.targets, fx.B, fx.S);
    gpt_backward(&m, 1.0f);
    float *full = malloc(sizeof(float) * fx.P);
    memcpy(full, m.grads, sizeof(float) * fx.P);
    gpt_zero_grad(&m);
    for (int b = 0; b < fx.B; b++) {
        gpt_forward(&m, fx.inputs + b * fx.S, fx.targets + b * fx.S, 1, fx.S);
        gpt_backward(&m, 1.0f / fx.B);
    }
    double d = max_abs_diff(m.grads, full, fx.P) / max_abs(full, fx.P);
    ck_assert_msg(d <= 1e-5, "accumulated gradient differs from the full batch's by %.3g", d);
    free(full);
    gpt_destroy(&m);
    fixture_free(&fx);
}
END_TEST

/*
 * The embedding and the tied head over windows of unit 0's rows (what
 * ZeRO-3 does with its chunks): 37 rows at a time, last window first, the
 * table padded with 40 zero rows past its end. The lookup is the whole
 * unit's bit for bit; logits, loss and gradients agree within fp32 noise,
 * and padding rows get no gradient.
 */
START_TEST(embedding_windows_match_the_whole_unit)
{
    struct fixture fx;
    struct gpt m;
    fixture_load(&fx);
    model_from_fixture(&m, &fx);
    const int L = m.cfg.L, W = 37;
    const size_t C = (size_t)m.cfg.C, rows = (size_t)(m.cfg.V + m.cfg.T), padded = rows + 40;
    const size_t N = (size_t)fx.B * fx.S, nlog = N * (size_t)m.cfg.V;
    const size_t P0 = m.layout.numel[0];

    gpt_zero_grad(&m);
    double whole_loss = gpt_forward(&m, fx.inputs, fx.targets, fx.B, fx.S);
    float *enc = malloc(sizeof(float) * N * C), *logits = malloc(sizeof(float) * nlog);
    float *grads = malloc(sizeof(float) * fx.P);
    memcpy(enc, m.acts.encoded, sizeof(float) * N * C);
    memcpy(logits, m.acts.logits, sizeof(float) * nlog);
    gpt_backward(&m, 1.0f);
    memcpy(grads, m.grads, sizeof(float) * fx.P);

    float *table = calloc(padded * C, sizeof(float)), *dtable = calloc(padded * C, sizeof(float));
    memcpy(table, gpt_unit_ptr(&m, m.params, 0), sizeof(float) * P0);
    gpt_zero_grad(&m);
    gpt_set_batch(&m, fx.inputs, fx.targets, fx.B, fx.S);
    embed_forward_begin(&m);
    for (long first = (long)((padded - 1) / W * W); first >= 0; first -= W)
        embed_forward_rows(&m, table + (size_t)first * C, (size_t)first, W);
    ck_assert_msg(memcmp(m.acts.encoded, enc, sizeof(float) * N * C) == 0,
                  "the lookup over windows differs from the whole unit's");
    for (int l = 0; l < L; l++)
        block_forward(&m, l, gpt_unit_ptr(&m, m.params, l + 1));
    head_norm_forward(&m, gpt_unit_ptr(&m, m.params, L + 1));
    for (long first = (long)((padded - 1) / W * W); first >= 0; first -= W)
        head_forward_rows(&m, table + (size_t)first * C, (size_t)first, W);
    double loss = head_loss(&m, 1);
    double dl = max_abs_diff(m.acts.logits, logits, nlog) / max_abs(logits, nlog);
    ck_assert_msg(dl <= 1e-6, "logits over windows differ by %.3g of the largest", dl);
    ck_assert_double_eq_tol(loss, whole_loss, 1e-6 * whole_loss);

    head_backward_begin(&m, 1.0f / (float)N);
    for (long first = (long)((padded - 1) / W * W); first >= 0; first -= W)
        head_backward_rows(&m, table + (size_t)first * C, (size_t)first, W);
    head_norm_backward(&m, gpt_unit_ptr(&m, m.grads, L + 1), gpt_unit_ptr(&m, m.params, L + 1));
    for (int l = L - 1; l >= 0; l--)
        block_backward(&m, l, gpt_unit_ptr(&m, m.grads, l + 1), gpt_unit_ptr(&m, m.params, l + 1));
    for (long first = (long)((padded - 1) / W * W); first >= 0; first -= W)
        embed_backward_rows(&m, dtable + (size_t)first * C, (size_t)first, W);
    memcpy(gpt_unit_ptr(&m, m.grads, 0), dtable, sizeof(float) * P0);
    double dg = max_abs_diff(m.grads, grads, fx.P) / max_abs(grads, fx.P);
    ck_assert_msg(dg <= 1e-5, "gradients over windows differ by %.3g of the largest", dg);
    ck_assert_double_eq(max_abs(dtable + P0, (padded - rows) * C), 0.0);
    printf("model: embedding and head over windows of %d rows: lookup bit for bit, logits "
           "%.2e, gradients %.2e\n", W, dl, dg);
    free(enc), free(logits), free(grads), free(table), free(dtable);
    gpt_destroy(&m);
    fixture_free(&fx);
}
END_TEST

START_TEST(layout_is_units_back_to_back)
{
    struct gpt_config cfg;
    struct gpt_layout lay;
    ck_assert_int_eq(gpt_preset("small", &cfg), 0);
    gpt_layout_init(&lay, &cfg);
    ck_assert_int_eq(lay.nunits, cfg.L + 2);
    size_t C = (size_t)cfg.C;
    ck_assert_uint_eq(lay.numel[0], (size_t)(cfg.V + cfg.T) * C);
    ck_assert_uint_eq(lay.numel[1], 12 * C * C + 13 * C);
    ck_assert_uint_eq(lay.numel[cfg.L + 1], 2 * C);
    for (int u = 1; u < lay.nunits; u++)
        ck_assert_uint_eq(lay.offset[u], lay.offset[u - 1] + lay.numel[u - 1]);
    ck_assert_uint_eq(lay.total, lay.offset[cfg.L + 1] + 2 * C);
    ck_assert_int_eq(gpt_preset("gpt2-124m", &cfg), 0);
    gpt_layout_init(&lay, &cfg);
    ck_assert_uint_eq(lay.total, 124439808u); /* GPT-2 small, V = 50257 */
    ck_assert_uint_eq(gpt_param_count(&cfg), lay.total);
    struct gpt_config odd = {.L = 3, .NH = 3, .C = 48, .T = 40, .V = 300}; /* no preset's shape */
    gpt_layout_init(&lay, &odd);
    ck_assert_uint_eq(gpt_param_count(&odd), lay.total);
    ck_assert_int_eq(gpt_preset("huge", &cfg), -ENOENT);
}
END_TEST

START_TEST(init_is_a_function_of_the_seed)
{
    struct gpt_config cfg;
    struct gpt a, b;
    ck_assert_int_eq(gpt_preset("tiny", &cfg), 0);
    ck_assert_int_eq(gpt_create(&a, &cfg, 1, 4), 0);
    ck_assert_int_eq(gpt_create(&b, &cfg, 1, 4), 0);
    gpt_init_weights(&a, 7);
    gpt_init_weights(&b, 7);
    ck_assert_int_eq(memcmp(a.params, b.params, sizeof(float) * a.layout.total), 0);
    gpt_init_weights(&b, 8);
    ck_assert_int_ne(memcmp(a.params, b.params, sizeof(float) * a.layout.total), 0);
    /* wte: std 0.02 */
    double ss = sum_squares(a.params, (size_t)cfg.V * cfg.C) / ((double)cfg.V * cfg.C);
    ck_assert_double_eq_tol(sqrt(ss), 0.02, 0.002);
    /* block 0's ln1w is all ones, ln1b all zeros */
    float *blk = gpt_unit_ptr(&a, a.params, 1);
    ck_assert_float_eq(blk[0], 1.0f);
    ck_assert_float_eq(blk[cfg.C], 0.0f);
    gpt_destroy(&a);
    gpt_destroy(&b);
}
END_TEST

START_TEST(schedule_and_clip)
{
    struct lr_schedule s = {1e-3, 1e-4, 10, 110};
    ck_assert_double_eq_tol(lr_at(&s, 0), 1e-4, 1e-12);
    ck_assert_double_eq_tol(lr_at(&s, 9), 1e-3, 1e-12);
    ck_assert_double_eq_tol(lr_at(&s, 10), 1e-3, 1e-12);
    ck_assert_double_eq_tol(lr_at(&s, 60), 5.5e-4, 1e-12); /* half way down */
    ck_assert_double_eq_tol(lr_at(&s, 110), 1e-4, 1e-12);
    ck_assert_double_eq_tol(lr_at(&s, 500), 1e-4, 1e-12);
    ck_assert_float_eq(clip_scale(0.5, 1.0), 1.0f);
    ck_assert_float_eq_tol(clip_scale(4.0, 1.0), 0.25f, 1e-6f);
    ck_assert_float_eq(clip_scale(1e9, 0.0), 1.0f);
}
END_TEST

/* Two threads, as on the CI machine: the kernels' threaded paths run. */
static void use_two_threads(void) { layers_set_threads(2); }

Suite *make_model_suite(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("pytorch");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, use_two_threads, NULL);
    tcase_add_test(tc, forward_matches_pytorch);
    tcase_add_test(tc, backward_matches_pytorch);
    tcase_add_test(tc, adamw_steps_match_pytorch);
    tcase_add_test(tc, accumulation_equals_full_batch);
    tcase_add_test(tc, embedding_windows_match_the_whole_unit);
    suite_add_tcase(s, tc);
    tc = tcase_create("structure");
    tcase_add_test(tc, layout_is_units_back_to_back);
    tcase_add_test(tc, init_is_a_function_of_the_seed);
    tcase_add_test(tc, schedule_and_clip);
    suite_add_tcase(s, tc);
    return s;
}
