/*
 * muster-worker: the node agent. Parses the command line, reads the token,
 * and hands over to agent_run().
 */
#include <errno.h>
#include <getopt.h>
#include <libgen.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/log.h"
#include "proto/proto.h"
#include "worker/agent.h"
#include "worker/agent_join.h"
#include "worker/devices.h"
#include "worker/local.h"
#include "worker/rank_env.h"

#define TOKEN_MAX 4096

static void usage(FILE *out)
{
    fprintf(out,
            "Usage: muster-worker --daemon HOST:PORT --devices SPEC [OPTION]...\n"
            "   or: muster-worker --local --job FILE --devices SPEC [OPTION]...\n"
            "Join the muster daemon and run one training rank per device of this node.\n"
            "With --local, start a private daemon for this one machine, run the job,\n"
            "and exit with its status (0 completed, 1 failed or stopped).\n"
            "\n"
            "  --daemon HOST:PORT   daemon control address (name, IPv4, or [IPv6]); port 29470 by default\n"
            "  --devices SPEC       cpu:N (N in 1..64), gpu:all, or gpu:I,J,... (GPU ordinals)\n"
            "  --node NAME          node name, [A-Za-z0-9._-]{1,63} (default: the host name)\n"
            "  --token-file FILE    cluster token (one trailing newline is stripped); default\n"
            "                       $CONFIGURATION_DIRECTORY/token or /etc/muster/token\n"
            "  --rank-cmd CMD       command of each rank, split on whitespace, no shell\n"
            "                       (default: muster-train next to this program)\n"
            "  --addr ADDR          address the ranks of this node are reached at\n"
            "                       (default: local address of the connection to the daemon)\n"
            "  --local              one-machine launcher: private daemon, this node only\n"
            "  --job FILE           the job spec (with --local)\n"
            "  --http-port PORT     REST port of the private daemon (with --local; default\n"
            "                       29471 when free)\n"
            "  --log-level LEVEL    error, warn, info (default) or debug\n"
            "  --help               show this help and exit\n"
            "  --version            show the version and exit\n"
            "\n"
            "Exit status: 0 when shut down, 1 on a runtime failure (e.g. refused by the daemon), 2 on a usage error.\n");
}

static int usage_error(const char *fmt, const char *arg)
{
    fprintf(stderr, "muster-worker: ");
    fprintf(stderr, fmt, arg);
    fprintf(stderr, "\nTry 'muster-worker --help' for more information.\n");
    return 2;
}

