/*
 * rank_client: the header-only C client users include (clients/c/muster_rank.h),
 * against a test agent on the other end of a socketpair that decodes what
 * it sends with the real decoder (proto_decode) and writes frames to it.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "clients/c/muster_rank.h"
#include "proto/proto.h"

static int agent_fd;
static uint8_t rx[PROTO_MAX_FRAME];
static size_t rx_len;

/* A rank's environment with its control socket; returns the agent's end. */
static int put_env(unsigned rank, unsigned gen)
{
    int sv[2];
    char v[32];
    ck_assert_int_eq(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    snprintf(v, sizeof(v), "%d", sv[1]);
    setenv("MUSTER_CTL_FD", v, 1);
    snprintf(v, sizeof(v), "%u", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%u", gen);
    setenv("MUSTER_GENERATION", v, 1);
    agent_fd = sv[0];
    rx_len = 0;
    return sv[1];
}

/* Waits at most ms for bytes from the rank; 0 when none came. */
static int agent_fill(int ms)
{
    struct pollfd p = {.fd = agent_fd, .events = POLLIN};
    if (poll(&p, 1, ms) <= 0)
        return 0;
    ssize_t n = read(agent_fd, rx + rx_len, sizeof(rx) - rx_len);
    ck_assert_int_gt(n, 0);
    rx_len += (size_t)n;
    return 1;
}

/*
 * Next frame from the rank, decoded, waiting at most ms; 0 when none came.
 * payload gets its JSON text (for what decoding hides, such as null).
 */
static int agent_recv(struct proto_msg *m, int ms, char *payload, size_t cap)
{
    for (;;) {
        size_t used = 0;
        int rc = proto_decode(rx, rx_len, m, &used);
        if (rc == PROTO_OK) {
            if (payload) {
                size_t n = used - PROTO_HEADER_LEN < cap - 1 ? used - PROTO_HEADER_LEN : cap - 1;
                memcpy(payload, rx + PROTO_HEADER_LEN, n);
                payload[n] = '\0';
            }
            memmove(rx, rx + used, rx_len - used);
            rx_len -= used;
            return 1;
        }
        ck_assert_msg(rc == PROTO_NEED_MORE, "the rank sent a frame that does not decode: %s", proto_strerror(rc));
        if (!agent_fill(ms))
            return 0;
    }
}

static void agent_send(const struct proto_msg *m)
{
    uint8_t buf[1024];
    int n = proto_encode(m, buf, sizeof(buf));
    ck_assert_int_gt(n, 0);
    ck_assert_int_eq(write(agent_fd, buf, (size_t)n), n);
}

static void agent_command(uint64_t gen, enum proto_command action)
{
    struct proto_msg m = {.type = PROTO_COMMAND};
    m.u.command.generation = gen;
    m.u.command.action = action;
    agent_send(&m);
}

static const struct proto_rank_beat *expect_beat(struct proto_msg *m, char *payload, size_t cap)
{
    ck_assert_msg(agent_recv(m, 2000, payload, cap), "no frame from the rank within 2 s");
    ck_assert_int_eq(m->type, PROTO_HEARTBEAT);
    ck_assert_int_eq(m->u.heartbeat.nranks, 1);
    return &m->u.heartbeat.ranks[0];
}

/* stderr into a file, for what the client says; returns the file. */
static FILE *capture_stderr(void)
{
    FILE *f = tmpfile();
    ck_assert_ptr_nonnull(f);
    fflush(stderr);
    ck_assert_int_ge(dup2(fileno(f), STDERR_FILENO), 0);
    return f;
}

static int count_lines(FILE *f, const char *needle)
{
    char line[512];
    int n = 0;
    fflush(stderr);
    rewind(f);
    while (fgets(line, sizeof(line), f))
        n += strstr(line, needle) != NULL;
    return n;
}

START_TEST(beat_carries_every_field)
{
    int fd = put_env(5, 9);
    struct muster_rank *r = muster_rank_open();
    ck_assert_int_eq(muster_rank_active(r), 1);
    ck_assert_ptr_null(getenv("MUSTER_CTL_FD")); /* children do not take it for theirs */
    ck_assert_int_eq(fcntl(fd, F_GETFD) & FD_CLOEXEC, FD_CLOEXEC);

    const double loss = 0.1 + 1e-17 * 3; /* needs all 17 digits */
    struct proto_msg m;
    char text[1024];
    muster_rank_beat(r, 12, loss, 1234.5);
    const struct proto_rank_beat *b = expect_beat(&m, text, sizeof(text));
    ck_assert_int_eq(m.u.heartbeat.generation, 9);
    ck_assert_int_eq(m.u.heartbeat.seq, 1);
    ck_assert_int_eq(b->rank, 5);
    ck_assert_int_eq(b->state, PROTO_RANK_RUNNING);
    ck_assert_int_eq(b->step, 12);
    ck_assert_msg(b->loss == loss, "loss %.17g arrived as %.17g", loss, b->loss);
    ck_assert_double_eq(b->tokens_per_s, 1234.5);
    ck_assert_double_eq(b->comm_frac, 0);
    ck_assert_int_eq(b->checkpoint_step, 0);
    ck_assert_ptr_null(strstr(text, "checkpoint_step")); /* optional: omitted when there is none */
    proto_msg_clear(&m);

    /* The next beat waits for its turn; NaN is null, bounds are clamped. */
    muster_rank_checkpoint(r, 10);
    muster_rank_comm_frac(r, 3.0);
    muster_rank_beat(r, 13, NAN, -5);
    usleep((MUSTER_RANK_BEAT_MS + 20) * 1000);
    ck_assert_int_eq(muster_rank_stop_requested(r), 0); /* any call sends a held-back beat */
    b = expect_beat(&m, text, sizeof(text));
    ck_assert_int_eq(m.u.heartbeat.seq, 2);
    ck_assert_int_eq(b->step, 13);
    ck_assert_msg(isnan(b->loss), "NaN loss arrived as %g", b->loss);
    ck_assert_ptr_nonnull(strstr(text, "\"loss\":null"));
    ck_assert_double_eq(b->tokens_per_s, 0);
    ck_assert_double_eq(b->comm_frac, 1);
    ck_assert_int_eq(b->checkpoint_step, 10);
    proto_msg_clear(&m);

    muster_rank_comm_frac(r, 0.25);
    usleep((MUSTER_RANK_BEAT_MS + 20) * 1000);
    muster_rank_beat(r, 14, INFINITY, 7);
    b = expect_beat(&m, text, sizeof(text));
    ck_assert_int_eq(m.u.heartbeat.seq, 3);
    ck_assert_int_eq(b->step, 14);
    ck_assert_ptr_nonnull(strstr(text, "\"loss\":null"));
    ck_assert_double_eq(b->comm_frac, 0.25);
    proto_msg_clear(&m);
    muster_rank_close(r);
    close(agent_fd);
}
END_TEST

START_TEST(beats_are_rate_limited_and_the_latest_is_sent)
{
    put_env(0, 1);
    struct muster_rank *r = muster_rank_open();
    for (uint64_t s = 1; s <= 1000; s++)
        muster_rank_beat(r, s, 1.0 / (double)s, 10);
    struct proto_msg m;
    const struct proto_rank_beat *b = expect_beat(&m, NULL, 0);
    ck_assert_int_eq(b->step, 1); /* the first beat goes out at once */
    proto_msg_clear(&m);
    ck_assert_msg(!agent_recv(&m, 0, NULL, 0), "a second heartbeat within %d ms", MUSTER_RANK_BEAT_MS);
    usleep((MUSTER_RANK_BEAT_MS + 20) * 1000);
    muster_rank_beat(r, 1001, 0.5, 10);
    b = expect_beat(&m, NULL, 0);
    ck_assert_int_eq(b->step, 1001);
    proto_msg_clear(&m);
    /* close sends the beat the rate limit held back. */
    muster_rank_beat(r, 1002, 0.5, 10);
    muster_rank_close(r);
    b = expect_beat(&m, NULL, 0);
    ck_assert_int_eq(b->step, 1002);
    ck_assert_int_eq(m.u.heartbeat.seq, 3);
    proto_msg_clear(&m);
    close(agent_fd);
}
END_TEST

/* An ASSIGN as big as a job spec gets; the client skips its payload unread. */
static size_t big_assign(uint8_t *out, size_t spec_bytes)
{
    int n = snprintf((char *)out + PROTO_HEADER_LEN, 64, "{\"generation\":3,\"job\":{\"pad\":\"");
    memset(out + PROTO_HEADER_LEN + n, 'x', spec_bytes);
    size_t len = (size_t)n + spec_bytes;
    memcpy(out + PROTO_HEADER_LEN + len, "\"}}", 3);
    len += 3;
    const uint8_t head[PROTO_HEADER_LEN] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8),
                                            (uint8_t)len, 0, PROTO_VERSION, 0, PROTO_ASSIGN};
    memcpy(out, head, sizeof(head));
    return PROTO_HEADER_LEN + len;
}

