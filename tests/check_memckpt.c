/* Memory checkpoints: the names' decisions (common/memtags.h) and a node's
 * directory (worker/agent/memckpt.h) on a temporary directory, no mount. */
#include <check.h>
#include <errno.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cmdline.h"
#include "common/memtags.h"
#include "tests/check_tmpdir.h"
#include "worker/agent/memckpt.h"

static char root[] = "/tmp/check-memckpt.XXXXXX";

static void setup(void) { tmpdir_make(root); }
static void teardown(void) { tmpdir_remove(root); }

START_TEST(common_is_the_newest_every_list_holds)
{
    char a[3][PROTO_CKPT_NAME_MAX] = {"step5", "step10", "step15"}, b[2][PROTO_CKPT_NAME_MAX] = {"step10", "step5"},
         c[1][PROTO_CKPT_NAME_MAX] = {"step9"}, out[PROTO_CKPT_NAME_MAX];
    const char *lists[3] = {a[0], b[0], c[0]};
    uint32_t counts[3] = {3, 2, 1};
    ck_assert_int_eq(memtags_common(lists, counts, 2, PROTO_CKPT_NAME_MAX, out, sizeof(out)), 1);
    ck_assert_str_eq(out, "step10"); /* version order: step10 after step5, whatever order the lists have */
    ck_assert_int_eq(memtags_common(lists, counts, 3, PROTO_CKPT_NAME_MAX, out, sizeof(out)), 0);
    ck_assert_str_eq(out, "");
    counts[1] = 0; /* a member that holds none */
    ck_assert_int_eq(memtags_common(lists, counts, 2, PROTO_CKPT_NAME_MAX, out, sizeof(out)), 0);
    ck_assert_int_eq(memtags_common(lists, counts, 1, PROTO_CKPT_NAME_MAX, out, sizeof(out)), 1);
    ck_assert_str_eq(out, "step15");
    ck_assert_int_eq(memtags_common(lists, counts, 0, PROTO_CKPT_NAME_MAX, out, sizeof(out)), 0);
    ck_assert_int_lt(memtags_cmp("global_step9", "global_step10"), 0);
    ck_assert_uint_eq(memtags_step("global_step120"), 120);
    ck_assert_uint_eq(memtags_step("latest"), 0);
    ck_assert_uint_eq(memtags_step("99999999999999999999999"), 9999999999999999999ull);
}
END_TEST

static void make_tag(const char *dir, const char *name)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    ck_assert_int_eq(mkdir(p, 0700), 0);
}

static int has(const char *dir, const char *name)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/%s", dir, name);
    return access(p, F_OK) == 0;
}

static struct job_spec spec_in(const char *rule, int keep)
{
    struct job_spec s;
    job_spec_defaults(&s);
    snprintf(s.name, sizeof(s.name), "a b/c");
    s.memory_checkpoint_mb = 1;
    snprintf(s.memory_checkpoint_root, sizeof(s.memory_checkpoint_root), "%s/", root);
    snprintf(s.memory_checkpoint_latest, sizeof(s.memory_checkpoint_latest), "%s", rule);
    s.memory_checkpoint_keep = keep;
    return s;
}

/* A tag counts once every rank that reports steps stepped after it appeared; a
 * writer that died with it leaves it unfinished for good, and it is removed
 * once a newer one is complete. keep bounds the complete ones. */
