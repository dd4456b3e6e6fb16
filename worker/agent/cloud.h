/*
 * cloud: `muster-worker --from-env`, for platforms that start the same
 * command on every node (Kubernetes indexed jobs, managed training
 * platforms) and describe the cluster in the environment:
 *
 *   WORLD_SIZE   number of nodes (1..4096)
 *   RANK         this node's rank, 0..WORLD_SIZE-1
 *   MASTER_ADDR  host of node rank 0 (name or IPv4)
 *   MASTER_PORT  port of musterd's control port there
 *
 * Every node joins MASTER_ADDR:MASTER_PORT; node rank 0 first starts the
 * daemon for the job (listening on 0.0.0.0:MASTER_PORT, "nodes" =
 * WORLD_SIZE, the shared cluster token) and exits with the job's status.
 * The other nodes exit 0 when the daemon ends the job.
 */
#ifndef MUSTER_WORKER_CLOUD_H
#define MUSTER_WORKER_CLOUD_H

#include <stddef.h>
#include <stdint.h>

#include "worker/agent/agent.h"

struct cloud_env {
    int world;                       /* WORLD_SIZE */
    int rank;                        /* RANK */
    char master[HOSTPORT_HOST_MAX];  /* MASTER_ADDR */
    uint16_t port;                   /* MASTER_PORT */
};

/* Reads the four variables. Returns 0, or -EINVAL with "VAR: expected ..., got ..." in err. */
int cloud_env_read(struct cloud_env *e, char *err, size_t errlen);

/* The default node name: "node" + rank, zero-padded so that names sort as ranks do. */
void cloud_node_name(const struct cloud_env *e, char *out, size_t cap);

/*
 * cfg: the agent configuration with everything but the daemon address,
 * which is set here. job_path: the job spec (needed on node rank 0 only);
 * token_file: the cluster token the daemon of node rank 0 reads. Returns
 * the process exit status.
 */
int cloud_run(const struct cloud_env *e, const char *job_path, const char *token_file, uint16_t http_port,
              struct agent_config *cfg);

#endif
