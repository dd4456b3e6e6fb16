#include "common/preflight.h"

#include <dirent.h>
#include <dlfcn.h>
#include <stdarg.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <ftw.h>
#include <stdbool.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "common/mkdirs.h"
#include "common/plan.h"

/* The llm.c token file (worker/train/data.h): int32 header[256], then uint16 tokens. */
#define TOKENS_MAGIC 20240520
#define TOKENS_VERSION 1
#define HEADER_BYTES (256 * 4)
#define TEXT_PROBE 4096
#define CHUNK (1u << 20)

int preflight_why(char *why, size_t len, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(why, len, fmt, ap);
    va_end(ap);
    return rc;
}

/* Opens a regular file for reading; *size gets its size. */
static int open_regular(const char *path, uint64_t *size, char *why, size_t len)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        return preflight_why(why, len, -e, "data %s: %s%s", path, strerror(e),
                   e == ENOENT ? ": copy the data file to this node (or fix the job's data path)"
                   : e == EACCES ? ": make it readable by the user the agent runs as" : "");
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return preflight_why(why, len, -EINVAL, "data %s: not a regular file", path);
    }
    *size = (uint64_t)st.st_size;
    return fd;
}

/* Reads up to n bytes at the current offset (fewer only at the end). */
static ssize_t read_some(int fd, void *buf, size_t n)
{
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, (char *)buf + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        if (k == 0)
            break;
        got += (size_t)k;
    }
    return (ssize_t)got;
}

/* Classifies the file from its first bytes: token file (count checked
 * against the size) or text; anything else is refused. */
static int classify(const char *path, const uint8_t *head, size_t n, uint64_t size, struct preflight_data *d,
                    char *why, size_t len)
{
    int32_t h[3] = {0, 0, 0};
    memcpy(h, head, n < sizeof(h) ? n : sizeof(h));
    memset(d, 0, sizeof(*d));
    if (n >= 4 && h[0] == TOKENS_MAGIC) {
        if (size < HEADER_BYTES)
            return preflight_why(why, len, -EINVAL, "data %s: truncated token file: %" PRIu64 " bytes, less than the "
                       "%d-byte header", path, size, HEADER_BYTES);
        if (h[1] != TOKENS_VERSION)
            return preflight_why(why, len, -EINVAL, "data %s: token file version %d, expected %d", path, h[1], TOKENS_VERSION);
        if (h[2] < 0 || (uint64_t)h[2] * 2 != size - HEADER_BYTES)
            return preflight_why(why, len, -EINVAL, "data %s: token file header says %d tokens, the file holds %" PRIu64
                       " bytes of tokens: the file is truncated or not what the header says", path, h[2],
                       size - HEADER_BYTES);
        d->tokens_file = 1;
        d->tokens = (uint64_t)h[2];
        return 0;
    }
    if (memchr(head, 0, n < TEXT_PROBE ? n : TEXT_PROBE))
        return preflight_why(why, len, -EINVAL, "data %s: neither text nor an llm.c token file: header holds magic %d, "
                   "version %d, count %d (expected magic %d, version %d)", path, h[0], h[1], h[2],
                   TOKENS_MAGIC, TOKENS_VERSION);
    d->tokens = size;
    return 0;
}

int preflight_data_tokens(const char *path, struct preflight_data *d)
{
    char why[PREFLIGHT_WHY_MAX];
    uint8_t head[TEXT_PROBE];
    uint64_t size;
    int fd = open_regular(path, &size, why, sizeof(why));
    if (fd < 0)
        return fd;
    ssize_t n = read_some(fd, head, sizeof(head));
    close(fd);
    if (n < 0)
        return (int)n;
    return classify(path, head, (size_t)n, size, d, why, sizeof(why));
}

