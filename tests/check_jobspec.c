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
    /* the flight recorder: on (2000 entries) unless the job says otherwise; 0 = off */
    ck_assert_int_eq(parse("{\"nodes\": 1}", &s, err, sizeof(err)), 0);
    ck_assert_int_eq(s.flight_recorder, 2000);
    ck_assert_int_eq(parse("{\"flight_recorder\": 0}", &s, err, sizeof(err)), 0);
    ck_assert_int_eq(s.flight_recorder, 0);
    ck_assert_int_eq(parse("{\"flight_recorder\": false}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: flight_recorder: expected an integer"));
    ck_assert_int_eq(parse("{\"flight_recorder\": 1000001}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: flight_recorder: expected an integer in [0, 1000000]"));
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

START_TEST(program_needs_are_lists_and_rules)
{
    struct job_spec s;
    char err[300] = "";
    ck_assert_int_eq(parse("{\"require_readable\": [\"/data/train.bin\", \"/data/my dir\"], "
                           "\"require_writable\": [\"/ckpt\"], \"require_free_mb\": 2048, "
                           "\"require_python_modules\": [\"torch\", \"deepspeed.ops\"], "
                           "\"checkpoint_dir\": \"/ckpt\", \"checkpoint_latest\": \"file:latest\"}",
                           &s, err, sizeof(err)), 0);
    ck_assert_str_eq(s.require_readable, "/data/train.bin");
    ck_assert_str_eq(s.require_readable + strlen("/data/train.bin") + 1, "/data/my dir"); /* not split */
    ck_assert_str_eq(s.require_python_modules + 6, "deepspeed.ops");
    ck_assert_int_eq(s.require_free_mb, 2048);
    ck_assert_int_eq(s.require_python_timeout_s, 120);
    ck_assert_int_eq(s.checkpoint_diverged_ok, 0);

    ck_assert_int_eq(parse("{\"require_readable\": \"/data\"}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: require_readable: expected a non-empty array of strings, got a string"));
    ck_assert_int_eq(parse("{\"require_readable\": []}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "got an empty array"));
    ck_assert_int_eq(parse("{\"require_writable\": [\"/a\", \"\"]}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: require_writable[1]: expected a non-empty string"));
    ck_assert_int_eq(parse("{\"require_python_modules\": [\"torch; import os\"]}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "require_python_modules: expected module names"));
    ck_assert_int_eq(parse("{\"require_python_modules\": [\"torch\", \"class\"]}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "require_python_modules: expected module names"));
    ck_assert_int_eq(parse("{\"require_python_modules\": [\"os\\nimport shutil\\u001b[2J\"]}", &s, err, sizeof(err)),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "got \"os?import shutil?[2J\"")); /* one line, no escape */

    /* sizes a careless or hostile job may ask for: refused, saying the bound */
    size_t big = 100000 * 6 + 64;
    char *text = malloc(big);
    ck_assert_ptr_nonnull(text);
    size_t n = (size_t)snprintf(text, big, "{\"require_readable\": [");
    for (int i = 0; i < 100000; i++)
        n += (size_t)snprintf(text + n, big - n, "%s\"/d\"", i ? "," : "");
    snprintf(text + n, big - n, "]}");
    ck_assert_int_eq(parse(text, &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "require_readable: expected at most 256 entries"));
    free(text);
    ck_assert_int_eq(parse("{\"require_writable\": [\"/c\"], \"require_free_mb\": 4611686018427387904}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "require_free_mb: expected an integer in [0, 1073741824]"));
    ck_assert_int_eq(parse("{\"require_writable\": [\"/c\"], \"require_free_mb\": 1e30}", &s, err, sizeof(err)),
                     -EINVAL);
    ck_assert_int_eq(parse("{\"checkpoint_dir\": \"c\", \"checkpoint_latest\": \"file:\"}", &s, err, sizeof(err)),
                     -EINVAL);
    ck_assert_int_eq(parse("{\"require_python_timeout_s\": 0}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(parse("{\"require_python\": \"python3\"}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "require_python: expected require_python_modules too"));
    ck_assert_int_eq(parse("{\"require_free_mb\": 10}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "require_free_mb: expected require_writable too"));
    ck_assert_int_eq(parse("{\"checkpoint_latest\": \"file:latest\"}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "checkpoint_latest: expected checkpoint_dir too"));
    ck_assert_int_eq(parse("{\"checkpoint_dir\": \"c\", \"checkpoint_latest\": \"newest\"}", &s, err, sizeof(err)),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "checkpoint_latest: expected \"file:NAME\""));
    ck_assert_int_eq(parse("{\"checkpoint_dir\": \"c\", \"checkpoint_latest\": \"file:a/latest\"}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_int_eq(parse("{\"checkpoint_dir\": \"c\", \"checkpoint_latest\": \"glob:step_*\"}", &s, err,
                           sizeof(err)), 0);
}
END_TEST

START_TEST(warm_spare_keys)
{
    struct job_spec s;
    char err[256] = "";
    ck_assert_int_eq(parse("{\"nodes\": 2}", &s, err, sizeof(err)), 0);
    ck_assert_int_eq(s.warm_spares, 0);
    ck_assert_str_eq(s.warm_imports, "");
    ck_assert_int_eq(parse("{\"warm_spares\": 1, \"warm_imports\": \"deepspeed,transformers.models\"}", &s, err,
                           sizeof(err)),
                     0);
    ck_assert_int_eq(s.warm_spares, 1);
    ck_assert_str_eq(s.warm_imports, "deepspeed,transformers.models");
    ck_assert_int_eq(parse("{\"warm_spares\": 2}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "warm_spares: expected an integer in [0, 1]"));
    ck_assert_int_eq(parse("{\"warm_imports\": \"os; rm -rf\"}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "warm_imports: expected comma-separated module names"));
    ck_assert_ptr_nonnull(strstr(err, "'os; rm -rf'"));
}
END_TEST

START_TEST(model_dimensions_override_the_preset)
{
    struct job_spec s;
    struct gpt_config g;
    char err[512] = "";
    /* A 350M-class shape from the gpt2-124m preset. */
    ck_assert_int_eq(parse("{\"model\": \"gpt2-124m\", \"n_layer\": 24, \"n_head\": 16, \"n_embd\": 1024}", &s, err,
                           sizeof(err)), 0);
    ck_assert_int_eq(job_spec_model(&s, &g, err, sizeof(err)), 0);
    ck_assert_int_eq(g.L, 24);
    ck_assert_int_eq(g.NH, 16);
    ck_assert_int_eq(g.C, 1024);
    ck_assert_int_eq(g.T, 1024);
    ck_assert_int_eq(g.V, 50257);
    ck_assert_uint_eq(gpt_param_count(&g), 354823168u); /* GPT-2 medium with a tied head */

    ck_assert_int_eq(parse("{\"model\": \"small\", \"n_embd\": 100, \"n_head\": 8}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "job.json: n_embd (100) must be a positive multiple of n_head (8)"));
    ck_assert_int_eq(parse("{\"n_layer\": 65}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "n_layer"));
    ck_assert_int_eq(parse("{\"model\": \"huge\"}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "model: unknown preset \"huge\" (expected one of tiny, small, gpt2-124m)"));
    ck_assert_int_eq(parse("{\"model\": \"tiny\", \"seq_len\": 64}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "seq_len: expected at most the model's context (32), got 64"));
    ck_assert_int_eq(parse("{\"model\": \"tiny\", \"context\": 64, \"seq_len\": 64}", &s, err, sizeof(err)), 0);
    ck_assert_int_eq(parse("{\"vocab\": 1}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "vocab: expected 2 to 65536, got 1"));
    ck_assert_int_eq(parse("{\"nodes\": 4000, \"spare_nodes\": 97}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "spare_nodes: expected nodes + spare_nodes at most 4096, got 4000 + 97"));
    ck_assert_int_eq(parse("{\"spare_nodes\": -1}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "spare_nodes"));
    ck_assert_int_eq(parse("{\"nodes\": 2, \"spare_nodes\": 1}", &s, err, sizeof(err)), 0);
    ck_assert_int_eq(s.spare_nodes, 1);
}
END_TEST

/* memory_checkpoint_*: off by default, a size turns it on, the rest needs it and is checked. */
START_TEST(memory_checkpoint_keys)
{
    struct job_spec s;
    char err[512];
    ck_assert_int_eq(parse("{}", &s, err, sizeof(err)), 0);
    ck_assert_int_eq(s.memory_checkpoint_mb, 0);
    ck_assert_str_eq(s.memory_checkpoint_root, "/dev/shm");
    ck_assert_str_eq(s.memory_checkpoint_latest, "glob:*");
    ck_assert_int_eq(s.memory_checkpoint_keep, 2);
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 512, \"memory_checkpoint_root\": \"/run/shm\", "
                           "\"memory_checkpoint_latest\": \"file:latest\", \"memory_checkpoint_keep\": 3}",
                           &s, err, sizeof(err)), 0);
    ck_assert_int_eq(s.memory_checkpoint_mb, 512);
    ck_assert_str_eq(s.memory_checkpoint_root, "/run/shm");
    ck_assert_str_eq(s.memory_checkpoint_latest, "file:latest");
    ck_assert_int_eq(s.memory_checkpoint_keep, 3);
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": -1}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_mb: expected an integer in [0, 1073741824], got -1"));
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": \"1G\"}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_mb: expected an integer"));
    ck_assert_int_eq(parse("{\"memory_checkpoint_keep\": 5}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_keep: expected memory_checkpoint_mb too"));
    ck_assert_int_eq(parse("{\"memory_checkpoint_root\": \"/x\"}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_root: expected memory_checkpoint_mb too"));
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_keep\": 1}", &s, err, sizeof(err)),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_keep: expected an integer in [2, 1000], got 1"));
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_root\": \"shm\"}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_root: expected an absolute path without .."));
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_root\": \"/dev/shm/../etc\"}", &s,
                           err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_root\": \"/dev/..\"}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_latest\": \"latest\"}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_latest: expected \"file:NAME\""));
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_latest\": \"file:a/b\"}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_latest\": \"glob:\"}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_latest\": \"committed:step*\"}", &s,
                           err, sizeof(err)), 0);
    ck_assert_str_eq(s.memory_checkpoint_latest, "committed:step*");
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_latest\": \"committed:\"}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "\"glob:PATTERN\" or \"committed:PATTERN\""));
}
END_TEST

START_TEST(memory_checkpoint_drain_keys)
{
    struct job_spec s;
    char err[512];
    ck_assert_int_eq(parse("{}", &s, err, sizeof(err)), 0);
    ck_assert_int_eq(s.memory_checkpoint_drain_steps, 0);
    ck_assert_int_eq(s.memory_checkpoint_drain_keep, 2);
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_drain_steps\": 50, "
                           "\"memory_checkpoint_drain_keep\": 3, \"checkpoint_dir\": \"/ckpt\"}", &s, err, sizeof(err)), 0);
    ck_assert_int_eq(s.memory_checkpoint_drain_steps, 50);
    ck_assert_int_eq(s.memory_checkpoint_drain_keep, 3);
    ck_assert_int_eq(parse("{\"memory_checkpoint_drain_steps\": 50, \"checkpoint_dir\": \"/ckpt\"}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_drain_steps: expected memory_checkpoint_mb too"));
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_drain_steps\": 50}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_drain_steps: expected checkpoint_dir too"));
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_drain_keep\": 4}", &s, err,
                           sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_drain_keep: expected memory_checkpoint_drain_steps too"));
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_drain_steps\": 50, "
                           "\"memory_checkpoint_drain_keep\": 0, \"checkpoint_dir\": \"/c\"}", &s, err, sizeof(err)),
                     -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_drain_keep: expected an integer in [1, 1000], got 0"));
    ck_assert_int_eq(parse("{\"memory_checkpoint_mb\": 8, \"memory_checkpoint_drain_steps\": -1, "
                           "\"checkpoint_dir\": \"/c\"}", &s, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "memory_checkpoint_drain_steps: expected an integer in [0, 100000000], got -1"));
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
    tcase_add_test(tc, memory_checkpoint_drain_keys);
    tcase_add_test(tc, warm_spare_keys);
    tcase_add_test(tc, model_dimensions_override_the_preset);
    tcase_add_test(tc, program_needs_are_lists_and_rules);
    tcase_add_test(tc, memory_checkpoint_keys);
    suite_add_tcase(s, tc);
    return s;
}
