#include "worker/train/rank.h"

#include <errno.h>
#include <math.h>
#include <poll.h>
#include <stdatomic.h>
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
    atomic_int superseded; /* stopped, or a newer generation came: a formation under way is moot */
    volatile sig_atomic_t *checkpoints; /* the caller's request count, or NULL */
    volatile sig_atomic_t *yield;       /* the caller's yield flag, or NULL */
    int quit;             /* rank_ctl_close asks the thread to end */
    uint64_t generation;  /* the newest this rank was given (ASSIGN) */
    uint64_t joined;      /* the one the training thread works in (rank_ctl_next_generation) */
    int rank;
    uint64_t seq;
    struct rank_assign next; /* the newest generation's place of this rank (job: NULL) */
    int have_uid;
    uint8_t uid[PROTO_UID_LEN];
    int have_beat, beat_sent_once;
    int beat_unsent;      /* the beat changed since it was last sent: rank_ctl_close sends it */
    struct proto_rank_beat beat;
    uint64_t step_changed_ms; /* when beat.step last changed, or the generation began (step_age_ms) */
    /* The time split's window under way (its ms, its collective ms, its
     * steps): closed into beat.split_* once RANK_SPLIT_MS long. */
    uint64_t split_ms, split_comm_ms, split_steps;
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

/* Caller holds the lock. The hook runs under it, so that rank_ctl_on_abort
 * (which takes it) returns only once no call of the old hook is under way. */
static void abort_locked(struct rank_ctl *c)
{
    if (c->abort_fn)
        c->abort_fn(c->abort_arg);
}

static void raise_stop(struct rank_ctl *c, const char *why)
{
    pthread_mutex_lock(&c->lock);
    if (!*c->stop) {
        log_info("rank %d: stopping: %s", c->rank, why);
        *c->stop = 1;
        atomic_store(&c->superseded, 1);
        abort_locked(c);
    }
    pthread_cond_broadcast(&c->cond);
    pthread_mutex_unlock(&c->lock);
}

/*
 * A newer generation's ASSIGN after the first one. A rank that rejoins
 * takes it when it has a slot for this rank's local rank (its device),
 * whatever its global rank and world size become there: the
 * generation is switched at once (its unique id may follow right behind),
 * the communicator aborted, and the training thread finds the generation in
 * rank_ctl_next_generation. Any other reassignment stops the rank: its
 * agent starts a fresh process for it.
 */
