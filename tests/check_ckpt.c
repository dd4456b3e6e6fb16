/*
 * ckpt over struct ckpt_rank, without a trainer: ranks are threads of this
 * process whose all-gather goes through shared memory. A rank's shards are
 * cut as the CPU path cuts them (zero_shards_init: S = ceil(numel / N), the
 * embedding at whole rows), as it cut them before (ceil(numel / N) for every
 * unit: checkpoints written then), or as the GPU path does (ceil(numel / N)
 * rounded up to 64 floats, worker/train/gpu/gpu_zero.cu); a checkpoint saved
 * with one slicing at N ranks loads with another at M ranks bit for bit, and
 * the CPU trainer resumes from a GPU-sliced one.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "worker/train/ckpt.h"
#include "worker/train/layers.h"
#include "worker/train/train.h"

#define MAXW 4
#define GPU_ALIGN 64

enum slicing { CPU, CPU_ROWS_BEFORE, GPU };
static const char *const slicing_name[] = {"CPU", "CPU before whole embedding rows", "GPU"};

static char tmpdir[] = "/tmp/check-ckpt-XXXXXX";
static char textpath[sizeof(tmpdir) + 32];

static void setup(void)
{
    ck_assert_ptr_nonnull(mkdtemp(tmpdir));
    snprintf(textpath, sizeof(textpath), "%s/text.txt", tmpdir);
    FILE *f = fopen(textpath, "wb");
    ck_assert_ptr_nonnull(f);
    for (int i = 0; i < 400; i++)
        fputs("to be or not to be, that is the question\n", f);
    fclose(f);
    layers_set_threads(1);
}

static void teardown(void)
{
    char cmd[sizeof(tmpdir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", tmpdir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(tmpdir, "/tmp/check-ckpt-XXXXXX");
}

/* tiny with a context of 30: the embedding's 286 rows do not split evenly
 * over 3 or 4 ranks, so the CPU path's whole rows differ from ceil(numel / N) */
static void tiny_spec(struct job_spec *s)
{
    job_spec_defaults(s);
    snprintf(s->model, sizeof(s->model), "tiny");
    s->context = 30;
    snprintf(s->data, sizeof(s->data), "%s", textpath);
    s->steps = 20;
    s->batch = 4;
    s->micro_batch = 2;
    s->eval_every = 0;
}

/* A whole model's state: a distinct float per index and array. */
struct full {
    struct gpt_config cfg;
    struct gpt_layout lay;
    float *a[3]; /* params, m, v */
};

static void full_init(struct full *f, int fill)
{
    struct job_spec s;
    char err[128];
    tiny_spec(&s);
    ck_assert_int_eq(job_spec_model(&s, &f->cfg, err, sizeof(err)), 0);
    gpt_layout_init(&f->lay, &f->cfg);
    for (int k = 0; k < 3; k++) {
        f->a[k] = calloc(f->lay.total, sizeof(float));
        ck_assert_ptr_nonnull(f->a[k]);
        for (size_t i = 0; fill && i < f->lay.total; i++)
            f->a[k][i] = (float)(k + 1) * 1e-3f * (float)((i * 2654435761u) % 10007) - 5.0f;
    }
}

static void full_free(struct full *f)
{
    for (int k = 0; k < 3; k++)
        free(f->a[k]);
}

/* One world of ranks as threads, all-gathering through `slots`. */
/* Words a rank may put into one all-gather here: the spread load is held
 * to fewer (SPREAD_WORDS), so that it ships a unit in several rounds. */
#define SLOT_WORDS 4096
#define SPREAD_WORDS 700

struct world {
    int n;
    enum slicing slicing;
    pthread_barrier_t bar;
    uint64_t slots[MAXW * SLOT_WORDS];
    struct job_spec spec;
    struct dataset data;
    struct full *full;
    const char *dir;
    const char *const *dirs; /* rank r's view of the directory (NULL: dir for all) */
    int save;
    long step;
    int rc[MAXW];
    long got_step[MAXW];
    char err[MAXW][512];
};

struct rank_arg {
    struct world *w;
    int rank;
};

