#include "worker/train/ckpt.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/log.h"
#include "common/mkdirs.h"

#define SHARD_MAGIC "MUSTSHRD"
#define SHARD_VERSION 1
#define MANIFEST_FORMAT "muster-checkpoint"
#define MANIFEST_VERSION 1
/* Words per rank in the save's all-gathers: result, checksum, bytes, committer. */
#define SAVE_WORDS 4

static uint64_t fnv1a(uint64_t h, const void *buf, size_t len)
{
    const uint8_t *p = buf;
    for (size_t i = 0; i < len; i++) {
        h ^= p[i];
        h *= 0x100000001b3ULL;
    }
    return h;
}
#define FNV_INIT 0xcbf29ce484222325ULL

/* A file's shard size may exceed ceil(numel / world) by this much (padding
 * for alignment, as the GPU path's 64 floats), plus a row of C floats (the
 * CPU path cuts the embedding at whole rows); more is refused as damage. */
#define MAX_SHARD_PAD 65536

/* The floats [lo, lo + n) of a unit of numel floats that shard q of size S
 * holds (n = 0 past the unit's end). */
static void held(size_t numel, size_t S, int q, size_t *lo, size_t *n)
{
    *lo = (size_t)q * S;
    *n = *lo >= numel ? 0 : (numel - *lo < S ? numel - *lo : S);
}

/* A file written through one buffer so that its checksum comes for free. */
struct out_file {
    int fd;
    uint64_t hash;
    size_t bytes;
    int err;
};

static void out_write(struct out_file *f, const void *buf, size_t len)
{
    const char *p = buf;
    f->hash = fnv1a(f->hash, buf, len);
    f->bytes += len;
    while (len && !f->err) {
        ssize_t n = write(f->fd, p, len);
        if (n < 0) {
            if (errno == EINTR)
                continue;
            f->err = errno;
            break;
        }
        p += n;
        len -= (size_t)n;
    }
}

static int out_open(struct out_file *f, const char *path)
{
    memset(f, 0, sizeof(*f));
    f->hash = FNV_INIT;
    f->fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    return f->fd < 0 ? -errno : 0;
}

static int out_close(struct out_file *f)
{
    if (!f->err && fsync(f->fd) != 0)
        f->err = errno;
    if (close(f->fd) != 0 && !f->err)
        f->err = errno;
    return -f->err;
}

static int sync_dir(const char *dir)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = fsync(fd) ? -errno : 0;
    close(fd);
    return rc;
}

static void remove_tree(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    char p[JOB_PATH_MAX + 300];
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
            unlink(p);
        }
    closedir(d);
    rmdir(dir);
}

/*
 * Two kinds of flock(2) keep writers and pruners of one checkpoint_dir apart,
 * even across processes that race (a restarted generation, two jobs):
 *   <dir>/.lock            held briefly by rank 0 around every change of
 *                          the directory's names: creating a temporary
 *                          directory, renaming one into place and `latest`,
 *                          pruning;
 *   <dir>/.tmp-step-N-PID/.writer
 *                          held by the rank 0 writing that temporary
 *                          directory until it is committed or given up: a
 *                          pruner that can take it knows the writer is gone.
 */
static int lock_dir(const char *dir)
{
    char p[JOB_PATH_MAX + 16];
    snprintf(p, sizeof(p), "%s/.lock", dir);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    while (flock(fd, LOCK_EX) != 0)
        if (errno != EINTR) {
            int e = errno;
            close(fd);
            return -e;
        }
    return fd;
}

static void unlock_dir(int fd)
{
    if (fd >= 0)
        close(fd); /* closing releases the flock */
}

/* The writer's lock of a temporary directory: an fd holding it, or < 0. */
static int writer_lock(const char *tmp)
{
    char p[JOB_PATH_MAX + 96];
    snprintf(p, sizeof(p), "%s/.writer", tmp);
    int fd = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0)
        return -errno;
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

/* Whether a temporary directory's writer still holds it: 1, or 0 when its
 * .writer is gone or free (the writer died). An error taking the lock (a
 * file system without flock) counts as held: nothing is removed on doubt. */
static int writer_alive(const char *tmp)
{
    char p[JOB_PATH_MAX + 96];
    snprintf(p, sizeof(p), "%s/.writer", tmp);
    int fd = open(p, O_RDWR | O_CLOEXEC);
    if (fd < 0)
        return errno == ENOENT ? 0 : 1;
    int alive = flock(fd, LOCK_EX | LOCK_NB) != 0;
    close(fd);
    return alive;
}

/* Writes this rank's shards of weights and moments (padding included). */
static int write_shard(const struct ckpt_rank *c, const char *path, uint64_t *hash, size_t *bytes)
{
    const int nunits = c->lay.nunits;
    struct out_file f;
    int rc = out_open(&f, path);
    if (rc)
        return rc;
    uint32_t h[4] = {SHARD_VERSION, (uint32_t)c->rank, (uint32_t)c->world, (uint32_t)nunits};
    out_write(&f, SHARD_MAGIC, 8);
    out_write(&f, h, sizeof(h));
    for (int u = 0; u < nunits; u++) {
        uint64_t S = c->shard[u];
        out_write(&f, &S, sizeof(S));
    }
    const float *bufs[3] = {c->params, c->m, c->v};
    for (int u = 0; u < nunits; u++)
        for (int b = 0; b < 3; b++)
            out_write(&f, bufs[b] + c->off[u], sizeof(float) * c->shard[u]);
    *hash = f.hash;
    *bytes = f.bytes;
    return out_close(&f);
}