int preflight_data_check(const char *path, int vocab, int seq_len, double val_fraction,
                         struct preflight_data *d, char *why, size_t len)
{
    uint64_t size;
    int fd = open_regular(path, &size, why, len);
    if (fd < 0)
        return fd;
    uint8_t *buf = malloc(CHUNK);
    if (!buf) {
        close(fd);
        return preflight_why(why, len, -ENOMEM, "data %s: out of memory to read it", path);
    }
    int rc = 0;
    ssize_t n = read_some(fd, buf, CHUNK);
    if (n < 0) {
        rc = preflight_why(why, len, (int)n, "data %s: read error: %s", path, strerror((int)-n));
    } else {
        rc = classify(path, buf, (size_t)n, size, d, why, len);
    }
    /* the largest token, chunk by chunk (a token file's tokens start after its header) */
    size_t at = d->tokens_file ? HEADER_BYTES : 0;
    int max = 0;
    while (rc == 0 && n > 0) {
        if (d->tokens_file) {
            for (size_t i = at; i + 1 < (size_t)n; i += 2) {
                uint16_t t;
                memcpy(&t, buf + i, 2);
                if (t > max)
                    max = t;
            }
        } else {
            for (size_t i = at; i < (size_t)n; i++)
                if (buf[i] > max)
                    max = buf[i];
        }
        at = 0;
        n = read_some(fd, buf, CHUNK); /* chunks are even: token pairs never straddle */
        if (n < 0)
            rc = preflight_why(why, len, (int)n, "data %s: read error: %s", path, strerror((int)-n));
    }
    free(buf);
    close(fd);
    if (rc)
        return rc;
    d->max_token = max;
    if (max >= vocab)
        return preflight_why(why, len, -EINVAL, "data %s: token %d is outside the model's vocabulary of %d: set the job's "
                   "vocab (or model) to one that covers the data", path, max, vocab);
    uint64_t nval = (uint64_t)((double)d->tokens * val_fraction), ntrain = d->tokens - nval;
    uint64_t need = (uint64_t)seq_len + 2;
    if (ntrain < need || (val_fraction > 0 && nval < need))
        return preflight_why(why, len, -EINVAL, "data %s: %" PRIu64 " tokens are too few: each split needs more than %d "
                   "(seq_len + 1) (train %" PRIu64 ", validation %" PRIu64 ")", path, d->tokens, seq_len + 1,
                   ntrain, nval);
    return 0;
}

/* Free bytes for the checkpoint check: statvfs, or the test hook's file. */
static int free_space(const char *dir, uint64_t *out)
{
    const char *hook = getenv(PREFLIGHT_FREE_HOOK_ENV);
    if (hook && *hook) {
        FILE *f = fopen(hook, "r");
        unsigned long long v;
        int ok = f && fscanf(f, "%llu", &v) == 1;
        if (f)
            fclose(f);
        if (ok) {
            *out = v;
            return 0;
        }
    }
    struct statvfs sv;
    if (statvfs(dir, &sv) != 0)
        return -errno;
    *out = (uint64_t)sv.f_bavail * (uint64_t)sv.f_frsize;
    return 0;
}

/*
 * A file can be made and removed in dir, and need bytes are free there (*free_bytes: what is).
 * what names dir in messages ("checkpoint_dir ck"); fix says what to do when it is not writable,
 * asks ("2 checkpoints of this job need") and room what to do when it is too full.
 */
static int writable_with_room(const char *dir, const char *what, const char *fix, uint64_t need, const char *asks,
                              const char *room, uint64_t *free_bytes, char *why, size_t len)
{
    char probe[4096 + 64];
    /* a unique name: a probe left by a killed agent, or one of another node (a shared
     * directory, the same pid in another container) does not make dir look unwritable */
    snprintf(probe, sizeof(probe), "%s/.muster-preflight-XXXXXX", dir);
    int fd = mkostemp(probe, O_CLOEXEC);
    if (fd < 0) {
        int e = errno;
        return preflight_why(why, len, -e, "%s: not writable: %s: %s", what, strerror(e), fix);
    }
    ssize_t w = write(fd, "x", 1);
    int e = w == 1 ? 0 : (w < 0 ? errno : ENOSPC);
    close(fd);
    unlink(probe);
    if (e)
        return preflight_why(why, len, -e, "%s: cannot write: %s", what, strerror(e));
    int rc = free_space(dir, free_bytes);
    if (rc)
        return preflight_why(why, len, rc, "%s: cannot tell its free space: %s", what, strerror(-rc));
    if (*free_bytes < need) {
        char a[32], b[32];
        return preflight_why(why, len, -ENOSPC, "%s: %s free, %s %s: %s", what,
                   plan_bytes_str(a, sizeof(a), (double)*free_bytes), asks, plan_bytes_str(b, sizeof(b), (double)need),
                   room);
    }
    return 0;
}

