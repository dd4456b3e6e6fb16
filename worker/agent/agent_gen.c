/*
 * agent_gen.c: generations: an ASSIGN checked against the held one (ranks
 * rejoined in place or respawned, older generations ignored) and the
 * generation's unique id handed to the ranks.
 */

#include "worker/agent/agent_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"

bool agent__stale(struct agent *a, const char *what, uint64_t gen)
{
    if (gen >= a->cur_gen)
        return false;
    log_debug("%s of generation %" PRIu64 " from the daemon ignored (current %" PRIu64 ")", what, gen, a->cur_gen);
    return true;
}

void agent__send_error(struct agent *a, const char *code, const char *reason)
{
    struct proto_msg m;
    agent__msg_init(&m, PROTO_ERROR);
    snprintf(m.u.error.code, sizeof(m.u.error.code), "%s", code);
    snprintf(m.u.error.reason, sizeof(m.u.error.reason), "%s", reason);
    agent__send_to_daemon(a, &m);
}

static int check_assign(const struct agent *a, const struct proto_assign *as, struct job_spec *spec, char *err,
                        size_t errlen)
{
    if (!as->job || job_spec_from_json(as->job, "ASSIGN job", spec, err, errlen) != 0) {
        if (!as->job)
            snprintf(err, errlen, "ASSIGN carries no job");
        return -1;
    }
    if (as->nranks == 0 || as->nranks > a->cfg->devices.n) {
        snprintf(err, errlen, "ASSIGN gives %u ranks to node %s, which has %u devices", as->nranks, a->cfg->node,
                 a->cfg->devices.n);
        return -1;
    }
    for (uint32_t i = 0; i < as->nranks; i++) {
        const struct proto_rank_slot *s = &as->ranks[i];
        if (!devices_contains(&a->cfg->devices, s->device) || s->local_rank >= as->nranks ||
            s->rank >= as->world_size) {
            snprintf(err, errlen, "ASSIGN slot %u (rank %u, local rank %u, device %u) does not fit node %s", i,
                     s->rank, s->local_rank, s->device, a->cfg->node);
            return -1;
        }
    }
    return 0;
}

static bool same_layout(const struct proto_assign *x, const struct proto_assign *y)
{
    return x->generation == y->generation && x->world_size == y->world_size && x->nranks == y->nranks &&
           memcmp(x->ranks, y->ranks, x->nranks * sizeof(x->ranks[0])) == 0;
}

/*
 * The held assignment is a new generation of the same slots (local ranks and
 * devices): each rank that said it can rejoin (heartbeat "rejoin") and runs
 * on gets the new ASSIGN and becomes that generation's rank of its slot (its
 * global rank may change), its output going to the new generation's log
 * from now on. Returns how many did.
 */
static uint32_t rejoin_ranks(struct agent *a)
{
    const struct proto_assign *as = &a->assign;
    static struct proto_msg assign_msg;
    uint32_t n = 0;
    agent__msg_init(&assign_msg, PROTO_ASSIGN);
    assign_msg.u.assign = *as;
    for (uint32_t i = 0; i < as->nranks; i++) {
        struct agent_rank *r = i < a->nranks ? a->ranks[i] : NULL;
        if (!r || !r->running || r->stopping || !r->beat.rejoin || !r->ctl || r->local_rank != as->ranks[i].local_rank ||
            !agent__responsive(a, r))
            continue;
        if (r->rank != as->ranks[i].rank)
            log_info("rank %u (pid %d) becomes rank %u of %u", r->rank, r->pid, as->ranks[i].rank, as->world_size);
        r->rejoined_from = r->generation;
        r->generation = as->generation;
        r->rank = as->ranks[i].rank;
        r->beat.rank = r->rank;
        /* Until the rank's own heartbeat of this generation: nothing restored yet (its last
         * report was of the generation before, and the daemon takes rank 0's as this one's). */
        r->beat.restore_from = PROTO_RESTORE_NONE;
        r->beat.restore_step = 0;
        r->beat.yielded = 0;
        char dir[PATH_MAX];
        agent__rank_dir(a, as->generation, r->rank, dir, sizeof(dir));
        rank_log_close(&r->log);
        rank_log_open(&r->log, dir, r->rank, a->cfg->log_max_bytes);
        agent__hand_assignment(a, r, &assign_msg);
        log_info("rank %u (pid %d) rejoins in place for generation %" PRIu64, r->rank, r->pid, as->generation);
        n++;
    }
    return n;
}