static json_t *manifest_build(const struct ckpt_rank *c, const uint64_t *hashes,
                              const size_t *sizes)
{
    const struct job_spec *s = c->spec;
    json_t *units = json_array(), *files = json_array();
    for (int u = 0; u < c->lay.nunits; u++) {
        struct gpt_tensor t[GPT_MAX_UNIT_TENSORS];
        int n = gpt_unit_tensors(&c->cfg, u, t);
        json_t *ts = json_array();
        for (int i = 0; i < n; i++)
            json_array_append_new(ts, json_pack("{s:s, s:I, s:I, s:b}", "name", t[i].name,
                                                "offset", (json_int_t)t[i].offset, "numel",
                                                (json_int_t)t[i].numel, "decay", t[i].decay));
        json_array_append_new(
            units, json_pack("{s:i, s:s, s:I, s:I, s:o}", "index", u, "kind",
                             gpt_unit_kind_name(gpt_unit_kind(&c->cfg, u)), "numel",
                             (json_int_t)c->lay.numel[u], "shard_numel",
                             (json_int_t)c->shard[u], "tensors", ts));
    }
    for (int r = 0; r < c->world; r++) {
        char name[64], hex[32];
        snprintf(name, sizeof(name), "rank-%05d.bin", r);
        snprintf(hex, sizeof(hex), "%016" PRIx64, hashes[r]);
        json_array_append_new(files, json_pack("{s:i, s:s, s:I, s:s}", "rank", r, "name", name,
                                               "bytes", (json_int_t)sizes[r], "fnv1a64", hex));
    }
    json_t *model = json_pack("{s:s, s:i, s:i, s:i, s:i, s:i}", "preset", s->model, "L",
                              c->cfg.L, "NH", c->cfg.NH, "C", c->cfg.C, "T", c->cfg.T, "V",
                              c->cfg.V);
    json_t *training = json_pack(
        "{s:i, s:i, s:i, s:i, s:f, s:f, s:i, s:f, s:f}", "steps", s->steps, "batch", s->batch,
        "micro_batch", s->micro_batch, "seq_len", s->seq_len, "lr", s->lr, "lr_min", s->lr_min,
        "warmup_steps", s->warmup_steps, "weight_decay", s->weight_decay, "grad_clip",
        s->grad_clip);
    json_t *optim = json_pack("{s:s, s:I, s:f, s:f, s:f}", "kind", "adamw", "t",
                              (json_int_t)c->step, "beta1", (double)c->beta1, "beta2",
                              (double)c->beta2, "eps", (double)c->eps);
    json_t *data = json_pack(
        "{s:s, s:s, s:I, s:I, s:I, s:I, s:I}", "path", s->data, "format",
        c->data->format == DATA_TEXT ? "text" : "llm.c-tokens", "tokens",
        (json_int_t)c->data->ntokens, "train_tokens", (json_int_t)c->data->ntrain, "seed",
        (json_int_t)s->seed, "next_step", (json_int_t)c->step, "tokens_seen",
        (json_int_t)c->step * s->batch * s->seq_len);
    json_t *rng = json_pack("{s:s, s:I, s:I}", "kind", "splitmix64-counter", "seed",
                            (json_int_t)s->seed, "counter", (json_int_t)c->step);
    return json_pack("{s:s, s:i, s:o, s:I, s:i, s:o, s:o, s:o, s:o, s:o, s:o}", "format",
                     MANIFEST_FORMAT, "version", MANIFEST_VERSION, "model", model, "step",
                     (json_int_t)c->step, "world_size", c->world, "training", training,
                     "optimizer", optim, "data", data, "rng", rng, "units", units, "files",
                     files);
}

/* Writes the manifest into the temporary directory and syncs it: a
 * committer's part of step 3. Shards are durable when this runs. */
static int write_manifest(const struct ckpt_rank *c, const char *tmp, const uint64_t *all)
{
    const int world = c->world;
    char file[JOB_PATH_MAX + 96];
    uint64_t *hashes = calloc((size_t)world, sizeof(uint64_t));
    size_t *sizes = calloc((size_t)world, sizeof(size_t));
    if (!hashes || !sizes) {
        free(hashes), free(sizes);
        return -ENOMEM;
    }
    for (int r = 0; r < world; r++) {
        hashes[r] = all[SAVE_WORDS * r + 1];
        sizes[r] = (size_t)all[SAVE_WORDS * r + 2];
    }
    json_t *man = manifest_build(c, hashes, sizes);
    free(hashes);
    free(sizes);
    snprintf(file, sizeof(file), "%s/manifest.json", tmp);
    char *text = man ? json_dumps(man, JSON_INDENT(2) | JSON_SORT_KEYS) : NULL;
    json_decref(man);
    struct out_file f;
    int rc = text ? out_open(&f, file) : -ENOMEM;
    if (!rc) {
        out_write(&f, text, strlen(text));
        out_write(&f, "\n", 1);
        rc = out_close(&f);
    }
    free(text);
    return rc ? rc : sync_dir(tmp);
}

/* A committer's part of step 4: the directory renamed into place, then
 * `latest`, under dir's lock. */
static int publish(const struct ckpt_rank *c, const char *dir, const char *tmp, const char *final)
{
    char file[JOB_PATH_MAX + 96];
    int rc = 0, lock = lock_dir(dir);
    if (lock < 0)
        return lock;
    /* Replace an older checkpoint of the same step: move it aside first,
     * because rename() does not replace a non-empty directory. The writer's
     * lock file goes before the rename: a committed directory holds the
     * manifest and the shards only. */
    char old[JOB_PATH_MAX + 64];
    snprintf(old, sizeof(old), "%s/.old-step-%08ld-%d", dir, c->step, (int)getpid());
    snprintf(file, sizeof(file), "%s/.writer", tmp);
    unlink(file);
    int had = rename(final, old) == 0;
    if (rename(tmp, final) != 0)
        rc = -errno;
    if (had)
        remove_tree(old);
    if (!rc) {
        struct out_file f;
        snprintf(file, sizeof(file), "%s/.latest.tmp", dir);
        rc = out_open(&f, file);
        if (!rc) {
            char line[64];
            int n = snprintf(line, sizeof(line), "step-%08ld\n", c->step);
            out_write(&f, line, (size_t)n);
            rc = out_close(&f);
        }
        char latest[JOB_PATH_MAX + 16];
        snprintf(latest, sizeof(latest), "%s/latest", dir);
        if (!rc && rename(file, latest) != 0)
            rc = -errno;
        if (!rc)
            rc = sync_dir(dir);
    }
    unlock_dir(lock);
    return rc;
}

/* Step 2's first half on every rank: the temporary directory tmp in this
 * rank's own view of dir. Under dir's lock, the rank whose mkdir creates it
 * becomes its committer and takes its writer lock (*writer >= 0); ranks on
 * the same file system come later and find it held. A directory of that
 * name whose writer is gone is debris of a crash (a reused pid): replaced. */
static int join_tmp(const char *dir, const char *tmp, int *writer)
{
    *writer = -1;
    int rc = mkdirs(dir, 0755);
    int lock = rc ? -1 : lock_dir(dir);
    if (!rc && lock < 0)
        rc = lock;
    if (!rc) {
        int made = mkdir(tmp, 0755) == 0 ? 0 : -errno;
        if (made == -EEXIST && !writer_alive(tmp)) {
            remove_tree(tmp);
            made = mkdir(tmp, 0755) == 0 ? 0 : -errno;
        }
        if (made == 0 && (*writer = writer_lock(tmp)) < 0) {
            rc = *writer;
            remove_tree(tmp);
        } else if (made && made != -EEXIST) {
            rc = made;
        }
    }
    unlock_dir(lock);
    return rc;
}

/* The first rank whose word w of SAVE_WORDS is a nonzero result, or -1. */
static int first_failed(const uint64_t *all, int world, int w, int *rc)
{
    for (int r = 0; r < world; r++)
        if ((int64_t)all[SAVE_WORDS * r + w]) {
            *rc = (int)(int64_t)all[SAVE_WORDS * r + w];
            return r;
        }
    return -1;
}