START_TEST(complete_once_every_writer_stepped_past)
{
    struct memckpt m = {0};
    struct job_spec s = spec_in("glob:step*", 2);
    char note[512], why[512], names[4][PROTO_CKPT_NAME_MAX];
    ck_assert_int_eq(memckpt_open(&m, &s, note, sizeof(note), why, sizeof(why)), 0);
    char want[PATH_MAX];
    snprintf(want, sizeof(want), "%s/muster-a_b_c", root);
    ck_assert_str_eq(m.dir, want); /* one component, the same on every node */
    struct memckpt_rank r[2] = {{.pid = 10, .steps = true, .step = 5}, {.pid = 11, .steps = true, .step = 5}};
    make_tag(m.dir, "step5");
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0); /* seen, its writers not yet past it */
    r[0].step = 6;
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0);
    r[1].step = 6;
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 1);
    ck_assert_uint_eq(memckpt_complete(&m, names, 4), 1);
    ck_assert_str_eq(names[0], "step5");

    make_tag(m.dir, "step10");
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0);
    r[1].pid = 12; /* rank 1 died in the save and came back */
    r[0].step = r[1].step = 11;
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0);
    ck_assert_uint_eq(memckpt_complete(&m, names, 4), 1); /* step10 never counts */

    make_tag(m.dir, "step15");
    memckpt_scan(&m, r, 2);
    r[0].step = r[1].step = 16;
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 1);
    ck_assert(!has(m.dir, "step10")); /* unfinished and older than a complete one */
    ck_assert(has(m.dir, "step5"));
    make_tag(m.dir, "step20");
    memckpt_scan(&m, r, 2);
    r[0].finished = true; /* an exit with status 0 is past every save */
    r[1].step = 21;
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 1);
    ck_assert_uint_eq(memckpt_complete(&m, names, 4), 2);
    ck_assert_str_eq(names[0], "step15");
    ck_assert_str_eq(names[1], "step20");
    ck_assert(!has(m.dir, "step5")); /* keep 2 */
    ck_assert_uint_eq(memckpt_complete(&m, names, 1), 1); /* the newest alone */
    ck_assert_str_eq(names[0], "step20");

    /* a rank that reports no steps adds no condition; a file matching the glob is no checkpoint */
    struct memckpt_rank quiet[1] = {{.pid = 30}};
    make_tag(m.dir, "step25");
    char f[PATH_MAX];
    snprintf(f, sizeof(f), "%s/step30", m.dir);
    fclose(fopen(f, "w"));
    ck_assert_int_eq(memckpt_scan(&m, quiet, 1), 1);
    ck_assert_uint_eq(memckpt_complete(&m, names, 4), 2);
    ck_assert_str_eq(names[1], "step25");
    memckpt_close(&m);
    ck_assert(access(want, F_OK) != 0);
}
END_TEST

/* committed:PATTERN: a tag counts once every rank that ran when it appeared reported a committed step of at
 * least the tag's, or finished; steps taken after it prove nothing (an async save returns before it is written),
 * and a writer replaced by another process never vouches for it. */
START_TEST(complete_once_every_writer_committed_its_step)
{
    struct memckpt m = {0};
    struct job_spec s = spec_in("committed:step*", 2);
    char note[512], why[512], names[4][PROTO_CKPT_NAME_MAX], path[PATH_MAX + 16], line[64] = "";
    ck_assert_int_eq(memckpt_open(&m, &s, note, sizeof(note), why, sizeof(why)), 0);
    struct memckpt_rank r[2] = {{.pid = 10, .steps = true, .step = 10}, {.pid = 11, .steps = true, .step = 10}};
    make_tag(m.dir, "step10");
    make_tag(m.dir, "other"); /* not the pattern's: no checkpoint */
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0);
    r[0].step = r[1].step = 12; /* stepped past it, committed nothing */
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0);
    r[0].committed = 10;
    r[1].committed = 5; /* an older one */
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0);
    r[1].committed = 10;
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 1);
    ck_assert_uint_eq(memckpt_complete(&m, names, 4), 1);
    ck_assert_str_eq(names[0], "step10");

    make_tag(m.dir, "step20");
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0);
    r[1] = (struct memckpt_rank){.pid = 12, .steps = true, .step = 20, .committed = 20}; /* died in the save */
    r[0].committed = 20;
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0);
    ck_assert_uint_eq(memckpt_complete(&m, names, 4), 1); /* step20 never counts */

    make_tag(m.dir, "step30");
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 0); /* their commits of 20 are not 30's */
    r[0].committed = 30;
    r[1].finished = true; /* an exit with status 0 is past every save */
    ck_assert_int_eq(memckpt_scan(&m, r, 2), 1);
    ck_assert(!has(m.dir, "step20")); /* unfinished and older than a complete one */
    ck_assert_uint_eq(memckpt_complete(&m, names, 4), 2);
    ck_assert_str_eq(names[1], "step30");

    /* restore: as with a glob, newer ones go and latest names the one kept */
    make_tag(m.dir, "step40");
    ck_assert_int_eq(memckpt_restore(&m, "step30", why, sizeof(why)), 0);
    ck_assert(!has(m.dir, "step40") && has(m.dir, "step30") && has(m.dir, "other"));
    snprintf(path, sizeof(path), "%s/latest", m.dir);
    FILE *fp = fopen(path, "r");
    ck_assert_ptr_nonnull(fp);
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), fp));
    fclose(fp);
    ck_assert_str_eq(line, "step30");
    memckpt_close(&m);
}
END_TEST

