/*
 * The node checks of common/preflight.h on files made here: token files
 * (good, wrong magic, a count that disagrees with the size, a token beyond
 * the vocabulary), text, too little data, each verdict the same as the
 * trainer's own reader (dataset_open); checkpoint directories (created,
 * not creatable, too little free space through the statvfs hook); the clock.
 */
#include <check.h>
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/preflight.h"
#include "worker/train/data.h"

static char dir[] = "/tmp/check-preflight-XXXXXX";

static void setup(void) { ck_assert_ptr_nonnull(mkdtemp(dir)); }

static void teardown(void)
{
    char cmd[sizeof(dir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(dir, "/tmp/check-preflight-XXXXXX");
    unsetenv(PREFLIGHT_FREE_HOOK_ENV);
}

/* An llm.c token file of n tokens 0, 1, 2, ... (mod top), header count given. */
static void token_file(const char *path, int32_t magic, int32_t count, int n, int top)
{
    int32_t h[256] = {magic, 1, count};
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(h, sizeof(h), 1, f), 1);
    for (int i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(i % top);
        ck_assert_uint_eq(fwrite(&t, 2, 1, f), 1);
    }
    fclose(f);
}

/* preflight_data_check's answer, which must be the trainer's too. */
static int check_data(const char *path, int vocab, int seq_len, double val, struct preflight_data *d, char *why,
                      size_t len)
{
    struct dataset ds;
    char err[512];
    int rc = preflight_data_check(path, vocab, seq_len, val, d, why, len);
    int trainer = dataset_open(&ds, path, vocab, val, seq_len, err, sizeof(err));
    if (trainer == 0)
        dataset_close(&ds);
    ck_assert_msg((rc == 0) == (trainer == 0), "%s: pre-flight says %d (%s), the trainer %d (%s)", path, rc,
                  rc ? why : "ok", trainer, trainer ? err : "ok");
    return rc;
}

START_TEST(data_files_are_checked_like_the_trainer_reads_them)
{
    char path[128], why[PREFLIGHT_WHY_MAX];
    struct preflight_data d;
    snprintf(path, sizeof(path), "%s/tok.bin", dir);
    token_file(path, 20240520, 1000000, 1000000, 50000);
    ck_assert_int_eq(check_data(path, 50257, 1024, 0.1, &d, why, sizeof(why)), 0);
    ck_assert_int_eq(d.tokens_file, 1);
    ck_assert_uint_eq(d.tokens, 1000000);
    ck_assert_int_eq(d.max_token, 49999);
    ck_assert_int_eq(preflight_data_tokens(path, &d), 0);
    ck_assert_uint_eq(d.tokens, 1000000);

    ck_assert_int_eq(check_data(path, 256, 64, 0.1, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "token 49999 is outside the model's vocabulary of 256"));

    token_file(path, 20240520, 1001, 1000, 100);
    ck_assert_int_eq(check_data(path, 256, 8, 0, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "header says 1001 tokens"));

    token_file(path, 12345, 10, 10, 10);
    ck_assert_int_eq(check_data(path, 256, 8, 0, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "neither text nor an llm.c token file: header holds magic 12345"));

    snprintf(path, sizeof(path), "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("to be or not to be\n", f);
    fclose(f);
    ck_assert_int_eq(check_data(path, 256, 4, 0, &d, why, sizeof(why)), 0);
    ck_assert_int_eq(d.tokens_file, 0);
    ck_assert_uint_eq(d.tokens, 19);
    ck_assert_int_eq(check_data(path, 256, 32, 0, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "19 tokens are too few"));

    snprintf(path, sizeof(path), "%s/missing.bin", dir);
    ck_assert_int_eq(check_data(path, 256, 4, 0, &d, why, sizeof(why)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, "missing.bin: No such file or directory: copy the data file"));
    ck_assert_int_eq(check_data(dir, 256, 4, 0, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "not a regular file"));
}
END_TEST

START_TEST(checkpoint_dir_writable_with_room_for_two)
{
    char path[128], hook[128], why[PREFLIGHT_WHY_MAX];
    uint64_t fr;
    snprintf(path, sizeof(path), "%s/ck/deeper", dir);
    ck_assert_int_eq(preflight_ckpt_dir(path, 4096, &fr, why, sizeof(why)), 0);
    ck_assert_int_eq(access(path, W_OK), 0);
    ck_assert_uint_gt(fr, 4096);

    snprintf(hook, sizeof(hook), "%s/free", dir);
    FILE *f = fopen(hook, "w");
    ck_assert_ptr_nonnull(f);
    fputs("1048576\n", f);
    fclose(f);
    setenv(PREFLIGHT_FREE_HOOK_ENV, hook, 1);
    ck_assert_int_eq(preflight_ckpt_dir(path, 3u << 20, &fr, why, sizeof(why)), -ENOSPC);
    ck_assert_uint_eq(fr, 1048576);
    ck_assert_ptr_nonnull(strstr(why, "1.00 MiB free, 2 checkpoints of this job need 3.00 MiB"));
    ck_assert_int_eq(preflight_ckpt_dir(path, 1u << 20, &fr, why, sizeof(why)), 0);

    /* a path through a regular file cannot be a directory */
    snprintf(path, sizeof(path), "%s/free/ck", dir);
    ck_assert_int_eq(preflight_ckpt_dir(path, 0, &fr, why, sizeof(why)), -ENOTDIR);
    ck_assert_ptr_nonnull(strstr(why, "cannot create it"));
}
END_TEST

START_TEST(clock_skew_beyond_the_round_trip_fails)
{
    char why[PREFLIGHT_WHY_MAX];
    ck_assert_int_eq(preflight_clock(4000, 10, why, sizeof(why)), 0);
    ck_assert_int_eq(preflight_clock(-5500, 1000, why, sizeof(why)), 0);
    ck_assert_int_eq(preflight_clock(-7000, 10, why, sizeof(why)), -ERANGE);
    ck_assert_ptr_nonnull(strstr(why, "7.0 s behind musterd's"));
    uint64_t total, avail;
    ck_assert_int_eq(preflight_host_memory(&total, &avail), 0);
    ck_assert_uint_gt(total, 0);
    ck_assert_uint_le(avail, total);
}
END_TEST

Suite *make_preflight_suite(void)
{
    Suite *s = suite_create("preflight");
    TCase *tc = tcase_create("preflight");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, data_files_are_checked_like_the_trainer_reads_them);
    tcase_add_test(tc, checkpoint_dir_writable_with_room_for_two);
    tcase_add_test(tc, clock_skew_beyond_the_round_trip_fails);
    suite_add_tcase(s, tc);
    return s;
}