void agent__on_assign(struct agent *a, struct proto_assign *as)
{
    if (agent__stale(a, "ASSIGN", as->generation))
        return;
    struct job_spec spec;
    char err[300];
    if (check_assign(a, as, &spec, err, sizeof(err)) != 0) {
        log_error("refusing assignment of generation %" PRIu64 ": %s", as->generation, err);
        agent__send_error(a, PROTO_REJECT_BAD_REQUEST, err);
        return;
    }
    a->cur_gen = as->generation;
    agent_preflight_settle(&a->pf); /* a check under way still reports: musterd waits for it */
    if (a->have_uid && a->uid.generation < as->generation)
        a->have_uid = false;
    if (agent__ranks_live(a) && same_layout(&a->assign, as)) {
        log_info("generation %" PRIu64 ": ranks already running; keeping them", as->generation);
        /* Rank 0 sends its id once: a daemon that restarted before handing it
         * out gets it again, or the generation never forms. */
        if (a->have_made_uid && a->made_uid.generation == as->generation &&
            !(a->have_uid && a->uid.generation == as->generation)) {
            log_info("sending rank 0's unique id of generation %" PRIu64 " again (never handed out)", as->generation);
            struct proto_msg m;
            agent__msg_init(&m, PROTO_UNIQUE_ID);
            m.u.unique_id = a->made_uid;
            agent__send_to_daemon(a, &m);
        }
        return;
    }
    /* Ranks that can rejoin keep their process when their slot (local rank and
     * device) stays; the global rank and world size may change (the job grew
     * or shrank: the rank re-slices its state). */
    bool same_slots = a->have_assign && a->assign.nranks == as->nranks;
    for (uint32_t i = 0; same_slots && i < as->nranks; i++)
        same_slots = a->assign.ranks[i].local_rank == as->ranks[i].local_rank &&
                     a->assign.ranks[i].device == as->ranks[i].device;
    if (a->have_assign)
        json_decref(a->assign.job);
    a->assign = *as;
    json_incref(a->assign.job);
    a->have_assign = true;
    a->spec = spec;
    memckpt_job(&a->mem, &a->spec);
    int shared = a->cfg->rank_user.set ? memckpt_share(&a->mem, a->cfg->rank_user.gid) : 0;
    if (shared) { /* ranks that cannot write it get none, rather than one others may */
        log_error("memory checkpoint directory %s: cannot give it to rank_group %u: %s; the ranks get no %s",
                  a->mem.dir, (unsigned)a->cfg->rank_user.gid, strerror(-shared), MEMCKPT_ENV);
        memckpt_close(&a->mem);
    }
    memrep_job(&a->rep, &a->spec, as->nnodes);
    memdrain_job(&a->drain, &a->spec);
    uint32_t rejoined = same_slots ? rejoin_ranks(a) : 0;
    log_info("generation %" PRIu64 ": %u rank(s) of world size %u on this node (ranks %u..%u)%s", as->generation,
             as->nranks, as->world_size, as->ranks[0].rank, as->ranks[as->nranks - 1].rank,
             rejoined == as->nranks ? ", every one rejoining in place" : rejoined ? ", some rejoining in place" : "");
    for (struct agent_rank *r = a->all; r; r = r->next)
        if (r->generation != as->generation)
            rank_stop(r, as->generation, (uint64_t)a->spec.stop_grace_ms);
    a->spawn_pending = true;
    if (!agent__any_outgoing(a))
        agent__spawn_all(a);
    agent__notify_joined(a);
}

void agent__on_unique_id(struct agent *a, const struct proto_unique_id *u)
{
    if (agent__stale(a, "UNIQUE_ID", u->generation))
        return;
    if (a->have_uid && a->uid.generation == u->generation && memcmp(a->uid.id, u->id, PROTO_UID_LEN) == 0) {
        log_debug("unique id of generation %" PRIu64 " again (sent again after a resumed session); ranks have it",
                  u->generation);
        return;
    }
    a->uid = *u;
    a->have_uid = true;
    struct proto_msg m;
    agent__msg_init(&m, PROTO_UNIQUE_ID);
    m.u.unique_id = *u;
    unsigned n = 0;
    for (uint32_t i = 0; i < a->nranks; i++) {
        struct agent_rank *r = a->ranks[i];
        if (r && r->running && r->generation == u->generation) {
            rank_send(r, &m);
            n++;
        }
    }
    log_info("unique id of generation %" PRIu64 " handed to %u rank(s)", u->generation, n);
}
