/*
 * ctl_doctor: `musterctl doctor [--job JOB]`, the node checks run on the
 * spot (docs/plan.md, docs/troubleshooting.md): musterd reachable, the
 * cluster token file's mode, whether the control and REST ports are free
 * or held by musterd, this node's devices and clock, and with a job its
 * data file, checkpoint directory and whether its plan fits this node. One
 * table row per check, with what to do for each failure.
 */
#include "ctl/ctl_doctor.h"

#include <curl/curl.h>
#include <dirent.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "common/jobspec.h"
#include "common/plan.h"
#include "common/plan_prog.h"
#include "common/preflight.h"
#include "common/token.h"

#define CONTROL_PORT 29470
#define CONNECT_TIMEOUT_MS 2000

struct doctor {
    int failed;
    int json;
    json_t *rows;
};

static void check(struct doctor *d, const char *name, int ok, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

/* ok: 1 pass, 0 fail, -1 a warning that fails nothing. */
static void check(struct doctor *d, const char *name, int ok, const char *fmt, ...)
{
    char text[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof(text), fmt, ap);
    va_end(ap);
    if (ok == 0)
        d->failed++;
    json_array_append_new(d->rows, json_pack("{s:s, s:s, s:s}", "check", name, "result",
                                             ok > 0 ? "ok" : ok == 0 ? "FAIL" : "warn", "detail", text));
}

/* Who listens on TCP port: the program's name from /proc, or "" when unknown. */
static void port_holder(int port, char *out, size_t len)
{
    out[0] = '\0';
    FILE *f = fopen("/proc/net/tcp", "r");
    if (!f)
        return;
    char line[512];
    unsigned long inode = 0;
    while (!inode && fgets(line, sizeof(line), f)) {
        unsigned lport, st;
        unsigned long ino;
        if (sscanf(line, " %*d: %*x:%x %*x:%*x %x %*s %*s %*s %*s %*s %lu", &lport, &st, &ino) == 3 &&
            (int)lport == port && st == 0x0A)
            inode = ino;
    }
    fclose(f);
    if (!inode)
        return;
    char want[64];
    snprintf(want, sizeof(want), "socket:[%lu]", inode);
    DIR *proc = opendir("/proc");
    struct dirent *p;
    int seen = 0;
    while (proc && !out[0] && (p = readdir(proc)) != NULL && seen++ < 100000) {
        if (p->d_name[0] < '0' || p->d_name[0] > '9')
            continue;
        char dir[300];
        snprintf(dir, sizeof(dir), "/proc/%s/fd", p->d_name);
        DIR *fds = opendir(dir);
        struct dirent *fd;
        while (fds && !out[0] && (fd = readdir(fds)) != NULL) {
            char link[600], target[128];
            snprintf(link, sizeof(link), "%s/%s", dir, fd->d_name);
            ssize_t n = readlink(link, target, sizeof(target) - 1);
            if (n <= 0)
                continue;
            target[n] = '\0';
            if (strcmp(target, want) != 0)
                continue;
            char comm[300];
            snprintf(comm, sizeof(comm), "/proc/%s/comm", p->d_name);
            FILE *c = fopen(comm, "r");
            if (c && fgets(out, (int)len, c))
                out[strcspn(out, "\n")] = '\0';
            if (c)
                fclose(c);
            size_t k = strlen(out);
            snprintf(out + k, len - k, " (pid %s)", p->d_name);
        }
        if (fds)
            closedir(fds);
    }
    if (proc)
        closedir(proc);
}

/* musterd's address as --server names it: host, REST port, and whether the
 * host is this node (one of its addresses can be bound). */
struct server_addr {
    char host[256];
    int rest_port;
    int local;
    struct sockaddr_storage sa; /* the host's first address */
    socklen_t salen;
};

static int bind_test(const struct server_addr *s, int port)
{
    struct sockaddr_storage sa = s->sa;
    if (sa.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)port);
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int rc = fd >= 0 ? bind(fd, (struct sockaddr *)&sa, s->salen) : -1;
    int e = errno;
    if (fd >= 0)
        close(fd);
    return rc == 0 ? 0 : -e;
}