START_TEST(incoming_frames_are_drained)
{
    put_env(2, 3);
    struct muster_rank *r = muster_rank_open();
    static uint8_t frame[PROTO_MAX_FRAME];
    size_t flen = big_assign(frame, 200000);
    ck_assert_int_eq(fcntl(agent_fd, F_SETFL, O_NONBLOCK), 0);

    /* 16 MiB of ASSIGNs, the socket filled each round: a client that did not
     * read would leave the agent unable to write more. */
    size_t total = 0, off = 0;
    for (int round = 0; total < 16u << 20; round++) {
        size_t wrote = 0;
        for (;;) {
            ssize_t n = write(agent_fd, frame + off, flen - off);
            if (n < 0) {
                ck_assert_int_eq(errno, EAGAIN);
                break;
            }
            wrote += (size_t)n;
            off = (off + (size_t)n) % flen;
        }
        ck_assert_msg(wrote > 0, "round %d: the client left the agent's writes backed up", round);
        total += wrote;
        muster_rank_beat(r, (uint64_t)round, 1.0, 1.0);
    }
    /* Finish the frame in flight, then the commands: they are still seen. */
    while (off != 0) {
        ssize_t n = write(agent_fd, frame + off, flen - off);
        if (n > 0)
            off = (off + (size_t)n) % flen;
        muster_rank_beat(r, 1, 1.0, 1.0);
    }
    ck_assert_int_eq(fcntl(agent_fd, F_SETFL, 0), 0);
    agent_command(3, PROTO_CMD_CHECKPOINT);
    struct proto_msg u = {.type = PROTO_UNIQUE_ID};
    u.u.unique_id.generation = 3;
    memset(u.u.unique_id.id, 0xc3, PROTO_UID_LEN);
    agent_send(&u);
    struct proto_msg old = u; /* another generation's id is not this one's */
    old.u.unique_id.generation = 2;
    memset(old.u.unique_id.id, 0x11, PROTO_UID_LEN);
    agent_send(&old);
    agent_command(3, PROTO_CMD_STOP);

    ck_assert_int_eq(muster_rank_checkpoint_requested(r), 1);
    ck_assert_int_eq(muster_rank_checkpoint_requested(r), 0); /* cleared by the call */
    ck_assert_int_eq(muster_rank_stop_requested(r), 1);
    uint8_t got[MUSTER_RANK_UID_LEN];
    ck_assert_int_eq(muster_rank_unique_id(r, NULL, got, 0), 0);
    ck_assert_int_eq(memcmp(got, u.u.unique_id.id, sizeof(got)), 0);
    ck_assert_int_eq(muster_rank_active(r), 1);
    muster_rank_close(r);
    close(agent_fd);
}
END_TEST

