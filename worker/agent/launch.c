#include "worker/agent/launch.h"

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
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/jobspec.h"
#include "common/log.h"
#include "proto/proto.h"

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

/* The daemon's readiness comes over the systemd notify protocol, to a socket of ours. */
static int notify_listen(const char *path)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof(sa.sun_path))
        return -ENAMETOOLONG;
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0)
        return -errno;
    if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        int e = -errno;
        close(fd);
        return e;
    }
    return fd;
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
    static const char *const files[] = {"token", "job.json", "notify.sock", "state/musterd.state.json", NULL};
    for (int i = 0; files[i]; i++) {
        snprintf(path, sizeof(path), "%s/%s", dir, files[i]);
        unlink(path);
    }
    snprintf(path, sizeof(path), "%s/state", dir);
    rmdir(path);
    rmdir(dir);
}

/*
 * The environment with NOTIFY_SOCKET pointing at our socket and no systemd
 * watchdog: the agent is the service; its daemon reports to the agent.
 */
static char **child_environ(char *notify_var)
{
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 2, sizeof(*env));
    if (!env)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "NOTIFY_SOCKET=", 14) != 0 && strncmp(environ[i], "WATCHDOG_", 9) != 0)
            env[k++] = environ[i];
    env[k] = notify_var;
    return env;
}

static int spawn_musterd(struct launch *l, const char *listen, const char *tokp)
{
    char self[PATH_MAX], musterd[PATH_MAX], ctl[80], http[64], state[PATH_MAX], jobp[PATH_MAX];
    char notify_var[PATH_MAX + 16];
    ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
    if (n < 0) {
        log_error("cannot find this program's path: %s", strerror(errno));
        return -1;
    }
    self[n] = '\0';
    snprintf(musterd, sizeof(musterd), "%s/musterd", dirname(self));
    snprintf(ctl, sizeof(ctl), "%s:%u", listen, l->ctl_port);
    snprintf(http, sizeof(http), "127.0.0.1:%u", l->http_port);
    snprintf(state, sizeof(state), "%s/state", l->dir);
    snprintf(jobp, sizeof(jobp), "%s/job.json", l->dir);
    char *argv[] = {musterd, "--job", jobp, "--listen", ctl, "--http", http, "--state-dir", state,
                    "--token-file", (char *)tokp, "--exit-on-end", NULL};
    snprintf(notify_var, sizeof(notify_var), "NOTIFY_SOCKET=%s/notify.sock", l->dir);
    char **env = child_environ(notify_var);
    int rc = env ? posix_spawn(&l->pid, musterd, NULL, NULL, argv, env) : ENOMEM;
    free(env);
    if (rc != 0) {
        log_error("cannot start %s: %s", musterd, strerror(rc));
        return -1;
    }
    return 0;
}

/* Waits for READY=1 on fd (musterd sends it once both ports listen and its state is loaded). */
static int wait_ready(struct launch *l, int fd, int timeout_ms)
{
    for (int waited = 0; waited <= timeout_ms; waited += 20) {
        char msg[1024];
        int status;
        ssize_t n;
        while ((n = recv(fd, msg, sizeof(msg) - 1, 0)) > 0) {
            msg[n] = '\0';
            if (strncmp(msg, "READY=1", 7) == 0 || strstr(msg, "\nREADY=1"))
                return 0;
        }
        if (waitpid(l->pid, &status, WNOHANG) == l->pid) {
            log_error("musterd exited (%s %d) before serving; its message is above",
                      WIFEXITED(status) ? "status" : "signal",
                      WIFEXITED(status) ? WEXITSTATUS(status) : WTERMSIG(status));
            return -1;
        }
        nanosleep(&(struct timespec){.tv_nsec = 20 * 1000 * 1000}, NULL);
    }
    log_error("musterd did not serve within %d ms; stopping it", timeout_ms);
    kill(l->pid, SIGTERM);
    waitpid(l->pid, NULL, 0);
    return -1;
}

int launch_start(const struct launch_config *lc, struct launch *l, int timeout_ms)
{
    char err[512], jobp[PATH_MAX], tokp[PATH_MAX];
    struct job_spec spec;
    json_t *job = NULL;

    memset(l, 0, sizeof(*l));
    if (job_spec_load(lc->job_path, &spec, &job, err, sizeof(err)) != 0) {
        log_error("%s", err);
        return 1;
    }
    snprintf(l->job_name, sizeof(l->job_name), "%s", spec.name);
    snprintf(l->dir, sizeof(l->dir), "/tmp/muster-launch.XXXXXX");
    if (!mkdtemp(l->dir)) {
        log_error("cannot create a temporary directory: %s", strerror(errno));
        json_decref(job);
        return 1;
    }
    json_object_set_new(job, "nodes", json_integer(lc->nodes));
    snprintf(jobp, sizeof(jobp), "%s/job.json", l->dir);
    int rc = json_dump_file(job, jobp, JSON_INDENT(2));
    json_decref(job);
    if (rc != 0) {
        log_error("%s: cannot write the job spec", jobp);
        remove_tree(l->dir);
        return 1;
    }
    if (lc->token_file) {
        snprintf(tokp, sizeof(tokp), "%s", lc->token_file);
    } else {
        uint8_t raw[32];
        snprintf(tokp, sizeof(tokp), "%s/token", l->dir);
        int nrc = proto_nonce(raw);
        for (int i = 0; nrc == 0 && i < 32; i++)
            snprintf(l->token_hex + 2 * i, 3, "%02x", raw[i]);
        if (nrc != 0 || write_file(tokp, l->token_hex) != 0) {
            log_error("%s: cannot write the private token", tokp);
            remove_tree(l->dir);
            return 1;
        }
    }
    int ctl = lc->ctl_port ? lc->ctl_port : free_port(0);
    int rest = lc->http_port ? lc->http_port : free_port(29471);
    if (rest < 0)
        rest = free_port(0);
    if (ctl < 0 || rest < 0) {
        log_error("no free loopback port: %s", strerror(-(ctl < 0 ? ctl : rest)));
        remove_tree(l->dir);
        return 1;
    }
    l->ctl_port = (uint16_t)ctl;
    l->http_port = (uint16_t)rest;
    char sock[PATH_MAX];
    snprintf(sock, sizeof(sock), "%s/notify.sock", l->dir);
    int fd = notify_listen(sock);
    if (fd < 0) {
        log_error("%s: cannot listen for the daemon's readiness: %s", sock, strerror(-fd));
        remove_tree(l->dir);
        return 1;
    }
    rc = spawn_musterd(l, lc->listen, tokp) != 0 ? -1 : wait_ready(l, fd, timeout_ms);
    /* Later STATUS= lines find no listener and are dropped by the daemon's sendto. */
    close(fd);
    unlink(sock);
    if (rc != 0) {
        remove_tree(l->dir);
        return 1;
    }
    return 0;
}

int launch_finish(struct launch *l, int agent_code)
{
    /* The daemon ends the agent when the job ends; otherwise end the daemon. */
    int status = 0;
    pid_t done = 0;
    for (int i = 0; i < 100 && (done = waitpid(l->pid, &status, WNOHANG)) == 0; i++)
        usleep(30 * 1000);
    if (done == 0) {
        kill(l->pid, SIGTERM);
        waitpid(l->pid, &status, 0);
    }
    int code = WIFEXITED(status) ? WEXITSTATUS(status) : 1;
    if (agent_code != 0)
        code = 1;
    if (code == 0)
        remove_tree(l->dir);
    else
        log_warn("job did not complete; daemon state kept in %s", l->dir);
    return code;
}
