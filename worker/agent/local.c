#include "worker/agent/local.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"
#include "worker/agent/launch.h"

int local_run(const struct local_config *lc, struct agent_config *cfg)
{
    /* One machine is one node, whatever the spec says about the cluster. */
    struct launch_config launch_cfg = {
        .job_path = lc->job_path, .nodes = 1, .listen = "127.0.0.1", .http_port = lc->http_port,
    };
    static struct launch l;
    if (launch_start(&launch_cfg, &l, 10000) != 0)
        return 1;
    log_info("local job %s: %d rank(s), private musterd pid %d, REST http://127.0.0.1:%u "
             "(musterctl --server http://127.0.0.1:%u status)",
             l.job_name, (int)cfg->devices.n, (int)l.pid, l.http_port, l.http_port);
    snprintf(cfg->daemon, sizeof(cfg->daemon), "127.0.0.1:%u", l.ctl_port);
    snprintf(cfg->host, sizeof(cfg->host), "127.0.0.1");
    cfg->port = l.ctl_port;
    cfg->token = (const uint8_t *)l.token_hex;
    cfg->token_len = strlen(l.token_hex);
    /* Rank directories go with the private daemon's: kept when the job did not complete. */
    if (!cfg->state_dir[0]) {
        snprintf(cfg->state_dir, sizeof(cfg->state_dir), "%s/worker", l.dir);
        /* A rank_user must pass through the private directory to its own; it lists nothing there,
         * and the private token in it stays 0600. */
        if (cfg->rank_user.set && chmod(l.dir, 0711) != 0)
            log_warn("%s: cannot let rank_user pass: %s", l.dir, strerror(errno));
    }
    return launch_finish(&l, agent_run(cfg));
}
