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

/* rank_env (freed) without per_rank, plus the spare's own variables (DS_ACCELERATOR=cuda with gpus,
 * unless rank_env sets it); NULL when out of memory. */
static char **spare_env(char **rank_env, const char *imports, bool gpus)
{
    size_t n = 0, k = 0;
    bool ds_set = false;
    while (rank_env[n])
        ds_set |= strncmp(rank_env[n++], "DS_ACCELERATOR=", 15) == 0;
    char **env = calloc(n + 6, sizeof(*env));
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
    const char *own[] = {fd, imp, "CUDA_VISIBLE_DEVICES=", "PYTORCH_NVML_BASED_CUDA_CHECK=1",
                         gpus && !ds_set ? "DS_ACCELERATOR=cuda" : NULL, NULL};
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

int spare_parse_report(const char *buf, size_t len, char name[128], char how[160], char *why, size_t cap)
{
    json_error_t jerr;
    json_t *o = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
    const char *n = NULL, *h = NULL;
    int rc = -EINVAL;
    if (!json_is_object(o) || json_object_size(o) != 2)
        snprintf(why, cap, "expected an object {\"cuda_import\", \"how\"}");
    else if (!(n = json_string_value(json_object_get(o, "cuda_import"))) || !n[0] || strlen(n) >= 128 ||
             n[strspn(n, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.")])
        snprintf(why, cap, "cuda_import: expected a module name (letters, digits, _ and .) of 1 to 127 bytes");
    else if (!(h = json_string_value(json_object_get(o, "how"))) || strlen(h) >= 160)
        snprintf(why, cap, "how: expected a string of at most 159 bytes");
    else {
        rc = 0;
        for (const char *c = h; *c; c++)
            if (*c < 0x20 || *c > 0x7e)
                rc = -EINVAL;
        if (rc)
            snprintf(why, cap, "how: expected printable ASCII");
    }
    if (rc == 0) {
        snprintf(name, 128, "%s", n);
        snprintf(how, 160, "%s", h);
    }
    json_decref(o);
    return rc;
}

bool spare_without_import(const char *imports, const char *name, char *out, size_t cap)
{
    size_t k = 0, nlen = strlen(name);
    bool found = false;
    out[0] = '\0';
    for (const char *w = imports; *w;) {
        size_t len = strcspn(w, ",");
        if (len == nlen && strncmp(w, name, len) == 0)
            found = true;
        else if (len && k + (k > 0) + len < cap)
            k += (size_t)snprintf(out + k, cap - k, "%s%.*s", k ? "," : "", (int)len, w);
        w += len + (w[len] == ',');
    }
    return found;
}

/* imports (the job's) less the pool's dropped ones, in out. */
static void effective_imports(const struct spare_pool *p, const char *imports, char *out, size_t cap)
{
    snprintf(out, cap, "%s", imports);
    for (const char *w = p->dropped; *w;) {
        size_t len = strcspn(w, ",");
        char name[128], rest[sizeof(p->imports)];
        snprintf(name, sizeof(name), "%.*s", (int)(len < sizeof(name) ? len : sizeof(name) - 1), w);
        if (spare_without_import(out, name, rest, sizeof(rest)))
            snprintf(out, cap, "%s", rest);
        w += len + (w[len] == ',');
    }
}

/* What a spare wrote on its hand-off socket before it exited (its report), up to cap - 1 bytes. */
static size_t read_report(int fd, char *buf, size_t cap)
{
    size_t got = 0;
    while (fd >= 0 && got + 1 < cap) {
        ssize_t n = recv(fd, buf + got, cap - 1 - got, MSG_DONTWAIT);
        if (n <= 0)
            break;
        got += (size_t)n;
    }
    buf[got] = '\0';
    return got;
}

/*
 * A spare reported that importing name touched the CUDA driver: the next
 * spare leaves it out (MUSTER_WARM_IMPORTS of the pool's environment), or
 * there is none when it is not a warm import to leave out (torch itself).
 */
static void drop_import(struct spare_pool *p, int pid, const char *name, const char *how)
{
    char now[sizeof(p->imports)], rest[sizeof(p->imports)];
    if (!p->env)
        return; /* no spare is wanted any more */
    effective_imports(p, p->imports, now, sizeof(now));
    if (!spare_without_import(now, name, rest, sizeof(rest))) {
        p->deaths = SPARE_MAX_DEATHS;
        snprintf(p->note, sizeof(p->note), "importing %s touched the CUDA driver (%s): no more spares for this job",
                 name, how);
        log_warn("warm spare (pid %d): importing %s touched the CUDA driver (%s): a spare must hold no device, "
                 "and it is not a warm import to leave out; no more spares for this job", pid, name, how);
        return;
    }
    size_t k = strlen(p->dropped);
    if (k + 1 + strlen(name) < sizeof(p->dropped))
        snprintf(p->dropped + k, sizeof(p->dropped) - k, "%s%s", k ? "," : "", name);
    for (size_t i = 0; p->env[i]; i++) {
        if (strncmp(p->env[i], "MUSTER_WARM_IMPORTS=", 20) != 0)
            continue;
        size_t cap = sizeof("MUSTER_WARM_IMPORTS=") + strlen(rest);
        char *var = malloc(cap);
        if (!var)
            break;
        snprintf(var, cap, "MUSTER_WARM_IMPORTS=%s", rest);
        free(p->env[i]);
        p->env[i] = var;
    }
    snprintf(p->note, sizeof(p->note), "importing %s (warm_imports) touched the CUDA driver (%s): the node's "
             "spares leave it out", name, how);
    log_warn("warm spare (pid %d): importing %s (warm_imports) touched the CUDA driver (%s): a spare must hold "
             "no device; starting another without it (warm imports now: %s)", pid, name, how,
             rest[0] ? rest : "none");
}

static void spare_exit(struct agent_rank *r, int code, int sig)
{
    struct spare_pool *p = r->cb.data;
    char report[512] = "", name[128] = "", how[160] = "", why[128] = "";
    size_t len = 0;
    if (p->r == r) {
        p->r = NULL;
        if (!p->closing && !r->stopping)
            len = read_report(p->handoff_fd, report, sizeof(report));
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
    } else if (len && spare_parse_report(report, len, name, how, why, sizeof(why)) == 0) {
        drop_import(p, r->pid, name, how);
    } else {
        if (len)
            log_warn("warm spare (pid %d): its report on the hand-off socket is not one: %s", r->pid, why);
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
    if (!same_argv(p->argv, argv) || strcmp(p->imports, imports) != 0)
        p->dropped[0] = p->note[0] = '\0'; /* another job or command: its own imports are tried afresh */
    snprintf(p->imports, sizeof(p->imports), "%s", imports);
    char now[sizeof(p->imports)];
    effective_imports(p, imports, now, sizeof(now));
    cmdline_free(p->env);
    cmdline_free(p->argv);
    p->env = rank_env ? spare_env(rank_env, now, p->gpus) : NULL;
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

bool spare_handoff_quiet(int fd)
{
    char c;
    return fd >= 0 && recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT) < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

struct agent_rank *spare_take(struct spare_pool *p, char *const *argv, char *const *env)
{
    struct agent_rank *r = p->r;
    if (!r || !r->running || r->stopping || !same_argv(argv, p->argv))
        return NULL;
    if (!spare_handoff_quiet(p->handoff_fd)) {
        /* It reported (and is exiting, or lingers) or closed its end: it would not become the rank, or would
         * exit as one. Killed, not stopped, so that spare_exit reads what it wrote. */
        log_warn("warm spare (pid %d): it wrote on or closed its hand-off socket before it was handed a rank; "
                 "starting the rank afresh", r->pid);
        rank_kill(r);
        return NULL;
    }
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