static void on_new_assign(struct rank_ctl *c, const struct proto_assign *as)
{
    int slot = -1;
    for (uint32_t i = 0; i < as->nranks; i++)
        if (as->ranks[i].local_rank == (uint32_t)c->next.local_rank)
            slot = (int)i;
    pthread_mutex_lock(&c->lock);
    int rejoin = c->beat.rejoin;
    if (as->generation <= c->generation) {
        pthread_mutex_unlock(&c->lock);
        log_debug("rank %d: ASSIGN of generation %llu ignored (this rank is in %llu)", c->rank,
                  (unsigned long long)as->generation, (unsigned long long)c->generation);
        return;
    }
    if (rejoin && slot >= 0) {
        const struct proto_rank_slot *sl = &as->ranks[slot];
        log_info("rank %d: generation %llu: rejoining in place as rank %u of %u", c->rank,
                 (unsigned long long)as->generation, sl->rank, as->world_size);
        c->generation = as->generation;
        c->next.generation = as->generation;
        c->next.rank = (int)sl->rank;
        c->next.world = (int)as->world_size;
        c->next.local_world = (int)as->nranks;
        c->next.node_rank = (int)as->node_rank;
        c->next.nnodes = (int)as->nnodes;
        c->next.device = (int)sl->device;
        c->rank = (int)sl->rank;
        c->beat.rank = sl->rank;
        c->have_uid = 0;
        c->beat.restore_from = PROTO_RESTORE_NONE;
        c->beat.restore_step = 0;
        c->beat.yielded = 0; /* of the generation before */
        c->step_changed_ms = now_ms();
        atomic_store(&c->superseded, 1);
        abort_locked(c);
        pthread_cond_broadcast(&c->cond);
        pthread_mutex_unlock(&c->lock);
        return;
    }
    pthread_mutex_unlock(&c->lock);
    raise_stop(c, rejoin ? "the new generation has no slot for this rank's device" : "a new generation was assigned");
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
    case PROTO_ASSIGN:
        on_new_assign(c, &m->u.assign);
        break;
    case PROTO_COMMAND:
        if (m->u.command.action == PROTO_CMD_STOP || m->u.command.action == PROTO_CMD_SHUTDOWN)
            raise_stop(c, "the agent said stop");
        else if (m->u.command.action == PROTO_CMD_PARK) {
            pthread_mutex_lock(&c->lock);
            if (c->beat.rejoin) {
                log_info("rank %d: generation %llu is over; waiting for the next one", c->rank,
                         (unsigned long long)c->joined);
                abort_locked(c);
            }
            int rejoin = c->beat.rejoin;
            pthread_mutex_unlock(&c->lock);
            if (!rejoin)
                raise_stop(c, "the generation is over and this rank cannot rejoin");
        }
        else if (m->u.command.action == PROTO_CMD_YIELD) {
            pthread_mutex_lock(&c->lock);
            int mine = c->yield && m->u.command.generation == c->joined && c->generation == c->joined;
            if (mine)
                *c->yield = 1;
            pthread_mutex_unlock(&c->lock);
            if (mine)
                log_info("rank %d: the job grows; leaving generation %llu at the next step boundary", c->rank,
                         (unsigned long long)m->u.command.generation);
            else
                log_debug("rank %d: yield of generation %llu ignored", c->rank,
                          (unsigned long long)m->u.command.generation);
        }
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
    struct proto_msg m;
    proto_heartbeat_start(&m); /* one entry, copied in whole: the other 63 are not written */
    m.u.heartbeat.generation = c->generation;
    m.u.heartbeat.seq = ++c->seq;
    m.u.heartbeat.nranks = 1;
    m.u.heartbeat.ranks[0] = c->beat;
    m.u.heartbeat.ranks[0].has_step_age = 1; /* musterd counts progress by this clock (PROTOCOL.md) */
    m.u.heartbeat.ranks[0].step_age_ms = now_ms() - c->step_changed_ms;
    if (send_msg(c, &m) != 0)
        log_debug("rank %d: heartbeat not sent", c->rank);
    c->beat_sent_once = 1;
    c->beat_unsent = 0;
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
    c->generation = c->joined = (uint64_t)gen;
    c->beat.rank = (uint32_t)rank;
    c->beat.state = PROTO_RANK_RUNNING;
    c->beat.loss = NAN;
    c->step_changed_ms = now_ms();
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
        a->node_rank = (int)as->node_rank;
        a->nnodes = (int)as->nnodes;
        c->next = *a;
        c->next.job = NULL;
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
    if (mine && c->generation == c->joined) {
        struct proto_msg m = {.type = PROTO_UNIQUE_ID};
        m.u.unique_id.generation = c->joined;
        memcpy(m.u.unique_id.id, mine, PROTO_UID_LEN);
        rc = send_msg(c, &m);
    }
    while (rc == 0 && !c->have_uid && !*c->stop && c->generation == c->joined)
        if (pthread_cond_timedwait(&c->cond, &c->lock, &until) == ETIMEDOUT)
            rc = -ETIMEDOUT;
    if (rc == 0 && *c->stop)
        rc = -ECANCELED;
    else if (rc == 0 && c->generation != c->joined)
        rc = -EAGAIN; /* a newer generation came: rank_ctl_next_generation */
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

/* The time split from muster-train's own timers: of the steps' wall time,
 * the share its collectives took (comm_frac, which includes waiting for the
 * slowest peer) and the rest, computing (data loading included); windows of
 * at least RANK_SPLIT_MS, of whole steps. Called with the lock held. */
static void note_split(struct rank_ctl *c, uint64_t ms, double comm_frac, uint64_t steps)
{
    if (!isfinite(comm_frac) || comm_frac < 0)
        comm_frac = 0;
    c->split_ms += ms;
    c->split_comm_ms += (uint64_t)((comm_frac > 1 ? 1 : comm_frac) * (double)ms);
    c->split_steps += steps;
    if (c->split_ms < RANK_SPLIT_MS)
        return;
    const double s = (double)c->split_ms / 1000.0;
    c->beat.split_s = s < PROTO_SPLIT_S_MAX ? s : PROTO_SPLIT_S_MAX;
    c->beat.split_steps = c->split_steps;
    const double comm = (double)c->split_comm_ms / (double)c->split_ms;
    c->beat.split[PROTO_SPLIT_COLLECTIVE] = comm;
    c->beat.split[PROTO_SPLIT_COMPUTE] = 1 - comm;
    c->beat.split[PROTO_SPLIT_GPU] = c->beat.split[PROTO_SPLIT_DATA] = 0;
    c->split_ms = c->split_comm_ms = c->split_steps = 0;
}

void rank_ctl_beat(struct rank_ctl *c, uint64_t step, double loss, double tokens_per_s, double comm_frac,
                   uint64_t checkpoint_step)
{
    pthread_mutex_lock(&c->lock);
    if (step != c->beat.step || !c->have_beat) {
        const uint64_t t = now_ms();
        /* A step's time: since the one before (not the first after a start, which loads too). */
        if (c->have_beat && step > c->beat.step) {
            c->beat.step_s = (double)(t - c->step_changed_ms) / 1000.0 / (double)(step - c->beat.step);
            note_split(c, t - c->step_changed_ms, comm_frac, step - c->beat.step);
        }
        c->step_changed_ms = t;
    }
    c->beat.step = step;
    c->beat.loss = loss;
    c->beat.tokens_per_s = isfinite(tokens_per_s) && tokens_per_s > 0 ? tokens_per_s : 0;
    c->beat.comm_frac = isfinite(comm_frac) ? (comm_frac < 0 ? 0 : comm_frac > 1 ? 1 : comm_frac) : 0;
    c->beat.checkpoint_step = checkpoint_step;
    c->have_beat = 1;
    c->beat_unsent = 1;
    if (!c->beat_sent_once)
        send_beat_locked(c); /* the first step is news: the job is running */
    pthread_mutex_unlock(&c->lock);
}

void rank_ctl_on_abort(struct rank_ctl *c, void (*fn)(void *arg), void *arg)
{
    pthread_mutex_lock(&c->lock);
    c->abort_fn = fn;
    c->abort_arg = arg;
    if (*c->stop || c->generation != c->joined)
        abort_locked(c); /* already stopped, or already a newer generation's */
    pthread_mutex_unlock(&c->lock);
}

const atomic_int *rank_ctl_superseded(struct rank_ctl *c) { return &c->superseded; }

void rank_ctl_set_rejoin(struct rank_ctl *c)
{
    pthread_mutex_lock(&c->lock);
    c->beat.rejoin = 1;
    pthread_mutex_unlock(&c->lock);
}

int rank_ctl_next_generation(struct rank_ctl *c, struct rank_assign *a)
{
    int rc = 0;
    pthread_mutex_lock(&c->lock);
    while (!*c->stop && c->generation == c->joined)
        pthread_cond_wait(&c->cond, &c->lock);
    if (*c->stop) {
        rc = -ECANCELED;
    } else {
        c->joined = c->generation;
        atomic_store(&c->superseded, 0);
        c->beat.yielded = 0;
        if (c->yield)
            *c->yield = 0;
        *a = c->next;
        a->job = NULL;
    }
    pthread_mutex_unlock(&c->lock);
    return rc;
}

void rank_ctl_restored(struct rank_ctl *c, enum proto_restore from, uint64_t step)
{
    pthread_mutex_lock(&c->lock);
    c->beat.restore_from = from;
    c->beat.restore_step = step;
    c->beat.step = step;
    send_beat_locked(c); /* news: the daemon reports where the state came from */
    pthread_mutex_unlock(&c->lock);
}

void rank_ctl_on_checkpoint(struct rank_ctl *c, volatile sig_atomic_t *requests)
{
    pthread_mutex_lock(&c->lock);
    c->checkpoints = requests;
    pthread_mutex_unlock(&c->lock);
}

void rank_ctl_on_yield(struct rank_ctl *c, volatile sig_atomic_t *flag)
{
    pthread_mutex_lock(&c->lock);
    c->yield = flag;
    pthread_mutex_unlock(&c->lock);
}

void rank_ctl_yielded(struct rank_ctl *c)
{
    pthread_mutex_lock(&c->lock);
    c->beat.yielded = 1;
    send_beat_locked(c); /* news: the daemon grows the job once every rank has said it */
    pthread_mutex_unlock(&c->lock);
}


void rank_ctl_close(struct rank_ctl *c)
{
    if (!c)
        return;
    pthread_mutex_lock(&c->lock);
    /* The last step reaches the agent before the exit does: a completed job
     * shows its last step, not the one of the beat before. */
    if (c->beat_unsent)
        send_beat_locked(c);
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
