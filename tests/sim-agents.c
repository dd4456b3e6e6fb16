/*
 * sim-agents: a load generator for musterd's control port. N simulated
 * agents of R ranks each speak the real protocol over loopback TCP (HELLO,
 * CHALLENGE with musterd's proof, checked, RESPONSE with the agent's, then
 * sealed frames: WELCOME, ASSIGN, heartbeats, RANK_EXIT) from one thread
 * with epoll; no rank processes.
 *
 * What it measures (one "key=value" line each, for scripts):
 *   form_ms        agents started -> musterd's generation_running event of
 *                  generation 1 (its own time stamp, read from /v1/events)
 *   steady_cpu_pct musterd's CPU (user + system, % of one core: CPU seconds
 *                  from /proc/PID/stat over wall seconds) in windows of
 *                  STEADY_WINDOW_S over --steady-s seconds of 1 Hz
 *                  heartbeats (needs --pid): the median, robust to a
 *                  machine whose other load comes and goes
 *   steady_cpu_windows  the windows' figures, lowest first
 *   steady_rss_kb  musterd's RSS at the end
 *   steady_wakeups_per_s  musterd's voluntary context switches per second
 *                  (its loop going to sleep: daemon/coalesce.h)
 *   recovery_ms    one rank's RANK_EXIT (exit status 1) -> the next
 *                  generation's generation_running event (--rank-exit)
 *
 * Agents behave like muster-worker as far as the daemon can tell: they
 * heartbeat at the interval WELCOME gives, report their ranks running as
 * soon as ASSIGN comes, drop them on COMMAND stop, and reconnect after
 * about a second when refused or closed (REJECT codes are counted and the
 * first reason of each is printed).
 *
 * Exit: 0 when every phase asked for finished, 1 when one timed out or
 * failed, 2 on a usage error.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/token.h"
#include "proto/proto.h"

#define RECONNECT_MS 1000
#define STEADY_WINDOW_S 5.0
#define STEADY_WINDOWS_MAX 64
#define POLL_EVENTS_MS 50
#define READ_CHUNK 16384

enum link {
    LINK_DOWN,       /* not connected; reconnect at retry_ms */
    LINK_CONNECTING, /* non-blocking connect in flight */
    LINK_HELLO,      /* HELLO sent; waiting for CHALLENGE */
    LINK_AUTH,       /* RESPONSE sent; waiting for WELCOME; sealed frames from here on */
    LINK_JOINED,
};

struct agent {
    int fd;
    enum link link;
    char name[PROTO_NAME_MAX];
    uint64_t retry_ms;
    uint64_t next_beat_ms;
    uint64_t beats_since_answer; /* heartbeats sent since the daemon's last answer or WELCOME */
    uint64_t seq;
    uint64_t generation; /* of the ranks it runs; 0 = none */
    uint32_t nranks;     /* assigned ranks (running while generation != 0) */
    uint32_t first_rank;
    uint64_t step;
    uint64_t gen_beats;  /* heartbeats sent in this generation */
    uint32_t master_port; /* of its last ASSIGN: never reported free again (as muster-worker) */
    uint8_t *rbuf;
    size_t rlen, rcap;
    uint8_t *wbuf;
    size_t wlen, wcap;
    struct proto_bind bind;   /* the handshake, from HELLO on */
    struct proto_channel *ch; /* after musterd's proof: frames read are sealed */
    int seal_tx;              /* after RESPONSE: frames sent are sealed */
};

static struct {
    const char *daemon_host;
    uint16_t daemon_port;
    uint16_t http_port;
    uint8_t token[TOKEN_MAX];
    size_t token_len;
    int nagents;
    int nranks;
    int pid;
    double steady_s;
    int rank_exit;
    double timeout_s;
    const char *prefix;
    int verbose;
    int ack_all;
    int memckpt; /* memory checkpoint names per heartbeat (a memory_checkpoint_mb job's agents); 0 = none */
} opt = {.daemon_host = "127.0.0.1", .nranks = 8, .timeout_s = 120, .prefix = "sim"};

static struct agent *agents;
static int epfd;
static uint32_t heartbeat_ms = 1000;
static uint32_t ack_every_ms = 1000; /* as muster-worker: proto_ack_every_ms of WELCOME's figures */
static unsigned long rejects, closes, joins;
static char reject_seen[8][32];

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static int64_t wall_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void die(const char *fmt, ...) __attribute__((format(printf, 1, 2), noreturn));
static void die(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "sim-agents: ");
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    exit(1);
}

