/*
 * muster_rank.h: tell muster how a C or C++ training program is doing.
 * One header, libc and POSIX only; see "The rank contract" in PROTOCOL.md.
 *
 * Under muster-worker every rank inherits a control socket, named by the
 * environment variable MUSTER_CTL_FD. These calls speak the rank's side of
 * it: HEARTBEAT frames with the step, loss and throughput, so that muster
 * shows progress and can tell a hung rank from a slow one.
 *
 *     #include "muster_rank.h"
 *
 *     struct muster_rank *mr = muster_rank_open();
 *     for (step = start; step < steps && !muster_rank_stop_requested(mr); step++) {
 *         float loss = train_step();
 *         muster_rank_beat(mr, step + 1, loss, tokens_per_s);
 *     }
 *     muster_rank_close(mr);
 *
 * Outside muster (MUSTER_CTL_FD unset) every call does nothing, so the same
 * program runs anywhere. Nothing here fails into the caller: when the agent
 * goes away (EOF, EPIPE; never SIGPIPE) the first failure is said once on
 * stderr and every later call does nothing. A NULL handle is accepted
 * everywhere.
 *
 * No thread: each call first takes in whatever the agent sent (a
 * non-blocking read; ASSIGN is skipped, COMMAND stop and checkpoint and
 * UNIQUE_ID are kept), so call one of them regularly (once a step is
 * plenty) and the agent's writes never back up. HEARTBEAT frames are sent
 * at most once per MUSTER_RANK_BEAT_MS; a beat held back goes out with the
 * first call after that. Writes block, as the agent always reads. The
 * handle is not thread-safe: call it from one thread, or under a lock.
 *
 * Needs POSIX.1-2008 (compile with -D_POSIX_C_SOURCE=200809L or
 * _GNU_SOURCE when in a strict -std=c11 mode; GCC's and Clang's default
 * modes have it). Everything is static inline, prefixed muster_rank_.
 */
#ifndef MUSTER_RANK_H
#define MUSTER_RANK_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MUSTER_RANK_BEAT_MS 100  /* at most one HEARTBEAT per this many ms */
#define MUSTER_RANK_UID_LEN 128  /* communicator unique id, bytes */

/* Wire constants (PROTOCOL.md, "Frames"). */
#define MUSTER_RANK_VERSION 2
#define MUSTER_RANK_MAX_PAYLOAD (256u * 1024u)
#define MUSTER_RANK_T_UNIQUE_ID 7
#define MUSTER_RANK_T_HEARTBEAT 8
#define MUSTER_RANK_T_COMMAND 10
#define MUSTER_RANK_U64_MAX ((UINT64_C(1) << 53) - 1)

/* Fields are private: use the functions. */
struct muster_rank {
    int fd;              /* control socket; -1 when inactive */
    uint64_t generation; /* MUSTER_GENERATION, sent in every frame */
    uint32_t rank;       /* RANK, the entry's global rank */
    uint64_t seq;        /* last HEARTBEAT sequence number sent */

    /* The latest beat, and whether it still has to go out. */
    uint64_t step, checkpoint_step;
    double loss, tokens_per_s, comm_frac;
    int have_beat, pending;
    uint64_t sent_ms; /* when the last HEARTBEAT went out */

    /* What the agent said. */
    int stop, checkpoint_asked, have_uid;
    uint8_t uid[MUSTER_RANK_UID_LEN];

    /* The frame being read: its header, then its payload, which is kept
     * (NUL-terminated) only for the small frames acted upon. */
    uint8_t head[8];
    size_t head_len;
    uint32_t body_len, body_left;
    unsigned type;
    int keep;
    char body[512];
};

