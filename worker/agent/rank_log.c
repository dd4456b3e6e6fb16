#include "worker/agent/rank_log.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include "common/log.h"
#include "common/mkdirs.h"

/* ---- writing ----------------------------------------------------------- */

static int path_in(char *out, size_t cap, const char *dir, const char *name)
{
    return snprintf(out, cap, "%s/%s", dir, name) < (int)cap ? 0 : -ENAMETOOLONG;
}

/*
 * The offset text of output.log.offset: decimal digits and a newline, at
 * most PROTO_U64_MAX (the wire's largest number: the rank can write this
 * file, and an offset the daemon cannot be told would leave a request
 * unanswered). 0 with *v set, or -EDOM.
 */
static int parse_base(const char *text, size_t n, uint64_t *v)
{
    uint64_t x = 0;
    size_t i = 0;
    for (; i < n && text[i] >= '0' && text[i] <= '9'; i++) {
        x = x * 10 + (uint64_t)(text[i] - '0');
        if (x > PROTO_U64_MAX)
            return -EDOM;
    }
    if (i == 0 || (i < n && !(text[i] == '\n' && i + 1 == n)))
        return -EDOM;
    *v = x;
    return 0;
}

/* What the writer goes on from: the recorded offset, 0 when there is none or it is not valid. */
static uint64_t read_base(const char *dir)
{
    char path[PATH_MAX + 32], text[32];
    uint64_t v = 0;
    if (path_in(path, sizeof(path), dir, RANK_LOG_OFFSET) != 0)
        return 0;
    int fd = open_regular_file(path, O_RDONLY, 0);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, text, sizeof(text));
    close(fd);
    return n > 0 && parse_base(text, (size_t)n, &v) == 0 ? v : 0;
}

/* Written aside and renamed, so a reader finds the old value or the new one. */
static int write_base(const char *dir, uint64_t base)
{
    char path[PATH_MAX + 32], tmp[PATH_MAX + 32], text[32];
    if (path_in(path, sizeof(path), dir, RANK_LOG_OFFSET) != 0 ||
        path_in(tmp, sizeof(tmp), dir, RANK_LOG_OFFSET ".tmp") != 0)
        return -ENAMETOOLONG;
    int fd = open_regular_file(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (fd < 0)
        return -errno;
    int len = snprintf(text, sizeof(text), "%" PRIu64 "\n", base);
    int rc = write(fd, text, (size_t)len) == len ? 0 : -(errno ? errno : EIO);
    if (close(fd) != 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) != 0)
        rc = -errno;
    if (rc != 0)
        unlink(tmp);
    return rc;
}

static int open_current(struct rank_log *l, int extra_flags)
{
    char path[PATH_MAX + 32];
    if (path_in(path, sizeof(path), l->dir, RANK_LOG_FILE) != 0)
        return -ENAMETOOLONG;
    l->fd = open_regular_file(path, O_WRONLY | O_CREAT | O_APPEND | extra_flags, 0600);
    return l->fd < 0 ? -errno : 0;
}

void rank_log_init(struct rank_log *l)
{
    memset(l, 0, sizeof(*l));
    l->fd = -1;
}

int rank_log_open(struct rank_log *l, const char *dir, uint32_t rank, uint64_t cap)
{
    rank_log_init(l);
    l->rank = rank;
    l->cap = cap;
    if (!dir[0] || cap == 0)
        return 0;
    snprintf(l->dir, sizeof(l->dir), "%s", dir);
    /* A generation started again (COMMAND start) goes on where its log ended. */
    int rc = open_current(l, 0);
    struct stat st;
    if (rc == 0 && fstat(l->fd, &st) != 0)
        rc = -errno;
    if (rc != 0) {
        log_warn("rank %u: cannot open its log in %s: %s; its output is not kept", rank, dir, strerror(-rc));
        rank_log_close(l);
        return rc;
    }
    l->size = (uint64_t)st.st_size;
    l->base = read_base(dir);
    return 0;
}

bool rank_log_must_rotate(uint64_t size, uint64_t add, uint64_t cap)
{
    return size > 0 && add > cap - (size < cap ? size : cap);
}

