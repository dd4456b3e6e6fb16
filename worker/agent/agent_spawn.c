/*
 * agent_spawn.c: starting the ranks of an assignment: their directories
 * (kept for the last generations), command, environment and devices, the
 * warm spare glue (spare.h) that keeps the next process ready, and a free
 * MASTER_PORT.
 */

#include "worker/agent/agent_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uv.h>

#include "common/log.h"
#include "common/mkdirs.h"

extern char **environ;

/* mkdir -p, then the directory must be ours to write. */
int agent__make_dirs(const char *path, mode_t mode)
{
    int rc = mkdirs(path, mode);
    if (rc)
        return rc;
    return access(path, W_OK | X_OK) == 0 ? 0 : -errno;
}

/* Keeps the rank directories of the last KEEP_GENERATIONS generations up to gen. */
static void prune_generations(const struct agent *a, uint64_t gen)
{
    if (gen <= KEEP_GENERATIONS)
        return;
    /* By descriptor from the state directory down: the ranks write in these
     * trees, and a directory swapped for a link must not take the removal elsewhere. */
    int sd = open(a->state_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (sd < 0)
        return;
    uv_fs_t req;
    if (uv_fs_scandir(NULL, &req, a->state_dir, 0, NULL) < 0) {
        uv_fs_req_cleanup(&req);
        close(sd);
        return;
    }
    uv_dirent_t ent;
    while (uv_fs_scandir_next(&req, &ent) != UV_EOF) {
        uint64_t g;
        if (!rank_log_generation(ent.name, &g) || g + KEEP_GENERATIONS > gen)
            continue;
        int rc = rmtree_at(sd, ent.name);
        if (rc)
            log_warn_limited("pruning %s/%s: %s", a->state_dir, ent.name, strerror(-rc));
    }
    uv_fs_req_cleanup(&req);
    close(sd);
}

/* The rank user may pass from the configured state directory (the node's directory's parent) down to dir. */
static int grant_rank_dir(const struct agent *a, const char *dir)
{
    char base[PATH_MAX];
    snprintf(base, sizeof(base), "%s", a->state_dir);
    char *slash = strrchr(base, '/');
    if (slash && slash != base)
        *slash = '\0';
    return rank_user_grant_dir(&a->cfg->rank_user, base, dir);
}

/* <state>/<node>/gen-G/rank-R, made if missing; "" when there is no usable state directory. */
void agent__rank_dir(const struct agent *a, uint64_t gen, uint32_t rank, char *out, size_t cap)
{
    out[0] = '\0';
    if (!a->state_dir[0])
        return;
    char dir[PATH_MAX];
    if (rank_log_dir(dir, sizeof(dir), a->state_dir, gen, rank) != 0)
        return;
    int rc = agent__make_dirs(dir, 0700);
    if (rc == 0)
        rc = grant_rank_dir(a, dir);
    if (rc != 0) {
        log_warn("cannot create rank directory %s: %s; rank %u gets no error file", dir, strerror(-rc), rank);
        return;
    }
    snprintf(out, cap, "%s", dir);
}

/* PYTHONPATH's head for the ranks of spec: muster's start-up hook and client, or "" for none
 * (muster-train ranks, python_hook off, or no client beside the agent). */
void agent__python_hook_path(const struct agent *a, const struct job_spec *spec, bool trainer, char *out,
                             size_t cap)
{
    out[0] = '\0';
    if (spec->python_hook && !trainer && a->cfg->python_dir[0] &&
        (size_t)snprintf(out, cap, "%s/startup:%s", a->cfg->python_dir, a->cfg->python_dir) >= cap)
        out[0] = '\0';
}

/* The program of the ranks: the agent's command line, else the job's rank_cmd, else the agent's. */
char **agent__rank_command(const struct agent *a, const struct job_spec *spec, bool *from_job)
{
    *from_job = !a->cfg->rank_argv_pinned && cmdline_set(spec->rank_cmd);
    return *from_job ? cmdline_argv(spec->rank_cmd) : a->cfg->rank_argv;
}

/* Cores for each local rank's OpenMP threads: torchrun's OMP_NUM_THREADS, but from the cores. */
static uint32_t omp_threads(uint32_t local_ranks)
{
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    uint32_t t = cores > 0 ? (uint32_t)cores / (local_ranks ? local_ranks : 1) : 1;
    return t ? t : 1;
}

void agent__release_ranks(struct agent *a)
{
    for (uint32_t i = 0; i < a->nranks; i++) {
        if (a->ranks[i])
            rank_release(a->ranks[i]);
        a->ranks[i] = NULL;
    }
    a->nranks = 0;
}

/* A rank of the held assignment's slot i that rejoined it in place. */
bool agent__kept(const struct agent *a, uint32_t i)
{
    const struct agent_rank *r = i < a->nranks ? a->ranks[i] : NULL;
    return r && r->running && !r->stopping && r->generation == a->assign.generation;
}

/* A rank's ASSIGN, then its generation's unique id when it came already. */
void agent__hand_assignment(struct agent *a, struct agent_rank *r, const struct proto_msg *assign_msg)
{
    rank_send(r, assign_msg);
    if (a->have_uid && a->uid.generation == assign_msg->u.assign.generation) {
        struct proto_msg u;
        agent__msg_init(&u, PROTO_UNIQUE_ID);
        u.u.unique_id = a->uid;
        rank_send(r, &u);
    }
}

/* The devices a rank of the held assignment sees, in LOCAL_RANK order (torchrun's view), into
 * out[PROTO_MAX_LOCAL_RANKS]; 0 = its own alone (muster-train, or the job's visible_devices "own"). */
static uint32_t visible_devices(const struct agent *a, uint32_t *out)
{
    const struct proto_assign *as = &a->assign;
#ifdef MUSTER_MUTANT_ONE_DEVICE
    /* A broken device contract for `make check-mutants` only (tests/mutants.sh): one device per rank, always. */
    return 0;
#endif
    if (a->cfg->devices.kind != PROTO_DEV_GPU || strcmp(a->spec.visible_devices, "node") != 0 ||
        agent__runs_trainer(a, &a->spec))
        return 0;
    for (uint32_t j = 0; j < as->nranks; j++) /* local ranks are 0..nranks-1, each once (proto_check) */
        out[as->ranks[j].local_rank] = as->ranks[j].device;
    return as->nranks;
}

/* The identity of slot i of the held assignment; visible[PROTO_MAX_LOCAL_RANKS] holds its devices. */
static struct rank_identity slot_identity(const struct agent *a, uint32_t i, const char *error_file,
                                          const char *dir, const char *pypath, uint32_t *visible)
{
    const struct proto_assign *as = &a->assign;
    const struct proto_rank_slot *slot = &as->ranks[i];
    const struct job_spec *spec = &a->spec;
    struct rank_identity id = {
        .rank = slot->rank,
        .local_rank = slot->local_rank,
        .world_size = as->world_size,
        .local_world_size = as->nranks,
        .node_rank = as->node_rank,
        .nnodes = as->nnodes,
        .generation = as->generation,
        .restart_count = as->restart_count,
        .max_restarts = (uint32_t)spec->max_restarts,
        .run_id = spec->name,
        .master_addr = as->master_addr,
        .master_port = as->master_port,
        .error_file = error_file,
        .omp_threads = omp_threads(as->nranks),
        .node = a->cfg->node,
        .python_path = pypath,
        .rank_dir = dir,
        .stacks_signal = pypath[0] && dir[0] ? STACKS_SIGNAL : 0,
        .fr_buffer = pypath[0] && dir[0] ? (uint32_t)spec->flight_recorder : 0,
        .kind = a->cfg->devices.kind,
        .device = slot->device,
        .visible = visible,
        .nvisible = visible_devices(a, visible),
    };
    return id;
}

/* After the ranks started: a warm spare for the next one when the job wants it and can have it. */
static void keep_spare(struct agent *a, char *const *argv, const char *pypath)
{
    char why[sizeof(a->spare_said)];
    if (!spare_usable(&a->spec, argv, pypath, why, sizeof(why))) {
        if (why[0] && strcmp(why, a->spare_said) != 0)
            log_warn("warm_spares is off for this job: %s", why);
        snprintf(a->spare_said, sizeof(a->spare_said), "%s", why);
        spare_drop(&a->spare);
        return;
    }
    a->spare_said[0] = '\0';
    uint32_t visible[PROTO_MAX_LOCAL_RANKS];
    struct rank_identity id = slot_identity(a, 0, "", "", pypath, visible);
    spare_want(&a->spare, argv, rank_env_build(environ, &id), a->spec.warm_imports);
}

/* A hot spare node (job key spare_nodes) holds no ranks yet: once its
 * pre-flight passed, its warm spare process starts from the WELCOME's job,
 * so that the ranks it takes over start warm. */
void agent__keep_spare_unassigned(struct agent *a)
{
    bool own_argv;
    char **argv = agent__rank_command(a, &a->spec, &own_argv);
    char pypath[2 * sizeof(a->cfg->python_dir) + 16];
    agent__python_hook_path(a, &a->spec, agent__runs_trainer(a, &a->spec), pypath, sizeof(pypath));
    if (argv)
        keep_spare(a, argv, pypath);
    if (own_argv)
        cmdline_free(argv);
}

/* Spawns one rank per slot of the held assignment that has none (a rank that
 * rejoined in place keeps its slot), the warm spare becoming the first one when
 * there is one; no other rank may be running. */
void agent__spawn_all(struct agent *a)
{
    const struct proto_assign *as = &a->assign;
    if (memrep_waits(&a->rep, as))
        return; /* its memory checkpoint comes from the buddy first: spawn_pending stays */
    if (memdrain_waits(&a->drain, as))
        return; /* or from its drained copy in checkpoint_dir */
    a->spawn_pending = false;
    for (uint32_t i = 0; i < a->nranks; i++) {
        if (!agent__kept(a, i) && a->ranks[i]) {
            rank_release(a->ranks[i]);
            a->ranks[i] = NULL;
        }
    }
    const struct job_spec *spec = &a->spec;
    bool own_argv;
    char **argv = agent__rank_command(a, spec, &own_argv);
    if (a->state_dir[0])
        prune_generations(a, as->generation);
    char pypath[2 * sizeof(a->cfg->python_dir) + 16];
    agent__python_hook_path(a, spec, agent__runs_trainer(a, spec), pypath, sizeof(pypath));
    static struct proto_msg assign_msg;
    agent__msg_init(&assign_msg, PROTO_ASSIGN);
    assign_msg.u.assign = *as;
    assign_msg.u.assign.has_memckpt = 0; /* the agent's to act on, not the ranks' */
    assign_msg.u.assign.memckpt_from[0] = '\0';
    assign_msg.u.assign.memckpt_drained = 0;
    bool any_kept = false;
    for (uint32_t i = 0; i < a->nranks; i++)
        any_kept |= agent__kept(a, i);
    memckpt_ready(&a->mem, as, a->ranks, a->nranks, any_kept);
    for (uint32_t i = 0; i < as->nranks; i++) {
        const struct proto_rank_slot *slot = &as->ranks[i];
        if (agent__kept(a, i))
            continue;
        char dir[PATH_MAX], error_file[PATH_MAX + 16] = "";
        agent__rank_dir(a, as->generation, slot->rank, dir, sizeof(dir));
        if (dir[0]) {
            snprintf(error_file, sizeof(error_file), "%s/error.json", dir);
            unlink(error_file);
        }
        uint32_t visible[PROTO_MAX_LOCAL_RANKS];
        struct rank_identity id = slot_identity(a, i, error_file, dir, pypath, visible);
        struct rank_callbacks cb = {.data = a, .on_msg = agent__rank_on_msg, .on_exit = agent__rank_on_exit};
        char **env = rank_env_build(environ, &id);
        if (a->mem.on)
            env = memckpt_env(env, a->mem.dir);
        int err_code = UV_ENOMEM;
        struct agent_rank *r = env && argv ? spare_take(&a->spare, argv, env) : NULL;
        const bool warm = r != NULL;
        if (warm)
            rank_take_up(r, &a->all, &id, &cb);
        else if (env && argv) {
            char **run = rank_user_argv(&a->cfg->rank_user, argv);
            r = run ? rank_spawn(a->loop, &a->all, run, env, &id, &cb, &err_code) : NULL;
            cmdline_free(run);
        }
        cmdline_free(env);
        a->ranks[i] = r;
        if (!r) {
            char why[PROTO_REASON_MAX], cmd[200] = "";
            if (argv)
                cmdline_describe(own_argv ? spec->rank_cmd : "", cmd, sizeof(cmd));
            snprintf(why, sizeof(why), "cannot run %s%s%s: %s (%s)", argv ? "'" : "the rank command",
                     argv ? argv[0] : "", argv ? "'" : "", uv_strerror(err_code),
                     own_argv ? "the job's rank_cmd" : a->cfg->rank_argv_pinned ? "the agent's command line"
                                                                               : "the agent's rank command");
            log_error("cannot start rank %u: %s", slot->rank, why);
            agent__send_rank_exit(a, as->generation, slot->rank, 127, 0, why, cmd, false);
            continue;
        }
        snprintf(r->error_file, sizeof(r->error_file), "%s", error_file);
        /* Its output is read from the next loop iteration on: no line comes before the log is open. */
        rank_log_open(&r->log, dir, slot->rank, a->cfg->log_max_bytes);
        log_info("started rank %u (local rank %u, %s %u, pid %d) for generation %" PRIu64 "%s", slot->rank,
                 slot->local_rank, a->cfg->devices.kind == PROTO_DEV_GPU ? "gpu" : "cpu", slot->device, r->pid,
                 as->generation, warm ? ": the warm spare took it up" : "");
        agent__hand_assignment(a, r, &assign_msg);
    }
    a->nranks = as->nranks;
    keep_spare(a, argv, pypath);
    if (own_argv)
        cmdline_free(argv);
}

/* ---- MASTER_PORT ------------------------------------------------------- */

/* Free: a listener could bind it now, on IPv4 and (where there is IPv6) on IPv6. */
static bool port_free(uint16_t port)
{
    int fams[2] = {AF_INET, AF_INET6};
    for (int i = 0; i < 2; i++) {
        int fd = socket(fams[i], SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (fd < 0)
            continue; /* no such family here */
        int one = 1;
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
        struct sockaddr_storage ss;
        memset(&ss, 0, sizeof(ss));
        socklen_t len;
        if (fams[i] == AF_INET) {
            struct sockaddr_in *in = (struct sockaddr_in *)&ss;
            in->sin_family = AF_INET;
            in->sin_port = htons(port);
            len = sizeof(*in);
        } else {
            struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
            in6->sin6_family = AF_INET6;
            in6->sin6_port = htons(port);
            setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof(one));
            len = sizeof(*in6);
        }
        int rc = bind(fd, (struct sockaddr *)&ss, len);
        int e = errno;
        close(fd);
        if (rc != 0 && e == EADDRINUSE)
            return false;
    }
    return true;
}

/*
 * A port of master_port_range that is free and is not the current
 * generation's (whose rank 0 may still hold it while it is being stopped).
 * Reported in HELLO and every heartbeat; musterd gives the one that rank 0's
 * node reported last to the next generation as MASTER_PORT. The candidate
 * stays while it is free; a new one is searched from a random point of the
 * range, so that jobs sharing a machine (several agents, test clusters) do
 * not all offer the range's first port: a rank binds it only seconds later,
 * after its imports, and two jobs on one port would meet in one store.
 */
void agent__refresh_free_port(struct agent *a)
{
    /* The running generation's port, while any rank (its rank 0 among them) still lives. */
    uint32_t skip = a->have_assign && agent__any_running(a) ? a->assign.master_port : 0, found = 0;
    uint32_t lo = a->cfg->port_lo, span = lo ? (uint32_t)a->cfg->port_hi - lo + 1 : 0;
    if (a->free_port && a->free_port != skip && port_free((uint16_t)a->free_port)) {
        found = a->free_port;
    } else if (span) {
        uint32_t start = agent__rng_next(a) % span;
        for (uint32_t k = 0; k < span && !found; k++) {
            uint32_t p = lo + (start + k) % span;
            if (p != skip && port_free((uint16_t)p))
                found = p;
        }
    }
    if (!found && !a->port_warned)
        log_warn("no free port in master_port_range %u-%u (every one is in use%s); this node cannot hold "
                 "rank 0 until one is free",
                 a->cfg->port_lo, a->cfg->port_hi, skip ? ", or is the running generation's" : "");
    else if (found && a->port_warned)
        log_info("port %u of master_port_range is free again", found);
    a->port_warned = !found;
    a->free_port = found;
}