int preflight_ckpt_dir(const char *dir, uint64_t need, uint64_t *free_bytes, char *why, size_t len)
{
    int rc = mkdirs(dir, 0755);
    if (rc)
        return preflight_why(why, len, rc, "checkpoint_dir %s: cannot create it: %s", dir, strerror(-rc));
    char what[4096 + 32];
    snprintf(what, sizeof(what), "checkpoint_dir %s", dir);
    return writable_with_room(dir, what, "give the agent's user write access or point checkpoint_dir elsewhere", need,
                              "2 checkpoints of this job need", "free space or point checkpoint_dir at a larger disk",
                              free_bytes, why, len);
}

int preflight_readable(const char *path, char *why, size_t len)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        return preflight_why(why, len, -e, "require_readable %s: %s%s", path, strerror(e),
                   e == ENOENT ? ": copy it to this node or mount the file system that holds it" : "");
    }
    int dir = S_ISDIR(st.st_mode);
    /* O_NONBLOCK: a FIFO does not wait for a writer; O_NOCTTY: a terminal named here does not
     * become the agent's (a service is a session leader without one; its hang-up would be ours) */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | (dir ? O_DIRECTORY : 0));
    if (fd < 0) {
        int e = errno;
        return preflight_why(why, len, -e, "require_readable %s: cannot open it: %s", path, strerror(e));
    }
    int e = 0;
    if (dir) {
        DIR *d = fdopendir(fd);
        if (!d) {
            e = errno;
            close(fd);
        } else {
            errno = 0;
            if (!readdir(d))
                e = errno;
            closedir(d);
        }
    } else {
        char b;
        if (S_ISREG(st.st_mode) && read(fd, &b, 1) < 0)
            e = errno;
        close(fd);
    }
    if (e)
        return preflight_why(why, len, -e, "require_readable %s: cannot read it: %s", path, strerror(e));
    return 0;
}

int preflight_writable(const char *dir, uint64_t need, char *why, size_t len)
{
    struct stat st;
    if (stat(dir, &st) != 0) {
        int e = errno;
        return preflight_why(why, len, -e, "require_writable %s: %s%s", dir, strerror(e),
                   e == ENOENT ? ": create it (mkdir -p) or mount the file system that holds it" : "");
    }
    if (!S_ISDIR(st.st_mode))
        return preflight_why(why, len, -ENOTDIR, "require_writable %s: not a directory", dir);
    char what[4096 + 32];
    snprintf(what, sizeof(what), "require_writable %s", dir);
    uint64_t fr;
    return writable_with_room(dir, what, "give the agent's user write access to it", need, "require_free_mb asks for",
                              "free space there", &fr, why, len);
}

/* Printable ASCII only: a checkpoint's name reaches events, the status and terminals. */
static void printable(char *s)
{
    for (; *s; s++)
        if ((unsigned char)*s < 0x20 || (unsigned char)*s > 0x7e)
            *s = '?';
}

/* The name in dir that sorts last in version order (step9 < step10) among those matching pattern. */
static int newest_match(const char *dir, const char *pattern, char *out, size_t cap, char *why, size_t len)
{
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        if (e == ENOENT)
            return 0;
        return preflight_why(why, len, -e, "checkpoint_dir %s: cannot list it: %s", dir, strerror(e));
    }
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (fnmatch(pattern, de->d_name, FNM_PERIOD) != 0 || strlen(de->d_name) >= cap)
            continue;
        if (!out[0] || strverscmp(de->d_name, out) > 0)
            snprintf(out, cap, "%s", de->d_name);
    }
    closedir(d);
    printable(out);
    return 0;
}

/* name under dir, opened without following a symbolic link at any step:
 * the ranks write there, and the agent reading it may be root. */
static int open_beneath(const char *dir, const char *name)
{
    int at = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (at < 0)
        return -1;
    char part[256];
    const char *p = name;
    for (;;) {
        size_t n = strcspn(p, "/");
        if (n == 0 || n >= sizeof(part)) {
            close(at);
            errno = n ? ENAMETOOLONG : ENOENT;
            return -1;
        }
        memcpy(part, p, n);
        part[n] = '\0';
        bool last = p[n] == '\0';
        /* O_NONBLOCK: a FIFO there must not hold the pre-flight until something writes to it */
        int fd = openat(at, part, last ? O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY | O_NOFOLLOW
                                       : O_RDONLY | O_CLOEXEC | O_DIRECTORY | O_NOFOLLOW);
        int e = errno;
        close(at);
        if (fd < 0 || last) {
            errno = e;
            return fd;
        }
        at = fd;
        p += n + 1;
    }
}

