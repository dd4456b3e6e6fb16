/* token: the token-file reader shared by musterd and muster-worker. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/token.h"

static char dir[64], path[128];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/muster-token.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/token", dir);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

static void write_token(const char *text, mode_t mode)
{
    unlink(path);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL, 0600);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    ck_assert_int_eq(chmod(path, mode), 0);
}

START_TEST(owner_only_token_is_read_and_newlines_stripped)
{
    uint8_t buf[TOKEN_MAX];
    size_t len = 0;
    char err[512] = "";
    write_token("abc123\n", 0600);
    ck_assert_int_eq(token_read(path, buf, sizeof(buf), &len, err, sizeof(err)), 0);
    ck_assert_uint_eq(len, 6);
    ck_assert_int_eq(memcmp(buf, "abc123", 6), 0);
    write_token("xyz\r\n", 0400);
    ck_assert_int_eq(token_read(path, buf, sizeof(buf), &len, err, sizeof(err)), 0);
    ck_assert_uint_eq(len, 3);
}
END_TEST

START_TEST(group_or_other_access_is_refused_with_chmod_hint)
{
    static const mode_t loose[] = {0644, 0640, 0604, 0660, 0606, 0620};
    uint8_t buf[TOKEN_MAX];
    size_t len = 0;
    char err[512], want[256];
    for (size_t i = 0; i < sizeof(loose) / sizeof(loose[0]); i++) {
        write_token("secret", loose[i]);
        ck_assert_int_eq(token_read(path, buf, sizeof(buf), &len, err, sizeof(err)), -EPERM);
        snprintf(want, sizeof(want), "%s: token file has mode %04o", path, (unsigned)loose[i]);
        ck_assert_ptr_nonnull(strstr(err, want));
        snprintf(want, sizeof(want), "chmod 600 %s", path);
        ck_assert_ptr_nonnull(strstr(err, want));
    }
}
END_TEST

START_TEST(private_file_check_warns_for_group_and_refuses_others)
{
    char err[512];
    write_token("key", 0600);
    ck_assert_int_eq(token_check_private(path, err, sizeof(err)), 0);
    write_token("key", 0640);
    ck_assert_int_eq(token_check_private(path, err, sizeof(err)), 1);
    ck_assert_msg(strstr(err, "mode 0640 lets group") && strstr(err, "chmod 600"), "%s", err);
    static const mode_t refused[] = {0644, 0604, 0660, 0602};
    for (size_t i = 0; i < sizeof(refused) / sizeof(refused[0]); i++) {
        write_token("key", refused[i]);
        ck_assert_int_eq(token_check_private(path, err, sizeof(err)), -EPERM);
        ck_assert_msg(strstr(err, "lets other users read or change it"), "%s", err);
    }
    unlink(path);
    ck_assert_int_eq(token_check_private(path, err, sizeof(err)), -ENOENT);
}
END_TEST

START_TEST(missing_empty_large_and_directory_are_refused)
{
    uint8_t buf[16];
    size_t len = 0;
    char err[512];
    unlink(path);
    ck_assert_int_eq(token_read(path, buf, sizeof(buf), &len, err, sizeof(err)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "cannot read the token file"));
    write_token("\n", 0600);
    ck_assert_int_eq(token_read(path, buf, sizeof(buf), &len, err, sizeof(err)), -ENODATA);
    ck_assert_ptr_nonnull(strstr(err, "empty"));
    write_token("0123456789abcdef", 0600);
    ck_assert_int_eq(token_read(path, buf, sizeof(buf), &len, err, sizeof(err)), 0);
    write_token("0123456789abcdefX", 0600);
    ck_assert_int_eq(token_read(path, buf, sizeof(buf), &len, err, sizeof(err)), -EFBIG);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    ck_assert_int_eq(token_read(dir, buf, sizeof(buf), &len, err, sizeof(err)), -EINVAL);
}
END_TEST

START_TEST(default_path_follows_systemd)
{
    char p[256];
    setenv("CONFIGURATION_DIRECTORY", "/etc/muster-test", 1);
    token_default_path(p, sizeof(p));
    ck_assert_str_eq(p, "/etc/muster-test/token");
    unsetenv("CONFIGURATION_DIRECTORY");
    token_default_path(p, sizeof(p));
    ck_assert_str_eq(p, "/etc/muster/token");
}
END_TEST

Suite *make_token_suite(void)
{
    Suite *s = suite_create("token");
    TCase *tc = tcase_create("token");
    tcase_set_timeout(tc, 10);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, owner_only_token_is_read_and_newlines_stripped);
    tcase_add_test(tc, group_or_other_access_is_refused_with_chmod_hint);
    tcase_add_test(tc, missing_empty_large_and_directory_are_refused);
    tcase_add_test(tc, private_file_check_warns_for_group_and_refuses_others);
    tcase_add_test(tc, default_path_follows_systemd);
    suite_add_tcase(s, tc);
    return s;
}