/* ---- connections ------------------------------------------------------ */

static void agent_down(struct agent *a, const char *why)
{
    if (a->fd >= 0) {
        epoll_ctl(epfd, EPOLL_CTL_DEL, a->fd, NULL);
        close(a->fd);
    }
    if (opt.verbose && why)
        fprintf(stderr, "sim-agents: %s: %s\n", a->name, why);
    a->fd = -1;
    a->link = LINK_DOWN;
    proto_channel_free(a->ch);
    a->ch = NULL;
    a->seal_tx = 0;
    a->rlen = a->wlen = 0;
    a->generation = 0;
    a->retry_ms = mono_ms() + RECONNECT_MS + (uint64_t)(rand() % 500);
    closes++;
}

static void want_out(struct agent *a, int on)
{
    struct epoll_event ev = {.events = EPOLLIN | (on ? EPOLLOUT : 0), .data.ptr = a};
    epoll_ctl(epfd, EPOLL_CTL_MOD, a->fd, &ev);
}

static int flush_out(struct agent *a)
{
    size_t off = 0;
    while (off < a->wlen) {
        ssize_t n = send(a->fd, a->wbuf + off, a->wlen - off, MSG_NOSIGNAL);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n < 0)
            return -errno;
        off += (size_t)n;
    }
    memmove(a->wbuf, a->wbuf + off, a->wlen - off);
    a->wlen -= off;
    want_out(a, a->wlen > 0);
    return 0;
}

/* m encoded into frame (PROTO_MAX_SEALED bytes): its length. */
static size_t encode(const struct proto_msg *m, uint8_t *frame)
{
    int n = proto_encode(m, frame, PROTO_MAX_FRAME);
    if (n < 0)
        die("cannot encode %s: %s", proto_type_name(m->type), proto_strerror(n));
    return (size_t)n;
}

static void send_frame(struct agent *a, uint8_t *frame, size_t len)
{
    int n = a->seal_tx ? proto_seal(a->ch, frame, len, PROTO_MAX_SEALED) : (int)len;
    if (n < 0)
        die("cannot seal a frame: %s", proto_strerror(n));
    if (a->wlen + (size_t)n > a->wcap) {
        a->wcap = a->wlen + (size_t)n + 4096;
        a->wbuf = realloc(a->wbuf, a->wcap);
        if (!a->wbuf)
            die("out of memory");
    }
    memcpy(a->wbuf + a->wlen, frame, (size_t)n);
    a->wlen += (size_t)n;
    if (flush_out(a) != 0)
        agent_down(a, "send failed");
}

static void agent_send(struct agent *a, const struct proto_msg *m)
{
    static uint8_t frame[PROTO_MAX_SEALED];
    send_frame(a, frame, encode(m, frame));
}

static void agent_connect(struct agent *a)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(opt.daemon_port)};
    inet_pton(AF_INET, opt.daemon_host, &sin.sin_addr);
    a->fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (a->fd < 0)
        die("socket: %s (raise the open-file limit)", strerror(errno));
    int one = 1;
    setsockopt(a->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    struct epoll_event ev = {.events = EPOLLIN | EPOLLOUT, .data.ptr = a};
    epoll_ctl(epfd, EPOLL_CTL_ADD, a->fd, &ev);
    a->link = LINK_CONNECTING;
    if (connect(a->fd, (struct sockaddr *)&sin, sizeof(sin)) != 0 && errno != EINPROGRESS)
        agent_down(a, strerror(errno));
}

static uint32_t free_port(const struct agent *a);

static void send_hello(struct agent *a)
{
    struct proto_msg m = {.type = PROTO_HELLO};
    struct proto_hello *h = &m.u.hello;
    snprintf(h->node, sizeof(h->node), "%s", a->name);
    snprintf(h->addr, sizeof(h->addr), "127.0.0.1");
    h->kind = PROTO_DEV_GPU;
    h->ndevices = (uint32_t)opt.nranks;
    for (int i = 0; i < opt.nranks; i++)
        h->devices[i] = (uint32_t)i;
    h->device_mem_mb = 81920;
    h->free_port = free_port(a);
    snprintf(h->agent_version, sizeof(h->agent_version), "sim-agents");
    if (proto_nonce(h->nonce) != 0)
        die("cannot draw a nonce");
    static uint8_t frame[PROTO_MAX_SEALED];
    size_t n = encode(&m, frame);
    if (proto_bind_hello(&a->bind, frame, n, h) != 0)
        die("cannot hash the HELLO");
    a->link = LINK_HELLO;
    send_frame(a, frame, n);
}