/* The first line of dir/name (a DeepSpeed-style `latest` file), "" when there is none. */
static int latest_file(const char *dir, const char *name, char *out, size_t cap, char *why, size_t len)
{
    int fd = open_beneath(dir, name);
    if (fd < 0) {
        int e = errno;
        if (e == ENOENT)
            return 0;
        if (e == ELOOP || e == ENOTDIR)
            return preflight_why(why, len, -e, "checkpoint_dir %s: %s is or goes through a symbolic link: not "
                                 "read (checkpoint_latest names a file the program writes there)", dir, name);
        return preflight_why(why, len, -e, "checkpoint_dir %s: cannot read %s: %s", dir, name, strerror(e));
    }
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        return preflight_why(why, len, -EINVAL, "checkpoint_dir %s: %s is not a regular file: checkpoint_latest "
                   "names the file that holds the latest checkpoint's name", dir, name);
    }
    char line[PREFLIGHT_CKPT_MAX + 2];
    ssize_t n = read_some(fd, line, sizeof(line) - 1);
    close(fd);
    if (n < 0)
        return preflight_why(why, len, (int)n, "checkpoint_dir %s: cannot read %s: %s", dir, name,
                   strerror((int)-n));
    line[n] = '\0';
    line[strcspn(line, "\r\n")] = '\0';
    printable(line);
    snprintf(out, cap, "%s", line[0] ? line : "(empty latest file)");
    return 0;
}

int preflight_latest_ckpt(const char *dir, const char *rule, char *out, size_t cap, char *why, size_t len)
{
    out[0] = '\0';
    if (strncmp(rule, "file:", 5) == 0)
        return latest_file(dir, rule + 5, out, cap, why, len);
    if (strncmp(rule, "glob:", 5) == 0)
        return newest_match(dir, rule + 5, out, cap, why, len);
    return preflight_why(why, len, -EINVAL, "checkpoint_latest %s: expected file:NAME or glob:PATTERN", rule);
}

static uint64_t held_bytes;

static int add_held(const char *path, const struct stat *st, int type, struct FTW *ftw)
{
    (void)path, (void)ftw;
    if (type == FTW_F)
        held_bytes += (uint64_t)st->st_blocks * 512;
    return 0;
}

int preflight_memory_ckpt(const char *root, const char *dir, uint64_t need_mb, char *why, size_t len)
{
    struct stat st, dst;
    int e = stat(root, &st) != 0 ? errno : S_ISDIR(st.st_mode) ? 0 : ENOTDIR;
    if (e)
        return preflight_why(why, len, -e, "memory_checkpoint_root %s: %s: name a memory file system every node "
                             "has (such as /dev/shm)", root, strerror(e));
    /* the job's own directory, kept from before (a rejoin, the agent restarted): its bytes are ours */
    held_bytes = 0;
    bool own = stat(dir, &dst) == 0 && S_ISDIR(dst.st_mode);
    if (own)
        nftw(dir, add_held, 8, FTW_PHYS);
    bool mount = own && dst.st_dev != st.st_dev;
    uint64_t total, avail;
    if (preflight_host_memory(&total, &avail) != 0)
        return preflight_why(why, len, -EIO, "memory_checkpoint_mb: cannot read /proc/meminfo");
    const uint64_t need = need_mb << 20, mib = 1 << 20, have = avail + held_bytes;
    if (need > have)
        return preflight_why(why, len, -ENOMEM, "memory_checkpoint_mb: %" PRIu64 " MiB asked for %s, but this node "
                             "has %" PRIu64 " MiB of memory available (MemAvailable %" PRIu64 " MiB of %" PRIu64
                             " MiB, and %" PRIu64 " MiB in the directory already): lower memory_checkpoint_mb or "
                             "free memory", need_mb, dir, have / mib, avail / mib, total / mib, held_bytes / mib);
    struct statvfs vfs;
    if (!mount && statvfs(root, &vfs) == 0) {
        uint64_t fr = (uint64_t)vfs.f_bavail * vfs.f_frsize + held_bytes;
        if (need > fr)
            return preflight_why(why, len, -ENOSPC, "memory_checkpoint_mb: %" PRIu64 " MiB asked for %s, but %s "
                                 "has %" PRIu64 " MiB free: lower memory_checkpoint_mb or make the file system "
                                 "larger (mount -o remount,size=...)", need_mb, dir, root, fr / mib);
    }
    return 0;
}

