/*
 * devices: what a node offers its ranks, from the --devices flag.
 *
 *   cpu:N      N CPU "devices" (1..64), for development and tests
 *   gpu:all    every GPU the driver exposes (/dev/nvidia0, /dev/nvidia1, ...)
 *   gpu:0,1    explicit GPU ordinals
 *
 * devices_parse() is pure; "gpu:all" leaves the list empty with all_gpus set
 * and devices_probe_gpus() fills it from a device directory.
 */
#ifndef MUSTER_WORKER_DEVICES_H
#define MUSTER_WORKER_DEVICES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define DEVICES_CPU_MAX 64

struct device_set {
    enum proto_device_kind kind;
    bool all_gpus;      /* "gpu:all": ids come from devices_probe_gpus() */
    uint32_t n;         /* number of devices, 1..PROTO_MAX_LOCAL_RANKS */
    uint32_t ids[PROTO_MAX_LOCAL_RANKS]; /* cpu: 0..n-1; gpu: ordinals */
};

/* Returns 0, or -EINVAL with "what was expected, what came" in err. */
int devices_parse(const char *spec, struct device_set *out, char *err, size_t errlen);

/*
 * Fills out (kind gpu) with the ordinals of the nvidiaN entries of devdir
 * ("/dev" in production), ascending. Returns 0, or -ENODEV / -errno with
 * the reason in err.
 */
int devices_probe_gpus(const char *devdir, struct device_set *out, char *err, size_t errlen);

/* True when id is one of the set's devices. */
bool devices_contains(const struct device_set *set, uint32_t id);

#endif
