/*
 * muster-worker: the node agent. Parses the command line and worker.json,
 * reads the token, and hands over to agent_run() (or to the one-machine
 * launcher, or to cloud-platform mode).
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/close_range.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "common/log.h"
#include "common/token.h"
#include "proto/proto.h"
#include "worker/agent/agent.h"
#include "worker/agent/agent_config.h"
#include "worker/agent/agent_join.h"
#include "worker/agent/cloud.h"
#include "worker/agent/devices.h"
#include "worker/agent/local.h"
#include "common/cmdline.h"
#include "worker/agent/rank_env.h"
#include "worker/agent/rank_user.h"

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: muster-worker [--config FILE] [OPTION]... [--] [COMMAND [ARG]...]\n"
            "   or: muster-worker --daemon HOST:PORT --devices SPEC [OPTION]...\n"
            "   or: muster-worker --local --job FILE --devices SPEC [OPTION]...\n"
            "   or: muster-worker --from-env --devices SPEC [--job FILE] [OPTION]...\n"
            "Join the muster daemon and run one training rank per device of this node.\n"
            "With no --daemon, --local or --from-env, read $CONFIGURATION_DIRECTORY/worker.json\n"
            "(or /etc/muster/worker.json): what systemd runs at boot.\n"
            "With --local, start a private daemon for this one machine, run the job,\n"
            "and exit with its status (0 completed, 1 failed or stopped).\n"
            "With --from-env, take the cluster from WORLD_SIZE (nodes), RANK (node rank),\n"
            "MASTER_ADDR and MASTER_PORT: join MASTER_ADDR:MASTER_PORT; node rank 0 also\n"
            "runs the daemon and exits with the job's status.\n"
            "\n"
            "  --config FILE        worker.json (keys in docs/config.md); options override it\n"
            "  --daemon HOST:PORT[,HOST:PORT...]\n"
            "                       daemon control address (name, IPv4, or [IPv6]:PORT); several:\n"
            "                       the musterd of one job, the agent joins whichever leads\n"
            "  --devices SPEC       cpu:N (N in 1..64), gpu:all, or gpu:I,J,... (GPU ordinals)\n"
            "  --node NAME          node name, [A-Za-z0-9._-]{1,63} (default: the host name;\n"
            "                       with --from-env: node<RANK>, zero-padded)\n"
            "  --token-file FILE    cluster token, mode 0600 (trailing newlines stripped); default\n"
            "                       $CONFIGURATION_DIRECTORY/token or /etc/muster/token\n"
            "  --rank-cmd CMD       command of each rank, split on whitespace, no shell\n"
            "                       (default: the job's rank_cmd, else muster-train next to this\n"
            "                       program); or give the command after the options:\n"
            "                       muster-worker --local --job J --devices cpu:2 -- python3 train.py\n"
            "  --state-dir DIR      rank directories: error files, logs (default $STATE_DIRECTORY,\n"
            "                       else /var/lib/muster-worker, else $TMPDIR/muster-worker-NODE)\n"
            "  --log-max-mb MB      each rank's output log, DIR/NODE/gen-G/rank-R/output.log,\n"
            "                       turns over to output.log.1 past MB MiB (default 64;\n"
            "                       fractions allowed; 0 = keep no rank logs)\n"
            "  --master-port-range LO-HI  ports this node may give rank 0 as MASTER_PORT\n"
            "                       (default 29500-29999; the first free one per generation)\n"
            "  --rank-user USER     run ranks, the warm spare and the pre-flight's import check as\n"
            "                       USER (name or uid; the agent must be root or hold CAP_SETUID\n"
            "                       and CAP_SETGID; default: the agent's own user)\n"
            "  --rank-group GROUP   their group (default: USER's primary group and its others)\n"
            "  --addr ADDR          address the ranks of this node are reached at\n"
            "                       (default: local address of the connection to the daemon)\n"
            "  --domain LABEL       placement label (a rack, an NVLink domain): a hot spare\n"
            "                       replaces a lost node of its own domain first, memory\n"
            "                       checkpoint copies go to a node of another domain\n"
            "  --local              one-machine launcher: private daemon, this node only\n"
            "  --from-env           cloud-platform mode (see above); $MUSTER_JOB, $MUSTER_TOKEN_FILE\n"
            "                       and $MUSTER_DEVICES stand in for --job, --token-file, --devices\n"
            "  --job FILE           the job spec (with --local, and with --from-env on node rank 0)\n"
            "  --http-port PORT     REST port of the private daemon (with --local or --from-env;\n"
            "                       default 29471 when free)\n"
            "  --log-level LEVEL    error, warn, info (default) or debug\n"
            "  --help               show this help and exit\n"
            "  --version            show the version and exit\n"
            "\n"
            "Exit status: 0 when shut down, 1 on a runtime failure (e.g. refused by the daemon,\n"
            "a bad worker.json), 2 on a usage error.\n");
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "muster-worker: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'muster-worker --help' for more information.\n");
    return 2;
}

/* The muster-train next to this executable. */
static int default_rank_cmd(char *out, size_t cap)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0)
        return -errno;
    self[n] = '\0';
    if ((size_t)snprintf(out, cap, "%s/muster-train", dirname(self)) >= cap)
        return -ENAMETOOLONG;
    return 0;
}