/* Host and port of the URL (libcurl's parser), resolved. 0 or -EINVAL with why. */
static int server_parse(const char *url, struct server_addr *s, char *why, size_t len)
{
    memset(s, 0, sizeof(*s));
    CURLU *u = curl_url();
    char *host = NULL, *port = NULL, *zone = NULL;
    int rc = -EINVAL;
    CURLUcode uc = CURLUE_OUT_OF_MEMORY;
    if (strncmp(url, "http://", 7) != 0 && strncmp(url, "https://", 8) != 0) {
        snprintf(why, len, "--server '%s' is not an http:// or https:// URL", url);
        goto out;
    }
    if (!u || (uc = curl_url_set(u, CURLUPART_URL, url, 0)) != CURLUE_OK ||
        (uc = curl_url_get(u, CURLUPART_HOST, &host, 0)) != CURLUE_OK ||
        (uc = curl_url_get(u, CURLUPART_PORT, &port, CURLU_DEFAULT_PORT)) != CURLUE_OK) {
        snprintf(why, len, "--server '%s': %s", url, curl_url_strerror(uc));
        goto out;
    }
    s->rest_port = atoi(port);
    if (s->rest_port < 1 || s->rest_port > 65535) {
        snprintf(why, len, "--server '%s': port %s: expected 1 to 65535", url, port);
        goto out;
    }
    /* an IPv6 literal comes bracketed, its zone (fe80::1%25eth0) apart */
    size_t hl = strlen(host);
    if (host[0] == '[' && hl > 2 && host[hl - 1] == ']')
        hl -= 2;
    curl_url_get(u, CURLUPART_ZONEID, &zone, 0);
    if ((size_t)snprintf(s->host, sizeof(s->host), "%.*s%s%s", (int)hl, host + (host[0] == '['),
                         zone ? "%" : "", zone ? zone : "") >= sizeof(s->host)) {
        snprintf(why, len, "--server: host '%.64s...': expected at most %zu bytes", host, sizeof(s->host) - 1);
        goto out;
    }
    struct addrinfo hints = {.ai_socktype = SOCK_STREAM}, *ai = NULL;
    int g = getaddrinfo(s->host, NULL, &hints, &ai);
    if (g || !ai || ai->ai_addrlen > sizeof(s->sa)) {
        snprintf(why, len, "--server '%s': cannot resolve %s: %s", url, s->host, g ? gai_strerror(g) : "no address");
        if (ai)
            freeaddrinfo(ai);
        goto out;
    }
    memcpy(&s->sa, ai->ai_addr, ai->ai_addrlen);
    s->salen = ai->ai_addrlen;
    freeaddrinfo(ai);
    s->local = bind_test(s, 0) != -EADDRNOTAVAIL;
    rc = 0;
out:
    curl_free(host);
    curl_free(port);
    curl_free(zone);
    curl_url_cleanup(u);
    return rc;
}

