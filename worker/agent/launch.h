/*
 * launch: a musterd child process for one job, run by the agent that needs
 * it: `muster-worker --local` (one machine) and `--from-env` on node rank 0
 * (cloud platforms). It copies the job spec into a private temporary
 * directory with "nodes" forced to the launcher's node count, spawns the
 * musterd next to this program with --exit-on-end (a private state
 * directory; no $NOTIFY_SOCKET: only the agent talks to systemd), waits
 * until its control port accepts, and at the end reaps it and turns its
 * exit status into the job's (0 completed, 1 failed or stopped).
 */
#ifndef MUSTER_WORKER_LAUNCH_H
#define MUSTER_WORKER_LAUNCH_H

#include <stdint.h>
#include <sys/types.h>

struct launch_config {
    const char *job_path;   /* the user's job spec */
    int nodes;              /* written into the copy's "nodes" */
    const char *listen;     /* control address to listen on, "127.0.0.1" or "0.0.0.0" */
    uint16_t ctl_port;      /* 0 = any free loopback port */
    uint16_t http_port;     /* REST on 127.0.0.1; 0 = 29471 when free, else any */
    const char *token_file; /* NULL = a fresh random token in the private directory */
};

struct launch {
    char dir[64];           /* the private directory (kept when the job did not complete) */
    pid_t pid;              /* the musterd child */
    uint16_t ctl_port, http_port;
    char job_name[64];
    char token_hex[65];     /* the fresh token when launch_config.token_file was NULL */
};

/*
 * Starts the daemon and waits (up to timeout_ms) until its control port
 * accepts connections. Returns 0, or 1 after logging why (bad job spec, no
 * port, musterd exited at once, e.g. "port already in use"); nothing is
 * left running then.
 */
int launch_start(const struct launch_config *lc, struct launch *l, int timeout_ms);

/*
 * After the agent returned agent_code: gives the daemon a moment to exit on
 * its own (it ends the agents when the job ends), else stops it; removes the
 * private directory when the job completed. Returns the job's exit status.
 */
int launch_finish(struct launch *l, int agent_code);

#endif