/*
 * The commit protocol, every rank in step. dir may be one directory that
 * all ranks see (a shared file system) or a node-local one on each node;
 * the protocol is the same, and each distinct directory gets one committer:
 *   1. all learn rank 0's pid, which names the temporary directory
 *      .tmp-step-N-PID (one all-gather);
 *   2. each rank creates that directory in its view of dir or finds it
 *      (join_tmp elects the committer of each directory), writes and
 *      fsyncs its shard file there; all learn every rank's result, size
 *      and checksum (an all-gather, which is also the barrier: nobody
 *      passes it before every shard is durable);
 *   3. each committer writes the manifest (every rank's file, wherever it
 *      lies) into its directory; all learn the results;
 *   4. only when every manifest is durable does each committer rename its
 *      directory into place and then `latest`; all learn the outcome.
 * A failure before 4 leaves the previous checkpoint as `latest`
 * everywhere; a failure within 4 (a rename) leaves some directories a step
 * behind the others, which ckpt_load settles by passing over a newer step
 * whose files are not all found.
 */
int ckpt_save(const struct ckpt_rank *c, const char *dir, char *path, size_t pathlen, char *err,
              size_t errlen)
{
    const int world = c->world;
    char final[JOB_PATH_MAX + 32], tmp[JOB_PATH_MAX + 64], file[JOB_PATH_MAX + 96];
    uint64_t *all = calloc(SAVE_WORDS * (size_t)world, sizeof(uint64_t));
    if (!all) {
        snprintf(err, errlen, "checkpoint: out of memory");
        return -ENOMEM;
    }
    snprintf(final, sizeof(final), "%s/step-%08ld", dir, c->step);
    /* 1 */
    uint64_t mine[SAVE_WORDS] = {0, (uint64_t)getpid(), 0, 0};
    int crc = c->gather(c->coll, mine, SAVE_WORDS, all), rc = 0, writer = -1, bad = -1, bad_rc = 0;
    const char *stage = "writing";
    snprintf(tmp, sizeof(tmp), "%s/.tmp-step-%08ld-%d", dir, c->step, (int)all[1]);
    /* 2 */
    if (!crc) {
        size_t bytes = 0;
        rc = c->local_rc ? c->local_rc : join_tmp(dir, tmp, &writer);
        if (!rc) {
            snprintf(file, sizeof(file), "%s/rank-%05d.bin", tmp, c->rank);
            rc = write_shard(c, file, &mine[1], &bytes);
        }
        mine[0] = (uint64_t)(int64_t)rc;
        mine[2] = bytes;
        mine[3] = writer >= 0;
        crc = c->gather(c->coll, mine, SAVE_WORDS, all);
        bad = crc ? -1 : first_failed(all, world, 0, &bad_rc);
    }
    /* 3 */
    if (!crc && bad < 0) {
        memset(mine, 0, sizeof(mine));
        if (writer >= 0)
            mine[0] = (uint64_t)(int64_t)write_manifest(c, tmp, all);
        stage = "committing";
        crc = c->gather(c->coll, mine, SAVE_WORDS, all);
        bad = crc ? -1 : first_failed(all, world, 0, &bad_rc);
    }
    /* 4 */
    if (!crc && bad < 0) {
        memset(mine, 0, sizeof(mine));
        if (writer >= 0)
            mine[0] = (uint64_t)(int64_t)publish(c, dir, tmp, final);
        stage = "publishing";
        crc = c->gather(c->coll, mine, SAVE_WORDS, all);
        bad = crc ? -1 : first_failed(all, world, 0, &bad_rc);
    }
    if (writer >= 0 && (crc || bad >= 0))
        remove_tree(tmp); /* gone already when it was renamed into place */
    unlock_dir(writer);
    free(all);
    if (crc) {
        snprintf(err, errlen, "checkpoint %s: collective failed: %s", final, c->why(c->coll, crc));
        return crc;
    }
    if (bad >= 0) {
        snprintf(err, errlen, "checkpoint: %s %s failed on rank %d: %s", stage, final, bad,
                 strerror(-bad_rc));
        return bad_rc;
    }
    /* Committed: each committer prunes its directory while the others go on
     * (a failed prune costs disk space, never the checkpoint). */
    if (writer >= 0) {
        char perr[JOB_PATH_MAX + 128];
        int pruned = ckpt_prune(dir, c->step, c->spec->checkpoint_keep, perr, sizeof(perr));
        if (pruned < 0)
            log_warn("%s", perr);
        else if (pruned > 0)
            log_debug("checkpoint: pruned %d director%s under %s", pruned,
                      pruned == 1 ? "y" : "ies", dir);
    }
    if (path)
        snprintf(path, pathlen, "%s", final);
    return 0;
}

static int model_differs(const json_t *model, const struct ckpt_rank *c, char *err,
                         size_t errlen, const char *where)
{
    const char *names[] = {"L", "NH", "C", "T", "V"};
    int here[] = {c->cfg.L, c->cfg.NH, c->cfg.C, c->cfg.T, c->cfg.V};
    const char *preset = json_string_value(json_object_get(model, "preset"));
    for (int i = 0; i < 5; i++) {
        json_t *v = json_object_get(model, names[i]);
        if (!json_is_integer(v)) {
            snprintf(err, errlen, "checkpoint %s: model.%s: expected an integer", where, names[i]);
            return 1;
        }
        if (json_integer_value(v) != here[i]) {
            snprintf(err, errlen,
                     "checkpoint %s is of another model: %s is %" JSON_INTEGER_FORMAT
                     " there (preset %s), %d here (preset %s)",
                     where, names[i], json_integer_value(v), preset ? preset : "?", here[i],
                     c->spec->model);
            return 1;
        }
    }
    return 0;
}

/* Reads each unit's numel and shard_numel from the manifest into S and checks
 * them against this model: S must cover the unit over `world` ranks, with no
 * more padding than MAX_SHARD_PAD and a row. */
static int units_check(const struct ckpt_rank *c, const json_t *units, int world, size_t *S,
                       char *err, size_t errlen, const char *where)
{
    for (int u = 0; u < c->lay.nunits; u++) {
        const json_t *ue = json_array_get(units, (size_t)u);
        const size_t numel = c->lay.numel[u], least = (numel + (size_t)world - 1) / (size_t)world;
        const size_t most = least + MAX_SHARD_PAD + (size_t)c->cfg.C;
        if ((size_t)json_integer_value(json_object_get(ue, "numel")) != numel) {
            snprintf(err, errlen, "checkpoint %s: unit %d has another size", where, u);
            return -EINVAL;
        }
        json_t *sn = json_object_get(ue, "shard_numel");
        json_int_t v = json_integer_value(sn);
        if (!json_is_integer(sn) || v < (json_int_t)least ||
            v > (json_int_t)most) {
            snprintf(err, errlen,
                     "checkpoint %s: unit %d: shard_numel %s%" JSON_INTEGER_FORMAT
                     " cannot split %zu floats over %d ranks (expected %zu to %zu)",
                     where, u, json_is_integer(sn) ? "" : "(not an integer) ", v, numel, world,
                     least, most);
            return -EINVAL;
        }
        S[u] = (size_t)v;
    }
    return 0;
}

