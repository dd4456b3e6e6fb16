/* Memory checkpoints drained to checkpoint_dir (worker/agent/memdrain.h):
 * which are due, and the copies out and back, run in the calling thread on
 * a temporary directory. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/mkdirs.h"
#include "tests/check_tmpdir.h"
#include "worker/agent/memdrain.h"

static char root[] = "/tmp/check-memdrain.XXXXXX";

static void setup(void) { tmpdir_make(root); }
static void teardown(void) { tmpdir_remove(root); }

static void put(const char *rel, const char *text)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static void dir(const char *rel)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    ck_assert_int_eq(mkdir(p, 0700), 0);
}

static int exists(const char *rel)
{
    char p[PATH_MAX];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    return lstat(p, &st) == 0;
}

static void read_back(const char *rel, char *out, size_t cap)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    FILE *f = fopen(p, "r");
    ck_assert_msg(f != NULL, "%s: %s", rel, strerror(errno));
    size_t n = fread(out, 1, cap - 1, f);
    out[n] = '\0';
    fclose(f);
}

/* A checkpoint stepN of the memory directory mem: r0.bin and meta/r0.json. */
static void saved(int step)
{
    char rel[64], text[64];
    snprintf(rel, sizeof(rel), "mem/step%d", step);
    dir(rel);
    snprintf(rel, sizeof(rel), "mem/step%d/meta", step);
    dir(rel);
    snprintf(rel, sizeof(rel), "mem/step%d/r0.bin", step);
    snprintf(text, sizeof(text), "weights of step %d", step);
    put(rel, text);
    snprintf(rel, sizeof(rel), "mem/step%d/meta/r0.json", step);
    put(rel, "{}");
}

static struct memdrain_task task(enum memdrain_kind kind, const char *tag);

/* tag drained (or restored, as kind says) without failure. */
static struct memdrain_task ran(enum memdrain_kind kind, const char *tag)
{
    struct memdrain_task t = task(kind, tag);
    memdrain_run(&t);
    ck_assert_msg(t.rc == 0, "%s %s: %s", kind == MEMDRAIN_RESTORE ? "restore" : "drain", tag, t.why);
    return t;
}

static struct memdrain_task task(enum memdrain_kind kind, const char *tag)
{
    struct memdrain_task t;
    memset(&t, 0, sizeof(t));
    t.kind = kind;
    snprintf(t.ckpt_dir, sizeof(t.ckpt_dir), "%s/durable", root);
    snprintf(t.job, sizeof(t.job), "j");
    snprintf(t.node, sizeof(t.node), "b");
    snprintf(t.mem_dir, sizeof(t.mem_dir), "%s/mem", root);
    snprintf(t.tag, sizeof(t.tag), "%s", tag);
    t.keep = 2;
    t.limit = 1 << 20;
    return t;
}

START_TEST(due_is_the_first_checkpoint_of_each_window)
{
    ck_assert(!memdrain_due("step5", "", 10));
    ck_assert(memdrain_due("step10", "", 10));
    ck_assert(memdrain_due("step12", "", 10)); /* the first one at or past the multiple */
    ck_assert(!memdrain_due("step15", "step10", 10));
    ck_assert(memdrain_due("step20", "step10", 10));
    ck_assert(memdrain_due("step35", "step10", 10)); /* windows with none in them are skipped */
    ck_assert(!memdrain_due("step10", "step20", 10)); /* older than the newest drained */
    ck_assert(!memdrain_due("step20", "step20", 10));
    ck_assert(!memdrain_due("step100", "", 0));
    ck_assert(!memdrain_due("latest", "", 10)); /* no step in the name: step 0 */
}
END_TEST

START_TEST(drained_whole_then_pruned_to_keep)
{
    dir("mem");
    saved(10);
    struct memdrain_task t = ran(MEMDRAIN_DRAIN, "step10");
    ck_assert_uint_eq(t.files, 2);
    ck_assert_uint_eq(t.bytes, strlen("weights of step 10") + 2);
    char text[64];
    read_back("durable/muster-memory/j/b/step10/r0.bin", text, sizeof(text));
    ck_assert_str_eq(text, "weights of step 10");
    ck_assert(exists("durable/muster-memory/j/b/step10/meta/r0.json"));
    ck_assert(!exists("durable/muster-memory/j/b/.muster-drain-step10"));
    ck_assert_uint_eq(t.n, 1);
    ck_assert_str_eq(t.names[0], "step10");
    struct stat st;
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/durable/muster-memory", root);
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0700); /* the agent's alone */
    saved(20);
    saved(30);
    ran(MEMDRAIN_DRAIN, "step20");
    t = ran(MEMDRAIN_DRAIN, "step30");
    ck_assert_uint_eq(t.n, 2); /* keep 2: step10 went */
    ck_assert_str_eq(t.names[0], "step20");
    ck_assert_str_eq(t.names[1], "step30");
    ck_assert(!exists("durable/muster-memory/j/b/step10"));
}
END_TEST