static inline uint64_t muster_rank_now_ms_(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Stops speaking for good; why (if not NULL) is said once on stderr. */
static inline void muster_rank_gone_(struct muster_rank *r, const char *why, int agent_gone)
{
    if (r->fd < 0)
        return;
    if (why)
        fprintf(stderr, "muster_rank: %s; progress is no longer reported\n", why);
    if (agent_gone)
        r->stop = 1;
    close(r->fd);
    r->fd = -1;
}

/* An environment variable holding an integer in [0, max]; says on stderr when not. */
static inline int muster_rank_env_u64_(const char *name, uint64_t max, uint64_t *out)
{
    const char *v = getenv(name);
    char *end = NULL;
    unsigned long long n = 0;
    errno = 0;
    if (v && *v >= '0' && *v <= '9')
        n = strtoull(v, &end, 10);
    if (!end || *end || errno || n > max) {
        fprintf(stderr, "muster_rank: %s: expected an integer in [0, %" PRIu64 "], got '%s'; "
                        "progress is not reported\n", name, max, v ? v : "");
        return -1;
    }
    *out = n;
    return 0;
}

/*
 * The rank's link to its agent. Takes over the socket MUSTER_CTL_FD names
 * (close-on-exec from now on) and unsets MUSTER_CTL_FD, so that child
 * processes do not take it for theirs. When MUSTER_CTL_FD is unset, or it,
 * RANK or MUSTER_GENERATION is unusable (said on stderr), the handle is
 * inactive. NULL only when out of memory; every call accepts NULL.
 */
static inline struct muster_rank *muster_rank_open(void)
{
    struct muster_rank *r = (struct muster_rank *)calloc(1, sizeof(*r));
    uint64_t fd, gen, rank;
    if (!r)
        return NULL;
    r->fd = -1;
    const char *ctl = getenv("MUSTER_CTL_FD");
    if (!ctl || !*ctl)
        return r;
    if (muster_rank_env_u64_("MUSTER_CTL_FD", INT32_MAX, &fd) || muster_rank_env_u64_("RANK", UINT32_MAX, &rank) ||
        muster_rank_env_u64_("MUSTER_GENERATION", MUSTER_RANK_U64_MAX, &gen))
        return r;
    int type;
    socklen_t len = sizeof(type);
    if (getsockopt((int)fd, SOL_SOCKET, SO_TYPE, &type, &len) != 0) {
        fprintf(stderr, "muster_rank: MUSTER_CTL_FD=%d is not a socket (%s); progress is not reported\n", (int)fd,
                strerror(errno));
        return r;
    }
    fcntl((int)fd, F_SETFD, FD_CLOEXEC);
    unsetenv("MUSTER_CTL_FD");
    r->fd = (int)fd;
    r->generation = gen;
    r->rank = (uint32_t)rank;
    r->loss = NAN;
    return r;
}

/* Writes all of buf (blocking; EINTR and a non-blocking socket are waited out). */
static inline int muster_rank_write_(struct muster_rank *r, const char *buf, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t n = send(r->fd, buf + off, len - off, MSG_NOSIGNAL);
        if (n >= 0) {
            off += (size_t)n;
            continue;
        }
        if (errno == EINTR)
            continue;
        int err = errno;
        if (err == EAGAIN || err == EWOULDBLOCK) {
            struct pollfd p = {r->fd, POLLOUT, 0};
            poll(&p, 1, -1);
            continue;
        }
        char why[128];
        snprintf(why, sizeof(why), "cannot write to the control socket: %s", strerror(err));
        muster_rank_gone_(r, why, err == EPIPE || err == ECONNRESET);
        return -1;
    }
    return 0;
}

/* Frame header + payload: length, version, type, all big-endian. */
static inline int muster_rank_send_(struct muster_rank *r, unsigned type, const char *payload, size_t len)
{
    char frame[1024];
    if (len > sizeof(frame) - 8)
        return -1;
    frame[0] = (char)(len >> 24), frame[1] = (char)(len >> 16), frame[2] = (char)(len >> 8), frame[3] = (char)len;
    frame[4] = 0, frame[5] = MUSTER_RANK_VERSION, frame[6] = 0, frame[7] = (char)type;
    memcpy(frame + 8, payload, len);
    return muster_rank_write_(r, frame, len + 8);
}

/* A real as JSON: 17 significant digits (bit for bit), null when not finite. */
static inline void muster_rank_real_(char *out, size_t cap, double x)
{
    if (!isfinite(x)) {
        snprintf(out, cap, "null");
        return;
    }
    snprintf(out, cap, "%.17g", x);
    /* A locale set by the program may have made the decimal point a comma. */
    for (char *p = out; *p; p++)
        if (*p == ',')
            *p = '.';
}

static inline void muster_rank_send_beat_(struct muster_rank *r)
{
    char loss[32], tps[32], comm[32], ckpt[48] = "", json[512];
    muster_rank_real_(loss, sizeof(loss), r->loss);
    muster_rank_real_(tps, sizeof(tps), r->tokens_per_s);
    muster_rank_real_(comm, sizeof(comm), r->comm_frac);
    if (r->checkpoint_step)
        snprintf(ckpt, sizeof(ckpt), ",\"checkpoint_step\":%" PRIu64, r->checkpoint_step);
    int n = snprintf(json, sizeof(json),
                     "{\"generation\":%" PRIu64 ",\"seq\":%" PRIu64 ",\"ranks\":[{\"rank\":%" PRIu32
                     ",\"state\":\"running\",\"step\":%" PRIu64 ",\"loss\":%s,\"tokens_per_s\":%s,"
                     "\"comm_frac\":%s%s}]}",
                     r->generation, r->seq + 1, r->rank, r->step, loss, tps, comm, ckpt);
    r->pending = 0;
    r->sent_ms = muster_rank_now_ms_();
    if (n > 0 && (size_t)n < sizeof(json) && muster_rank_send_(r, MUSTER_RANK_T_HEARTBEAT, json, (size_t)n) == 0)
        r->seq++;
}

