#include "worker/train/rank.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"

struct rank_ctl {
    int fd;
    pthread_t thread;
    int thread_started;
    pthread_mutex_t lock; /* everything below, and writes to fd */
    pthread_cond_t cond;  /* a unique id arrived, or stop */
    volatile sig_atomic_t *stop; /* the caller's flag (see rank_ctl_open) */
    volatile sig_atomic_t *checkpoints; /* the caller's request count, or NULL */
    int quit;             /* rank_ctl_close asks the thread to end */
    uint64_t generation;
    int rank;
    uint64_t seq;
    int have_uid;
    uint8_t uid[PROTO_UID_LEN];
    int have_beat, beat_sent_once;
    struct proto_rank_beat beat;
    void (*abort_fn)(void *);
    void *abort_arg;
    size_t rlen;
    uint8_t rbuf[PROTO_MAX_FRAME];
};

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int rank_ctl_present(void) { return getenv("MUSTER_CTL_FD") != NULL; }

static int env_int(const char *name, long min, long max, long *out)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !*v)
        return -ENOENT;
    errno = 0;
    long x = strtol(v, &end, 10);
    if (errno || *end || x < min || x > max)
        return -EINVAL;
    *out = x;
    return 0;
}

/* Caller holds the lock (or is the only thread). */
static int send_msg(struct rank_ctl *c, const struct proto_msg *m)
{
    uint8_t buf[PROTO_MAX_FRAME];
    int n = proto_encode(m, buf, sizeof(buf));
    if (n < 0)
        return -EINVAL;
    size_t off = 0;
    while (off < (size_t)n) {
        ssize_t w = send(c->fd, buf + off, (size_t)n - off, MSG_NOSIGNAL); /* a dead agent is EPIPE, not SIGPIPE */
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        off += (size_t)w;
    }
    return 0;
}

/*
 * Reads what is there (waiting at most wait_ms) and decodes one frame into
 * m. Returns 1 with a frame, 0 with none yet, -EPIPE at EOF, other < 0 on
 * a bad stream.
 */
static int read_frame(struct rank_ctl *c, struct proto_msg *m, int wait_ms)
{
    size_t used;
    int rc = proto_decode(c->rbuf, c->rlen, m, &used);
    if (rc == PROTO_NEED_MORE) {
        struct pollfd p = {.fd = c->fd, .events = POLLIN};
        int pr = poll(&p, 1, wait_ms);
        if (pr < 0)
            return errno == EINTR ? 0 : -errno;
        if (pr == 0)
            return 0;
        ssize_t n = read(c->fd, c->rbuf + c->rlen, sizeof(c->rbuf) - c->rlen);
        if (n == 0)
            return -EPIPE;
        if (n < 0)
            return errno == EINTR || errno == EAGAIN ? 0 : -errno;
        c->rlen += (size_t)n;
        rc = proto_decode(c->rbuf, c->rlen, m, &used);
        if (rc == PROTO_NEED_MORE)
            return 0;
    }
    if (rc < 0) {
        log_error("control socket: bad frame from the agent: %s", proto_strerror(rc));
        if (used == 0)
            return -EPROTO;
    }
    memmove(c->rbuf, c->rbuf + used, c->rlen - used);
    c->rlen -= used;
    return rc < 0 ? 0 : 1;
}

static void raise_stop(struct rank_ctl *c, const char *why)
{
    void (*fn)(void *) = NULL;
    void *arg = NULL;
    pthread_mutex_lock(&c->lock);
    if (!*c->stop) {
        log_info("rank %d: stopping: %s", c->rank, why);
        *c->stop = 1;
        fn = c->abort_fn;
        arg = c->abort_arg;
    }
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
    if (fn)
        fn(arg);
}

