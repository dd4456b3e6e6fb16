#include "worker/agent/devices.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int fail(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static int fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    return -EINVAL;
}

/* Parses a decimal number of at most 9 digits spanning s[0..len). */
static int parse_uint(const char *s, size_t len, uint32_t *out)
{
    if (len == 0 || len > 9)
        return -1;
    uint32_t v = 0;
    for (size_t i = 0; i < len; i++) {
        if (!isdigit((unsigned char)s[i]))
            return -1;
        v = v * 10 + (uint32_t)(s[i] - '0');
    }
    *out = v;
    return 0;
}

static int parse_gpu_list(const char *list, struct device_set *out, char *err, size_t errlen)
{
    const char *p = list;
    for (;;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        uint32_t id;
        if (parse_uint(p, len, &id) != 0)
            return fail(err, errlen, "--devices: gpu ordinal '%.*s' is not a number", (int)len, p);
        if (devices_contains(out, id))
            return fail(err, errlen, "--devices: gpu ordinal %u is listed twice", id);
        if (out->n == PROTO_MAX_LOCAL_RANKS)
            return fail(err, errlen, "--devices: more than %d gpus listed", PROTO_MAX_LOCAL_RANKS);
        out->ids[out->n++] = id;
        if (!end)
            return 0;
        p = end + 1;
    }
}

int devices_parse(const char *spec, struct device_set *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof(*out));
    if (strncmp(spec, "cpu:", 4) == 0) {
        const char *num = spec + 4;
        uint32_t n;
        if (parse_uint(num, strlen(num), &n) != 0 || n < 1 || n > DEVICES_CPU_MAX)
            return fail(err, errlen, "--devices: cpu:N needs N in 1..%d, got '%s'", DEVICES_CPU_MAX, num);
        out->kind = PROTO_DEV_CPU;
        out->n = n;
        for (uint32_t i = 0; i < n; i++)
            out->ids[i] = i;
        return 0;
    }
    if (strncmp(spec, "gpu:", 4) == 0) {
        out->kind = PROTO_DEV_GPU;
        if (strcmp(spec + 4, "all") == 0) {
            out->all_gpus = true;
            return 0;
        }
        if (spec[4] == '\0')
            return fail(err, errlen, "--devices: gpu: needs 'all' or a list of ordinals such as gpu:0,1");
        return parse_gpu_list(spec + 4, out, err, errlen);
    }
    return fail(err, errlen, "--devices: expected cpu:N, gpu:all or gpu:I,J,..., got '%s'", spec);
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int devices_probe_gpus(const char *devdir, struct device_set *out, char *err, size_t errlen)
{
    DIR *d = opendir(devdir);
    if (!d) {
        int e = errno;
        snprintf(err, errlen, "--devices gpu:all: cannot list %s: %s", devdir, strerror(e));
        return -e;
    }
    memset(out, 0, sizeof(*out));
    out->kind = PROTO_DEV_GPU;
    out->all_gpus = true;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        uint32_t id;
        if (strncmp(de->d_name, "nvidia", 6) != 0)
            continue;
        if (parse_uint(de->d_name + 6, strlen(de->d_name + 6), &id) != 0)
            continue; /* nvidiactl, nvidia-uvm, ... */
        if (out->n < PROTO_MAX_LOCAL_RANKS)
            out->ids[out->n++] = id;
    }
    closedir(d);
    if (out->n == 0) {
        snprintf(err, errlen, "--devices gpu:all: no GPU found (no %s/nvidia0, nvidia1, ...); is the NVIDIA driver loaded? "
                 "Use cpu:N to run without GPUs", devdir);
        return -ENODEV;
    }
    qsort(out->ids, out->n, sizeof(out->ids[0]), cmp_u32);
    return 0;
}

bool devices_contains(const struct device_set *set, uint32_t id)
{
    for (uint32_t i = 0; i < set->n; i++)
        if (set->ids[i] == id)
            return true;
    return false;
}