/* Whether file q of a world of N with shard sizes S holds any float this
 * rank owns. */
static int needed(const struct ckpt_rank *c, int q, const size_t *S)
{
    for (int u = 0; u < c->lay.nunits; u++) {
        size_t a, an, b, bn;
        held(c->lay.numel[u], S[u], q, &a, &an);
        held(c->lay.numel[u], c->shard[u], c->rank, &b, &bn);
        if (a < b + bn && b < a + an)
            return 1;
    }
    return 0;
}

/* Reads shard file q of a world of N with shard sizes S and copies what this
 * rank owns of it into its shards: the re-slicing N -> M. */
static int read_shard(struct ckpt_rank *c, const char *file, int q, int world, const size_t *S,
                      size_t bytes, const char *hex, char *err, size_t errlen)
{
    const struct gpt_layout *lay = &c->lay;
    FILE *f = fopen(file, "rb");
    struct stat st;
    if (!f || fstat(fileno(f), &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "checkpoint: %s: %s", file, strerror(e));
        if (f)
            fclose(f);
        return -e;
    }
    if ((size_t)st.st_size != bytes) {
        fclose(f);
        snprintf(err, errlen, "checkpoint: %s: size differs from the manifest's %zu bytes", file,
                 bytes);
        return -EINVAL;
    }
    uint8_t *buf = malloc(bytes ? bytes : 1);
    int rc = 0;
    size_t got = buf ? fread(buf, 1, bytes, f) : 0;
    int extra = fgetc(f) != EOF;
    fclose(f);
    if (!buf) {
        snprintf(err, errlen, "checkpoint: %s: out of memory for %zu bytes", file, bytes);
        return -ENOMEM;
    }
    char have[32];
    snprintf(have, sizeof(have), "%016" PRIx64, fnv1a(FNV_INIT, buf, got));
    size_t hdr = 8 + 16 + 8 * (size_t)lay->nunits, want = hdr;
    for (int u = 0; u < lay->nunits; u++)
        want += 3 * sizeof(float) * S[u];
    uint32_t h[4];
    int same_s = 1;
    for (int u = 0; u < lay->nunits && got == bytes && bytes >= hdr; u++) {
        uint64_t fs;
        memcpy(&fs, buf + 24 + 8 * (size_t)u, sizeof(fs));
        same_s = same_s && fs == S[u];
    }
    if (got != bytes || extra) {
        snprintf(err, errlen, "checkpoint: %s: size differs from the manifest's %zu bytes", file,
                 bytes);
        rc = -EINVAL;
    } else if (strcmp(have, hex) != 0) {
        snprintf(err, errlen, "checkpoint: %s: checksum %s, manifest says %s (file damaged)",
                 file, have, hex);
        rc = -EINVAL;
    } else if (bytes != want || memcmp(buf, SHARD_MAGIC, 8) != 0 ||
               (memcpy(h, buf + 8, sizeof(h)), h[0] != SHARD_VERSION) ||
               h[1] != (uint32_t)q || h[2] != (uint32_t)world ||
               h[3] != (uint32_t)lay->nunits || !same_s) {
        snprintf(err, errlen, "checkpoint: %s: not the shard of rank %d of %d for this layout",
                 file, q, world);
        rc = -EINVAL;
    }
    if (rc) {
        free(buf);
        return rc;
    }
    const float *src = (const float *)(buf + hdr);
    float *bufs[3] = {c->params, c->m, c->v};
    for (int u = 0; u < lay->nunits; u++) {
        size_t a, an, b, bn;
        held(lay->numel[u], S[u], q, &a, &an);
        held(lay->numel[u], c->shard[u], c->rank, &b, &bn);
        size_t lo = a > b ? a : b, hi = a + an < b + bn ? a + an : b + bn;
        for (int k = 0; k < 3; k++) {
            if (lo < hi)
                memcpy(bufs[k] + c->off[u] + (lo - b), src + (lo - a), sizeof(float) * (hi - lo));
            src += S[u];
        }
    }
    free(buf);
    return 0;
}

/* Every rank learns whether every rank did `what` ("load it"): all go on,
 * or none. */
static int agree_on(const struct ckpt_rank *c, int rc, const char *what, char *err, size_t errlen)
{
    uint64_t mine = (uint64_t)(int64_t)rc, *all = calloc((size_t)c->world, sizeof(uint64_t));
    if (!all)
        return rc ? rc : -ENOMEM;
    int crc = c->gather(c->coll, &mine, 1, all);
    for (int r = 0; !crc && !rc && r < c->world; r++)
        if ((int64_t)all[r]) {
            rc = (int)(int64_t)all[r];
            snprintf(err, errlen, "checkpoint: rank %d could not %s: %s", r, what, strerror(-rc));
        }
    free(all);
    if (crc && !rc) {
        snprintf(err, errlen, "checkpoint: collective failed: %s", c->why(c->coll, crc));
        rc = crc;
    }
    return rc;
}

static int agree_loaded(const struct ckpt_rank *c, int rc, char *err, size_t errlen)
{
    return agree_on(c, rc, "load it", err, errlen);
}

/* ---- pruning ---- */

int ckpt_prune_plan(struct ckpt_entry *e, size_t n, long committed, long latest, int keep)
{
    int removed = 0;
    for (size_t i = 0; i < n; i++) {
        e[i].remove = 0;
        /* at or past the commit: this one, or a racing writer's */
        if (e[i].step >= committed || e[i].step == latest)
            continue;
        switch (e[i].kind) {
        case CKPT_COMMITTED: {
            if (keep <= 0)
                break;
            int newer = 0; /* committed ones in (step, committed] */
            for (size_t j = 0; j < n; j++)
                newer += e[j].kind == CKPT_COMMITTED && e[j].step > e[i].step &&
                         e[j].step <= committed;
            e[i].remove = newer >= keep;
            break;
        }
        case CKPT_UNCOMMITTED:
        case CKPT_ABANDONED:
        case CKPT_ASIDE:
            e[i].remove = 1;
            break;
        case CKPT_WRITING:
            break;
        }
        removed += e[i].remove;
    }
    return removed;
}

/* "<prefix><digits>" then the end, or "-<digits>" and the end when pid is
 * set: the step, or -1. */
static long parse_step(const char *name, const char *prefix, int pid)
{
    size_t len = strlen(prefix);
    if (strncmp(name, prefix, len) != 0)
        return -1;
    const char *p = name + len;
    char *end;
    if (*p < '0' || *p > '9')
        return -1;
    errno = 0;
    long step = strtol(p, &end, 10);
    if (errno || step < 0)
        return -1;
    if (pid) {
        if (*end != '-' || end[1] < '0' || end[1] > '9')
            return -1;
        strtol(end + 1, &end, 10);
    }
    return *end ? -1 : step;
}

