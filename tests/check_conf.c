/*
 * conf: musterd.json and worker.json against their tables: a good file,
 * unknown keys, bad values and types, relative paths, defaults from
 * systemd's directories, and every key documented in docs/config.md.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/batch.h"
#include "common/conf.h"
#include "common/jobspec.h"
#include "daemon/musterd_config.h"
#include "worker/agent/agent_config.h"

static char dir[64], path[128];

static void setup(void)
{
    snprintf(dir, sizeof(dir), "/tmp/muster-conf.XXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(path, sizeof(path), "%s/conf.json", dir);
}

static void teardown(void)
{
    unlink(path);
    rmdir(dir);
}

static void write_conf(const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

static int load_worker(const char *text, struct agent_file *f, char *err, size_t errlen)
{
    write_conf(text);
    agent_config_defaults(f);
    return conf_load(path, agent_config_keys, agent_config_nkeys, f, err, errlen);
}

/* err must be exactly "<path>: <rest>". */
static void expect_err(const char *err, const char *rest)
{
    char want[512];
    snprintf(want, sizeof(want), "%s: %s", path, rest);
    ck_assert_str_eq(err, want);
}

START_TEST(good_worker_file)
{
    struct agent_file f;
    char err[512] = "", tok[256];
    ck_assert_int_eq(load_worker("{\"daemon\": \"master:29470\", \"node\": \"gpu-07\", \"devices\": \"gpu:0,1\",\n"
                                 " \"token_file\": \"token\", \"rank_cmd\": \"/opt/train --x\", \"addr\": \"10.0.0.7\",\n"
                                 " \"log_level\": \"debug\"}", &f, err, sizeof(err)), 0);
    ck_assert_str_eq(f.daemon, "master:29470");
    ck_assert_str_eq(f.node, "gpu-07");
    ck_assert_str_eq(f.devices, "gpu:0,1");
    snprintf(tok, sizeof(tok), "%s/token", dir); /* relative to the file's directory */
    ck_assert_str_eq(f.token_file, tok);
    ck_assert_str_eq(f.rank_cmd, "/opt/train"); /* packed: "/opt/train\0--x\0\0" */
    ck_assert_str_eq(f.rank_cmd + strlen("/opt/train") + 1, "--x");
    ck_assert_str_eq(f.addr, "10.0.0.7");
    ck_assert_str_eq(f.log_level, "debug");

    /* Keys not in the file keep their defaults. */
    unsetenv("CONFIGURATION_DIRECTORY");
    ck_assert_int_eq(load_worker("{\"daemon\": \"[::1]:1\", \"token_file\": \"/abs/t\"}", &f, err, sizeof(err)), 0);
    ck_assert_str_eq(f.token_file, "/abs/t");
    ck_assert_str_eq(f.node, "");
    ck_assert_str_eq(f.log_level, "info");
}
END_TEST

