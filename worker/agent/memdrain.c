#include "worker/agent/memdrain.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/log.h"
#include "common/memtags.h"
#include "common/mkdirs.h"
#include "worker/agent/memrep.h"

#define COPY_CHUNK (1u << 20)

bool memdrain_due(const char *tag, const char *last, uint64_t window)
{
    if (!window || !tag[0] || (last[0] && memtags_cmp(tag, last) <= 0))
        return false;
    return memtags_step(tag) / window > (last[0] ? memtags_step(last) : 0) / window;
}

/* ---- the thread pool's side: paths opened part by part, never through a link ---- */

static int fail(struct memdrain_task *t, int e, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct memdrain_task *t, int e, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->why, sizeof(t->why), fmt, ap);
    va_end(ap);
    t->rc = e < 0 ? e : -e;
    return t->rc;
}

/* checkpoint_dir/muster-memory/JOB/NODE, each part below checkpoint_dir the agent's alone; the fd or -errno (why
 * set). */
static int open_node_dir(struct memdrain_task *t, bool create)
{
    if (!proto_valid_name(t->node))
        return fail(t, EINVAL, "node name %s cannot name a directory", t->node);
    if (create && mkdirs(t->ckpt_dir, 0755) != 0)
        return fail(t, errno, "checkpoint_dir %s: cannot make it: %s", t->ckpt_dir, strerror(errno));
    int fd = open(t->ckpt_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* the operator's: followed */
    if (fd < 0)
        return fail(t, errno, "checkpoint_dir %s: cannot open it: %s", t->ckpt_dir, strerror(errno));
    const char *parts[3] = {MEMDRAIN_SUBDIR, t->job, t->node};
    for (int i = 0; i < 3; i++) {
        if (create && mkdirat(fd, parts[i], 0700) != 0 && errno != EEXIST) {
            int e = errno;
            close(fd);
            return fail(t, e, "%s: cannot make its part %s: %s", t->where, parts[i], strerror(e));
        }
        int next = openat(fd, parts[i], O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        int e = errno;
        close(fd);
        struct stat st;
        if (next < 0)
            return fail(t, e, "%s: cannot open its part %s: %s", t->where, parts[i],
                        e == ELOOP || e == ENOTDIR ? "not a directory (a link?)" : strerror(e));
        if (fstat(next, &st) != 0 || st.st_uid != geteuid() || (st.st_mode & 022)) {
            close(next);
            return fail(t, EPERM, "%s (%s): not the agent's alone (owner uid %u, mode %04o): refused", t->where,
                        parts[i], (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777));
        }
        fd = next;
    }
    return fd;
}

/* One file: in to out, every byte of size (a file that changed meanwhile fails), then synced. */
static int copy_file(int in, int out, uint64_t size, uint8_t *buf)
{
    uint64_t done = 0;
    for (;;) {
        ssize_t got = read(in, buf, COPY_CHUNK);
        if (got < 0 && errno == EINTR)
            continue;
        if (got < 0)
            return -errno;
        if (got == 0)
            break;
        for (ssize_t off = 0; off < got;) {
            ssize_t w = write(out, buf + off, (size_t)(got - off));
            if (w < 0 && errno == EINTR)
                continue;
            if (w < 0)
                return -errno;
            off += w;
        }
        done += (uint64_t)got;
    }
    if (done != size)
        return -ESTALE;
    return fsync(out) == 0 ? 0 : -errno;
}

/*
 * from/TAG (fromfd: the tag directory) into todir as STAGE+TAG, each file
 * synced, then renamed to TAG and todir synced. mode: of the files made
 * (their directories get x too); stage_mode: of the stage itself.
 */
static int copy_tag(struct memdrain_task *t, int fromfd, const char *from, int todir, const char *to, mode_t mode,
                    mode_t stage_mode)
{
    char stage[PROTO_CKPT_NAME_MAX + sizeof(MEMDRAIN_STAGE)];
    snprintf(stage, sizeof(stage), MEMDRAIN_STAGE "%s", t->tag);
    rmtree_at(todir, stage); /* a copy cut short before */
    char (*paths)[PROTO_MEMPATH_MAX] = malloc(MEMREP_FILES_MAX * sizeof(*paths));
    uint64_t *sizes = malloc(MEMREP_FILES_MAX * sizeof(*sizes));
    uint8_t *buf = malloc(COPY_CHUNK);
    int sfd = -1;
    if (!paths || !sizes || !buf) {
        fail(t, ENOMEM, "no memory to copy %s", t->tag);
        goto out;
    }
    int n = memrep_list(fromfd, paths, sizes, MEMREP_FILES_MAX, t->limit);
    if (n < 0) {
        fail(t, n, "%s/%s: not copied: %s", from, t->tag,
             n == -ELOOP ? "it holds a link or a file that is not regular"
             : n == -EFBIG ? "its files pass memory_checkpoint_mb"
             : n == -ENAMETOOLONG ? "a path in it is too long or not plain"
             : n == -E2BIG ? "it holds over 4096 files" : strerror(-n));
        goto out;
    }
    if (mkdirat(todir, stage, 0700) != 0 ||
        (sfd = openat(todir, stage, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
        fail(t, errno, "%s: cannot make %s: %s", to, stage, strerror(errno));
        goto out;
    }
    fchmod(sfd, stage_mode);
    for (int i = 0; i < n; i++) {
        int in = memrep_open_under(fromfd, paths[i], false, 0);
        int o = in < 0 ? in : memrep_open_under(sfd, paths[i], true, mode);
        int rc = o < 0 ? o : copy_file(in, o, sizes[i], buf);
        if (in >= 0)
            close(in);
        if (o >= 0)
            close(o);
        if (rc != 0) {
            fail(t, rc, "%s/%s/%s to %s: %s", from, t->tag, paths[i], to,
                 rc == -ESTALE ? "it changed while it was copied" : strerror(-rc));
            goto out;
        }
        t->bytes += sizes[i];
        t->files++;
    }
    if (fsync(sfd) != 0) {
        fail(t, errno, "%s/%s: cannot sync it: %s", to, stage, strerror(errno));
        goto out;
    }
    rmtree_at(todir, t->tag);
    if (renameat(todir, stage, todir, t->tag) != 0) {
        fail(t, errno, "%s: cannot rename %s to %s: %s", to, stage, t->tag, strerror(errno));
        goto out;
    }
    if (fsync(todir) != 0)
        fail(t, errno, "%s: cannot sync it after the rename: %s", to, strerror(errno));
out:
    if (sfd >= 0)
        close(sfd);
    if (t->rc != 0)
        rmtree_at(todir, stage);
    free(paths);
    free(sizes);
    free(buf);
    return t->rc;
}

static int by_tag(const void *a, const void *b)
{
    return memtags_cmp(*(char *const *)a, *(char *const *)b);
}

/* NODE's entries: stages removed, tag directories beyond keep removed, the newest left in t->names. */
static void list_node(struct memdrain_task *t, int fd)
{
    int dup_fd = dup(fd);
    DIR *d = dup_fd >= 0 ? fdopendir(dup_fd) : NULL;
    if (!d) {
        if (dup_fd >= 0)
            close(dup_fd);
        fail(t, errno, "%s: cannot list it: %s", t->where, strerror(errno));
        return;
    }
    char **tags = NULL;
    size_t k = 0, cap = 0;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        struct stat st;
        if (strncmp(de->d_name, MEMDRAIN_STAGE, strlen(MEMDRAIN_STAGE)) == 0) {
            rmtree_at(fd, de->d_name); /* a copy that never finished: never a checkpoint */
            t->cut_short++;
            continue;
        }
        if (de->d_name[0] == '.' || strlen(de->d_name) >= PROTO_CKPT_NAME_MAX ||
            !proto_valid_label(de->d_name, PROTO_CKPT_NAME_MAX) ||
            fstatat(fd, de->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if (k == cap) {
            cap = cap ? 2 * cap : 16;
            char **more = realloc(tags, cap * sizeof(*tags));
            if (!more)
                break;
            tags = more;
        }
        if ((tags[k] = strdup(de->d_name)) != NULL)
            k++;
    }
    closedir(d);
    if (tags)
        qsort(tags, k, sizeof(*tags), by_tag);
    size_t from = k > (size_t)t->keep ? k - (size_t)t->keep : 0;
    for (size_t i = 0; i < from; i++)
        rmtree_at(fd, tags[i]);
    size_t first = k - from > PROTO_MEMCKPT_MAX ? k - PROTO_MEMCKPT_MAX : from;
    t->n = 0;
    t->listed = true;
    for (size_t i = first; i < k; i++)
        snprintf(t->names[t->n++], PROTO_CKPT_NAME_MAX, "%s", tags[i]);
    for (size_t i = 0; i < k; i++)
        free(tags[i]);
    free(tags);
}

static int open_sub(const char *dir, const char *name, int *parent)
{
    *parent = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    return *parent < 0 ? -1 : openat(*parent, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
}

void memdrain_run(struct memdrain_task *t)
{
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    t->rc = 0;
    t->why[0] = '\0';
    t->bytes = t->files = t->cut_short = t->n = 0;
    t->listed = false;
    const char *node_path = t->where;
    snprintf(t->where, sizeof(t->where), "%s/%s/%s/%s", t->ckpt_dir, MEMDRAIN_SUBDIR, t->job, t->node);
    int nfd = open_node_dir(t, t->kind != MEMDRAIN_RESTORE);
    if (nfd < 0)
        return;
    int parent = -1, src = -1;
    if (t->kind == MEMDRAIN_DRAIN) {
        if ((src = open_sub(t->mem_dir, t->tag, &parent)) < 0)
            fail(t, errno, "%s/%s: cannot open it: %s", t->mem_dir, t->tag, strerror(errno));
        else
            copy_tag(t, src, t->mem_dir, nfd, node_path, 0600, 0700);
    } else if (t->kind == MEMDRAIN_RESTORE) {
        src = openat(nfd, t->tag, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        parent = open(t->mem_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (src < 0)
            fail(t, errno, "%s/%s: cannot open it: %s", node_path, t->tag, strerror(errno));
        else if (parent < 0)
            fail(t, errno, "%s: cannot open it: %s", t->mem_dir, strerror(errno));
        else /* the ranks' files: their group's, as memckpt_share makes the directory */
            copy_tag(t, src, node_path, parent, t->mem_dir, 0660, 02770);
    }
    if (src >= 0)
        close(src);
    if (parent >= 0)
        close(parent);
    if (t->kind != MEMDRAIN_RESTORE) {
        int rc = t->rc; /* a failed drain still lists what is there */
        list_node(t, nfd);
        if (rc != 0)
            t->rc = rc;
    }
    close(nfd);
    clock_gettime(CLOCK_MONOTONIC, &t1);
    t->ms = (uint64_t)((t1.tv_sec - t0.tv_sec) * 1000 + (t1.tv_nsec - t0.tv_nsec) / 1000000);
}

/* ---- the loop's side ---- */

static void start(struct memdrain *d);

static void work_cb(uv_work_t *w)
{
    memdrain_run(w->data);
}

static void after_cb(uv_work_t *w, int status)
{
    struct memdrain *d = (struct memdrain *)((char *)w - offsetof(struct memdrain, work));
    struct memdrain_task *t = &d->task;
    d->busy = false;
    if (t->kind == MEMDRAIN_DRAIN)
        d->mem->pinned[0] = '\0';
    if (d->closing || status == UV_ECANCELED)
        return;
    if (t->listed) {
        d->ndrained = t->n;
        memcpy(d->drained, t->names, t->n * sizeof(t->names[0]));
    }
    if (t->cut_short)
        log_warn("%s: %u drain(s) cut short before (%s* directories) removed, never used", t->where, t->cut_short,
                 MEMDRAIN_STAGE);
    if (t->kind == MEMDRAIN_SCAN) {
        d->scanned = true;
        if (t->rc != 0)
            log_error("memory checkpoint drains: %s; none is known", t->why);
        else
            log_info("memory checkpoints drained to %s: %u here%s%s", t->where, t->n, t->n ? ", the newest " : "",
                     t->n ? t->names[t->n - 1] : "");
    } else if (t->kind == MEMDRAIN_DRAIN) {
        if (t->rc != 0)
            log_warn("memory checkpoint %s not drained: %s", t->tag, t->why);
        else
            log_info("memory checkpoint %s (step %" PRIu64 ") drained to %s: %" PRIu64 " bytes in %u files, "
                     "%" PRIu64 " ms", t->tag, memtags_step(t->tag), t->where, t->bytes, t->files, t->ms);
    } else {
        if (t->rc != 0) {
            log_error("generation %" PRIu64 ": memory checkpoint %s not copied back from checkpoint_dir: %s; the "
                      "ranks start from what is here", d->wait_gen, t->tag, t->why);
        } else {
            memckpt_adopt(d->mem, t->tag);
            log_info("generation %" PRIu64 ": memory checkpoint %s copied back from its drained copy in %s: "
                     "%" PRIu64 " bytes in %u files, %" PRIu64 " ms", d->wait_gen, t->tag, t->where, t->bytes, t->files,
                     t->ms);
        }
        d->wait_over = true;
        d->restored(d->ctx);
    }
    start(d);
}

static void queue(struct memdrain *d, enum memdrain_kind kind, const char *tag)
{
    struct memdrain_task *t = &d->task;
    memset(t, 0, sizeof(*t));
    t->kind = kind;
    snprintf(t->ckpt_dir, sizeof(t->ckpt_dir), "%s", d->ckpt_dir);
    snprintf(t->job, sizeof(t->job), "%s", d->job);
    snprintf(t->node, sizeof(t->node), "%s", d->node);
    snprintf(t->mem_dir, sizeof(t->mem_dir), "%s", d->mem->dir);
    snprintf(t->tag, sizeof(t->tag), "%s", tag);
    t->keep = d->keep;
    t->limit = d->limit;
    d->work.data = t;
    int rc = uv_queue_work(d->loop, &d->work, work_cb, after_cb);
    if (rc != 0) {
        log_error("memory checkpoint drains: cannot queue work: %s", uv_strerror(rc));
        return;
    }
    d->busy = true;
    if (kind == MEMDRAIN_DRAIN) /* memckpt's prune leaves it while it is read */
        snprintf(d->mem->pinned, sizeof(d->mem->pinned), "%s", tag);
}

/* The next task, if none runs: a listing, then a restore waited for, then a drain that is due. */
static void start(struct memdrain *d)
{
    if (d->busy || d->closing || !d->on)
        return;
    if (d->scan_wanted) {
        d->scan_wanted = false;
        queue(d, MEMDRAIN_SCAN, "");
        return;
    }
    if (d->restore_wanted && d->mem->on) {
        d->restore_wanted = false;
        queue(d, MEMDRAIN_RESTORE, d->wait_tag);
        return;
    }
    if (!d->scanned || !d->mem->on)
        return;
    /* the oldest due one still here: the first of its window, which every node drains alike */
    char done[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
    uint32_t n = memckpt_complete(d->mem, done, PROTO_MEMCKPT_MAX);
    const char *last = d->ndrained ? d->drained[d->ndrained - 1] : "";
    for (uint32_t i = 0; i < n; i++) {
        if (!memdrain_due(done[i], last, d->window))
            continue;
        if (strcmp(done[i], d->tried) == 0)
            return; /* it failed: the next window's may do */
        snprintf(d->tried, sizeof(d->tried), "%s", done[i]);
        queue(d, MEMDRAIN_DRAIN, done[i]);
        return;
    }
}

void memdrain_init(struct memdrain *d, uv_loop_t *loop, struct memckpt *mem, const char *node,
                   void (*restored)(void *ctx), void *ctx)
{
    memset(d, 0, sizeof(*d));
    d->loop = loop;
    d->mem = mem;
    d->restored = restored;
    d->ctx = ctx;
    snprintf(d->node, sizeof(d->node), "%s", node);
    d->work.data = &d->task;
}

void memdrain_job(struct memdrain *d, const struct job_spec *spec)
{
    bool want = spec->memory_checkpoint_mb && spec->memory_checkpoint_drain_steps && spec->checkpoint_dir[0];
    char job[JOB_NAME_MAX];
    memckpt_job_part(spec->name, job);
    if (!want || strcmp(d->ckpt_dir, spec->checkpoint_dir) != 0 || strcmp(d->job, job) != 0) { /* another job's */
        d->on = d->scanned = d->restore_wanted = false;
        d->ndrained = 0;
        d->ckpt_dir[0] = d->tried[0] = '\0';
        d->wait_gen = 0;
    }
    d->window = (uint64_t)spec->memory_checkpoint_drain_steps;
    d->keep = spec->memory_checkpoint_drain_keep;
    d->limit = (uint64_t)spec->memory_checkpoint_mb << 20;
    if (!want || d->on)
        return;
    snprintf(d->ckpt_dir, sizeof(d->ckpt_dir), "%s", spec->checkpoint_dir);
    snprintf(d->job, sizeof(d->job), "%s", job);
    d->on = true;
    d->scan_wanted = true;
    start(d);
}

void memdrain_heartbeat(struct memdrain *d, struct proto_heartbeat *hb)
{
    if (!d->on)
        return;
    if (!d->scanned) { /* musterd waits for the list (heartbeat_timeout_ms at most) rather than name one without it */
        hb->has_memckpt = 0;
        hb->nmemckpt = 0;
        return;
    }
    hb->has_drained = 1;
    hb->ndrained = d->ndrained;
    memcpy(hb->drained, d->drained, d->ndrained * sizeof(d->drained[0]));
    start(d);
}

bool memdrain_waits(struct memdrain *d, const struct proto_assign *as)
{
    if (!as->memckpt_drained || !as->memckpt[0] || !d->on || !d->mem->on)
        return false;
    if (d->wait_gen == as->generation && strcmp(d->wait_tag, as->memckpt) == 0)
        return !d->wait_over;
    if (memckpt_has(d->mem, as->memckpt))
        return false; /* here already */
    d->wait_gen = as->generation;
    snprintf(d->wait_tag, sizeof(d->wait_tag), "%s", as->memckpt);
    d->wait_over = false;
    d->restore_wanted = true;
    log_info("generation %" PRIu64 ": memory checkpoint %s is in no node's memory; the ranks wait for its drained "
             "copy from %s/%s/%s/%s", as->generation, as->memckpt, d->ckpt_dir, MEMDRAIN_SUBDIR, d->job, d->node);
    start(d);
    return true;
}

void memdrain_close(struct memdrain *d)
{
    d->closing = true;
    d->on = false;
    if (d->busy)
        uv_cancel((uv_req_t *)&d->work); /* fails once it runs: after_cb comes when it is done */
}