/* The step `latest` names, or -1. */
static long latest_step(const char *dir)
{
    char p[JOB_PATH_MAX + 16], name[64] = "";
    snprintf(p, sizeof(p), "%s/latest", dir);
    FILE *f = fopen(p, "r");
    if (!f)
        return -1;
    int ok = fgets(name, sizeof(name), f) != NULL;
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
    return ok ? parse_step(name, "step-", 0) : -1;
}

int ckpt_prune(const char *dir, long committed, int keep, char *err, size_t errlen)
{
    int lock = lock_dir(dir);
    if (lock < 0) {
        snprintf(err, errlen, "checkpoint: cannot lock %s/.lock to prune: %s", dir,
                 strerror(-lock));
        return lock;
    }
    DIR *d = opendir(dir);
    if (!d) {
        int e = errno;
        unlock_dir(lock);
        snprintf(err, errlen, "checkpoint: cannot list %s to prune: %s", dir, strerror(e));
        return -e;
    }
    size_t n = 0, cap = 0;
    struct ckpt_entry *ents = NULL;
    char (*names)[256] = NULL;
    struct dirent *de;
    int rc = 0;
    while ((de = readdir(d))) {
        struct ckpt_entry en = {.step = -1};
        char p[JOB_PATH_MAX + 300];
        struct stat st;
        snprintf(p, sizeof(p), "%s/%s", dir, de->d_name);
        if (lstat(p, &st) != 0 || !S_ISDIR(st.st_mode))
            continue;
        if ((en.step = parse_step(de->d_name, "step-", 0)) >= 0) {
            snprintf(p, sizeof(p), "%s/%s/manifest.json", dir, de->d_name);
            en.kind = access(p, F_OK) == 0 ? CKPT_COMMITTED : CKPT_UNCOMMITTED;
        } else if ((en.step = parse_step(de->d_name, ".tmp-step-", 1)) >= 0) {
            en.kind = writer_alive(p) ? CKPT_WRITING : CKPT_ABANDONED;
        } else if ((en.step = parse_step(de->d_name, ".old-step-", 1)) >= 0) {
            en.kind = CKPT_ASIDE;
        } else {
            continue; /* not ours: never touched */
        }
        if (n == cap) {
            cap = cap ? 2 * cap : 64;
            struct ckpt_entry *ne = realloc(ents, cap * sizeof(*ents));
            char(*nn)[256] = ne ? realloc(names, cap * sizeof(*names)) : NULL;
            if (ne)
                ents = ne;
            if (nn)
                names = nn;
            if (!ne || !nn) {
                rc = -ENOMEM;
                break;
            }
        }
        ents[n] = en;
        snprintf(names[n], sizeof(names[n]), "%s", de->d_name);
        n++;
    }
    closedir(d);
    if (rc) {
        snprintf(err, errlen, "checkpoint: out of memory listing %s to prune", dir);
    } else {
        rc = ckpt_prune_plan(ents, n, committed, latest_step(dir), keep);
        for (size_t i = 0; i < n; i++)
            if (ents[i].remove) {
                char p[JOB_PATH_MAX + 300];
                snprintf(p, sizeof(p), "%s/%s", dir, names[i]);
                remove_tree(p);
            }
        if (rc)
            sync_dir(dir);
    }
    unlock_dir(lock);
    free(ents);
    free(names);
    return rc;
}

/* ---- loading ---- */

/* One checkpoint step as this rank finds it in its own view of the
 * directory: the manifest, checked against this model. */
struct step_view {
    char dir[JOB_PATH_MAX + 32];
    json_t *man; /* NULL: no manifest here */
    json_t *files;
    int world;
    long step;
    int64_t seed;
    uint64_t files_hash; /* FNV-1a of every file's name, size and checksum: the same manifest on every node */
    size_t S[GPT_MAX_UNITS];
};

/* Reads and checks dir/manifest.json into v: 0, -ENOENT when there is none,
 * or another error with err set. */
static int view_step(const struct ckpt_rank *c, const char *dir, struct step_view *v, char *err,
                     size_t errlen)
{
    char file[JOB_PATH_MAX + 64];
    memset(v, 0, sizeof(*v));
    snprintf(v->dir, sizeof(v->dir), "%s", dir);
    snprintf(file, sizeof(file), "%s/manifest.json", dir);
    if (access(file, F_OK) != 0)
        return -ENOENT;
    json_error_t jerr;
    json_t *man = json_load_file(file, JSON_REJECT_DUPLICATES, &jerr);
    if (!man) {
        snprintf(err, errlen, "checkpoint: %s: %s", file, jerr.text);
        return -EINVAL;
    }
    const char *format = json_string_value(json_object_get(man, "format"));
    json_t *files = json_object_get(man, "files");
    json_t *units = json_object_get(man, "units");
    json_int_t step = json_integer_value(json_object_get(man, "step"));
    json_int_t world = json_integer_value(json_object_get(man, "world_size"));
    int rc = -EINVAL;
    if (!format || strcmp(format, MANIFEST_FORMAT) != 0 ||
        json_integer_value(json_object_get(man, "version")) != MANIFEST_VERSION) {
        snprintf(err, errlen, "checkpoint: %s: not a %s manifest of version %d", file,
                 MANIFEST_FORMAT, MANIFEST_VERSION);
    } else if (model_differs(json_object_get(man, "model"), c, err, errlen, dir)) {
    } else if (!json_is_array(units) || json_array_size(units) != (size_t)c->lay.nunits) {
        snprintf(err, errlen, "checkpoint %s: expected %d units in the layout", dir,
                 c->lay.nunits);
    } else if (world < 1 || world > CKPT_MAX_WORLD || !json_is_array(files) ||
               json_array_size(files) != (size_t)world || step < 0) {
        snprintf(err, errlen, "checkpoint %s: manifest's step, world_size or files are invalid",
                 dir);
    } else {
        rc = units_check(c, units, (int)world, v->S, err, errlen, dir);
    }
    for (json_int_t r = 0; r < world && !rc; r++) {
        json_t *fe = json_array_get(files, (size_t)r);
        const char *name = json_string_value(json_object_get(fe, "name"));
        if (!name || strchr(name, '/') || !json_string_value(json_object_get(fe, "fnv1a64")) ||
            json_integer_value(json_object_get(fe, "bytes")) <= 0 ||
            json_integer_value(json_object_get(fe, "rank")) != r) {
            snprintf(err, errlen, "checkpoint %s: files[%d] is invalid", dir, (int)r);
            rc = -EINVAL;
        }
    }
    if (rc) {
        json_decref(man);
        return rc;
    }
    v->files_hash = FNV_INIT;
    for (json_int_t r = 0; r < world; r++) {
        json_t *fe = json_array_get(files, (size_t)r);
        const char *name = json_string_value(json_object_get(fe, "name"));
        const char *hex = json_string_value(json_object_get(fe, "fnv1a64"));
        json_int_t bytes = json_integer_value(json_object_get(fe, "bytes"));
        v->files_hash = fnv1a(v->files_hash, name, strlen(name) + 1);
        v->files_hash = fnv1a(v->files_hash, hex, strlen(hex) + 1);
        v->files_hash = fnv1a(v->files_hash, &bytes, sizeof(bytes));
    }
    v->man = man;
    v->files = files;
    v->world = (int)world;
    v->step = (long)step;
    v->seed = json_integer_value(json_object_get(json_object_get(man, "data"), "seed"));
    return 0;
}

