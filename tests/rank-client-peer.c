/*
 * rank-client-peer: the agent's end of a rank's control socket, for testing
 * the rank clients (clients/). Runs COMMAND with one end of a socketpair as
 * fd 3 and the environment an agent gives (MUSTER_CTL_FD=3, RANK,
 * MUSTER_GENERATION), sends it an ASSIGN, decodes every frame it sends
 * with the real decoder and prints one line per frame on stdout:
 *
 *   heartbeat generation=7 seq=1 rank=0 state=running step=0 loss=null
 *             tokens_per_s=0 comm_frac=0 checkpoint_step=0   (one line)
 *   unique_id generation=7 id=000102...   (echoed back, as musterd would)
 *
 * then "exit status=N" or "exit signal=N" when the command ends. On request
 * it sends COMMAND checkpoint then stop once a step is reached, closes the
 * socket after some heartbeats (the agent dies), or floods the rank with
 * ASSIGN frames (a rank must keep reading).
 *
 * Exit: 0 when the command ended and every frame decoded; 1 on a frame
 * that does not decode or when --timeout-ms passes (the command is killed);
 * 2 on a usage error.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "proto/proto.h"

#define ASSIGN_PAD 200000 /* job spec bytes in each ASSIGN */

static struct {
    uint64_t generation, stop_at_step, close_after, flood_bytes, timeout_ms;
    unsigned rank;
} opt = {.generation = 1, .stop_at_step = UINT64_MAX, .close_after = UINT64_MAX, .timeout_ms = 30000};

static int fd = -1;
static pid_t child;
static uint8_t in[PROTO_MAX_FRAME];
static size_t in_len;
/* Bytes queued for the rank: out[out_off..out_len). */
static uint8_t out[1u << 20];
static size_t out_off, out_len;
static uint64_t flood_left;

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void fail(const char *what)
{
    printf("fail %s\n", what);
    if (child > 0)
        kill(child, SIGKILL);
    exit(1);
}

static void queue(const uint8_t *p, size_t n)
{
    if (out_off == out_len)
        out_off = out_len = 0;
    if (n > sizeof(out) - out_len) {
        memmove(out, out + out_off, out_len - out_off);
        out_len -= out_off, out_off = 0;
    }
    if (n > sizeof(out) - out_len)
        fail("output queue full");
    memcpy(out + out_len, p, n);
    out_len += n;
}

static void queue_msg(const struct proto_msg *m)
{
    uint8_t buf[1024];
    int n = proto_encode(m, buf, sizeof(buf));
    if (n < 0)
        fail(proto_strerror(n));
    queue(buf, (size_t)n);
}

/*
 * An ASSIGN with a job spec of ASSIGN_PAD bytes, written by hand: the
 * clients treat its payload as opaque, and this keeps the tool independent
 * of the slot fields ASSIGN carries.
 */
static void queue_assign(void)
{
    static uint8_t f[PROTO_HEADER_LEN + ASSIGN_PAD + 128];
    char *p = (char *)f + PROTO_HEADER_LEN;
    int n = sprintf(p, "{\"generation\":%" PRIu64 ",\"job\":{\"pad\":\"", opt.generation);
    memset(p + n, 'x', ASSIGN_PAD);
    size_t len = (size_t)n + ASSIGN_PAD + (size_t)sprintf(p + n + ASSIGN_PAD, "\"}}");
    const uint8_t head[PROTO_HEADER_LEN] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8),
                                            (uint8_t)len, 0, PROTO_VERSION, 0, PROTO_ASSIGN};
    memcpy(f, head, sizeof(head));
    queue(f, PROTO_HEADER_LEN + len);
}

static void queue_command(enum proto_command action)
{
    struct proto_msg m = {.type = PROTO_COMMAND};
    m.u.command.generation = opt.generation;
    m.u.command.action = action;
    queue_msg(&m);
    printf("sent %s\n", proto_command_name(action));
}

static void on_msg(struct proto_msg *m)
{
    static uint64_t beats;
    if (m->type == PROTO_HEARTBEAT) {
        const struct proto_heartbeat *h = &m->u.heartbeat;
        int reached = 0;
        printf("heartbeat generation=%" PRIu64 " seq=%" PRIu64, h->generation, h->seq);
        for (uint32_t i = 0; i < h->nranks; i++) {
            const struct proto_rank_beat *b = &h->ranks[i];
            char loss[32] = "null";
            if (!isnan(b->loss))
                snprintf(loss, sizeof(loss), "%.17g", b->loss);
            printf(" rank=%u state=%s step=%" PRIu64 " loss=%s tokens_per_s=%.17g comm_frac=%.17g"
                   " checkpoint_step=%" PRIu64, b->rank, proto_rank_state_name(b->state), b->step, loss,
                   b->tokens_per_s, b->comm_frac, b->checkpoint_step);
            reached |= b->step >= opt.stop_at_step;
        }
        printf("\n");
        if (reached) {
            opt.stop_at_step = UINT64_MAX;
            queue_command(PROTO_CMD_CHECKPOINT);
            queue_command(PROTO_CMD_STOP);
        }
        if (++beats == opt.close_after) {
            close(fd);
            fd = -1;
            printf("closed\n");
        }
        return;
    }
    if (m->type == PROTO_UNIQUE_ID) {
        printf("unique_id generation=%" PRIu64 " id=", m->u.unique_id.generation);
        for (size_t i = 0; i < PROTO_UID_LEN; i++)
            printf("%02x", m->u.unique_id.id[i]);
        printf("\n");
        queue_msg(m);
        return;
    }
    printf("unexpected %s\n", proto_type_name(m->type));
}