/* muster's Python client beside this executable: lib/muster/python of an
 * installation (bin/../lib/muster/python) or python/ of a build directory;
 * "" when neither holds the start-up hook. */
static void find_python_dir(char *out, size_t cap)
{
    char self[PATH_MAX];
    out[0] = '\0';
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0)
        return;
    self[n] = '\0';
    const char *dir = dirname(self);
    static const char *const tries[] = {"%s/../lib/muster/python", "%s/python"};
    for (size_t i = 0; i < sizeof(tries) / sizeof(tries[0]); i++) {
        char cand[PATH_MAX], hook[PATH_MAX + 32];
        if ((size_t)snprintf(cand, sizeof(cand), tries[i], dir) >= sizeof(cand) ||
            (size_t)snprintf(hook, sizeof(hook), "%s/startup/sitecustomize.py", cand) >= sizeof(hook))
            continue;
        if (access(hook, R_OK) == 0 && realpath(cand, out) != NULL)
            return;
    }
    out[0] = '\0';
}

/* prog names a file this user may execute: a path, or a name found on $PATH. */
static bool program_runnable(const char *prog, char *why, size_t cap)
{
    if (strchr(prog, '/')) {
        if (access(prog, X_OK) == 0)
            return true;
        snprintf(why, cap, "cannot run '%s': %s", prog, strerror(errno));
        return false;
    }
    const char *path = getenv("PATH");
    char dir[PATH_MAX];
    for (const char *p = path ? path : "/usr/local/bin:/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        if (snprintf(dir, sizeof(dir), "%.*s/%s", (int)n, n ? p : ".", prog) < (int)sizeof(dir) &&
            access(dir, X_OK) == 0)
            return true;
        p += n + (p[n] == ':');
    }
    snprintf(why, cap, "cannot run '%s': not found in PATH (%s)", prog, path ? path : "unset");
    return false;
}

/* The first of the candidates that is set and non-empty, else NULL. */
static const char *first_set(const char *a, const char *b, const char *c)
{
    if (a && a[0])
        return a;
    if (b && b[0])
        return b;
    return c && c[0] ? c : NULL;
}