/* File q of the step: its path, size and checksum (view_step checked them). */
static void view_file(const struct step_view *v, int q, char *path, size_t len, size_t *bytes,
                      const char **hex)
{
    json_t *fe = json_array_get(v->files, (size_t)q);
    snprintf(path, len, "%s/%s", v->dir, json_string_value(json_object_get(fe, "name")));
    *bytes = (size_t)json_integer_value(json_object_get(fe, "bytes"));
    *hex = json_string_value(json_object_get(fe, "fnv1a64"));
}

/* Whether file q is here with the manifest's size (its checksum is checked
 * when it is read). */
static int view_has(const struct step_view *v, int q)
{
    char path[JOB_PATH_MAX + 128];
    size_t bytes;
    const char *hex;
    struct stat st;
    view_file(v, q, path, sizeof(path), &bytes, &hex);
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && (size_t)st.st_size == bytes;
}

/* Reads every file of the step holding floats this rank owns: the load of
 * a rank that finds all of them in its own view. */
static int load_own(struct ckpt_rank *c, const struct step_view *v, char *err, size_t errlen)
{
    int rc = 0;
    for (int q = 0; q < v->world && !rc; q++) {
        if (!needed(c, q, v->S))
            continue;
        char file[JOB_PATH_MAX + 128];
        size_t bytes;
        const char *hex;
        view_file(v, q, file, sizeof(file), &bytes, &hex);
        rc = read_shard(c, file, q, v->world, v->S, bytes, hex, err, errlen);
    }
    return rc;
}

/* The step `latest` names under dir: 0 with *step (-1: no `latest`), or
 * -EINVAL with err set when it names nothing valid. */
static int read_latest(const char *dir, long *step, char *err, size_t errlen)
{
    char p[JOB_PATH_MAX + 16], name[64] = "";
    snprintf(p, sizeof(p), "%s/latest", dir);
    *step = -1;
    FILE *f = fopen(p, "r");
    if (!f)
        return errno == ENOENT ? 0 : -errno;
    int ok = fgets(name, sizeof(name), f) != NULL;
    fclose(f);
    name[strcspn(name, "\n")] = '\0';
    if (!ok || (*step = parse_step(name, "step-", 0)) < 0) {
        snprintf(err, errlen, "checkpoint: %s: expected \"step-NNNNNNNN\", got \"%s\"", p, name);
        return -EINVAL;
    }
    return 0;
}

/* A word of an all-gather holding a result: the first rank whose word is a
 * negative errno, or -1. */
static int first_error(const uint64_t *all, int world, size_t words, int *rc)
{
    for (int r = 0; r < world; r++)
        if ((int64_t)all[words * (size_t)r] < 0) {
            *rc = (int)(int64_t)all[words * (size_t)r];
            return r;
        }
    return -1;
}

/* Another rank's failure, in this rank's words (its own err says more). */
static int failed_on(int bad, int me, int rc, const char *what, char *err, size_t errlen)
{
    if (bad != me)
        snprintf(err, errlen, "checkpoint: rank %d could not %s: %s", bad, what, strerror(-rc));
    return rc;
}

/* Per-rank words of a step probe: found (1), absent (0) or a negative
 * errno; the step's world and seed; whether this rank holds every file it
 * needs; each unit's shard size. */
enum { PROBE_FOUND, PROBE_WORLD, PROBE_SEED, PROBE_FILES, PROBE_SELF, PROBE_S, PROBE_WORDS = PROBE_S + GPT_MAX_UNITS };

/* Most u64 words one rank puts into one all-gather of the spread load by
 * default: 64 MiB over the whole world, at least 512 KiB a rank. */
static size_t spread_words(const struct ckpt_rank *c)
{
    if (c->gather_max)
        return c->gather_max;
    size_t w = ((size_t)8 << 20) / (size_t)c->world;
    return w < ((size_t)1 << 16) ? (size_t)1 << 16 : w;
}

int ckpt_reslice(struct ckpt_rank *c, int w0, const size_t *S, int ncontrib, const float *const *mine, int nmine,
                 const int *from_rank, const int *from_index, char *err, size_t errlen)
{
    const int world = c->world, me = c->rank, nunits = c->lay.nunits;
    size_t stot = 0, off[GPT_MAX_UNITS];
    for (int u = 0; u < nunits; u++) {
        off[u] = stot;
        stot += S[u];
    }
    ncontrib = ncontrib < 1 ? 1 : ncontrib;
    size_t len_max = spread_words(c) * 2 / (3 * (size_t)ncontrib);
    len_max = len_max < 2 ? 2 : len_max;
    float *send = calloc(3 * (size_t)ncontrib * len_max + 1, sizeof(float));
    float *got = calloc((3 * (size_t)ncontrib * len_max + 1) * (size_t)world, sizeof(float));
    int rc = c->local_rc ? c->local_rc : send && got ? 0 : -ENOMEM, crc = 0;
    if (rc && !c->local_rc) /* (a local_rc's reason is the caller's to give) */
        snprintf(err, errlen, "re-slicing: out of memory for the buffers that ship the state");
    if ((rc = agree_on(c, rc, "make room to re-slice", err, errlen)) != 0)
        goto out;
    /* each unit round, a chunk of every block at a time */
    float *dst[3] = {c->params, c->m, c->v};
    for (int u = 0; u < nunits && !crc; u++) {
        size_t lo_me, n_me;
        held(c->lay.numel[u], c->shard[u], me, &lo_me, &n_me);
        for (size_t a = 0; a < S[u] && !crc; a += len_max) {
            const size_t len = S[u] - a < len_max ? S[u] - a : len_max;
            const size_t nf = (3 * (size_t)ncontrib * len + 1) & ~(size_t)1; /* whole u64 words */
            memset(send, 0, nf * sizeof(float));
            for (int i = 0; i < nmine; i++)
                for (int k = 0; k < 3; k++)
                    memcpy(send + ((size_t)i * 3 + (size_t)k) * len, mine[i] + (size_t)k * stot + off[u] + a,
                           len * sizeof(float));
            if ((crc = c->gather(c->coll, (const uint64_t *)(void *)send, nf / 2, (uint64_t *)(void *)got)) != 0)
                break;
            /* the old ranks o whose chunk [o*S + a, o*S + a + len) meets this rank's floats */
            for (size_t o = n_me ? lo_me / S[u] : 1, end = n_me ? (lo_me + n_me - 1) / S[u] : 0; o <= end; o++) {
                size_t x = o * S[u] + a, y = x + len;
                x = x > lo_me ? x : lo_me;
                y = y < lo_me + n_me ? y : lo_me + n_me;
                if (x >= y)
                    continue;
                const float *from = got + (size_t)from_rank[o] * nf;
                for (int k = 0; k < 3; k++)
                    memcpy(dst[k] + c->off[u] + (x - lo_me),
                           from + ((size_t)from_index[o] * 3 + (size_t)k) * len + (x - o * S[u] - a),
                           (y - x) * sizeof(float));
            }
        }
    }
    if (crc) {
        snprintf(err, errlen, "re-slicing the state of %d ranks for %d: collective failed: %s", w0, world,
                 c->why(c->coll, crc));
        rc = crc;
    }
out:
    free(send);
    free(got);
    return rc;
}

