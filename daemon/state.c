#include "daemon/state.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#define STATE_VERSION 1

static json_t *to_json(const struct rdv_saved *s)
{
    json_t *members = json_array();
    for (uint32_t i = 0; i < s->nmembers; i++)
        json_array_append_new(members, json_pack("{s:s, s:i, s:i}", "name", s->members[i].name, "first_rank",
                                                  (int)s->members[i].first_rank, "ndevices",
                                                  (int)s->members[i].ndevices));
    json_t *obj = json_pack("{s:i, s:s, s:s, s:s, s:I, s:i, s:i, s:I, s:o}", "version", STATE_VERSION, "job", s->job,
                            "state", rdv_job_state_name(s->state), "reason", s->reason, "generation",
                            (json_int_t)s->generation, "restarts", (int)s->restarts, "world_size", (int)s->world_size,
                            "last_checkpoint_step", (json_int_t)s->last_checkpoint_step, "members", members);
    /* Hot spares (daemon/rdv_spare.c): the replacements so far and the last one; absent = none. */
    const struct rdv_replacement *x = &s->last_replacement;
    if (obj && x->generation &&
        json_object_set_new(obj, "spares", json_pack("{s:i, s:{s:I, s:I, s:s, s:s, s:s, s:i, s:i, s:i, s:b}}",
                                                     "replacements", (int)s->replacements, "last_replacement",
                                                     "generation", (json_int_t)x->generation, "wall_ms",
                                                     (json_int_t)x->wall_ms, "lost", x->lost, "spare", x->spare,
                                                     "why", x->why, "node_rank", (int)x->node_rank, "first_rank",
                                                     (int)x->first_rank, "nranks", (int)x->nranks, "same_domain",
                                                     x->same_domain)) != 0) {
        json_decref(obj);
        return NULL;
    }
    return obj;
}

/* The "spares" object of a state document into s (whose generation is read):
 * 0, or -1 with what is wrong in what[] ("replacements: ..."). */
static int spares_from_json(json_t *o, struct rdv_saved *s, char *what, size_t cap)
{
    json_error_t jerr;
    const char *lost, *spare, *why;
    json_int_t n, gen, wall, node_rank, first, nranks;
    int same;
    const char *wrong = NULL;
    if (json_unpack_ex(o, &jerr, JSON_STRICT, "{s:I, s:{s:I, s:I, s:s, s:s, s:s, s:I, s:I, s:I, s:b}}",
                       "replacements", &n, "last_replacement", "generation", &gen, "wall_ms", &wall, "lost", &lost,
                       "spare", &spare, "why", &why, "node_rank", &node_rank, "first_rank", &first, "nranks",
                       &nranks, "same_domain", &same) != 0) {
        snprintf(what, cap, "unexpected content: %s", jerr.text);
        return -1;
    }
    if (n < 1 || n > UINT32_MAX)
        wrong = "replacements: expected 1..4294967295";
    else if (gen < 1 || (uint64_t)gen > s->generation)
        wrong = "last_replacement.generation: expected 1..the document's generation";
    else if (wall < 0)
        wrong = "last_replacement.wall_ms: expected a time, not negative";
    else if (!proto_valid_name(lost))
        wrong = "last_replacement.lost: expected a node name (1..63 characters of [A-Za-z0-9._-])";
    else if (!proto_valid_name(spare))
        wrong = "last_replacement.spare: expected a node name (1..63 characters of [A-Za-z0-9._-])";
    else if (strcmp(why, "lost") != 0 && strcmp(why, "unfit") != 0)
        wrong = "last_replacement.why: expected lost or unfit";
    else if (node_rank < 0 || node_rank >= RDV_MAX_NODES)
        wrong = "last_replacement.node_rank: expected 0..4095";
    else if (first < 0 || first > 1 << 20)
        wrong = "last_replacement.first_rank: expected 0..1048576";
    else if (nranks < 1 || nranks > PROTO_MAX_LOCAL_RANKS) {
        snprintf(what, cap, "last_replacement.nranks: expected 1..%d", PROTO_MAX_LOCAL_RANKS);
        return -1;
    }
    if (wrong) {
        snprintf(what, cap, "%s", wrong);
        return -1;
    }
    struct rdv_replacement *x = &s->last_replacement;
    s->replacements = (uint32_t)n;
    x->generation = (uint64_t)gen;
    x->wall_ms = wall;
    snprintf(x->lost, sizeof(x->lost), "%s", lost);
    snprintf(x->spare, sizeof(x->spare), "%s", spare);
    snprintf(x->why, sizeof(x->why), "%s", why);
    x->node_rank = (uint32_t)node_rank;
    x->first_rank = (uint32_t)first;
    x->nranks = (uint32_t)nranks;
    x->same_domain = same;
    return 0;
}

char *state_to_text(const struct rdv_saved *s)
{
    json_t *obj = to_json(s);
    char *text = obj ? json_dumps(obj, JSON_INDENT(2)) : NULL;
    json_decref(obj);
    return text;
}

