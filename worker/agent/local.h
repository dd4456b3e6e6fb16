/*
 * local: `muster-worker --local`, the one-machine launcher (like torchrun
 * --standalone). It starts a private musterd (random loopback ports, a fresh
 * token and state directory under a temporary directory, the job forced to
 * one node, --exit-on-end), runs this agent against it, and returns the
 * job's status: 0 when it completed, 1 when it failed or was stopped.
 */
#ifndef MUSTER_WORKER_LOCAL_H
#define MUSTER_WORKER_LOCAL_H

#include <stdint.h>

#include "worker/agent/agent.h"

struct local_config {
    const char *job_path; /* the user's job spec */
    uint16_t http_port;   /* REST port; 0 = 29471 if free, else any */
};

/* cfg: the agent configuration with everything but the daemon and token. */
int local_run(const struct local_config *lc, struct agent_config *cfg);

#endif
