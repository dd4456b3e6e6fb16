/*
 * failure: what kind of failure a rank's end was, and how long the next
 * generation waits for it. Pure functions over what RANK_EXIT carries (exit
 * status, signal, the rank's own words) and the job's restart keys, so the
 * policy is one table and unit-tested on its own.
 *
 * Classes, and what the daemon does about them:
 *   exit, signal, comm   transient as far as anyone knows: restart; a streak of
 *                        failures backs off (restart_backoff_ms doubling up to
 *                        restart_backoff_max_ms; the first restart after a
 *                        healthy run is immediate)
 *   disk_full, oom       the same configuration will fail the same way unless
 *                        someone acts: restart, but only after the longest
 *                        backoff, so max_restarts is not spent in seconds
 *   config               the rank's program cannot run, or refused its own
 *                        arguments or imports: retrying cannot help; the job
 *                        fails at once, saying so
 */
#ifndef MUSTER_DAEMON_FAILURE_H
#define MUSTER_DAEMON_FAILURE_H

#include <stdint.h>

#include "common/jobspec.h"
#include "proto/proto.h"

enum failure_class {
    FAILURE_EXIT,      /* exited non-zero, nothing more known */
    FAILURE_SIGNAL,    /* killed by a signal */
    FAILURE_COMM,      /* a collective's peer went away (often a consequence) */
    FAILURE_DISK_FULL, /* ENOSPC, quota */
    FAILURE_OOM,       /* host or device memory */
    FAILURE_CONFIG,    /* cannot run, usage error, missing module */
};

enum failure_class failure_classify(const struct proto_rank_exit *x);

/* "exit", "disk_full", ... as in /v1/status and events. */
const char *failure_class_name(enum failure_class c);

/* Retrying cannot help: the job fails at once. */
int failure_fatal(enum failure_class c);

/*
 * Milliseconds to wait before the generation after the streak-th failure in
 * a row (streak >= 1) of class c: 0 for the first of a transient class.
 */
uint64_t failure_backoff_ms(const struct job_spec *spec, uint32_t streak, enum failure_class c);

#endif
