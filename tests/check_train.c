/*
 * Data, checkpoints and the training loop of muster-train, on the tiny
 * preset and generated data: batches are pure functions of their inputs,
 * bad files get errors that say what was wrong, and a run that is saved,
 * loaded into a fresh trainer and continued gives bit-identical losses.
 */
#include <check.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cblas.h>

#include "worker/train/blas_core.h"
#include "worker/train/ckpt.h"
#include "worker/train/layers.h"
#include "worker/train/train.h"

static char tmpdir[] = "/tmp/check-train-XXXXXX";
static char textpath[sizeof(tmpdir) + 32];

static void write_file(const char *path, const void *buf, size_t len)
{
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(buf, 1, len, f), len);
    fclose(f);
}

/* A few KiB of text with some structure to learn. */
static void make_text(const char *path, size_t len)
{
    static const char *words[] = {"to ", "be ", "or ", "not ", "that ", "is ", "the ",
                                  "question\n", "whether ", "tis ", "nobler "};
    char *buf = malloc(len);
    size_t n = 0;
    unsigned x = 12345;
    while (n < len) {
        x = x * 1103515245u + 12345u;
        const char *w = words[(x >> 16) % 11];
        for (size_t i = 0; w[i] && n < len; i++)
            buf[n++] = w[i];
    }
    write_file(path, buf, len);
    free(buf);
}

static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(textpath, sizeof(textpath), "%s/text.txt", tmpdir);
    make_text(textpath, 20000);
    layers_set_threads(2);
}

