#include "worker/agent/agent_preflight.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/gptcfg.h"
#include "common/plan.h"
#include "worker/agent/memckpt.h"
#include "worker/agent/rank_env.h"

extern char **environ;

void agent_preflight_init(struct agent_preflight *p, uv_loop_t *loop, preflight_done_fn done, void *data)
{
    memset(p, 0, sizeof(*p));
    p->loop = loop;
    p->done = done;
    p->data = data;
    uv_timer_init(loop, &p->retry);
    p->retry.data = p;
    p->work.data = p;
}

static int check_devices(const struct preflight_inputs *p, char *why, size_t len)
{
    if (p->kind != PROTO_DEV_GPU)
        return 0;
    struct gpu_fact g[PREFLIGHT_MAX_GPUS];
    char nvml[PREFLIGHT_WHY_MAX];
    int n = preflight_gpus(g, PREFLIGHT_MAX_GPUS, nvml, sizeof(nvml));
    if (n == -ENOENT)
        return 0; /* no NVML: the device nodes were checked at start */
    if (n < 0) {
        snprintf(why, len, "devices: %s", nvml);
        return n;
    }
    for (uint32_t i = 0; i < p->ndevices; i++)
        if (p->devices[i] >= (uint32_t)n) {
            snprintf(why, len, "devices: gpu %u is not visible: NVML sees %d GPU%s (check --devices and "
                     "CUDA_VISIBLE_DEVICES of the agent)", p->devices[i], n, n == 1 ? "" : "s");
            return -ENODEV;
        }
    return 0;
}

/* FNV-1a over a string and its NUL, so that ("ab", "c") and ("a", "bc") differ. */
static uint64_t hash_str(uint64_t h, const char *s)
{
    do {
        h ^= (unsigned char)*s;
        h *= 0x100000001b3ull;
    } while (*s++);
    return h;
}

