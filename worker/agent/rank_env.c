#include "worker/agent/rank_env.h"

#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/cmdline.h"

/* The variables the agent owns: a parent entry of the same name is dropped. */
static const char *const owned[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
    "ROLE_NAME", "ROLE_RANK", "ROLE_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS", "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE", "MUSTER_GENERATION", "MUSTER_NODE", "MUSTER_CTL_FD", "CUDA_VISIBLE_DEVICES",
    "MUSTER_RANK_DIR", "MUSTER_STACKS_SIGNAL", "CUDA_DEVICE_ORDER",
};
#define NOWNED (sizeof(owned) / sizeof(owned[0]))

static int has_name(const char *entry, const char *name)
{
    size_t n = strlen(name);
    return strncmp(entry, name, n) == 0 && entry[n] == '=';
}

static int is_owned(const char *entry)
{
    for (size_t i = 0; i < NOWNED; i++)
        if (has_name(entry, owned[i]))
            return 1;
    return 0;
}

const char *rank_env_get(char *const *env, const char *name)
{
    for (size_t i = 0; env && env[i]; i++)
        if (has_name(env[i], name))
            return env[i] + strlen(name) + 1;
    return NULL;
}

/* Appends "name=value" to env at *n. */
static int put_var(char **env, size_t *n, const char *name, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static int put_var(char **env, size_t *n, const char *name, const char *fmt, ...)
{
    char *value;
    va_list ap;
    va_start(ap, fmt);
    int len = vasprintf(&value, fmt, ap);
    va_end(ap);
    if (len < 0) {
        env[*n] = NULL;
        return -1;
    }
    int rc = asprintf(&env[*n], "%s=%s", name, value);
    free(value);
    if (rc < 0) {
        env[*n] = NULL;
        return -1;
    }
    (*n)++;
    return 0;
}

/* "5" or "4,5,6,7": the rank's device alone, or the node's in LOCAL_RANK order. */
static void visible_list(const struct rank_identity *id, char *out, size_t cap)
{
    size_t len = 0;
    out[0] = '\0';
    if (!id->visible || id->nvisible == 0) {
        snprintf(out, cap, "%" PRIu32, id->device);
        return;
    }
    for (uint32_t i = 0; i < id->nvisible && i < PROTO_MAX_LOCAL_RANKS && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s%" PRIu32, i ? "," : "", id->visible[i]);
}

char **rank_env_build(char *const *parent, const struct rank_identity *id)
{
    size_t np = 0;
    while (parent && parent[np])
        np++;
    char **env = calloc(np + NOWNED + 1 /* OMP_NUM_THREADS */ + 1 /* PYTHONPATH */ + 1 /* TORCH_FR_BUFFER_SIZE */ + 1,
                        sizeof(char *));
    if (!env)
        return NULL;
    size_t n = 0;
    const int hook = id->python_path && id->python_path[0];
    for (size_t i = 0; i < np; i++) {
        if (is_owned(parent[i]) || (hook && has_name(parent[i], "PYTHONPATH")))
            continue;
        if (!(env[n++] = strdup(parent[i])))
            goto oom;
    }
    /* Every name below is in owned[], OMP_NUM_THREADS or PYTHONPATH, which size env. */
    if (put_var(env, &n, "RANK", "%" PRIu32, id->rank) || put_var(env, &n, "LOCAL_RANK", "%" PRIu32, id->local_rank) ||
        put_var(env, &n, "WORLD_SIZE", "%" PRIu32, id->world_size) ||
        put_var(env, &n, "LOCAL_WORLD_SIZE", "%" PRIu32, id->local_world_size) ||
        put_var(env, &n, "GROUP_RANK", "%" PRIu32, id->node_rank) ||
        put_var(env, &n, "GROUP_WORLD_SIZE", "%" PRIu32, id->nnodes) ||
        put_var(env, &n, "ROLE_NAME", "%s", "default") || /* torchrun's role when none is named */
        put_var(env, &n, "ROLE_RANK", "%" PRIu32, id->rank) ||
        put_var(env, &n, "ROLE_WORLD_SIZE", "%" PRIu32, id->world_size) ||
        put_var(env, &n, "MASTER_ADDR", "%s", id->master_addr ? id->master_addr : "") ||
        put_var(env, &n, "MASTER_PORT", "%" PRIu32, id->master_port) ||
        put_var(env, &n, "TORCHELASTIC_RESTART_COUNT", "%" PRIu32, id->restart_count) ||
        put_var(env, &n, "TORCHELASTIC_MAX_RESTARTS", "%" PRIu32, id->max_restarts) ||
        put_var(env, &n, "TORCHELASTIC_RUN_ID", "%s", id->run_id ? id->run_id : "") ||
        (id->error_file && id->error_file[0] &&
         put_var(env, &n, "TORCHELASTIC_ERROR_FILE", "%s", id->error_file)) ||
        put_var(env, &n, "MUSTER_GENERATION", "%" PRIu64, id->generation) ||
        put_var(env, &n, "MUSTER_NODE", "%s", id->node ? id->node : "") ||
        put_var(env, &n, "MUSTER_CTL_FD", "%d", RANK_CTL_FD))
        goto oom;
    /* The ordinals are NVML's (the agent's discovery), which is PCI bus order; CUDA's
     * default order (fastest first) can differ, so it is made the same. A cpu rank sees none. */
    char visible[PROTO_MAX_LOCAL_RANKS * 11] = "";
    if (id->kind == PROTO_DEV_GPU)
        visible_list(id, visible, sizeof(visible));
    if (put_var(env, &n, "CUDA_VISIBLE_DEVICES", "%s", visible))
        goto oom;
    if (put_var(env, &n, "CUDA_DEVICE_ORDER", "%s", "PCI_BUS_ID"))
        goto oom;
    if (id->omp_threads && !rank_env_get(parent, "OMP_NUM_THREADS") &&
        put_var(env, &n, "OMP_NUM_THREADS", "%" PRIu32, id->omp_threads))
        goto oom;
    /* The hook first, then the parent's PYTHONPATH, as the user set it. */
    const char *pp = rank_env_get(parent, "PYTHONPATH");
    if (hook && put_var(env, &n, "PYTHONPATH", "%s%s%s", id->python_path, pp && pp[0] ? ":" : "", pp ? pp : ""))
        goto oom;
    if (id->rank_dir && id->rank_dir[0] && put_var(env, &n, "MUSTER_RANK_DIR", "%s", id->rank_dir))
        goto oom;
    if (id->stacks_signal && put_var(env, &n, "MUSTER_STACKS_SIGNAL", "%d", id->stacks_signal))
        goto oom;
    if (id->fr_buffer && !rank_env_get(parent, "TORCH_FR_BUFFER_SIZE") &&
        put_var(env, &n, "TORCH_FR_BUFFER_SIZE", "%" PRIu32, id->fr_buffer))
        goto oom;
    return env;
oom:
    cmdline_free(env);
    return NULL;
}
