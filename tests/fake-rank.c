/*
 * fake-rank: a stand-in for muster-train in tests (never the default rank
 * command). Speaks the rank side of the control socket with blocking I/O:
 * reads ASSIGN, sends UNIQUE_ID when it is rank 0, waits for the unique id,
 * then heartbeats one step every --step-ms. Faults on request: exit 3 at a
 * step (--crash-*), or at the next step after SIGUSR1 (a crash a test can
 * time), stop heartbeating (--hang-*). Output on request:
 * --lines N prints N numbered lines on stdout per step (for rank logs).
 *
 * Exit: 0 after --steps steps, on COMMAND stop or SIGTERM; 1 when the
 * control socket closes or a wait times out; 2 on a usage error; 3 = crash.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "proto/proto.h"

#define WAIT_UID_MS 30000
#define WAIT_ASSIGN_MS 30000

static volatile sig_atomic_t got_sigterm, got_sigusr1;

static struct {
    int fd;
    unsigned rank;
    uint64_t generation;
    uint8_t buf[PROTO_MAX_FRAME];
    size_t len;
} ctl;

static void on_sigterm(int sig) { (void)sig; got_sigterm = 1; }
static void on_sigusr1(int sig) { (void)sig; got_sigusr1 = 1; }

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
    char line[512];
    va_list ap;
    int n = snprintf(line, sizeof(line), "fake-rank %u: ", ctl.rank);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    fprintf(stderr, "%s\n", line);
}

static void die(int code, const char *fmt, ...) __attribute__((format(printf, 2, 3), noreturn));
static void die(int code, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    say("%s", line);
    exit(code);
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void send_msg(const struct proto_msg *m)
{
    static uint8_t out[PROTO_MAX_FRAME];
    int n = proto_encode(m, out, sizeof(out));
    if (n < 0)
        die(1, "cannot encode %s: %s", proto_type_name(m->type), proto_strerror(n));
    for (size_t off = 0; off < (size_t)n;) {
        ssize_t w = send(ctl.fd, out + off, (size_t)n - off, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            die(1, "control socket: write failed: %s", strerror(errno));
        off += (size_t)w;
    }
}

/* 1: a frame in *msg; 0: deadline passed or SIGTERM; exits when the socket closes. */
static int recv_msg(uint64_t deadline, struct proto_msg *msg)
{
    for (;;) {
        size_t used = 0;
        int rc = proto_decode(ctl.buf, ctl.len, msg, &used);
        if (rc == PROTO_OK) {
            memmove(ctl.buf, ctl.buf + used, ctl.len - used);
            ctl.len -= used;
            return 1;
        }
        if (rc != PROTO_NEED_MORE)
            die(1, "control socket: bad frame: %s", proto_strerror(rc));
        if (got_sigterm)
            return 0;
        uint64_t now = now_ms();
        if (now >= deadline)
            return 0;
        struct pollfd p = {.fd = ctl.fd, .events = POLLIN};
        int pr = poll(&p, 1, (int)(deadline - now));
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            die(1, "poll: %s", strerror(errno));
        if (pr == 0)
            continue;
        ssize_t n = read(ctl.fd, ctl.buf + ctl.len, sizeof(ctl.buf) - ctl.len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            die(1, "control socket closed by the agent%s", n < 0 ? " (read error)" : "");
        ctl.len += (size_t)n;
    }
}

/* Handles what may come at any time; returns the message type. */
static enum proto_type handle(struct proto_msg *m)
{
    enum proto_type t = m->type;
    if (t == PROTO_COMMAND) {
        if (m->u.command.action == PROTO_CMD_STOP) {
            proto_msg_clear(m);
            die(0, "stop command received; exiting");
        }
        say("command %s received", proto_command_name(m->u.command.action));
    }
    return t;
}

static unsigned long env_num(const char *name)
{
    const char *v = getenv(name);
    if (!v || !*v) {
        fprintf(stderr, "fake-rank: %s is not set (fake-rank is started by muster-worker)\n", name);
        exit(2);
    }
    char *end;
    errno = 0;
    unsigned long n = strtoul(v, &end, 10);
    if (errno || *end) {
        fprintf(stderr, "fake-rank: %s: expected a number, got '%s'\n", name, v);
        exit(2);
    }
    return n;
}

static void write_pidfile(void)
{
    const char *dir = getenv("FAKE_RANK_PIDDIR");
    if (!dir || !*dir)
        return;
    char path[4096];
    snprintf(path, sizeof(path), "%s/rank-%u.pid", dir, ctl.rank);
    FILE *f = fopen(path, "w");
    if (!f)
        die(1, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "%d\n", (int)getpid());
    fclose(f);
}

/* --spawn-child: a helper process that ignores SIGTERM, as a real trainer's
 * data loader might; its pid goes to $FAKE_RANK_PIDDIR/child-RANK.pid. */
static void spawn_child(void)
{
    pid_t pid = fork();
    if (pid < 0)
        die(1, "fork: %s", strerror(errno));
    if (pid == 0) {
        signal(SIGTERM, SIG_IGN);
        close(ctl.fd);
        for (int i = 0; i < 600; i++) /* bounded: ten minutes at most */
            sleep(1);
        _exit(0);
    }
    const char *dir = getenv("FAKE_RANK_PIDDIR");
    if (!dir || !*dir)
        return;
    char path[4096];
    snprintf(path, sizeof(path), "%s/child-%u.pid", dir, ctl.rank);
    FILE *f = fopen(path, "w");
    if (!f)
        die(1, "cannot write %s: %s", path, strerror(errno));
    fprintf(f, "%d\n", (int)pid);
    fclose(f);
}

static long flag_num(const char *flag, const char *v)
{
    char *end;
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || n < 0) {
        fprintf(stderr, "fake-rank: %s: expected a non-negative number, got '%s'\n", flag, v);
        exit(2);
    }
    return n;
}