START_TEST(a_cut_short_drain_is_removed_never_listed)
{
    dir("mem");
    saved(10);
    ran(MEMDRAIN_DRAIN, "step10");
    dir("durable/muster-memory/j/b/.muster-drain-step20"); /* an agent killed mid-copy */
    put("durable/muster-memory/j/b/.muster-drain-step20/r0.bin", "weights of st");
    struct memdrain_task t = ran(MEMDRAIN_SCAN, "");
    ck_assert_uint_eq(t.cut_short, 1);
    ck_assert_uint_eq(t.n, 1);
    ck_assert_str_eq(t.names[0], "step10");
    ck_assert(!exists("durable/muster-memory/j/b/.muster-drain-step20"));
}
END_TEST

START_TEST(a_link_in_a_checkpoint_or_on_the_path_is_refused)
{
    dir("mem");
    saved(10);
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/mem/step10/token", root);
    ck_assert_int_eq(symlink("/etc/passwd", p), 0); /* a rank's link: never read */
    struct memdrain_task t = task(MEMDRAIN_DRAIN, "step10");
    memdrain_run(&t);
    ck_assert_int_eq(t.rc, -ELOOP);
    ck_assert_ptr_nonnull(strstr(t.why, "a link"));
    ck_assert(!exists("durable/muster-memory/j/b/step10"));
    ck_assert(!exists("durable/muster-memory/j/b/.muster-drain-step10"));
    ck_assert_uint_eq(t.n, 0);
    /* muster-memory swapped for a link to elsewhere (ranks may write checkpoint_dir) */
    dir("elsewhere");
    snprintf(p, sizeof(p), "%s/durable/muster-memory", root);
    char q[PATH_MAX];
    snprintf(q, sizeof(q), "%s/durable/moved", root);
    ck_assert_int_eq(rename(p, q), 0);
    snprintf(q, sizeof(q), "%s/elsewhere", root);
    ck_assert_int_eq(symlink(q, p), 0);
    t = task(MEMDRAIN_SCAN, "");
    memdrain_run(&t);
    ck_assert_int_ne(t.rc, 0);
    ck_assert_ptr_nonnull(strstr(t.why, "muster-memory"));
    ck_assert(!exists("elsewhere/j"));
}
END_TEST

START_TEST(restored_into_the_memory_directory_for_the_ranks_group)
{
    dir("mem");
    saved(30);
    ran(MEMDRAIN_DRAIN, "step30");
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/mem", root);
    ck_assert_int_eq(rmtree_at(AT_FDCWD, p), 0); /* the node's memory lost */
    dir("mem");
    ran(MEMDRAIN_RESTORE, "step30");
    char text[64];
    read_back("mem/step30/r0.bin", text, sizeof(text));
    ck_assert_str_eq(text, "weights of step 30");
    struct stat st;
    snprintf(p, sizeof(p), "%s/mem/step30/r0.bin", root);
    ck_assert_int_eq(stat(p, &st), 0);
    ck_assert_int_eq(st.st_mode & 0777, 0660);
    ck_assert(!exists("mem/.muster-drain-step30"));
    struct memdrain_task t = task(MEMDRAIN_RESTORE, "step40"); /* never drained */
    memdrain_run(&t);
    ck_assert_int_eq(t.rc, -ENOENT);
    ck_assert_ptr_nonnull(strstr(t.why, "step40"));
}
END_TEST

Suite *make_memdrain_suite(void)
{
    Suite *s = suite_create("memdrain");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, due_is_the_first_checkpoint_of_each_window);
    tcase_add_test(tc, drained_whole_then_pruned_to_keep);
    tcase_add_test(tc, a_cut_short_drain_is_removed_never_listed);
    tcase_add_test(tc, a_link_in_a_checkpoint_or_on_the_path_is_refused);
    tcase_add_test(tc, restored_into_the_memory_directory_for_the_ranks_group);
    suite_add_tcase(s, tc);
    return s;
}
