/*
 * agent_config: worker.json, the node agent's configuration file, so that a
 * freshly booted node joins with no command line (systemd runs
 * `muster-worker`, which reads /etc/muster/worker.json). One table
 * (agent_config.c); flags override the file; docs/config.md documents it.
 */
#ifndef MUSTER_WORKER_AGENT_CONFIG_H
#define MUSTER_WORKER_AGENT_CONFIG_H

#include <limits.h>
#include <stddef.h>
#include <stdint.h>

#include "common/cmdline.h"
#include "common/conf.h"
#include "proto/proto.h"
#include "worker/agent/agent_join.h"

struct agent_file {
    char daemon[HOSTPORT_HOST_MAX + 16]; /* HOST:PORT of musterd's control port */
    char node[PROTO_NAME_MAX];           /* "" = the host name */
    char devices[256];                   /* cpu:N, gpu:all, gpu:I,J,... */
    char token_file[PATH_MAX];           /* cluster token, mode 0600 */
    char rank_cmd[CMDLINE_MAX];          /* packed (common/cmdline.h); unset = the job's, else muster-train */
    char state_dir[PATH_MAX];            /* rank directories: error files, logs */
    char master_port_range[16];          /* LO-HI: where MASTER_PORT is chosen on this node */
    char log_max_mb[24];                 /* per rank log file, MiB; "0" = no rank logs */
    char addr[PROTO_NAME_MAX];           /* "" = local address of the daemon connection */
    char domain[PROTO_NAME_MAX];         /* placement label for hot spares (HELLO.domain); "" = none */
    char rank_user[64];                  /* "" = ranks run as the agent */
    char rank_group[64];                 /* "" = rank_user's primary group (and its other groups) */
    char log_level[8];
};

extern const struct conf_key agent_config_keys[];
extern const size_t agent_config_nkeys;

/* Table defaults; token_file is $CONFIGURATION_DIRECTORY/token under systemd. */
void agent_config_defaults(struct agent_file *f);

/* log_max_mb bounds: fractions of a MiB are for tests and small disks. */
#define AGENT_LOG_MAX_MB_MIN 0.001
#define AGENT_LOG_MAX_MB_MAX 1048576.0

/* Parses log_max_mb ("64", "0.5", "0") into bytes; 0 or -EINVAL. */
int agent_log_max_parse(const char *s, uint64_t *bytes);

/* Parses "LO-HI" (1024 <= LO <= HI <= 65535); 0 or -EINVAL. */
int agent_port_range_parse(const char *s, uint16_t *lo, uint16_t *hi);

/* $CONFIGURATION_DIRECTORY/worker.json, or /etc/muster/worker.json. */
void agent_config_default_path(char *out, size_t cap);

#endif
