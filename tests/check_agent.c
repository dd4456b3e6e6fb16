/*
 * The node agent's pure parts: --devices parsing and GPU discovery,
 * HOST:PORT parsing, reconnect backoff, a rank's argv and environment.
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "worker/agent/agent_join.h"
#include "worker/agent/devices.h"
#include "worker/agent/rank_env.h"

/* ---- --devices --------------------------------------------------------- */

START_TEST(devices_cpu)
{
    struct device_set d;
    char err[256] = "";
    ck_assert_int_eq(devices_parse("cpu:4", &d, err, sizeof(err)), 0);
    ck_assert_int_eq(d.kind, PROTO_DEV_CPU);
    ck_assert_uint_eq(d.n, 4);
    ck_assert_uint_eq(d.ids[0], 0);
    ck_assert_uint_eq(d.ids[3], 3);
    ck_assert_int_eq(devices_parse("cpu:64", &d, err, sizeof(err)), 0);
    ck_assert_uint_eq(d.n, 64);
}
END_TEST

START_TEST(devices_gpu_list_and_all)
{
    struct device_set d;
    char err[256] = "";
    ck_assert_int_eq(devices_parse("gpu:0,1,3", &d, err, sizeof(err)), 0);
    ck_assert_int_eq(d.kind, PROTO_DEV_GPU);
    ck_assert_uint_eq(d.n, 3);
    ck_assert_uint_eq(d.ids[2], 3);
    ck_assert(!d.all_gpus);
    ck_assert(devices_contains(&d, 1));
    ck_assert(!devices_contains(&d, 2));
    ck_assert_int_eq(devices_parse("gpu:all", &d, err, sizeof(err)), 0);
    ck_assert(d.all_gpus);
    ck_assert_uint_eq(d.n, 0);
}
END_TEST

static void expect_bad(const char *spec, const char *needle)
{
    struct device_set d;
    char err[256] = "";
    ck_assert_int_eq(devices_parse(spec, &d, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, needle) != NULL, "devices_parse(\"%s\"): expected \"%s\" in \"%s\"", spec, needle,
                  err);
}

START_TEST(devices_bad_forms_are_named)
{
    expect_bad("cpu:0", "cpu:N needs N in 1..64, got '0'");
    expect_bad("cpu:65", "got '65'");
    expect_bad("cpu:", "got ''");
    expect_bad("cpu:two", "got 'two'");
    expect_bad("cpu:-1", "got '-1'");
    expect_bad("gpu:", "needs 'all' or a list of ordinals");
    expect_bad("gpu:0,,1", "gpu ordinal '' is not a number");
    expect_bad("gpu:0,x", "gpu ordinal 'x' is not a number");
    expect_bad("gpu:1,", "gpu ordinal '' is not a number");
    expect_bad("gpu:1,1", "gpu ordinal 1 is listed twice");
    expect_bad("tpu:4", "expected cpu:N, gpu:all or gpu:I,J,..., got 'tpu:4'");
    expect_bad("", "expected cpu:N");
}
END_TEST