int main(int argc, char **argv)
{
    enum { OPT_DAEMON = 256, OPT_NODE, OPT_DEVICES, OPT_TOKEN_FILE, OPT_RANK_CMD, OPT_ADDR, OPT_DOMAIN, OPT_LOG_LEVEL,
           OPT_HELP, OPT_VERSION, OPT_LOCAL, OPT_JOB, OPT_HTTP_PORT, OPT_CONFIG, OPT_FROM_ENV, OPT_STATE_DIR, OPT_PORT_RANGE,
           OPT_LOG_MAX, OPT_RANK_USER, OPT_RANK_GROUP };
    static const struct option opts[] = {
        {"config", required_argument, NULL, OPT_CONFIG},
        {"daemon", required_argument, NULL, OPT_DAEMON},
        {"node", required_argument, NULL, OPT_NODE},
        {"devices", required_argument, NULL, OPT_DEVICES},
        {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
        {"rank-cmd", required_argument, NULL, OPT_RANK_CMD},
        {"addr", required_argument, NULL, OPT_ADDR},
        {"domain", required_argument, NULL, OPT_DOMAIN},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"local", no_argument, NULL, OPT_LOCAL},
        {"from-env", no_argument, NULL, OPT_FROM_ENV},
        {"job", required_argument, NULL, OPT_JOB},
        {"http-port", required_argument, NULL, OPT_HTTP_PORT},
        {"state-dir", required_argument, NULL, OPT_STATE_DIR},
        {"master-port-range", required_argument, NULL, OPT_PORT_RANGE},
        {"log-max-mb", required_argument, NULL, OPT_LOG_MAX},
        {"rank-user", required_argument, NULL, OPT_RANK_USER},
        {"rank-group", required_argument, NULL, OPT_RANK_GROUP},
        {"help", no_argument, NULL, OPT_HELP},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    /* The agent's own trampoline into a rank's user (rank_user.h): before anything else. */
    if (argc > 1 && strcmp(argv[1], RANK_USER_EXEC_FLAG) == 0)
        return rank_user_exec(argc, argv);
    log_set_prog("muster-worker");
    /* Descriptors the agent was started with beyond stdio (a shell's, a
     * supervisor's) are nobody's business in a rank: none survives an exec.
     * The agent's own are opened close-on-exec already. */
    if (close_range(3, ~0U, CLOSE_RANGE_CLOEXEC) != 0)
        for (int fd = 3; fd < 1024; fd++)
            (void)fcntl(fd, F_SETFD, FD_CLOEXEC);

    static struct agent_config cfg;
    static struct agent_file file;
    /* Flags as given (NULL = not given); they override worker.json. */
    const char *config = NULL, *daemon = NULL, *node = NULL, *devices = NULL, *token_file = NULL;
    const char *rank_cmd = NULL, *addr = NULL, *domain = NULL, *level = NULL, *job = NULL, *state_dir = NULL,
               *port_range = NULL, *log_max = NULL, *rank_user = NULL, *rank_group = NULL;
    struct local_config local = {0};
    int is_local = 0, from_env = 0;
    char err[512];
    int c;
    opterr = 0;
    /* "+": options end at the first word that is not one, the rank command (as after --). */
    while ((c = getopt_long(argc, argv, "+", opts, NULL)) != -1) {
        switch (c) {
        case OPT_CONFIG: config = optarg; break;
        case OPT_DAEMON: daemon = optarg; break;
        case OPT_NODE:
            if (!proto_valid_name(optarg))
                return usage_error("--node: expected 1..63 characters of [A-Za-z0-9._-], got '%s'", optarg);
            node = optarg;
            break;
        case OPT_DEVICES: devices = optarg; break;
        case OPT_TOKEN_FILE: token_file = optarg; break;
        case OPT_RANK_CMD: rank_cmd = optarg; break;
        case OPT_ADDR:
            if (optarg[0] == '\0' || strlen(optarg) >= sizeof(cfg.addr))
                return usage_error("--addr: expected an address of 1..63 bytes, got '%s'", optarg);
            addr = optarg;
            break;
        case OPT_DOMAIN:
            if (!proto_valid_name(optarg))
                return usage_error("--domain: expected 1..63 characters of [A-Za-z0-9._-], got '%s'", optarg);
            domain = optarg;
            break;
        case OPT_LOG_LEVEL:
            if (conf_valid_log_level(optarg) != 0)
                return usage_error("--log-level: expected error, warn, info or debug, got '%s'", optarg);
            level = optarg;
            break;
        case OPT_LOCAL: is_local = 1; break;
        case OPT_FROM_ENV: from_env = 1; break;
        case OPT_JOB: job = optarg; break;
        case OPT_STATE_DIR:
            if (optarg[0] == '\0' || strlen(optarg) >= sizeof(cfg.state_dir))
                return usage_error("--state-dir: expected a directory, got '%s'", optarg);
            state_dir = optarg;
            break;
        case OPT_PORT_RANGE:
            if (agent_port_range_parse(optarg, &cfg.port_lo, &cfg.port_hi) != 0)
                return usage_error("--master-port-range: expected LO-HI with 1024 <= LO <= HI <= 65535, got '%s'",
                                   optarg);
            port_range = optarg;
            break;
        case OPT_LOG_MAX:
            if (agent_log_max_parse(optarg, &cfg.log_max_bytes) != 0)
                return usage_error("--log-max-mb: expected 0 (no rank logs) or a number of MiB in 0.001..1048576, "
                                   "got '%s'", optarg);
            log_max = optarg;
            break;
        case OPT_RANK_USER: rank_user = optarg; break;
        case OPT_RANK_GROUP: rank_group = optarg; break;
        case OPT_HTTP_PORT: {
            char *end;
            long p = strtol(optarg, &end, 10);
            if (*end || end == optarg || p < 1 || p > 65535)
                return usage_error("--http-port: expected a port in 1..65535, got '%s'", optarg);
            local.http_port = (uint16_t)p;
            break;
        }
        case OPT_HELP:
            usage(stdout);
            return 0;
        case OPT_VERSION:
            printf("muster-worker %s\n", MUSTER_VERSION);
            return 0;
        case ':':
            return usage_error("option '%s' needs a value", argv[optind - 1]);
        default:
            return usage_error("unknown option '%s'", argv[optind - 1]);
        }
    }
    static char cmd_packed[CMDLINE_MAX];
    if (optind < argc) {
        if (rank_cmd)
            return usage_error("%s", "give the rank command once: --rank-cmd CMD or the command after the options");
        if (cmdline_from_argv(argc - optind, argv + optind, cmd_packed, sizeof(cmd_packed)) != 0)
            return usage_error("the rank command after the options: expected 1..%d non-empty arguments", "256");
    } else if (rank_cmd) {
        json_t *v = json_string(rank_cmd);
        char why[200] = "got a string that is not UTF-8";
        if (!v || cmdline_from_json(v, cmd_packed, sizeof(cmd_packed), why, sizeof(why)) != 0) {
            json_decref(v);
            return usage_error("--rank-cmd: %s", why);
        }
        json_decref(v);
    }
    if (is_local && from_env)
        return usage_error("%s", "--local and --from-env are two different launchers: pick one");
    if ((is_local || from_env) && daemon)
        return usage_error("%s", is_local ? "--local starts its own daemon: drop --daemon"
                                          : "--from-env joins MASTER_ADDR:MASTER_PORT: drop --daemon");
    if (is_local && !job)
        return usage_error("%s", "--local needs --job FILE");
    if (is_local && token_file)
        return usage_error("%s", "--local makes its own token: drop --token-file");
    if (!is_local && !from_env && (job || local.http_port))
        return usage_error("%s", "--job and --http-port go with --local or --from-env");

    /* worker.json: named, or the default one when the command line does not say where to go. */
    agent_config_defaults(&file);
    static char default_config[PATH_MAX];
    if (!config && !daemon && !is_local && !from_env) {
        agent_config_default_path(default_config, sizeof(default_config));
        if (access(default_config, F_OK) == 0)
            config = default_config;
    }
    if (config && conf_load(config, agent_config_keys, agent_config_nkeys, &file, err, sizeof(err)) != 0) {
        log_error("%s", err);
        return 1;
    }
    log_set_level_name(level ? level : file.log_level);
    if (!is_local && !from_env)
        daemon = first_set(daemon, file.daemon, NULL);
    devices = first_set(devices, from_env ? getenv("MUSTER_DEVICES") : NULL, file.devices);
    token_file = first_set(token_file, from_env ? getenv("MUSTER_TOKEN_FILE") : NULL, file.token_file);
    rank_cmd = first_set(rank_cmd, file.rank_cmd, NULL);
    node = first_set(node, file.node, NULL);
    addr = first_set(addr, file.addr, NULL);
    domain = first_set(domain, file.domain, NULL);
    if (from_env)
        job = first_set(job, getenv("MUSTER_JOB"), NULL);
    local.job_path = job;

    if (!daemon && !is_local && !from_env)
        return usage_error("missing --daemon HOST:PORT (or --local --job FILE, --from-env, or \"daemon\" in %s)",
                           config ? config : "worker.json (--config FILE)");
    if (!devices)
        return usage_error("%s", "missing --devices (cpu:N, gpu:all or gpu:I,J,...)");
    struct cloud_env cloud;
    if (from_env) {
        if (cloud_env_read(&cloud, err, sizeof(err)) != 0)
            return usage_error("--from-env: %s", err);
        if (cloud.rank == 0 && !job)
            return usage_error("%s", "--from-env on node rank 0 runs the daemon and needs the job: --job FILE "
                                     "or MUSTER_JOB");
        if (!node)
            cloud_node_name(&cloud, cfg.node, sizeof(cfg.node));
    }
    if (daemon) {
        if (daemon_list_parse(daemon, &cfg.daemons, err, sizeof(err)) != 0)
            return usage_error("%s", err);
        snprintf(cfg.daemon, sizeof(cfg.daemon), "%s", cfg.daemons.addr[0]);
        hostport_parse(cfg.daemon, cfg.host, &cfg.port, err, sizeof(err));
    }
    if (node)
        snprintf(cfg.node, sizeof(cfg.node), "%s", node);
    if (addr)
        snprintf(cfg.addr, sizeof(cfg.addr), "%s", addr);
    if (domain)
        snprintf(cfg.domain, sizeof(cfg.domain), "%s", domain);
    if (devices_parse(devices, &cfg.devices, err, sizeof(err)) != 0)
        return usage_error("%s", err);
    if (cfg.devices.all_gpus) {
        int rc = devices_probe_gpus("/dev", &cfg.devices, err, sizeof(err));
        if (rc != 0) {
            log_error("%s", err);
            return 1;
        }
    }
    if (cfg.node[0] == '\0') {
        char host[256];
        if (gethostname(host, sizeof(host)) != 0 || !proto_valid_name(host))
            return usage_error("%s", "the host name is not a valid node name; give one with --node NAME");
        snprintf(cfg.node, sizeof(cfg.node), "%s", host);
    }

    /* The cluster token is required: the daemon refuses agents that cannot prove it. */
    static uint8_t token[TOKEN_MAX];
    if (is_local) {
        cfg.token_len = 1; /* local_run installs the private token */
    } else {
        int trc = token_read(token_file, token, sizeof(token), &cfg.token_len, err, sizeof(err));
        if (trc != 0) {
            log_error("%s", err);
            if (trc != -EPERM)
                log_error("copy the cluster token from the master (`musterctl token new FILE` makes one) "
                          "or pass --token-file");
            return 1;
        }
    }
    cfg.token = token;

    /* The agent's rank command: the command line's, else worker.json's, else muster-train next
     * to this program. At spawn a job's rank_cmd replaces it unless it came from the command line. */
    const char *packed = cmd_packed;
    cfg.rank_argv_pinned = cmdline_set(cmd_packed);
    if (!cfg.rank_argv_pinned && cmdline_set(file.rank_cmd))
        packed = file.rank_cmd;
    if (!cmdline_set(packed)) {
        char default_cmd[PATH_MAX + 16];
        int rc = default_rank_cmd(default_cmd, sizeof(default_cmd));
        if (rc != 0) {
            log_error("cannot find muster-train next to this program: %s; give --rank-cmd", strerror(-rc));
            return 1;
        }
        cmdline_from_argv(1, (char *const[]){default_cmd}, cmd_packed, sizeof(cmd_packed));
        packed = cmd_packed;
    }
    cfg.rank_argv = cmdline_argv(packed);
    find_python_dir(cfg.python_dir, sizeof(cfg.python_dir));
    if (!cfg.rank_argv) {
        log_error("out of memory");
        return 1;
    }
    if (!program_runnable(cfg.rank_argv[0], err, sizeof(err))) {
        log_error("rank command%s: %s", cfg.rank_argv_pinned ? "" : " (rank_cmd of worker.json)", err);
        cmdline_free(cfg.rank_argv);
        return cfg.rank_argv_pinned ? 2 : 1;
    }
    if (!port_range && agent_port_range_parse(file.master_port_range, &cfg.port_lo, &cfg.port_hi) != 0)
        return usage_error("master_port_range: expected LO-HI, got '%s'", file.master_port_range);
    if (!log_max && agent_log_max_parse(file.log_max_mb, &cfg.log_max_bytes) != 0)
        return usage_error("log_max_mb: expected a number of MiB, got '%s'", file.log_max_mb);
    state_dir = first_set(state_dir, file.state_dir, is_local ? NULL : getenv("STATE_DIRECTORY"));
    if (state_dir)
        snprintf(cfg.state_dir, sizeof(cfg.state_dir), "%s", state_dir);
    /* Who the job's processes run as; a bad one stops start-up naming the flag, or the file and its key. */
    int ru_rc = rank_user_resolve(first_set(rank_user, file.rank_user, NULL),
                                  first_set(rank_group, file.rank_group, NULL), &cfg.rank_user, err, sizeof(err));
    if (ru_rc != 0) {
        cmdline_free(cfg.rank_argv);
        if (rank_user || rank_group)
            return usage_error("%s (from --rank-user or --rank-group)", err);
        log_error("%s: %s", config ? config : "worker.json", err);
        return 1;
    }
    if (cfg.rank_user.set)
        log_info("ranks run as %s (uid %u, gid %u)", cfg.rank_user.name, (unsigned)cfg.rank_user.uid,
                 (unsigned)cfg.rank_user.gid);

    signal(SIGPIPE, SIG_IGN);
    int code;
    if (is_local)
        code = local_run(&local, &cfg);
    else if (from_env)
        code = cloud_run(&cloud, job, token_file, local.http_port, &cfg);
    else
        code = agent_run(&cfg);
    cmdline_free(cfg.rank_argv);
    return code;
}