static int shared_gather(void *coll, const uint64_t *mine, size_t n, uint64_t *all)
{
    struct rank_arg *a = coll;
    struct world *w = a->w;
    ck_assert_uint_le(n, SLOT_WORDS);
    memcpy(w->slots + (size_t)a->rank * n, mine, sizeof(uint64_t) * n);
    pthread_barrier_wait(&w->bar);
    memcpy(all, w->slots, sizeof(uint64_t) * n * (size_t)w->n);
    pthread_barrier_wait(&w->bar);
    return 0;
}

static const char *no_why(void *coll, int rc)
{
    (void)coll, (void)rc;
    return "shared-memory gather cannot fail";
}

static size_t shard_size(const struct full *f, int u, int world, enum slicing slicing)
{
    struct zero_shards p;
    size_t s = (f->lay.numel[u] + (size_t)world - 1) / (size_t)world;
    switch (slicing) {
    case CPU:
        zero_shards_init(&p, &f->lay, world, 1);
        return p.shard[u];
    case CPU_ROWS_BEFORE: return s;
    case GPU: return (s + GPU_ALIGN - 1) / GPU_ALIGN * GPU_ALIGN;
    }
    return 0;
}

static void *rank_main(void *arg)
{
    struct rank_arg *a = arg;
    struct world *w = a->w;
    struct full *f = w->full;
    struct ckpt_rank c;
    memset(&c, 0, sizeof(c));
    c.spec = &w->spec;
    c.data = &w->data;
    c.cfg = f->cfg;
    c.lay = f->lay;
    c.beta1 = 0.9f, c.beta2 = 0.95f, c.eps = 1e-8f;
    c.step = w->step;
    c.rank = a->rank;
    c.world = w->n;
    size_t total = 0;
    for (int u = 0; u < f->lay.nunits; u++) {
        c.shard[u] = shard_size(f, u, w->n, w->slicing);
        c.off[u] = total;
        total += c.shard[u];
    }
    float *bufs[3];
    for (int k = 0; k < 3; k++)
        bufs[k] = calloc(total, sizeof(float));
    c.params = bufs[0], c.m = bufs[1], c.v = bufs[2];
    c.gather = shared_gather;
    c.why = no_why;
    c.coll = a;
    c.gather_max = SPREAD_WORDS;
    /* the floats this rank owns, [rank*S, rank*S + n) of each unit */
    for (int u = 0; u < f->lay.nunits; u++) {
        size_t lo = (size_t)a->rank * c.shard[u], n = 0;
        if (lo < f->lay.numel[u])
            n = f->lay.numel[u] - lo < c.shard[u] ? f->lay.numel[u] - lo : c.shard[u];
        for (int k = 0; k < 3 && w->save; k++)
            memcpy(bufs[k] + c.off[u], f->a[k] + f->lay.offset[u] + lo, sizeof(float) * n);
    }
    const char *dir = w->dirs ? w->dirs[a->rank] : w->dir;
    int rc = w->save ? ckpt_save(&c, dir, NULL, 0, w->err[a->rank], sizeof(w->err[0]))
                     : ckpt_load(&c, dir, w->err[a->rank], sizeof(w->err[0]));
    w->rc[a->rank] = rc;
    w->got_step[a->rank] = c.step;
    for (int u = 0; u < f->lay.nunits && !rc && !w->save; u++) {
        size_t lo = (size_t)a->rank * c.shard[u];
        for (size_t j = 0; j < c.shard[u]; j++) {
            /* real floats go back into the whole model; padding must stay zero */
            int real = lo + j < f->lay.numel[u];
            for (int k = 0; k < 3; k++) {
                float x = bufs[k][c.off[u] + j];
                if (real)
                    f->a[k][f->lay.offset[u] + lo + j] = x;
                else if (x != 0.0f)
                    w->rc[a->rank] = -EDOM;
            }
        }
    }
    for (int k = 0; k < 3; k++)
        free(bufs[k]);
    return NULL;
}

/* Runs n ranks saving (or loading) f at step `step`, rank r in dirs[r]
 * (dirs NULL: all in dir), with the CPU or GPU slicing; the world, for its
 * results (free it). */
