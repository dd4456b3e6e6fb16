#include "worker/agent/memckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/cmdline.h"
#include "common/log.h"
#include "common/memtags.h"
#include "common/mkdirs.h"
#include "common/preflight.h"
#include "worker/agent/agent_rank.h"

void memckpt_job_part(const char *job, char out[JOB_NAME_MAX])
{
    snprintf(out, JOB_NAME_MAX, "%s", job[0] && strcmp(job, ".") != 0 && strcmp(job, "..") != 0 ? job : "_");
    for (char *c = out; *c; c++) /* one path component, the same on every node */
        if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || (*c >= '0' && *c <= '9') || *c == '.' ||
              *c == '_' || *c == '-'))
            *c = '_';
}

int memckpt_path(const struct job_spec *spec, char *out, size_t cap)
{
    char name[JOB_NAME_MAX];
    memckpt_job_part(spec->name, name);
    const char *root = spec->memory_checkpoint_root;
    size_t r = strlen(root);
    while (r > 1 && root[r - 1] == '/')
        r--;
    int n = snprintf(out, cap, "%.*s/muster-%s", (int)r, root, name);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

bool memckpt_own_mount(const char *dir)
{
    char parent[PATH_MAX + 4];
    snprintf(parent, sizeof(parent), "%s/..", dir);
    struct stat a, b;
    return stat(dir, &a) == 0 && stat(parent, &b) == 0 && a.st_dev != b.st_dev;
}

int memckpt_open(struct memckpt *m, const struct job_spec *spec, char *note, size_t note_len, char *why,
                 size_t len)
{
    char dir[PATH_MAX];
    note[0] = '\0';
    if (memckpt_path(spec, dir, sizeof(dir)) != 0)
        return preflight_why(why, len, -ENAMETOOLONG, "memory_checkpoint_root %s: the path is too long",
                             spec->memory_checkpoint_root);
    if (m->on && strcmp(m->dir, dir) == 0) {
        m->keep = spec->memory_checkpoint_keep;
        snprintf(m->rule, sizeof(m->rule), "%s", spec->memory_checkpoint_latest);
        return 0;
    }
    if (m->on)
        memckpt_close(m); /* another job's */
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        int e = errno;
        return preflight_why(why, len, -e, "memory checkpoint directory %s: cannot make it: %s", dir, strerror(e));
    }
    /* The root is shared (/dev/shm: sticky, everyone's): a directory someone
     * else made there first, or a link, is theirs to read and plant in. Once
     * it is the agent's, the sticky bit keeps it from being swapped. */
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    struct stat st;
    if (dfd < 0 || fstat(dfd, &st) != 0 || !S_ISDIR(st.st_mode)) {
        int e = errno;
        if (dfd >= 0)
            close(dfd);
        return preflight_why(why, len, -ENOTDIR, "memory checkpoint directory %s: not a directory (%s)", dir,
                             strerror(e));
    }
    if (st.st_uid != geteuid() || (st.st_mode & S_IWOTH)) {
        close(dfd);
        return preflight_why(why, len, -EPERM, "memory checkpoint directory %s: it exists, owned by uid %u with mode "
                             "%04o, not the agent's (uid %u) alone: refused (whoever made it could read and plant "
                             "checkpoints); remove it", dir, (unsigned)st.st_uid, (unsigned)(st.st_mode & 07777),
                             (unsigned)geteuid());
    }
    memset(m, 0, sizeof(*m));
    snprintf(m->dir, sizeof(m->dir), "%s", dir);
    snprintf(m->rule, sizeof(m->rule), "%s", spec->memory_checkpoint_latest);
    m->keep = spec->memory_checkpoint_keep;
    m->size_mb = (uint64_t)spec->memory_checkpoint_mb;
    m->on = true;
    if (memckpt_own_mount(dir)) {
        close(dfd);
        m->mounted = true; /* the agent's mount, from before its ranks' restart or its own */
        return 0;
    }
    char opts[64], at[64];
    snprintf(opts, sizeof(opts), "size=%" PRIu64 "m,mode=0700", m->size_mb);
    snprintf(at, sizeof(at), "/proc/self/fd/%d", dfd); /* the directory checked, not what the path names now */
    if (geteuid() == 0 && mount("tmpfs", at, "tmpfs", MS_NOSUID | MS_NODEV, opts) == 0) {
        close(dfd);
        m->mounted = true;
        return 0;
    }
    close(dfd);
    snprintf(note, note_len, "%s is a plain directory on %s (%s): memory_checkpoint_mb is checked in pre-flight "
             "but does not bound it", dir, spec->memory_checkpoint_root,
             geteuid() == 0 ? strerror(errno) : "the agent is not root, so it mounts no tmpfs");
    return 0;
}