START_TEST(unique_id_goes_up_and_comes_back)
{
    put_env(0, 4);
    struct muster_rank *r = muster_rank_open();
    uint8_t mine[MUSTER_RANK_UID_LEN], got[MUSTER_RANK_UID_LEN];
    for (size_t i = 0; i < sizeof(mine); i++)
        mine[i] = (uint8_t)(i * 7 + 1);
    ck_assert_int_eq(muster_rank_unique_id(r, NULL, got, 50), -1); /* nothing came */

    /* The daemon's answer is already on its way when rank 0 asks. */
    struct proto_msg m = {.type = PROTO_UNIQUE_ID};
    m.u.unique_id.generation = 4;
    memcpy(m.u.unique_id.id, mine, sizeof(mine));
    agent_send(&m);
    ck_assert_int_eq(muster_rank_unique_id(r, mine, got, 2000), 0);
    ck_assert_int_eq(memcmp(got, mine, sizeof(got)), 0);

    ck_assert(agent_recv(&m, 2000, NULL, 0));
    ck_assert_int_eq(m.type, PROTO_UNIQUE_ID);
    ck_assert_int_eq(m.u.unique_id.generation, 4);
    ck_assert_int_eq(memcmp(m.u.unique_id.id, mine, sizeof(mine)), 0);
    muster_rank_close(r);
    close(agent_fd);
}
END_TEST

