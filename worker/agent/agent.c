/*
 * agent.c: the agent's life: agent_run sets the loop up (state directory,
 * GPUs, timers, signals), the watchdog tick fences ranks when the lease runs
 * out and abandons slow handshakes, and shutdown waits for the ranks and the
 * spare before the loop closes. The rest of the agent is in the files that
 * share agent_internal.h (listed there).
 */

#include "worker/agent/agent_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <math.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <uv.h>

#include "common/log.h"
#include "common/mkdirs.h"
#include "common/notify.h"

void agent__msg_init(struct proto_msg *m, enum proto_type type)
{
    memset(m, 0, sizeof(*m));
    m->type = type;
}

/* ---- watchdog: lease, handshake deadlines ------------------------------- */

/* Ranks that never spoke are running once their process has lived RANK_SILENT_GRACE_MS. */
static void settle_silent_ranks(struct agent *a, uint64_t now)
{
    bool news = false;
    for (uint32_t i = 0; i < a->nranks; i++) {
        struct agent_rank *r = a->ranks[i];
        if (r && r->running && !r->reaped && !r->stopping && !r->spoke &&
            r->beat.state == PROTO_RANK_STARTING && now - r->spawned_ms >= RANK_SILENT_GRACE_MS) {
            r->beat.state = PROTO_RANK_RUNNING;
            r->beat.silent = 1;
            r->beat.loss = NAN;
            news = true;
            log_info("rank %u (pid %d) is running (alive %d ms, silent: no progress reports)", r->rank, r->pid,
                     RANK_SILENT_GRACE_MS);
        }
    }
    if (news)
        agent__on_beat_timer(&a->beat_timer);
}

static void on_tick(uv_timer_t *t)
{
    struct agent *a = t->data;
    if (a->exiting)
        return;
    uint64_t now = uv_now(a->loop);
    settle_silent_ranks(a, now);
    uint64_t silent = now - a->last_rx;
    if (a->resume_until && now >= a->resume_until) {
        log_warn("could not resume the session with the daemon at %s within heartbeat_timeout_ms (%u ms); "
                 "rejoining", a->daemon, a->heartbeat_timeout_ms);
        agent__drop_stalled(a);
    }
    /* Several daemons: one that does not answer (stopped, or its host gone) gives way to the next soon. */
    uint64_t handshake_ms = a->daemons.n > 1 ? FOLLOW_CONNECT_MS : HANDSHAKE_TIMEOUT_MS;
    if (a->link == LINK_CONNECTING && now - a->link_since > handshake_ms) {
        a->last_connect_err = UV_ETIMEDOUT;
        fconn_close(a->conn);
        a->conn = NULL;
        agent__try_next_addr(a);
    } else if ((a->link == LINK_HELLO || a->link == LINK_AUTH) && now - a->link_since > handshake_ms) {
        agent__link_lost(a, "handshake timed out");
        daemon_list_next(&a->daemons);
        agent__use_daemon(a);
    } else if (a->link == LINK_JOINED && silent >= a->lease_ms) {
        char why[160];
        snprintf(why, sizeof(why), "no frame from the daemon for %" PRIu64 " ms (lease %u ms)", silent, a->lease_ms);
        agent__link_lost(a, why);
    } else if (a->link == LINK_JOINED && a->session && a->unanswered_since &&
               now - a->unanswered_since >= agent__stall_ms(a)) {
        agent__link_stalled(a, now); /* a daemon that gave no session cannot take it back: wait on TCP then */
    }
    if (a->link != LINK_JOINED && silent >= a->lease_ms && agent__any_unstopped(a)) {
        log_error("SELF-FENCING: daemon at %s unreachable for %" PRIu64 " ms, longer than the lease (%u ms); "
                  "stopping the ranks of generation %" PRIu64,
                  a->daemon, silent, a->lease_ms, a->cur_gen);
        a->spawn_pending = false;
        agent__stop_all(a, a->cur_gen);
    }
}

/* ---- shutdown ---------------------------------------------------------- */