/* name under dir, by directory descriptor: the ranks write in dir, and a
 * link they plant there is removed, never followed (common/mkdirs.h). */
static void remove_tree(const char *dir, const char *name)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return;
    rmtree_at(fd, name);
    close(fd);
}

int memckpt_share(struct memckpt *m, gid_t gid)
{
    if (!m->on)
        return 0;
    int fd = open(m->dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    /* the group's to write in, new entries in the group (setgid), the agent's to prune */
    int rc = fchown(fd, (uid_t)-1, gid) == 0 && fchmod(fd, 02770) == 0 ? 0 : -errno;
    close(fd);
    return rc;
}

void memckpt_close(struct memckpt *m)
{
    if (!m->on)
        return;
    if (m->mounted)
        umount2(m->dir, MNT_DETACH);
    char parent[PATH_MAX], base[PATH_MAX];
    snprintf(parent, sizeof(parent), "%s", m->dir);
    snprintf(base, sizeof(base), "%s", m->dir);
    remove_tree(dirname(parent), basename(base));
    memset(m, 0, sizeof(*m));
}

/* name is a directory in dir, and a name status and frames can carry. */
static bool tag_dir(const char *dir, const char *name)
{
    if (!name[0] || name[0] == '.' || strlen(name) >= PROTO_CKPT_NAME_MAX || strchr(name, '/') ||
        !proto_valid_label(name, PROTO_CKPT_NAME_MAX))
        return false;
    char path[PATH_MAX + PROTO_CKPT_NAME_MAX + 2];
    struct stat st;
    return snprintf(path, sizeof(path), "%s/%s", dir, name) < (int)sizeof(path) && lstat(path, &st) == 0 &&
           S_ISDIR(st.st_mode);
}

/* The rule's pattern of tag names (glob:PATTERN, committed:PATTERN); NULL for file:NAME. */
static const char *rule_glob(const struct memckpt *m)
{
    if (strncmp(m->rule, "glob:", 5) == 0)
        return m->rule + 5;
    if (strncmp(m->rule, "committed:", 10) == 0)
        return m->rule + 10;
    return NULL;
}

/* name is one of the rule's checkpoints (its directory need not exist). */
static bool rule_names(const struct memckpt *m, const char *name, const char *named)
{
    const char *pattern = rule_glob(m);
    return pattern ? fnmatch(pattern, name, FNM_PERIOD) == 0 : strcmp(name, named) == 0;
}

static struct memckpt_tag *find(struct memckpt *m, const char *name)
{
    for (uint32_t i = 0; i < m->ntags; i++)
        if (strcmp(m->tags[i].name, name) == 0)
            return &m->tags[i];
    return NULL;
}

static void drop(struct memckpt *m, uint32_t i)
{
    m->tags[i] = m->tags[--m->ntags];
}

static void add(struct memckpt *m, const char *name, const struct memckpt_rank *ranks, uint32_t n)
{
    if (m->ntags == MEMCKPT_TAGS_MAX) { /* the oldest leaves the table (not the directory) */
        uint32_t old = 0;
        for (uint32_t i = 1; i < m->ntags; i++)
            if (memtags_cmp(m->tags[i].name, m->tags[old].name) < 0)
                old = i;
        drop(m, old);
    }
    struct memckpt_tag *t = &m->tags[m->ntags++];
    memset(t, 0, sizeof(*t));
    snprintf(t->name, sizeof(t->name), "%s", name);
    t->nranks = n < PROTO_MAX_LOCAL_RANKS ? n : PROTO_MAX_LOCAL_RANKS;
    memcpy(t->seen, ranks, t->nranks * sizeof(*ranks));
    t->orphan = true;
    for (uint32_t i = 0; i < t->nranks; i++)
        if (ranks[i].pid && !ranks[i].finished)
            t->orphan = false;
}

/*
 * Every writer of t is past it, or finished: it took an optimizer step
 * after t appeared (a writer that reports no steps adds no condition), or,
 * by_commit (the rule committed:), it reported a committed checkpoint step
 * of at least t's.
 */
static bool writers_past(const struct memckpt_tag *t, const struct memckpt_rank *ranks, uint32_t n, bool by_commit)
{
    uint64_t step = memtags_step(t->name);
    for (uint32_t i = 0; i < t->nranks; i++) {
        const struct memckpt_rank *s = &t->seen[i];
        if (!s->pid || s->finished || (!by_commit && !s->steps))
            continue;
        if (i >= n || ranks[i].pid != s->pid)
            return false; /* its writer is gone: the save may be half done */
        bool past = by_commit ? ranks[i].committed && ranks[i].committed >= step : ranks[i].step > s->step;
        if (!ranks[i].finished && !past)
            return false;
    }
    return true;
}

/* Removes what keep leaves: complete ones beyond the newest keep, unfinished ones older than the newest complete. */
static void prune(struct memckpt *m)
{
    for (uint32_t i = 0; i < m->ntags;) {
        const struct memckpt_tag *t = &m->tags[i];
        int newer_complete = 0;
        for (uint32_t j = 0; j < m->ntags; j++)
            if (m->tags[j].complete && memtags_cmp(m->tags[j].name, t->name) > 0)
                newer_complete++;
        bool pinned = strcmp(t->name, m->pinned) == 0;
        if (!pinned && ((t->complete && newer_complete >= m->keep) || (!t->complete && newer_complete > 0))) {
            remove_tree(m->dir, t->name);
            drop(m, i);
            continue;
        }
        i++;
    }
}

int memckpt_scan(struct memckpt *m, const struct memckpt_rank *ranks, uint32_t n)
{
    if (!m->on)
        return 0;
    char named[PREFLIGHT_CKPT_MAX + 1] = "", why[PREFLIGHT_WHY_MAX];
    bool file = strncmp(m->rule, "file:", 5) == 0, by_commit = strncmp(m->rule, "committed:", 10) == 0;
    if (file && preflight_latest_ckpt(m->dir, m->rule, named, sizeof(named), why, sizeof(why)) != 0)
        named[0] = '\0';
    int changed = 0;
    for (uint32_t i = 0; i < m->ntags;) { /* gone from the directory */
        if (!tag_dir(m->dir, m->tags[i].name)) {
            changed |= m->tags[i].complete;
            drop(m, i);
            continue;
        }
        i++;
    }
    DIR *d = opendir(m->dir);
    if (d) {
        struct dirent *de;
        while ((de = readdir(d)) != NULL)
            if (rule_names(m, de->d_name, named) && !find(m, de->d_name) && tag_dir(m->dir, de->d_name))
                add(m, de->d_name, ranks, n);
        closedir(d);
    }
    for (uint32_t i = 0; i < m->ntags; i++) {
        struct memckpt_tag *t = &m->tags[i];
        if (t->complete)
            continue;
        bool done;
        if (t->orphan) {
            /* found with no rank running: a file rule's name is the program's commit; a
             * glob's directory counts once a newer one began (saves are one after another) */
            done = file;
            for (uint32_t j = 0; !done && j < m->ntags; j++)
                done = memtags_cmp(m->tags[j].name, t->name) > 0;
        } else {
            done = writers_past(t, ranks, n, by_commit);
        }
        if (done) {
            t->complete = true;
            changed = 1;
        }
    }
    prune(m);
    return changed;
}

bool memckpt_has(const struct memckpt *m, const char *tag)
{
    return m->on && tag_dir(m->dir, tag);
}

void memckpt_adopt(struct memckpt *m, const char *tag)
{
    if (!m->on || !tag_dir(m->dir, tag))
        return;
    struct memckpt_tag *t = find(m, tag);
    if (!t) {
        struct memckpt_rank none[1] = {{0}};
        add(m, tag, none, 0);
        t = &m->tags[m->ntags - 1];
    }
    t->complete = true;
}

uint32_t memckpt_complete(const struct memckpt *m, char (*names)[PROTO_CKPT_NAME_MAX], uint32_t max)
{
    /* selection of the newest max, written oldest first */
    const struct memckpt_tag *pick[MEMCKPT_TAGS_MAX];
    uint32_t k = 0;
    for (uint32_t i = 0; i < m->ntags; i++)
        if (m->tags[i].complete)
            pick[k++] = &m->tags[i];
    for (uint32_t i = 1; i < k; i++) /* insertion sort, oldest first */
        for (uint32_t j = i; j > 0 && memtags_cmp(pick[j - 1]->name, pick[j]->name) > 0; j--) {
            const struct memckpt_tag *x = pick[j];
            pick[j] = pick[j - 1];
            pick[j - 1] = x;
        }
    uint32_t from = k > max ? k - max : 0;
    for (uint32_t i = from; i < k; i++)
        snprintf(names[i - from], PROTO_CKPT_NAME_MAX, "%s", pick[i]->name);
    return k - from;
}

/* The file that names the checkpoint to load: file:NAME's, else DeepSpeed's `latest`. */
static void latest_path(const struct memckpt *m, char *out, size_t cap)
{
    snprintf(out, cap, "%s/%s", m->dir, strncmp(m->rule, "file:", 5) == 0 ? m->rule + 5 : "latest");
}

int memckpt_restore(struct memckpt *m, const char *tag, char *why, size_t len)
{
    if (!m->on)
        return 0;
    if (tag[0] && !tag_dir(m->dir, tag))
        return preflight_why(why, len, -ENOENT, "memory checkpoint %s: not in %s on this node", tag, m->dir);
    bool file = strncmp(m->rule, "file:", 5) == 0;
    DIR *d = opendir(m->dir);
    if (!d) {
        int e = errno;
        return preflight_why(why, len, -e, "memory checkpoint directory %s: cannot list it: %s", m->dir,
                             strerror(e));
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        /* a file rule names one at a time: every directory may be one of its checkpoints */
        if ((file || rule_names(m, de->d_name, "")) && tag_dir(m->dir, de->d_name) &&
            (!tag[0] || memtags_cmp(de->d_name, tag) > 0))
            remove_tree(m->dir, de->d_name);
    }
    closedir(d);
    for (uint32_t i = 0; i < m->ntags;) {
        if (!tag_dir(m->dir, m->tags[i].name)) {
            drop(m, i);
            continue;
        }
        i++;
    }
    char path[PATH_MAX + 300], tmp[PATH_MAX + 320];
    latest_path(m, path, sizeof(path));
    if (!tag[0]) {
        if (unlink(path) != 0 && errno != ENOENT) {
            int e = errno;
            return preflight_why(why, len, -e, "memory checkpoint directory: cannot remove %s: %s", path,
                                 strerror(e));
        }
        return 0;
    }
    snprintf(tmp, sizeof(tmp), "%s.muster-tmp", path);
    /* the ranks write this directory: whatever they left at tmp (a FIFO, a
     * link) goes, and the file is made afresh, never opened through it */
    if (unlink(tmp) != 0 && errno != ENOENT && errno != EISDIR)
        return preflight_why(why, len, -errno, "memory checkpoint directory: cannot remove %s: %s", tmp,
                             strerror(errno));
    int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0644);
    size_t n = strlen(tag);
    bool ok = fd >= 0 && write(fd, tag, n) == (ssize_t)n;
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (!ok || rename(tmp, path) != 0) {
        e = ok ? errno : e;
        unlink(tmp);
        return preflight_why(why, len, -e, "memory checkpoint directory: cannot write %s: %s", path, strerror(e));
    }
    return 0;
}

