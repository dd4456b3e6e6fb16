/*
 * A disk slow to make writes durable, for tests: LD_PRELOAD'ed into musterd,
 * it makes every fsync(2) and fdatasync(2) take longer by the milliseconds
 * written in the file MUSTER_TEST_FSYNC_FILE names, read at each call (as on
 * a loaded disk, where one can take seconds), then does the real one.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void slow(void)
{
    const char *file = getenv("MUSTER_TEST_FSYNC_FILE");
    FILE *f = file ? fopen(file, "r") : NULL;
    long v = 0;
    if (f) {
        if (fscanf(f, "%ld", &v) != 1)
            v = 0;
        fclose(f);
    }
    if (v <= 0 || v > 60000)
        return;
    struct timespec ts = {.tv_sec = v / 1000, .tv_nsec = (v % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0)
        ;
}

int fsync(int fd)
{
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    slow();
    return real(fd);
}

int fdatasync(int fd)
{
    static int (*real)(int);
    if (!real)
        real = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    slow();
    return real(fd);
}