/* Where "key" (quoted) is followed by ':' in the payload: the value's first byte, or NULL. */
static inline const char *muster_rank_json_value_(const char *json, const char *key)
{
    size_t klen = strlen(key);
    for (const char *p = strchr(json, '"'); p; p = strchr(p + 1, '"')) {
        if (strncmp(p + 1, key, klen) != 0 || p[1 + klen] != '"')
            continue;
        const char *v = p + 2 + klen;
        v += strspn(v, " \t\r\n");
        if (*v != ':')
            continue;
        v++;
        return v + strspn(v, " \t\r\n");
    }
    return NULL;
}

static inline int muster_rank_hex_(char c)
{
    return c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
}

/* A whole COMMAND or UNIQUE_ID payload is in r->body. */
static inline void muster_rank_on_frame_(struct muster_rank *r)
{
    const char *v;
    if (r->type == MUSTER_RANK_T_COMMAND && (v = muster_rank_json_value_(r->body, "action"))) {
        if (strncmp(v, "\"stop\"", 6) == 0)
            r->stop = 1;
        else if (strncmp(v, "\"checkpoint\"", 12) == 0)
            r->checkpoint_asked = 1;
        return;
    }
    const char *g = muster_rank_json_value_(r->body, "generation");
    if (r->type != MUSTER_RANK_T_UNIQUE_ID || !g || strtoull(g, NULL, 10) != r->generation ||
        !(v = muster_rank_json_value_(r->body, "id")) || *v++ != '"')
        return;
    uint8_t id[MUSTER_RANK_UID_LEN];
    for (size_t i = 0; i < sizeof(id); i++) {
        int hi = muster_rank_hex_(v[2 * i]), lo = hi < 0 ? -1 : muster_rank_hex_(v[2 * i + 1]);
        if (lo < 0)
            return;
        id[i] = (uint8_t)(hi << 4 | lo);
    }
    memcpy(r->uid, id, sizeof(id));
    r->have_uid = 1;
}

/* Feeds bytes from the socket through the frame reader. */
static inline void muster_rank_feed_(struct muster_rank *r, const uint8_t *p, size_t n)
{
    while (n > 0 && r->fd >= 0) {
        if (r->head_len < sizeof(r->head)) {
            size_t k = sizeof(r->head) - r->head_len < n ? sizeof(r->head) - r->head_len : n;
            memcpy(r->head + r->head_len, p, k);
            r->head_len += k, p += k, n -= k;
            if (r->head_len < sizeof(r->head))
                return;
            const uint8_t *h = r->head;
            r->body_len = r->body_left = (uint32_t)h[0] << 24 | (uint32_t)h[1] << 16 | (uint32_t)h[2] << 8 | h[3];
            r->type = (unsigned)h[6] << 8 | h[7];
            if (r->body_len > MUSTER_RANK_MAX_PAYLOAD || h[4] != 0 || h[5] != MUSTER_RANK_VERSION) {
                muster_rank_gone_(r, "the agent sent a frame this client does not speak", 0);
                return;
            }
            r->keep = (r->type == MUSTER_RANK_T_COMMAND || r->type == MUSTER_RANK_T_UNIQUE_ID) &&
                      r->body_len < sizeof(r->body);
        }
        size_t k = r->body_left < n ? r->body_left : n;
        if (r->keep)
            memcpy(r->body + (r->body_len - r->body_left), p, k);
        r->body_left -= (uint32_t)k, p += k, n -= k;
        if (r->body_left > 0)
            return;
        if (r->keep) {
            r->body[r->body_len] = '\0';
            muster_rank_on_frame_(r);
        }
        r->head_len = 0;
    }
}

/* Takes in what the agent sent (never blocks), then sends a held-back beat that is due. */
static inline void muster_rank_pump_(struct muster_rank *r)
{
    uint8_t buf[4096];
    while (r->fd >= 0) {
        struct pollfd p = {r->fd, POLLIN, 0};
        if (poll(&p, 1, 0) <= 0)
            break;
        ssize_t n = recv(r->fd, buf, sizeof(buf), 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK))
            continue;
        if (n <= 0) {
            char why[128] = "the agent closed the control socket";
            if (n < 0)
                snprintf(why, sizeof(why), "cannot read the control socket: %s", strerror(errno));
            muster_rank_gone_(r, why, 1);
            return;
        }
        muster_rank_feed_(r, buf, (size_t)n);
    }
    if (r->fd >= 0 && r->pending && muster_rank_now_ms_() - r->sent_ms >= MUSTER_RANK_BEAT_MS)
        muster_rank_send_beat_(r);
}

