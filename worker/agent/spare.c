#include "worker/agent/spare.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>

#include "common/cmdline.h"
#include "common/log.h"

void spare_init(struct spare_pool *p, uv_loop_t *loop, void (*on_gone)(void *data), void *data)
{
    memset(p, 0, sizeof(*p));
    p->loop = loop;
    p->handoff_fd = -1;
    p->on_gone = on_gone;
    p->data = data;
    uv_timer_init(loop, &p->timer);
    p->timer.data = p;
}

static bool is_python(const char *path)
{
    const char *base = strrchr(path, '/');
    return strncmp(base ? base + 1 : path, "python", 6) == 0;
}

bool spare_usable(const struct job_spec *spec, char *const *argv, const char *pypath, char *why, size_t cap)
{
    why[0] = '\0';
    if (!spec->warm_spares)
        return false;
    if (!argv || !argv[0] || !is_python(argv[0]) || !argv[1] ||
        (argv[1][0] == '-' && !(strcmp(argv[1], "-m") == 0 && argv[2] && argv[2][0] != '-')))
        snprintf(why, cap, "the rank command is not `PYTHON script.py ...` or `PYTHON -m module ...` "
                           "(an interpreter named python*, no option before the script)");
    else if (!pypath[0])
        snprintf(why, cap, "python_hook is off or muster's Python client is not beside the agent");
    return !why[0];
}

/* The rank's variables that name one rank or wake the start-up hook: a spare has none of them. */
static const char *const per_rank[] = {"MUSTER_CTL_FD", "MUSTER_RANK_DIR", "MUSTER_STACKS_SIGNAL",
                                       "TORCHELASTIC_ERROR_FILE", "RANK", "LOCAL_RANK", "ROLE_RANK",
                                       "CUDA_VISIBLE_DEVICES", NULL};

static bool named(const char *var, const char *const *names)
{
    for (size_t i = 0; names[i]; i++) {
        size_t n = strlen(names[i]);
        if (strncmp(var, names[i], n) == 0 && var[n] == '=')
            return true;
    }
    return false;
}

/* rank_env (freed) without per_rank, plus the spare's own variables; NULL when out of memory. */
static char **spare_env(char **rank_env, const char *imports)
{
    size_t n = 0, k = 0;
    while (rank_env[n])
        n++;
    char **env = calloc(n + 5, sizeof(*env));
    if (!env) {
        cmdline_free(rank_env);
        return NULL;
    }
    for (size_t i = 0; i < n; i++) {
        if (named(rank_env[i], per_rank))
            free(rank_env[i]);
        else
            env[k++] = rank_env[i];
    }
    free(rank_env);
    char fd[32], imp[600];
    snprintf(fd, sizeof(fd), "MUSTER_SPARE_FD=%d", SPARE_HANDOFF_FD);
    snprintf(imp, sizeof(imp), "MUSTER_WARM_IMPORTS=%s", imports);
    /* No device is visible to a spare, and torch's CUDA check does not initialise CUDA in it
     * (a warm import that asks would otherwise fix the visible devices before the take-up). */
    const char *own[] = {fd, imp, "CUDA_VISIBLE_DEVICES=", "PYTORCH_NVML_BASED_CUDA_CHECK=1", NULL};
    for (size_t i = 0; own[i]; i++) {
        if (!(env[k++] = strdup(own[i]))) {
            cmdline_free(env);
            return NULL;
        }
    }
    return env;
}

static void start_later(struct spare_pool *p, uint64_t ms);

static void spare_msg(struct agent_rank *r, struct proto_msg *msg)
{
    (void)r, (void)msg; /* a spare says nothing before it is a rank */
}

static void spare_exit(struct agent_rank *r, int code, int sig)
{
    struct spare_pool *p = r->cb.data;
    if (p->r == r) {
        p->r = NULL;
        close(p->handoff_fd);
        p->handoff_fd = -1;
    }
    if (p->closing) {
        rank_release(r);
        if (p->on_gone)
            p->on_gone(p->data);
        return;
    }
    if (r->stopping) {
        log_debug("warm spare (pid %d) stopped", r->pid);
    } else {
        const char *tail = r->err.tail, *last = tail;
        for (const char *c = tail; *c; c++)
            if (c[0] == '\n' && c[1])
                last = c + 1;
        p->deaths++;
        log_warn("warm spare (pid %d) %s %d before it was needed%s%.*s; %s", r->pid, sig ? "was killed by signal"
                 : "exited with status", sig ? sig : code, *last ? ": " : "", (int)strcspn(last, "\n"), last,
                 p->deaths < SPARE_MAX_DEATHS ? "starting another" : "no more spares for this job");
    }
    rank_release(r);
    if (p->deaths < SPARE_MAX_DEATHS)
        start_later(p, SPARE_DELAY_MS);
}

