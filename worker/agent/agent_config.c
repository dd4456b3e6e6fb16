#include "worker/agent/agent_config.h"

#include <errno.h>
#include <grp.h>
#include <pwd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/token.h"
#include "worker/agent/devices.h"

static int valid_daemon(const char *s)
{
    static struct daemon_list l;
    char err[256];
    return daemon_list_parse(s, &l, err, sizeof(err));
}

static int valid_node(const char *s) { return proto_valid_name(s) ? 0 : -1; }

static int valid_devices(const char *s)
{
    struct device_set set;
    char err[256];
    return devices_parse(s, &set, err, sizeof(err));
}

int agent_port_range_parse(const char *s, uint16_t *lo, uint16_t *hi)
{
    unsigned a, b;
    int end = 0;
    if (sscanf(s, "%5u-%5u%n", &a, &b, &end) != 2 || s[end] != '\0' || a < 1024 || a > b || b > 65535)
        return -EINVAL;
    *lo = (uint16_t)a;
    *hi = (uint16_t)b;
    return 0;
}

static int valid_port_range(const char *s)
{
    uint16_t lo, hi;
    return agent_port_range_parse(s, &lo, &hi);
}

int agent_log_max_parse(const char *s, uint64_t *bytes)
{
    /* Digits with at most one '.': no signs, exponents, hex, inf or nan for strtod to take. */
    size_t digits = strspn(s, "0123456789");
    if (s[digits] == '.')
        digits += 1 + strspn(s + digits + 1, "0123456789");
    if (digits == 0 || s[digits] != '\0' || strcmp(s, ".") == 0)
        return -EINVAL;
    double mb = strtod(s, NULL);
    if (mb != 0 && (mb < AGENT_LOG_MAX_MB_MIN || mb > AGENT_LOG_MAX_MB_MAX))
        return -EINVAL;
    *bytes = (uint64_t)(mb * 1048576.0 + 0.5);
    return 0;
}

static int valid_log_max(const char *s)
{
    uint64_t bytes;
    return agent_log_max_parse(s, &bytes);
}

/* A user or group of this machine, by name or number: checked again, with its rights, at start-up. */
static int valid_user(const char *s)
{
    char *end;
    unsigned long id = strtoul(s, &end, 10);
    return getpwnam(s) || (s[0] >= '0' && s[0] <= '9' && !*end && getpwuid((uid_t)id)) ? 0 : -1;
}

static int valid_group(const char *s)
{
    char *end;
    unsigned long id = strtoul(s, &end, 10);
    return getgrnam(s) || (s[0] >= '0' && s[0] <= '9' && !*end && getgrgid((gid_t)id)) ? 0 : -1;
}

#define F(field) offsetof(struct agent_file, field), sizeof(((struct agent_file *)0)->field)

/* The one table of worker.json keys. Keep docs/config.md in step. */
const struct conf_key agent_config_keys[] = {
    {"daemon", CONF_STRING, F(daemon), valid_daemon, "HOST:PORT[,HOST:PORT...] (each a name, IPv4 or [IPv6], port 1..65535)", "",
     "musterd's control address; required (no default)"},
    {"node", CONF_STRING, F(node), valid_node, "1..63 characters of [A-Za-z0-9._-]", "",
     "node name; unset = the host name"},
    {"devices", CONF_STRING, F(devices), valid_devices, "cpu:N (N in 1..64), gpu:all or gpu:I,J,...", "",
     "devices this node offers, one rank each; required (no default)"},
    {"token_file", CONF_PATH, F(token_file), NULL, "a file", "/etc/muster/token",
     "cluster token, mode 0600 ($CONFIGURATION_DIRECTORY/token under systemd)"},
    {"rank_cmd", CONF_CMD, F(rank_cmd), NULL, "a command string or an array of strings", "",
     "command of each rank: a string split on whitespace (no shell) or an array of arguments; unset = the job's "
     "rank_cmd, else muster-train next to the agent"},
    {"state_dir", CONF_PATH, F(state_dir), NULL, "a directory", "",
     "where rank directories (error files, logs) live; unset = $STATE_DIRECTORY, else /var/lib/muster-worker, "
     "else $TMPDIR/muster-worker-NODE"},
    {"master_port_range", CONF_STRING, F(master_port_range), valid_port_range, "LO-HI with 1024 <= LO <= HI <= 65535",
     "29500-29999", "ports this node may give rank 0 as MASTER_PORT (the first free one is chosen per generation)"},
    {"log_max_mb", CONF_STRING, F(log_max_mb), valid_log_max,
     "MiB: 0 (no rank logs), or 0.001..1048576 (fractions allowed)", "64",
     "each rank's output log per generation turns over to output.log.1 past this size (2 files kept)"},
    {"addr", CONF_STRING, F(addr), NULL, "an address of 1..63 bytes", "",
     "address the ranks of this node are reached at; unset = local address of the daemon connection"},
    {"domain", CONF_STRING, F(domain), valid_node, "1..63 characters of [A-Za-z0-9._-]", "",
     "placement label of this node (a rack, an NVLink domain): a hot spare replaces a lost node of its own "
     "domain first (job key spare_nodes), memory checkpoint copies go to a buddy of another domain; unset = none"},
    {"rank_user", CONF_STRING, F(rank_user), valid_user, "a user of this machine (name or uid), not root", "",
     "user every process the agent starts for a job runs as (ranks, warm spare, pre-flight import check); "
     "unset = the agent's own user. The agent must be root or hold CAP_SETUID and CAP_SETGID"},
    {"rank_group", CONF_STRING, F(rank_group), valid_group, "a group of this machine (name or gid)", "",
     "group of those processes, their only group; unset = rank_user's primary group and its other groups"},
    {"log_level", CONF_STRING, F(log_level), conf_valid_log_level, "error, warn, info or debug", "info",
     "least severe level logged"},
};

const size_t agent_config_nkeys = sizeof(agent_config_keys) / sizeof(agent_config_keys[0]);

void agent_config_defaults(struct agent_file *f)
{
    conf_defaults(agent_config_keys, agent_config_nkeys, f);
    token_default_path(f->token_file, sizeof(f->token_file));
}

void agent_config_default_path(char *out, size_t cap)
{
    const char *conf = getenv("CONFIGURATION_DIRECTORY");
    snprintf(out, cap, "%s/worker.json", conf && conf[0] ? conf : "/etc/muster");
}
