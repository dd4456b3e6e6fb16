/*
 * flight: the flight recorder summaries' parser (a rank's words, untrusted)
 * and the rule that names the rank behind (common/flight.h), on synthetic
 * summaries.
 */
#include <check.h>
#include <string.h>

#include "common/flight.h"

static int parse(const char *text, struct flight_rank *r)
{
    unsigned line;
    return flight_parse(text, strlen(text), r, &line);
}

/* The verdict over n summaries texts[0..n) (index = rank). */
static int blame(const char *const *texts, unsigned n, char *out, size_t cap, uint32_t *culprit)
{
    static struct flight_rank r[16];
    const struct flight_rank *p[16];
    ck_assert_uint_le(n, 16);
    for (unsigned i = 0; i < n; i++) {
        p[i] = texts[i] ? &r[i] : NULL;
        if (texts[i])
            ck_assert_int_eq(parse(texts[i], &r[i]), 0);
    }
    return flight_blame(p, n, out, cap, culprit);
}

START_TEST(parse_reads_every_field)
{
    struct flight_rank r;
    ck_assert_int_eq(parse("0 default_pg 37 36 35:all_reduce 36:all_reduce 37:barrier\n1 undefined 4 4", &r), 0);
    ck_assert_uint_eq(r.npgs, 2);
    ck_assert_str_eq(r.pgs[0].name, "0");
    ck_assert_str_eq(r.pgs[0].desc, "default_pg");
    ck_assert_uint_eq(r.pgs[0].entered, 37);
    ck_assert_uint_eq(r.pgs[0].completed, 36);
    ck_assert_uint_eq(r.pgs[0].nops, 3);
    ck_assert_uint_eq(r.pgs[0].ops[2].seq, 37);
    ck_assert_str_eq(r.pgs[0].ops[2].op, "barrier");
    ck_assert_uint_eq(r.pgs[1].nops, 0);
    ck_assert_int_eq(parse("", &r), 0);
    ck_assert_uint_eq(r.npgs, 0);
    ck_assert_int_eq(parse("0 default_pg 0 0\n", &r), 0); /* a trailing newline */
}
END_TEST

START_TEST(parse_refuses_bad_summaries_with_the_line)
{
    static const struct {
        const char *text;
        int err;
        unsigned line;
    } bad[] = {
        {"0 default_pg 37", FLIGHT_E_SYNTAX, 1},
        {"0  default_pg 37 36", FLIGHT_E_SYNTAX, 1},
        {"0 default_pg 37 36 ", FLIGHT_E_SYNTAX, 1},
        {"0 default_pg 37 36\n\n", FLIGHT_E_SYNTAX, 2},
        {"0 default_pg 37 36 37", FLIGHT_E_SYNTAX, 1},
        {"0 default_pg -1 0", FLIGHT_E_NUMBER, 1},
        {"0 default_pg 037 0", FLIGHT_E_NUMBER, 1},
        {"0 default_pg 99999999999999999999 0", FLIGHT_E_NUMBER, 1},
        {"0 default_pg 9223372036854775808 0", FLIGHT_E_NUMBER, 1},
        {"0 default_pg 36 37", FLIGHT_E_ORDER, 1},
        {"0 default_pg 37 36 38:all_reduce", FLIGHT_E_ORDER, 1},
        {"0 default_pg 37 36 37:all_reduce 36:all_reduce", FLIGHT_E_ORDER, 1},
        {"0 default_pg 37 36 0:all_reduce", FLIGHT_E_ORDER, 1},
        {"0 default_pg 37 36 37:gloo:all_reduce", FLIGHT_E_NAME, 1},
        {"0 default_pg 37 36 37:", FLIGHT_E_NAME, 1},
        {"0 default\tpg 37 36", FLIGHT_E_NAME, 1},
        {"0 0123456789012345678901234567890123 1 1", FLIGHT_E_NAME, 1},
        {"0 a 1 1\n1 b 1 1\n0 c 1 1", FLIGHT_E_DUP, 3},
        {"0 a 5 5 1:x 2:x 3:x 4:x 5:x", FLIGHT_E_SIZE, 1},
        {"0 a 1 1\n1 a 1 1\n2 a 1 1\n3 a 1 1\n4 a 1 1\n5 a 1 1\n6 a 1 1\n7 a 1 1\n8 a 1 1", FLIGHT_E_SIZE, 9},
    };
    struct flight_rank r;
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        unsigned line = 0;
        ck_assert_msg(flight_parse(bad[i].text, strlen(bad[i].text), &r, &line) == bad[i].err,
                      "%s: expected %d (%s)", bad[i].text, bad[i].err, flight_strerror(bad[i].err));
        ck_assert_uint_eq(line, bad[i].line);
        ck_assert_uint_eq(r.npgs, 0);
    }
    char big[FLIGHT_TEXT_MAX + 2];
    memset(big, 'a', sizeof(big));
    ck_assert_int_eq(flight_parse(big, sizeof(big), &r, NULL), FLIGHT_E_SIZE);
    ck_assert_int_eq(flight_parse("0 a\0 1 1", 8, &r, NULL), FLIGHT_E_NAME); /* a NUL inside */
}
END_TEST