static void handle(struct rank_ctl *c, const struct proto_msg *m)
{
    switch (m->type) {
    case PROTO_UNIQUE_ID:
        pthread_mutex_lock(&c->lock);
        if (m->u.unique_id.generation == c->generation) {
            memcpy(c->uid, m->u.unique_id.id, PROTO_UID_LEN);
            c->have_uid = 1;
            pthread_cond_broadcast(&c->cond);
        }
        pthread_mutex_unlock(&c->lock);
        break;
    case PROTO_COMMAND:
        if (m->u.command.action == PROTO_CMD_STOP || m->u.command.action == PROTO_CMD_SHUTDOWN)
            raise_stop(c, "the agent said stop");
        else if (m->u.command.action == PROTO_CMD_CHECKPOINT && m->u.command.generation != c->generation)
            log_warn("rank %d: checkpoint request of generation %llu ignored: this rank is of generation %llu",
                     c->rank, (unsigned long long)m->u.command.generation,
                     (unsigned long long)c->generation);
        else if (m->u.command.action == PROTO_CMD_CHECKPOINT && c->checkpoints) {
            pthread_mutex_lock(&c->lock);
            *c->checkpoints = *c->checkpoints + 1;
            pthread_mutex_unlock(&c->lock);
            log_info("rank %d: checkpoint requested; taken at the next step boundary", c->rank);
        } else
            log_warn("rank %d: command %s is not supported by muster-train; ignored", c->rank,
                     proto_command_name(m->u.command.action));
        break;
    case PROTO_ERROR:
        log_warn("rank %d: agent reports %s: %s", c->rank, m->u.error.code, m->u.error.reason);
        break;
    default:
        log_debug("rank %d: %s from the agent ignored", c->rank, proto_type_name(m->type));
        break;
    }
}

static void send_beat_locked(struct rank_ctl *c)
{
    struct proto_msg m = {.type = PROTO_HEARTBEAT};
    m.u.heartbeat.generation = c->generation;
    m.u.heartbeat.seq = ++c->seq;
    m.u.heartbeat.nranks = 1;
    m.u.heartbeat.ranks[0] = c->beat;
    if (send_msg(c, &m) != 0)
        log_debug("rank %d: heartbeat not sent", c->rank);
    c->beat_sent_once = 1;
}

static void *ctl_thread(void *arg)
{
    struct rank_ctl *c = arg;
    uint64_t last_beat = 0;

    for (;;) {
        pthread_mutex_lock(&c->lock);
        int quit = c->quit;
        if (!quit && c->have_beat && now_ms() - last_beat >= RANK_BEAT_MS) {
            send_beat_locked(c);
            last_beat = now_ms();
        }
        pthread_mutex_unlock(&c->lock);
        if (quit)
            break;
        struct proto_msg m;
        int rc = read_frame(c, &m, 100);
        if (rc == 1) {
            handle(c, &m);
            proto_msg_clear(&m);
        } else if (rc < 0) {
            raise_stop(c, rc == -EPIPE ? "the agent is gone (control socket closed)" : "control socket broken");
            break;
        }
    }
    return NULL;
}

int rank_ctl_open(struct rank_ctl **out, struct rank_assign *a, volatile sig_atomic_t *stop, int timeout_ms,
                  char *err, size_t errlen)
{
    long fd, rank, world, gen;
    struct rank_ctl *c;

    if (env_int("MUSTER_CTL_FD", 0, 1 << 20, &fd) != 0 || env_int("RANK", 0, 1 << 20, &rank) != 0 ||
        env_int("WORLD_SIZE", 1, 1 << 20, &world) != 0 || env_int("MUSTER_GENERATION", 1, 1L << 52, &gen) != 0) {
        snprintf(err, errlen,
                 "MUSTER_CTL_FD, RANK, WORLD_SIZE and MUSTER_GENERATION must hold integers: muster-train is "
                 "started by muster-worker (or run it with --standalone)");
        return -EINVAL;
    }
    c = calloc(1, sizeof(*c));
    if (!c)
        return -ENOMEM;
    c->stop = stop;
    c->fd = (int)fd;
    c->rank = (int)rank;
    c->generation = (uint64_t)gen;
    c->beat.rank = (uint32_t)rank;
    c->beat.state = PROTO_RANK_RUNNING;
    c->beat.loss = NAN;
    pthread_mutex_init(&c->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC); /* deadlines on the monotonic clock */
    pthread_cond_init(&c->cond, &ca);
    pthread_condattr_destroy(&ca);

    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    memset(a, 0, sizeof(*a));
    for (;;) {
        struct proto_msg m;
        int left = (int)(deadline > now_ms() ? deadline - now_ms() : 0);
        if (left == 0) {
            snprintf(err, errlen, "no ASSIGN from the agent within %d ms", timeout_ms);
            goto fail;
        }
        int rc = read_frame(c, &m, left < 100 ? left : 100);
        if (rc < 0) {
            snprintf(err, errlen, "control socket (fd %ld): %s before ASSIGN", fd,
                     rc == -EPIPE ? "closed by the agent" : strerror(-rc));
            goto fail;
        }
        if (rc == 0)
            continue;
        if (m.type != PROTO_ASSIGN) {
            handle(c, &m);
            proto_msg_clear(&m);
            continue;
        }
        const struct proto_assign *as = &m.u.assign;
        int slot = -1;
        for (uint32_t i = 0; i < as->nranks; i++)
            if (as->ranks[i].rank == (uint32_t)rank)
                slot = (int)i;
        if (as->generation != (uint64_t)gen || as->world_size != (uint32_t)world || slot < 0) {
            snprintf(err, errlen,
                     "ASSIGN (generation %llu, world size %u) does not hold this rank (RANK=%ld, WORLD_SIZE=%ld, "
                     "MUSTER_GENERATION=%ld)",
                     (unsigned long long)as->generation, as->world_size, rank, world, gen);
            proto_msg_clear(&m);
            goto fail;
        }
        a->generation = as->generation;
        a->rank = (int)rank;
        a->world = (int)world;
        a->local_rank = (int)as->ranks[slot].local_rank;
        a->local_world = (int)as->nranks;
        a->device = (int)as->ranks[slot].device;
        a->job = json_incref(as->job);
        proto_msg_clear(&m);
        break;
    }
    if (pthread_create(&c->thread, NULL, ctl_thread, c) != 0) {
        snprintf(err, errlen, "cannot start the control thread");
        json_decref(a->job);
        a->job = NULL;
        goto fail;
    }
    c->thread_started = 1;
    *out = c;
    return 0;
fail:
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
    return -EPROTO;
}