/* ---- heartbeats and ranks --------------------------------------------- */

static uint32_t free_port(const struct agent *a)
{
    uint32_t port = (uint32_t)(20000 + (a - agents) % 40000);
    return port == a->master_port ? port + 1 : port;
}

static void send_beat(struct agent *a, uint64_t now)
{
    struct proto_msg m;
    proto_heartbeat_start(&m); /* as muster-worker: the message's 64 entries are not all zeroed */
    struct proto_heartbeat *hb = &m.u.heartbeat;
    hb->generation = a->generation;
    hb->seq = ++a->seq;
    hb->free_port = free_port(a); /* as muster-worker does: rank 0's is MASTER_PORT */
    a->beats_since_answer++;
    hb->no_ack = !opt.ack_all && !proto_ack_due(a->beats_since_answer, heartbeat_ms, ack_every_ms); /* as muster-worker */
    if (opt.memckpt) { /* the newest complete ones, oldest first, as muster-worker lists them */
        hb->has_memckpt = 1;
        hb->nmemckpt = (uint32_t)opt.memckpt;
        for (uint32_t i = 0; i < hb->nmemckpt; i++)
            snprintf(hb->memckpt[i], sizeof(hb->memckpt[i]), "global_step%llu",
                     (unsigned long long)(a->step / 50 + i) * 50);
    }
    if (a->generation) {
        a->step++;
        const int measured = a->gen_beats++ > 0; /* a rank just started has no figures yet */
        hb->nranks = a->nranks;
        for (uint32_t i = 0; i < a->nranks; i++) {
            struct proto_rank_beat *b = &hb->ranks[i];
            *b = (struct proto_rank_beat){0};
            b->rank = a->first_rank + i;
            b->state = PROTO_RANK_RUNNING;
            b->step = a->step;
            /* Measured figures, as trainers report them: doubles that need
             * all 17 digits (and a full strtod) to be read back. */
            const double jitter = (double)((a->step * 2654435761u + b->rank * 40503u) % 100000) / 1e5;
            b->loss = measured ? 2.0 + 1.0 / (double)a->step + jitter / 7.0 : NAN;
            b->tokens_per_s = measured ? 1.0e5 * (0.9 + jitter / 5.0) : 0;
            b->comm_frac = measured ? 0.1 + jitter / 3.0 : 0;
        }
    }
    a->next_beat_ms = now + heartbeat_ms;
    agent_send(a, &m);
}

static void send_rank_exit(struct agent *a)
{
    struct proto_msg m = {.type = PROTO_RANK_EXIT};
    m.u.rank_exit.generation = a->generation;
    m.u.rank_exit.rank = a->first_rank;
    m.u.rank_exit.exit_code = 1;
    snprintf(m.u.rank_exit.reason, sizeof(m.u.rank_exit.reason), "sim-agents: injected rank exit");
    a->generation = 0;
    agent_send(a, &m);
}

static void note_reject(const struct proto_reject *rj)
{
    rejects++;
    for (int i = 0; i < 8; i++) {
        if (strcmp(reject_seen[i], rj->code) == 0)
            return;
        if (!reject_seen[i][0]) {
            snprintf(reject_seen[i], sizeof(reject_seen[i]), "%s", rj->code);
            printf("reject: %s: %s\n", rj->code, rj->reason);
            fflush(stdout);
            return;
        }
    }
}