void agent__maybe_finish(struct agent *a)
{
    if (!a->exiting || a->closed || agent__any_running(a) || spare_running(&a->spare))
        return;
    a->closed = true;
    log_debug("no rank running; closing every handle");
    agent__link_close(a);
    agent__drop_stalled(a);
    if (a->gai_busy)
        uv_cancel((uv_req_t *)&a->gai);
    uv_close((uv_handle_t *)&a->retry_timer, NULL);
    uv_close((uv_handle_t *)&a->beat_timer, NULL);
    uv_close((uv_handle_t *)&a->tick_timer, NULL);
    uv_close((uv_handle_t *)&a->connect_timer, NULL);
    uv_close((uv_handle_t *)&a->stacks_timer, NULL);
    free(a->stacks);
    free(a->flights);
    ras_end(&a->ras);
    a->stacks = NULL;
    a->flights = NULL;
    agent_preflight_close(&a->pf);
    uv_close((uv_handle_t *)&a->sigterm, NULL);
    uv_close((uv_handle_t *)&a->sigint, NULL);
    agent__release_ranks(a);
    for (struct agent_rank *r = a->all; r; r = r->next)
        rank_close(r);
    spare_close(&a->spare);
    memrep_close(&a->rep, a->mem_drop);
    memdrain_close(&a->drain);
    if (a->mem_drop)
        memckpt_close(&a->mem); /* an agent stopped by a signal leaves it to the next one */
}

static void spare_gone(void *data)
{
    agent__maybe_finish(data);
}

void agent__agent_exit(struct agent *a, int code)
{
    if (a->exiting)
        return;
    a->exiting = true;
    a->exit_code = code;
    notify_send("STOPPING=1");
    a->spawn_pending = false;
    agent__link_close(a);
    uv_timer_stop(&a->retry_timer);
    agent__link_set_state(a, LINK_CLOSED);
    if (agent__any_running(a))
        log_info("stopping ranks (grace %" PRIu64 " ms)", (uint64_t)a->spec.stop_grace_ms);
    agent__stop_all(a, a->cur_gen);
    spare_stop(&a->spare);
    agent__maybe_finish(a);
}

static void on_signal(uv_signal_t *s, int signum)
{
    struct agent *a = s->data;
    if (!a->exiting) {
        log_info("received %s: stopping ranks and exiting", strsignal(signum));
        agent__agent_exit(a, 0);
        return;
    }
    log_warn("received %s again: killing ranks now", strsignal(signum));
    for (struct agent_rank *r = a->all; r; r = r->next)
        rank_kill(r);
}

/* The state directory: the configured one, else a system one, else a private one under $TMPDIR. */
static void choose_state_dir(struct agent *a)
{
    const char *tmp = getenv("TMPDIR");
    char fallback[PATH_MAX];
    snprintf(fallback, sizeof(fallback), "%s/muster-worker-%s", tmp && tmp[0] ? tmp : "/tmp", a->cfg->node);
    const char *candidates[3] = {a->cfg->state_dir[0] ? a->cfg->state_dir : NULL,
                                 a->cfg->state_dir[0] ? NULL : "/var/lib/muster-worker",
                                 a->cfg->state_dir[0] ? NULL : fallback};
    for (int i = 0; i < 3; i++) {
        if (!candidates[i])
            continue;
        /* One subdirectory per node: agents of several nodes may share a machine and a directory. */
        char dir[PATH_MAX], why[160] = "";
        int rc = snprintf(dir, sizeof(dir), "%s/%s", candidates[i], a->cfg->node) < (int)sizeof(dir)
                     ? agent__make_dirs(dir, 0700)
                     : -ENAMETOOLONG;
        /* $TMPDIR is everyone's: a muster-worker-NODE found there may be a stranger's, with links
         * planted in it. It and the node's directory must be this agent's alone. */
        if (rc == 0 && candidates[i] == fallback && dir_private(candidates[i], why, sizeof(why)) != 0) {
            log_error("state directory %s refused: %s (someone else's directory could redirect the ranks' "
                      "files); remove it or give --state-dir DIR", candidates[i], why);
            continue;
        }
        if (rc == 0 && dir_private(dir, why, sizeof(why)) != 0) {
            log_error("state directory %s refused: %s; remove it or give --state-dir DIR", dir, why);
            continue;
        }
        if (rc == 0) {
            snprintf(a->state_dir, sizeof(a->state_dir), "%s", dir);
            log_info("rank directories (error files, logs) under %s", a->state_dir);
            return;
        }
        log_warn("state directory %s: %s", candidates[i], strerror(-rc));
    }
    a->state_dir[0] = '\0';
    log_error("no usable state directory: ranks get no TORCHELASTIC_ERROR_FILE (give --state-dir DIR)");
}

