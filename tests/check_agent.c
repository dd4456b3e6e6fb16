/*
 * The node agent's pure parts: --devices parsing and GPU discovery,
 * HOST:PORT parsing, reconnect backoff, the queue of rank exits kept across
 * a stalled link, a rank's argv and environment, and the rank logs (written,
 * rotated and read back in a temporary directory).
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/mkdirs.h"
#include "worker/agent/agent_config.h"
#include "worker/agent/agent_join.h"
#include "worker/agent/devices.h"
#include "worker/agent/exit_queue.h"
#include "common/cmdline.h"
#include "worker/agent/rank_env.h"
#include "worker/agent/rank_failure.h"
#include "worker/agent/rank_log.h"
#include "worker/agent/rank_stacks.h"
#include "worker/agent/rank_user.h"
#include "worker/agent/rank_flight.h"
#include "worker/agent/spare.h"

#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <sys/wait.h>
#include <time.h>

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

/* Several daemons: a list, and the leader a standby's REJECT names. */
START_TEST(daemon_list_follows_the_leader)
{
    struct daemon_list l;
    char err[256];
    ck_assert_int_eq(daemon_list_parse("a:1,b:2", &l, err, sizeof(err)), 0);
    ck_assert_uint_eq(l.n, 2);
    ck_assert_str_eq(l.addr[l.cur], "a:1");
    ck_assert_int_eq(daemon_list_follow(&l, "b:2 leads; this musterd stands by"), 1);
    ck_assert_str_eq(l.addr[l.cur], "b:2");
    /* A leader not in the list is not joined (etcd's key named it, not the operator). */
    ck_assert_int_eq(daemon_list_follow(&l, "c:3 leads; this musterd stands by"), -1);
    ck_assert_uint_eq(l.n, 2);
    ck_assert_str_eq(l.addr[l.cur], "b:2");
    /* No leader named (an election under way), or garbage: nothing moves. */
    ck_assert_int_eq(daemon_list_follow(&l, "no leader; this musterd stands by until one is elected"), 0);
    ck_assert_int_eq(daemon_list_follow(&l, "c:0 leads"), 0);
    ck_assert_int_eq(daemon_list_follow(&l, ""), 0);
    ck_assert_str_eq(l.addr[l.cur], "b:2");
    daemon_list_next(&l);
    ck_assert_str_eq(l.addr[l.cur], "a:1");
    ck_assert_int_eq(daemon_list_parse("a:1,", &l, err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(daemon_list_parse("a:1,b", &l, err, sizeof(err)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(err, "'b'"));
    ck_assert_int_eq(daemon_list_parse("a:1,b:2,c:3,d:4,e:5,f:6,g:7,h:8,i:9", &l, err, sizeof(err)), -EINVAL);
}
END_TEST

/* A frame of a term lower than one seen is a deposed leader's: refused. */
START_TEST(daemon_list_refuses_a_lower_term)
{
    struct daemon_list l;
    char err[256];
    ck_assert_int_eq(daemon_list_parse("a:1,b:2", &l, err, sizeof(err)), 0);
    ck_assert_uint_eq(l.term, 0);
    /* No store: term 0 throughout. */
    ck_assert_int_eq(daemon_list_term(&l, 0), 0);
    ck_assert_int_eq(daemon_list_term(&l, 41), 0);
    ck_assert_int_eq(daemon_list_term(&l, 41), 0);
    ck_assert_uint_eq(l.term, 41);
    /* The next leader's term is higher (a later etcd revision). */
    ck_assert_int_eq(daemon_list_term(&l, 57), 0);
    ck_assert_uint_eq(l.term, 57);
    /* The old leader, or a daemon without a store, is refused and changes nothing. */
    ck_assert_int_eq(daemon_list_term(&l, 41), -ESTALE);
    ck_assert_int_eq(daemon_list_term(&l, 0), -ESTALE);
    ck_assert_uint_eq(l.term, 57);
    /* Following a leader or moving on keeps the term. */
    ck_assert_int_eq(daemon_list_follow(&l, "b:2 leads; this musterd stands by"), 1);
    daemon_list_next(&l);
    ck_assert_uint_eq(l.term, 57);
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

/* ---- rank exits kept until the daemon has read them ------------------- */

static struct proto_rank_exit an_exit(uint64_t generation, uint32_t rank, int code)
{
    struct proto_rank_exit x;
    memset(&x, 0, sizeof(x));
    x.generation = generation;
    x.rank = rank;
    x.exit_code = code;
    snprintf(x.reason, sizeof(x.reason), "rank %u said %d", rank, code);
    return x;
}

START_TEST(exitq_echo_of_a_later_beat_confirms)
{
    static struct exitq q;
    memset(&q, 0, sizeof(q));
    struct proto_rank_exit x = an_exit(3, 5, 1);
    exitq_push(&q, &x, 10); /* sent after heartbeat 10 */
    exitq_confirm(&q, 9);
    exitq_confirm(&q, 10); /* heartbeat 10 went before the exit: says nothing of it */
    ck_assert_uint_eq(q.n, 1);
    ck_assert(exitq_holds(&q, 3));
    ck_assert(!exitq_holds(&q, 2));
    ck_assert_str_eq(q.e[0].x.reason, "rank 5 said 1");
    exitq_confirm(&q, 11);
    ck_assert_uint_eq(q.n, 0);
    ck_assert(!exitq_holds(&q, 3));
}
END_TEST

START_TEST(exitq_unsent_waits_for_a_resend)
{
    static struct exitq q;
    memset(&q, 0, sizeof(q));
    struct proto_rank_exit a = an_exit(3, 5, 1), b = an_exit(3, 6, 0), c = an_exit(4, 7, 2);
    exitq_push(&q, &a, 10);
    exitq_push(&q, &b, EXITQ_UNSENT);
    exitq_push(&q, &c, 12);
    exitq_confirm(&q, 1000000);
    ck_assert_uint_eq(q.n, 1); /* only the one never sent is left */
    ck_assert_uint_eq(q.e[0].x.rank, 6);
    exitq_sent(&q, 0, 40);
    exitq_confirm(&q, 40);
    ck_assert_uint_eq(q.n, 1);
    exitq_confirm(&q, 41);
    ck_assert_uint_eq(q.n, 0);
}
END_TEST

START_TEST(exitq_keeps_order_drops_old_generations_and_the_oldest_when_full)
{
    static struct exitq q;
    memset(&q, 0, sizeof(q));
    for (uint32_t i = 0; i < EXITQ_MAX; i++) {
        struct proto_rank_exit x = an_exit(i < 3 ? 2 : 3, i, 1);
        ck_assert_int_eq(exitq_push(&q, &x, EXITQ_UNSENT), 0);
    }
    struct proto_rank_exit last = an_exit(3, 1000, 1);
    ck_assert_int_eq(exitq_push(&q, &last, EXITQ_UNSENT), 1);
    ck_assert_uint_eq(q.n, EXITQ_MAX);
    ck_assert_uint_eq(q.e[0].x.rank, 1); /* rank 0's, the oldest, made room */
    ck_assert_uint_eq(q.e[EXITQ_MAX - 1].x.rank, 1000);
    exitq_drop_before(&q, 3);
    ck_assert_uint_eq(q.n, EXITQ_MAX - 2); /* ranks 1 and 2 were of generation 2 */
    ck_assert(!exitq_holds(&q, 2));
    for (uint32_t i = 0; i + 1 < q.n; i++)
        ck_assert_uint_lt(q.e[i].x.rank, q.e[i + 1].x.rank);
    ck_assert_uint_eq(q.e[0].x.rank, 3);
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
    char *parent[] = {"PATH=/usr/bin", "RANK=99", "CUDA_VISIBLE_DEVICES=0,1,2,3", "HOME=/root",
                      "CUDA_DEVICE_ORDER=FASTEST_FIRST", NULL};
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
    ck_assert_str_eq(env_get(env, "CUDA_VISIBLE_DEVICES"), "5"); /* its own alone: muster-train, "own" */
    /* the device is NVML's ordinal (PCI bus order): CUDA must count the same way */
    ck_assert_str_eq(env_get(env, "CUDA_DEVICE_ORDER"), "PCI_BUS_ID");
    cmdline_free(env);
}
END_TEST

START_TEST(rank_env_drops_secrets)
{
    char *parent[] = {"PATH=/usr/bin", "MUSTER_TOKEN_FILE=/etc/muster/token", "MUSTER_TOKEN=abc",
                      "MUSTER_ADMIN_TOKEN=adm", "MUSTER_READ_TOKEN=rd", "ETCDCTL_PASSWORD=pw", "ETCDCTL_KEY=/k",
                      "CREDENTIALS_DIRECTORY=/run/credentials/x", "CONFIGURATION_DIRECTORY=/etc/muster",
                      "NOTIFY_SOCKET=/run/systemd/notify", "WATCHDOG_USEC=1", "MUSTER_CTL_FD=9",
                      "MUSTER_TOKENISER=keep?", "MUSTER_JOB=/job.json", "HOME=/root", NULL};
    struct rank_identity id = {.rank = 0, .world_size = 1, .local_world_size = 1, .node = "n", .kind = PROTO_DEV_CPU};
    char **env = rank_env_build(parent, &id);
    ck_assert_ptr_nonnull(env);
    static const char *const gone[] = {"MUSTER_TOKEN_FILE", "MUSTER_TOKEN", "MUSTER_ADMIN_TOKEN", "MUSTER_READ_TOKEN",
                                       "ETCDCTL_PASSWORD", "ETCDCTL_KEY", "CREDENTIALS_DIRECTORY",
                                       "CONFIGURATION_DIRECTORY", "NOTIFY_SOCKET", "WATCHDOG_USEC",
                                       "MUSTER_TOKENISER"}; /* a prefix: any MUSTER_TOKEN* */
    for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++)
        ck_assert_msg(env_get(env, gone[i]) == NULL, "%s reached the rank", gone[i]);
    ck_assert_str_eq(env_get(env, "MUSTER_CTL_FD"), "3"); /* the agent's own, not the parent's */
    ck_assert_str_eq(env_get(env, "MUSTER_JOB"), "/job.json");
    ck_assert_str_eq(env_get(env, "HOME"), "/root");
    ck_assert(rank_env_secret("ETCDCTL_USER=u"));
    ck_assert(!rank_env_secret("MUSTER_NODE=a"));
    ck_assert(!rank_env_secret("NOTIFY_SOCKETS=x")); /* exact names are not prefixes */
    cmdline_free(env);
}
END_TEST

/* ---- rank_user ----------------------------------------------------------- */

START_TEST(rank_user_resolve_names_the_key)
{
    struct rank_user ru;
    char err[512] = "";
    ck_assert_int_eq(rank_user_resolve(NULL, NULL, &ru, err, sizeof(err)), 0);
    ck_assert(!ru.set);
    ck_assert_int_eq(rank_user_resolve("", "", &ru, err, sizeof(err)), 0);
    ck_assert(!ru.set);
    ck_assert_int_eq(rank_user_resolve("no-such-user-zz", NULL, &ru, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strncmp(err, "rank_user: no user \"no-such-user-zz\" on this machine", 50) == 0, "%s", err);
    ck_assert_int_eq(rank_user_resolve(NULL, "root", &ru, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "rank_group: needs rank_user") == err, "%s", err);
    ck_assert_int_eq(rank_user_resolve("root", NULL, &ru, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "rank_user: \"root\" is root") == err, "%s", err);
    struct passwd *pw = getpwnam("nobody");
    if (!pw)
        return;
    struct passwd nobody_copy = *pw, *nobody = &nobody_copy; /* getpw* reuse their buffer */
    ck_assert_int_eq(rank_user_resolve("nobody", "no-such-group-zz", &ru, err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "rank_group: no group \"no-such-group-zz\"") == err, "%s", err);
    int rc = rank_user_resolve("nobody", NULL, &ru, err, sizeof(err));
    if (geteuid() != 0) { /* no CAP_SETUID in a test run as a user */
        ck_assert_int_eq(rc, -EPERM);
        ck_assert_msg(strstr(err, "without CAP_SETUID and CAP_SETGID") != NULL, "%s", err);
        return;
    }
    ck_assert_int_eq(rc, 0);
    ck_assert(ru.set);
    ck_assert_int_eq(ru.uid, nobody->pw_uid);
    ck_assert_int_eq(ru.gid, nobody->pw_gid);
    ck_assert_int_ge(ru.ngroups, 1);
    ck_assert_str_eq(ru.name, "nobody");
    char uid[16];
    snprintf(uid, sizeof(uid), "%u", (unsigned)nobody->pw_uid);
    struct group *g = getgrgid(0);
    ck_assert_int_eq(rank_user_resolve(uid, g ? g->gr_name : "0", &ru, err, sizeof(err)), 0); /* by number */
    ck_assert_int_eq(ru.uid, nobody->pw_uid);
    ck_assert_int_eq(ru.gid, 0);
    ck_assert_int_eq(ru.ngroups, 1); /* a named group is the only one */
    ck_assert_int_eq(ru.groups[0], 0);
}
END_TEST

START_TEST(rank_user_argv_prefixes_the_drop)
{
    char *cmd[] = {"python3", "train.py", "--lr", "1e-3", NULL};
    struct rank_user none = {0};
    char **same = rank_user_argv(&none, cmd);
    ck_assert_ptr_nonnull(same);
    for (int i = 0; i < 4; i++)
        ck_assert_str_eq(same[i], cmd[i]);
    ck_assert_ptr_null(same[4]);
    cmdline_free(same);
    struct rank_user ru = {.set = true, .uid = 1234, .gid = 99, .ngroups = 2, .groups = {99, 44}, .exe = "/opt/mw"};
    char **run = rank_user_argv(&ru, cmd);
    ck_assert_ptr_nonnull(run);
    const char *want[] = {"/opt/mw", RANK_USER_EXEC_FLAG, "1234", "99", "99,44", "--", "python3", "train.py", "--lr",
                          "1e-3"};
    for (int i = 0; i < 10; i++)
        ck_assert_str_eq(run[i], want[i]);
    ck_assert_ptr_null(run[10]);
    struct rank_user back;
    ck_assert_int_eq(rank_user_parse_ids(run[2], run[3], run[4], &back), 0);
    ck_assert_int_eq(back.uid, 1234);
    ck_assert_int_eq(back.gid, 99);
    ck_assert_int_eq(back.ngroups, 2);
    ck_assert_int_eq(back.groups[1], 44);
    cmdline_free(run);
    /* Bad forms: root, signs, junk, an empty list, the "unchanged" id. */
    ck_assert_int_eq(rank_user_parse_ids("0", "1", "1", &back), -EINVAL);
    ck_assert_int_eq(rank_user_parse_ids("-5", "1", "1", &back), -EINVAL);
    ck_assert_int_eq(rank_user_parse_ids("12x", "1", "1", &back), -EINVAL);
    ck_assert_int_eq(rank_user_parse_ids("12", "1", ",", &back), -EINVAL);
    ck_assert_int_eq(rank_user_parse_ids("12", "4294967295", "1", &back), -EINVAL);
    ck_assert_int_eq(rank_user_parse_ids("12", "1", "-", &back), 0);
    ck_assert_int_eq(back.ngroups, 0);
}
END_TEST

/* The trampoline as a rank would run it: drops, proves it cannot go back, execs. */
START_TEST(rank_user_exec_drops_for_good)
{
    struct passwd *nobody = getpwnam("nobody");
    if (geteuid() != 0 || !nobody)
        return; /* switching users needs root */
    char uid[16], gid[16], out[] = "/tmp/check-rank-user.XXXXXX";
    int fd = mkstemp(out);
    ck_assert_int_ge(fd, 0);
    snprintf(uid, sizeof(uid), "%u", (unsigned)nobody->pw_uid);
    snprintf(gid, sizeof(gid), "%u", (unsigned)nobody->pw_gid);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd, 1);
        char *argv[] = {"muster-worker", RANK_USER_EXEC_FLAG, uid, gid, gid, "--", "/bin/sh", "-c", "id -u; id -G",
                        NULL};
        _exit(rank_user_exec(9, argv));
    }
    int status;
    waitpid(pid, &status, 0);
    ck_assert(WIFEXITED(status));
    ck_assert_int_eq(WEXITSTATUS(status), 0);
    char text[128] = "", want[64];
    ck_assert_int_gt(pread(fd, text, sizeof(text) - 1, 0), 0);
    snprintf(want, sizeof(want), "%s\n%s\n", uid, gid);
    ck_assert_str_eq(text, want);
    close(fd);
    unlink(out);
    char *bad[] = {"muster-worker", RANK_USER_EXEC_FLAG, "0", "0", "0", "--", "/bin/true", NULL};
    ck_assert_int_eq(rank_user_exec(7, bad), 2); /* never to root */
}
END_TEST

START_TEST(rank_user_grant_dir_lets_the_rank_in)
{
    char base[] = "/tmp/check-grant.XXXXXX", dir[256];
    ck_assert_ptr_nonnull(mkdtemp(base));
    snprintf(dir, sizeof(dir), "%s/node/gen-1/rank-0", base);
    char mk[300];
    snprintf(mk, sizeof(mk), "mkdir -p %s", dir);
    ck_assert_int_eq(system(mk), 0);
    struct rank_user ru = {.set = true, .uid = 4242, .gid = getegid()};
    int rc = rank_user_grant_dir(&ru, base, dir);
    ck_assert_int_eq(rc, 0);
    struct stat st;
    ck_assert_int_eq(stat(dir, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0770);
    ck_assert_int_eq(st.st_uid, geteuid()); /* the agent keeps it */
    ck_assert_int_eq(st.st_gid, getegid());
    snprintf(mk, sizeof(mk), "%s/node/gen-1", base);
    ck_assert_int_eq(stat(mk, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0710);
    ck_assert_int_eq(stat(base, &st), 0);
    ck_assert_int_eq(st.st_mode & 07777, 0710);
    ck_assert_int_eq(rank_user_grant_dir(&ru, "/elsewhere", dir), -EINVAL);
    /* A link planted in the path is not followed. */
    snprintf(mk, sizeof(mk), "%s/link", base);
    ck_assert_int_eq(symlink("/etc", mk), 0);
    snprintf(dir, sizeof(dir), "%s/link/ssl", base);
    rc = rank_user_grant_dir(&ru, base, dir);
    ck_assert_msg(rc == -ELOOP || rc == -ENOTDIR, "a link was followed: %d", rc);
    snprintf(mk, sizeof(mk), "rm -rf %s", base);
    ck_assert_int_eq(system(mk), 0);
}
END_TEST

START_TEST(rank_env_gpu_node_view)
{
    /* torchrun's view: the node's job devices in LOCAL_RANK order, so that entry LOCAL_RANK is its own. */
    char *parent[] = {"CUDA_VISIBLE_DEVICES=0", NULL};
    const uint32_t node[] = {4, 5, 6, 7};
    struct rank_identity id = {.rank = 9, .local_rank = 1, .world_size = 16, .local_world_size = 4,
                               .generation = 4, .node = "node-b", .kind = PROTO_DEV_GPU, .device = 5,
                               .visible = node, .nvisible = 4};
    char **env = rank_env_build(parent, &id);
    ck_assert_ptr_nonnull(env);
    ck_assert_str_eq(env_get(env, "CUDA_VISIBLE_DEVICES"), "4,5,6,7");
    ck_assert_str_eq(env_get(env, "LOCAL_RANK"), "1");
    cmdline_free(env);
    const uint32_t one[] = {2};
    id.visible = one;
    id.nvisible = 1;
    id.device = 2;
    id.local_rank = 0;
    env = rank_env_build(parent, &id);
    ck_assert_str_eq(env_get(env, "CUDA_VISIBLE_DEVICES"), "2");
    cmdline_free(env);
    id.kind = PROTO_DEV_CPU; /* a cpu rank sees no gpu, whatever the list */
    env = rank_env_build(parent, &id);
    ck_assert_str_eq(env_get(env, "CUDA_VISIBLE_DEVICES"), "");
    cmdline_free(env);
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
    cmdline_free(env);
    env = rank_env_build(NULL, &id);
    ck_assert_ptr_nonnull(env);
    ck_assert_str_eq(env_get(env, "WORLD_SIZE"), "1");
    cmdline_free(env);
}
END_TEST

START_TEST(rank_env_torchrun_names)
{
    /* A platform's node-level values (--from-env) must never reach a rank. */
    char *parent[] = {"MASTER_ADDR=platform-master", "MASTER_PORT=29470", "WORLD_SIZE=2", "RANK=1",
                      "TORCHELASTIC_ERROR_FILE=/elsewhere", "GROUP_RANK=7", NULL};
    struct rank_identity id = {.rank = 5, .local_rank = 1, .world_size = 8, .local_world_size = 4,
                               .node_rank = 1, .nnodes = 2, .generation = 3, .restart_count = 2,
                               .max_restarts = 7, .run_id = "shakespeare", .master_addr = "10.0.0.1",
                               .master_port = 29517, .error_file = "/state/gen-3/rank-5/error.json",
                               .omp_threads = 3, .node = "b", .kind = PROTO_DEV_CPU};
    char **env = rank_env_build(parent, &id);
    ck_assert_ptr_nonnull(env);
    ck_assert_str_eq(env_get(env, "MASTER_ADDR"), "10.0.0.1");
    ck_assert_str_eq(env_get(env, "MASTER_PORT"), "29517");
    ck_assert_str_eq(env_get(env, "RANK"), "5");
    ck_assert_str_eq(env_get(env, "WORLD_SIZE"), "8");
    ck_assert_str_eq(env_get(env, "GROUP_RANK"), "1");
    ck_assert_str_eq(env_get(env, "GROUP_WORLD_SIZE"), "2");
    ck_assert_str_eq(env_get(env, "ROLE_NAME"), "default");
    ck_assert_str_eq(env_get(env, "ROLE_RANK"), "5");
    ck_assert_str_eq(env_get(env, "ROLE_WORLD_SIZE"), "8");
    ck_assert_str_eq(env_get(env, "TORCHELASTIC_RESTART_COUNT"), "2");
    ck_assert_str_eq(env_get(env, "TORCHELASTIC_MAX_RESTARTS"), "7");
    ck_assert_str_eq(env_get(env, "TORCHELASTIC_RUN_ID"), "shakespeare");
    ck_assert_str_eq(env_get(env, "TORCHELASTIC_ERROR_FILE"), "/state/gen-3/rank-5/error.json");
    ck_assert_str_eq(env_get(env, "OMP_NUM_THREADS"), "3");
    /* torch's own default for NCCL errors: muster sets nothing (healing in place needs it off) */
    ck_assert_ptr_null(env_get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"));
    ck_assert_ptr_null(env_get(env, "NCCL_ASYNC_ERROR_HANDLING"));
    cmdline_free(env);
}
END_TEST

START_TEST(rank_env_user_defaults_win)
{
    /* OMP_NUM_THREADS is a default and the NCCL error handling the parent's: the user's value stays. */
    char *parent[] = {"OMP_NUM_THREADS=16", "TORCH_NCCL_ASYNC_ERROR_HANDLING=0", NULL};
    struct rank_identity id = {.rank = 0, .world_size = 1, .local_world_size = 1, .nnodes = 1,
                               .generation = 1, .master_addr = "127.0.0.1", .master_port = 29500,
                               .omp_threads = 2, .node = "n", .kind = PROTO_DEV_CPU};
    char **env = rank_env_build(parent, &id);
    ck_assert_ptr_nonnull(env);
    ck_assert_str_eq(env_get(env, "OMP_NUM_THREADS"), "16");
    ck_assert_str_eq(env_get(env, "TORCH_NCCL_ASYNC_ERROR_HANDLING"), "0");
    ck_assert_ptr_null(env_get(env, "TORCHELASTIC_ERROR_FILE")); /* none given: unset */
    cmdline_free(env);
}
END_TEST

START_TEST(rank_env_python_hook)
{
    /* The hook goes first on PYTHONPATH, the user's path after it; the rank's directory and the
     * stacks signal come with it. Without a hook the user's PYTHONPATH is left as it was. */
    char long_path[3000];
    memset(long_path, 'p', sizeof(long_path) - 1);
    long_path[0] = '/';
    long_path[sizeof(long_path) - 1] = '\0';
    char user[sizeof(long_path) + 16];
    snprintf(user, sizeof(user), "PYTHONPATH=%s", long_path);
    char *parent[] = {user, "MUSTER_RANK_DIR=/stale", "MUSTER_STACKS_SIGNAL=1", NULL};
    struct rank_identity id = {.rank = 2, .world_size = 4, .local_world_size = 2, .nnodes = 2, .generation = 7,
                               .node = "n", .kind = PROTO_DEV_CPU, .python_path = "/m/python/startup:/m/python",
                               .rank_dir = "/state/gen-7/rank-2", .stacks_signal = 39};
    char **env = rank_env_build(parent, &id);
    ck_assert_ptr_nonnull(env);
    char want[sizeof(long_path) + 64];
    snprintf(want, sizeof(want), "/m/python/startup:/m/python:%s", long_path);
    ck_assert_str_eq(env_get(env, "PYTHONPATH"), want); /* longer than any fixed buffer: whole */
    ck_assert_str_eq(env_get(env, "MUSTER_RANK_DIR"), "/state/gen-7/rank-2");
    ck_assert_str_eq(env_get(env, "MUSTER_STACKS_SIGNAL"), "39");
    cmdline_free(env);

    char *bare[] = {NULL};
    env = rank_env_build(bare, &id);
    ck_assert_str_eq(env_get(env, "PYTHONPATH"), "/m/python/startup:/m/python");
    cmdline_free(env);

    id.python_path = NULL;
    id.rank_dir = NULL;
    id.stacks_signal = 0;
    env = rank_env_build(parent, &id);
    ck_assert_str_eq(env_get(env, "PYTHONPATH"), long_path);
    ck_assert_ptr_null(env_get(env, "MUSTER_RANK_DIR")); /* the agent's, never a stale parent's */
    ck_assert_ptr_null(env_get(env, "MUSTER_STACKS_SIGNAL"));
    cmdline_free(env);

    /* the flight recorder's buffer: the job's, unless the agent's environment sets one; 0 = unset */
    id.fr_buffer = 2000;
    env = rank_env_build(bare, &id);
    ck_assert_str_eq(env_get(env, "TORCH_FR_BUFFER_SIZE"), "2000");
    cmdline_free(env);
    char *own[] = {"TORCH_FR_BUFFER_SIZE=50", NULL};
    env = rank_env_build(own, &id);
    ck_assert_str_eq(env_get(env, "TORCH_FR_BUFFER_SIZE"), "50");
    cmdline_free(env);
    id.fr_buffer = 0;
    env = rank_env_build(bare, &id);
    ck_assert_ptr_null(env_get(env, "TORCH_FR_BUFFER_SIZE"));
    cmdline_free(env);
}
END_TEST

START_TEST(cmdline_string_and_array)
{
    char packed[CMDLINE_MAX], why[200];
    ck_assert_int_eq(cmdline_from_string("  build/tests/fake-rank\t--steps 20   --step-ms=5 ", packed,
                                         sizeof(packed)), 0);
    char **v = cmdline_argv(packed);
    ck_assert_ptr_nonnull(v);
    ck_assert_str_eq(v[0], "build/tests/fake-rank");
    ck_assert_str_eq(v[1], "--steps");
    ck_assert_str_eq(v[2], "20");
    ck_assert_str_eq(v[3], "--step-ms=5");
    ck_assert_ptr_null(v[4]);
    cmdline_free(v);
    ck_assert_int_ne(cmdline_from_string(" \t ", packed, sizeof(packed)), 0);
    ck_assert_int_eq(cmdline_set(packed), 0);

    json_t *arr = json_pack("[s, s, s]", "python3", "train.py", "--name=two words");
    ck_assert_int_eq(cmdline_from_json(arr, packed, sizeof(packed), why, sizeof(why)), 0);
    json_decref(arr);
    v = cmdline_argv(packed);
    ck_assert_str_eq(v[2], "--name=two words");
    ck_assert_ptr_null(v[3]);
    cmdline_free(v);
    char line[200];
    cmdline_describe(packed, line, sizeof(line));
    ck_assert_str_eq(line, "python3 train.py '--name=two words'");
}
END_TEST

START_TEST(cmdline_bad_forms_are_named)
{
    char packed[64], why[200];
    json_t *v = json_pack("[s, i]", "python3", 3);
    ck_assert_int_eq(cmdline_from_json(v, packed, sizeof(packed), why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "index 1"));
    json_decref(v);
    v = json_array();
    ck_assert_int_eq(cmdline_from_json(v, packed, sizeof(packed), why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "got 0"));
    json_decref(v);
    v = json_integer(4);
    ck_assert_int_eq(cmdline_from_json(v, packed, sizeof(packed), why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "an integer"));
    json_decref(v);
    v = json_pack("[s, s]", "python3", "");
    ck_assert_int_eq(cmdline_from_json(v, packed, sizeof(packed), why, sizeof(why)), -EINVAL);
    json_decref(v);
    /* Longer than the buffer: refused, not cut. */
    v = json_string("a-program-name-that-is-long another-argument-that-is-long and-a-third-one");
    ck_assert_int_eq(cmdline_from_json(v, packed, sizeof(packed), why, sizeof(why)), -EINVAL);
    json_decref(v);
}
END_TEST

/* Writes text to a fresh file in a temporary directory; returns its path (static). */
static const char *temp_file(const char *text, size_t len)
{
    static char path[64];
    snprintf(path, sizeof(path), "/tmp/check-agent-XXXXXX");
    int fd = mkstemp(path);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(write(fd, text, len), (ssize_t)len);
    close(fd);
    return path;
}

START_TEST(failure_from_torch_error_file)
{
    const char *json =
        "{\"message\": {\"message\": \"RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB\", "
        "\"extraInfo\": {\"py_callstack\": \"Traceback (most recent call last):\\n  File "
        "\\\"/home/u/train.py\\\", line 120, in step\\n    y = model(x)\\n  File "
        "\\\"/usr/lib/python3/dist-packages/torch/nn/modules/module.py\\\", line 1190, in _call_impl\\n    "
        "return forward_call(*input)\\nRuntimeError: CUDA out of memory.\\n\", \"timestamp\": \"1\"}}}";
    const char *path = temp_file(json, strlen(json));
    char reason[PROTO_REASON_MAX], detail[PROTO_DETAIL_MAX], why[300];
    rank_failure_explain(path, "ignored stderr\n", reason, sizeof(reason), detail, sizeof(detail), why,
                         sizeof(why));
    unlink(path);
    /* The user's frame, not the library's, names the location. */
    ck_assert_str_eq(reason, "RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB (train.py:120)");
    ck_assert_ptr_nonnull(strstr(detail, "Traceback (most recent call last)"));
    ck_assert_str_eq(why, "");
}
END_TEST

START_TEST(failure_from_stderr_when_file_is_bad)
{
    const char *tail = "step 3 loss 0.5\nTraceback (most recent call last):\n  File \"t.py\", line 9, in <module>\n"
                       "    f()\nValueError: bad shape \xff\n\n";
    char reason[PROTO_REASON_MAX], detail[PROTO_DETAIL_MAX], why[300];
    const char *path = temp_file("not json {", 10);
    rank_failure_explain(path, tail, reason, sizeof(reason), detail, sizeof(detail), why, sizeof(why));
    ck_assert_ptr_nonnull(strstr(why, "is not JSON"));
    /* Invalid UTF-8 from the rank is made safe for the wire. */
    ck_assert_str_eq(reason, "ValueError: bad shape ? (t.py:9)");
    unlink(path);

    /* A huge error file is not read. */
    size_t big = RANK_ERROR_FILE_MAX + 10;
    char *junk = malloc(big);
    memset(junk, ' ', big);
    path = temp_file(junk, big);
    free(junk);
    rank_failure_explain(path, "Segmentation fault\n", reason, sizeof(reason), detail, sizeof(detail), why,
                         sizeof(why));
    ck_assert_ptr_nonnull(strstr(why, "more than the"));
    ck_assert_str_eq(reason, "Segmentation fault");
    unlink(path);

    /* Files that could stall the agent or are not the rank's: a FIFO, a symbolic link, procfs. */
    char dir[] = "/tmp/check-agent-dir-XXXXXX", fifo[64], link_path[64];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    snprintf(fifo, sizeof(fifo), "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    rank_failure_explain(fifo, "from stderr\n", reason, sizeof(reason), detail, sizeof(detail), why, sizeof(why));
    ck_assert_ptr_nonnull(strstr(why, "is not a regular file"));
    ck_assert_str_eq(reason, "from stderr");
    snprintf(link_path, sizeof(link_path), "%s/link", dir);
    ck_assert_int_eq(symlink("/dev/zero", link_path), 0);
    rank_failure_explain(link_path, "x\n", reason, sizeof(reason), detail, sizeof(detail), why, sizeof(why));
    ck_assert_ptr_nonnull(strstr(why, "symbolic link"));
    rank_failure_explain("/proc/self/status", "x\n", reason, sizeof(reason), detail, sizeof(detail), why,
                         sizeof(why));
    ck_assert_ptr_nonnull(strstr(why, "is not a regular file"));
    char hard[64], other[64];
    snprintf(other, sizeof(other), "%s/agent-file", dir);
    FILE *o = fopen(other, "w");
    ck_assert_ptr_nonnull(o);
    fputs("{\"message\": {\"message\": \"secret of the agent's\"}}", o);
    fclose(o);
    snprintf(hard, sizeof(hard), "%s/hard", dir);
    ck_assert_int_eq(link(other, hard), 0);
    rank_failure_explain(hard, "x\n", reason, sizeof(reason), detail, sizeof(detail), why, sizeof(why));
    ck_assert_ptr_nonnull(strstr(why, "hard link"));
    ck_assert_ptr_null(strstr(reason, "secret"));
    unlink(hard);
    unlink(other);
    unlink(fifo);
    unlink(link_path);
    rmdir(dir);

    /* No file, nothing on stderr: nothing said. */
    rank_failure_explain("/nonexistent/error.json", "", reason, sizeof(reason), detail, sizeof(detail), why,
                         sizeof(why));
    ck_assert_str_eq(reason, "");
    ck_assert_str_eq(why, "");
}
END_TEST

/* ---- rank logs --------------------------------------------------------- */

static char log_root[64];

static void log_setup(void)
{
    snprintf(log_root, sizeof(log_root), "/tmp/check_rank_logXXXXXX");
    ck_assert_ptr_nonnull(mkdtemp(log_root));
}

static void log_teardown(void)
{
    char cmd[128];
    snprintf(cmd, sizeof(cmd), "rm -rf '%s'", log_root);
    ck_assert_int_eq(system(cmd), 0);
}

/* <log_root>/gen-G/rank-R, created. */
static void rank_dir_of(uint64_t gen, uint32_t rank, char *out, size_t cap)
{
    char gdir[128];
    snprintf(gdir, sizeof(gdir), "%s/gen-%llu", log_root, (unsigned long long)gen);
    mkdir(gdir, 0700);
    snprintf(out, cap, "%s/rank-%u", gdir, rank);
    mkdir(out, 0700);
}

static long long size_of(const char *dir, const char *name)
{
    char path[256];
    struct stat st;
    snprintf(path, sizeof(path), "%s/%s", dir, name);
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

/* One LOG_REQUEST answered; the caller frees d->data. */
static void serve(uint32_t rank, uint64_t gen, uint64_t offset, uint32_t tail, uint32_t max,
                  struct proto_log_data *d)
{
    struct proto_log_request q = {42, rank, gen, offset, tail, max};
    struct proto_msg m = {.type = PROTO_LOG_DATA};
    static uint8_t frame[PROTO_MAX_FRAME];
    rank_log_serve(log_root, "n1", false, &q, d);
    ck_assert_uint_eq(d->id, 42);
    ck_assert_uint_eq(d->rank, rank);
    /* Whatever the agent answers, the protocol accepts. */
    m.u.log_data = *d;
    ck_assert_int_gt(proto_encode(&m, frame, sizeof(frame)), 0);
}

START_TEST(log_rotation_rule)
{
    ck_assert(!rank_log_must_rotate(0, 500, 100)); /* an empty file takes any line */
    ck_assert(!rank_log_must_rotate(90, 10, 100));
    ck_assert(rank_log_must_rotate(90, 11, 100));
    ck_assert(rank_log_must_rotate(100, 1, 100));
    ck_assert(rank_log_must_rotate(150, 1, 100));
    ck_assert(!rank_log_must_rotate(UINT64_MAX - 1, 0, UINT64_MAX));
    ck_assert(rank_log_must_rotate(UINT64_MAX - 1, 2, UINT64_MAX));
}
END_TEST

START_TEST(log_parse_log_max_mb)
{
    uint64_t b = 1;
    ck_assert_int_eq(agent_log_max_parse("64", &b), 0);
    ck_assert_uint_eq(b, 64ull << 20);
    ck_assert_int_eq(agent_log_max_parse("0.5", &b), 0);
    ck_assert_uint_eq(b, 512ull << 10);
    ck_assert_int_eq(agent_log_max_parse("0", &b), 0);
    ck_assert_uint_eq(b, 0);
    ck_assert_int_eq(agent_log_max_parse("0.001", &b), 0);
    ck_assert_uint_eq(b, 1049);
    const char *bad[] = {"", ".", "-1", "+1", "1e3", "0x10", "inf", "nan", "1.2.3", "64M", " 64", "0.0009",
                         "1048577"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        ck_assert_msg(agent_log_max_parse(bad[i], &b) == -EINVAL, "log_max_mb '%s' accepted", bad[i]);
}
END_TEST

/* Lines past the cap turn the file over once; offsets go on across it and a
 * reader that follows next_offset gets exactly the bytes still kept. */
START_TEST(log_rotates_and_reads_back)
{
    char dir[128], line[32], all[4096] = "";
    struct rank_log l;
    rank_dir_of(3, 1, dir, sizeof(dir));
    ck_assert_int_eq(rank_log_open(&l, dir, 1, 100), 0);
    for (int i = 0; i < 50; i++) {
        snprintf(line, sizeof(line), "line %03d", i); /* 8 bytes + newline */
        rank_log_append(&l, line, strlen(line), true);
        strcat(all, line);
        strcat(all, "\n");
        ck_assert_int_le(size_of(dir, RANK_LOG_FILE), 100);
    }
    rank_log_close(&l);
    size_t total = strlen(all); /* 450 */
    long long cur = size_of(dir, RANK_LOG_FILE), old = size_of(dir, RANK_LOG_OLD);
    ck_assert_int_le(old, 100);
    ck_assert_int_gt(old, 90);
    ck_assert_int_gt(cur, 0);

    struct proto_log_data d;
    serve(1, 3, 0, 0, 7, &d);
    ck_assert_int_eq(d.error, PROTO_LOG_OK);
    ck_assert_uint_eq(d.generation, 3);
    ck_assert_uint_eq(d.newest, 3);
    ck_assert_uint_eq(d.size, total);
    ck_assert_uint_eq(d.offset, total - (size_t)cur - (size_t)old); /* the older bytes were rotated away */
    ck_assert_str_eq(d.data, "line 03");
    uint64_t next = d.next_offset, first = d.offset;
    char got[4096] = "";
    strcat(got, d.data);
    free(d.data);
    while (next < total) {
        serve(1, 3, next, 0, 7, &d);
        ck_assert_int_eq(d.error, PROTO_LOG_OK);
        ck_assert_uint_eq(d.offset, next);
        ck_assert_uint_gt(d.next_offset, next);
        strcat(got, d.data);
        next = d.next_offset;
        free(d.data);
    }
    ck_assert_str_eq(got, all + first);

    /* Caught up: nothing more, no error. Past the end: an error. */
    serve(1, 0, total, 0, 100, &d);
    ck_assert_int_eq(d.error, PROTO_LOG_OK);
    ck_assert_str_eq(d.data, "");
    ck_assert_uint_eq(d.next_offset, total);
    free(d.data);
    serve(1, 3, total + 1, 0, 100, &d);
    ck_assert_int_eq(d.error, PROTO_LOG_BEYOND_END);
    ck_assert_uint_eq(d.next_offset, total);
    ck_assert_ptr_nonnull(strstr(d.reason, "beyond the end"));
    free(d.data);

    /* The tail starts at a line. */
    serve(1, 0, 0, 25, 65536, &d);
    ck_assert_int_eq(d.error, PROTO_LOG_OK);
    ck_assert_str_eq(d.data, "line 048\nline 049\n");
    ck_assert_uint_eq(d.next_offset, total);
    free(d.data);

    /* A generation started again goes on where its log ended. */
    ck_assert_int_eq(rank_log_open(&l, dir, 1, 100), 0);
    rank_log_append(&l, "more", 4, false);
    rank_log_close(&l);
    serve(1, 3, total, 0, 100, &d);
    ck_assert_str_eq(d.data, "more");
    ck_assert_uint_eq(d.size, total + 4);
    free(d.data);
}
END_TEST

START_TEST(log_newest_and_missing)
{
    char dir[128];
    struct rank_log l;
    struct proto_log_data d;
    for (uint64_t g = 1; g <= 12; g += 11) {
        rank_dir_of(g, 2, dir, sizeof(dir));
        ck_assert_int_eq(rank_log_open(&l, dir, 2, 1 << 20), 0);
        rank_log_append(&l, g == 1 ? "one" : "twelve", g == 1 ? 3 : 6, true);
        rank_log_close(&l);
    }
    rank_dir_of(13, 2, dir, sizeof(dir)); /* a rank directory with no log yet */
    ck_assert_uint_eq(rank_log_newest(log_root, 2), 12);
    ck_assert_uint_eq(rank_log_newest(log_root, 5), 0);

    serve(2, 0, 0, 0, 100, &d);
    ck_assert_uint_eq(d.generation, 12);
    ck_assert_str_eq(d.data, "twelve\n");
    free(d.data);
    serve(2, 1, 0, 0, 100, &d);
    ck_assert_uint_eq(d.generation, 1);
    ck_assert_uint_eq(d.newest, 12);
    ck_assert_str_eq(d.data, "one\n");
    free(d.data);

    serve(2, 7, 0, 0, 100, &d);
    ck_assert_int_eq(d.error, PROTO_LOG_NO_LOG);
    ck_assert_str_eq(d.reason, "no log of rank 2 in generation 7 on node n1");
    free(d.data);
    serve(9, 0, 0, 0, 100, &d);
    ck_assert_int_eq(d.error, PROTO_LOG_NO_LOG);
    ck_assert_str_eq(d.reason, "no log of rank 9 on node n1");
    ck_assert_uint_eq(d.newest, 0);
    free(d.data);

    struct proto_log_request q = {1, 2, 0, 0, 0, 100};
    rank_log_serve("", "n1", false, &q, &d);
    ck_assert_int_eq(d.error, PROTO_LOG_NO_LOG);
    ck_assert_ptr_nonnull(strstr(d.reason, "no usable state directory"));
    free(d.data);

    /* No directory, or logs off: no file, and no complaint. */
    ck_assert_int_eq(rank_log_open(&l, "", 2, 100), 0);
    ck_assert_int_eq(l.fd, -1);
    rank_log_append(&l, "x", 1, true);
    rank_dir_of(14, 3, dir, sizeof(dir));
    ck_assert_int_eq(rank_log_open(&l, dir, 3, 0), 0);
    rank_log_append(&l, "x", 1, true);
    ck_assert_int_eq(size_of(dir, RANK_LOG_FILE), -1);

    /* A rank may plant anything in its directory: a FIFO must not stop the agent
     * (this test would hang), a symbolic link must not be served (a token, say),
     * and neither may be written through. */
    char path[256];
    rank_dir_of(20, 4, dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/%s", dir, RANK_LOG_FILE);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    serve(4, 20, 0, 0, 100, &d);
    ck_assert_int_ne(d.error, 0);
    free(d.data);
    ck_assert_int_ne(rank_log_open(&l, dir, 4, 1 << 20), 0);
    rank_log_close(&l);
    unlink(path);
    char secret[256];
    snprintf(secret, sizeof(secret), "%s/secret", log_root);
    FILE *f = fopen(secret, "w");
    ck_assert_ptr_nonnull(f);
    fputs("cluster-token\n", f);
    fclose(f);
    ck_assert_int_eq(symlink(secret, path), 0);
    serve(4, 20, 0, 0, 100, &d);
    ck_assert_int_ne(d.error, 0);
    ck_assert_ptr_null(d.data ? strstr(d.data, "cluster-token") : NULL);
    free(d.data);
    ck_assert_int_ne(rank_log_open(&l, dir, 4, 1 << 20), 0);
    rank_log_close(&l);
}
END_TEST

/* A file planted at path with text; returns path. */
static void plant(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

/* serve() of rank `rank`, generation gen: refused, with a reason that names `why`. */
static void assert_refused(uint32_t rank, uint64_t gen, const char *why)
{
    struct proto_log_data d;
    serve(rank, gen, 0, 0, 100, &d);
    ck_assert_msg(d.error == PROTO_LOG_UNREADABLE || d.error == PROTO_LOG_NO_LOG, "error %d (%s)", (int)d.error,
                  d.reason);
    ck_assert_ptr_null(d.data);
    ck_assert_msg(strstr(d.reason, why), "reason \"%s\" does not say \"%s\"", d.reason, why);
    ck_assert_uint_le(d.size, PROTO_U64_MAX);
}

/* Rank 3's log of generation gen: one line, and offset_text in its offset file. */
static void log_with_offset(uint64_t gen, const char *offset_text)
{
    char dir[256], path[300];
    struct rank_log l;
    rank_dir_of(gen, 3, dir, sizeof(dir));
    ck_assert_int_eq(rank_log_open(&l, dir, 3, 1 << 20), 0);
    rank_log_append(&l, "line", 4, true);
    rank_log_close(&l);
    snprintf(path, sizeof(path), "%s/%s", dir, RANK_LOG_OFFSET);
    plant(path, offset_text);
}

/* What is served comes from the rank's own directory and its own files only:
 * no hard link, no symbolic link on the way (gen-G, rank-R), no forged offset. */
START_TEST(log_escapes_are_refused)
{
    char dir[256], path[300], secret[256], other[256];
    snprintf(secret, sizeof(secret), "%s/secret", log_root);
    plant(secret, "cluster-token\n");

    /* A hard link to the token, named output.log. */
    rank_dir_of(30, 1, dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/%s", dir, RANK_LOG_FILE);
    ck_assert_int_eq(link(secret, path), 0);
    assert_refused(1, 30, "more than one link");

    /* A symbolic link as the generation's directory, and as the rank's. */
    snprintf(other, sizeof(other), "%s/elsewhere", log_root);
    ck_assert_int_eq(mkdir(other, 0700), 0);
    snprintf(path, sizeof(path), "%s/rank-2", other);
    ck_assert_int_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof(path), "%s/rank-2/%s", other, RANK_LOG_FILE);
    plant(path, "not this rank's\n");
    snprintf(path, sizeof(path), "%s/gen-31", log_root);
    ck_assert_int_eq(symlink(other, path), 0);
    assert_refused(2, 31, "gen-31/rank-2");
    rank_dir_of(32, 0, dir, sizeof(dir));
    snprintf(path, sizeof(path), "%s/gen-32/rank-2", log_root);
    snprintf(other, sizeof(other), "%s/elsewhere/rank-2", log_root);
    ck_assert_int_eq(symlink(other, path), 0);
    assert_refused(2, 32, "gen-32/rank-2");

    /* Forged offsets: beyond the wire's numbers, negative, not a number. The
     * answer is an error that the protocol can carry, never silence. */
    static const char *const forged[] = {"18446744073709551615\n", "9007199254740993\n", "-5\n", "12abc\n", "\n"};
    for (unsigned i = 0; i < sizeof(forged) / sizeof(forged[0]); i++) {
        log_with_offset(40 + i, forged[i]);
        assert_refused(3, 40 + i, RANK_LOG_OFFSET);
    }
    /* The largest offset the wire carries, with a file that would end past it. */
    log_with_offset(50, "9007199254740991\n");
    assert_refused(3, 50, "larger than a log offset");
    /* A valid offset still serves. */
    struct proto_log_data d;
    log_with_offset(51, "1000\n");
    serve(3, 51, 1000, 0, 100, &d);
    ck_assert_int_eq(d.error, PROTO_LOG_OK);
    ck_assert_str_eq(d.data, "line\n");
    ck_assert_uint_eq(d.size, 1005);
    free(d.data);
}
END_TEST

/* Raw bytes come back as text of the same length; a character cut by max waits. */
START_TEST(log_bytes_become_text)
{
    char dir[128];
    struct rank_log l;
    struct proto_log_data d;
    rank_dir_of(1, 0, dir, sizeof(dir));
    ck_assert_int_eq(rank_log_open(&l, dir, 0, 1 << 20), 0);
    rank_log_append(&l, "a\xff\x00\x1b b", 6, true);
    rank_log_append(&l, "\xe2\x82\xac!", 4, true);
    rank_log_close(&l);

    serve(0, 1, 0, 0, 100, &d);
    ck_assert_str_eq(d.data, "a?   b\n\xe2\x82\xac!\n");
    ck_assert_uint_eq(d.next_offset, 12);
    free(d.data);
    serve(0, 1, 0, 0, 9, &d); /* would end inside the euro sign */
    ck_assert_str_eq(d.data, "a?   b\n");
    ck_assert_uint_eq(d.next_offset, 7);
    free(d.data);
    serve(0, 1, 7, 0, 2, &d); /* a character longer than max still makes progress */
    ck_assert_str_eq(d.data, "??");
    ck_assert_uint_eq(d.next_offset, 9);
    free(d.data);

    /* A log that ends inside a character: sent as it is, so a reader gets to the end. */
    ck_assert_int_eq(rank_log_open(&l, dir, 0, 1 << 20), 0);
    rank_log_append(&l, "x\xe2\x82", 3, false);
    rank_log_close(&l);
    serve(0, 1, 12, 0, 100, &d);
    ck_assert_str_eq(d.data, "x??");
    ck_assert_uint_eq(d.next_offset, 15);
    ck_assert_uint_eq(d.size, 15);
    free(d.data);
}
END_TEST


/* ---- rank_stacks: a rank's processes dump on a signal, as the Python hook's faulthandler does ---- */

static int dump_fd = -1;
static void dump_handler(int sig)
{
    (void)sig;
    static const char text[] = "Thread 0x01 (most recent call first):\n  File \"train.py\", line 88 in step\n";
    if (write(dump_fd, text, sizeof(text) - 1) < 0)
        _exit(3);
}

/* A child in a process group of its own, armed like a hooked Python rank: writes to
 * dir/stacks-PID.txt on signum (faulthandler). With fifo 1 it also reads
 * dir/stacks-PID.fifo and answers each byte with a dump of its own (the
 * hook's thread); with fifo 2 it holds the FIFO open and never reads it (a
 * thread that cannot take the GIL); with fifo 3 it reads and never answers
 * (a thread that took the byte and is still walking). Returns its pid once
 * it is armed. */
static pid_t armed_child_fifo(const char *dir, int signum, int fifo)
{
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        char path[512];
        snprintf(path, sizeof(path), "%s/stacks-%d.txt", dir, (int)getpid());
        dump_fd = open(path, O_WRONLY | O_CREAT | O_APPEND, 0600);
        signal(signum, dump_handler);
        int rfd = -1;
        if (fifo) {
            snprintf(path, sizeof(path), "%s/stacks-%d.fifo", dir, (int)getpid());
            if (mkfifo(path, 0600) != 0 || (rfd = open(path, O_RDWR)) < 0)
                _exit(4);
        }
        if (write(ready[1], "r", 1) != 1)
            _exit(2);
        static const char text[] = "Thread 0x02 \"MainThread\" (most recent call first):\n"
                                   "  File \"train.py\", line 99 in wait\n";
        char c;
        for (;;) {
            if (rfd < 0 || fifo == 2) {
                pause();
                continue;
            }
            ssize_t n = read(rfd, &c, 1);
            if (n == 1 && fifo == 1 && write(dump_fd, text, sizeof(text) - 1) < 0)
                _exit(3);
        }
    }
    char c;
    close(ready[1]);
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    close(ready[0]);
    return pid;
}

static pid_t armed_child(const char *dir, int signum)
{
    return armed_child_fifo(dir, signum, 0);
}

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)(ts.tv_nsec / 1000000);
}

/* Polls d every 20 ms for up to 3 s; the time the dump took (ms), or -1. */
static int64_t poll_dump(struct stacks_dump *d)
{
    uint64_t t0 = mono_ms();
    for (int i = 0; i < 150; i++) {
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (stacks_poll(d, mono_ms()))
            return (int64_t)(mono_ms() - t0);
    }
    return -1;
}

static void reap(pid_t pid)
{
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);
}

START_TEST(stacks_dump_a_rank_and_say_why_not)
{
    char dir[] = "/tmp/check_stacksXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const int sig = SIGRTMIN + 5;
    pid_t child = armed_child(dir, sig);

    /* A file of a pid outside the rank's process group (ours) is never signalled. */
    char stray[600];
    snprintf(stray, sizeof(stray), "%s/stacks-%d.txt", dir, (int)getpid());
    FILE *f = fopen(stray, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);

    struct stacks_dump d = {.generation = 4, .rank = 3};
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 1);
    ck_assert_uint_eq(d.nprocs, 1);
    ck_assert_msg(poll_dump(&d) >= 0, "the dump did not complete");
    struct proto_msg m;
    ck_assert_int_eq(stacks_message(&d, &m, 0), 0);
    ck_assert_int_eq(m.type, PROTO_STACKS);
    ck_assert_uint_eq(m.u.stacks.rank, 3);
    ck_assert_uint_eq(m.u.stacks.pid, (uint32_t)child);
    ck_assert_str_eq(m.u.stacks.error, "");
    char head[64];
    snprintf(head, sizeof(head), "process %d:\nThread 0x01", (int)child);
    ck_assert_msg(strstr(m.u.stacks.text, head) && strstr(m.u.stacks.text, "train.py\", line 88 in step"),
                  "unexpected dump: %s", m.u.stacks.text);
    proto_msg_clear(&m);

    /* Stopped: not signalled, and the answer says why at once. */
    kill(child, SIGSTOP);
    for (int i = 0; i < 100 && !rank_stopped(child); i++) {
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    ck_assert_int_eq(rank_stopped(child), 1);
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 0);
    ck_assert_ptr_nonnull(strstr(d.error, "stopped"));
    ck_assert_int_eq(stacks_message(&d, &m, 0), 0);
    ck_assert_int_eq(m.u.stacks.stopped, 1);
    proto_msg_clear(&m);
    kill(child, SIGCONT);
    ck_assert_int_eq(rank_stopped(child), 0);
    reap(child);

    /* No armed process: no hook. */
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 0);
    ck_assert_ptr_nonnull(strstr(d.error, "no stack hook"));
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* The hook's thread is asked first, through the FIFO: its dump, no signal
 * (faulthandler's walk can crash a rank running Python). A thread that does
 * not answer (the GIL held in native code) gets the signal after
 * STACKS_FALLBACK_MS, and faulthandler's dump is taken. */
START_TEST(stacks_ask_the_thread_then_signal)
{
    char dir[] = "/tmp/check_stacksXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const int sig = SIGRTMIN + 5;

    pid_t child = armed_child_fifo(dir, sig, 1);
    struct stacks_dump d = {.generation = 2, .rank = 1};
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 1);
    int64_t took = poll_dump(&d);
    ck_assert_msg(took >= 0 && took < STACKS_FALLBACK_MS, "the thread's dump took %lld ms", (long long)took);
    struct proto_msg m;
    ck_assert_int_eq(stacks_message(&d, &m, 0), 0);
    ck_assert_msg(strstr(m.u.stacks.text, "line 99 in wait") && !strstr(m.u.stacks.text, "line 88 in step"),
                  "expected the thread's dump alone: %s", m.u.stacks.text);
    proto_msg_clear(&m);
    reap(child);

    child = armed_child_fifo(dir, sig, 2);
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 1);
    took = poll_dump(&d);
    ck_assert_msg(took >= STACKS_FALLBACK_MS, "the fallback came after %lld ms", (long long)took);
    ck_assert_int_eq(stacks_message(&d, &m, 0), 0);
    ck_assert_msg(strstr(m.u.stacks.text, "line 88 in step") != NULL, "no faulthandler dump: %s", m.u.stacks.text);
    proto_msg_clear(&m);
    reap(child);

    /* The byte read, no answer yet (the thread walks): no signal; the dump is cut at the deadline. */
    child = armed_child_fifo(dir, sig, 3);
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 1);
    uint64_t t0 = mono_ms();
    while (mono_ms() - t0 < STACKS_FALLBACK_MS + 300) {
        stacks_poll(&d, mono_ms());
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    ck_assert_int_eq(stacks_message(&d, &m, 1), 0);
    ck_assert_msg(!strstr(m.u.stacks.text ? m.u.stacks.text : "", "line 88 in step"), "signalled: %s",
                  m.u.stacks.text);
    proto_msg_clear(&m);

    /* A FIFO nobody reads (the process exec'd, or exits): not asked, never signalled. */
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    child = armed_child(dir, sig); /* its handler would write "line 88" if signalled */
    char fifo[600];
    snprintf(fifo, sizeof(fifo), "%s/stacks-%d.fifo", dir, (int)child);
    ck_assert_int_eq(mkfifo(fifo, 0600), 0);
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 0);
    reap(child);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A child in a process group of its own that ignores signum (a rank whose hook never writes). */
static pid_t quiet_child(int signum)
{
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setpgid(0, 0);
        prctl(PR_SET_PDEATHSIG, SIGKILL); /* gone with the test, even one killed for its timeout */
        signal(signum, SIG_IGN);
        if (write(ready[1], "r", 1) != 1)
            _exit(2);
        for (;;)
            pause();
    }
    char c;
    close(ready[1]);
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    close(ready[0]);
    return pid;
}

/* A rank that makes its stacks file a FIFO (before the dump, or swapped in
 * during it) or a link to another file stalls nothing and truncates nothing:
 * the agent's loop, which runs these, would stop its heartbeats. SIGALRM
 * ends the test if an open blocks. */
START_TEST(stacks_fifo_or_link_does_not_stall)
{
    char dir[] = "/tmp/check_stacksXXXXXX", path[600], other[600];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    const int sig = SIGRTMIN + 6;
    pid_t child = quiet_child(sig);
    snprintf(path, sizeof(path), "%s/stacks-%d.txt", dir, (int)child);
    snprintf(other, sizeof(other), "%s/agent-file", dir);
    alarm(5);

    ck_assert_int_eq(mkfifo(path, 0600), 0);
    struct stacks_dump d = {.generation = 1, .rank = 0};
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 0);
    ck_assert_ptr_nonnull(strstr(d.error, "no stack hook"));

    /* a link to a file of the agent's: not followed, not truncated */
    unlink(path);
    FILE *f = fopen(other, "w");
    ck_assert_ptr_nonnull(f);
    fputs("keep me\n", f);
    fclose(f);
    ck_assert_int_eq(symlink(other, path), 0);
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 0);
    struct stat st;
    ck_assert_int_eq(stat(other, &st), 0);
    ck_assert_int_eq(st.st_size, 8);

    /* a hard link to a file of the agent's: a regular file, but not the rank's alone: not truncated */
    unlink(path);
    ck_assert_int_eq(link(other, path), 0);
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 0);
    ck_assert_int_eq(stat(other, &st), 0);
    ck_assert_int_eq(st.st_size, 8);

    /* a regular file when the dump begins, a FIFO by the time it is read */
    unlink(path);
    f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(stacks_begin(&d, dir, child, sig, mono_ms()), 1);
    unlink(path);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    ck_assert_int_eq(stacks_poll(&d, mono_ms()), 0);
    struct proto_msg m;
    ck_assert_int_eq(stacks_message(&d, &m, 1), 0);
    ck_assert_msg(strstr(m.u.stacks.error, "wrote no dump") != NULL, "error: %s", m.u.stacks.error);
    proto_msg_clear(&m);
    alarm(0);
    reap(child);
    char cmd[600];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* A state directory is taken only when it is this user's alone. */
START_TEST(state_dir_private_or_refused)
{
    char dir[] = "/tmp/check_privXXXXXX", link[600], why[160];
    ck_assert_ptr_nonnull(mkdtemp(dir));
    ck_assert_int_eq(dir_private(dir, why, sizeof(why)), 0);
    ck_assert_int_eq(chmod(dir, 0770), 0);
    ck_assert_int_eq(dir_private(dir, why, sizeof(why)), -EPERM);
    ck_assert_msg(strstr(why, "its group may write it (mode 0770)") != NULL, "why: %s", why);
    ck_assert_int_eq(chmod(dir, 01777), 0);
    ck_assert_int_eq(dir_private(dir, why, sizeof(why)), -EPERM);
    ck_assert_msg(strstr(why, "anyone may write it") != NULL, "why: %s", why);
    ck_assert_int_eq(chmod(dir, 0700), 0);
    snprintf(link, sizeof(link), "%s.link", dir);
    ck_assert_int_eq(symlink(dir, link), 0);
    ck_assert_int_eq(dir_private(link, why, sizeof(why)), -ENOTDIR);
    ck_assert_msg(strstr(why, "symbolic link") != NULL, "why: %s", why);
    unlink(link);
    if (geteuid() == 0) { /* another owner: only root can make one here */
        ck_assert_int_eq(chown(dir, 65534, (gid_t)-1), 0);
        ck_assert_int_eq(dir_private(dir, why, sizeof(why)), -EPERM);
        ck_assert_msg(strstr(why, "owned by uid 65534") != NULL, "why: %s", why);
    }
    rmdir(dir);
}
END_TEST

/* Pruning by descriptor removes the tree, FIFOs and links included, and
 * nothing a link points to. */
START_TEST(rmtree_stays_inside)
{
    char top[] = "/tmp/check_rmtreeXXXXXX", p[700];
    ck_assert_ptr_nonnull(mkdtemp(top));
    snprintf(p, sizeof(p), "%s/outside", top);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/outside/victim", top);
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    const char *dirs[] = {"gen-1", "gen-1/rank-0", "gen-1/rank-0/deep"};
    for (size_t i = 0; i < 3; i++) {
        snprintf(p, sizeof(p), "%s/%s", top, dirs[i]);
        ck_assert_int_eq(mkdir(p, 0700), 0);
    }
    snprintf(p, sizeof(p), "%s/gen-1/rank-0/error.json", top);
    f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    snprintf(p, sizeof(p), "%s/gen-1/rank-0/stacks-1.txt", top);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    char target[700];
    snprintf(target, sizeof(target), "%s/outside", top);
    snprintf(p, sizeof(p), "%s/gen-1/rank-0/deep/planted", top);
    ck_assert_int_eq(symlink(target, p), 0);
    int fd = open(top, O_RDONLY | O_DIRECTORY);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(rmtree_at(fd, "gen-1"), 0);
    close(fd);
    snprintf(p, sizeof(p), "%s/gen-1", top);
    ck_assert_int_ne(access(p, F_OK), 0);
    snprintf(p, sizeof(p), "%s/outside/victim", top);
    ck_assert_int_eq(access(p, F_OK), 0);
    char cmd[700];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", top);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

/* Which rank commands a warm spare can stand in for, and why not. */
START_TEST(spare_usable_forms)
{
    struct job_spec spec;
    char why[256];
    job_spec_defaults(&spec);
    char *script[] = {"/opt/venv/bin/python3", "train.py", "--lr", "1e-3", NULL};
    char *module[] = {"python", "-m", "pkg.train", NULL};
    char *option[] = {"python3", "-u", "train.py", NULL};
    char *dash_m[] = {"python3", "-m", NULL};
    char *other[] = {"/usr/bin/deepspeed", "train.py", NULL};
    char *bare[] = {"python3", NULL};
    ck_assert(!spare_usable(&spec, script, "/hook", why, sizeof(why)));
    ck_assert_str_eq(why, ""); /* off: nothing to say */
    spec.warm_spares = 1;
    ck_assert(spare_usable(&spec, script, "/hook", why, sizeof(why)));
    ck_assert(spare_usable(&spec, module, "/hook", why, sizeof(why)));
    char *const *bad[] = {option, dash_m, other, bare};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        ck_assert_msg(!spare_usable(&spec, bad[i], "/hook", why, sizeof(why)), "form %zu accepted", i);
        ck_assert_ptr_nonnull(strstr(why, "not `PYTHON script.py ...` or `PYTHON -m module ...`"));
    }
    ck_assert(!spare_usable(&spec, script, "", why, sizeof(why)));
    ck_assert_ptr_nonnull(strstr(why, "python_hook is off"));
}
END_TEST

/* A spare's report that an import touched the CUDA driver: what is taken, and what is refused with why. */
START_TEST(spare_report_checked)
{
    char name[128], how[160], why[128];
    const char *ok = "{\"cuda_import\": \"cupy.cuda\", \"how\": \"libcuda.so.1 mapped\"}";
    ck_assert_int_eq(spare_parse_report(ok, strlen(ok), name, how, why, sizeof(why)), 0);
    ck_assert_str_eq(name, "cupy.cuda");
    ck_assert_str_eq(how, "libcuda.so.1 mapped");
    char deep[512]; /* as deep as a report the agent reads (511 bytes) can nest */
    memset(deep, '[', 255);
    memset(deep + 255, ']', 255);
    deep[510] = '\0';
    struct { const char *text, *why; } bad[] = {
        {"", "expected an object"},
        {"[1]", "expected an object"},
        {"{\"cuda_import\": \"x\"}", "expected an object"},
        {"{\"cuda_import\": \"x\", \"how\": \"y\", \"more\": 1}", "expected an object"},
        {"{\"cuda_import\": \"os; rm\", \"how\": \"y\"}", "cuda_import: expected a module name"},
        {"{\"cuda_import\": \"\", \"how\": \"y\"}", "cuda_import: expected a module name"},
        {"{\"cuda_import\": 3, \"how\": \"y\"}", "cuda_import: expected a module name"},
        {"{\"cuda_import\": \"x\", \"how\": \"a\\nb\"}", "how: expected printable ASCII"},
        {"{\"cuda_import\": \"x\", \"how\": null}", "how: expected a string"},
        /* a spare runs the user's imports: what it writes is untrusted */
        {"{\"cuda_import\": \"x\", \"how\": \"y\"}{\"cuda_import\": \"z\", \"how\": \"y\"}", "expected an object"},
        {"{\"cuda_import\": \"x\", \"how\": \"\xff\"}", "expected an object"}, /* not UTF-8 */
        {"{\"cuda_import\": \"x\\u0000y\", \"how\": \"y\"}", "expected an object"},
        {"{\"cuda_import\": \"x\", \"how\": \"\\u001b[2J\"}", "how: expected printable ASCII"},
        {"{\"cuda_import\": \"x\", \"how\": \"\\u009b2J caf\\u00e9\"}", "how: expected printable ASCII"},
        {deep, "expected an object"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        why[0] = '\0';
        ck_assert_msg(spare_parse_report(bad[i].text, strlen(bad[i].text), name, how, why, sizeof(why)) == -EINVAL,
                      "report %zu accepted: %s", i, bad[i].text);
        ck_assert_msg(strstr(why, bad[i].why) != NULL, "report %zu: why is '%s', expected '%s'", i, why, bad[i].why);
    }
}
END_TEST

/* A spare can be handed a rank only while its hand-off socket is quiet: not after a report
 * (its process is exiting, or lingers) nor once it closed its end. */
START_TEST(spare_handoff_quiet_until_it_speaks)
{
    int sp[2];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sp), 0);
    ck_assert(spare_handoff_quiet(sp[0]));
    ck_assert_int_eq(write(sp[1], "{", 1), 1);
    ck_assert(!spare_handoff_quiet(sp[0]));
    char c;
    ck_assert_int_eq(read(sp[0], &c, 1), 1); /* read: quiet again */
    ck_assert(spare_handoff_quiet(sp[0]));
    close(sp[1]);
    ck_assert(!spare_handoff_quiet(sp[0])); /* EOF */
    close(sp[0]);
    ck_assert(!spare_handoff_quiet(-1));
}
END_TEST

