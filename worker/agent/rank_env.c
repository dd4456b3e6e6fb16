#include "worker/agent/rank_env.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The variables the agent owns; same order as the values built below. */
static const char *const owned[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MUSTER_GENERATION",
    "MUSTER_NODE", "MUSTER_CTL_FD", "CUDA_VISIBLE_DEVICES",
};
#define NOWNED (sizeof(owned) / sizeof(owned[0]))

static int is_owned(const char *entry)
{
    for (size_t i = 0; i < NOWNED; i++) {
        size_t n = strlen(owned[i]);
        if (strncmp(entry, owned[i], n) == 0 && entry[n] == '=')
            return 1;
    }
    return 0;
}

char **rank_env_build(char *const *parent, const struct rank_identity *id)
{
    size_t np = 0;
    while (parent && parent[np])
        np++;
    char **env = calloc(np + NOWNED + 1, sizeof(char *));
    if (!env)
        return NULL;
    size_t n = 0;
    for (size_t i = 0; i < np; i++) {
        if (is_owned(parent[i]))
            continue;
        if (!(env[n++] = strdup(parent[i])))
            goto oom;
    }
    char values[NOWNED][96];
    snprintf(values[0], sizeof(values[0]), "%" PRIu32, id->rank);
    snprintf(values[1], sizeof(values[1]), "%" PRIu32, id->local_rank);
    snprintf(values[2], sizeof(values[2]), "%" PRIu32, id->world_size);
    snprintf(values[3], sizeof(values[3]), "%" PRIu32, id->local_world_size);
    snprintf(values[4], sizeof(values[4]), "%" PRIu64, id->generation);
    snprintf(values[5], sizeof(values[5]), "%s", id->node ? id->node : "");
    snprintf(values[6], sizeof(values[6]), "%d", RANK_CTL_FD);
    if (id->kind == PROTO_DEV_GPU)
        snprintf(values[7], sizeof(values[7]), "%" PRIu32, id->device);
    else
        values[7][0] = '\0';
    for (size_t i = 0; i < NOWNED; i++) {
        if (asprintf(&env[n], "%s=%s", owned[i], values[i]) < 0) {
            env[n] = NULL;
            goto oom;
        }
        n++;
    }
    return env;
oom:
    rank_strv_free(env);
    return NULL;
}

char **rank_argv_split(const char *cmd)
{
    size_t cap = strlen(cmd) / 2 + 2;
    char **argv = calloc(cap, sizeof(char *));
    if (!argv)
        return NULL;
    size_t n = 0;
    const char *p = cmd;
    for (;;) {
        p += strspn(p, " \t");
        if (*p == '\0')
            break;
        size_t len = strcspn(p, " \t");
        if (!(argv[n++] = strndup(p, len))) {
            rank_strv_free(argv);
            return NULL;
        }
        p += len;
    }
    if (n == 0) {
        free(argv);
        return NULL;
    }
    return argv;
}

void rank_strv_free(char **v)
{
    if (!v)
        return;
    for (size_t i = 0; v[i]; i++)
        free(v[i]);
    free(v);
}