/* Restore keeps the given tag, removes newer ones, and names it in latest; "" starts afresh. */
START_TEST(restore_to_the_common_one)
{
    struct memckpt m = {0};
    struct job_spec s = spec_in("glob:*", 3);
    char note[512], why[512], names[4][PROTO_CKPT_NAME_MAX], path[PATH_MAX + 16], line[64] = "";
    ck_assert_int_eq(memckpt_open(&m, &s, note, sizeof(note), why, sizeof(why)), 0);
    make_tag(m.dir, "step5");
    make_tag(m.dir, "step10");
    make_tag(m.dir, "step15");
    ck_assert_int_eq(memckpt_scan(&m, NULL, 0), 1); /* found with no rank: a newer one began after each */
    ck_assert_uint_eq(memckpt_complete(&m, names, 4), 2);
    /* a rank's FIFO where the agent writes latest's new text: removed, not opened (it would wait) */
    char fifo[PATH_MAX + 32];
    snprintf(fifo, sizeof(fifo), "%s/latest.muster-tmp", m.dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(memckpt_restore(&m, "step10", why, sizeof(why)), 0);
    ck_assert(has(m.dir, "step5") && has(m.dir, "step10") && !has(m.dir, "step15"));
    snprintf(path, sizeof(path), "%s/latest", m.dir);
    FILE *fp = fopen(path, "r");
    ck_assert_ptr_nonnull(fp);
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), fp));
    fclose(fp);
    ck_assert_str_eq(line, "step10");
    ck_assert_int_eq(memckpt_restore(&m, "step99", why, sizeof(why)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, "memory checkpoint step99: not in"));
    ck_assert_int_eq(memckpt_restore(&m, "", why, sizeof(why)), 0);
    ck_assert(!has(m.dir, "step5") && !has(m.dir, "step10") && !has(m.dir, "latest"));
    memckpt_close(&m);

    /* file:NAME: the file names the checkpoint; restore rewrites that file */
    s = spec_in("file:newest", 2);
    ck_assert_int_eq(memckpt_open(&m, &s, note, sizeof(note), why, sizeof(why)), 0);
    make_tag(m.dir, "a1");
    make_tag(m.dir, "a2");
    snprintf(path, sizeof(path), "%s/newest", m.dir);
    fp = fopen(path, "w");
    fputs("a2\n", fp);
    fclose(fp);
    ck_assert_int_eq(memckpt_scan(&m, NULL, 0), 1);
    ck_assert_uint_eq(memckpt_complete(&m, names, 4), 1);
    ck_assert_str_eq(names[0], "a2");
    ck_assert_int_eq(memckpt_restore(&m, "a1", why, sizeof(why)), 0);
    ck_assert(!has(m.dir, "a2"));
    fp = fopen(path, "r");
    ck_assert_ptr_nonnull(fgets(line, sizeof(line), fp));
    fclose(fp);
    ck_assert_str_eq(line, "a1");
    memckpt_close(&m);
}
END_TEST

START_TEST(env_names_the_directory_once)
{
    char **env = calloc(3, sizeof(char *));
    env[0] = strdup("A=1");
    env[1] = strdup("MUSTER_CHECKPOINT_DIR=/elsewhere");
    env = memckpt_env(env, "/dev/shm/muster-j");
    ck_assert_ptr_nonnull(env);
    ck_assert_str_eq(env[0], "A=1");
    ck_assert_str_eq(env[1], "MUSTER_CHECKPOINT_DIR=/dev/shm/muster-j");
    ck_assert_ptr_null(env[2]);
    cmdline_free(env);
    ck_assert_ptr_null(memckpt_env(NULL, "/x"));
}
END_TEST

Suite *make_memckpt_suite(void)
{
    Suite *s = suite_create("memckpt");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, common_is_the_newest_every_list_holds);
    tcase_add_test(tc, complete_once_every_writer_stepped_past);
    tcase_add_test(tc, complete_once_every_writer_committed_its_step);
    tcase_add_test(tc, restore_to_the_common_one);
    tcase_add_test(tc, env_names_the_directory_once);
    suite_add_tcase(s, tc);
    return s;
}
