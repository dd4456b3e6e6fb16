/*
 * rank: muster-train's control channel, against a fake agent on the other
 * end of a socketpair (raw frames, no agent code).
 */
#include <check.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "worker/train/rank.h"

static int agent_fd;

static void put_env(int fd, int rank, int world, int gen)
{
    char v[32];
    snprintf(v, sizeof(v), "%d", fd);
    setenv("MUSTER_CTL_FD", v, 1);
    snprintf(v, sizeof(v), "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%d", world);
    setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof(v), "%d", gen);
    setenv("MUSTER_GENERATION", v, 1);
}

static void agent_send(const struct proto_msg *m)
{
    uint8_t buf[PROTO_MAX_FRAME];
    int n = proto_encode(m, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(write(agent_fd, buf, (size_t)n), n);
}

/* Next frame from the rank (blocking, at most ~2 s). */
static void agent_recv(struct proto_msg *m)
{
    static uint8_t buf[PROTO_MAX_FRAME];
    static size_t len;
    struct timeval tv = {.tv_sec = 2};
    setsockopt(agent_fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    for (;;) {
        size_t used;
        int rc = proto_decode(buf, len, m, &used);
        if (rc == PROTO_OK) {
            memmove(buf, buf + used, len - used);
            len -= used;
            return;
        }
        ck_assert_int_eq(rc, PROTO_NEED_MORE);
        ssize_t n = read(agent_fd, buf + len, sizeof(buf) - len);
        ck_assert_msg(n > 0, "no frame from the rank within 2 s");
        len += (size_t)n;
    }
}

static void send_assign(int gen, int world, int first, int n)
{
    struct proto_msg m = {.type = PROTO_ASSIGN};
    m.u.assign.generation = (uint64_t)gen;
    m.u.assign.world_size = (uint32_t)world;
    m.u.assign.nranks = (uint32_t)n;
    for (int i = 0; i < n; i++) {
        m.u.assign.ranks[i].rank = (uint32_t)(first + i);
        m.u.assign.ranks[i].local_rank = (uint32_t)i;
        m.u.assign.ranks[i].device = (uint32_t)i;
    }
    m.u.assign.nnodes = 1;
    m.u.assign.master_port = 29500;
    snprintf(m.u.assign.master_addr, sizeof(m.u.assign.master_addr), "127.0.0.1");
    m.u.assign.job = json_pack("{s:s}", "name", "t");
    agent_send(&m);
    json_decref(m.u.assign.job);
}

/* The stop flag a rank program owns (a static in muster-train). */
static volatile sig_atomic_t stop_flag;

static struct rank_ctl *open_rank(int rank, int world, int gen, struct rank_assign *a)
{
    int sv[2];
    char err[256] = "";
    struct rank_ctl *c = NULL;
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    agent_fd = sv[0];
    put_env(sv[1], rank, world, gen);
    send_assign(gen, world, rank - rank % 2, 2);
    stop_flag = 0;
    ck_assert_msg(rank_ctl_open(&c, a, &stop_flag, 2000, err, sizeof(err)) == 0, "open: %s", err);
    return c;
}

static int aborted;
static void on_abort(void *arg) { aborted = *(int *)arg; }

START_TEST(assign_is_read_and_checked)
{
    struct rank_assign a;
    struct rank_ctl *c = open_rank(3, 4, 7, &a);
    ck_assert_int_eq(a.generation, 7);
    ck_assert_int_eq(a.rank, 3);
    ck_assert_int_eq(a.world, 4);
    ck_assert_int_eq(a.local_rank, 1);
    ck_assert_int_eq(a.local_world, 2);
    ck_assert_str_eq(json_string_value(json_object_get(a.job, "name")), "t");
    json_decref(a.job);
    rank_ctl_close(c);
    close(agent_fd);
}
END_TEST

START_TEST(assign_for_another_rank_is_refused)
{
    int sv[2];
    char err[256] = "";
    struct rank_assign a;
    struct rank_ctl *c = NULL;
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    agent_fd = sv[0];
    put_env(sv[1], 5, 8, 2);
    send_assign(2, 8, 0, 2); /* holds ranks 0 and 1 only */
    ck_assert_int_lt(rank_ctl_open(&c, &a, &stop_flag, 1000, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(err, "does not hold this rank"));
    close(agent_fd);
}
END_TEST

START_TEST(no_assign_times_out)
{
    int sv[2];
    char err[256] = "";
    struct rank_assign a;
    struct rank_ctl *c = NULL;
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    put_env(sv[1], 0, 1, 1);
    ck_assert_int_lt(rank_ctl_open(&c, &a, &stop_flag, 300, err, sizeof(err)), 0);
    ck_assert_ptr_nonnull(strstr(err, "no ASSIGN"));
    close(sv[0]);
}
END_TEST

START_TEST(unique_id_goes_up_and_comes_back)
{
    struct rank_assign a;
    struct rank_ctl *c = open_rank(0, 2, 3, &a);
    uint8_t mine[PROTO_UID_LEN], got[PROTO_UID_LEN];
    memset(mine, 0x5a, sizeof(mine));
    /* The fake agent echoes the id as the daemon would. */
    struct proto_msg up;
    pid_t pid = fork();
    if (pid == 0) {
        agent_recv(&up);
        if (up.type != PROTO_UNIQUE_ID || up.u.unique_id.generation != 3)
            _exit(1);
        agent_send(&up);
        _exit(0);
    }
    ck_assert_int_eq(rank_ctl_unique_id(c, mine, got, 2000), 0);
    ck_assert_int_eq(memcmp(mine, got, sizeof(got)), 0);
    json_decref(a.job);
    rank_ctl_close(c);
    close(agent_fd);
}
END_TEST

/* muster-train's time split, from its own timers: a window of whole steps at
 * least RANK_SPLIT_MS long, its collective share the steps' comm_frac. */
START_TEST(heartbeat_carries_the_time_split)
{
    struct rank_assign a;
    struct rank_ctl *c = open_rank(1, 2, 4, &a);
    struct proto_msg m;
    rank_ctl_beat(c, 1, 3.0, 1000.0, 0.25, 0);
    agent_recv(&m);
    ck_assert_double_eq(m.u.heartbeat.ranks[0].split_s, 0); /* no window yet */
    for (uint64_t step = 2; step <= 3; step++) {
        usleep(RANK_SPLIT_MS * 1000 / 2 + 50000);
        rank_ctl_beat(c, step, 3.0, 1000.0, 0.25, 0);
    }
    int seen = 0;
    for (int i = 0; i < 8 && !seen; i++) {
        agent_recv(&m);
        seen = m.u.heartbeat.ranks[0].split_s > 0;
    }
    ck_assert_msg(seen, "no heartbeat with a time split within 8 frames");
    const struct proto_rank_beat *b = &m.u.heartbeat.ranks[0];
    ck_assert_double_ge(b->split_s, RANK_SPLIT_MS / 1000.0);
    ck_assert_double_le(b->split_s, 3.0);
    ck_assert_uint_eq(b->split_steps, 2);
    ck_assert_double_eq_tol(b->split[PROTO_SPLIT_COLLECTIVE], 0.25, 0.01);
    ck_assert_double_eq_tol(b->split[PROTO_SPLIT_COMPUTE], 0.75, 0.01);
    json_decref(a.job);
    rank_ctl_close(c);
    close(agent_fd);
}
END_TEST

START_TEST(heartbeat_carries_progress)
{
    struct rank_assign a;
    struct rank_ctl *c = open_rank(1, 2, 4, &a);
    rank_ctl_beat(c, 12, 3.25, 1000.0, 0.25, 10);
    struct proto_msg m;
    agent_recv(&m);
    ck_assert_int_eq(m.type, PROTO_HEARTBEAT);
    ck_assert_int_eq(m.u.heartbeat.generation, 4);
    ck_assert_int_eq(m.u.heartbeat.nranks, 1);
    ck_assert_int_eq(m.u.heartbeat.ranks[0].rank, 1);
    ck_assert_int_eq(m.u.heartbeat.ranks[0].step, 12);
    ck_assert_int_eq(m.u.heartbeat.ranks[0].checkpoint_step, 10);
    ck_assert_int_eq(m.u.heartbeat.ranks[0].state, PROTO_RANK_RUNNING);
    ck_assert_double_eq_tol(m.u.heartbeat.ranks[0].comm_frac, 0.25, 1e-12);
    /* Later beats come from the control thread on its period (it may repeat step 12 first). */
    rank_ctl_beat(c, 13, 3.0, 1000.0, 0.2, 10);
    int seen13 = 0;
    for (int i = 0; i < 4 && !seen13; i++) {
        agent_recv(&m);
        ck_assert_int_eq(m.type, PROTO_HEARTBEAT);
        ck_assert_int_ge(m.u.heartbeat.ranks[0].step, 12);
        seen13 = m.u.heartbeat.ranks[0].step == 13;
    }
    ck_assert_msg(seen13, "no heartbeat with step 13 within 4 frames");
    json_decref(a.job);
    rank_ctl_close(c);
    close(agent_fd);
}
END_TEST

START_TEST(stop_command_and_agent_death_stop_the_rank)
{
    struct rank_assign a;
    struct rank_ctl *c = open_rank(0, 2, 1, &a);
    int tag = 42;
    aborted = 0;
    rank_ctl_on_abort(c, on_abort, &tag);
    volatile sig_atomic_t *stop = &stop_flag;
    ck_assert_int_eq(*stop, 0);
    struct proto_msg m = {.type = PROTO_COMMAND};
    m.u.command.generation = 1;
    m.u.command.action = PROTO_CMD_CHECKPOINT; /* not supported: logged, ignored */
    agent_send(&m);
    m.u.command.action = PROTO_CMD_STOP;
    agent_send(&m);
    for (int i = 0; i < 200 && !*stop; i++)
        usleep(10000);
    ck_assert_int_eq(*stop, 1);
    ck_assert_int_eq(aborted, 42);
    uint8_t got[PROTO_UID_LEN];
    ck_assert_int_eq(rank_ctl_unique_id(c, NULL, got, 1000), -ECANCELED);
    json_decref(a.job);
    rank_ctl_close(c);
    close(agent_fd);

    c = open_rank(1, 2, 1, &a);
    close(agent_fd); /* the agent dies */
    for (int i = 0; i < 200 && !*stop; i++)
        usleep(10000);
    ck_assert_int_eq(*stop, 1);
    json_decref(a.job);
    rank_ctl_close(c);
}
END_TEST

Suite *make_rank_suite(void)
{
    Suite *s = suite_create("rank");
    TCase *tc = tcase_create("ctl");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, assign_is_read_and_checked);
    tcase_add_test(tc, assign_for_another_rank_is_refused);
    tcase_add_test(tc, no_assign_times_out);
    tcase_add_test(tc, unique_id_goes_up_and_comes_back);
    tcase_add_test(tc, heartbeat_carries_progress);
    tcase_add_test(tc, heartbeat_carries_the_time_split);
    tcase_add_test(tc, stop_command_and_agent_death_stop_the_rank);
    suite_add_tcase(s, tc);
    return s;
}