START_TEST(one_rank_behind_is_named_with_the_collective)
{
    const char *t[] = {
        "0 default_pg 31 30 29:all_reduce 30:broadcast 31:all_reduce",
        "0 default_pg 31 30 30:broadcast 31:all_reduce",
        "0 default_pg 30 30 29:all_reduce 30:broadcast",
        "0 default_pg 31 30 31:all_reduce",
    };
    char out[512];
    uint32_t culprit = 99;
    ck_assert_int_eq(blame(t, 4, out, sizeof(out), &culprit), 1);
    ck_assert_uint_eq(culprit, 2);
    ck_assert_str_eq(out, "rank 2 never entered all_reduce #31 (its last is broadcast #30); ranks 0-1, 3 wait in it");
}
END_TEST

START_TEST(a_skipped_collective_is_named_by_the_op_the_others_are_in)
{
    /* rank 2 skipped all_reduce #37 and went on to its barrier, which took #37 */
    const char *t[] = {
        "0 default_pg 37 36 36:all_reduce 37:all_reduce",
        "0 default_pg 37 36 36:all_reduce 37:all_reduce",
        "0 default_pg 37 36 36:all_reduce 37:barrier",
        "0 default_pg 37 36 36:all_reduce 37:all_reduce",
    };
    char out[512];
    uint32_t culprit = 99;
    ck_assert_int_eq(blame(t, 4, out, sizeof(out), &culprit), 1);
    ck_assert_uint_eq(culprit, 2);
    ck_assert_str_eq(out, "rank 2 never entered all_reduce #37 (its #37 is barrier); ranks 0-1, 3 wait in it");
}
END_TEST

START_TEST(two_ranks_behind_at_different_numbers_blame_the_furthest)
{
    /* rank 3 stopped after #29; rank 2 waits for it in #30; ranks 0-1 got to #31 */
    const char *t[] = {
        "0 default_pg 31 30 30:broadcast 31:all_reduce",
        "0 default_pg 31 30 30:broadcast 31:all_reduce",
        "0 default_pg 30 29 29:all_reduce 30:broadcast",
        "0 default_pg 29 29 29:all_reduce",
    };
    char out[512];
    uint32_t culprit = 99;
    ck_assert_int_eq(blame(t, 4, out, sizeof(out), &culprit), 1);
    ck_assert_uint_eq(culprit, 3);
    ck_assert_str_eq(out, "rank 3 never entered broadcast #30 (its last is all_reduce #29); rank 2 waits in it, "
                          "ranks 0-1 are past it");
    /* two at the same lower number: both named */
    const char *u[] = {
        "0 default_pg 8 7 8:all_reduce",
        "0 default_pg 7 7 7:all_reduce",
        "0 default_pg 7 7 7:all_reduce",
        "0 default_pg 8 7 8:all_reduce",
    };
    ck_assert_int_eq(blame(u, 4, out, sizeof(out), &culprit), 1);
    ck_assert_uint_eq(culprit, 1);
    ck_assert_str_eq(out, "ranks 1-2 never entered all_reduce #8 (their last is #7); ranks 0, 3 wait in it");
}
END_TEST

