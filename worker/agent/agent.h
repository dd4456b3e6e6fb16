/*
 * agent: the node agent's event loop. Joins the daemon (HELLO, CHALLENGE /
 * RESPONSE, WELCOME), rejoins with jittered backoff when the link is lost,
 * fences its ranks when the daemon has been silent longer than the lease,
 * spawns one rank per assigned slot and relays between ranks and daemon
 * (see proto/PROTOCOL.md for the conversation).
 */
#ifndef MUSTER_WORKER_AGENT_H
#define MUSTER_WORKER_AGENT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"
#include "worker/agent/agent_join.h"
#include "worker/agent/devices.h"
#include "worker/agent/rank_user.h"

struct agent_config {
    char daemon[HOSTPORT_HOST_MAX + 16]; /* HOST:PORT as given, for messages */
    char host[HOSTPORT_HOST_MAX];
    uint16_t port;
    /* Every musterd of the job (--daemon a:P,b:P); n = 0: only daemon. */
    struct daemon_list daemons;
    char node[PROTO_NAME_MAX];
    char addr[PROTO_NAME_MAX]; /* "" = local address of the daemon connection */
    char domain[PROTO_NAME_MAX]; /* placement label sent in HELLO (a rack, an NVLink domain); "" = none */
    struct device_set devices;
    const uint8_t *token;
    size_t token_len;
    char **rank_argv;      /* the agent's rank command, NULL-terminated (worker.json, flag or default) */
    int rank_argv_pinned;  /* given on the command line: it wins over the job's rank_cmd */
    char state_dir[4096];  /* rank directories live here (error files, logs) */
    char python_dir[4096]; /* muster's Python client with its start-up hook (startup/); "" = none found */
    uint16_t port_lo, port_hi; /* master_port_range */
    uint64_t log_max_bytes; /* per rank log file (log_max_mb); 0 = no rank logs */
    struct rank_user rank_user; /* who the job's processes run as; .set false = the agent's user */
};

/*
 * Runs the agent until it is told to shut down (COMMAND shutdown, SIGTERM,
 * SIGINT) or refused for good (REJECT auth / version). Returns the process
 * exit status: 0 or 1.
 */
int agent_run(const struct agent_config *cfg);

#endif