int preflight_host_memory(uint64_t *total, uint64_t *available)
{
    FILE *f = fopen("/proc/meminfo", "r");
    if (!f)
        return -errno;
    char line[256];
    unsigned long long kb;
    *total = *available = 0;
    while (fgets(line, sizeof(line), f)) {
        if (sscanf(line, "MemTotal: %llu kB", &kb) == 1)
            *total = kb * 1024;
        else if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1)
            *available = kb * 1024;
    }
    fclose(f);
    return *total ? 0 : -EINVAL;
}

/* NVML's C API, declared here so that nothing links against it: the
 * library is opened at run time, and a node without the driver has none. */
typedef struct nvml_device *nvml_device_t;
struct nvml_memory {
    unsigned long long total, free, used;
};

int preflight_gpus(struct gpu_fact *out, int max, char *why, size_t len)
{
    void *lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!lib)
        return preflight_why(why, len, -ENOENT, "NVML (libnvidia-ml.so.1) not found: no NVIDIA driver on this node");
    int (*init)(void) = (int (*)(void))dlsym(lib, "nvmlInit_v2");
    int (*shutdown)(void) = (int (*)(void))dlsym(lib, "nvmlShutdown");
    int (*count)(unsigned *) = (int (*)(unsigned *))dlsym(lib, "nvmlDeviceGetCount_v2");
    int (*handle)(unsigned, nvml_device_t *) = (int (*)(unsigned, nvml_device_t *))dlsym(lib, "nvmlDeviceGetHandleByIndex_v2");
    int (*name)(nvml_device_t, char *, unsigned) = (int (*)(nvml_device_t, char *, unsigned))dlsym(lib, "nvmlDeviceGetName");
    int (*meminfo)(nvml_device_t, struct nvml_memory *) =
        (int (*)(nvml_device_t, struct nvml_memory *))dlsym(lib, "nvmlDeviceGetMemoryInfo");
    int rc;
    if (!init || !shutdown || !count || !handle || !name || !meminfo) {
        rc = preflight_why(why, len, -ENOSYS, "NVML is too old: a function muster needs is missing");
    } else if (init() != 0) {
        rc = preflight_why(why, len, -EIO, "NVML could not initialise: is the NVIDIA driver loaded?");
    } else {
        unsigned n = 0;
        rc = count(&n) == 0 ? 0 : preflight_why(why, len, -EIO, "NVML could not count the GPUs");
        for (unsigned i = 0; rc == 0 && i < n && (int)i < max; i++) {
            nvml_device_t h;
            struct nvml_memory m;
            memset(&out[i], 0, sizeof(out[i]));
            if (handle(i, &h) != 0 || meminfo(h, &m) != 0) {
                rc = preflight_why(why, len, -EIO, "NVML could not read GPU %u", i);
                break;
            }
            if (name(h, out[i].name, sizeof(out[i].name)) != 0)
                snprintf(out[i].name, sizeof(out[i].name), "GPU %u", i);
            out[i].total = m.total;
            out[i].free = m.free;
        }
        if (rc == 0)
            rc = (int)n < max ? (int)n : max;
        shutdown();
    }
    dlclose(lib);
    return rc;
}

int preflight_clock(int64_t skew_ms, int64_t rtt_ms, char *why, size_t len)
{
    int64_t a = skew_ms < 0 ? -skew_ms : skew_ms;
    if (a - rtt_ms <= PREFLIGHT_MAX_SKEW_MS)
        return 0;
    return preflight_why(why, len, -ERANGE, "clock: this node's clock is %.1f s %s musterd's (more than %d s): sync it "
               "(chrony or systemd-timesyncd) so that events, logs and checkpoints agree",
               (double)a / 1000.0, skew_ms > 0 ? "ahead of" : "behind", PREFLIGHT_MAX_SKEW_MS / 1000);
}