static struct world *run_ranks(struct full *f, const char *dir, const char *const *dirs, int n,
                               enum slicing slicing, int save, long step)
{
    struct world *w = calloc(1, sizeof(*w));
    ck_assert_ptr_nonnull(w);
    w->n = n;
    w->slicing = slicing;
    w->full = f;
    w->dir = dir;
    w->dirs = dirs;
    w->save = save;
    w->step = step;
    tiny_spec(&w->spec);
    w->data = (struct dataset){.format = DATA_TEXT, .ntokens = 16400, .ntrain = 14760};
    pthread_barrier_init(&w->bar, NULL, (unsigned)n);
    pthread_t th[MAXW];
    struct rank_arg args[MAXW];
    for (int r = 0; r < n; r++) {
        args[r] = (struct rank_arg){w, r};
        ck_assert_int_eq(pthread_create(&th[r], NULL, rank_main, &args[r]), 0);
    }
    for (int r = 0; r < n; r++)
        pthread_join(th[r], NULL);
    pthread_barrier_destroy(&w->bar);
    return w;
}

/* run_ranks at step 7 where every rank must succeed. */
static void run_dirs(struct full *f, const char *dir, const char *const *dirs, int n, enum slicing slicing,
                     int save)
{
    struct world *w = run_ranks(f, dir, dirs, n, slicing, save, 7);
    for (int r = 0; r < n; r++) {
        ck_assert_msg(w->rc[r] == 0, "%s at world %d (%s slicing), rank %d: %d %s",
                      save ? "save" : "load", n, slicing_name[slicing], r, w->rc[r], w->err[r]);
        if (!save)
            ck_assert_int_eq(w->got_step[r], 7);
    }
    free(w);
}

static void run_world(struct full *f, const char *dir, int n, enum slicing slicing, int save)
{
    run_dirs(f, dir, NULL, n, slicing, save);
}

static void same_model(const struct full *got, const struct full *ref, const char *what)
{
    for (int a = 0; a < 3; a++)
        ck_assert_msg(memcmp(got->a[a], ref->a[a], sizeof(float) * ref->lay.total) == 0,
                      "%s: array %d differs", what, a);
}

/* Saved with one slicing at N ranks, loaded with the other at M: the same bits. */
START_TEST(slicings_and_worlds_load_each_other)
{
    static const struct {
        int n;
        enum slicing n_slicing;
        int m;
        enum slicing m_slicing;
    } cases[] = {
        {3, GPU, 2, CPU}, {2, CPU, 3, GPU}, {1, CPU, 4, GPU}, {4, GPU, 1, CPU}, {4, GPU, 4, GPU},
        {2, GPU, 2, CPU}, {2, CPU_ROWS_BEFORE, 2, CPU}, {3, CPU_ROWS_BEFORE, 4, CPU},
        {3, CPU, 3, CPU},
    };
    struct full ref;
    full_init(&ref, 1);
    for (size_t k = 0; k < sizeof(cases) / sizeof(cases[0]); k++) {
        char dir[128];
        snprintf(dir, sizeof(dir), "%s/c%zu", tmpdir, k);
        run_world(&ref, dir, cases[k].n, cases[k].n_slicing, 1);
        struct full got;
        full_init(&got, 0);
        run_world(&got, dir, cases[k].m, cases[k].m_slicing, 0);
        for (int a = 0; a < 3; a++)
            ck_assert_msg(memcmp(got.a[a], ref.a[a], sizeof(float) * ref.lay.total) == 0,
                          "%d ranks (%s) -> %d ranks (%s): array %d differs", cases[k].n,
                          slicing_name[cases[k].n_slicing], cases[k].m,
                          slicing_name[cases[k].m_slicing], a);
        full_free(&got);
    }
    full_free(&ref);
}
END_TEST