/* A warm import left out of the list, and one that is not in it. */
START_TEST(spare_import_left_out)
{
    char out[64];
    ck_assert(spare_without_import("deepspeed,fakecuda,transformers", "fakecuda", out, sizeof(out)));
    ck_assert_str_eq(out, "deepspeed,transformers");
    ck_assert(spare_without_import("fakecuda", "fakecuda", out, sizeof(out)));
    ck_assert_str_eq(out, "");
    ck_assert(spare_without_import("fakecuda,a.b", "fakecuda", out, sizeof(out)));
    ck_assert_str_eq(out, "a.b");
    ck_assert(!spare_without_import("deepspeed,fake", "torch", out, sizeof(out)));
    ck_assert_str_eq(out, "deepspeed,fake");
    ck_assert(!spare_without_import("fakecudax", "fakecuda", out, sizeof(out))); /* whole names only */
    ck_assert(!spare_without_import("", "x", out, sizeof(out)));
    ck_assert_str_eq(out, "");
}
END_TEST

/* A process of its own group armed as the hook arms it (fr-PID.fifo in dir):
 * on a byte it writes answer to fr-PID.txt, through a rename, and exits. */
static pid_t flight_rank(const char *dir, const char *answer)
{
    int ready[2];
    ck_assert_int_eq(pipe(ready), 0);
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        setpgid(0, 0);
        char fifo[4200], out[4200], tmp[4300], c;
        snprintf(fifo, sizeof(fifo), "%s/fr-%d.fifo", dir, (int)getpid());
        snprintf(out, sizeof(out), "%s/fr-%d.txt", dir, (int)getpid());
        snprintf(tmp, sizeof(tmp), "%s.tmp", out);
        int fd = mkfifo(fifo, 0600) == 0 ? open(fifo, O_RDWR) : -1;
        if (fd < 0 || write(ready[1], "r", 1) != 1 || read(fd, &c, 1) != 1)
            _exit(1);
        FILE *f = fopen(tmp, "w");
        if (!f || fputs(answer, f) < 0 || fclose(f) != 0 || rename(tmp, out) != 0)
            _exit(1);
        _exit(0);
    }
    setpgid(pid, pid);
    char c;
    ck_assert_int_eq(read(ready[0], &c, 1), 1);
    close(ready[0]);
    close(ready[1]);
    return pid;
}