START_TEST(all_equal_blames_nobody)
{
    const char *in[] = {"0 default_pg 12 11 12:all_reduce", "0 default_pg 12 11 12:all_reduce",
                        "0 default_pg 12 11 12:all_reduce"};
    const char *done[] = {"0 default_pg 12 12 12:all_reduce", "0 default_pg 12 12 12:all_reduce"};
    const char *none[] = {"", "", ""};
    const char *one[] = {"0 default_pg 12 11 12:all_reduce"};
    char out[512] = "x";
    uint32_t culprit = 99;
    ck_assert_int_eq(blame(in, 3, out, sizeof(out), &culprit), 0);
    ck_assert_str_eq(out, "");
    ck_assert_int_eq(blame(done, 2, out, sizeof(out), &culprit), 0);
    ck_assert_int_eq(blame(none, 3, out, sizeof(out), &culprit), 0);
    ck_assert_int_eq(blame(one, 1, out, sizeof(out), &culprit), 0);
    ck_assert_uint_eq(culprit, 99);
    /* every rank done with what it entered, though the numbers differ: nobody waits, nobody is blamed */
    const char *idle[] = {"0 default_pg 12 12 12:all_reduce", "0 default_pg 11 11 11:all_reduce"};
    ck_assert_int_eq(blame(idle, 2, out, sizeof(out), &culprit), 0);
}
END_TEST

START_TEST(process_groups_are_compared_among_their_members)
{
    /* default group level; subgroup "1" of ranks 0-1: rank 1 behind in it; rank 2 not a member */
    const char *t[] = {
        "0 default_pg 5 5 5:all_reduce\n1 undefined 3 2 3:all_gather",
        "0 default_pg 5 5 5:all_reduce\n1 undefined 2 2 2:all_gather",
        "0 default_pg 5 5 5:all_reduce",
    };
    char out[512];
    uint32_t culprit = 99;
    ck_assert_int_eq(blame(t, 3, out, sizeof(out), &culprit), 1);
    ck_assert_uint_eq(culprit, 1);
    ck_assert_str_eq(out, "rank 1 never entered all_gather #3 of process group 1 (undefined) (its last is all_gather "
                          "#2); rank 0 waits in it");
    /* a rank with no summary is left out, not blamed */
    const char *u[] = {"0 default_pg 9 8 9:all_reduce", NULL, "0 default_pg 8 8 8:all_reduce",
                       "0 default_pg 9 8 9:all_reduce"};
    ck_assert_int_eq(blame(u, 4, out, sizeof(out), &culprit), 1);
    ck_assert_uint_eq(culprit, 2);
    ck_assert_str_eq(out, "rank 2 never entered all_reduce #9 (its last is all_reduce #8); ranks 0, 3 wait in it");
}
END_TEST

START_TEST(an_op_out_of_the_window_is_said_as_collective)
{
    const char *t[] = {"0 default_pg 40 39 40:all_reduce", "0 default_pg 2 2"};
    char out[512];
    uint32_t culprit = 99;
    ck_assert_int_eq(blame(t, 2, out, sizeof(out), &culprit), 1);
    ck_assert_str_eq(out, "rank 1 never entered collective #3 (its last is #2); rank 0 is past it");
}
END_TEST

Suite *make_flight_suite(void)
{
    Suite *s = suite_create("flight");
    TCase *tc = tcase_create("flight");
    tcase_add_test(tc, parse_reads_every_field);
    tcase_add_test(tc, parse_refuses_bad_summaries_with_the_line);
    tcase_add_test(tc, one_rank_behind_is_named_with_the_collective);
    tcase_add_test(tc, a_skipped_collective_is_named_by_the_op_the_others_are_in);
    tcase_add_test(tc, two_ranks_behind_at_different_numbers_blame_the_furthest);
    tcase_add_test(tc, all_equal_blames_nobody);
    tcase_add_test(tc, process_groups_are_compared_among_their_members);
    tcase_add_test(tc, an_op_out_of_the_window_is_said_as_collective);
    suite_add_tcase(s, tc);
    return s;
}