char **memckpt_env(char **env, const char *dir)
{
    if (!env)
        return NULL;
    const size_t klen = strlen(MEMCKPT_ENV "=");
    size_t n = 0, k = 0;
    while (env[n])
        n++;
    char **out = calloc(n + 2, sizeof(char *));
    char *var = malloc(klen + strlen(dir) + 1);
    if (!out || !var) {
        free(out);
        free(var);
        cmdline_free(env);
        return NULL;
    }
    sprintf(var, "%s=%s", MEMCKPT_ENV, dir);
    for (size_t i = 0; i < n; i++) {
        if (strncmp(env[i], MEMCKPT_ENV "=", klen) == 0)
            free(env[i]);
        else
            out[k++] = env[i];
    }
    out[k] = var;
    free(env); /* its strings moved to out */
    return out;
}

/* ---- the agent's side --------------------------------------------------- */

void memckpt_job(struct memckpt *m, const struct job_spec *spec)
{
    if (!spec->memory_checkpoint_mb) {
        memckpt_close(m);
        return;
    }
    char note[PATH_MAX + 200], why[PATH_MAX + 200];
    bool had = m->on;
    if (memckpt_open(m, spec, note, sizeof(note), why, sizeof(why)) != 0) {
        log_error("%s; the ranks get no %s", why, MEMCKPT_ENV);
        return;
    }
    if (!had)
        log_info("memory checkpoints in %s (%d MiB%s)", m->dir, spec->memory_checkpoint_mb,
                 m->mounted ? ", a tmpfs of that size" : "");
    if (note[0])
        log_warn("%s", note);
}