/* The manifest records the writer's shard sizes, and the files hold them. */
START_TEST(manifest_records_the_writers_shard_size)
{
    struct full ref;
    full_init(&ref, 1);
    char dir[128], file[192];
    snprintf(dir, sizeof(dir), "%s/gpu4", tmpdir);
    run_world(&ref, dir, 4, GPU, 1);
    snprintf(file, sizeof(file), "%s/step-00000007/manifest.json", dir);
    json_error_t jerr;
    json_t *man = json_load_file(file, 0, &jerr);
    ck_assert_msg(man != NULL, "%s", jerr.text);
    json_t *units = json_object_get(man, "units");
    size_t floats = 0;
    for (int u = 0; u < ref.lay.nunits; u++) {
        json_int_t S = json_integer_value(json_object_get(json_array_get(units, (size_t)u),
                                                          "shard_numel"));
        ck_assert_int_eq(S, (json_int_t)shard_size(&ref, u, 4, GPU));
        ck_assert_int_eq(S % GPU_ALIGN, 0);
        floats += (size_t)S;
    }
    json_int_t bytes = json_integer_value(
        json_object_get(json_array_get(json_object_get(man, "files"), 3), "bytes"));
    ck_assert_int_eq(bytes, (json_int_t)(8 + 16 + 8 * (size_t)ref.lay.nunits + 12 * floats));
    json_decref(man);
    full_free(&ref);
}
END_TEST

/* A shard size that cannot cover its unit is refused with what it expected. */
START_TEST(impossible_shard_size_is_refused)
{
    struct full ref;
    full_init(&ref, 1);
    char dir[128], file[192], err[512] = "";
    snprintf(dir, sizeof(dir), "%s/bad", tmpdir);
    run_world(&ref, dir, 2, CPU, 1);
    snprintf(file, sizeof(file), "%s/step-00000007/manifest.json", dir);
    json_error_t jerr;
    json_t *man = json_load_file(file, 0, &jerr);
    ck_assert_ptr_nonnull(man);
    json_object_set_new(json_array_get(json_object_get(man, "units"), 1), "shard_numel",
                        json_integer(1000));
    ck_assert_int_eq(json_dump_file(man, file, 0), 0);
    json_decref(man);
    struct job_spec s;
    struct trainer tr;
    tiny_spec(&s);
    ck_assert_int_eq(trainer_init(&tr, &s, 0, 1, NULL, err, sizeof(err)), 0);
    ck_assert_int_eq(trainer_load(&tr, dir, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "unit 1: shard_numel 1000 cannot split 3280 floats over 2 ranks "
                              "(expected 1640 to"),
                  "message was: %s", err);
    trainer_free(&tr);
    full_free(&ref);
}
END_TEST

/* The CPU trainer resumes from what GPU-sliced ranks wrote, and its own
 * checkpoint of those weights loads back into the GPU slicing unchanged. */