static void on_msg(struct agent *a, const struct proto_msg *m)
{
    if (m->type == PROTO_HEARTBEAT || m->type == PROTO_WELCOME)
        a->beats_since_answer = 0;
    switch (m->type) {
    case PROTO_CHALLENGE: {
        struct proto_msg r = {.type = PROTO_RESPONSE};
        memcpy(a->bind.daemon_nonce, m->u.challenge.nonce, PROTO_NONCE_LEN);
        if (a->link != LINK_HELLO ||
            !proto_proof_verify(opt.token, opt.token_len, &a->bind, PROTO_SIDE_DAEMON, m->u.challenge.hmac)) {
            agent_down(a, "musterd's proof of the token does not verify");
            return;
        }
        a->ch = proto_channel_new(opt.token, opt.token_len, &a->bind, PROTO_SIDE_AGENT);
        if (!a->ch || proto_proof(opt.token, opt.token_len, &a->bind, PROTO_SIDE_AGENT, r.u.response.hmac) != 0)
            die("cannot compute the proof or the channel's keys");
        a->link = LINK_AUTH;
        agent_send(a, &r);
        a->seal_tx = a->fd >= 0; /* a failed send took the link down */
        return;
    }
    case PROTO_WELCOME:
        a->link = LINK_JOINED;
        joins++;
        if (m->u.welcome.heartbeat_interval_ms)
            heartbeat_ms = m->u.welcome.heartbeat_interval_ms;
        ack_every_ms = proto_ack_every_ms(heartbeat_ms, m->u.welcome.heartbeat_timeout_ms, m->u.welcome.lease_ms);
        send_beat(a, mono_ms());
        /* Agents on separate hosts beat in phases of their own: the next beat
         * comes at a random point of the interval, not with the others that
         * joined in the same moment. */
        a->next_beat_ms -= (uint64_t)(rand() % (int)heartbeat_ms);
        return;
    case PROTO_REJECT:
        note_reject(&m->u.reject);
        agent_down(a, m->u.reject.reason);
        return;
    case PROTO_ASSIGN:
        a->generation = m->u.assign.generation;
        a->nranks = m->u.assign.nranks;
        a->first_rank = m->u.assign.nranks ? m->u.assign.ranks[0].rank : 0;
        a->master_port = m->u.assign.master_port;
        a->gen_beats = 0;
        send_beat(a, mono_ms());
        return;
    case PROTO_COMMAND:
        if (m->u.command.action == PROTO_CMD_STOP)
            a->generation = 0;
        else if (m->u.command.action == PROTO_CMD_SHUTDOWN)
            agent_down(a, "shut down by the daemon");
        return;
    default:
        return; /* heartbeat acks, unique ids, errors: nothing to do */
    }
}

static void on_readable(struct agent *a)
{
    for (;;) {
        if (a->rcap - a->rlen < READ_CHUNK) {
            a->rcap = a->rlen + READ_CHUNK * 2;
            a->rbuf = realloc(a->rbuf, a->rcap);
            if (!a->rbuf)
                die("out of memory");
        }
        ssize_t n = recv(a->fd, a->rbuf + a->rlen, a->rcap - a->rlen, 0);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
            break;
        if (n <= 0) {
            agent_down(a, n == 0 ? "closed by the daemon" : strerror(errno));
            return;
        }
        a->rlen += (size_t)n;
    }
    size_t off = 0;
    while (a->fd >= 0) {
        struct proto_msg m;
        size_t used = 0;
        int rc = a->ch ? proto_open(a->ch, a->rbuf + off, a->rlen - off, &m, &used)
                       : proto_decode(a->rbuf + off, a->rlen - off, &m, &used);
        if (rc == PROTO_NEED_MORE)
            break;
        if (rc < 0) {
            agent_down(a, proto_strerror(rc));
            return;
        }
        off += used;
        on_msg(a, &m);
        proto_msg_clear(&m);
    }
    if (a->fd >= 0) {
        memmove(a->rbuf, a->rbuf + off, a->rlen - off);
        a->rlen -= off;
    }
}

static void run_for(uint64_t ms, int (*done)(void))
{
    uint64_t end = mono_ms() + ms;
    struct epoll_event evs[256];
    for (;;) {
        uint64_t now = mono_ms();
        if (now >= end || (done && done()))
            return;
        for (int i = 0; i < opt.nagents; i++) {
            struct agent *a = &agents[i];
            if (a->link == LINK_DOWN && now >= a->retry_ms)
                agent_connect(a);
            else if (a->link == LINK_JOINED && now >= a->next_beat_ms)
                send_beat(a, now);
        }
        uint64_t wait = end - now < 10 ? end - now : 10;
        int n = epoll_wait(epfd, evs, 256, (int)wait);
        for (int k = 0; k < n; k++) {
            struct agent *a = evs[k].data.ptr;
            if (a->fd < 0)
                continue;
            if (a->link == LINK_CONNECTING && (evs[k].events & (EPOLLOUT | EPOLLERR | EPOLLHUP))) {
                int err = 0;
                socklen_t len = sizeof(err);
                getsockopt(a->fd, SOL_SOCKET, SO_ERROR, &err, &len);
                if (err) {
                    agent_down(a, strerror(err));
                    continue;
                }
                want_out(a, 0);
                send_hello(a);
                continue;
            }
            if (evs[k].events & EPOLLOUT && flush_out(a) != 0) {
                agent_down(a, "send failed");
                continue;
            }
            if (evs[k].events & (EPOLLIN | EPOLLHUP | EPOLLERR))
                on_readable(a);
        }
    }
}

