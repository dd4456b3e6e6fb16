#include "worker/agent/rank_flight.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/flight.h"
#include "common/mkdirs.h"

/* "fr-PID.fifo" -> PID; 0 for any other name. */
static int armed_pid(const char *name)
{
    int pid = 0, end = 0;
    if (sscanf(name, "fr-%d.fifo%n", &pid, &end) != 1 || name[end] || pid <= 0)
        return 0;
    return pid;
}

static int path_of(char *out, size_t cap, const char *dir, int pid, const char *ext)
{
    return (size_t)snprintf(out, cap, "%s/fr-%d.%s", dir, pid, ext) < cap ? 0 : -1;
}

int flight_ask_begin(struct flight_ask *f, const char *dir, int rank_pid)
{
    f->nprocs = 0;
    if (!dir || !dir[0] || (size_t)snprintf(f->dir, sizeof(f->dir), "%s", dir) >= sizeof(f->dir))
        return 0;
    DIR *dp = opendir(dir);
    struct dirent *e;
    while (dp && (e = readdir(dp)) != NULL && f->nprocs < FLIGHT_ASK_MAX_PROCS) {
        int pid = armed_pid(e->d_name);
        char fifo[4200], out[4200];
        struct stat st;
        /* only a live process of this rank, and only a FIFO: a rank's directory is the rank's to fill */
        if (!pid || getpgid(pid) != rank_pid || path_of(fifo, sizeof(fifo), dir, pid, "fifo") ||
            path_of(out, sizeof(out), dir, pid, "txt") || lstat(fifo, &st) != 0 || !S_ISFIFO(st.st_mode))
            continue;
        unlink(out);
        int fd = open(fifo, O_WRONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC);
        if (fd < 0)
            continue; /* ENXIO: nobody reads it */
        if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) { /* swapped since the lstat: not written */
            close(fd);
            continue;
        }
        ssize_t n = write(fd, "d", 1);
        close(fd);
        if (n == 1)
            f->pids[f->nprocs++] = pid;
    }
    if (dp)
        closedir(dp);
    return f->nprocs > 0;
}

int flight_ask_poll(const struct flight_ask *f)
{
    for (unsigned i = 0; i < f->nprocs; i++) {
        char out[4200];
        if (path_of(out, sizeof(out), f->dir, f->pids[i], "txt") || access(out, F_OK) != 0)
            return 0;
    }
    return 1;
}

char *flight_ask_read(const struct flight_ask *f, char *why, size_t cap)
{
    why[0] = '\0';
    for (unsigned i = 0; i < f->nprocs; i++) {
        char path[4200], buf[FLIGHT_TEXT_MAX + 2];
        if (path_of(path, sizeof(path), f->dir, f->pids[i], "txt"))
            continue;
        int fd = open_regular_file(path, O_RDONLY, 0); /* a rank's FIFO or link there: skipped */
        struct stat st;
        if (fd >= 0 && (fstat(fd, &st) != 0 || st.st_nlink != 1)) { /* a hard link to a file not the rank's */
            close(fd);
            fd = -1;
        }
        if (fd < 0)
            continue;
        size_t len = 0;
        ssize_t n;
        while (len < sizeof(buf) - 1 && (n = read(fd, buf + len, sizeof(buf) - 1 - len)) > 0)
            len += (size_t)n;
        close(fd);
        if (len == 0)
            continue; /* no process group in that process */
        static struct flight_rank parsed; /* 2 KiB: not on the loop's stack */
        unsigned line = 0;
        int rc = flight_parse(buf, len, &parsed, &line);
        if (rc) {
            snprintf(why, cap, "process %d's flight recorder summary is refused: line %u: %s", f->pids[i], line,
                     flight_strerror(rc));
            return NULL;
        }
        char *text = malloc(len + 1);
        if (!text)
            return NULL;
        memcpy(text, buf, len);
        text[len] = '\0';
        return text;
    }
    return NULL;
}