/* Reads the token file; strips one trailing newline. Returns 0 or -errno. */
static int read_token(const char *path, uint8_t *buf, size_t cap, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return -errno;
    size_t n = fread(buf, 1, cap, f);
    int err = ferror(f) ? -EIO : 0;
    if (!err && n == cap && fgetc(f) != EOF)
        err = -EFBIG;
    fclose(f);
    if (err)
        return err;
    if (n > 0 && buf[n - 1] == '\n')
        n--;
    *len = n;
    return 0;
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

int main(int argc, char **argv)
{
    enum { OPT_DAEMON = 256, OPT_NODE, OPT_DEVICES, OPT_TOKEN_FILE, OPT_RANK_CMD, OPT_ADDR, OPT_LOG_LEVEL,
           OPT_HELP, OPT_VERSION, OPT_LOCAL, OPT_JOB, OPT_HTTP_PORT };
    static const struct option opts[] = {
        {"daemon", required_argument, NULL, OPT_DAEMON},
        {"node", required_argument, NULL, OPT_NODE},
        {"devices", required_argument, NULL, OPT_DEVICES},
        {"token-file", required_argument, NULL, OPT_TOKEN_FILE},
        {"rank-cmd", required_argument, NULL, OPT_RANK_CMD},
        {"addr", required_argument, NULL, OPT_ADDR},
        {"log-level", required_argument, NULL, OPT_LOG_LEVEL},
        {"local", no_argument, NULL, OPT_LOCAL},
        {"job", required_argument, NULL, OPT_JOB},
        {"http-port", required_argument, NULL, OPT_HTTP_PORT},
        {"help", no_argument, NULL, OPT_HELP},
        {"version", no_argument, NULL, OPT_VERSION},
        {NULL, 0, NULL, 0},
    };
    log_set_prog("muster-worker");

    static struct agent_config cfg;
    const char *daemon = NULL, *devices = NULL, *token_file = NULL, *rank_cmd = NULL;
    struct local_config local = {0};
    int is_local = 0;
    char err[512];
    int c;
    opterr = 0;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (c) {
        case OPT_DAEMON:
            daemon = optarg;
            break;
        case OPT_NODE:
            if (!proto_valid_name(optarg))
                return usage_error("--node: expected 1..63 characters of [A-Za-z0-9._-], got '%s'", optarg);
            snprintf(cfg.node, sizeof(cfg.node), "%s", optarg);
            break;
        case OPT_DEVICES:
            devices = optarg;
            break;
        case OPT_TOKEN_FILE:
            token_file = optarg;
            break;
        case OPT_RANK_CMD:
            rank_cmd = optarg;
            break;
        case OPT_ADDR:
            if (optarg[0] == '\0' || strlen(optarg) >= sizeof(cfg.addr))
                return usage_error("--addr: expected an address of 1..63 bytes, got '%s'", optarg);
            snprintf(cfg.addr, sizeof(cfg.addr), "%s", optarg);
            break;
        case OPT_LOG_LEVEL:
            if (log_set_level_name(optarg) != 0)
                return usage_error("--log-level: expected error, warn, info or debug, got '%s'", optarg);
            break;
        case OPT_LOCAL:
            is_local = 1;
            break;
        case OPT_JOB:
            local.job_path = optarg;
            break;
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
    if (optind < argc)
        return usage_error("unexpected argument '%s'", argv[optind]);
    if (is_local && daemon)
        return usage_error("%s", "--local starts its own daemon: drop --daemon");
    if (is_local && !local.job_path)
        return usage_error("%s", "--local needs --job FILE");
    if (is_local && token_file)
        return usage_error("%s", "--local makes its own token: drop --token-file");
    if (!is_local && (local.job_path || local.http_port))
        return usage_error("%s", "--job and --http-port go with --local");
    if (!daemon && !is_local)
        return usage_error("%s", "missing --daemon HOST:PORT (or --local --job FILE)");
    if (!devices)
        return usage_error("%s", "missing --devices (cpu:N, gpu:all or gpu:I,J,...)");
    if (daemon) {
        if (hostport_parse(daemon, cfg.host, &cfg.port, err, sizeof(err)) != 0)
            return usage_error("%s", err);
        snprintf(cfg.daemon, sizeof(cfg.daemon), "%s", daemon);
    }
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
    static char default_token[PATH_MAX];
    if (!token_file && !is_local) {
        const char *conf = getenv("CONFIGURATION_DIRECTORY");
        snprintf(default_token, sizeof(default_token), "%s/token", conf ? conf : "/etc/muster");
        token_file = default_token;
    }
    int trc = is_local ? 0 : read_token(token_file, token, sizeof(token), &cfg.token_len);
    if (is_local)
        cfg.token_len = 1; /* local_run installs the private token */
    if (trc == 0 && cfg.token_len == 0)
        trc = -ENODATA;
    if (trc != 0) {
        log_error("token file %s: %s; copy the cluster token from the master (`musterctl token new FILE` "
                  "makes one) or pass --token-file",
                  token_file, trc == -EFBIG ? "longer than 4096 bytes" : trc == -ENODATA ? "empty" : strerror(-trc));
        return 1;
    }
    cfg.token = token;

    char default_cmd[PATH_MAX + 16];
    if (!rank_cmd) {
        int rc = default_rank_cmd(default_cmd, sizeof(default_cmd));
        if (rc != 0) {
            log_error("cannot find muster-train next to this program: %s; give --rank-cmd", strerror(-rc));
            return 1;
        }
        rank_cmd = default_cmd;
    }
    cfg.rank_argv = rank_argv_split(rank_cmd);
    if (!cfg.rank_argv)
        return usage_error("%s", "--rank-cmd: expected a command, got nothing");

    signal(SIGPIPE, SIG_IGN);
    int code = is_local ? local_run(&local, &cfg) : agent_run(&cfg);
    rank_strv_free(cfg.rank_argv);
    return code;
}
