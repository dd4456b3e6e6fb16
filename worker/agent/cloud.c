#include "worker/agent/cloud.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "worker/agent/launch.h"

/* An integer environment variable in [min, max]. */
static int env_int(const char *name, long min, long max, long *out, char *err, size_t errlen)
{
    const char *v = getenv(name);
    char *end;
    if (!v || !v[0]) {
        snprintf(err, errlen, "%s: expected an integer in %ld..%ld, got nothing (is this a platform that sets it?)",
                 name, min, max);
        return -EINVAL;
    }
    errno = 0;
    long n = strtol(v, &end, 10);
    if (errno || *end || n < min || n > max) {
        snprintf(err, errlen, "%s: expected an integer in %ld..%ld, got '%.64s'", name, min, max, v);
        return -EINVAL;
    }
    *out = n;
    return 0;
}

int cloud_env_read(struct cloud_env *e, char *err, size_t errlen)
{
    long world, rank, port;
    const char *master = getenv("MASTER_ADDR");
    memset(e, 0, sizeof(*e));
    if (env_int("WORLD_SIZE", 1, 4096, &world, err, errlen) || env_int("RANK", 0, 4095, &rank, err, errlen) ||
        env_int("MASTER_PORT", 1, 65535, &port, err, errlen))
        return -EINVAL;
    if (rank >= world) {
        snprintf(err, errlen, "RANK: expected 0..%ld (WORLD_SIZE is %ld), got %ld", world - 1, world, rank);
        return -EINVAL;
    }
    if (!master || !master[0] || strlen(master) >= sizeof(e->master) || strpbrk(master, ":[] \t")) {
        snprintf(err, errlen, "MASTER_ADDR: expected a host name or IPv4 address, got '%.64s'",
                 master ? master : "");
        return -EINVAL;
    }
    e->world = (int)world;
    e->rank = (int)rank;
    e->port = (uint16_t)port;
    snprintf(e->master, sizeof(e->master), "%s", master);
    return 0;
}

void cloud_node_name(const struct cloud_env *e, char *out, size_t cap)
{
    int width = snprintf(NULL, 0, "%d", e->world - 1);
    snprintf(out, cap, "node%0*d", width, e->rank);
}

int cloud_run(const struct cloud_env *e, const char *job_path, const char *token_file, uint16_t http_port,
              struct agent_config *cfg)
{
    snprintf(cfg->daemon, sizeof(cfg->daemon), "%s:%u", e->master, e->port);
    snprintf(cfg->host, sizeof(cfg->host), "%s", e->master);
    cfg->port = e->port;
    if (e->rank != 0) {
        log_info("node rank %d of %d: joining musterd at %s as %s", e->rank, e->world, cfg->daemon, cfg->node);
        return agent_run(cfg);
    }
    /* Node rank 0 runs the daemon; every node (this one too) joins it at MASTER_ADDR, so that
     * the address this node reports for its ranks is the one the others reach. */
    struct launch_config lc = {
        .job_path = job_path, .nodes = e->world, .listen = "0.0.0.0", .ctl_port = e->port,
        .http_port = http_port, .token_file = token_file,
    };
    static struct launch l;
    if (launch_start(&lc, &l, 10000) != 0)
        return 1;
    log_info("node rank 0 of %d: job %s, musterd pid %d on port %u, REST http://127.0.0.1:%u; joining it as %s",
             e->world, l.job_name, (int)l.pid, l.ctl_port, l.http_port, cfg->node);
    return launch_finish(&l, agent_run(cfg));
}