/* ---- what musterd says over REST ------------------------------------- */

/* GET path from the REST port; a malloc'd body, or NULL. */
static char *http_get(const char *path)
{
    struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(opt.http_port)};
    inet_pton(AF_INET, "127.0.0.1", &sin.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return NULL;
    struct timeval tv = {.tv_sec = 2};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
    if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) != 0) {
        close(fd);
        return NULL;
    }
    char req[256];
    int rl = snprintf(req, sizeof(req), "GET %s HTTP/1.0\r\nHost: 127.0.0.1:%u\r\n\r\n", path, opt.http_port);
    if (send(fd, req, (size_t)rl, MSG_NOSIGNAL) != rl) {
        close(fd);
        return NULL;
    }
    size_t len = 0, cap = 65536;
    char *buf = malloc(cap + 1);
    for (;;) {
        if (!buf)
            break;
        if (cap - len < 16384) {
            cap *= 2;
            char *nb = realloc(buf, cap + 1);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        ssize_t n = recv(fd, buf + len, cap - len, 0);
        if (n <= 0)
            break;
        len += (size_t)n;
    }
    close(fd);
    if (!buf)
        return NULL;
    buf[len] = '\0';
    char *body = strstr(buf, "\r\n\r\n");
    if (!body || strncmp(buf, "HTTP/1.", 7) != 0 || strncmp(buf + 9, "200", 3) != 0) {
        free(buf);
        return NULL;
    }
    memmove(buf, body + 4, strlen(body + 4) + 1);
    return buf;
}

/* Wall-clock ms of musterd's generation_running event for gen (0 = not yet). */
static int64_t running_event_ms(uint64_t gen)
{
    char *text = http_get("/v1/events");
    if (!text)
        return 0;
    json_t *doc = json_loads(text, 0, NULL);
    free(text);
    json_t *events = json_object_get(doc, "events");
    int64_t at = 0;
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        const char *kind = json_string_value(json_object_get(e, "kind"));
        const char *when = json_string_value(json_object_get(e, "time"));
        if (!kind || !when || strcmp(kind, "generation_running") != 0 ||
            (uint64_t)json_integer_value(json_object_get(e, "generation")) != gen)
            continue;
        struct tm tm = {0};
        int msec = 0;
        if (sscanf(when, "%d-%d-%dT%d:%d:%d.%dZ", &tm.tm_year, &tm.tm_mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                   &tm.tm_sec, &msec) == 7) {
            tm.tm_year -= 1900;
            tm.tm_mon -= 1;
            at = (int64_t)timegm(&tm) * 1000 + msec;
        }
    }
    json_decref(doc);
    return at;
}

static uint64_t wanted_gen;
static int64_t wanted_at;
static uint64_t next_poll;

static int generation_running(void)
{
    uint64_t now = mono_ms();
    if (now < next_poll)
        return 0;
    next_poll = now + POLL_EVENTS_MS;
    wanted_at = running_event_ms(wanted_gen);
    return wanted_at != 0;
}

/* Waits (serving agents) for generation gen to run; its event's wall ms, or 0. */
static int64_t wait_running(uint64_t gen)
{
    wanted_gen = gen;
    wanted_at = 0;
    next_poll = 0;
    run_for((uint64_t)(opt.timeout_s * 1000), generation_running);
    return wanted_at;
}