/* memrep's link (memrep.h): frames to musterd, what waits on it, the ranks' files back from the buddy. */
static int rep_send(void *ctx, const struct proto_msg *m)
{
    struct agent *a = ctx;
    return a->link == LINK_JOINED ? agent__send_to_daemon(a, m) : UV_ENOTCONN;
}

static size_t rep_queued(void *ctx)
{
    struct agent *a = ctx;
    return a->conn ? a->conn->wq_bytes : 0;
}

static void rep_fetched(void *ctx)
{
    struct agent *a = ctx;
    if (a->spawn_pending && !agent__any_outgoing(a))
        agent__spawn_all(a);
}

int agent_run(const struct agent_config *cfg)
{
    uv_loop_t loop;
    int rc = uv_loop_init(&loop);
    if (rc != 0) {
        log_error("cannot create the event loop: %s", uv_strerror(rc));
        return 1;
    }
    struct agent *a = calloc(1, sizeof(*a));
    if (!a) {
        log_error("out of memory");
        uv_loop_close(&loop);
        return 1;
    }
    a->cfg = cfg;
    if (cfg->daemons.n) {
        a->daemons = cfg->daemons;
    } else {
        a->daemons.n = 1;
        snprintf(a->daemons.addr[0], sizeof(a->daemons.addr[0]), "%s", cfg->daemon);
    }
    agent__use_daemon(a);
    a->loop = &loop;
    a->rng = uv_hrtime() ^ ((uint64_t)getpid() << 32) ^ 0x9E3779B97F4A7C15ULL;
    a->heartbeat_interval_ms = 1000;
    a->lease_ms = 10000;
    a->heartbeat_timeout_ms = 5000;
    a->gai.data = a;
    job_spec_defaults(&a->spec);
    backoff_init(&a->backoff, BACKOFF_BASE_MS, BACKOFF_CAP_MS);
    choose_state_dir(a);
    agent__probe_gpus(a);
    agent_preflight_init(&a->pf, &loop, agent__on_preflight_done, a);
    spare_init(&a->spare, &loop, spare_gone, a);
    a->spare.user = &a->cfg->rank_user;
    a->spare.gpus = a->cfg->devices.kind == PROTO_DEV_GPU;
    memrep_init(&a->rep, &loop, &a->mem, cfg->node,
                &(struct memrep_link){.ctx = a, .send = rep_send, .queued = rep_queued, .fetched = rep_fetched});
    memdrain_init(&a->drain, &loop, &a->mem, cfg->node, rep_fetched, a);

    uv_timer_init(&loop, &a->retry_timer);
    uv_timer_init(&loop, &a->beat_timer);
    uv_timer_init(&loop, &a->tick_timer);
    uv_timer_init(&loop, &a->connect_timer);
    uv_timer_init(&loop, &a->stacks_timer);
    a->connect_timer.data = a->stacks_timer.data = a;
    a->ras.fd = -1; /* no RAS query (nccl_ras.h) */
    a->ras.phase = RAS_DONE;
    uv_signal_init(&loop, &a->sigterm);
    uv_signal_init(&loop, &a->sigint);
    a->retry_timer.data = a->beat_timer.data = a->tick_timer.data = a;
    a->sigterm.data = a->sigint.data = a;
    uv_signal_start(&a->sigterm, on_signal, SIGTERM);
    uv_signal_start(&a->sigint, on_signal, SIGINT);
    uv_timer_start(&a->tick_timer, on_tick, TICK_MS, TICK_MS);
    a->last_rx = uv_now(&loop);

    agent__link_set_state(a, LINK_IDLE);
    log_info("muster-worker %s: node %s, %u %s device(s), daemon %s", MUSTER_VERSION, cfg->node, cfg->devices.n,
             cfg->devices.kind == PROTO_DEV_GPU ? "gpu" : "cpu", cfg->daemon);
    uv_timer_start(&a->retry_timer, agent__on_retry_timer, 0, 0);

    uv_run(&loop, UV_RUN_DEFAULT);

    if (a->have_assign)
        json_decref(a->assign.job);
    int code = a->exit_code;
    free(a);
    rc = uv_loop_close(&loop);
    if (rc != 0) {
        log_error("internal: event loop closed with handles still open: %s", uv_strerror(rc));
        return 1;
    }
    return code;
}
