#include "worker/local.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "common/jobspec.h"
#include "common/log.h"

extern char **environ;

/* A loopback port nobody listens on now (bound, read, released). */
static int free_port(uint16_t want)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(want)};
    socklen_t len = sizeof(sa);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0 || getsockname(fd, (struct sockaddr *)&sa, &len) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    close(fd);
    return ntohs(sa.sin_port);
}

static int write_file(const char *path, const char *text)
{
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0)
        return -errno;
    size_t len = strlen(text);
    ssize_t n = write(fd, text, len);
    int rc = (n == (ssize_t)len) ? 0 : -EIO;
    close(fd);
    return rc;
}

static void remove_tree(const char *dir)
{
    char path[PATH_MAX];
    static const char *const files[] = {"token", "job.json", "state/musterd.state.json", NULL};
    for (int i = 0; files[i]; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/state", dir);
    rmdir(path);
    rmdir(dir);
}

int local_run(const struct local_config *lc, struct agent_config *cfg)
{
    char dir[] = "/tmp/muster-local.XXXXXX", self[PATH_MAX], musterd[PATH_MAX];
    char err[512], token_hex[2 * 32 + 2], listen[64], http[64], state[PATH_MAX], jobp[PATH_MAX], tokp[PATH_MAX];
    uint8_t raw[32];
    struct job_spec spec;
    json_t *job = NULL;

    if (job_spec_load(lc->job_path, &spec, &job, err, sizeof(err)) != 0) {
        log_error("%s", err);
        return 1;
    }
    if (!mkdtemp(dir)) {
        log_error("cannot create a temporary directory: %s", strerror(errno));
        json_decref(job);
        return 1;
    }
    /* One machine is one node, whatever the spec says about the cluster. */
    json_object_set_new(job, "nodes", json_integer(1));
    snprintf(jobp, sizeof(jobp), "%s/job.json", dir);
    int rc = json_dump_file(job, jobp, JSON_INDENT(2));
    json_decref(job);
    if (rc != 0 || proto_nonce(raw) != 0) {
        log_error("%s: cannot write the local job spec", jobp);
        remove_tree(dir);
        return 1;
    }
    for (int i = 0; i < 32; i++)
        snprintf(token_hex + 2 * i, 3, "%02x", raw[i]);
    snprintf(tokp, sizeof(tokp), "%s/token", dir);
    if (write_file(tokp, token_hex) != 0) {
        log_error("%s: cannot write the local token", tokp);
        remove_tree(dir);
        return 1;
    }
    int ctl = free_port(0);
    int rest = lc->http_port ? lc->http_port : free_port(29471);
    if (rest < 0)
        rest = free_port(0);
    if (ctl < 0 || rest < 0) {
        log_error("no free loopback port: %s", strerror(-(ctl < 0 ? ctl : rest)));
        remove_tree(dir);
        return 1;
    }
    snprintf(listen, sizeof(listen), "127.0.0.1:%d", ctl);
    snprintf(http, sizeof(http), "127.0.0.1:%d", rest);
    snprintf(state, sizeof(state), "%s/state", dir);

    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0) {
        log_error("cannot find this program's path: %s", strerror(errno));
        remove_tree(dir);
        return 1;
    }
    self[n] = '\0';
    snprintf(musterd, sizeof(musterd), "%s/musterd", dirname(self));
    char *argv[] = {musterd, "--job", jobp, "--listen", listen, "--http", http, "--state-dir", state,
                    "--token-file", tokp, "--exit-on-end", NULL};
    pid_t pid;
    rc = posix_spawn(&pid, musterd, NULL, NULL, argv, environ);
    if (rc != 0) {
        log_error("cannot start %s: %s", musterd, strerror(rc));
        remove_tree(dir);
        return 1;
    }
    log_info("local job %s: %d rank(s), private musterd pid %d, REST http://%s (musterctl --server http://%s status)",
             spec.name, (int)cfg->devices.n, (int)pid, http, http);

    snprintf(cfg->daemon, sizeof(cfg->daemon), "%s", listen);
    snprintf(cfg->host, sizeof(cfg->host), "127.0.0.1");
    cfg->port = (uint16_t)ctl;
    cfg->token = (const uint8_t *)token_hex;
    cfg->token_len = strlen(token_hex);
    int agent_code = agent_run(cfg);

    /* The daemon ends the agent when the job ends; otherwise end the daemon. */
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 100 && (done = waitpid(pid, &status, WNOHANG)) == 0; i++)
        usleep(30 * 1000);
    if (done == 0) {
        kill(pid, SIGTERM);
        waitpid(pid, &status, 0);
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (agent_code != 0)
        code = 1;
    if (code == 0)
        remove_tree(dir);
    else
        log_warn("job did not complete; daemon state kept in %s", dir);
    return code;
}