/*
 * The spread load (docs/training.md, "Node-local checkpoints"): some rank
 * does not find every file it needs in its own view of the directory. Each
 * file q of the step is read by one rank that has it (rank q itself when
 * it does, else the rank with the fewest files to read so far), whole, into
 * a block laid out as the writer's shard; then each unit goes round in
 * all-gathers of at most spread_words() words a rank, from which every rank
 * copies the floats it owns. Every rank computes the same assignment from
 * the gathered bitmaps. Collective; the same result on every rank, and
 * *absent set on every rank when it is -ENODATA because a file is on no
 * rank (nothing read, no collective left half done).
 */
static int load_spread(struct ckpt_rank *c, const struct step_view *v, int w0, const size_t *S,
                       int *absent, char *err, size_t errlen)
{
    const int world = c->world, me = c->rank, nunits = c->lay.nunits;
    const size_t words = ((size_t)w0 + 63) / 64;
    uint64_t *bits = calloc(words, sizeof(uint64_t)), *all = calloc(words * (size_t)world, sizeof(uint64_t));
    int *reader = malloc(sizeof(int) * (size_t)w0), *index = malloc(sizeof(int) * (size_t)w0);
    int *load = calloc((size_t)world, sizeof(int));
    float *blocks = NULL;
    int rc = bits && all && reader && index && load ? 0 : -ENOMEM, crc = 0, ncontrib = 0, nmine = 0;
    for (int q = 0; !rc && v->man && q < w0; q++)
        if (view_has(v, q))
            bits[q / 64] |= (uint64_t)1 << (q % 64);
    if (rc) {
        snprintf(err, errlen, "checkpoint: out of memory for the spread load of %d files", w0);
        goto out; /* a few words a rank: as ckpt_load's own, its peers' gather times out */
    }
    if ((crc = c->gather(c->coll, bits, words, all)) != 0)
        goto out;
    /* who reads what: every rank computes the same */
    char missing[256] = "";
    int nmissing = 0;
    for (int q = 0; q < w0; q++) {
        int best = -1;
        if (q < world && (all[(size_t)q * words + (size_t)q / 64] >> (q % 64) & 1))
            best = q;
        for (int r = 0; best != q && r < world; r++)
            if ((all[(size_t)r * words + (size_t)q / 64] >> (q % 64) & 1) && (best < 0 || load[r] < load[best]))
                best = r;
        reader[q] = best;
        if (best < 0) {
            if (nmissing++ < 8) {
                size_t used = strlen(missing);
                snprintf(missing + used, sizeof(missing) - used, "%s%d", used ? ", " : "", q);
            }
            continue;
        }
        index[q] = load[best]++;
        ncontrib = load[best] > ncontrib ? load[best] : ncontrib;
    }
    if (nmissing) {
        snprintf(err, errlen,
                 "checkpoint %s: no rank of this world finds the shard file%s of rank%s %s%s (of %d): "
                 "a node-local checkpoint_dir's files leave with their node; a shared one, or peer "
                 "replicas, survive that",
                 v->dir, nmissing > 1 ? "s" : "", nmissing > 1 ? "s" : "", missing,
                 nmissing > 8 ? ", ..." : "", w0);
        rc = -ENODATA;
        *absent = 1;
        goto out; /* every rank found the same: no collective is left half done */
    }
    /* each reader reads its files whole into blocks laid out as their shards */
    size_t stot = 0, off[GPT_MAX_UNITS];
    for (int u = 0; u < nunits; u++) {
        off[u] = stot;
        stot += S[u];
    }
    nmine = load[me];
    if (nmine && !(blocks = calloc((size_t)nmine * 3 * stot, sizeof(float))))
        rc = -ENOMEM;
    const float **mine = calloc((size_t)nmine + 1, sizeof(*mine));
    rc = rc ? rc : mine ? 0 : -ENOMEM;
    for (int q = 0, i = 0; !rc && q < w0; q++) {
        if (reader[q] != me)
            continue;
        struct ckpt_rank as = *c; /* this rank reading as rank q of the writer's world */
        float *blk = blocks + (size_t)i * 3 * stot;
        mine[i++] = blk;
        as.rank = q;
        as.world = w0;
        memcpy(as.shard, S, sizeof(size_t) * (size_t)nunits);
        memcpy(as.off, off, sizeof(size_t) * (size_t)nunits);
        as.params = blk, as.m = blk + stot, as.v = blk + 2 * stot;
        char file[JOB_PATH_MAX + 128];
        size_t bytes;
        const char *hex;
        view_file(v, q, file, sizeof(file), &bytes, &hex);
        rc = read_shard(&as, file, q, w0, S, bytes, hex, err, errlen);
    }
    if (rc == -ENOMEM)
        snprintf(err, errlen, "checkpoint: out of memory for %d shard file(s) of %zu floats", nmine, 3 * stot);
    if ((rc = agree_loaded(c, rc, err, errlen)) == 0)
        rc = ckpt_reslice(c, w0, S, ncontrib, mine, nmine, reader, index, err, errlen);
    free(mine);
out:
    if (crc && !rc) {
        snprintf(err, errlen, "checkpoint: collective failed: %s", c->why(c->coll, crc));
        rc = crc;
    }
    free(bits), free(all), free(reader), free(index), free(load), free(blocks);
    return rc;
}

/*
 * ckpt_load: every rank in step, whatever each one finds in its own view
 * of the directory (the same on a shared file system, its node's own files
 * where checkpoint_dir is node-local):
 *   1. the candidates: each rank says which step its `latest` names (or
 *      the step of the step directory given); a rank that finds nothing
 *      (a new node) names none;
 *   2. for each candidate, newest first: each rank reads that step's
 *      manifest if it has it and says so, with the world, seed and shard
 *      sizes, and whether it finds every file it needs itself;
 *   3. if every rank does, each reads its files (the common case, shared
 *      or not); otherwise the spread load ships the files round; a step
 *      whose manifest or some file is on no rank is passed over for the
 *      next older candidate: a directory a step behind (a commit whose
 *      rename failed on some node) names the step every node has, while the
 *      newer one lacks that node's files; a node that sat out some saves
 *      (the job went on without it) names an old step the others moved
 *      past, and it is not loaded while a newer one is whole;
 *   4. all learn whether every rank loaded.
 */