static void start_now(uv_timer_t *t)
{
    struct spare_pool *p = t->data;
    if (p->r || !p->env || p->closing || p->deaths >= SPARE_MAX_DEATHS)
        return;
    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) {
        log_warn("warm spare: cannot make its hand-off socket: %s", strerror(errno));
        return;
    }
    size_t n = 0;
    while (p->argv[n])
        n++;
    char **argv = calloc(n + 3, sizeof(*argv));
    struct rank_callbacks cb = {.data = p, .on_msg = spare_msg, .on_exit = spare_exit};
    int err = UV_ENOMEM;
    if (argv) {
        argv[0] = p->argv[0];
        argv[1] = "-c";
        argv[2] = (char *)SPARE_START;
        memcpy(argv + 3, p->argv + 1, (n - 1) * sizeof(*argv));
        char **run = rank_user_argv(p->user, argv);
        if (run)
            p->r = rank_spawn_spare(p->loop, &p->list, run, p->env, sp[1], &cb, &err);
        cmdline_free(run);
    }
    free(argv);
    close(sp[1]);
    if (!p->r) {
        close(sp[0]);
        log_warn("warm spare: cannot start %s: %s", p->argv[0], uv_strerror(err));
        return;
    }
    p->handoff_fd = sp[0];
    log_info("started a warm spare (pid %d)", p->r->pid);
}

static void start_later(struct spare_pool *p, uint64_t ms)
{
    if (!p->closing)
        uv_timer_start(&p->timer, start_now, ms, 0);
}

static bool same_argv(char *const *x, char *const *y)
{
    size_t i = 0;
    for (; x && y && x[i] && y[i]; i++)
        if (strcmp(x[i], y[i]) != 0)
            return false;
    return x && y && !x[i] && !y[i];
}

/* A malloc'd copy of argv (freed with cmdline_free); NULL when out of memory. */
static char **copy_argv(char *const *argv)
{
    size_t n = 0;
    while (argv[n])
        n++;
    char **c = calloc(n + 1, sizeof(*c));
    for (size_t i = 0; c && i < n; i++) {
        if (!(c[i] = strdup(argv[i]))) {
            cmdline_free(c);
            return NULL;
        }
    }
    return c;
}

void spare_want(struct spare_pool *p, char *const *argv, char **rank_env, const char *imports)
{
    if (p->r && !same_argv(p->argv, argv))
        spare_drop(p);
    cmdline_free(p->env);
    cmdline_free(p->argv);
    p->env = rank_env ? spare_env(rank_env, imports) : NULL;
    p->argv = copy_argv(argv);
    if (!p->argv) {
        cmdline_free(p->env);
        p->env = NULL;
    }
    if (!p->r && !uv_is_active((uv_handle_t *)&p->timer))
        start_later(p, SPARE_DELAY_MS);
}

void spare_drop(struct spare_pool *p)
{
    uv_timer_stop(&p->timer);
    cmdline_free(p->env);
    p->env = NULL;
    if (p->r)
        rank_stop(p->r, 0, 0);
}

/* {"argv": [...], "env": [...], "cwd": "..."}; NULL when something is not UTF-8 or memory ran out. */
static char *handoff_text(char *const *argv, char *const *env)
{
    char cwd[PATH_MAX];
    if (!getcwd(cwd, sizeof(cwd)))
        return NULL;
    json_t *o = json_object(), *a = json_array(), *e = json_array();
    int bad = !o || !a || !e;
    for (size_t i = 0; !bad && argv[i]; i++)
        bad = json_array_append_new(a, json_string(argv[i]));
    for (size_t i = 0; !bad && env[i]; i++)
        bad = json_array_append_new(e, json_string(env[i]));
    char *text = NULL;
    if (!bad && json_object_set(o, "argv", a) == 0 && json_object_set(o, "env", e) == 0 &&
        json_object_set_new(o, "cwd", json_string(cwd)) == 0)
        text = json_dumps(o, JSON_COMPACT);
    json_decref(a);
    json_decref(e);
    json_decref(o);
    return text;
}

struct agent_rank *spare_take(struct spare_pool *p, char *const *argv, char *const *env)
{
    struct agent_rank *r = p->r;
    if (!r || !r->running || r->stopping || !same_argv(argv, p->argv))
        return NULL;
    char *text = handoff_text(argv, env);
    size_t len = text ? strlen(text) : 0, done = 0;
    while (text && done < len) {
        ssize_t n = send(p->handoff_fd, text + done, len - done, MSG_DONTWAIT | MSG_NOSIGNAL);
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    free(text);
    if (!text || done < len) {
        log_warn("warm spare (pid %d): cannot hand it the rank (%s); starting the rank afresh", r->pid,
                 !text ? "an argument or variable is not UTF-8" : strerror(errno));
        rank_stop(r, 0, 0);
        return NULL;
    }
    close(p->handoff_fd);
    p->handoff_fd = -1;
    p->r = NULL;
    p->deaths = 0;
    start_later(p, SPARE_AGAIN_MS);
    return r;
}

void spare_stop(struct spare_pool *p)
{
    p->closing = true;
    uv_timer_stop(&p->timer);
    if (p->r)
        rank_kill(p->r);
}

bool spare_running(const struct spare_pool *p)
{
    for (const struct agent_rank *r = p->list; r; r = r->next)
        if (r->running)
            return true;
    return false;
}

void spare_close(struct spare_pool *p)
{
    cmdline_free(p->env);
    cmdline_free(p->argv);
    p->env = NULL;
    p->argv = NULL;
    if (p->handoff_fd >= 0)
        close(p->handoff_fd);
    p->handoff_fd = -1;
    uv_close((uv_handle_t *)&p->timer, NULL);
    for (struct agent_rank *r = p->list; r; r = r->next)
        rank_close(r);
}