/* musterd's CPU seconds, RSS and voluntary context switches (its loop's wakeups, mostly). */
static int proc_sample(double *cpu_s, long *rss_kb, long *wakeups)
{
    char path[64], buf[4096];
    snprintf(path, sizeof(path), "/proc/%d/stat", opt.pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return -1;
    size_t n = fread(buf, 1, sizeof(buf) - 1, f);
    fclose(f);
    buf[n] = '\0';
    char *p = strrchr(buf, ')');
    unsigned long ut = 0, st = 0;
    /* After "pid (comm)": state, then fields 4..; utime and stime are 14 and 15. */
    if (!p || sscanf(p + 2, "%*c %*d %*d %*d %*d %*d %*u %*u %*u %*u %*u %lu %lu", &ut, &st) != 2)
        return -1;
    *cpu_s = (double)(ut + st) / (double)sysconf(_SC_CLK_TCK);
    snprintf(path, sizeof(path), "/proc/%d/status", opt.pid);
    f = fopen(path, "r");
    if (!f)
        return -1;
    *rss_kb = 0;
    *wakeups = 0;
    while (fgets(buf, sizeof(buf), f))
        if (sscanf(buf, "VmRSS: %ld", rss_kb) != 1)
            sscanf(buf, "voluntary_ctxt_switches: %ld", wakeups);
    fclose(f);
    return 0;
}

static int no_phase_left(void) { return 0; }

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: sim-agents --daemon HOST:PORT --http PORT --token-file FILE --agents N [OPTION]...\n"
            "Simulated agents for load tests of musterd (loopback).\n\n"
            "  --ranks R        ranks (devices) per agent (default 8)\n"
            "  --pid PID        musterd's pid: measure its CPU and RSS in steady state\n"
            "  --steady-s S     run S seconds of heartbeats after forming (default 0)\n"
            "  --rank-exit      then report one rank exited and time the recovery\n"
            "  --timeout-s S    give up on a phase after S seconds (default 120)\n"
            "  --prefix NAME    node names are NAME-00000, ... (default sim)\n"
            "  --verbose        say why each connection closed\n"
            "  --ack-all        ask for an answer on every heartbeat, as agents did before\n"
            "                   HEARTBEAT's ack (to measure the difference side by side)\n"
            "  --memory-checkpoints N  name N (1..%d) complete memory checkpoints in every\n"
            "                   heartbeat, as the agents of a memory_checkpoint_mb job do\n", PROTO_MEMCKPT_MAX);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"daemon", required_argument, NULL, 'd'}, {"http", required_argument, NULL, 'H'},
        {"token-file", required_argument, NULL, 't'}, {"agents", required_argument, NULL, 'n'},
        {"ranks", required_argument, NULL, 'r'}, {"pid", required_argument, NULL, 'p'},
        {"steady-s", required_argument, NULL, 's'}, {"rank-exit", no_argument, NULL, 'x'},
        {"timeout-s", required_argument, NULL, 'T'}, {"prefix", required_argument, NULL, 'P'},
        {"verbose", no_argument, NULL, 'v'}, {"ack-all", no_argument, NULL, 'A'},
        {"memory-checkpoints", required_argument, NULL, 'M'},
        {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    const char *token_path = NULL;
    static char host[64];
    char err[512];
    int c;

    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case 'd': {
            const char *colon = strrchr(optarg, ':');
            if (!colon || (size_t)(colon - optarg) >= sizeof(host)) {
                usage(stderr);
                return 2;
            }
            memcpy(host, optarg, (size_t)(colon - optarg));
            opt.daemon_host = host;
            opt.daemon_port = (uint16_t)atoi(colon + 1);
            break;
        }
        case 'H': opt.http_port = (uint16_t)atoi(optarg); break;
        case 't': token_path = optarg; break;
        case 'n': opt.nagents = atoi(optarg); break;
        case 'r': opt.nranks = atoi(optarg); break;
        case 'p': opt.pid = atoi(optarg); break;
        case 's': opt.steady_s = atof(optarg); break;
        case 'x': opt.rank_exit = 1; break;
        case 'T': opt.timeout_s = atof(optarg); break;
        case 'P': opt.prefix = optarg; break;
        case 'v': opt.verbose = 1; break;
        case 'A': opt.ack_all = 1; break;
        case 'M': opt.memckpt = atoi(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!token_path || opt.nagents < 1 || opt.nranks < 1 || opt.nranks > PROTO_MAX_LOCAL_RANKS ||
        opt.memckpt < 0 || opt.memckpt > PROTO_MEMCKPT_MAX ||
        !opt.daemon_port || !opt.http_port) {
        usage(stderr);
        return 2;
    }
    if (token_read(token_path, opt.token, sizeof(opt.token), &opt.token_len, err, sizeof(err)) != 0)
        die("%s", err);
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
        rl.rlim_cur = rl.rlim_max;
        setrlimit(RLIMIT_NOFILE, &rl);
    }
    epfd = epoll_create1(EPOLL_CLOEXEC);
    agents = calloc((size_t)opt.nagents, sizeof(*agents));
    if (epfd < 0 || !agents)
        die("cannot set up: %s", strerror(errno));
    srand((unsigned)getpid());

    int64_t t0 = wall_ms();
    for (int i = 0; i < opt.nagents; i++) {
        snprintf(agents[i].name, sizeof(agents[i].name), "%s-%05d", opt.prefix, i);
        agents[i].fd = -1;
        agent_connect(&agents[i]);
    }
    int64_t t1 = wait_running(1);
    if (!t1) {
        printf("form_ms=timeout (no generation 1 running within %.0f s; %lu joined, %lu closes, %lu rejects)\n",
               opt.timeout_s, joins, closes, rejects);
        return 1;
    }
    printf("form_ms=%lld\n", (long long)(t1 - t0));
    fflush(stdout);

    if (opt.steady_s > 0) {
        long rss = 0, wk = 0; /* wakeups over all windows */
        run_for(2000, no_phase_left); /* let the formation's bursts settle */
        int nwin = (int)(opt.steady_s / STEADY_WINDOW_S);
        nwin = nwin < 1 ? 1 : nwin > STEADY_WINDOWS_MAX ? STEADY_WINDOWS_MAX : nwin;
        const double win_s = opt.steady_s / nwin;
        double pct[STEADY_WINDOWS_MAX];
        for (int w = 0; w < nwin; w++) {
            double cpu0 = 0, cpu1 = 0;
            long wk0 = 0, wk1 = 0;
            uint64_t m0 = mono_ms();
            if (opt.pid && proc_sample(&cpu0, &rss, &wk0) != 0)
                die("cannot read /proc/%d", opt.pid);
            run_for((uint64_t)(win_s * 1000), no_phase_left);
            if (opt.pid && proc_sample(&cpu1, &rss, &wk1) != 0)
                die("cannot read /proc/%d", opt.pid);
            wk += wk1 - wk0;
            pct[w] = 100.0 * (cpu1 - cpu0) / ((double)(mono_ms() - m0) / 1000.0);
        }
        if (opt.pid) {
            qsort(pct, (size_t)nwin, sizeof(pct[0]), cmp_double);
            double median = nwin % 2 ? pct[nwin / 2] : (pct[nwin / 2 - 1] + pct[nwin / 2]) / 2;
            printf("steady_cpu_pct=%.1f\nsteady_cpu_windows=", median);
            for (int w = 0; w < nwin; w++)
                printf("%s%.1f", w ? "," : "", pct[w]);
            printf("\nsteady_rss_kb=%ld\nsteady_wakeups_per_s=%.0f\n", rss, (double)wk / (win_s * nwin));
        }
        fflush(stdout);
    }

    if (opt.rank_exit) {
        /* The middle agent, or the next one that holds ranks (more agents than nodes: some hold none). */
        struct agent *victim = NULL;
        for (int k = 0; k < opt.nagents && !victim; k++) {
            struct agent *a = &agents[(opt.nagents / 2 + k) % opt.nagents];
            if (a->link == LINK_JOINED && a->generation)
                victim = a;
        }
        if (!victim)
            die("no agent holds running ranks to fail");
        uint64_t gen = victim->generation;
        int64_t t2 = wall_ms();
        send_rank_exit(victim);
        int64_t t3 = wait_running(gen + 1);
        if (!t3) {
            printf("recovery_ms=timeout (no generation %llu running within %.0f s)\n", (unsigned long long)gen + 1,
                   opt.timeout_s);
            return 1;
        }
        printf("recovery_ms=%lld\n", (long long)(t3 - t2));
    }
    for (int i = 0; i < opt.nagents; i++) {
        if (agents[i].fd >= 0)
            close(agents[i].fd);
        free(agents[i].rbuf);
        free(agents[i].wbuf);
    }
    free(agents);
    close(epfd);
    return 0;
}