START_TEST(devices_probe_counts_nvidia_nodes)
{
    char dir[] = "/tmp/check_agent_devXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    char path[256];
    struct device_set d;
    char err[256] = "";
    ck_assert_int_eq(devices_probe_gpus(dir, &d, err, sizeof(err)), -ENODEV);
    ck_assert_ptr_nonnull(strstr(err, "no GPU found"));
    const char *names[] = {"nvidia1", "nvidiactl", "nvidia-uvm", "nvidia0", "nvidia10"};
    for (size_t i = 0; i < 5; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        FILE *f = fopen(path, "w");
        ck_assert_ptr_nonnull(f);
        fclose(f);
    }
    ck_assert_int_eq(devices_probe_gpus(dir, &d, err, sizeof(err)), 0);
    ck_assert_uint_eq(d.n, 3);
    ck_assert_uint_eq(d.ids[0], 0);
    ck_assert_uint_eq(d.ids[1], 1);
    ck_assert_uint_eq(d.ids[2], 10);
    for (size_t i = 0; i < 5; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        unlink(path);
    }
    rmdir(dir);
    ck_assert_int_eq(devices_probe_gpus("/nonexistent-dir", &d, err, sizeof(err)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(err, "cannot list /nonexistent-dir"));
}
END_TEST

/* ---- HOST:PORT --------------------------------------------------------- */

START_TEST(hostport_good)
{
    char host[HOSTPORT_HOST_MAX], err[256];
    uint16_t port = 0;
    ck_assert_int_eq(hostport_parse("127.0.0.1:29470", host, &port, err, sizeof(err)), 0);
    ck_assert_str_eq(host, "127.0.0.1");
    ck_assert_uint_eq(port, 29470);
    ck_assert_int_eq(hostport_parse("master-0.cluster:1", host, &port, err, sizeof(err)), 0);
    ck_assert_str_eq(host, "master-0.cluster");
    ck_assert_uint_eq(port, 1);
    ck_assert_int_eq(hostport_parse("[::1]:65535", host, &port, err, sizeof(err)), 0);
    ck_assert_str_eq(host, "::1");
    ck_assert_uint_eq(port, 65535);
}
END_TEST

static void expect_bad_hp(const char *s, const char *needle)
{
    char host[HOSTPORT_HOST_MAX], err[256] = "";
    uint16_t port;
    ck_assert_int_eq(hostport_parse(s, host, &port, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, needle) != NULL, "hostport_parse(\"%s\"): expected \"%s\" in \"%s\"", s, needle, err);
}

START_TEST(hostport_bad)
{
    expect_bad_hp("localhost", "no port");
    expect_bad_hp(":29470", "host of 1..");
    expect_bad_hp("host:", "port must be 1..65535, got ''");
    expect_bad_hp("host:0", "got '0'");
    expect_bad_hp("host:65536", "got '65536'");
    expect_bad_hp("host:12x", "got '12x'");
    expect_bad_hp("host:-5", "got '-5'");
    expect_bad_hp("::1:80", "write an IPv6 address as [ADDR]:PORT");
    expect_bad_hp("[::1]80", "expected [IPv6]:PORT");
}
END_TEST

/* ---- backoff ----------------------------------------------------------- */

START_TEST(backoff_grows_to_cap_with_jitter_in_bounds)
{
    struct backoff b;
    backoff_init(&b, BACKOFF_BASE_MS, BACKOFF_CAP_MS);
    uint64_t expect[] = {200, 400, 800, 1600, 3200, 5000, 5000, 5000};
    for (size_t i = 0; i < sizeof(expect) / sizeof(expect[0]); i++) {
        ck_assert_uint_eq(backoff_ceiling(&b), expect[i]);
        struct backoff probe = b;
        /* The largest random value lands on the ceiling, zero on zero. */
        ck_assert_uint_eq(backoff_next(&probe, (uint32_t)expect[i]), expect[i]);
        probe = b;
        ck_assert_uint_eq(backoff_next(&probe, 0), 0);
        uint64_t d = backoff_next(&b, (uint32_t)rand());
        ck_assert_uint_le(d, expect[i]);
    }
    for (int i = 0; i < 1000; i++)
        ck_assert_uint_le(backoff_next(&b, (uint32_t)rand() * 2u + 1u), BACKOFF_CAP_MS);
    ck_assert_uint_eq(backoff_ceiling(&b), BACKOFF_CAP_MS);
}
END_TEST

START_TEST(backoff_reset_starts_over)
{
    struct backoff b;
    backoff_init(&b, 200, 5000);
    for (int i = 0; i < 100; i++)
        backoff_next(&b, 0xffffffffu);
    ck_assert_uint_eq(backoff_ceiling(&b), 5000);
    backoff_reset(&b);
    ck_assert_uint_eq(backoff_ceiling(&b), 200);
    ck_assert_uint_le(backoff_next(&b, 0xffffffffu), 200);
    ck_assert_uint_eq(backoff_ceiling(&b), 400);
}
END_TEST

/* ---- rank argv and environment ----------------------------------------- */

static const char *env_get(char **env, const char *name)
{
    size_t n = strlen(name);
    const char *found = NULL;
    for (size_t i = 0; env[i]; i++) {
        if (strncmp(env[i], name, n) == 0 && env[i][n] == '=') {
            ck_assert_msg(found == NULL, "%s appears twice in the environment", name);
            found = env[i] + n + 1;
        }
    }
    return found;
}

START_TEST(rank_env_gpu)
{
    char *parent[] = {"PATH=/usr/bin", "RANK=99", "CUDA_VISIBLE_DEVICES=0,1,2,3", "HOME=/root", NULL};
    struct rank_identity id = {.rank = 9, .local_rank = 1, .world_size = 16, .local_world_size = 8,
                               .generation = 4, .node = "node-b", .kind = PROTO_DEV_GPU, .device = 5};
    char **env = rank_env_build(parent, &id);
    ck_assert_ptr_nonnull(env);
    ck_assert_str_eq(env_get(env, "PATH"), "/usr/bin");
    ck_assert_str_eq(env_get(env, "HOME"), "/root");
    ck_assert_str_eq(env_get(env, "RANK"), "9");
    ck_assert_str_eq(env_get(env, "LOCAL_RANK"), "1");
    ck_assert_str_eq(env_get(env, "WORLD_SIZE"), "16");
    ck_assert_str_eq(env_get(env, "LOCAL_WORLD_SIZE"), "8");
    ck_assert_str_eq(env_get(env, "MUSTER_GENERATION"), "4");
    ck_assert_str_eq(env_get(env, "MUSTER_NODE"), "node-b");
    ck_assert_str_eq(env_get(env, "MUSTER_CTL_FD"), "3");
    ck_assert_str_eq(env_get(env, "CUDA_VISIBLE_DEVICES"), "5");
    rank_strv_free(env);
}
END_TEST

START_TEST(rank_env_cpu_hides_gpus)
{
    char *parent[] = {"CUDA_VISIBLE_DEVICES=0", "RANKING=kept", NULL};
    struct rank_identity id = {.rank = 0, .local_rank = 0, .world_size = 1, .local_world_size = 1,
                               .generation = 1, .node = "n", .kind = PROTO_DEV_CPU, .device = 0};
    char **env = rank_env_build(parent, &id);
    ck_assert_ptr_nonnull(env);
    ck_assert_str_eq(env_get(env, "CUDA_VISIBLE_DEVICES"), "");
    ck_assert_str_eq(env_get(env, "RANKING"), "kept");
    ck_assert_str_eq(env_get(env, "RANK"), "0");
    rank_strv_free(env);
    env = rank_env_build(NULL, &id);
    ck_assert_ptr_nonnull(env);
    ck_assert_str_eq(env_get(env, "WORLD_SIZE"), "1");
    rank_strv_free(env);
}
END_TEST

START_TEST(rank_argv_split_on_whitespace)
{
    char **v = rank_argv_split("  build/tests/fake-rank\t--steps 20   --step-ms=5 ");
    ck_assert_ptr_nonnull(v);
    ck_assert_str_eq(v[0], "build/tests/fake-rank");
    ck_assert_str_eq(v[1], "--steps");
    ck_assert_str_eq(v[2], "20");
    ck_assert_str_eq(v[3], "--step-ms=5");
    ck_assert_ptr_null(v[4]);
    rank_strv_free(v);
    ck_assert_ptr_null(rank_argv_split(""));
    ck_assert_ptr_null(rank_argv_split(" \t "));
}
END_TEST

Suite *make_agent_suite(void)
{
    Suite *s = suite_create("agent");
    TCase *tc = tcase_create("devices");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, devices_cpu);
    tcase_add_test(tc, devices_gpu_list_and_all);
    tcase_add_test(tc, devices_bad_forms_are_named);
    tcase_add_test(tc, devices_probe_counts_nvidia_nodes);
    suite_add_tcase(s, tc);

    tc = tcase_create("join");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, hostport_good);
    tcase_add_test(tc, hostport_bad);
    tcase_add_test(tc, backoff_grows_to_cap_with_jitter_in_bounds);
    tcase_add_test(tc, backoff_reset_starts_over);
    suite_add_tcase(s, tc);

    tc = tcase_create("rank_env");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, rank_env_gpu);
    tcase_add_test(tc, rank_env_cpu_hides_gpus);
    tcase_add_test(tc, rank_argv_split_on_whitespace);
    suite_add_tcase(s, tc);
    return s;
}