/* The agent's side of the flight recorder summary: asked through the FIFO,
 * waited for, read bounded and checked (a rank's words). */
START_TEST(flight_summary_is_asked_for_and_checked)
{
    static const struct {
        const char *answer;
        const char *want; /* NULL: refused */
    } cases[] = {
        {"0 default_pg 37 36 37:all_reduce", "0 default_pg 37 36 37:all_reduce"},
        {"0 default_pg 37 38 37:all_reduce", NULL},
        {"0 default_pg 37 36 37:all\x1b[31m", NULL},
        {"", NULL}, /* no process group yet: nothing to send, nothing wrong */
    };
    char dir[] = "/tmp/check_flightXXXXXX";
    ck_assert_ptr_nonnull(mkdtemp(dir));
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        pid_t pid = flight_rank(dir, cases[i].answer);
        static struct flight_ask f;
        ck_assert_int_eq(flight_ask_begin(&f, dir, pid), 1);
        for (int t = 0; t < 500 && !flight_ask_poll(&f); t++)
            usleep(10000);
        ck_assert_int_eq(flight_ask_poll(&f), 1);
        char why[512];
        char *text = flight_ask_read(&f, why, sizeof(why));
        if (cases[i].want) {
            ck_assert_ptr_nonnull(text);
            ck_assert_str_eq(text, cases[i].want);
            ck_assert_str_eq(why, "");
        } else {
            ck_assert_ptr_null(text);
            if (cases[i].answer[0])
                ck_assert_msg(strstr(why, "flight recorder summary is refused: line 1"), "%s", why);
            else
                ck_assert_str_eq(why, "");
        }
        free(text);
        int st;
        ck_assert_int_eq(waitpid(pid, &st, 0), pid);
        ck_assert_int_eq(WEXITSTATUS(st), 0);
        char path[4200];
        snprintf(path, sizeof(path), "%s/fr-%d.fifo", dir, (int)pid);
        unlink(path);
        snprintf(path, sizeof(path), "%s/fr-%d.txt", dir, (int)pid);
        unlink(path);
    }
    /* nobody armed: nothing asked */
    static struct flight_ask f;
    ck_assert_int_eq(flight_ask_begin(&f, dir, getpid()), 0);
    /* a rank's FIFO (or link) as its answer: skipped at once, not waited on */
    char path[4200];
    f.nprocs = 1;
    f.pids[0] = 424242;
    snprintf(f.dir, sizeof(f.dir), "%s", dir);
    snprintf(path, sizeof(path), "%s/fr-424242.txt", dir);
    ck_assert_int_eq(mkfifo(path, 0600), 0);
    char why[512];
    ck_assert_ptr_null(flight_ask_read(&f, why, sizeof(why)));
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(symlink("/etc/passwd", path), 0);
    ck_assert_ptr_null(flight_ask_read(&f, why, sizeof(why)));
    ck_assert_int_eq(unlink(path), 0);
    /* a hard link to a file not the rank's (one a summary would pass): not read */
    char other[4200];
    snprintf(other, sizeof(other), "%s/agent-file", dir);
    FILE *o = fopen(other, "w");
    ck_assert_ptr_nonnull(o);
    fputs("0 default_pg 37 36 37:all_reduce", o);
    fclose(o);
    ck_assert_int_eq(link(other, path), 0);
    ck_assert_ptr_null(flight_ask_read(&f, why, sizeof(why)));
    ck_assert_int_eq(unlink(path), 0);
    ck_assert_int_eq(unlink(other), 0);
    ck_assert_int_eq(rmdir(dir), 0);
}
END_TEST

