#include "worker/agent/rank_user.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <inttypes.h>
#include <linux/capability.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "common/cmdline.h"

/* A decimal id without sign or junk, below (id_t)-1 (which set*id read as "unchanged"). */
static int parse_id(const char *s, unsigned long *out)
{
    char *end;
    if (!s || s[0] < '0' || s[0] > '9')
        return -EINVAL;
    errno = 0;
    unsigned long v = strtoul(s, &end, 10);
    if (errno || *end || v >= (unsigned long)(uid_t)-1)
        return -EINVAL;
    *out = v;
    return 0;
}

/* The capability sets of this process (v3: two 32-bit words each). */
static int caps_get(struct __user_cap_data_struct data[2])
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    return syscall(SYS_capget, &h, data) == 0 ? 0 : -errno;
}

static bool has_cap(const struct __user_cap_data_struct data[2], int cap)
{
    return (data[cap / 32].effective >> (cap % 32)) & 1u;
}

int rank_user_resolve(const char *user, const char *group, struct rank_user *ru, char *err, size_t cap)
{
    memset(ru, 0, sizeof(*ru));
    if (!user || !user[0]) {
        if (group && group[0]) {
            snprintf(err, cap, "rank_group: needs rank_user (the group of which user?), got \"%s\" alone", group);
            return -EINVAL;
        }
        return 0;
    }
    unsigned long id;
    struct passwd *pw = getpwnam(user);
    if (!pw && parse_id(user, &id) == 0)
        pw = getpwuid((uid_t)id);
    if (!pw) {
        snprintf(err, cap, "rank_user: no user \"%s\" on this machine (getent passwd %s); create it "
                 "(useradd -r -M -s /usr/sbin/nologin %s) or name another", user, user, user);
        return -EINVAL;
    }
    ru->uid = pw->pw_uid;
    ru->gid = pw->pw_gid;
    snprintf(ru->name, sizeof(ru->name), "%s", pw->pw_name);
    if (group && group[0]) {
        struct group *gr = getgrnam(group);
        if (!gr && parse_id(group, &id) == 0)
            gr = getgrgid((gid_t)id);
        if (!gr) {
            snprintf(err, cap, "rank_group: no group \"%s\" on this machine (getent group %s)", group, group);
            return -EINVAL;
        }
        ru->gid = gr->gr_gid;
        ru->groups[0] = ru->gid; /* a named group: that group alone, not the user's others */
        ru->ngroups = 1;
    } else {
        ru->ngroups = RANK_USER_MAX_GROUPS;
        if (getgrouplist(pw->pw_name, ru->gid, ru->groups, &ru->ngroups) < 0) {
            snprintf(err, cap, "rank_user: \"%s\" is in more than %d groups; give rank_group", user,
                     RANK_USER_MAX_GROUPS);
            return -EINVAL;
        }
    }
    if (ru->uid == 0) {
        snprintf(err, cap, "rank_user: \"%s\" is root; name an unprivileged user (or leave rank_user unset)", user);
        return -EINVAL;
    }
    if (ru->uid == geteuid() && ru->gid == getegid() && ru->ngroups == 1 && ru->groups[0] == ru->gid)
        return 0; /* already who the ranks must be: nothing to drop (ru->set stays false) */
    struct __user_cap_data_struct caps[2];
    bool can = geteuid() == 0 || (caps_get(caps) == 0 && has_cap(caps, CAP_SETUID) && has_cap(caps, CAP_SETGID));
    if (!can) {
        snprintf(err, cap, "rank_user: the agent runs as uid %u without CAP_SETUID and CAP_SETGID, so it cannot "
                 "start ranks as \"%s\" (uid %u): run it as root, give it those capabilities (see "
                 "muster-worker.service), or leave rank_user unset", (unsigned)geteuid(), user, (unsigned)ru->uid);
        return -EPERM;
    }
    ssize_t n = readlink("/proc/self/exe", ru->exe, sizeof(ru->exe) - 1);
    if (n < 0) {
        snprintf(err, cap, "rank_user: cannot find this program's path: %s", strerror(errno));
        return -errno;
    }
    ru->exe[n] = '\0';
    ru->set = true;
    return 0;
}

char **rank_user_argv(const struct rank_user *ru, char *const *argv)
{
    size_t n = 0;
    while (argv[n])
        n++;
    const size_t pre = ru && ru->set ? 6 : 0; /* EXE --rank-exec UID GID GROUPS -- */
    char **out = calloc(pre + n + 1, sizeof(*out));
    if (!out)
        return NULL;
    if (pre) {
        char ids[RANK_USER_MAX_GROUPS * 11 + 1], uid[16], gid[16];
        size_t len = 0;
        ids[0] = '\0';
        snprintf(uid, sizeof(uid), "%u", (unsigned)ru->uid);
        snprintf(gid, sizeof(gid), "%u", (unsigned)ru->gid);
        for (int i = 0; i < ru->ngroups; i++)
            len += (size_t)snprintf(ids + len, sizeof(ids) - len, "%s%u", i ? "," : "", (unsigned)ru->groups[i]);
        /* Filled in order: cmdline_free stops at the first NULL, which is the first not made. */
        if (!(out[0] = strdup(ru->exe)) || !(out[1] = strdup(RANK_USER_EXEC_FLAG)) ||
            !(out[2] = strdup(uid)) || !(out[3] = strdup(gid)) ||
            !(out[4] = strdup(ids[0] ? ids : "-")) || !(out[5] = strdup("--")))
            goto oom;
    }
    for (size_t i = 0; i < n; i++)
        if (!(out[pre + i] = strdup(argv[i])))
            goto oom;
    return out;
oom:
    cmdline_free(out);
    return NULL;
}