/* output.log -> output.log.1, the new file's offset recorded, a new output.log. */
static int rotate(struct rank_log *l)
{
    char cur[PATH_MAX + 32], old[PATH_MAX + 32];
    close(l->fd);
    l->fd = -1;
    if (path_in(cur, sizeof(cur), l->dir, RANK_LOG_FILE) != 0 ||
        path_in(old, sizeof(old), l->dir, RANK_LOG_OLD) != 0)
        return -ENAMETOOLONG;
    if (rename(cur, old) != 0)
        return -errno;
    l->base += l->size;
    l->size = 0;
    int rc = write_base(l->dir, l->base);
    return rc != 0 ? rc : open_current(l, O_TRUNC);
}

void rank_log_append(struct rank_log *l, const char *bytes, size_t len, bool newline)
{
    if (l->fd < 0)
        return;
    size_t total = len + (newline ? 1 : 0);
    int rc = 0;
    if (rank_log_must_rotate(l->size, total, l->cap))
        rc = rotate(l);
    struct iovec iov[2] = {{(void *)bytes, len}, {"\n", newline ? 1 : 0}};
    size_t done = 0;
    while (rc == 0 && done < total) {
        /* Skip what a short write already took. */
        struct iovec part[2];
        int n = 0;
        size_t skip = done;
        for (int i = 0; i < 2; i++) {
            if (skip >= iov[i].iov_len) {
                skip -= iov[i].iov_len;
                continue;
            }
            part[n].iov_base = (char *)iov[i].iov_base + skip;
            part[n].iov_len = iov[i].iov_len - skip;
            skip = 0;
            n++;
        }
        ssize_t w = writev(l->fd, part, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            rc = w < 0 ? -errno : -EIO;
        else
            done += (size_t)w;
    }
    l->size += done;
    if (rc != 0) {
        log_warn("rank %u: cannot write its log in %s: %s; the rest of its output is not kept", l->rank, l->dir,
                 strerror(-rc));
        rank_log_close(l);
    }
}

void rank_log_close(struct rank_log *l)
{
    if (l->fd >= 0)
        close(l->fd);
    l->fd = -1;
}

/* ---- reading ----------------------------------------------------------- */

/*
 * The reader serves what a rank wrote to whoever may read /v1/ranks/R/log,
 * so everything under the state directory is taken as the rank left it:
 * gen-G and rank-R are opened one component at a time and never through a
 * symbolic link, and a file is read only when it is a regular file with one
 * link (a hard link to a file the agent can read, the cluster token say, is
 * not the rank's output). The state directory itself is the operator's.
 */
static int open_dir_at(int at, const char *name)
{
    return openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

/* The generation's rank directory, as a descriptor; -1 with errno set. */
static int open_rank_dir(const char *state_dir, uint64_t gen, uint32_t rank)
{
    char name[48];
    int sd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (sd < 0)
        return -1;
    snprintf(name, sizeof(name), "gen-%" PRIu64, gen);
    int gd = open_dir_at(sd, name);
    int err = errno;
    close(sd);
    if (gd < 0) {
        errno = err;
        return -1;
    }
    snprintf(name, sizeof(name), "rank-%u", rank);
    int rd = open_dir_at(gd, name);
    err = errno;
    close(gd);
    errno = err;
    return rd;
}

/* A regular file with one link; anything else is not the rank's log. */
static int check_own(const struct stat *st)
{
    if (!S_ISREG(st->st_mode))
        return -EINVAL; /* a link, a FIFO, a directory */
    if (st->st_nlink != 1)
        return -EMLINK; /* also reachable elsewhere: not a file the agent wrote */
    return 0;
}

static int file_size_at(int dir, const char *name, uint64_t *size)
{
    struct stat st;
    if (fstatat(dir, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return -errno;
    int rc = check_own(&st);
    if (rc == 0)
        *size = (uint64_t)st.st_size;
    return rc;
}

/* open(2) of a file in the rank directory, for reading, as check_own allows; -1 with errno set. */
static int open_own_at(int dir, const char *name)
{
    int fd = openat(dir, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0)
        return -1;
    struct stat st;
    int rc = fstat(fd, &st) != 0 ? -errno : check_own(&st);
    if (rc != 0) {
        close(fd);
        errno = -rc;
        return -1;
    }
    return fd;
}

/* The recorded offset of output.log: 0 when there is no file, -EDOM when it is not valid. */
static int read_base_at(int dir, uint64_t *base)
{
    char text[32];
    *base = 0;
    int fd = open_own_at(dir, RANK_LOG_OFFSET);
    if (fd < 0)
        return errno == ENOENT ? 0 : -errno;
    ssize_t n = read(fd, text, sizeof(text));
    int err = errno;
    close(fd);
    if (n < 0)
        return -err;
    return parse_base(text, (size_t)n, base);
}

int rank_log_dir(char *out, size_t cap, const char *state_dir, uint64_t gen, uint32_t rank)
{
    return snprintf(out, cap, "%s/gen-%" PRIu64 "/rank-%u", state_dir, gen, rank) < (int)cap ? 0 : -ENAMETOOLONG;
}

int rank_log_generation(const char *name, uint64_t *gen)
{
    unsigned long long g;
    int end = 0;
    if (sscanf(name, "gen-%llu%n", &g, &end) != 1 || name[end])
        return 0;
    *gen = g;
    return 1;
}

/* Something named like a log is there; whether it may be read is for rank_log_serve to say. */
static bool has_log(const char *state_dir, uint64_t gen, uint32_t rank)
{
    char dir[PATH_MAX], path[PATH_MAX + 32];
    struct stat st;
    if (rank_log_dir(dir, sizeof(dir), state_dir, gen, rank) != 0)
        return false;
    return (path_in(path, sizeof(path), dir, RANK_LOG_FILE) == 0 && lstat(path, &st) == 0) ||
           (path_in(path, sizeof(path), dir, RANK_LOG_OLD) == 0 && lstat(path, &st) == 0);
}

uint64_t rank_log_newest(const char *state_dir, uint32_t rank)
{
    uint64_t newest = 0;
    if (!state_dir[0])
        return 0;
    DIR *d = opendir(state_dir);
    if (!d)
        return 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        uint64_t g;
        if (rank_log_generation(e->d_name, &g) && g > newest && has_log(state_dir, g, rank))
            newest = g;
    }
    closedir(d);
    return newest;
}

/* Where a generation's bytes are: [start, base) in output.log.1, [base, end) in output.log. */
struct log_span {
    uint64_t start, base, end;
};

/* 0, or a negative errno; *what names the file at fault. */
static int log_span(int dir, struct log_span *s, const char **what)
{
    uint64_t cur = 0, old = 0;
    *what = RANK_LOG_FILE;
    int rc = file_size_at(dir, RANK_LOG_FILE, &cur);
    if (rc == -ENOENT) {
        *what = RANK_LOG_OLD;
        rc = file_size_at(dir, RANK_LOG_OLD, &old);
    } else if (rc == 0) {
        int orc = file_size_at(dir, RANK_LOG_OLD, &old);
        if (orc != 0 && orc != -ENOENT) {
            *what = RANK_LOG_OLD;
            rc = orc;
        }
    }
    if (rc != 0)
        return rc;
    *what = RANK_LOG_OFFSET;
    if ((rc = read_base_at(dir, &s->base)) != 0)
        return rc;
    if (cur > PROTO_U64_MAX - s->base)
        return -EOVERFLOW; /* its end could not be told on the wire */
    s->end = s->base + cur;
    s->start = s->base - (old < s->base ? old : s->base);
    return 0;
}

/* Bytes to drop from the end of buf[0..n) so that it does not stop inside a UTF-8 character. */
static size_t cut_partial_char(const char *buf, size_t n)
{
    for (size_t back = 1; back <= 3 && back <= n; back++) {
        unsigned char c = (unsigned char)buf[n - back];
        if ((c & 0xc0) == 0x80)
            continue; /* a continuation byte: look further back */
        size_t want = c >= 0xf0 ? 4 : c >= 0xe0 ? 3 : c >= 0xc0 ? 2 : 1;
        return want > back && back < n ? back : 0;
    }
    return 0;
}

static void fail(struct proto_log_data *d, enum proto_log_error error, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(struct proto_log_data *d, enum proto_log_error error, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->reason, sizeof(d->reason), fmt, ap);
    va_end(ap);
    proto_text_sanitize(d->reason);
    d->error = error;
    free(d->data);
    d->data = NULL;
    d->next_offset = d->offset;
    if (d->size < d->next_offset)
        d->size = d->next_offset;
}

static const char *refusal(int err)
{
    switch (err) {
    case EMLINK: return "it has more than one link (not a file the agent wrote)";
    case EINVAL: return "not a regular file";
    case EDOM: return "not an offset (decimal digits, at most 2^53-1)";
    case ELOOP: return "a symbolic link";
    case ENOTDIR: return "not a directory (a symbolic link?)";
    case EOVERFLOW: return "its offset and size are larger than a log offset can be";
    default: return strerror(err);
    }
}

/*
 * Reads [o, o + n) of the generation's log from the file holding o into a
 * new d->data. at_line: start after the first newline (a tail); cut_short:
 * more bytes follow in the file, so a character cut at the end waits for the
 * next read (at the end of the file it is sent as it is: nothing may come to
 * complete it, and the reader must not be stuck before it).
 */
static void read_piece(int dir, const char *where, const struct log_span *s, uint64_t o, size_t n, bool at_line,
                       bool cut_short, struct proto_log_data *d)
{
    const char *name = o < s->base ? RANK_LOG_OLD : RANK_LOG_FILE;
    uint64_t file_start = o < s->base ? s->start : s->base;
    /* One byte more in front when the piece must begin at a line: is it a newline? */
    size_t before = at_line && o > file_start ? 1 : 0;
    char *buf = malloc(n + before + 1);
    ssize_t got = -1;
    int err = buf ? 0 : ENOMEM;
    int fd = buf ? open_own_at(dir, name) : -1;
    if (buf && fd < 0)
        err = errno;
    while (fd >= 0 && (got = pread(fd, buf, n + before, (off_t)(o - file_start - before))) < 0 && errno == EINTR)
        ;
    if (fd >= 0 && got < 0)
        err = errno;
    if (fd >= 0)
        close(fd);
    d->offset = o;
    if (err) {
        free(buf);
        fail(d, PROTO_LOG_UNREADABLE, "cannot read %s/%s: %s", where, name, refusal(err));
        return;
    }
    size_t len = (size_t)got, skip = before;
    if (len < before) {
        len = before = skip = 0; /* the file is shorter than its span said */
    } else if (before && buf[0] != '\n') {
        char *nl = memchr(buf + 1, '\n', len - 1);
        if (nl)
            skip = (size_t)(nl - buf) + 1;
    }
    len -= skip;
    memmove(buf, buf + skip, len);
    if (cut_short)
        len -= cut_partial_char(buf, len);
    proto_log_sanitize(buf, len);
    d->offset = o + (skip - before);
    d->data = buf;
    d->next_offset = d->offset + len;
}

void rank_log_serve(const char *state_dir, const char *node, bool logs_off, const struct proto_log_request *q,
                    struct proto_log_data *d)
{
    memset(d, 0, sizeof(*d));
    d->id = q->id;
    d->rank = q->rank;
    d->generation = q->generation;
    if (!state_dir[0]) {
        fail(d, PROTO_LOG_NO_LOG, "node %s keeps no rank logs: it has no usable state directory", node);
        return;
    }
    d->newest = rank_log_newest(state_dir, q->rank);
    if (d->generation == 0)
        d->generation = d->newest;
    if (d->generation == 0 || !has_log(state_dir, d->generation, q->rank)) {
        char which[48] = "";
        if (q->generation)
            snprintf(which, sizeof(which), " in generation %" PRIu64, q->generation);
        fail(d, PROTO_LOG_NO_LOG, "no log of rank %u%s on node %s%s", q->rank, which, node,
             logs_off ? " (its rank logs are off: log_max_mb is 0)" : "");
        return;
    }
    char where[PATH_MAX];
    struct log_span s = {0};
    const char *what;
    rank_log_dir(where, sizeof(where), state_dir, d->generation, q->rank);
    int dir = open_rank_dir(state_dir, d->generation, q->rank);
    int rc = dir < 0 ? -errno : log_span(dir, &s, &what);
    if (rc != 0) {
        if (dir < 0)
            fail(d, PROTO_LOG_UNREADABLE, "cannot open %s: %s", where, refusal(-rc));
        else
            fail(d, PROTO_LOG_UNREADABLE, "cannot read the log in %s: %s: %s", where, what, refusal(-rc));
        if (dir >= 0)
            close(dir);
        return;
    }
    d->size = s.end;
    uint64_t o = q->offset;
    if (q->tail > 0)
        o = s.end > q->tail ? s.end - q->tail : 0;
    if (o > s.end) {
        d->offset = s.end;
        fail(d, PROTO_LOG_BEYOND_END, "offset %" PRIu64 " is beyond the end of rank %u's log of generation %" PRIu64
             " (%" PRIu64 " bytes)", o, q->rank, d->generation, s.end);
    } else {
        if (o < s.start)
            o = s.start; /* rotated away: serve the oldest kept */
        uint64_t avail = (o < s.base ? s.base : s.end) - o;
        size_t n = (size_t)(avail < q->max ? avail : q->max);
        read_piece(dir, where, &s, o, n, q->tail > 0, n < avail, d);
    }
    close(dir);
}