START_TEST(unknown_key_and_bad_values_name_file_key_and_expectation)
{
    struct agent_file f;
    char err[512];
    ck_assert_int_eq(load_worker("{\"daemon\": \"m:1\", \"colour\": \"red\"}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "colour: unknown key (see docs/config.md for the keys)");
    ck_assert_int_eq(load_worker("{\"devices\": \"tpu:1\"}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "devices: expected cpu:N (N in 1..64), gpu:all or gpu:I,J,..., got \"tpu:1\"");
    ck_assert_int_eq(load_worker("{\"daemon\": \"master\"}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "daemon: expected HOST:PORT[,HOST:PORT...] (each a name, IPv4 or [IPv6], port 1..65535), got \"master\"");
    ck_assert_int_eq(load_worker("{\"daemon\": 29470}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "daemon: expected HOST:PORT[,HOST:PORT...] (each a name, IPv4 or [IPv6], port 1..65535) as a string, got an integer");
    ck_assert_int_eq(load_worker("{\"node\": \"a b\"}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "node: expected 1..63 characters of [A-Za-z0-9._-], got \"a b\"");
    ck_assert_int_eq(load_worker("{\"log_level\": \"loud\"}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "log_level: expected error, warn, info or debug, got \"loud\"");
    ck_assert_int_eq(load_worker("{\"rank_cmd\": \"\"}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "rank_cmd: expected a command of 1..256 words and at most 4094 bytes, got no word (0 words, 0 bytes)");
    ck_assert_int_eq(load_worker("{\"rank_cmd\": [\"python3\", 7]}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "rank_cmd: expected an array of strings, got an integer at index 1");
    ck_assert_int_eq(load_worker("{\"master_port_range\": \"29600-29500\"}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "master_port_range: expected LO-HI with 1024 <= LO <= HI <= 65535, got \"29600-29500\"");
    ck_assert_int_eq(load_worker("{\"rank_user\": \"no-such-user-zz\"}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "rank_user: expected a user of this machine (name or uid), not root, got \"no-such-user-zz\"");
    ck_assert_int_eq(load_worker("{\"rank_user\": \"\"}", &f, err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(load_worker("{\"rank_group\": \"no-such-group-zz\"}", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "rank_group: expected a group of this machine (name or gid), got \"no-such-group-zz\"");
    ck_assert_int_eq(load_worker("{\"rank_user\": \"root\", \"rank_group\": \"0\"}", &f, err, sizeof(err)), 0);
    ck_assert_str_eq(f.rank_user, "root"); /* a name of this machine: who may be one is for start-up to say */
    ck_assert_str_eq(f.rank_group, "0");
    ck_assert_int_eq(load_worker("[1, 2]", &f, err, sizeof(err)), -EINVAL);
    expect_err(err, "expected a JSON object at the top level, got an array");
    ck_assert_int_eq(load_worker("{\"daemon\": ", &f, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "not valid JSON"));
    ck_assert_int_eq(load_worker("{\"node\": \"a\", \"node\": \"b\"}", &f, err, sizeof(err)), -EINVAL);
    unlink(path);
    agent_config_defaults(&f);
    ck_assert_int_eq(conf_load(path, agent_config_keys, agent_config_nkeys, &f, err, sizeof(err)), -ENOENT);
}
END_TEST

START_TEST(musterd_file_and_defaults_from_systemd)
{
    struct musterd_config c;
    char err[512] = "", want[256];
    setenv("STATE_DIRECTORY", "/var/lib/muster-x", 1);
    setenv("CONFIGURATION_DIRECTORY", "/etc/muster-x", 1);
    musterd_config_defaults(&c);
    ck_assert_str_eq(c.state_dir, "/var/lib/muster-x");
    ck_assert_str_eq(c.token_file, "/etc/muster-x/token");
    ck_assert_str_eq(c.listen, "0.0.0.0:29470");
    ck_assert_str_eq(c.http, "127.0.0.1:29471");
    ck_assert_str_eq(c.admin_token_file, "");
    musterd_config_default_path(want, sizeof(want));
    ck_assert_str_eq(want, "/etc/muster-x/musterd.json");
    unsetenv("STATE_DIRECTORY");
    unsetenv("CONFIGURATION_DIRECTORY");
    musterd_config_defaults(&c);
    ck_assert_str_eq(c.state_dir, "/var/lib/muster");
    ck_assert_str_eq(c.token_file, "/etc/muster/token");

    write_conf("{\"listen\": \"10.0.0.1:4000\", \"http\": \"0.0.0.0:4001\", \"job\": \"jobs/big.json\",\n"
               " \"admin_token_file\": \"/etc/muster/admin-token\", \"state_dir\": \"/srv/muster\"}");
    ck_assert_int_eq(conf_load(path, musterd_config_keys, musterd_config_nkeys, &c, err, sizeof(err)), 0);
    ck_assert_str_eq(c.listen, "10.0.0.1:4000");
    ck_assert_str_eq(c.http, "0.0.0.0:4001");
    snprintf(want, sizeof(want), "%s/jobs/big.json", dir);
    ck_assert_str_eq(c.job, want);
    ck_assert_str_eq(c.admin_token_file, "/etc/muster/admin-token");
    ck_assert_str_eq(c.state_dir, "/srv/muster");

    write_conf("{\"listen\": \"29470\"}");
    ck_assert_int_eq(conf_load(path, musterd_config_keys, musterd_config_nkeys, &c, err, sizeof(err)), -EINVAL);
    expect_err(err, "listen: expected ADDR:PORT, got \"29470\"");
    write_conf("{\"http\": \"127.0.0.1:70000\"}");
    ck_assert_int_eq(conf_load(path, musterd_config_keys, musterd_config_nkeys, &c, err, sizeof(err)), -EINVAL);
    expect_err(err, "http: expected ADDR:PORT, got \"127.0.0.1:70000\"");
    write_conf("{\"nodes\": \"2\"}");
    ck_assert_int_eq(conf_load(path, musterd_config_keys, musterd_config_nkeys, &c, err, sizeof(err)), -EINVAL);
    expect_err(err, "nodes: unknown key (see docs/config.md for the keys)");
}
END_TEST

/* Every key of both tables has a row "| `key` |" in docs/config.md (tests run at the repository root). */
START_TEST(every_key_is_documented)
{
    FILE *f = fopen("docs/config.md", "r");
    ck_assert_ptr_nonnull(f);
    static char doc[65536];
    size_t n = fread(doc, 1, sizeof(doc) - 1, f);
    fclose(f);
    doc[n] = '\0';
    const struct { const struct conf_key *keys; size_t n; } tables[] = {
        {musterd_config_keys, musterd_config_nkeys}, {agent_config_keys, agent_config_nkeys}};
    for (size_t t = 0; t < 2; t++)
        for (size_t i = 0; i < tables[t].n; i++) {
            char row[96];
            snprintf(row, sizeof(row), "| `%s` |", tables[t].keys[i].name);
            ck_assert_msg(strstr(doc, row), "docs/config.md has no row for key %s", tables[t].keys[i].name);
        }
}
END_TEST

/* The shipped examples load, and every preset splits its batch on 8, 16 and 64 GPUs. */
START_TEST(shipped_examples_are_valid)
{
    struct musterd_config mc;
    struct agent_file af;
    char err[512] = "";
    musterd_config_defaults(&mc);
    ck_assert_msg(conf_load("etc/musterd.json", musterd_config_keys, musterd_config_nkeys, &mc, err, sizeof(err)) == 0,
                  "%s", err);
    ck_assert_str_eq(mc.job, "etc/job.json");
    agent_config_defaults(&af);
    ck_assert_msg(conf_load("etc/worker.json", agent_config_keys, agent_config_nkeys, &af, err, sizeof(err)) == 0,
                  "%s", err);
    static const char *const presets[] = {"etc/conservative.json", "etc/balanced.json", "etc/aggressive.json"};
    static const int worlds[] = {8, 16, 64};
    int micro[3];
    for (int p = 0; p < 3; p++) {
        struct job_spec spec;
        ck_assert_msg(job_spec_load(presets[p], &spec, NULL, err, sizeof(err)) == 0, "%s", err);
        micro[p] = spec.micro_batch;
        for (int w = 0; w < 3; w++) {
            struct batch_plan plan;
            ck_assert_msg(batch_plan(spec.batch, spec.micro_batch, worlds[w], &plan, err, sizeof(err)) == 0,
                          "%s on %d ranks: %s", presets[p], worlds[w], err);
            ck_assert_int_eq(plan.micro_batch * plan.accum * worlds[w], spec.batch);
        }
    }
    /* Memory/speed: conservative < balanced < aggressive in micro-batch (activation memory). */
    ck_assert_int_lt(micro[0], micro[1]);
    ck_assert_int_lt(micro[1], micro[2]);
}
END_TEST

Suite *make_conf_suite(void)
{
    Suite *s = suite_create("conf");
    TCase *tc = tcase_create("conf");
    tcase_set_timeout(tc, 10);
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, good_worker_file);
    tcase_add_test(tc, unknown_key_and_bad_values_name_file_key_and_expectation);
    tcase_add_test(tc, musterd_file_and_defaults_from_systemd);
    tcase_add_test(tc, every_key_is_documented);
    tcase_add_test(tc, shipped_examples_are_valid);
    suite_add_tcase(s, tc);
    return s;
}
