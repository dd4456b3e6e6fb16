/* notify: datagrams arrive at a socket of the test's own, path and abstract. */
#include <check.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "common/notify.h"

static int bind_dgram(const char *name, int abstract)
{
    struct sockaddr_un sa;
    int fd = socket(AF_UNIX, SOCK_DGRAM, 0);
    ck_assert_int_ge(fd, 0);
    memset(&sa, 0, sizeof(sa));
    sa.sun_family = AF_UNIX;
    snprintf(sa.sun_path + (abstract ? 1 : 0), sizeof(sa.sun_path) - 1, "%s", name);
    socklen_t len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + (abstract ? 1 : 0) + strlen(name));
    ck_assert_int_eq(bind(fd, (struct sockaddr *)&sa, len), 0);
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    return fd;
}

static void expect(int fd, const char *want)
{
    char buf[256];
    ssize_t n = recv(fd, buf, sizeof(buf) - 1, 0);
    ck_assert_int_gt(n, 0);
    buf[n] = '\0';
    ck_assert_str_eq(buf, want);
}

START_TEST(messages_arrive_in_order_on_a_path_socket)
{
    char path[64];
    snprintf(path, sizeof(path), "/tmp/muster-notify-%d", (int)getpid());
    unlink(path);
    int fd = bind_dgram(path, 0);
    setenv("NOTIFY_SOCKET", path, 1);
    ck_assert_int_eq(notify_send("READY=1"), 0);
    ck_assert_int_eq(notify_sendf("STATUS=running gen %d", 3), 0);
    ck_assert_int_eq(notify_send("WATCHDOG=1"), 0);
    ck_assert_int_eq(notify_send("STOPPING=1"), 0);
    expect(fd, "READY=1");
    expect(fd, "STATUS=running gen 3");
    expect(fd, "WATCHDOG=1");
    expect(fd, "STOPPING=1");
    close(fd);
    unlink(path);
}
END_TEST

START_TEST(abstract_namespace_socket)
{
    char name[64];
    snprintf(name, sizeof(name), "muster-notify-abs-%d", (int)getpid());
    int fd = bind_dgram(name, 1);
    char env[80];
    snprintf(env, sizeof(env), "@%s", name);
    setenv("NOTIFY_SOCKET", env, 1);
    ck_assert_int_eq(notify_send("READY=1"), 0);
    expect(fd, "READY=1");
    close(fd);
}
END_TEST

START_TEST(no_socket_is_not_an_error_and_bad_one_is)
{
    unsetenv("NOTIFY_SOCKET");
    ck_assert_int_eq(notify_send("READY=1"), 0);
    setenv("NOTIFY_SOCKET", "relative/path", 1);
    ck_assert_int_lt(notify_send("READY=1"), 0);
    setenv("NOTIFY_SOCKET", "/nonexistent/muster/socket", 1);
    ck_assert_int_lt(notify_send("READY=1"), 0);
}
END_TEST

START_TEST(watchdog_period_from_environment)
{
    char pid[32];
    unsetenv("WATCHDOG_PID");
    unsetenv("WATCHDOG_USEC");
    ck_assert_uint_eq(notify_watchdog_usec(), 0);
    setenv("WATCHDOG_USEC", "2000000", 1);
    ck_assert_uint_eq(notify_watchdog_usec(), 2000000);
    snprintf(pid, sizeof(pid), "%d", (int)getpid() + 1);
    setenv("WATCHDOG_PID", pid, 1);
    ck_assert_uint_eq(notify_watchdog_usec(), 0); /* meant for another process */
    snprintf(pid, sizeof(pid), "%d", (int)getpid());
    setenv("WATCHDOG_PID", pid, 1);
    ck_assert_uint_eq(notify_watchdog_usec(), 2000000);
    setenv("WATCHDOG_USEC", "12x", 1);
    ck_assert_uint_eq(notify_watchdog_usec(), 0);
}
END_TEST

Suite *make_notify_suite(void)
{
    Suite *s = suite_create("notify");
    TCase *tc = tcase_create("notify");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, messages_arrive_in_order_on_a_path_socket);
    tcase_add_test(tc, abstract_namespace_socket);
    tcase_add_test(tc, no_socket_is_not_an_error_and_bad_one_is);
    tcase_add_test(tc, watchdog_period_from_environment);
    suite_add_tcase(s, tc);
    return s;
}
