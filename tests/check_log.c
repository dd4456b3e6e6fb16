/* log: rate-limited lines and the counts of what they held back. */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "common/ratelimit.h"

/* stderr into a temporary file while the test logs; text gets what was written. */
static FILE *capture;
static int saved_fd = -1;

static void capture_start(void)
{
    fflush(stderr);
    capture = tmpfile();
    ck_assert_ptr_nonnull(capture);
    saved_fd = dup(STDERR_FILENO);
    ck_assert_int_ge(saved_fd, 0);
    ck_assert_int_ge(dup2(fileno(capture), STDERR_FILENO), 0);
}

static void capture_end(char *text, size_t cap)
{
    fflush(stderr);
    dup2(saved_fd, STDERR_FILENO);
    close(saved_fd);
    rewind(capture);
    size_t n = fread(text, 1, cap - 1, capture);
    text[n] = '\0';
    fclose(capture);
}

static int count(const char *text, const char *what)
{
    int n = 0;
    for (const char *p = text; (p = strstr(p, what)) != NULL; p++)
        n++;
    return n;
}

static void refuse(int i) { log_warn_limited("connection %d refused: full", i); }
static void close_conn(int i) { log_info_limited("connection %d closed", i); }

/* A burst of 12 from one call site and 7 from another: 5 lines of each get
 * through, and the counts of the rest are written when the site falls quiet
 * (a flush after its window) or at exit (a flush of all), once each. */
START_TEST(held_back_lines_are_counted_when_the_site_falls_quiet)
{
    static char text[8192];
    capture_start();
    for (int i = 0; i < 12; i++)
        refuse(i);
    for (int i = 0; i < 7; i++)
        close_conn(i);
    log_limit_flush(0); /* the windows have not ended: nothing yet */
    capture_end(text, sizeof(text));
    ck_assert_int_eq(count(text, "refused: full"), 5);
    ck_assert_int_eq(count(text, "closed"), 5);
    ck_assert_int_eq(count(text, "suppressed"), 0);

    capture_start();
    usleep((LOG_LIMIT_WINDOW_MS + 50) * 1000);
    log_limit_flush(0);
    log_limit_flush(0); /* counted once */
    capture_end(text, sizeof(text));
    ck_assert_ptr_nonnull(strstr(text, "muster warn: 7 similar lines suppressed (\"connection %d refused: full\")"));
    ck_assert_ptr_nonnull(strstr(text, "muster info: 2 similar lines suppressed (\"connection %d closed\")"));
    ck_assert_int_eq(count(text, "suppressed"), 2);

    capture_start();
    for (int i = 0; i < 8; i++)
        refuse(i);
    log_limit_flush(1); /* at exit: the window need not have ended */
    capture_end(text, sizeof(text));
    ck_assert_int_eq(count(text, "refused: full"), 5 + 1);
    ck_assert_ptr_nonnull(strstr(text, "3 similar lines suppressed"));
}
END_TEST

/* One line per peer per interval, with the count held back; peers apart. */
START_TEST(peer_lines_one_per_interval)
{
    struct ratelimit a = {0}, b = {0};
    unsigned long held = 99;
    char note[64];
    ck_assert_int_eq(ratelimit_pass(&a, 5000, 1000, &held), 1);
    ck_assert_uint_eq(held, 0);
    ck_assert_str_eq(ratelimit_note(held, note, sizeof(note)), "");
    int passed = 0;
    for (uint64_t t = 5001; t < 6000; t++)
        passed += ratelimit_pass(&a, t, 1000, &held);
    ck_assert_int_eq(passed, 0);
    /* another peer is not held back by the first */
    ck_assert_int_eq(ratelimit_pass(&b, 5500, 1000, &held), 1);
    ck_assert_uint_eq(held, 0);
    ck_assert_int_eq(ratelimit_pass(&a, 6000, 1000, &held), 1);
    ck_assert_uint_eq(held, 999);
    ck_assert_str_eq(ratelimit_note(held, note, sizeof(note)), " (999 more like it held back)");
    ck_assert_int_eq(ratelimit_pass(&a, 6999, 1000, &held), 0);
    ck_assert_int_eq(ratelimit_pass(&a, 9000, 1000, &held), 1);
    ck_assert_uint_eq(held, 1);
    /* a first line at time 0 passes too */
    struct ratelimit c = {0};
    ck_assert_int_eq(ratelimit_pass(&c, 0, 1000, &held), 1);
    ck_assert_int_eq(ratelimit_pass(&c, 10, 1000, &held), 0);
}
END_TEST

Suite *make_log_suite(void)
{
    Suite *s = suite_create("log");
    TCase *tc = tcase_create("log");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, held_back_lines_are_counted_when_the_site_falls_quiet);
    tcase_add_test(tc, peer_lines_one_per_interval);
    suite_add_tcase(s, tc);
    return s;
}
