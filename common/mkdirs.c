#include "common/mkdirs.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <sys/stat.h>

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