/* 1 while the handle speaks to an agent. */
static inline int muster_rank_active(const struct muster_rank *r)
{
    return r && r->fd >= 0;
}

/*
 * Progress after a step: step is the last completed optimizer step, loss
 * NaN or infinite is sent as null, tokens_per_s is this rank's throughput
 * (clamped to >= 0).
 */
static inline void muster_rank_beat(struct muster_rank *r, uint64_t step, double loss, double tokens_per_s)
{
    if (!muster_rank_active(r))
        return;
    r->step = step < MUSTER_RANK_U64_MAX ? step : MUSTER_RANK_U64_MAX;
    r->loss = loss;
    r->tokens_per_s = isfinite(tokens_per_s) && tokens_per_s > 0 ? tokens_per_s : 0;
    if (!r->have_beat)
        r->sent_ms = muster_rank_now_ms_() - MUSTER_RANK_BEAT_MS; /* the first beat goes out at once */
    r->have_beat = r->pending = 1;
    muster_rank_pump_(r);
}

/* Share of step time spent waiting on communication (0..1), sent with later beats. */
static inline void muster_rank_comm_frac(struct muster_rank *r, double frac)
{
    if (!muster_rank_active(r))
        return;
    r->comm_frac = isfinite(frac) ? (frac < 0 ? 0 : frac > 1 ? 1 : frac) : 0;
    r->pending = r->have_beat;
    muster_rank_pump_(r);
}

/*
 * The step of the last checkpoint that is complete on disk (all ranks); sent
 * with the following beats. musterd records the one rank 0 reports.
 */
static inline void muster_rank_checkpoint(struct muster_rank *r, uint64_t step)
{
    if (!muster_rank_active(r))
        return;
    r->checkpoint_step = step < MUSTER_RANK_U64_MAX ? step : MUSTER_RANK_U64_MAX;
    r->pending = r->have_beat;
    muster_rank_pump_(r);
}

/* 1 once the agent said COMMAND stop, or went away. */
static inline int muster_rank_stop_requested(struct muster_rank *r)
{
    if (!r)
        return 0;
    muster_rank_pump_(r);
    return r->stop;
}

/* 1 when the agent asked for a checkpoint (COMMAND checkpoint) since the last call. */
static inline int muster_rank_checkpoint_requested(struct muster_rank *r)
{
    if (!r)
        return 0;
    muster_rank_pump_(r);
    int asked = r->checkpoint_asked;
    r->checkpoint_asked = 0;
    return asked;
}

/*
 * The communicator's unique id of this generation into out. Global rank 0
 * passes the id it created (mine, MUSTER_RANK_UID_LEN bytes; others pass
 * NULL); it goes up to musterd, which hands it to every rank. Waits at most
 * timeout_ms (< 0: until it comes). 0 when out holds the id; -1 when the
 * handle is inactive, the agent went away, or the time ran out.
 */
static inline int muster_rank_unique_id(struct muster_rank *r, const uint8_t *mine, uint8_t *out, int timeout_ms)
{
    if (!muster_rank_active(r))
        return -1;
    if (mine) {
        char json[64 + 2 * MUSTER_RANK_UID_LEN];
        int n = snprintf(json, sizeof(json), "{\"generation\":%" PRIu64 ",\"id\":\"", r->generation);
        for (size_t i = 0; i < MUSTER_RANK_UID_LEN; i++)
            n += snprintf(json + n, sizeof(json) - (size_t)n, "%02x", mine[i]);
        n += snprintf(json + n, sizeof(json) - (size_t)n, "\"}");
        if (muster_rank_send_(r, MUSTER_RANK_T_UNIQUE_ID, json, (size_t)n) != 0)
            return -1;
    }
    uint64_t start = muster_rank_now_ms_();
    for (;;) {
        muster_rank_pump_(r);
        if (r->have_uid) {
            memcpy(out, r->uid, MUSTER_RANK_UID_LEN);
            return 0;
        }
        uint64_t waited = muster_rank_now_ms_() - start;
        if (r->fd < 0 || (timeout_ms >= 0 && waited >= (uint64_t)timeout_ms))
            return -1;
        struct pollfd p = {r->fd, POLLIN, 0};
        int wait = timeout_ms < 0 || timeout_ms - (int)waited > MUSTER_RANK_BEAT_MS ? MUSTER_RANK_BEAT_MS
                                                                                   : timeout_ms - (int)waited;
        poll(&p, 1, wait);
    }
}

/* Sends a held-back beat, closes the socket and frees the handle. */
static inline void muster_rank_close(struct muster_rank *r)
{
    if (!r)
        return;
    if (r->fd >= 0 && r->pending)
        muster_rank_send_beat_(r);
    muster_rank_gone_(r, NULL, 0);
    free(r);
}

#endif
