#include <check.h>
#include <errno.h>
#include <string.h>

#include "common/jobspec.h"

static int parse(const char *text, struct job_spec *spec, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *obj = json_loads(text, 0, &jerr);
    ck_assert_msg(obj != NULL, "test JSON does not parse: %s", jerr.text);
    int rc = job_spec_from_json(obj, "job.json", spec, err, errlen);
    json_decref(obj);
    return rc;
}

START_TEST(minimal_spec_gets_defaults)
{
    struct job_spec s;
    char err[256] = "";
    ck_assert_int_eq(parse("{\"name\": \"demo\", \"nodes\": 2, \"max_restarts\": 3}", &s, err, sizeof(err)), 0);
    ck_assert_str_eq(s.name, "demo");
    ck_assert_int_eq(s.nodes, 2);
    ck_assert_int_eq(s.max_restarts, 3);
    ck_assert_int_eq(s.heartbeat_interval_ms, 1000);
    ck_assert_int_eq(s.heartbeat_timeout_ms, 5000);
    ck_assert_int_eq(s.lease_ms, 10000);
}
END_TEST

START_TEST(unknown_key_is_named)
{
    struct job_spec s;
    char err[256] = "";
    ck_assert_int_eq(parse("{\"nodes\": 2, \"nodez\": 1}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: nodez: unknown key"));
}
END_TEST

START_TEST(wrong_type_and_bounds_are_named)
{
    struct job_spec s;
    char err[256] = "";
    ck_assert_int_eq(parse("{\"nodes\": \"two\"}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: nodes: expected an integer"));
    ck_assert_ptr_nonnull(strstr(err, "got a string"));
    ck_assert_int_eq(parse("{\"nodes\": 0}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "got 0"));
    ck_assert_int_eq(parse("{\"lr\": -1.5}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: lr: expected a number"));
    ck_assert_int_eq(parse("[1, 2]", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "top level"));
}
END_TEST

START_TEST(cross_field_checks)
{
    struct job_spec s;
    char err[256] = "";
    ck_assert_int_eq(parse("{\"heartbeat_interval_ms\": 2000, \"heartbeat_timeout_ms\": 1000}", &s, err,
                           sizeof(err)),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "heartbeat_timeout_ms"));
}
END_TEST

Suite *make_jobspec_suite(void)
{
    Suite *s = suite_create("jobspec");
    TCase *tc = tcase_create("parse");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, minimal_spec_gets_defaults);
    tcase_add_test(tc, unknown_key_is_named);
    tcase_add_test(tc, wrong_type_and_bounds_are_named);
    tcase_add_test(tc, cross_field_checks);
    suite_add_tcase(s, tc);
    return s;
}