START_TEST(a_gone_agent_makes_every_call_a_quiet_noop)
{
    signal(SIGPIPE, SIG_DFL); /* a write without MSG_NOSIGNAL would kill this test */
    FILE *err = capture_stderr();

    /* The agent stops reading: the write fails with EPIPE. */
    put_env(1, 2);
    struct muster_rank *r = muster_rank_open();
    ck_assert_int_eq(shutdown(agent_fd, SHUT_RD), 0);
    for (uint64_t s = 1; s <= 50; s++) {
        muster_rank_beat(r, s, 1.0, 1.0);
        usleep(5000);
    }
    ck_assert_int_eq(muster_rank_active(r), 0);
    ck_assert_int_eq(muster_rank_stop_requested(r), 1);
    ck_assert_int_eq(count_lines(err, "muster_rank: cannot write to the control socket"), 1);
    muster_rank_close(r);
    close(agent_fd);

    /* The agent closes: EOF. */
    put_env(1, 2);
    r = muster_rank_open();
    muster_rank_beat(r, 1, 1.0, 1.0);
    struct proto_msg m;
    expect_beat(&m, NULL, 0); /* read: closing with unread bytes would be a reset, not EOF */
    close(agent_fd);
    for (uint64_t s = 2; s <= 50; s++) {
        muster_rank_beat(r, s, 1.0, 1.0);
        muster_rank_checkpoint(r, s);
        usleep(5000);
    }
    uint8_t got[MUSTER_RANK_UID_LEN] = {0};
    ck_assert_int_eq(muster_rank_unique_id(r, got, got, 100), -1);
    ck_assert_int_eq(muster_rank_stop_requested(r), 1);
    ck_assert_int_eq(count_lines(err, "muster_rank: the agent closed the control socket"), 1);
    muster_rank_close(r);

    /* The agent speaks another protocol version: silence, but no stop. */
    put_env(1, 2);
    r = muster_rank_open();
    const uint8_t other[PROTO_HEADER_LEN] = {0, 0, 0, 2, 0, PROTO_VERSION + 1, 0, PROTO_COMMAND};
    ck_assert_int_eq(write(agent_fd, other, sizeof(other)), (ssize_t)sizeof(other));
    muster_rank_beat(r, 1, 1.0, 1.0);
    ck_assert_int_eq(muster_rank_active(r), 0);
    ck_assert_int_eq(muster_rank_stop_requested(r), 0);
    ck_assert_int_eq(count_lines(err, "does not speak"), 1);
    muster_rank_close(r);
    close(agent_fd);
    fclose(err);
}
END_TEST

START_TEST(without_muster_every_call_is_a_noop)
{
    FILE *err = capture_stderr();
    unsetenv("MUSTER_CTL_FD");
    struct muster_rank *r = muster_rank_open();
    uint8_t id[MUSTER_RANK_UID_LEN] = {0};
    for (int pass = 0; pass < 2; pass++, r = NULL) { /* an inactive handle, then NULL */
        ck_assert_int_eq(muster_rank_active(r), 0);
        muster_rank_beat(r, 1, 1.0, 1.0);
        muster_rank_comm_frac(r, 0.5);
        muster_rank_checkpoint(r, 1);
        ck_assert_int_eq(muster_rank_stop_requested(r), 0);
        ck_assert_int_eq(muster_rank_checkpoint_requested(r), 0);
        ck_assert_int_eq(muster_rank_unique_id(r, id, id, -1), -1);
        muster_rank_close(r);
    }
    ck_assert_int_eq(count_lines(err, ""), 0); /* and it says nothing */

    /* Unusable settings: inactive, said once. */
    int p[2];
    ck_assert_int_eq(pipe(p), 0);
    const char *bad[][3] = {{"abc", "0", "1"}, {"3", "-1", "1"}, {"3", "0", "9007199254740992"}, {"", "", ""}};
    char fd[16];
    snprintf(fd, sizeof(fd), "%d", p[0]);
    bad[3][0] = fd, bad[3][1] = "0", bad[3][2] = "1"; /* a pipe is not a socket */
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        setenv("MUSTER_CTL_FD", bad[i][0], 1);
        setenv("RANK", bad[i][1], 1);
        setenv("MUSTER_GENERATION", bad[i][2], 1);
        r = muster_rank_open();
        ck_assert_int_eq(muster_rank_active(r), 0);
        muster_rank_beat(r, 1, 1.0, 1.0);
        muster_rank_close(r);
        ck_assert_int_eq(count_lines(err, "muster_rank: "), (int)i + 1);
    }
    fclose(err);
}
END_TEST

Suite *make_rank_client_suite(void)
{
    Suite *s = suite_create("rank_client");
    TCase *tc = tcase_create("c_client");
    tcase_set_timeout(tc, 20);
    tcase_add_test(tc, beat_carries_every_field);
    tcase_add_test(tc, beats_are_rate_limited_and_the_latest_is_sent);
    tcase_add_test(tc, incoming_frames_are_drained);
    tcase_add_test(tc, unique_id_goes_up_and_comes_back);
    tcase_add_test(tc, a_gone_agent_makes_every_call_a_quiet_noop);
    tcase_add_test(tc, without_muster_every_call_is_a_noop);
    suite_add_tcase(s, tc);
    return s;
}
