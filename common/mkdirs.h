/* mkdirs: mkdir -p, the directories it creates getting mode; and the checks
 * and removal of a private directory tree that others could tamper with. */
#ifndef MUSTER_MKDIRS_H
#define MUSTER_MKDIRS_H

#include <stddef.h>
#include <sys/types.h>

/* 0 when path is a directory afterwards; -ENAMETOOLONG or the failing mkdir's -errno. */
int mkdirs(const char *path, mode_t mode);

/*
 * 0 when path is a directory itself (not a symbolic link to one), owned by
 * this process's effective user, that neither its group nor others may
 * write: one nobody else can plant links or files in. Else -ENOTDIR or
 * -EPERM with why (the owner or the mode found), or lstat's -errno.
 */
int dir_private(const char *path, char *why, size_t cap);

/*
 * Removes name under the directory dirfd and, if it is a directory,
 * everything in it, by directory descriptor (openat with O_NOFOLLOW,
 * unlinkat): a symbolic link is removed, never followed, so an entry
 * swapped for a link meanwhile removes nothing outside the tree. Depth is
 * bounded (16). 0, or the first failure's -errno (the rest is still tried).
 */
int rmtree_at(int dirfd, const char *name);

/*
 * path opened with flags (O_RDONLY, O_WRONLY | O_CREAT ..., mode for a file
 * made) only when it is a regular file: never through a final symbolic link
 * (a rank's link to the cluster token, say), and without waiting (a FIFO a
 * rank put there must not hold the caller's loop). The fd, or -1 with errno
 * (EINVAL: not a regular file).
 */
int open_regular_file(const char *path, int flags, mode_t mode);

#endif