Suite *make_agent_suite(void)
{
    Suite *s = suite_create("agent");
    TCase *tc = tcase_create("devices");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, devices_cpu);
    tcase_add_test(tc, spare_usable_forms);
    tcase_add_test(tc, spare_report_checked);
    tcase_add_test(tc, spare_handoff_quiet_until_it_speaks);
    tcase_add_test(tc, spare_import_left_out);
    tcase_add_test(tc, devices_gpu_list_and_all);
    tcase_add_test(tc, devices_bad_forms_are_named);
    tcase_add_test(tc, flight_summary_is_asked_for_and_checked);
    tcase_add_test(tc, devices_probe_counts_nvidia_nodes);
    suite_add_tcase(s, tc);

    tc = tcase_create("join");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, daemon_list_follows_the_leader);
    tcase_add_test(tc, daemon_list_refuses_a_lower_term);
    tcase_add_test(tc, backoff_grows_to_cap_with_jitter_in_bounds);
    tcase_add_test(tc, backoff_reset_starts_over);
    tcase_add_test(tc, exitq_echo_of_a_later_beat_confirms);
    tcase_add_test(tc, exitq_unsent_waits_for_a_resend);
    tcase_add_test(tc, exitq_keeps_order_drops_old_generations_and_the_oldest_when_full);
    suite_add_tcase(s, tc);

    tc = tcase_create("rank_env");
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, rank_env_gpu);
    tcase_add_test(tc, rank_env_gpu_node_view);
    tcase_add_test(tc, rank_env_cpu_hides_gpus);
    tcase_add_test(tc, rank_env_torchrun_names);
    tcase_add_test(tc, rank_env_user_defaults_win);
    tcase_add_test(tc, rank_env_python_hook);
    tcase_add_test(tc, rank_env_drops_secrets);
    tcase_add_test(tc, rank_user_resolve_names_the_key);
    tcase_add_test(tc, rank_user_argv_prefixes_the_drop);
    tcase_add_test(tc, rank_user_exec_drops_for_good);
    tcase_add_test(tc, rank_user_grant_dir_lets_the_rank_in);
    tcase_add_test(tc, stacks_dump_a_rank_and_say_why_not);
    tcase_add_test(tc, stacks_fifo_or_link_does_not_stall);
    tcase_add_test(tc, stacks_ask_the_thread_then_signal);
    tcase_add_test(tc, state_dir_private_or_refused);
    tcase_add_test(tc, rmtree_stays_inside);
    tcase_add_test(tc, cmdline_string_and_array);
    tcase_add_test(tc, cmdline_bad_forms_are_named);
    tcase_add_test(tc, failure_from_torch_error_file);
    tcase_add_test(tc, failure_from_stderr_when_file_is_bad);
    suite_add_tcase(s, tc);

    tc = tcase_create("rank_log");
    tcase_set_timeout(tc, 10);
    tcase_add_checked_fixture(tc, log_setup, log_teardown);
    tcase_add_test(tc, log_rotation_rule);
    tcase_add_test(tc, log_parse_log_max_mb);
    tcase_add_test(tc, log_rotates_and_reads_back);
    tcase_add_test(tc, log_newest_and_missing);
    tcase_add_test(tc, log_bytes_become_text);
    tcase_add_test(tc, log_escapes_are_refused);
    suite_add_tcase(s, tc);
    return s;
}
