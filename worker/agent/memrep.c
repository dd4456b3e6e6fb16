#include "worker/agent/memrep.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/log.h"
#include "common/memtags.h"
#include "common/mkdirs.h"
#include "common/ratelimit.h"

#define STAGE_PREFIX ".muster-in-"

/* ---- paths under a directory, part by part ----------------------------- */

int memrep_open_under(int dirfd, const char *rel, bool create, mode_t mode)
{
    if (!proto_valid_mem_path(rel))
        return -EINVAL;
    char part[PROTO_MEMPATH_MAX];
    int fd = dup(dirfd);
    if (fd < 0)
        return -errno;
    const char *p = rel;
    for (;;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        memcpy(part, p, n);
        part[n] = '\0';
        int next;
        mode_t dmode = mode | ((mode & 0444) >> 2); /* rw for a file, rwx for its directories */
        if (slash) {
            if (create && mkdirat(fd, part, dmode) != 0 && errno != EEXIST) {
                int e = errno;
                close(fd);
                return -e;
            }
            next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        } else {
            next = create ? openat(fd, part, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, mode)
                          : openat(fd, part, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
        }
        int e = errno;
        close(fd);
        if (next < 0)
            return -e;
        if (create) /* exactly so, whatever the umask: ranks of rank_user read what comes back through the group */
            fchmod(next, slash ? dmode : mode);
        if (!slash) {
            struct stat st;
            if (fstat(next, &st) != 0 || !S_ISREG(st.st_mode)) {
                close(next);
                return -ELOOP; /* a FIFO or device planted in the directory: not read */
            }
            return next;
        }
        fd = next;
        p = slash + 1;
    }
}

static int by_name(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

/* The entries of fd (but . and ..), sorted, malloc'd; *n of them. NULL with -errno in *n on failure. */
static char **entries(int fd, int *n)
{
    int dup_fd = dup(fd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        *n = -errno;
        if (dup_fd >= 0)
            close(dup_fd);
        return NULL;
    }
    rewinddir(d);
    char **names = NULL;
    int k = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
            continue;
        if (k == cap) {
            cap = cap ? 2 * cap : 16;
            char **more = realloc(names, (size_t)cap * sizeof(*names));
            if (!more)
                break;
            names = more;
        }
        names[k++] = strdup(de->d_name);
    }
    closedir(d);
    if (names)
        qsort(names, (size_t)k, sizeof(*names), by_name);
    *n = k;
    return names ? names : calloc(1, sizeof(char *));
}

static void free_entries(char **names, int n)
{
    for (int i = 0; i < n; i++)
        free(names[i]);
    free(names);
}

static int list_at(int fd, const char *prefix, int depth, char (*paths)[PROTO_MEMPATH_MAX], uint64_t *sizes,
                   uint32_t max, uint64_t limit, uint32_t *k, uint64_t *total)
{
    if (depth > 16)
        return -ELOOP;
    int n;
    char **names = entries(fd, &n);
    if (!names)
        return n;
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        char rel[PROTO_MEMPATH_MAX];
        if (!names[i] || snprintf(rel, sizeof(rel), "%s%s%s", prefix, prefix[0] ? "/" : "", names[i]) >=
                             (int)sizeof(rel) || !proto_valid_mem_path(rel)) {
            rc = -ENAMETOOLONG;
            break;
        }
        struct stat st;
        if (fstatat(fd, names[i], &st, AT_SYMLINK_NOFOLLOW) != 0) {
            rc = -errno;
        } else if (S_ISDIR(st.st_mode)) {
            int sub = openat(fd, names[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            rc = sub < 0 ? -errno : list_at(sub, rel, depth + 1, paths, sizes, max, limit, k, total);
            if (sub >= 0)
                close(sub);
        } else if (!S_ISREG(st.st_mode)) {
            rc = -ELOOP;
        } else if (*k == max) {
            rc = -E2BIG;
        } else if ((*total += (uint64_t)st.st_size) > limit) {
            rc = -EFBIG;
        } else {
            memcpy(paths[*k], rel, sizeof(rel));
            sizes[(*k)++] = (uint64_t)st.st_size;
        }
    }
    free_entries(names, n);
    return rc;
}

int memrep_list(int dirfd, char (*paths)[PROTO_MEMPATH_MAX], uint64_t *sizes, uint32_t max, uint64_t limit)
{
    uint32_t k = 0;
    uint64_t total = 0;
    int rc = list_at(dirfd, "", 0, paths, sizes, max, limit, &k, &total);
    return rc < 0 ? rc : (int)k;
}

/* ---- the replicas held here -------------------------------------------- */

static int open_dir(const char *path)
{
    return open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

static void remove_in(const char *dir, const char *name)
{
    int fd = open_dir(dir);
    if (fd >= 0) {
        rmtree_at(fd, name);
        close(fd);
    }
}

/* Every entry of the replica directory goes (another owner's, or the job's end). */
static void clear_held(struct memrep *p)
{
    int fd = open_dir(p->dir), n = 0;
    char **names = fd >= 0 ? entries(fd, &n) : NULL;
    for (int i = 0; names && i < n; i++)
        if (names[i])
            rmtree_at(fd, names[i]);
    if (names)
        free_entries(names, n);
    if (fd >= 0)
        close(fd);
    p->nheld = 0;
}

static void hold(struct memrep *p, const char *tag)
{
    uint32_t k = 0;
    for (uint32_t i = 0; i < p->nheld; i++)
        if (strcmp(p->held[i], tag) != 0)
            memcpy(p->held[k++], p->held[i], sizeof(p->held[0]));
    p->nheld = k;
    uint32_t at = p->nheld; /* oldest first */
    while (at > 0 && memtags_cmp(p->held[at - 1], tag) > 0)
        at--;
    memmove(p->held[at + 1], p->held[at], (p->nheld - at) * sizeof(p->held[0]));
    snprintf(p->held[at], sizeof(p->held[0]), "%s", tag);
    p->nheld++;
    uint32_t most = (uint32_t)p->keep < PROTO_MEMCKPT_MAX ? (uint32_t)p->keep : PROTO_MEMCKPT_MAX;
    while (p->nheld > most) {
        remove_in(p->dir, p->held[0]);
        memmove(p->held[0], p->held[1], (p->nheld - 1) * sizeof(p->held[0]));
        p->nheld--;
    }
}

static bool holds(const struct memrep *p, const char *tag)
{
    for (uint32_t i = 0; i < p->nheld; i++)
        if (strcmp(p->held[i], tag) == 0)
            return true;
    return false;
}

/* ---- going out ----------------------------------------------------------- */

static void out_stop(struct memrep_out *o)
{
    if (o->fd >= 0)
        close(o->fd);
    if (o->on && o->dirfd >= 0)
        close(o->dirfd);
    free(o->paths);
    free(o->sizes);
    memset(o, 0, sizeof(*o));
    o->fd = o->dirfd = -1;
}

static void tick(uv_timer_t *t);

static void run_timer(struct memrep *p)
{
    if (!uv_is_active((uv_handle_t *)&p->timer)) {
        p->last_ms = uv_now(p->loop);
        uv_timer_start(&p->timer, tick, MEMREP_TICK_MS, MEMREP_TICK_MS);
    }
}

/* Starts owner's tag in root out; false (logged) when it cannot be listed. */
static bool out_start(struct memrep *p, const char *root, const char *owner, const char *tag, bool restore)
{
    struct memrep_out *o = &p->out;
    out_stop(o);
    int dfd = open_dir(root);
    o->dirfd = dfd >= 0 ? openat(dfd, tag, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC) : -1;
    if (dfd >= 0)
        close(dfd);
    o->paths = malloc(MEMREP_FILES_MAX * sizeof(*o->paths));
    o->sizes = malloc(MEMREP_FILES_MAX * sizeof(*o->sizes));
    int n = o->dirfd < 0 ? -errno : !o->paths || !o->sizes ? -ENOMEM
                                  : memrep_list(o->dirfd, o->paths, o->sizes, MEMREP_FILES_MAX, p->limit);
    if (n < 0) {
        log_warn("memory checkpoint %s of node %s in %s: not sent%s: %s", tag, owner, root,
                 restore ? " back" : " to the buddy",
                 n == -ELOOP ? "it holds a link or a file that is not regular"
                 : n == -EFBIG ? "its files pass memory_checkpoint_mb"
                 : n == -ENAMETOOLONG ? "a path in it is too long for the protocol or not plain"
                 : n == -E2BIG ? "it holds over 4096 files" : strerror(-n));
        if (o->dirfd >= 0)
            close(o->dirfd);
        o->dirfd = -1;
        out_stop(o);
        return false;
    }
    o->on = true;
    o->restore = restore;
    o->nfiles = (uint32_t)n;
    snprintf(o->owner, sizeof(o->owner), "%s", owner);
    snprintf(o->tag, sizeof(o->tag), "%s", tag);
    o->started_ms = uv_now(p->loop);
    run_timer(p);
    return true;
}

/* The next piece of o, or its end frame; 0, 1 when o is done, or -1 when it was dropped (logged). */
static int out_piece(struct memrep *p, uint8_t *buf)
{
    struct memrep_out *o = &p->out;
    struct proto_msg m = {.type = PROTO_MEM_FILE};
    struct proto_mem_file *f = &m.u.mem_file;
    snprintf(f->owner, sizeof(f->owner), "%s", o->owner);
    snprintf(f->tag, sizeof(f->tag), "%s", o->tag);
    f->restore = o->restore;
    f->begin = !o->begun;
    o->begun = true;
    if (o->at == o->nfiles) {
        f->end = 1;
        if (p->link.send(p->link.ctx, &m) != 0)
            return -1;
        uint64_t ms = uv_now(p->loop) - o->started_ms;
        log_info("memory checkpoint %s of node %s sent %s: %" PRIu64 " bytes in %u files, %" PRIu64 " ms", o->tag,
                 o->owner, o->restore ? "back to it" : "to the buddy", o->bytes, o->nfiles, ms);
        if (!o->restore)
            snprintf(p->sent, sizeof(p->sent), "%s", o->tag);
        return 1;
    }
    if (o->fd < 0 && (o->fd = memrep_open_under(o->dirfd, o->paths[o->at], false, 0)) < 0) {
        log_warn("memory checkpoint %s: %s: cannot open it to send: %s; the copy stops", o->tag, o->paths[o->at],
                 strerror(-o->fd));
        o->fd = -1;
        return -1;
    }
    uint64_t size = o->sizes[o->at];
    uint64_t want = size - o->offset < PROTO_MEMDATA_MAX ? size - o->offset : PROTO_MEMDATA_MAX;
    ssize_t got = want ? pread(o->fd, buf, (size_t)want, (off_t)o->offset) : 0;
    if (got != (ssize_t)want) {
        log_warn("memory checkpoint %s: %s changed while it was sent (%s); the copy stops", o->tag,
                 o->paths[o->at], got < 0 ? strerror(errno) : "shorter than it was");
        return -1;
    }
    snprintf(f->path, sizeof(f->path), "%s", o->paths[o->at]);
    f->offset = o->offset;
    f->size = size;
    f->len = (uint32_t)want;
    f->data = want ? buf : NULL;
    if (p->link.send(p->link.ctx, &m) != 0)
        return -1;
    o->offset += want;
    o->bytes += want;
    p->budget = p->budget > want ? p->budget - want : 0;
    if (o->offset == size) {
        close(o->fd);
        o->fd = -1;
        o->offset = 0;
        o->at++;
    }
    return 0;
}

/* What goes out next: a fetch first, then our newest complete checkpoint if the buddy lacks it. */
static void out_next(struct memrep *p)
{
    if (p->out.on || !p->on)
        return;
    if (p->fetch_tag[0]) {
        char owner[PROTO_NAME_MAX], tag[PROTO_CKPT_NAME_MAX];
        snprintf(owner, sizeof(owner), "%s", p->fetch_owner);
        snprintf(tag, sizeof(tag), "%s", p->fetch_tag);
        p->fetch_tag[0] = '\0';
        out_start(p, p->dir, owner, tag, true);
        return;
    }
    char newest[1][PROTO_CKPT_NAME_MAX];
    if (!p->mem->on || !memckpt_complete(p->mem, newest, 1) || strcmp(newest[0], p->sent) == 0)
        return;
    if (!out_start(p, p->mem->dir, p->node, newest[0], false))
        snprintf(p->sent, sizeof(p->sent), "%s", newest[0]); /* not again: the next one may do */
}

static void tick(uv_timer_t *t)
{
    struct memrep *p = t->data;
    uint64_t now = uv_now(p->loop);
    if (p->wait_gen && !p->wait_over && now >= p->wait_until_ms) {
        log_error("generation %" PRIu64 ": memory checkpoint %s did not come back from the buddy within %u s; "
                  "the ranks start from what is here", p->wait_gen, p->wait_tag, MEMREP_FETCH_WAIT_MS / 1000);
        p->wait_over = true;
        p->link.fetched(p->link.ctx);
    }
    /* the pace: rate bytes a second, at most a tenth of a second's worth saved up */
    p->budget += p->rate * (now - p->last_ms) / 1000;
    if (p->budget > p->rate / 10 + PROTO_MEMDATA_MAX)
        p->budget = p->rate / 10 + PROTO_MEMDATA_MAX;
    p->last_ms = now;
    static uint8_t buf[PROTO_MEMDATA_MAX]; /* the loop thread's */
    while (p->out.on && p->budget >= PROTO_MEMDATA_MAX / 2 && p->link.queued(p->link.ctx) < MEMREP_QUEUE_MAX) {
        int rc = out_piece(p, buf);
        if (rc != 0)
            out_stop(&p->out);
        if (rc < 0)
            break; /* tried again from the next heartbeat: the buddy or the link may be back */
        if (rc > 0)
            out_next(p);
    }
    if (!p->out.on && !(p->wait_gen && !p->wait_over))
        uv_timer_stop(&p->timer);
}

/* ---- coming in ----------------------------------------------------------- */

static void in_drop(struct memrep_in *in)
{
    if (in->fd >= 0)
        close(in->fd);
    if (in->stagefd >= 0)
        close(in->stagefd);
    if (in->on) {
        char stage[PROTO_CKPT_NAME_MAX + 16];
        snprintf(stage, sizeof(stage), STAGE_PREFIX "%s", in->tag);
        remove_in(in->root, stage);
    }
    memset(in, 0, sizeof(*in));
    in->fd = in->stagefd = -1;
}

static bool in_begin(struct memrep *p, struct memrep_in *in, const struct proto_mem_file *f, const char *root)
{
    in_drop(in);
    char stage[PROTO_CKPT_NAME_MAX + 16];
    snprintf(stage, sizeof(stage), STAGE_PREFIX "%s", f->tag);
    int dfd = open_dir(root);
    if (dfd < 0) {
        log_warn("memory checkpoint %s of node %s: cannot open %s: %s; not taken", f->tag, f->owner, root,
                 strerror(errno));
        return false;
    }
    rmtree_at(dfd, stage); /* a copy cut short before */
    in->stagefd = mkdirat(dfd, stage, 0700) == 0 ? openat(dfd, stage, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                                                  : -1;
    close(dfd);
    in->mode = f->restore ? 0660 : 0600; /* the ranks' own files: their group's (memckpt_share) */
    if (in->stagefd >= 0)
        fchmod(in->stagefd, f->restore ? 02770 : 0700);
    if (in->stagefd < 0) {
        log_warn("memory checkpoint %s of node %s: cannot make %s/%s: %s; not taken", f->tag, f->owner, root, stage,
                 strerror(errno));
        return false;
    }
    in->on = true;
    snprintf(in->owner, sizeof(in->owner), "%s", f->owner);
    snprintf(in->tag, sizeof(in->tag), "%s", f->tag);
    snprintf(in->root, sizeof(in->root), "%s", root);
    (void)p;
    return true;
}

/* The checkpoint is whole: its stage becomes root/TAG. */
static bool in_finish(struct memrep_in *in)
{
    if (in->fd >= 0 && in->offset != in->size)
        return false;
    char stage[PROTO_CKPT_NAME_MAX + 16];
    snprintf(stage, sizeof(stage), STAGE_PREFIX "%s", in->tag);
    int dfd = open_dir(in->root);
    bool ok = dfd >= 0;
    if (ok) {
        rmtree_at(dfd, in->tag);
        ok = renameat(dfd, stage, dfd, in->tag) == 0;
        close(dfd);
    }
    return ok;
}

/* One piece; false when it does not follow the one before (the caller drops the checkpoint). */
static bool in_piece(struct memrep *p, struct memrep_in *in, const struct proto_mem_file *f, const char **why)
{
    if (strcmp(f->path, in->path) != 0) { /* the next file: the last one must be whole */
        if (in->fd >= 0 && in->offset != in->size) {
            *why = "a file ended short";
            return false;
        }
        if (in->fd >= 0)
            close(in->fd);
        in->fd = -1;
        if (f->offset != 0) {
            *why = "a file does not start at offset 0";
            return false;
        }
        int fd = memrep_open_under(in->stagefd, f->path, true, in->mode);
        if (fd < 0) {
            *why = fd == -EEXIST ? "a file came twice" : "a file cannot be made (a link on its path?)";
            return false;
        }
        in->fd = fd;
        snprintf(in->path, sizeof(in->path), "%s", f->path);
        in->offset = 0;
        in->size = f->size;
    }
    if (f->offset != in->offset || f->size != in->size) {
        *why = "a piece is missing or out of order";
        return false;
    }
    if ((in->total += f->len) > p->limit) {
        *why = "it passes memory_checkpoint_mb";
        return false;
    }
    if (f->len && pwrite(in->fd, f->data, f->len, (off_t)f->offset) != (ssize_t)f->len) {
        *why = errno == ENOSPC ? "no space left in memory" : "a write failed";
        return false;
    }
    in->offset += f->len;
    return true;
}

static void on_file(struct memrep *p, const struct proto_mem_file *f)
{
    bool own = f->restore;
    unsigned long held;
    char note[64];
    bool say = (own && (strcmp(f->owner, p->node) != 0 || !p->mem->on)) ||
               (!own && (!p->on || strcmp(f->owner, p->node) == 0));
    if (say) { /* one line per 10 s: a copy is many frames */
        if (ratelimit_pass(&p->refused_log, uv_now(p->loop), RATELIMIT_PEER_MS, &held))
            log_warn("MEM_FILE %s node %s's %s, but this node (%s) %s: ignored%s",
                     own ? "gives back" : "is a replica of", f->owner, f->tag, p->node,
                     own ? (p->mem->on ? "is another" : "holds no memory checkpoint directory")
                         : (p->on ? "is that node" : "holds no replicas for the job"),
                     ratelimit_note(held, note, sizeof(note)));
        return;
    }
    struct memrep_in *in = &p->in[own];
    if (!own && strcmp(p->replica_of, f->owner) != 0) { /* a new owner: the old one's copies are no use */
        in_drop(in);
        clear_held(p);
        snprintf(p->replica_of, sizeof(p->replica_of), "%s", f->owner);
    }
    if (f->begin && !in_begin(p, in, f, own ? p->mem->dir : p->dir))
        return;
    if (!in->on || strcmp(in->tag, f->tag) != 0)
        return; /* the rest of a copy dropped, or of one begun before this agent or link */
    const char *why = NULL;
    if (f->end) {
        if (!in_finish(in)) {
            why = "its last file ended short, or it could not be put in place";
        } else if (own) {
            log_info("memory checkpoint %s came back from the buddy: %" PRIu64 " bytes", f->tag, in->total);
            memckpt_adopt(p->mem, f->tag);
            snprintf(p->sent, sizeof(p->sent), "%s", f->tag); /* the buddy has it */
            bool awaited = p->wait_gen && !p->wait_over && strcmp(p->wait_tag, f->tag) == 0;
            if (in->fd >= 0)
                close(in->fd);
            close(in->stagefd);
            memset(in, 0, sizeof(*in));
            in->fd = in->stagefd = -1;
            if (awaited) {
                p->wait_over = true;
                p->link.fetched(p->link.ctx);
            }
            return;
        } else {
            hold(p, f->tag);
            log_info("holding node %s's memory checkpoint %s (%" PRIu64 " bytes) as its buddy", f->owner, f->tag,
                     in->total);
        }
        if (!why) {
            if (in->fd >= 0)
                close(in->fd);
            close(in->stagefd);
            memset(in, 0, sizeof(*in));
            in->fd = in->stagefd = -1;
            return;
        }
    } else if (in_piece(p, in, f, &why)) {
        return;
    }
    log_warn("memory checkpoint %s of node %s %s: %s at %s; dropped", f->tag, f->owner,
             own ? "coming back" : "held as its buddy", why, f->path[0] ? f->path : "its end");
    in_drop(in);
}

static void on_fetch(struct memrep *p, const struct proto_mem_fetch *q)
{
    if (!p->on || strcmp(q->owner, p->replica_of) != 0 || !holds(p, q->tag)) {
        log_warn("musterd asks for node %s's memory checkpoint %s, which this node does not hold%s", q->owner, q->tag,
                 p->on ? "" : " (the job has no replicas)");
        return;
    }
    log_info("giving node %s's memory checkpoint %s back to it", q->owner, q->tag);
    if (p->out.on && !p->out.restore)
        out_stop(&p->out); /* ours goes again later: a node waits for this one */
    snprintf(p->fetch_owner, sizeof(p->fetch_owner), "%s", q->owner);
    snprintf(p->fetch_tag, sizeof(p->fetch_tag), "%s", q->tag);
    out_next(p);
}

/* ---- the agent's calls --------------------------------------------------- */

static void stop_job(struct memrep *p, bool remove);

void memrep_init(struct memrep *p, uv_loop_t *loop, struct memckpt *mem, const char *node,
                 const struct memrep_link *link)
{
    memset(p, 0, sizeof(*p));
    p->loop = loop;
    p->mem = mem;
    p->link = *link;
    snprintf(p->node, sizeof(p->node), "%s", node);
    p->out.fd = p->out.dirfd = -1;
    for (int i = 0; i < 2; i++)
        p->in[i].fd = p->in[i].stagefd = -1;
    uv_timer_init(loop, &p->timer);
    p->timer.data = p;
    p->timer_init = true;
}

void memrep_job(struct memrep *p, const struct job_spec *spec, uint32_t nnodes)
{
    bool want = p->mem->on && spec->memory_checkpoint_replica_mbps > 0 && nnodes >= 2;
    char dir[PATH_MAX + 16] = "";
    if (want)
        snprintf(dir, sizeof(dir), "%s.replicas", p->mem->dir);
    if (p->on && strcmp(dir, p->dir) != 0)
        stop_job(p, true);
    p->rate = (uint64_t)spec->memory_checkpoint_replica_mbps << 20;
    p->limit = (uint64_t)spec->memory_checkpoint_mb << 20;
    p->keep = spec->memory_checkpoint_keep;
    if (!want || p->on)
        return;
    char why[PATH_MAX + 200];
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        log_error("memory checkpoint replicas: cannot make %s: %s; this node holds none", dir, strerror(errno));
        return;
    }
    if (dir_private(dir, why, sizeof(why)) != 0) {
        log_error("memory checkpoint replicas: %s; this node holds none", why);
        return;
    }
    snprintf(p->dir, sizeof(p->dir), "%s", dir);
    p->on = true;
    p->mounted = memckpt_own_mount(dir);
    if (!p->mounted && geteuid() == 0) {
        /* bounded as the ranks' own: keep checkpoints and one coming in */
        char opts[64], at[64];
        snprintf(opts, sizeof(opts), "size=%" PRIu64 "m,mode=0700",
                 (uint64_t)spec->memory_checkpoint_mb * (uint64_t)(spec->memory_checkpoint_keep + 1));
        int fd = open_dir(dir);
        snprintf(at, sizeof(at), "/proc/self/fd/%d", fd); /* the directory checked, not what the path names now */
        p->mounted = fd >= 0 && mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV, opts) == 0;
        if (fd >= 0)
            close(fd);
    }
    clear_held(p); /* what an earlier agent left: its owner and completeness are unknown */
    log_info("memory checkpoint replicas: sent to the buddy at %d MiB/s at most, a buddy's held in %s%s",
             spec->memory_checkpoint_replica_mbps, dir, p->mounted ? " (a tmpfs of its own)" : "");
}

/*
 * The ranks' tmpfs is full (under 1 MiB or 1% left): a save there fails with
 * ENOSPC in the program. musterd hears it once per filling (ERROR
 * memory_checkpoint_full, an event naming the node), with the figures.
 */
static void check_full(struct memrep *p)
{
    struct statvfs sv;
    if (!p->mem->on || !p->mem->mounted || statvfs(p->mem->dir, &sv) != 0)
        return;
    uint64_t total = (uint64_t)sv.f_blocks * sv.f_frsize, left = (uint64_t)sv.f_bavail * sv.f_frsize;
    bool full = left < (1u << 20) || left < total / 100;
    if (full && !p->full_said) {
        struct proto_msg m = {.type = PROTO_ERROR};
        snprintf(m.u.error.code, sizeof(m.u.error.code), "memory_checkpoint_full");
        snprintf(m.u.error.reason, sizeof(m.u.error.reason),
                 "memory checkpoint directory %s on node %s is full: %" PRIu64 " of %" PRIu64 " MiB used "
                 "(memory_checkpoint_mb); a save there fails with ENOSPC: raise memory_checkpoint_mb or save less",
                 p->mem->dir, p->node, (total - left) >> 20, total >> 20);
        log_warn("%s", m.u.error.reason);
        p->full_said = p->link.send(p->link.ctx, &m) == 0;
    } else if (!full) {
        p->full_said = false;
    }
}

void memrep_heartbeat(struct memrep *p, struct proto_heartbeat *hb)
{
    check_full(p);
    if (!p->on)
        return;
    if (p->replica_of[0]) {
        snprintf(hb->replica_of, sizeof(hb->replica_of), "%s", p->replica_of);
        hb->nreplica = p->nheld;
        memcpy(hb->replica, p->held, p->nheld * sizeof(p->held[0]));
    }
    out_next(p);
}

void memrep_on_msg(struct memrep *p, const struct proto_msg *m)
{
    if (m->type == PROTO_MEM_FILE)
        on_file(p, &m->u.mem_file);
    else if (m->type == PROTO_MEM_FETCH)
        on_fetch(p, &m->u.mem_fetch);
}

bool memrep_waits(struct memrep *p, const struct proto_assign *as)
{
    if (!as->memckpt_from[0] || !p->mem->on)
        return false;
    if (p->wait_gen == as->generation && strcmp(p->wait_tag, as->memckpt) == 0)
        return !p->wait_over;
    if (memckpt_has(p->mem, as->memckpt))
        return false; /* here already (it came back for an earlier try) */
    p->wait_gen = as->generation;
    snprintf(p->wait_tag, sizeof(p->wait_tag), "%s", as->memckpt);
    p->wait_until_ms = uv_now(p->loop) + MEMREP_FETCH_WAIT_MS;
    p->wait_over = false;
    log_info("generation %" PRIu64 ": memory checkpoint %s is not here; the ranks wait for it from node %s",
             as->generation, as->memckpt, as->memckpt_from);
    run_timer(p);
    return true;
}

void memrep_link_lost(struct memrep *p)
{
    out_stop(&p->out);
    in_drop(&p->in[0]);
    in_drop(&p->in[1]);
    p->fetch_tag[0] = '\0';
}

static void stop_job(struct memrep *p, bool remove)
{
    memrep_link_lost(p);
    if (remove && p->on) {
        clear_held(p);
        if (p->mounted)
            umount2(p->dir, MNT_DETACH);
        char parent[PATH_MAX], *slash;
        snprintf(parent, sizeof(parent), "%s", p->dir);
        if ((slash = strrchr(parent, '/')) != NULL) {
            *slash = '\0';
            remove_in(parent[0] ? parent : "/", slash + 1);
        }
    }
    p->on = p->mounted = false;
    p->dir[0] = p->replica_of[0] = p->sent[0] = '\0';
    p->nheld = 0;
}

void memrep_close(struct memrep *p, bool remove)
{
    stop_job(p, remove);
    if (p->timer_init) {
        uv_timer_stop(&p->timer);
        uv_close((uv_handle_t *)&p->timer, NULL);
        p->timer_init = false;
    }
}