void memckpt_welcome(struct memckpt *m, const struct job_spec *spec)
{
    char dir[PATH_MAX];
    struct stat st;
    m->expected = false;
    if (!spec->memory_checkpoint_mb || memckpt_path(spec, dir, sizeof(dir)) != 0)
        return;
    if (m->on || (lstat(dir, &st) == 0 && S_ISDIR(st.st_mode)))
        memckpt_job(m, spec);
    m->expected = !m->on;
}

void memckpt_look(struct memckpt *m, struct agent_rank *const *ranks, uint32_t n)
{
    if (!m->on)
        return;
    struct memckpt_rank rs[PROTO_MAX_LOCAL_RANKS];
    memset(rs, 0, sizeof(rs));
    for (uint32_t i = 0; i < n && i < PROTO_MAX_LOCAL_RANKS; i++) {
        const struct agent_rank *r = ranks[i];
        if (r)
            rs[i] = (struct memckpt_rank){.pid = r->pid, .steps = r->beat_ms && !r->beat.silent, .step = r->beat.step,
                                          .committed = r->beat.checkpoint_step,
                                          .finished = !r->running && r->exit_code == 0 && r->exit_signal == 0};
    }
    char newest[1][PROTO_CKPT_NAME_MAX];
    if (memckpt_scan(m, rs, n) && memckpt_complete(m, newest, 1))
        log_info("memory checkpoint %s is complete on this node", newest[0]);
}