int main(int argc, char **argv)
{
    long steps = 1000000, step_ms = 100, crash_step = -1, crash_rank = -1, crash_gen = 1, hang_step = -1,
         hang_rank = -1, lines = 0, uid_delay_ms = 0;
    int child = 0, hang_all = 0;
    static const struct option opts[] = {
        {"spawn-child", no_argument, NULL, 'C'},
        {"steps", required_argument, NULL, 's'},
        {"step-ms", required_argument, NULL, 'm'},
        {"crash-at-step", required_argument, NULL, 'c'},
        {"crash-rank", required_argument, NULL, 'r'},
        {"crash-generation", required_argument, NULL, 'g'},
        {"hang-at-step", required_argument, NULL, 'h'},
        {"hang-rank", required_argument, NULL, 'H'},
        {"hang-all", no_argument, NULL, 'A'},
        {"lines", required_argument, NULL, 'l'},
        {"uid-delay-ms", required_argument, NULL, 'u'},
        {NULL, 0, NULL, 0},
    };
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 's': steps = flag_num("--steps", optarg); break;
        case 'm': step_ms = flag_num("--step-ms", optarg); break;
        case 'c': crash_step = flag_num("--crash-at-step", optarg); break;
        case 'r': crash_rank = flag_num("--crash-rank", optarg); break;
        case 'g': crash_gen = flag_num("--crash-generation", optarg); break;
        case 'h': hang_step = flag_num("--hang-at-step", optarg); break;
        case 'H': hang_rank = flag_num("--hang-rank", optarg); break;
        case 'l': lines = flag_num("--lines", optarg); break;
        case 'u': uid_delay_ms = flag_num("--uid-delay-ms", optarg); break;
        case 'C': child = 1; break;
        case 'A': hang_all = 1; break;
        default:
            fprintf(stderr, "usage: fake-rank [--steps N] [--step-ms MS] [--crash-at-step K --crash-rank R "
                            "[--crash-generation G]] [--hang-at-step K --hang-rank R | --hang-all] [--spawn-child] [--lines N] "
                            "[--uid-delay-ms MS]\n");
            return 2;
        }
    }
    ctl.rank = (unsigned)env_num("RANK");
    unsigned world = (unsigned)env_num("WORLD_SIZE");
    ctl.generation = env_num("MUSTER_GENERATION");
    ctl.fd = (int)env_num("MUSTER_CTL_FD");

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigterm;
    sigaction(SIGTERM, &sa, NULL); /* no SA_RESTART: poll returns EINTR */
    sa.sa_handler = on_sigusr1;
    sigaction(SIGUSR1, &sa, NULL);
    write_pidfile();
    if (child)
        spawn_child();

    struct proto_msg m;
    uint64_t deadline = now_ms() + WAIT_ASSIGN_MS;
    for (;;) {
        if (!recv_msg(deadline, &m)) {
            if (got_sigterm)
                die(0, "SIGTERM before ASSIGN; exiting");
            die(1, "no ASSIGN within %d s", WAIT_ASSIGN_MS / 1000);
        }
        enum proto_type t = handle(&m);
        if (t == PROTO_ASSIGN && m.u.assign.generation != ctl.generation)
            die(1, "ASSIGN of generation %" PRIu64 " but MUSTER_GENERATION is %" PRIu64, m.u.assign.generation,
                ctl.generation);
        proto_msg_clear(&m);
        if (t == PROTO_ASSIGN)
            break;
    }
    printf("fake-rank %u: assigned, generation %" PRIu64 ", world size %u\n", ctl.rank, ctl.generation, world);
    fflush(stdout);

    if (ctl.rank == 0) {
        if (uid_delay_ms) { /* a slow communicator set-up: the id comes later */
            struct timespec ts = {.tv_sec = uid_delay_ms / 1000, .tv_nsec = (uid_delay_ms % 1000) * 1000000L};
            while (nanosleep(&ts, &ts) == -1 && errno == EINTR && !got_sigterm)
                ;
        }
        memset(&m, 0, sizeof(m));
        m.type = PROTO_UNIQUE_ID;
        m.u.unique_id.generation = ctl.generation;
        if (getrandom(m.u.unique_id.id, PROTO_UID_LEN, 0) != PROTO_UID_LEN)
            die(1, "getrandom failed: %s", strerror(errno));
        send_msg(&m);
    }
    deadline = now_ms() + WAIT_UID_MS;
    for (;;) {
        if (!recv_msg(deadline, &m)) {
            if (got_sigterm)
                die(0, "SIGTERM while waiting for the unique id; exiting");
            die(1, "no unique id for generation %" PRIu64 " within %d s", ctl.generation, WAIT_UID_MS / 1000);
        }
        enum proto_type t = handle(&m);
        bool ours = t == PROTO_UNIQUE_ID && m.u.unique_id.generation == ctl.generation;
        proto_msg_clear(&m);
        if (ours)
            break;
    }
    say("unique id received; training");

    uint64_t seq = 0, step = 0, next = now_ms() + (uint64_t)step_ms;
    for (;;) {
        while (recv_msg(next, &m)) {
            handle(&m);
            proto_msg_clear(&m);
        }
        if (got_sigterm)
            die(0, "SIGTERM at step %" PRIu64 "; exiting", step);
        step++;
        next += (uint64_t)step_ms;
        if ((long)step == crash_step && (long)ctl.rank == crash_rank && (long)ctl.generation == crash_gen)
            die(3, "crashing at step %" PRIu64 " as asked (--crash-at-step)", step);
        if (got_sigusr1)
            die(3, "crashing at step %" PRIu64 " as asked (SIGUSR1)", step);
        if ((long)step == hang_step && (hang_all || (long)ctl.rank == hang_rank)) {
            say("hanging at step %" PRIu64 " as asked (--hang-at-step)", step);
            while (!got_sigterm)
                pause();
            die(0, "SIGTERM while hung; exiting");
        }
        memset(&m, 0, sizeof(m));
        m.type = PROTO_HEARTBEAT;
        m.u.heartbeat.generation = ctl.generation;
        m.u.heartbeat.seq = ++seq;
        m.u.heartbeat.nranks = 1;
        struct proto_rank_beat *b = &m.u.heartbeat.ranks[0];
        b->rank = ctl.rank;
        b->state = PROTO_RANK_RUNNING;
        b->step = step;
        b->loss = 5.0 / (1.0 + 0.01 * (double)step);
        b->tokens_per_s = 1000;
        b->comm_frac = 0.1;
        send_msg(&m);
        if (step % 50 == 0)
            say("step %" PRIu64 " loss %.4f", step, b->loss);
        for (long i = 0; i < lines; i++)
            printf("fake-rank %u generation %" PRIu64 " step %" PRIu64 " line %ld\n", ctl.rank, ctl.generation,
                   step, i);
        if (lines)
            fflush(stdout);
        if ((long)step >= steps)
            die(0, "completed %" PRIu64 " steps", step);
    }
}