/* What a passed import check depends on: the interpreter (path and file), the environment, the modules. */
static uint64_t python_key(const char *interp, char *const *env, const char *modules)
{
    uint64_t h = hash_str(0xcbf29ce484222325ull, interp);
    struct stat st;
    if (stat(interp, &st) == 0) {
        char id[96];
        snprintf(id, sizeof(id), "%llu:%llu:%lld.%09ld", (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
        h = hash_str(h, id);
    }
    for (char *const *e = env; *e; e++)
        h = hash_str(h, *e);
    for (const char *m = modules; *m; m += strlen(m) + 1)
        h = hash_str(h, m);
    return h ? h : 1;
}

/*
 * The program a command runs and the variables it sets first: `env A=1 B=2
 * python3 train.py` (as docs/pytorch.md writes it) runs python3 with A and B.
 * Returns the index of the program in argv; *sets, *nsets the NAME=VALUE words;
 * -1 when env splits a string into the command (-S): the job must name the interpreter.
 */
static int program_of(char **argv, int *sets, int *nsets)
{
    *sets = 1;
    *nsets = 0;
    const char *base = argv[0] ? strrchr(argv[0], '/') : NULL;
    if (!argv[0] || strcmp(base ? base + 1 : argv[0], "env") != 0)
        return 0;
    int i = 1;
    while (argv[i] && argv[i][0] == '-' && argv[i][1]) { /* env's own options (-i, -u NAME, -C DIR ...) */
        const char *o = argv[i++];
        if (strcmp(o, "--") == 0)
            break;
        if (strncmp(o, "-S", 2) == 0 || strncmp(o, "--split-string", 14) == 0)
            return -1;
        if (strcmp(o, "-u") == 0 || strcmp(o, "--unset") == 0 || strcmp(o, "-C") == 0 || strcmp(o, "--chdir") == 0)
            i += argv[i] != NULL; /* and its argument */
    }
    *sets = i;
    while (argv[i] && strchr(argv[i], '='))
        i++;
    *nsets = i - *sets;
    return argv[i] ? i : 0;
}

/* env with the NAME=VALUE words of sets in place of entries of the same names; NULL without memory. */
static char **env_with(char **env, char *const *sets, int nsets)
{
    size_t n = 0;
    while (env[n])
        n++;
    char **out = calloc(n + (size_t)nsets + 1, sizeof(char *));
    if (!out)
        return NULL;
    size_t k = 0;
    bool ok = true;
    for (size_t i = 0; ok && i < n; i++) {
        bool replaced = false;
        for (int j = 0; j < nsets && !replaced; j++)
            replaced = strncmp(env[i], sets[j], (size_t)(strchr(sets[j], '=') - sets[j]) + 1) == 0;
        ok = replaced || (out[k++] = strdup(env[i])) != NULL;
    }
    for (int j = 0; ok && j < nsets; j++)
        ok = (out[k++] = strdup(sets[j])) != NULL;
    if (!ok) {
        cmdline_free(out);
        return NULL;
    }
    return out;
}

/* require_python_modules, with the environment a rank of this node would get. */
static int check_python(const struct preflight_inputs *p, struct preflight_result *res, char *why, size_t len)
{
    const struct job_spec *s = &p->spec;
    struct rank_identity id = {
        .world_size = 1, .local_world_size = 1, .nnodes = 1, .max_restarts = (uint32_t)s->max_restarts,
        .run_id = s->name, .master_addr = "127.0.0.1", .node = p->node, .python_path = p->python_path,
        .kind = p->kind, .device = p->ndevices ? p->devices[0] : 0,
        /* a rank's view: its node's job devices under visible_devices "node" */
        .visible = p->devices, .nvisible = strcmp(s->visible_devices, "node") == 0 ? p->ndevices : 0,
    };
    char **argv = cmdline_argv(p->cmd);
    if (!argv) {
        snprintf(why, len, "require_python: the rank command is unknown: name the interpreter in require_python");
        return -EINVAL;
    }
    int sets = 0, nsets = 0, prog = program_of(argv, &sets, &nsets);
    if (prog < 0 && !s->require_python[0]) {
        cmdline_free(argv);
        snprintf(why, len, "require_python: the rank command runs env -S, whose program muster does not parse: "
                 "name the interpreter in require_python");
        return -EINVAL;
    }
    if (prog < 0)
        prog = nsets = 0; /* require_python names the interpreter; env -S's variables are not taken */
    char **base = rank_env_build(environ, &id), **env = NULL;
    if (base)
        env = env_with(base, argv + sets, nsets);
    cmdline_free(base);
    if (!env) {
        cmdline_free(argv);
        snprintf(why, len, "require_python: out of memory");
        return -ENOMEM;
    }
    char interp[PATH_MAX];
    int rc = preflight_interpreter(argv[prog], s->require_python, rank_env_get(env, "PATH"), interp, sizeof(interp),
                                   why, len);
    if (rc == 0) {
        uint64_t key = python_key(interp, env, s->require_python_modules);
        if (key != res->python_ok) {
            char *none[] = {NULL};
            char **wrap = rank_user_argv(p->user, none); /* the drop to rank_user, or nothing */
            rc = wrap ? preflight_python_as(wrap, interp, s->require_python_modules, env,
                                            s->require_python_timeout_s * 1000, why, len)
                      : -ENOMEM;
            cmdline_free(wrap);
            res->python_ok = rc == 0 ? key : 0;
        }
    }
    cmdline_free(env);
    cmdline_free(argv);
    return rc;
}

/* The job's require_* keys, and the latest checkpoint when it names checkpoint_latest. */
static int check_needs(const struct preflight_inputs *p, struct preflight_result *res, char *why, size_t len)
{
    const struct job_spec *s = &p->spec;
    int rc;
    for (const char *path = s->require_readable; *path; path += strlen(path) + 1)
        if ((rc = preflight_readable(path, why, len)) != 0)
            return rc;
    for (const char *dir = s->require_writable; *dir; dir += strlen(dir) + 1)
        if ((rc = preflight_writable(dir, (uint64_t)s->require_free_mb << 20, why, len)) != 0)
            return rc;
    if (s->require_python_modules[0] && (rc = check_python(p, res, why, len)) != 0)
        return rc;
    char mem[PATH_MAX];
    if (s->memory_checkpoint_mb && memckpt_path(s, mem, sizeof(mem)) == 0 &&
        (rc = preflight_memory_ckpt(s->memory_checkpoint_root, mem, (uint64_t)s->memory_checkpoint_mb, why, len)) != 0)
        return rc;
    if (s->checkpoint_latest[0]) {
        if ((rc = preflight_latest_ckpt(s->checkpoint_dir, s->checkpoint_latest, res->checkpoint,
                                        sizeof(res->checkpoint), why, len)) != 0)
            return rc;
        res->has_checkpoint = true;
    }
    return 0;
}

int agent_preflight_check(const struct preflight_inputs *p, struct preflight_result *res, char *why, size_t len)
{
    int rc;
    res->has_checkpoint = false;
    res->checkpoint[0] = '\0';
    if (p->have_clock && (rc = preflight_clock(p->skew_ms, p->rtt_ms, why, len)) != 0)
        return rc;
    if ((rc = check_devices(p, why, len)) != 0)
        return rc;
    if ((rc = check_needs(p, res, why, len)) != 0)
        return rc;
    if (!p->trainer)
        return 0; /* a program of the user's: its data and checkpoints are its own */
    const struct job_spec *s = &p->spec;
    struct gpt_config cfg;
    if (job_spec_model(s, &cfg, why, len))
        return -EINVAL;
    if (s->data[0]) {
        struct preflight_data d;
        if ((rc = preflight_data_check(s->data, cfg.V, s->seq_len ? s->seq_len : cfg.T, s->val_fraction, &d, why,
                                       len)) != 0)
            return rc;
    }
    if (s->checkpoint_dir[0]) {
        /* two checkpoints of the world this node would join (a batch that does not
         * divide is musterd's to refuse; then only writability is checked here) */
        struct plan_input in;
        struct plan pl;
        char unused[256];
        uint64_t need = 0, fr;
        if (plan_input_from_spec(&in, s, unused, sizeof(unused)) == 0) {
            in.devices_per_node = (int)p->ndevices;
            if (plan_compute(&in, &pl, unused, sizeof(unused)) == 0)
                need = 2 * pl.ckpt_bytes;
        }
        if ((rc = preflight_ckpt_dir(s->checkpoint_dir, need, &fr, why, len)) != 0)
            return rc;
    }
    return 0;
}

static void run_work(uv_work_t *w)
{
    struct agent_preflight *p = w->data;
    p->reason[0] = '\0';
    p->fit = agent_preflight_check(&p->cur, &p->res, p->reason, sizeof(p->reason)) == 0;
    if (!p->fit && !p->reason[0])
        snprintf(p->reason, sizeof(p->reason), "pre-flight failed");
}

static void queue(struct agent_preflight *p);

static void on_retry(uv_timer_t *t)
{
    queue(t->data);
}

static void after_work(uv_work_t *w, int status)
{
    struct agent_preflight *p = w->data;
    p->busy = false;
    if (p->closing || status == UV_ECANCELED || !p->wanted)
        return;
    if (p->again) { /* its inputs changed while it ran: this answer is stale */
        queue(p);
        return;
    }
    const bool last = p->last;
    p->last = false;
    if (last)
        p->wanted = false;
    p->done(p, p->fit, p->reason);
    if ((!p->fit || p->cur.spec.checkpoint_latest[0]) && p->wanted)
        uv_timer_start(&p->retry, on_retry, PREFLIGHT_RETRY_MS, 0);
}

static void queue(struct agent_preflight *p)
{
    if (p->busy || p->closing || !p->wanted)
        return;
    p->cur = p->next;
    p->again = false;
    p->busy = uv_queue_work(p->loop, &p->work, run_work, after_work) == 0;
}

void agent_preflight_start(struct agent_preflight *p, const struct preflight_inputs *in)
{
    p->next = *in;
    p->wanted = true;
    p->last = false;
    p->again = p->busy;
    uv_timer_stop(&p->retry);
    queue(p);
}

void agent_preflight_settle(struct agent_preflight *p)
{
    if (!p->busy || !p->wanted) {
        agent_preflight_stop(p);
        return;
    }
    p->last = true;
    if (!p->closing)
        uv_timer_stop(&p->retry);
}

void agent_preflight_stop(struct agent_preflight *p)
{
    p->wanted = false;
    p->last = false;
    if (!p->closing)
        uv_timer_stop(&p->retry);
}

void agent_preflight_close(struct agent_preflight *p)
{
    agent_preflight_stop(p);
    p->closing = true;
    if (p->busy) /* an import check must not hold the loop's end (and the agent's exit) until its deadline */
        preflight_python_abort();
    uv_close((uv_handle_t *)&p->retry, NULL);
}
