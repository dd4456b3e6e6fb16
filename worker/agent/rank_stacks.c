#include "worker/agent/rank_stacks.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/mkdirs.h"
#include "common/log.h"

/*
 * The rank owns its directory: what is named stacks-PID.txt there may be a
 * FIFO (an open blocks until the other end opens: the agent's loop would
 * stop, and with it its heartbeats and fencing), a device, or a symbolic
 * link or a hard link to a file of the agent's (the agent, often root,
 * would truncate it, or send what it holds to musterd). So a file is opened
 * without following a link and without blocking, and used only when it is
 * a regular file of one name. Returns the descriptor, or -1 (logged).
 */
static int open_regular(const char *path, int flags)
{
    int fd = open_regular_file(path, flags, 0);
    if (fd < 0 && errno == EINVAL)
        log_warn_limited("%s is not a regular file (a rank's FIFO or device?): skipped", path);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_nlink != 1)) {
        log_warn_limited("%s has another name (a hard link to a file not the rank's?): skipped", path);
        close(fd);
        return -1;
    }
    return fd;
}

int rank_stopped(int pid)
{
    char path[64], buf[512];
    snprintf(path, sizeof(path), "/proc/%d/stat", pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof(buf) - 1);
    close(fd);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    /* "PID (COMM) S ...": the command may hold ')' itself, so take the last one. */
    const char *close_paren = strrchr(buf, ')');
    if (!close_paren || close_paren[1] != ' ')
        return 0;
    return close_paren[2] == 'T' || close_paren[2] == 't';
}

/* "stacks-PID.txt" -> PID; 0 for any other name. */
static int armed_pid(const char *name)
{
    int pid = 0, end = 0;
    if (sscanf(name, "stacks-%d.txt%n", &pid, &end) != 1 || name[end] || pid <= 0)
        return 0;
    return pid;
}

/* dir/stacks-PID.fifo opened for writing, never blocking nor following a link, checked to be a FIFO after
 * the open too (the rank may swap in another file, a hard link to one of the agent's, after the lstat).
 * The descriptor; -1 when there is no such FIFO; -2 when it is there but nobody reads it. */
static int open_fifo(const char *dir, int pid)
{
    char fifo[4200];
    struct stat st;
    if ((size_t)snprintf(fifo, sizeof(fifo), "%s/stacks-%d.fifo", dir, pid) >= sizeof(fifo) ||
        lstat(fifo, &st) != 0 || !S_ISFIFO(st.st_mode))
        return -1;
    int fd = open(fifo, O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return errno == ENXIO ? -2 : -1;
    if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) {
        close(fd);
        return -1;
    }
    return fd;
}

enum ask { ASKED, NO_FIFO, NO_READER };

/* The request byte to the hook's thread: ASKED; NO_FIFO (an older hook: the signal is the way); NO_READER
 * (the thread is gone: the process exits, or it exec'd another program, which the signal would kill). */
static enum ask ask_thread(const char *dir, int pid)
{
    int fd = open_fifo(dir, pid);
    if (fd < 0)
        return fd == -2 ? NO_READER : NO_FIFO;
    ssize_t n = write(fd, "s", 1);
    close(fd);
    return n == 1 ? ASKED : NO_READER;
}

/* Whether the request byte still waits in the FIFO: the thread never ran to read it. */
static int request_unread(const char *dir, int pid)
{
    int fd = open_fifo(dir, pid), n = 0;
    if (fd < 0)
        return 0;
    if (ioctl(fd, FIONREAD, &n) != 0)
        n = 0;
    close(fd);
    return n > 0;
}