/* fchown/fchmod of an open directory to the rank's group and mode. */
static int grant_fd(int fd, gid_t gid, mode_t mode)
{
    if (fchown(fd, (uid_t)-1, gid) != 0 || fchmod(fd, mode) != 0)
        return -errno;
    return 0;
}

int rank_user_grant_dir(const struct rank_user *ru, const char *base, const char *dir)
{
    if (!ru || !ru->set)
        return 0;
    size_t blen = strlen(base);
    if (strncmp(dir, base, blen) != 0 || (dir[blen] != '/' && dir[blen] != '\0'))
        return -EINVAL;
    int fd = open(base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    char rest[PATH_MAX];
    snprintf(rest, sizeof(rest), "%s", dir + blen + (dir[blen] == '/'));
    int rc = 0;
    char *save = NULL;
    for (char *part = strtok_r(rest, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        if ((rc = grant_fd(fd, ru->gid, 0710)) != 0)
            break;
        int next = openat(fd, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (next < 0) {
            rc = -errno;
            break;
        }
        close(fd);
        fd = next;
    }
    if (rc == 0)
        rc = grant_fd(fd, ru->gid, 0770);
    close(fd);
    return rc;
}

int rank_user_parse_ids(const char *uid, const char *gid, const char *groups, struct rank_user *ru)
{
    unsigned long v;
    memset(ru, 0, sizeof(*ru));
    if (parse_id(uid, &v) != 0 || v == 0)
        return -EINVAL;
    ru->uid = (uid_t)v;
    if (parse_id(gid, &v) != 0)
        return -EINVAL;
    ru->gid = (gid_t)v;
    if (strcmp(groups, "-") == 0)
        return 0;
    char list[RANK_USER_MAX_GROUPS * 11 + 1];
    if (snprintf(list, sizeof(list), "%s", groups) >= (int)sizeof(list))
        return -EINVAL;
    char *save = NULL;
    for (char *g = strtok_r(list, ",", &save); g; g = strtok_r(NULL, ",", &save)) {
        if (ru->ngroups == RANK_USER_MAX_GROUPS || parse_id(g, &v) != 0)
            return -EINVAL;
        ru->groups[ru->ngroups++] = (gid_t)v;
    }
    return ru->ngroups > 0 ? 0 : -EINVAL;
}

/* No capability left in any set: a non-root agent holds some (ambient ones reach this process). */
static int drop_caps(void)
{
    struct __user_cap_header_struct h = {.version = _LINUX_CAPABILITY_VERSION_3, .pid = 0};
    struct __user_cap_data_struct none[2];
    memset(none, 0, sizeof(none));
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        return -errno;
    return syscall(SYS_capset, &h, none) == 0 ? 0 : -errno;
}

static int exec_fail(int code, const char *what, int err)
{
    fprintf(stderr, "muster-worker: cannot start the rank as its rank_user: %s: %s\n", what, strerror(err));
    return code;
}

int rank_user_exec(int argc, char **argv)
{
    struct rank_user ru;
    if (argc < 7 || strcmp(argv[5], "--") != 0 || rank_user_parse_ids(argv[2], argv[3], argv[4], &ru) != 0) {
        fprintf(stderr, "muster-worker: %s is the agent's own: %s UID GID G1,G2,... -- PROGRAM [ARG]...\n",
                RANK_USER_EXEC_FLAG, RANK_USER_EXEC_FLAG);
        return 2;
    }
    /* Groups first and the user last: after setresuid nothing else may be changed. */
    if (setgroups((size_t)ru.ngroups, ru.groups) != 0)
        return exec_fail(126, "setgroups", errno);
    if (setresgid(ru.gid, ru.gid, ru.gid) != 0)
        return exec_fail(126, "setresgid", errno);
    if (setresuid(ru.uid, ru.uid, ru.uid) != 0)
        return exec_fail(126, "setresuid", errno);
    int rc = drop_caps();
    if (rc != 0)
        return exec_fail(126, "dropping capabilities", -rc);
    /* The proof: the ids are the rank's, and the way back to root is shut. */
    uid_t r, e, s;
    gid_t gr, ge, gs;
    if (getresuid(&r, &e, &s) != 0 || r != ru.uid || e != ru.uid || s != ru.uid || getresgid(&gr, &ge, &gs) != 0 ||
        gr != ru.gid || ge != ru.gid || gs != ru.gid)
        return exec_fail(126, "the ids did not change", EPERM);
    if (setuid(0) == 0 || setgid(0) == 0 || errno != EPERM)
        return exec_fail(126, "it could become root again", EPERM);
    execvp(argv[6], argv + 6);
    char what[PATH_MAX + 16];
    snprintf(what, sizeof(what), "cannot run '%s'", argv[6]);
    return exec_fail(127, what, errno);
}