void memckpt_heartbeat(struct memckpt *m, struct agent_rank *const *ranks, uint32_t n, struct proto_heartbeat *hb)
{
    if (!m->on) {
        hb->has_memckpt = m->expected; /* an empty list: none here yet */
        return;
    }
    memckpt_look(m, ranks, n);
    hb->has_memckpt = 1;
    hb->nmemckpt = memckpt_complete(m, hb->memckpt, PROTO_MEMCKPT_MAX);
}

void memckpt_rank_exit(struct memckpt *m, struct agent_rank *const *ranks, uint32_t n)
{
    if (!m->on)
        return;
    memckpt_look(m, ranks, n);
    for (uint32_t i = 0; i < n; i++)
        if (!ranks[i] || ranks[i]->running || ranks[i]->exit_code != 0 || ranks[i]->exit_signal != 0)
            return;
    log_info("every rank finished: removing the memory checkpoint directory %s", m->dir);
    memckpt_close(m);
}

void memckpt_ready(struct memckpt *m, const struct proto_assign *as, struct agent_rank *const *ranks, uint32_t n,
                   bool kept)
{
    if (!m->on || !as->has_memckpt || m->restored_gen == as->generation || kept)
        return; /* ranks that stay keep their state: the directory is left as they see it */
    memckpt_look(m, ranks, n);
    m->restored_gen = as->generation;
    char why[PATH_MAX + 300];
    if (memckpt_restore(m, as->memckpt, why, sizeof(why)) != 0)
        log_error("generation %" PRIu64 ": %s; the ranks start from what is there", as->generation, why);
    else if (as->memckpt[0])
        log_info("generation %" PRIu64 ": resumed from memory checkpoint step %" PRIu64 " (%s, the newest "
                 "complete on every node)", as->generation, memtags_step(as->memckpt), as->memckpt);
    else
        log_info("generation %" PRIu64 ": no memory checkpoint is complete on every node: the ranks start afresh",
                 as->generation);
}