int ckpt_load(struct ckpt_rank *c, const char *path, char *err, size_t errlen)
{
    const int world = c->world;
    char probe[JOB_PATH_MAX + 32], passed[512] = "";
    struct step_view v = {0};
    long mine_step = -1;
    /* 1 */
    int rc = c->local_rc;
    snprintf(probe, sizeof(probe), "%s/manifest.json", path);
    if (rc) {
        snprintf(err, errlen, "checkpoint: this rank has no room for it: %s", strerror(-rc));
    } else {
        if (access(probe, F_OK) == 0) { /* a step directory */
            if ((rc = view_step(c, path, &v, err, errlen)) == 0)
                mine_step = v.step;
            json_decref(v.man);
            v.man = NULL;
        } else {
            rc = read_latest(path, &mine_step, err, errlen);
        }
    }
    uint64_t word = rc ? (uint64_t)(int64_t)rc : (uint64_t)(mine_step + 1);
    uint64_t *all = calloc((size_t)world * PROBE_WORDS, sizeof(uint64_t));
    uint64_t *named = calloc((size_t)world, sizeof(uint64_t));
    if (!all || !named) {
        free(all), free(named);
        return -ENOMEM; /* its peers fail at the gather it does not join: the collective breaks */
    }
    int crc = c->gather(c->coll, &word, 1, named), bad;
    if (!crc && (bad = first_error(named, world, 1, &rc)) >= 0) {
        rc = failed_on(bad, c->rank, rc, "read its checkpoint directory", err, errlen);
        goto out;
    }
    /* at most one candidate a rank: the loop is bounded by the world */
    for (long newer = -1, step; !crc; newer = step) {
        step = -1;
        for (int r = 0; r < world; r++) {
            long s = (long)named[r] - 1;
            if (named[r] && (newer < 0 || s < newer) && s > step)
                step = s;
        }
        if (step < 0 && newer < 0) {
            snprintf(err, errlen, "checkpoint: no rank finds a checkpoint at %s", path);
            rc = -ENOENT;
            break;
        }
        if (step < 0) { /* every candidate passed over: the newest one's reason */
            snprintf(err, errlen, "%s", passed);
            rc = -ENODATA;
            break;
        }
        if (newer >= 0 && c->rank == 0)
            log_warn("checkpoint step %ld is not whole on this world's ranks (%s); trying step %ld",
                     newer, err, step);
        /* 2 */
        uint64_t offer[PROBE_WORDS] = {0};
        char dir[JOB_PATH_MAX + 32];
        if (access(probe, F_OK) == 0)
            snprintf(dir, sizeof(dir), "%s", path);
        else
            snprintf(dir, sizeof(dir), "%s/step-%08ld", path, step);
        json_decref(v.man);
        rc = view_step(c, dir, &v, err, errlen);
        if (rc == 0 && v.step != step) {
            snprintf(err, errlen, "checkpoint %s: its manifest says step %ld", dir, v.step);
            rc = -EINVAL;
        }
        offer[PROBE_FOUND] = rc == -ENOENT ? 0 : rc ? (uint64_t)(int64_t)rc : 1;
        if (rc == 0) {
            offer[PROBE_WORLD] = (uint64_t)v.world;
            offer[PROBE_SEED] = (uint64_t)v.seed;
            offer[PROBE_FILES] = v.files_hash;
            offer[PROBE_SELF] = 1;
            for (int q = 0; q < v.world && offer[PROBE_SELF]; q++)
                offer[PROBE_SELF] = !needed(c, q, v.S) || view_has(&v, q);
            for (int u = 0; u < c->lay.nunits; u++)
                offer[PROBE_S + u] = v.S[u];
        }
        if ((crc = c->gather(c->coll, offer, PROBE_WORDS, all)) != 0)
            break;
        if ((bad = first_error(all, world, PROBE_WORDS, &rc)) >= 0) {
            rc = failed_on(bad, c->rank, rc, "read the manifest of the step to load", err, errlen);
            break;
        }
        int first = -1, self = 1;
        rc = 0;
        for (int r = 0; !rc && r < world; r++) {
            const uint64_t *o = all + (size_t)r * PROBE_WORDS;
            self = self && o[PROBE_SELF];
            if (!o[PROBE_FOUND])
                continue;
            if (first < 0) {
                first = r;
            } else if (memcmp(o + PROBE_WORLD, all + (size_t)first * PROBE_WORDS + PROBE_WORLD,
                              sizeof(uint64_t) * 3) ||
                       memcmp(o + PROBE_S, all + (size_t)first * PROBE_WORDS + PROBE_S,
                              sizeof(uint64_t) * (size_t)c->lay.nunits)) {
                snprintf(err, errlen,
                         "checkpoint step %ld: the manifests ranks %d and %d find differ (world, "
                         "seed, files or shard sizes): two runs share the name",
                         step, first, r);
                rc = -EINVAL;
            }
        }
        if (rc)
            break;
        int absent = 0;
        if (first < 0) {
            snprintf(err, errlen, "checkpoint step %ld: no rank finds its manifest under %s", step,
                     path);
            rc = -ENODATA;
            absent = 1;
        } else {
            /* 3 */
            const uint64_t *o = all + (size_t)first * PROBE_WORDS;
            size_t S[GPT_MAX_UNITS];
            for (int u = 0; u < c->lay.nunits; u++)
                S[u] = (size_t)o[PROBE_S + u];
            if (self) {
                rc = agree_loaded(c, load_own(c, &v, err, errlen), err, errlen);
            } else {
                if (c->rank == 0)
                    log_info("checkpoint step %ld: not every rank finds the files it needs in its "
                             "own view of %s; each file is read once and shipped", step, path);
                rc = load_spread(c, &v, (int)o[PROBE_WORLD], S, &absent, err, errlen);
            }
            if (rc == 0) {
                c->seed = (int64_t)o[PROBE_SEED];
                c->step = step;
                if (c->seed != c->spec->seed)
                    log_warn("checkpoint step %ld was trained with seed %" PRId64 "; continuing "
                             "with it (this run asked for %" PRId64 ")", step, c->seed, c->spec->seed);
            }
        }
        if (!absent)
            break;
        if (!passed[0])
            snprintf(passed, sizeof(passed), "%s", err);
    }
out:
    if (crc && !rc) {
        snprintf(err, errlen, "checkpoint: collective failed: %s", c->why(c->coll, crc));
        rc = crc;
    }
    json_decref(v.man);
    free(named);
    free(all);
    return rc;
}
