#include "common/token.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int token_read(const char *path, uint8_t *buf, size_t cap, size_t *len, char *err, size_t errlen)
{
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot read the token file: %s", path, strerror(e));
        return -e;
    }
    if (fstat(fd, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: cannot read the token file: %s", path, strerror(e));
        close(fd);
        return -e;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: the token file is not a regular file", path);
        close(fd);
        return -EINVAL;
    }
    /* A token others can read is a token others can use to join or to stop the job. */
    if (st.st_mode & (S_IRWXG | S_IRWXO)) {
        snprintf(err, errlen, "%s: token file has mode %04o, readable or writable by others; "
                 "run `chmod 600 %s`", path, (unsigned)(st.st_mode & 07777), path);
        close(fd);
        return -EPERM;
    }
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) {
            int e = errno;
            snprintf(err, errlen, "%s: cannot read the token file: %s", path, strerror(e));
            close(fd);
            return -e;
        }
        if (r == 0)
            break;
        n += (size_t)r;
        if (n == cap) {
            char extra;
            ssize_t more = read(fd, &extra, 1);
            if (more > 0) {
                snprintf(err, errlen, "%s: token file is larger than %zu bytes", path, cap);
                close(fd);
                return -EFBIG;
            }
            break;
        }
    }
    close(fd);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r'))
        n--;
    if (n == 0) {
        snprintf(err, errlen, "%s: token file is empty", path);
        return -ENODATA;
    }
    *len = n;
    return 0;
}

void token_default_path(char *out, size_t cap)
{
    const char *conf = getenv("CONFIGURATION_DIRECTORY");
    snprintf(out, cap, "%s/token", conf && conf[0] ? conf : "/etc/muster");
}

int token_check_private(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) != 0) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    unsigned mode = (unsigned)(st.st_mode & 07777);
    if (st.st_mode & (S_IRWXO | S_IWGRP | S_IXGRP)) {
        snprintf(err, errlen, "%s: mode %04o lets other users read or change it (a rank, say); run `chmod 600 %s`",
                 path, mode, path);
        return -EPERM;
    }
    if (st.st_mode & S_IRGRP) {
        snprintf(err, errlen, "%s: mode %04o lets group %u read it; unless only musterd's users are in that group, "
                 "run `chmod 600 %s`", path, mode, (unsigned)st.st_gid, path);
        return 1;
    }
    return 0;
}