/* A node that is not musterd's: can an agent here reach the control port? */
static void check_reach(struct doctor *d, const struct server_addr *s, int port)
{
    struct sockaddr_storage sa = s->sa;
    if (sa.ss_family == AF_INET6)
        ((struct sockaddr_in6 *)&sa)->sin6_port = htons((uint16_t)port);
    else
        ((struct sockaddr_in *)&sa)->sin_port = htons((uint16_t)port);
    int fd = socket(sa.ss_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int rc = fd >= 0 ? connect(fd, (struct sockaddr *)&sa, s->salen) : -1, e = errno;
    if (rc && e == EINPROGRESS) {
        struct pollfd pfd = {.fd = fd, .events = POLLOUT};
        socklen_t el = sizeof(e);
        if (poll(&pfd, 1, CONNECT_TIMEOUT_MS) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0)
            rc = e ? -1 : 0;
        else
            e = ETIMEDOUT;
    }
    if (fd >= 0)
        close(fd);
    if (rc == 0)
        check(d, "control port", 1, "%s:%d accepts connections (agents on this node join there)", s->host, port);
    else
        check(d, "control port", 0, "%s:%d: %s: agents on this node cannot join; check musterd's listen address, "
              "the firewall, or pass --control-port", s->host, port, strerror(e));
}

static void check_port(struct doctor *d, const struct server_addr *s, const char *name, int port)
{
    int e = -bind_test(s, port);
    if (e == 0) {
        check(d, name, 1, "%s:%d is free (musterd can listen on it; agents need nothing here)", s->host, port);
        return;
    }
    char who[128];
    port_holder(port, who, sizeof(who));
    if (strncmp(who, "musterd", 7) == 0)
        check(d, name, 1, "%s:%d is held by %s", s->host, port, who);
    else if (e == EADDRINUSE)
        check(d, name, -1, "%s:%d is in use by %s: on the master node stop it or give musterd another port "
              "(musterd.json)", s->host, port, who[0] ? who : "another program (run as root to see which)");
    else
        check(d, name, -1, "%s:%d: cannot test: %s", s->host, port, strerror(e));
}

static void check_token(struct doctor *d, const char *path)
{
    uint8_t buf[TOKEN_MAX];
    size_t n;
    char err[512];
    int rc = token_read(path, buf, sizeof(buf), &n, err, sizeof(err));
    if (rc == 0)
        check(d, "token file", 1, "%s: mode 0600 or stricter, %zu bytes", path, n);
    else if (rc == -ENOENT)
        check(d, "token file", 0, "%s: missing: copy the cluster token here (mode 0600), or pass --token-file", path);
    else
        check(d, "token file", 0, "%s", err);
}

static int64_t wall_ms(void)
{
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (int64_t)tv.tv_sec * 1000 + tv.tv_usec / 1000;
}

static void check_daemon(struct doctor *d, const char *server, ctl_get_fn get, void *ctx)
{
    int64_t t0 = wall_ms();
    json_t *doc = get(ctx, server, "/v1/plan");
    int64_t t1 = wall_ms();
    if (!doc) {
        check(d, "musterd", 0, "%s does not answer: start musterd on the master node (systemctl start musterd) or "
              "pass --server URL / set MUSTER_SERVER", server);
        return;
    }
    check(d, "musterd", 1, "%s answers (job %s, %s)", server,
          json_string_value(json_object_get(doc, "job")) ? json_string_value(json_object_get(doc, "job")) : "?",
          json_string_value(json_object_get(doc, "state")) ? json_string_value(json_object_get(doc, "state")) : "?");
    json_t *t = json_object_get(doc, "time_ms");
    if (json_is_integer(t)) {
        char why[PREFLIGHT_WHY_MAX];
        int64_t skew = (t0 + t1) / 2 - (int64_t)json_integer_value(t);
        if (preflight_clock(skew, (t1 - t0) / 2 + 1, why, sizeof(why)) == 0)
            check(d, "clock", 1, "within %.1f s of musterd's", (double)(skew < 0 ? -skew : skew) / 1000.0);
        else
            check(d, "clock", 0, "%s", why);
    }
    json_decref(doc);
}

static void check_devices(struct doctor *d, uint64_t *gpu_mem, uint64_t *host_mem)
{
    struct gpu_fact g[PREFLIGHT_MAX_GPUS];
    char why[PREFLIGHT_WHY_MAX];
    uint64_t avail = 0;
    *gpu_mem = 0;
    if (preflight_host_memory(host_mem, &avail) == 0)
        check(d, "host memory", 1, "%.2f GiB, %.2f GiB available", (double)*host_mem / (1 << 30),
              (double)avail / (1 << 30));
    else
        check(d, "host memory", -1, "cannot read /proc/meminfo");
    int n = preflight_gpus(g, PREFLIGHT_MAX_GPUS, why, sizeof(why));
    if (n < 0) {
        check(d, "gpus", -1, "%s (fine for cpu:N workers)", why);
        return;
    }
    if (n == 0) {
        check(d, "gpus", -1, "NVML sees no GPU (fine for cpu:N workers)");
        return;
    }
    uint64_t least = g[0].total;
    for (int i = 1; i < n; i++)
        if (g[i].total < least)
            least = g[i].total;
    *gpu_mem = least;
    check(d, "gpus", 1, "%d x %s, %.2f GiB each (gpu 0: %.2f GiB free)", n, g[0].name, (double)least / (1 << 30),
          (double)g[0].free / (1 << 30));
}

/* checkpoint_dir writable, with room for need bytes (0: what the program writes is unknown). */
static void check_ckpt_dir(struct doctor *d, const char *dir, uint64_t need)
{
    char why[PREFLIGHT_WHY_MAX];
    uint64_t fr;
    if (!dir[0])
        return;
    if (preflight_ckpt_dir(dir, need, &fr, why, sizeof(why)) != 0)
        check(d, "checkpoint_dir", 0, "%s", why);
    else if (need)
        check(d, "checkpoint_dir", 1, "%s: writable, %.2f GiB free, 2 checkpoints need %.1f MiB", dir,
              (double)fr / (1 << 30), (double)need / (1 << 20));
    else
        check(d, "checkpoint_dir", 1, "%s: writable, %.2f GiB free", dir, (double)fr / (1 << 30));
}

/* A rank_cmd program the spec describes (parallelism ddp, zero1..3, fsdp): its
 * plan (common/plan_prog.h) against this node's GPUs, and its checkpoint_dir
 * writable; muster-train's plan and data checks are not its. */
static void check_program(struct doctor *d, const char *path, const struct job_spec *spec, int devices,
                          uint64_t gpu_mem)
{
    struct plan_prog_input in;
    struct plan_prog p;
    char err[1024];
    if (plan_prog_input_from_spec(&in, spec, spec->nodes, devices, err, sizeof(err)) ||
        (in.gpu_mem = gpu_mem, plan_prog_compute(&in, &p, err, sizeof(err)))) {
        check(d, "plan", 0, "%s", err);
    } else {
        const double need = (double)p.peak / (1 << 30), have = (double)gpu_mem / (1 << 30);
        if (!gpu_mem)
            check(d, "plan", -1, "%s program: %.2f GiB per GPU predicted; no GPU here to check it against",
                  spec->parallelism, need);
        else if (p.fits)
            check(d, "plan", 1, "%s program: %.2f GiB per GPU predicted, a GPU has %.2f GiB", spec->parallelism,
                  need, have);
        else
            check(d, "plan", 0, "%s program: %.2f GiB per GPU predicted, a GPU has %.2f GiB: shard more (zero2, "
                  "zero3), checkpoint activations or use more GPUs (musterctl plan %s)", spec->parallelism, need,
                  have, path);
    }
    check_ckpt_dir(d, spec->checkpoint_dir, 0);
}

static void check_job(struct doctor *d, const char *path, int devices, uint64_t gpu_mem, uint64_t host_mem)
{
    struct job_spec spec;
    char err[1024], why[PREFLIGHT_WHY_MAX];
    if (job_spec_load(path, &spec, NULL, err, sizeof(err))) {
        check(d, "job spec", 0, "%s", err);
        return;
    }
    check(d, "job spec", 1, "%s: job %s, %d node%s", path, spec.name, spec.nodes, spec.nodes == 1 ? "" : "s");
    if (strcmp(spec.parallelism, "muster-train") != 0) {
        check_program(d, path, &spec, devices, gpu_mem);
        return;
    }
    if (spec.rank_cmd[0]) { /* muster-train's plan would describe another program */
        check(d, "plan", -1, "the job runs its own rank program (rank_cmd): describe it with parallelism and params "
              "to plan it (docs/plan.md); its data and memory are its own");
        check_ckpt_dir(d, spec.checkpoint_dir, 0);
        return;
    }
    struct plan_input in;
    struct plan p;
    int planned = plan_input_from_spec(&in, &spec, err, sizeof(err)) == 0;
    if (planned) {
        in.devices_per_node = devices;
        in.device = gpu_mem ? PLAN_GPU : PLAN_CPU;
        in.device_mem = gpu_mem ? gpu_mem : host_mem;
        struct preflight_data pd;
        if (!gpu_mem && spec.data[0] && preflight_data_tokens(spec.data, &pd) == 0)
            in.data_tokens = pd.tokens;
        planned = plan_compute(&in, &p, err, sizeof(err)) == 0;
    }
    if (!planned)
        check(d, "plan", 0, "%s", err);
    else if (p.fits == 1)
        check(d, "plan", 1, "%d rank%s need %.1f MiB of %.2f GiB %s", in.devices_per_node,
              in.devices_per_node == 1 ? "" : "s", (double)p.need / (1 << 20), (double)in.device_mem / (1 << 30),
              gpu_mem ? "per GPU" : "host memory");
    else
        check(d, "plan", 0, "needs %.2f GiB, %s has %.2f GiB: use more nodes, a smaller micro_batch (largest that "
              "fits: %d) or a smaller model (musterctl plan %s)", (double)p.need / (1 << 30),
              gpu_mem ? "a GPU" : "this node", (double)in.device_mem / (1 << 30), p.max_micro_batch, path);
    struct gpt_config cfg;
    struct preflight_data pd;
    if (!spec.data[0])
        check(d, "data", 0, "the job names no data file: set \"data\"");
    else if (job_spec_model(&spec, &cfg, err, sizeof(err)) == 0 &&
             preflight_data_check(spec.data, cfg.V, spec.seq_len ? spec.seq_len : cfg.T, spec.val_fraction, &pd,
                                  why, sizeof(why)) == 0)
        check(d, "data", 1, "%s: %s, %llu tokens, largest %d < vocab %d", spec.data,
              pd.tokens_file ? "token file" : "text", (unsigned long long)pd.tokens, pd.max_token, cfg.V);
    else
        check(d, "data", 0, "%s", why);
    if (planned)
        check_ckpt_dir(d, spec.checkpoint_dir, 2 * p.ckpt_bytes);
}

static void print_table(FILE *f, const json_t *rows)
{
    size_t i;
    json_t *r;
    fprintf(f, "%-16s %-6s %s\n", "CHECK", "RESULT", "DETAIL / WHAT TO DO");
    json_array_foreach(rows, i, r)
        fprintf(f, "%-16s %-6s %s\n", json_string_value(json_object_get(r, "check")),
                json_string_value(json_object_get(r, "result")), json_string_value(json_object_get(r, "detail")));
}

static int usage(const char *fmt, const char *arg)
{
    fputs("musterctl doctor: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\n", stderr);
    ctl_doctor_usage(stderr);
    return 2;
}

void ctl_doctor_usage(FILE *f)
{
    fputs("usage: musterctl doctor [--job JOB] [--token-file FILE] [--devices-per-node G] [--server URL]\n"
          "                        [--control-port PORT] [--json]\n"
          "  --job JOB               also check JOB (a job spec file): its plan on this node, data, checkpoint_dir\n"
          "  --token-file FILE       the cluster token to check (default $CONFIGURATION_DIRECTORY/token,\n"
          "                          else /etc/muster/token)\n"
          "  --devices-per-node G    ranks this node runs, for JOB's plan (default 1)\n"
          "  --server URL            musterd's REST address (default $MUSTER_SERVER, else\n"
          "                          http://127.0.0.1:29471); its host and port are the ones checked\n"
          "  --control-port PORT     musterd's control port on that host (default 29470)\n"
          "  --admin-token-file FILE accepted and unused (musterctl's global option)\n"
          "  --json                  one JSON object instead of the table\n"
          "On musterd's host the control and REST ports must be free or held by musterd; elsewhere the\n"
          "control port must accept connections. Exit status: 0 every check passed, 1 one failed, 2 usage.\n",
          f);
}

int ctl_doctor_main(int argc, char **argv, const char *server, ctl_get_fn get, void *get_ctx)
{
    struct doctor d = {.rows = json_array()};
    const char *job = NULL, *token = NULL;
    char token_path[1024];
    int devices = 0, seen_cmd = 0, control_port = CONTROL_PORT;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "doctor") == 0 && !seen_cmd) {
            seen_cmd = 1;
        } else if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
            ctl_doctor_usage(stdout);
            json_decref(d.rows);
            return 0;
        } else if (strcmp(a, "--json") == 0) {
            d.json = 1;
        } else if (strcmp(a, "--job") == 0 || strcmp(a, "--token-file") == 0 || strcmp(a, "--server") == 0 ||
                   strcmp(a, "--devices-per-node") == 0 || strcmp(a, "--admin-token-file") == 0 ||
                   strcmp(a, "--control-port") == 0) {
            if (!v) {
                json_decref(d.rows);
                return usage("option '%s' needs a value", a);
            }
            if (strcmp(a, "--job") == 0)
                job = v;
            else if (strcmp(a, "--token-file") == 0)
                token = v;
            else if (strcmp(a, "--server") == 0)
                server = v;
            else if (strcmp(a, "--devices-per-node") == 0 &&
                     ((devices = atoi(v)) < 1 || devices > PLAN_MAX_DEVICES || strspn(v, "0123456789") != strlen(v))) {
                json_decref(d.rows);
                return usage("--devices-per-node: expected 1 to 64, got '%s'", v);
            } else if (strcmp(a, "--control-port") == 0 &&
                       ((control_port = atoi(v)) < 1 || control_port > 65535 || strspn(v, "0123456789") != strlen(v))) {
                json_decref(d.rows);
                return usage("--control-port: expected a port, 1 to 65535, got '%s'", v);
            }
            i++;
        } else {
            json_decref(d.rows);
            return usage("unexpected argument '%s'", a);
        }
    }
    if (!token) {
        token_default_path(token_path, sizeof(token_path));
        token = token_path;
    }
    struct server_addr sa;
    char why[512];
    if (server_parse(server, &sa, why, sizeof(why))) {
        json_decref(d.rows);
        return usage("%s", why);
    }
    uint64_t gpu_mem, host_mem = 0;
    check_daemon(&d, server, get, get_ctx);
    check_token(&d, token);
    if (sa.local) {
        check_port(&d, &sa, "control port", control_port);
        check_port(&d, &sa, "REST port", sa.rest_port);
    } else {
        check_reach(&d, &sa, control_port);
    }
    check_devices(&d, &gpu_mem, &host_mem);
    if (job)
        check_job(&d, job, devices ? devices : 1, gpu_mem, host_mem);
    if (d.json) {
        json_t *doc = json_pack("{s:o, s:i}", "checks", d.rows, "failed", d.failed);
        char *text = json_dumps(doc, JSON_COMPACT);
        printf("%s\n", text);
        free(text);
        json_decref(doc);
    } else {
        print_table(stdout, d.rows);
        printf("\n%s\n", d.failed ? "some checks failed: see DETAIL for what to do (docs/troubleshooting.md)"
                                  : "every check passed");
        json_decref(d.rows);
    }
    return d.failed ? 1 : 0;
}