START_TEST(cpu_trainer_resumes_from_gpu_slicing)
{
    struct full ref;
    full_init(&ref, 1);
    char dir[128], back[128], err[512] = "";
    snprintf(dir, sizeof(dir), "%s/from-gpu", tmpdir);
    snprintf(back, sizeof(back), "%s/from-cpu", tmpdir);
    run_world(&ref, dir, 3, GPU, 1);
    struct job_spec s;
    struct trainer tr;
    tiny_spec(&s);
    ck_assert_int_eq(trainer_init(&tr, &s, 0, 1, NULL, err, sizeof(err)), 0);
    ck_assert_msg(trainer_load(&tr, dir, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(tr.step, 7);
    ck_assert_int_eq(tr.last_checkpoint_step, 7);
    const float *mine[3] = {tr.zero.params, tr.zero.m, tr.zero.v};
    for (int a = 0; a < 3; a++)
        ck_assert_msg(memcmp(mine[a], ref.a[a], sizeof(float) * ref.lay.total) == 0,
                      "array %d differs after the CPU trainer loaded it", a);
    ck_assert_msg(trainer_save(&tr, back, NULL, 0, err, sizeof(err)) == 0, "%s", err);
    struct train_step_info info;
    ck_assert_msg(trainer_step(&tr, &info, err, sizeof(err)) == 0, "%s", err);
    ck_assert_int_eq(info.step, 8);
    trainer_free(&tr);
    struct full got;
    full_init(&got, 0);
    run_world(&got, back, 2, GPU, 0);
    for (int a = 0; a < 3; a++)
        ck_assert_int_eq(memcmp(got.a[a], ref.a[a], sizeof(float) * ref.lay.total), 0);
    full_free(&got);
    full_free(&ref);
}
END_TEST

/* ---- pruning ---- */

static int plan_removes(struct ckpt_entry *e, size_t n, long step)
{
    for (size_t i = 0; i < n; i++)
        if (e[i].step == step)
            return e[i].remove;
    ck_abort_msg("no entry of step %ld", step);
    return 0;
}

/* keep 2 after committing 30: 25 and 30 stay, older committed ones go, the
 * one `latest` names stays, nothing past 30 is touched, debris goes, a live
 * writer's directory stays. */
START_TEST(prune_plan_keeps_the_newest_and_what_resume_needs)
{
    struct ckpt_entry e[] = {
        {5, CKPT_COMMITTED, 0},  {10, CKPT_COMMITTED, 0}, {15, CKPT_COMMITTED, 0},
        {20, CKPT_COMMITTED, 0}, {25, CKPT_COMMITTED, 0}, {30, CKPT_COMMITTED, 0},
        {35, CKPT_COMMITTED, 0}, {12, CKPT_UNCOMMITTED, 0}, {13, CKPT_ABANDONED, 0},
        {14, CKPT_WRITING, 0},   {16, CKPT_ASIDE, 0},     {31, CKPT_ABANDONED, 0},
        {40, CKPT_WRITING, 0},
    };
    const size_t n = sizeof(e) / sizeof(e[0]);
    ck_assert_int_eq(ckpt_prune_plan(e, n, 30, 10, 2), 6);
    const long gone[] = {5, 15, 20, 12, 13, 16}, kept[] = {10, 25, 30, 35, 14, 31, 40};
    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
        ck_assert_msg(plan_removes(e, n, gone[i]), "step %ld should go", gone[i]);
    for (size_t i = 0; i < sizeof(kept) / sizeof(kept[0]); i++)
        ck_assert_msg(!plan_removes(e, n, kept[i]), "step %ld should stay", kept[i]);
    /* keep 0 keeps every committed checkpoint and still clears debris */
    ck_assert_int_eq(ckpt_prune_plan(e, n, 30, 30, 0), 3);
    ck_assert(!plan_removes(e, n, 5));
    ck_assert(plan_removes(e, n, 12));
    /* keep 1: only the one just committed, and never that one */
    struct ckpt_entry one[] = {{7, CKPT_COMMITTED, 0}, {8, CKPT_COMMITTED, 0}};
    ck_assert_int_eq(ckpt_prune_plan(one, 2, 8, 8, 1), 1);
    ck_assert(one[0].remove && !one[1].remove);
    /* the committed one missing (another pruner raced): the newest stays */
    struct ckpt_entry lone[] = {{7, CKPT_COMMITTED, 0}};
    ck_assert_int_eq(ckpt_prune_plan(lone, 1, 8, -1, 1), 0);
}
END_TEST

static void mkdirs(const char *dir, const char *name, int manifest)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    ck_assert_int_eq(mkdir(p, 0755), 0);
    if (manifest) {
        snprintf(p, sizeof(p), "%s/%s/manifest.json", dir, name);
        FILE *f = fopen(p, "w");
        ck_assert_ptr_nonnull(f);
        fclose(f);
    }
}

static int exists(const char *dir, const char *name)
{
    char p[512];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

/* On disk, after a world of 2 commits step 7 with checkpoint_keep 2. */
START_TEST(save_prunes_old_checkpoints_and_debris_but_not_live_writers)
{
    struct full ref;
    full_init(&ref, 1);
    char dir[128], p[512];
    snprintf(dir, sizeof(dir), "%s/pruned", tmpdir);
    ck_assert_int_eq(mkdir(dir, 0755), 0);
    mkdirs(dir, "step-00000001", 1);
    mkdirs(dir, "step-00000003", 1);
    mkdirs(dir, "step-00000005", 1);
    mkdirs(dir, "step-00000004", 0);          /* uncommitted, left by a crash */
    mkdirs(dir, ".tmp-step-00000002-999", 0); /* its writer is gone */
    mkdirs(dir, ".tmp-step-00000006-998", 0); /* its writer holds the lock */
    mkdirs(dir, "step-00000009", 1);          /* past the commit: another writer's */
    mkdirs(dir, "notes", 0);                  /* not a checkpoint's */
    snprintf(p, sizeof(p), "%s/.tmp-step-00000006-998/.writer", dir);
    int live = open(p, O_RDWR | O_CREAT, 0644);
    ck_assert_int_ge(live, 0);
    ck_assert_int_eq(flock(live, LOCK_EX), 0);
    run_world(&ref, dir, 2, CPU, 1); /* step 7, tiny_spec's checkpoint_keep: the default 3 */
    ck_assert(exists(dir, "step-00000007/manifest.json"));
    ck_assert(!exists(dir, "step-00000007/.writer"));
    ck_assert(exists(dir, "step-00000005") && exists(dir, "step-00000003"));
    ck_assert(!exists(dir, "step-00000001"));
    ck_assert(!exists(dir, "step-00000004"));
    ck_assert(!exists(dir, ".tmp-step-00000002-999"));
    ck_assert(exists(dir, ".tmp-step-00000006-998"));
    ck_assert(exists(dir, "step-00000009") && exists(dir, "notes"));
    /* keep 1 on the same directory: 3 and 5 go, 7 stays as latest */
    char err[256];
    ck_assert_int_eq(ckpt_prune(dir, 7, 1, err, sizeof(err)), 2);
    ck_assert(exists(dir, "step-00000007") && !exists(dir, "step-00000005"));
    ck_assert(exists(dir, ".tmp-step-00000006-998"));
    close(live); /* the writer dies: its directory is debris now */
    ck_assert_int_eq(ckpt_prune(dir, 7, 1, err, sizeof(err)), 1);
    ck_assert(!exists(dir, ".tmp-step-00000006-998"));
    ck_assert(exists(dir, "step-00000007/manifest.json"));
    full_free(&ref);
}
END_TEST

/* ---- node-local directories ---- */

static void node_dirs(char node[3][128])
{
    for (int i = 0; i < 3; i++)
        snprintf(node[i], sizeof(node[i]), "%s/node%d", tmpdir, i);
}

/* Every rank of a world fails alike, with err holding `says`. */
static void all_fail(struct world *w, int rc, const char *says)
{
    for (int r = 0; r < w->n; r++) {
        ck_assert_msg(w->rc[r] == rc, "rank %d: %d (%s), expected %d", r, w->rc[r], w->err[r], rc);
        ck_assert_msg(!says || strstr(w->err[r], says), "rank %d said: %s", r, w->err[r]);
    }
    free(w);
}

/* Rank r's view of the directory is node r % 2's own disk: each node keeps
 * its ranks' files, a manifest and `latest`; the same placement loads what
 * each finds, another world or placement (a new, empty node among them)
 * gets the files shipped; the files of a node that is gone cannot be. */
START_TEST(node_local_directories_save_and_load)
{
    struct full ref, got;
    char node[3][128], file[256], what[128];
    full_init(&ref, 1);
    node_dirs(node);
    const char *four[] = {node[0], node[1], node[0], node[1]};
    run_dirs(&ref, NULL, four, 4, CPU, 1);
    for (int r = 0; r < 4; r++)
        for (int n = 0; n < 2; n++) {
            snprintf(file, sizeof(file), "%s/step-00000007/rank-%05d.bin", node[n], r);
            ck_assert_msg((access(file, F_OK) == 0) == (r % 2 == n), "%s", file);
        }
    for (int n = 0; n < 2; n++) {
        ck_assert(exists(node[n], "step-00000007/manifest.json") && exists(node[n], "latest"));
        ck_assert(!exists(node[n], "step-00000007/.writer"));
    }
    full_init(&got, 0);
    run_dirs(&got, NULL, four, 4, CPU, 0);
    same_model(&got, &ref, "4 ranks on their own nodes");
    full_free(&got);
    const char *three[] = {node[1], node[2], node[0]};
    for (enum slicing sl = CPU; sl <= GPU; sl += GPU - CPU) {
        full_init(&got, 0);
        run_dirs(&got, NULL, three, 3, sl, 0);
        snprintf(what, sizeof(what), "4 -> 3 ranks (%s), one on a new node", slicing_name[sl]);
        same_model(&got, &ref, what);
        full_free(&got);
    }
    const char *lost[] = {node[0], node[2]};
    full_init(&got, 0);
    all_fail(run_ranks(&got, NULL, lost, 2, CPU, 0, 7), -ENODATA, "shard files of ranks 1, 3 (of 4)");
    const char *empty[] = {node[2], node[2]};
    all_fail(run_ranks(&got, NULL, empty, 2, CPU, 0, 7), -ENOENT, "no rank finds a checkpoint");
    full_free(&got);
    full_free(&ref);
}
END_TEST

/* Two runs saved the same step of the same world and seed, one on each
 * node: the manifests name other files, and no rank loads a mix of them. */
START_TEST(manifests_of_two_runs_are_not_mixed)
{
    struct full a, b, got;
    char node[3][128];
    full_init(&a, 1);
    full_init(&b, 1);
    for (size_t i = 0; i < b.lay.total; i++)
        b.a[0][i] += 0.5f;
    node_dirs(node);
    const char *on0[] = {node[0], node[0]}, *on1[] = {node[1], node[1]}, *split[] = {node[0], node[1]};
    run_dirs(&a, NULL, on0, 2, CPU, 1);
    run_dirs(&b, NULL, on1, 2, CPU, 1);
    full_init(&got, 0);
    all_fail(run_ranks(&got, NULL, split, 2, CPU, 0, 7), -EINVAL, "differ (world, seed, files or shard sizes)");
    full_free(&got);
    full_free(&a);
    full_free(&b);
}
END_TEST

/* GPU-sliced shards written node-locally load into the CPU slicing when a
 * rank finds only some of the files it needs. */
START_TEST(node_local_gpu_slicing_ships_to_cpu_slicing)
{
    struct full ref, got;
    char node[3][128];
    full_init(&ref, 1);
    node_dirs(node);
    const char *four[] = {node[0], node[1], node[0], node[1]}, *two[] = {node[0], node[1]};
    run_dirs(&ref, NULL, four, 4, GPU, 1);
    full_init(&got, 0);
    run_dirs(&got, NULL, two, 2, CPU, 0);
    same_model(&got, &ref, "4 GPU-sliced ranks on 2 nodes -> 2 CPU ranks");
    full_free(&got);
    full_free(&ref);
}
END_TEST

/* Two distinct models, as two checkpoints of one run would hold. */
static void two_models(struct full *older, struct full *newer)
{
    full_init(older, 1);
    full_init(newer, 1);
    for (int k = 0; k < 3; k++)
        for (size_t i = 0; i < newer->lay.total; i++)
            newer->a[k][i] += 1.0f;
}

/* Points dir/latest at step-<step>, as a commit that stopped short left it. */
static void set_latest(const char *dir, long step)
{
    char p[256];
    snprintf(p, sizeof(p), "%s/latest", dir);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fprintf(f, "step-%08ld\n", step);
    fclose(f);
}

/* A commit that one node missed (its rename failed: its directory a step
 * behind, the newer step without that node's files): every rank loads the
 * older step, which both nodes have. Where only its `latest` was not
 * replaced, the newer step is whole and is loaded. */
START_TEST(a_directory_a_step_behind_loads_the_older_step)
{
    struct full ref7, ref9, got;
    char node[3][128], step9[256], aside[256];
    two_models(&ref7, &ref9);
    node_dirs(node);
    const char *four[] = {node[0], node[1], node[0], node[1]};
    run_dirs(&ref7, NULL, four, 4, CPU, 1);
    struct world *w = run_ranks(&ref9, NULL, four, 4, CPU, 1, 9);
    ck_assert_msg(w->rc[0] == 0 && w->rc[1] == 0, "%s", w->err[0]);
    free(w);
    snprintf(step9, sizeof(step9), "%s/step-00000009", node[1]);
    snprintf(aside, sizeof(aside), "%s/aside", node[1]);
    ck_assert_int_eq(rename(step9, aside), 0); /* node 1's rename did not happen */
    set_latest(node[1], 7);
    full_init(&got, 0);
    run_dirs(&got, NULL, four, 4, CPU, 0); /* asserts step 7 */
    same_model(&got, &ref7, "nodes at steps 9 and 7");
    full_free(&got);
    ck_assert_int_eq(rename(aside, step9), 0); /* it did; only `latest` did not follow */
    full_init(&got, 0);
    w = run_ranks(&got, NULL, four, 4, CPU, 0, 0);
    for (int r = 0; r < 4; r++)
        ck_assert_msg(w->rc[r] == 0 && w->got_step[r] == 9, "rank %d: step %ld: %d %s", r,
                      w->got_step[r], w->rc[r], w->err[r]);
    free(w);
    same_model(&got, &ref9, "step 9 whole, node 1's latest at 7");
    full_free(&got);
    full_free(&ref7);
    full_free(&ref9);
}
END_TEST

/* A node that sat out some saves (the job shrank without it, then grew or
 * restarted with it back) holds an old `latest`: its step is not one the
 * others missed but one they moved past. Every rank loads the newest step
 * whose files are all found, not the returning node's old one: neither a
 * silent rewind while the others still keep it, nor a load that fails
 * (-ENODATA) once they pruned it. */
START_TEST(a_returning_nodes_old_latest_does_not_rewind_the_load)
{
    struct full ref7, ref9, got;
    char node[3][128];
    two_models(&ref7, &ref9);
    node_dirs(node);
    const char *three[] = {node[0], node[1], node[2]}, *two[] = {node[0], node[1]};
    run_dirs(&ref7, NULL, three, 3, CPU, 1);
    for (long step = 9; step <= 13; step += 2) {
        struct world *w = run_ranks(&ref9, NULL, two, 2, CPU, 1, step); /* node 2 away */
        ck_assert_msg(w->rc[0] == 0 && w->rc[1] == 0, "%s", w->err[0]);
        free(w);
        full_init(&got, 0);
        w = run_ranks(&got, NULL, three, 3, CPU, 0, 0); /* node 2 back */
        for (int r = 0; r < 3; r++)
            ck_assert_msg(w->rc[r] == 0 && w->got_step[r] == step,
                          "node 2 back after step %ld: rank %d loaded step %ld: %d %s", step, r,
                          w->got_step[r], w->rc[r], w->err[r]);
        free(w);
        same_model(&got, &ref9, "the newest step, not the returning node's");
        full_free(&got);
    }
    ck_assert(!exists(node[0], "step-00000007")); /* pruned there by then (checkpoint_keep 3) */
    full_free(&ref7);
    full_free(&ref9);
}
END_TEST

Suite *make_ckpt_suite(void)
{
    Suite *s = suite_create("ckpt");
    TCase *tc = tcase_create("slicing");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, slicings_and_worlds_load_each_other);
    tcase_add_test(tc, manifest_records_the_writers_shard_size);
    tcase_add_test(tc, impossible_shard_size_is_refused);
    tcase_add_test(tc, cpu_trainer_resumes_from_gpu_slicing);
    tcase_add_test(tc, node_local_directories_save_and_load);
    tcase_add_test(tc, node_local_gpu_slicing_ships_to_cpu_slicing);
    tcase_add_test(tc, manifests_of_two_runs_are_not_mixed);
    tcase_add_test(tc, a_directory_a_step_behind_loads_the_older_step);
    tcase_add_test(tc, a_returning_nodes_old_latest_does_not_rewind_the_load);
    suite_add_tcase(s, tc);
    tc = tcase_create("prune");
    tcase_set_timeout(tc, 60);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, prune_plan_keeps_the_newest_and_what_resume_needs);
    tcase_add_test(tc, save_prunes_old_checkpoints_and_debris_but_not_live_writers);
    suite_add_tcase(s, tc);
    return s;
}