static void read_frames(void)
{
    ssize_t n = read(fd, in + in_len, sizeof(in) - in_len);
    if (n < 0 && (errno == EINTR || errno == EAGAIN))
        return;
    if (n <= 0) { /* the rank closed its end; its exit comes next */
        close(fd);
        fd = -1;
        return;
    }
    in_len += (size_t)n;
    for (;;) {
        struct proto_msg m;
        size_t used = 0;
        int rc = proto_decode(in, in_len, &m, &used);
        if (rc == PROTO_NEED_MORE)
            return;
        if (rc != PROTO_OK)
            fail(proto_strerror(rc));
        on_msg(&m);
        proto_msg_clear(&m);
        memmove(in, in + used, in_len - used);
        in_len -= used;
        if (fd < 0)
            return;
    }
}

static void write_frames(void)
{
    if (out_off == out_len && flood_left > 0) {
        queue_assign();
        uint64_t n = out_len - out_off;
        flood_left = flood_left > n ? flood_left - n : 0;
        if (flood_left == 0)
            printf("flood done\n");
    }
    ssize_t n = write(fd, out + out_off, out_len - out_off);
    if (n > 0)
        out_off += (size_t)n;
    else if (n < 0 && errno != EAGAIN && errno != EINTR)
        fail("write to the rank failed");
}

static int usage(void)
{
    fprintf(stderr, "usage: rank-client-peer [--rank N] [--generation G] [--stop-at-step S] "
                    "[--close-after-beats K] [--flood-mib M] [--timeout-ms T] -- COMMAND [ARG...]\n");
    return 2;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"rank", required_argument, NULL, 'r'},          {"generation", required_argument, NULL, 'g'},
        {"stop-at-step", required_argument, NULL, 's'},  {"close-after-beats", required_argument, NULL, 'c'},
        {"flood-mib", required_argument, NULL, 'f'},     {"timeout-ms", required_argument, NULL, 't'},
        {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
        char *end;
        unsigned long long v = strtoull(optarg ? optarg : "", &end, 10);
        if (c == '?' || !optarg || *end || !*optarg)
            return usage();
        if (c == 'r')
            opt.rank = (unsigned)v;
        else if (c == 'g')
            opt.generation = v;
        else if (c == 's')
            opt.stop_at_step = v;
        else if (c == 'c')
            opt.close_after = v;
        else if (c == 'f')
            opt.flood_bytes = v << 20;
        else
            opt.timeout_ms = v;
    }
    if (optind >= argc)
        return usage();
    setvbuf(stdout, NULL, _IOLBF, 0);
    signal(SIGPIPE, SIG_IGN);

    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
        fail("socketpair");
    char v[32];
    snprintf(v, sizeof(v), "%u", opt.rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof(v), "%" PRIu64, opt.generation);
    setenv("MUSTER_GENERATION", v, 1);
    setenv("MUSTER_CTL_FD", "3", 1);
    child = fork();
    if (child < 0)
        fail("fork");
    if (child == 0) {
        if (dup2(sv[1], 3) < 0)
            _exit(127);
        if (sv[0] != 3)
            close(sv[0]);
        if (sv[1] != 3)
            close(sv[1]);
        execvp(argv[optind], argv + optind);
        fprintf(stderr, "rank-client-peer: %s: %s\n", argv[optind], strerror(errno));
        _exit(127);
    }
    close(sv[1]);
    fd = sv[0];
    fcntl(fd, F_SETFL, O_NONBLOCK);
    queue_assign();
    flood_left = opt.flood_bytes;

    const uint64_t deadline = now_ms() + opt.timeout_ms;
    for (;;) {
        int status;
        if (waitpid(child, &status, WNOHANG) == child) {
            while (fd >= 0 && in_len < sizeof(in)) {
                size_t before = in_len;
                read_frames();
                if (in_len == before)
                    break;
            }
            if (WIFEXITED(status))
                printf("exit status=%d\n", WEXITSTATUS(status));
            else
                printf("exit signal=%d\n", WTERMSIG(status));
            return 0;
        }
        if (now_ms() >= deadline)
            fail("timeout");
        if (fd < 0) {
            usleep(10000);
            continue;
        }
        struct pollfd p = {.fd = fd, .events = POLLIN};
        if (out_off < out_len || flood_left > 0)
            p.events |= POLLOUT;
        if (poll(&p, 1, 20) > 0) {
            if (p.revents & (POLLIN | POLLHUP | POLLERR))
                read_frames();
            if (fd >= 0 && (p.revents & POLLOUT))
                write_frames();
        }
    }
}
