/* mkdirs: mkdir -p, the directories it creates getting mode. */
#ifndef MUSTER_MKDIRS_H
#define MUSTER_MKDIRS_H

#include <sys/types.h>

/* 0 when path is a directory afterwards; -ENAMETOOLONG or the failing mkdir's -errno. */
int mkdirs(const char *path, mode_t mode);

#endif
