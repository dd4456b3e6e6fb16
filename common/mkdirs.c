#include "common/mkdirs.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define RMTREE_DEPTH 16

int mkdirs(const char *path, mode_t mode)
{
    char buf[PATH_MAX];
    if (snprintf(buf, sizeof(buf), "%s", path) >= (int)sizeof(buf))
        return -ENAMETOOLONG;
    for (char *p = buf + 1;; p++) {
        if (*p != '/' && *p != '\0')
            continue;
        char c = *p;
        *p = '\0';
        if (mkdir(buf, mode) != 0 && errno != EEXIST)
            return -errno;
        *p = c;
        if (c == '\0')
            return 0;
    }
}

int dir_private(const char *path, char *why, size_t cap)
{
    struct stat st;
    if (lstat(path, &st) != 0) {
        int rc = -errno;
        snprintf(why, cap, "%s", strerror(errno));
        return rc;
    }
    if (!S_ISDIR(st.st_mode)) {
        snprintf(why, cap, "not a directory (%s)", S_ISLNK(st.st_mode) ? "a symbolic link" : "a file");
        return -ENOTDIR;
    }
    if (st.st_uid != geteuid()) {
        snprintf(why, cap, "owned by uid %u, not by this agent's user (uid %u)", (unsigned)st.st_uid,
                 (unsigned)geteuid());
        return -EPERM;
    }
    if (st.st_mode & (S_IWGRP | S_IWOTH)) {
        snprintf(why, cap, "%s may write it (mode %04o): make it 0700", st.st_mode & S_IWOTH ? "anyone" : "its group",
                 (unsigned)(st.st_mode & 07777));
        return -EPERM;
    }
    return 0;
}

static int rmtree_depth(int at, const char *name, int depth)
{
    int fd = openat(at, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        if (errno != ENOTDIR && errno != ELOOP)
            return -errno;
        /* a file, a FIFO, a link: the entry itself goes */
        return unlinkat(at, name, 0) == 0 ? 0 : -errno;
    }
    int rc = 0;
    DIR *dp = depth < RMTREE_DEPTH ? fdopendir(fd) : NULL;
    if (!dp) {
        close(fd);
        return depth < RMTREE_DEPTH ? -errno : -ELOOP;
    }
    struct dirent *e;
    while ((e = readdir(dp)) != NULL) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
            continue;
        int one = rmtree_depth(dirfd(dp), e->d_name, depth + 1);
        if (one && !rc)
            rc = one;
    }
    closedir(dp);
    if (unlinkat(at, name, AT_REMOVEDIR) != 0 && !rc)
        rc = -errno;
    return rc;
}

int rmtree_at(int dirfd, const char *name)
{
    return rmtree_depth(dirfd, name, 0);
}

int open_regular_file(const char *path, int flags, mode_t mode)
{
    int fd = open(path, flags | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC, mode);
    if (fd < 0)
        return -1;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    return fd;
}