int rank_ctl_unique_id(struct rank_ctl *c, const uint8_t mine[PROTO_UID_LEN], uint8_t out[PROTO_UID_LEN],
                       int timeout_ms)
{
    struct timespec until;
    int rc = 0;

    clock_gettime(CLOCK_MONOTONIC, &until);
    until.tv_sec += timeout_ms / 1000;
    until.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
    if (until.tv_nsec >= 1000000000L) {
        until.tv_sec++;
        until.tv_nsec -= 1000000000L;
    }
    pthread_mutex_lock(&c->lock);
    if (mine) {
        struct proto_msg m = {.type = PROTO_UNIQUE_ID};
        m.u.unique_id.generation = c->generation;
        memcpy(m.u.unique_id.id, mine, PROTO_UID_LEN);
        rc = send_msg(c, &m);
    }
    while (rc == 0 && !c->have_uid && !*c->stop)
        if (pthread_cond_timedwait(&c->cond, &c->lock, &until) == ETIMEDOUT)
            rc = -ETIMEDOUT;
    if (rc == 0 && *c->stop)
        rc = -ECANCELED;
    if (rc == 0)
        memcpy(out, c->uid, PROTO_UID_LEN);
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void rank_ctl_measured(struct rank_ctl *c, uint64_t step_bytes, uint64_t peak_mem)
{
    pthread_mutex_lock(&c->lock);
    c->beat.step_bytes = step_bytes > PROTO_U64_MAX ? PROTO_U64_MAX : step_bytes;
    c->beat.peak_mem = peak_mem > PROTO_U64_MAX ? PROTO_U64_MAX : peak_mem;
    pthread_mutex_unlock(&c->lock);
}

void rank_ctl_beat(struct rank_ctl *c, uint64_t step, double loss, double tokens_per_s, double comm_frac,
                   uint64_t checkpoint_step)
{
    pthread_mutex_lock(&c->lock);
    c->beat.step = step;
    c->beat.loss = loss;
    c->beat.tokens_per_s = isfinite(tokens_per_s) && tokens_per_s > 0 ? tokens_per_s : 0;
    c->beat.comm_frac = isfinite(comm_frac) ? (comm_frac < 0 ? 0 : comm_frac > 1 ? 1 : comm_frac) : 0;
    c->beat.checkpoint_step = checkpoint_step;
    c->have_beat = 1;
    if (!c->beat_sent_once)
        send_beat_locked(c); /* the first step is news: the job is running */
    pthread_mutex_unlock(&c->lock);
}

void rank_ctl_on_abort(struct rank_ctl *c, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&c->lock);
    c->abort_fn = fn;
    c->abort_arg = arg;
    int stopped = *c->stop;
    pthread_mutex_unlock(&c->lock);
    if (stopped && fn)
        fn(arg);
}

void rank_ctl_on_checkpoint(struct rank_ctl *c, volatile sig_atomic_t *requests)
{
    pthread_mutex_lock(&c->lock);
    c->checkpoints = requests;
    pthread_mutex_unlock(&c->lock);
}


void rank_ctl_close(struct rank_ctl *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    c->quit = 1;
    c->abort_fn = NULL;
    pthread_mutex_unlock(&c->lock);
    if (c->thread_started)
        pthread_join(c->thread, NULL);
    close(c->fd);
    pthread_mutex_destroy(&c->lock);
    pthread_cond_destroy(&c->cond);
    free(c);
}