static void teardown(void)
{
    char cmd[sizeof(tmpdir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmpdir, "/tmp/check-train-XXXXXX");
}

static void tiny_spec(struct job_spec *s)
{
    job_spec_defaults(s);
    snprintf(s->model, sizeof(s->model), "tiny");
    snprintf(s->data, sizeof(s->data), "%s", textpath);
    s->steps = 20;
    s->batch = 4;
    s->micro_batch = 2; /* two micro-steps: accumulation is on the path */
    s->lr = 3e-3;
    s->lr_min = 3e-4;
    s->warmup_steps = 5;
    s->eval_every = 0;
}

static void write_tokens(const char *path, int32_t magic, int32_t version, int32_t count,
                         size_t have)
{
    int32_t h[DATA_HEADER_INTS] = {magic, version, count};
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(h, sizeof(h), 1, f);
    for (size_t i = 0; i < have; i++) {
        uint16_t t = (uint16_t)(i % 200);
        fwrite(&t, 2, 1, f);
    }
    fclose(f);
}

START_TEST(token_file_is_read)
{
    char path[128], err[512] = "";
    struct dataset d;
    snprintf(path, sizeof(path), "%s/ok.bin", tmpdir);
    write_tokens(path, DATA_MAGIC, DATA_VERSION, 5000, 5000);
    ck_assert_int_eq(dataset_open(&d, path, 256, 0.1, 32, err, sizeof(err)), 0);
    ck_assert_int_eq(d.format, DATA_TOKENS);
    ck_assert_uint_eq(d.ntokens, 5000);
    ck_assert_uint_eq(d.ntrain, 4500);
    ck_assert_int_eq(d.tokens[201], 1);
    dataset_close(&d);
}
END_TEST

START_TEST(truncated_token_file_is_refused)
{
    char path[128], err[512] = "";
    struct dataset d;
    snprintf(path, sizeof(path), "%s/short.bin", tmpdir);
    write_tokens(path, DATA_MAGIC, DATA_VERSION, 5000, 4000);
    ck_assert_int_eq(dataset_open(&d, path, 256, 0.1, 32, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "truncated token file: header says 5000 tokens, file holds 4000"),
                  "message was: %s", err);
}
END_TEST

START_TEST(wrong_magic_is_refused_saying_what_was_there)
{
    char path[128], err[512] = "";
    struct dataset d;
    snprintf(path, sizeof(path), "%s/magic.bin", tmpdir);
    write_tokens(path, 20240519, 1, 5000, 5000);
    ck_assert_int_eq(dataset_open(&d, path, 256, 0.1, 32, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "header holds magic 20240519, version 1, count 5000"),
                  "message was: %s", err);
    write_tokens(path, DATA_MAGIC, 2, 5000, 5000);
    ck_assert_int_eq(dataset_open(&d, path, 256, 0.1, 32, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "version 2, expected 1"), "message was: %s", err);
}
END_TEST

START_TEST(tokens_outside_vocab_and_tiny_files_are_refused)
{
    char path[128], err[512] = "";
    struct dataset d;
    snprintf(path, sizeof(path), "%s/ok.bin", tmpdir);
    write_tokens(path, DATA_MAGIC, DATA_VERSION, 5000, 5000);
    ck_assert_int_eq(dataset_open(&d, path, 100, 0.1, 32, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "token 199 is outside the model's vocabulary of 100"), "%s", err);
    snprintf(path, sizeof(path), "%s/small.txt", tmpdir);
    write_file(path, "hello world\n", 12);
    ck_assert_int_eq(dataset_open(&d, path, 256, 0.1, 32, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "too few"), "%s", err);
    snprintf(path, sizeof(path), "%s/missing.txt", tmpdir);
    ck_assert_int_eq(dataset_open(&d, path, 256, 0.1, 32, err, sizeof(err)), -ENOENT);
}
END_TEST

START_TEST(batches_are_pure_functions)
{
    char err[512] = "";
    struct dataset d;
    ck_assert_int_eq(dataset_open(&d, textpath, 256, 0.1, 16, err, sizeof(err)), 0);
    ck_assert_int_eq(d.format, DATA_TEXT);
    int a[4 * 16], at[4 * 16], b[4 * 16], bt[4 * 16];
    dataset_train_batch(&d, a, at, 4, 16, 7, 3, 1, 0, 1);
    dataset_train_batch(&d, b, bt, 4, 16, 7, 3, 1, 0, 1);
    ck_assert_int_eq(memcmp(a, b, sizeof(a)), 0);
    ck_assert_int_eq(memcmp(at, bt, sizeof(at)), 0);
    ck_assert_int_eq(a[1], at[0]); /* targets are the inputs shifted by one */
    dataset_train_batch(&d, b, bt, 4, 16, 7, 4, 1, 0, 1);
    ck_assert_int_ne(memcmp(a, b, sizeof(a)), 0);
    /* rank 1 of 2 with micro-batch 2 reads sequences 6, 7 of micro-step 1
     * of the step: the same as the second half of world 1's micro-batch 4 */
    int r[2 * 16], rt[2 * 16];
    dataset_train_batch(&d, r, rt, 2, 16, 7, 3, 1, 1, 2);
    ck_assert_int_eq(memcmp(r, a + 2 * 16, sizeof(r)), 0);
    /* validation batches come from the held-out tail */
    dataset_val_batch(&d, a, at, 4, 16, 7, 0);
    dataset_val_batch(&d, b, bt, 4, 16, 7, 0);
    ck_assert_int_eq(memcmp(a, b, sizeof(a)), 0);
    dataset_close(&d);
}
END_TEST

static void run_steps(struct trainer *tr, int n, double *losses)
{
    char err[512] = "";
    for (int i = 0; i < n; i++) {
        struct train_step_info info;
        ck_assert_msg(trainer_step(tr, &info, err, sizeof(err)) == 0, "%s", err);
        losses[i] = info.loss;
    }
}

START_TEST(resume_is_bit_exact)
{
    struct job_spec s;
    struct trainer a, b, c;
    char err[512] = "", dir[128], path[256];
    double straight[20], first[10], second[10];
    tiny_spec(&s);
    ck_assert_int_eq(trainer_init(&a, &s, 0, 1, NULL, err, sizeof(err)), 0);
    run_steps(&a, 20, straight);
    ck_assert_msg(straight[19] < straight[0] - 0.5, "did not learn: %f -> %f", straight[0],
                  straight[19]);

    snprintf(dir, sizeof(dir), "%s/ckpt", tmpdir);
    ck_assert_int_eq(trainer_init(&b, &s, 0, 1, NULL, err, sizeof(err)), 0);
    run_steps(&b, 10, first);
    ck_assert_msg(trainer_save(&b, dir, path, sizeof(path), err, sizeof(err)) == 0, "%s", err);
    ck_assert_str_eq(strrchr(path, '/'), "/step-00000010");
    trainer_free(&b);

    ck_assert_int_eq(trainer_init(&c, &s, 0, 1, NULL, err, sizeof(err)), 0);
    ck_assert_msg(trainer_load(&c, dir, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(c.step, 10);
    run_steps(&c, 10, second);
    for (int i = 0; i < 10; i++) {
        ck_assert_msg(memcmp(&first[i], &straight[i], sizeof(double)) == 0,
                      "step %d: %.17g vs %.17g", i + 1, first[i], straight[i]);
        ck_assert_msg(memcmp(&second[i], &straight[10 + i], sizeof(double)) == 0,
                      "step %d after resume: %.17g, uninterrupted %.17g", 11 + i, second[i],
                      straight[10 + i]);
    }
    ck_assert_int_eq(memcmp(a.zero.params, c.zero.params, sizeof(float) * a.model.layout.total), 0);
    ck_assert_int_eq(memcmp(a.zero.v, c.zero.v, sizeof(float) * a.model.layout.total), 0);
    trainer_free(&a);
    trainer_free(&c);
}
END_TEST

START_TEST(checkpoint_of_another_model_is_refused)
{
    struct job_spec s;
    struct trainer a, b;
    char err[512] = "", dir[128];
    tiny_spec(&s);
    s.steps = 2;
    snprintf(dir, sizeof(dir), "%s/ckpt", tmpdir);
    ck_assert_int_eq(trainer_init(&a, &s, 0, 1, NULL, err, sizeof(err)), 0);
    double l[2];
    run_steps(&a, 2, l);
    ck_assert_int_eq(trainer_save(&a, dir, NULL, 0, err, sizeof(err)), 0);
    trainer_free(&a);
    snprintf(s.model, sizeof(s.model), "small");
    s.batch = 2;
    s.micro_batch = 1;
    ck_assert_int_eq(trainer_init(&b, &s, 0, 1, NULL, err, sizeof(err)), 0);
    ck_assert_int_eq(trainer_load(&b, dir, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "of another model: L is 2 there (preset tiny), 4 here (preset small)"),
                  "message was: %s", err);
    trainer_free(&b);
}
END_TEST

START_TEST(damaged_checkpoint_is_refused)
{
    struct job_spec s;
    struct trainer a;
    char err[512] = "", dir[128], shard[256];
    tiny_spec(&s);
    snprintf(dir, sizeof(dir), "%s/ckpt", tmpdir);
    ck_assert_int_eq(trainer_init(&a, &s, 0, 1, NULL, err, sizeof(err)), 0);
    double l[1];
    run_steps(&a, 1, l);
    ck_assert_int_eq(trainer_save(&a, dir, NULL, 0, err, sizeof(err)), 0);
    snprintf(shard, sizeof(shard), "%s/step-00000001/rank-00000.bin", dir);
    FILE *f = fopen(shard, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, 1000, SEEK_SET);
    fputc(0x5a, f);
    fclose(f);
    ck_assert_int_eq(trainer_load(&a, dir, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "checksum") && strstr(err, "file damaged"), "message was: %s", err);
    ck_assert_int_eq(trainer_load(&a, tmpdir, err, sizeof(err)), -ENOENT);
    trainer_free(&a);
}
END_TEST

/* The sampler the GPU path uses on weights gathered to the host gives the
 * trainer's tokens, past the context length too. */
START_TEST(sampling_a_whole_model_matches_the_trainer)
{
    struct job_spec s;
    struct trainer a;
    struct gpt g;
    char err[512] = "";
    int want[40], got[40];
    tiny_spec(&s);
    ck_assert_int_eq(trainer_init(&a, &s, 0, 1, NULL, err, sizeof(err)), 0);
    double l[3];
    run_steps(&a, 3, l);
    trainer_sample(&a, '\n', want, 40);
    ck_assert_int_eq(gpt_create(&g, &a.model.cfg, 1, a.spec.seq_len), 0);
    memcpy(g.params, a.zero.params, sizeof(float) * g.layout.total);
    train_sample_model(&g, (uint64_t)a.spec.seed, a.step, a.spec.seq_len, '\n', got, 40);
    ck_assert_int_eq(memcmp(want, got, sizeof(want)), 0);
    gpt_destroy(&g);
    trainer_free(&a);
}
END_TEST

START_TEST(nan_loss_names_the_step)
{
    struct job_spec s;
    struct trainer a;
    char err[512] = "";
    tiny_spec(&s);
    ck_assert_int_eq(trainer_init(&a, &s, 0, 1, NULL, err, sizeof(err)), 0);
    a.fault_nan_step = 2;
    double l[2];
    run_steps(&a, 2, l);
    struct train_step_info info;
    ck_assert_int_eq(trainer_step(&a, &info, err, sizeof(err)), -ERANGE);
    ck_assert_msg(strstr(err, "step 3: loss is nan") && strstr(err, "wte of unit 0 (embed)"),
                  "message was: %s", err);
    trainer_free(&a);
}
END_TEST

START_TEST(bad_batch_split_is_refused)
{
    struct job_spec s;
    struct trainer a;
    char err[512] = "";
    tiny_spec(&s);
    s.batch = 5;
    ck_assert_int_eq(trainer_init(&a, &s, 0, 1, NULL, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "not a multiple of micro_batch (2)"), "message was: %s", err);
    tiny_spec(&s);
    s.seq_len = 64;
    ck_assert_int_eq(trainer_init(&a, &s, 0, 1, NULL, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "exceeds the model's context T = 32"), "message was: %s", err);
}
END_TEST

/* ---- the stop, checkpoint and yield vote ---- */

START_TEST(vote_counts_three_questions_from_one_sum)
{
    for (int world = 1; world <= 9; world++)
        for (int nstop = 0; nstop <= world; nstop++)
            for (int nckpt = 0; nckpt <= world; nckpt++)
                for (int nyield = 0; nyield <= world; nyield++) {
                    /* the first nstop ranks ask to stop, the last nckpt for a checkpoint,
                     * every other one from rank 1 on to yield (up to nyield) */
                    double sum = 0;
                    for (int r = 0, y = 0; r < world; r++) {
                        int yield = y < nyield && (r % 2 == 1 || world - r <= nyield - y);
                        y += yield;
                        sum += train_vote_share(r < nstop, r >= world - nckpt, yield, world);
                    }
                    struct train_vote v = train_vote_count(sum, world);
                    ck_assert_msg(v.stop == nstop && v.checkpoint == nckpt && v.yield == nyield,
                                  "world %d, %d stop, %d checkpoint and %d yield votes read as %d, %d, %d",
                                  world, nstop, nckpt, nyield, v.stop, v.checkpoint, v.yield);
                }
    /* the largest world the vote allows: every rank asking everything */
    const int big = (1 << 17) - 1;
    struct train_vote v = train_vote_count((double)big * train_vote_share(1, 1, 1, big), big);
    ck_assert(v.stop == big && v.checkpoint == big && v.yield == big);
    v = train_vote_count((double)(big - 1) * train_vote_share(0, 1, 1, big) + train_vote_share(1, 0, 0, big), big);
    ck_assert(v.stop == 1 && v.checkpoint == big - 1 && v.yield == big - 1);
}
END_TEST

/* Ranks as threads over a fake trainer whose steps only count and whose sum
 * goes through shared memory: the vote, the loop and nothing else. */
#define VOTE_WORLD 3
#define VOTE_STEPS 8

struct vote_world {
    pthread_barrier_t bar;
    double slot[VOTE_WORLD];
    struct job_spec spec;
};

struct vote_rank {
    struct vote_world *w;
    int rank;
    long step, last_checkpoint;
    long saved[VOTE_STEPS + 2];
    int nsaved;
    int ask_at[2];                  /* steps after which this rank's control thread
                                     * "receives" a request (-1: none) */
    volatile sig_atomic_t requests; /* what the control thread raises */
    int yield_at;                   /* step after which it "receives" a yield (0: none) */
    volatile sig_atomic_t yield;
    long answered;                  /* requests the loop answered, over its runs */
    long rc;                        /* what train_loop_run returned */
};

static int vote_step(void *tr, struct train_step_info *info, char *err, size_t errlen)
{
    (void)err, (void)errlen;
    struct vote_rank *r = tr;
    r->step++;
    for (int i = 0; i < 2; i++)
        if (r->ask_at[i] == r->step)
            r->requests = r->requests + 1;
    if (r->yield_at && r->yield_at == r->step)
        r->yield = 1;
    memset(info, 0, sizeof(*info));
    info->step = r->step;
    return 0;
}

static int vote_sum(void *tr, double *x)
{
    struct vote_rank *r = tr;
    r->w->slot[r->rank] = *x;
    pthread_barrier_wait(&r->w->bar);
    double s = 0;
    for (int i = 0; i < VOTE_WORLD; i++)
        s += r->w->slot[i];
    pthread_barrier_wait(&r->w->bar);
    *x = s;
    return 0;
}

static int vote_save(void *tr, const char *dir, char *path, size_t pathlen, char *err,
                     size_t errlen)
{
    (void)dir, (void)err, (void)errlen;
    struct vote_rank *r = tr;
    double x = 0;
    vote_sum(tr, &x); /* a checkpoint is collective: a mismatch would hang here */
    r->saved[r->nsaved++] = r->step;
    r->last_checkpoint = r->step;
    snprintf(path, pathlen, "step-%ld", r->step);
    return 0;
}

static int vote_failed(void *tr, int rc, const char *what, char *err, size_t errlen)
{
    (void)tr;
    snprintf(err, errlen, "%s failed", what);
    return rc;
}

static const struct train_ops vote_ops = {vote_step, NULL, vote_sum, vote_save, vote_failed};

static void *vote_rank_main(void *arg)
{
    struct vote_rank *r = arg;
    struct train_loop l = {.ops = &vote_ops, .tr = r, .spec = &r->w->spec, .step = &r->step,
                           .last_checkpoint = &r->last_checkpoint, .rank = r->rank,
                           .world = VOTE_WORLD};
    struct train_hooks hooks = {.checkpoint_requests = &r->requests, .checkpoints_answered = &r->answered,
                                .yield = &r->yield};
    char err[128];
    r->rc = train_loop_run(&l, 0, &hooks, NULL, err, sizeof(err));
    return NULL;
}

/* Runs VOTE_WORLD ranks of the fake trainer to their end. */
static void vote_run(struct vote_world *w, struct vote_rank *r)
{
    pthread_t th[VOTE_WORLD];
    for (int i = 0; i < VOTE_WORLD; i++)
        ck_assert_int_eq(pthread_create(&th[i], NULL, vote_rank_main, &r[i]), 0);
    for (int i = 0; i < VOTE_WORLD; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&w->bar);
}

static void vote_world_init(struct vote_world *w)
{
    memset(w, 0, sizeof(*w));
    job_spec_defaults(&w->spec);
    w->spec.steps = VOTE_STEPS;
    w->spec.eval_every = 0;
    w->spec.checkpoint_every = 0;
    snprintf(w->spec.checkpoint_dir, sizeof(w->spec.checkpoint_dir), "unused");
    pthread_barrier_init(&w->bar, NULL, VOTE_WORLD);
}

/* A yield reaches rank 1 after step 3 and the others after step 5: every
 * rank leaves at the boundary after step 3 (TRAIN_YIELDED, no final
 * checkpoint); a checkpoint asked for at the same boundary is taken first. */
START_TEST(yield_leaves_the_generation_at_one_step_boundary)
{
    struct vote_world w;
    vote_world_init(&w);
    static struct vote_rank r[VOTE_WORLD];
    const int yield_at[VOTE_WORLD] = {5, 3, 5}, ask_at[VOTE_WORLD] = {-1, -1, 3};
    for (int i = 0; i < VOTE_WORLD; i++)
        r[i] = (struct vote_rank){.w = &w, .rank = i, .last_checkpoint = -1, .ask_at = {ask_at[i], -1},
                                  .yield_at = yield_at[i]};
    vote_run(&w, r);
    for (int i = 0; i < VOTE_WORLD; i++) {
        ck_assert_msg(r[i].rc == TRAIN_YIELDED, "rank %d returned %ld", i, r[i].rc);
        ck_assert_msg(r[i].step == 3, "rank %d left at step %ld, expected 3", i, r[i].step);
        ck_assert_msg(r[i].nsaved == 1 && r[i].saved[0] == 3, "rank %d: %d checkpoints", i, r[i].nsaved);
    }
}
END_TEST

/* One request reaches the ranks after steps 2, 3 and 4; a second reaches
 * rank 2 after step 5 and the others after step 6. Every rank checkpoints
 * at step 2 (the first to ask carries the vote) and at step 5, never twice
 * for one request, and at the end. */
START_TEST(requested_checkpoint_is_taken_by_every_rank_at_one_step)
{
    struct vote_world w;
    vote_world_init(&w);
    static struct vote_rank r[VOTE_WORLD];
    const int first[VOTE_WORLD] = {2, 3, 4}, second[VOTE_WORLD] = {6, 6, 5};
    for (int i = 0; i < VOTE_WORLD; i++)
        r[i] = (struct vote_rank){.w = &w, .rank = i, .last_checkpoint = -1, .ask_at = {first[i], second[i]}};
    vote_run(&w, r);
    for (int i = 0; i < VOTE_WORLD; i++)
        ck_assert_int_eq(r[i].rc, 0);
    const long want[] = {2, 5, VOTE_STEPS};
    for (int i = 0; i < VOTE_WORLD; i++) {
        ck_assert_int_eq(r[i].step, VOTE_STEPS);
        ck_assert_msg(r[i].nsaved == 3, "rank %d took %d checkpoints, expected 3", i,
                      r[i].nsaved);
        for (int k = 0; k < 3; k++)
            ck_assert_msg(r[i].saved[k] == want[k], "rank %d: checkpoint %d at step %ld, expected %ld",
                          i, k, r[i].saved[k], want[k]);
    }
}
END_TEST

/* A request answered at step 2, a yield at step 5: in the grown generation
 * the ranks run the loop again, and the request already answered is not
 * answered again with a checkpoint at step 5 (only the one at the end). */
START_TEST(answered_request_is_not_taken_again_after_a_yield)
{
    struct vote_world w;
    vote_world_init(&w);
    static struct vote_rank r[VOTE_WORLD];
    for (int i = 0; i < VOTE_WORLD; i++)
        r[i] = (struct vote_rank){.w = &w, .rank = i, .last_checkpoint = -1, .ask_at = {2, -1}, .yield_at = 5};
    vote_run(&w, r);
    for (int i = 0; i < VOTE_WORLD; i++) {
        ck_assert_msg(r[i].rc == TRAIN_YIELDED && r[i].step == 5, "rank %d: %ld at step %ld", i, r[i].rc, r[i].step);
        r[i].yield = 0; /* rank_ctl_next_generation */
        r[i].yield_at = 0;
    }
    pthread_barrier_init(&w.bar, NULL, VOTE_WORLD);
    vote_run(&w, r);
    const long want[] = {2, VOTE_STEPS};
    for (int i = 0; i < VOTE_WORLD; i++) {
        ck_assert_int_eq(r[i].rc, 0);
        ck_assert_msg(r[i].nsaved == 2, "rank %d took %d checkpoints (the second at step %ld), expected 2", i,
                      r[i].nsaved, r[i].saved[1]);
        for (int k = 0; k < 2; k++)
            ck_assert_int_eq(r[i].saved[k], want[k]);
    }
}
END_TEST

/* OpenBLAS's own choice, as the library makes it when it loads. */
extern void gotoblas_dynamic_init(void) __attribute__((weak));
extern void gotoblas_dynamic_quit(void) __attribute__((weak));

static void blas_choose(const char *coretype)
{
    setenv("OPENBLAS_CORETYPE", coretype, 1);
    gotoblas_dynamic_quit();
    gotoblas_dynamic_init();
    unsetenv("OPENBLAS_CORETYPE");
}

/* The generic kernels OpenBLAS falls back to on a CPU it does not know are
 * replaced in this process, and matrix products still compute. */
START_TEST(blas_generic_kernels_are_replaced_in_place)
{
    if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit)
        return; /* an OpenBLAS built for one CPU: nothing to choose */
    __builtin_cpu_init();
    blas_choose("Prescott");
    ck_assert_str_eq(openblas_get_corename(), "Prescott");
    const char *got = blas_core_fix();
    if (!__builtin_cpu_supports("avx2")) {
        ck_assert_ptr_null(got);
        return;
    }
    const char *want = __builtin_cpu_supports("avx512f") ? "SkylakeX" : "Haswell";
    ck_assert_ptr_nonnull(got);
    ck_assert_str_eq(got, want);
    ck_assert_str_eq(openblas_get_corename(), want);
    ck_assert_ptr_null(getenv("OPENBLAS_CORETYPE"));
    float a[4] = {1, 2, 3, 4}, b[4] = {5, 6, 7, 8}, c[4] = {0};
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 2, 2, 2, 1.0f, a, 2, b, 2, 0.0f, c, 2);
    ck_assert_float_eq(c[0], 19);
    ck_assert_float_eq(c[3], 50);
    /* Kernels the library chose by itself are left as they are. */
    ck_assert_ptr_null(blas_core_fix());
}
END_TEST

/* A user's OPENBLAS_CORETYPE wins, even when it names the generic kernels. */
START_TEST(blas_users_coretype_is_left_alone)
{
    if (!gotoblas_dynamic_init || !gotoblas_dynamic_quit)
        return;
    blas_choose("Prescott");
    setenv("OPENBLAS_CORETYPE", "Prescott", 1);
    ck_assert_ptr_null(blas_core_fix());
    ck_assert_str_eq(openblas_get_corename(), "Prescott");
    ck_assert_str_eq(getenv("OPENBLAS_CORETYPE"), "Prescott");
}
END_TEST

Suite *make_train_suite(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("data");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, token_file_is_read);
    tcase_add_test(tc, truncated_token_file_is_refused);
    tcase_add_test(tc, wrong_magic_is_refused_saying_what_was_there);
    tcase_add_test(tc, tokens_outside_vocab_and_tiny_files_are_refused);
    tcase_add_test(tc, batches_are_pure_functions);
    suite_add_tcase(s, tc);
    tc = tcase_create("loop");
    tcase_set_timeout(tc, 120);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, resume_is_bit_exact);
    tcase_add_test(tc, checkpoint_of_another_model_is_refused);
    tcase_add_test(tc, damaged_checkpoint_is_refused);
    tcase_add_test(tc, sampling_a_whole_model_matches_the_trainer);
    tcase_add_test(tc, nan_loss_names_the_step);
    tcase_add_test(tc, bad_batch_split_is_refused);
    tcase_add_test(tc, blas_generic_kernels_are_replaced_in_place);
    tcase_add_test(tc, blas_users_coretype_is_left_alone);
    suite_add_tcase(s, tc);
    tc = tcase_create("vote");
    tcase_set_timeout(tc, 30);
    tcase_add_test(tc, vote_counts_three_questions_from_one_sum);
    tcase_add_test(tc, yield_leaves_the_generation_at_one_step_boundary);
    tcase_add_test(tc, requested_checkpoint_is_taken_by_every_rank_at_one_step);
    tcase_add_test(tc, answered_request_is_not_taken_again_after_a_yield);
    suite_add_tcase(s, tc);
    return s;
}