int stacks_begin(struct stacks_dump *d, const char *dir, int rank_pid, int signum, uint64_t now_ms)
{
    d->rank_pid = rank_pid;
    d->nprocs = 0;
    d->signum = signum;
    d->begun_ms = now_ms;
    snprintf(d->dir, sizeof(d->dir), "%s", dir ? dir : ""); /* a longer one names no file below: nothing asked */
    d->error[0] = '\0';
    d->stopped = rank_stopped(rank_pid);
    if (d->stopped) { /* it cannot dump now, and a signal left pending would dump it later for nobody */
        snprintf(d->error, sizeof(d->error),
                 "its process is stopped (SIGSTOP or a debugger): it cannot dump its stacks until it continues");
        return 0;
    }
    DIR *dp = dir && dir[0] ? opendir(dir) : NULL;
    struct dirent *e;
    while (dp && (e = readdir(dp)) != NULL && d->nprocs < STACKS_MAX_PROCS) {
        int pid = armed_pid(e->d_name);
        /* Only a live process of this rank: a file of one that is gone may name a pid reused since. */
        if (!pid || getpgid(pid) != rank_pid)
            continue;
        struct stacks_proc *p = &d->procs[d->nprocs];
        if ((size_t)snprintf(p->path, sizeof(p->path), "%s/%s", dir, e->d_name) >= sizeof(p->path))
            continue;
        int fd = open_regular(p->path, O_WRONLY);
        if (fd < 0)
            continue;
        int cut = ftruncate(fd, 0); /* truncated only once known to be a regular file of one name */
        close(fd);
        if (cut != 0)
            continue;
        enum ask asked = ask_thread(dir, pid);
        if (asked == NO_READER || (asked == NO_FIFO && kill(pid, signum) != 0))
            continue;
        p->signalled = asked == NO_FIFO;
        p->pid = pid;
        p->last_size = -1;
        p->done = 0;
        d->nprocs++;
    }
    if (dp)
        closedir(dp);
    if (d->nprocs == 0)
        snprintf(d->error, sizeof(d->error),
                 "the rank has no stack hook (not a Python rank, python_hook is off, or it has not started Python "
                 "yet)");
    return d->nprocs > 0;
}

int stacks_poll(struct stacks_dump *d, uint64_t now_ms)
{
    int all = 1;
    for (unsigned i = 0; i < d->nprocs; i++) {
        struct stacks_proc *p = &d->procs[i];
        if (p->done)
            continue;
        struct stat st;
        int64_t size = lstat(p->path, &st) == 0 && S_ISREG(st.st_mode) ? (int64_t)st.st_size : -1;
        /* The thread writes its dump in one write, faulthandler from the handler in a burst: bytes that
         * stopped growing are the dump. */
        if (size > 0 && size == p->last_size)
            p->done = 1;
        else
            all = 0;
        /* The fallback: nothing written, the byte still unread (the thread never ran: most likely the GIL
         * is held in native code, where faulthandler's walk is safe), the process still the rank's. */
        if (size == 0 && !p->signalled && now_ms - d->begun_ms >= STACKS_FALLBACK_MS) {
            p->signalled = 1;
            if (request_unread(d->dir, p->pid) && getpgid(p->pid) == d->rank_pid)
                kill(p->pid, d->signum);
        }
        p->last_size = size;
    }
    return all;
}

/* Appends up to the room left of path's bytes to buf at *len. */
static void append_file(const char *path, char *buf, size_t *len, size_t cap)
{
    int fd = open_regular(path, O_RDONLY); /* swapped for a FIFO since the dump began: skipped */
    if (fd < 0)
        return;
    while (*len < cap) {
        ssize_t n = read(fd, buf + *len, cap - *len);
        if (n <= 0)
            break;
        *len += (size_t)n;
    }
    close(fd);
}

int stacks_message(const struct stacks_dump *d, struct proto_msg *m, int timed_out)
{
    memset(m, 0, sizeof(*m));
    m->type = PROTO_STACKS;
    struct proto_stacks *s = &m->u.stacks;
    s->generation = d->generation;
    s->rank = d->rank;
    s->pid = d->rank_pid > 0 ? (uint32_t)d->rank_pid : 0;
    s->stopped = d->stopped;
    snprintf(s->error, sizeof(s->error), "%s", d->error);
    const size_t cap = PROTO_STACKS_MAX;
    char *buf = malloc(cap + 1);
    if (!buf)
        return -ENOMEM;
    size_t len = 0;
    unsigned missing = 0;
    for (unsigned i = 0; i < d->nprocs && len < cap; i++) {
        const struct stacks_proc *p = &d->procs[i];
        int head = snprintf(buf + len, cap - len, "process %d:\n", p->pid);
        if (head < 0 || (size_t)head >= cap - len)
            break;
        len += (size_t)head;
        size_t before = len;
        append_file(p->path, buf, &len, cap);
        if (len == before)
            missing++;
        if (len < cap && len > 0 && buf[len - 1] != '\n')
            buf[len++] = '\n';
    }
    buf[len] = '\0';
    proto_log_sanitize(buf, len);
    s->text = buf;
    if (!s->error[0] && timed_out && missing)
        snprintf(s->error, sizeof(s->error), "%u of %u processes wrote no dump within %.1f s", missing, d->nprocs,
                 STACKS_DEADLINE_MS / 1000.0);
    return 0;
}