int state_write(const char *dir, const struct rdv_saved *s, char *err, size_t errlen)
{
    char path[4096], tmp[4200];
    char *text = state_to_text(s);
    int rc = 0, fd = -1;

    if (!text) {
        snprintf(err, errlen, "cannot render the state file: out of memory");
        return -ENOMEM;
    }
    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE_NAME);
    snprintf(tmp, sizeof(tmp), "%s.tmp", path);
    fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: cannot create: %s", tmp, strerror(errno));
        goto out;
    }
    size_t len = strlen(text), off = 0;
    while (off < len) {
        ssize_t n = write(fd, text + off, len - off);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0) {
            rc = -errno;
            snprintf(err, errlen, "%s: write failed: %s", tmp, strerror(errno));
            goto out;
        }
        off += (size_t)n;
    }
    if (fsync(fd) != 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: fsync failed: %s", tmp, strerror(errno));
        goto out;
    }
    close(fd);
    fd = -1;
    if (rename(tmp, path) != 0) {
        rc = -errno;
        snprintf(err, errlen, "rename %s -> %s failed: %s", tmp, path, strerror(errno));
        goto out;
    }
    int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || fsync(dfd) != 0) {
        rc = -errno;
        snprintf(err, errlen, "%s: fsync of the directory failed: %s", dir, strerror(errno));
    }
    if (dfd >= 0)
        close(dfd);
out:
    if (fd >= 0) {
        close(fd);
        unlink(tmp);
    }
    free(text);
    return rc;
}

static int bad(char *err, size_t errlen, const char *path, const char *what)
{
    snprintf(err, errlen, "%s: %s (move the file away to start the job afresh)", path, what);
    return -EINVAL;
}

/* The content of a state document (obj: taken); path names where it came from. */
static int from_json(json_t *obj, const char *path, struct rdv_saved *s, char *err, size_t errlen)
{
    json_error_t jerr;
    const char *job, *state, *reason;
    json_int_t version, generation, restarts, world, ckpt;
    json_t *members, *spares = NULL;

    memset(s, 0, sizeof(*s));
    int rc = 0;
    if (json_unpack_ex(obj, &jerr, JSON_STRICT, "{s:I, s:s, s:s, s:s, s:I, s:I, s:I, s:I, s:o, s?o}", "version",
                       &version, "job", &job, "state", &state, "reason", &reason, "generation", &generation,
                       "restarts", &restarts, "world_size", &world, "last_checkpoint_step", &ckpt, "members",
                       &members, "spares", &spares) != 0) {
        char what[300];
        snprintf(what, sizeof(what), "unexpected content: %s", jerr.text);
        rc = bad(err, errlen, path, what);
        goto out;
    }
    if (version != STATE_VERSION) {
        rc = bad(err, errlen, path, "unsupported version");
        goto out;
    }
    if (rdv_job_state_parse(state, &s->state) != 0) {
        rc = bad(err, errlen, path, "unknown job state");
        goto out;
    }
    if (generation < 0 || restarts < 0 || restarts > 1000000 || world < 0 || world > 1 << 20 || ckpt < -1 ||
        !json_is_array(members) || json_array_size(members) > RDV_MAX_NODES || strlen(job) >= sizeof(s->job)) {
        rc = bad(err, errlen, path, "a value is out of range");
        goto out;
    }
    snprintf(s->job, sizeof(s->job), "%s", job);
    snprintf(s->reason, sizeof(s->reason), "%s", reason);
    s->generation = (uint64_t)generation;
    s->restarts = (uint32_t)restarts;
    s->world_size = (uint32_t)world;
    s->last_checkpoint_step = ckpt;
    if (spares) {
        char what[300], said[240];
        if (!json_is_object(spares)) {
            rc = bad(err, errlen, path, "spares: expected an object");
            goto out;
        }
        if (spares_from_json(spares, s, said, sizeof(said)) != 0) {
            snprintf(what, sizeof(what), "spares: %s", said);
            rc = bad(err, errlen, path, what);
            goto out;
        }
    }
    size_t i;
    json_t *m;
    json_array_foreach(members, i, m) {
        const char *name;
        json_int_t first, ndev;
        if (json_unpack_ex(m, &jerr, JSON_STRICT, "{s:s, s:I, s:I}", "name", &name, "first_rank", &first,
                           "ndevices", &ndev) != 0 ||
            !proto_valid_name(name) || first < 0 || first >= world || ndev < 1 || ndev > PROTO_MAX_LOCAL_RANKS) {
            rc = bad(err, errlen, path, "a member entry is malformed");
            goto out;
        }
        struct rdv_saved_member *sm = &s->members[s->nmembers++];
        snprintf(sm->name, sizeof(sm->name), "%s", name);
        sm->first_rank = (uint32_t)first;
        sm->ndevices = (uint32_t)ndev;
    }
out:
    json_decref(obj);
    return rc;
}

int state_read(const char *dir, struct rdv_saved *s, char *err, size_t errlen)
{
    char path[4096];
    json_error_t jerr;

    snprintf(path, sizeof(path), "%s/%s", dir, STATE_FILE_NAME);
    if (access(path, F_OK) != 0)
        return -ENOENT;
    json_t *obj = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!obj) {
        snprintf(err, errlen, "%s: not valid JSON: %s (line %d)", path, jerr.text, jerr.line);
        return -EINVAL;
    }
    return from_json(obj, path, s, err, errlen);
}

int state_from_text(const char *text, const char *origin, struct rdv_saved *s, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *obj = json_loads(text, JSON_REJECT_DUPLICATES, &jerr);
    if (!obj) {
        snprintf(err, errlen, "%s: not valid JSON: %s (line %d)", origin, jerr.text, jerr.line);
        return -EINVAL;
    }
    return from_json(obj, origin, s, err, errlen);
}
