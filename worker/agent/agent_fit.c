/*
 * agent_fit.c: the pre-flight glue: what the job a WELCOME carries asks of
 * this node (agent_preflight.h runs the checks), the verdict sent up as
 * PREFLIGHT, and its checkpoint report refreshed.
 */

#include "worker/agent/agent_internal.h"

#include <errno.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "common/log.h"

void agent__on_preflight_done(struct agent_preflight *p, bool fit, const char *reason)
{
    struct agent *a = p->data;
    if (a->link != LINK_JOINED)
        return;
    struct proto_msg m;
    agent__msg_init(&m, PROTO_PREFLIGHT);
    m.u.preflight.fit = fit;
    m.u.preflight.trainer = a->trainer;
    snprintf(m.u.preflight.reason, sizeof(m.u.preflight.reason), "%s", fit ? "" : reason);
    proto_text_sanitize(m.u.preflight.reason);
    m.u.preflight.has_checkpoint = fit && p->res.has_checkpoint;
    if (m.u.preflight.has_checkpoint) {
        snprintf(m.u.preflight.checkpoint, sizeof(m.u.preflight.checkpoint), "%s", p->res.checkpoint);
        proto_text_sanitize(m.u.preflight.checkpoint);
    }
    if (fit && !a->have_assign && a->spec.spare_nodes > 0)
        agent__keep_spare_unassigned(a);
    bool same = a->preflight_logged && strcmp(a->preflight_said, m.u.preflight.reason) == 0;
    if (!same) {
        if (fit)
            log_info("pre-flight checks pass");
        else
            log_warn("unfit for the job: %s (checking again every %d s)", reason, PREFLIGHT_RETRY_MS / 1000);
    }
    /* a fit node checks again only to follow its latest checkpoint: musterd hears of changes */
    if (same && fit && a->preflight_had_ckpt == (bool)m.u.preflight.has_checkpoint &&
        strcmp(a->preflight_ckpt, m.u.preflight.checkpoint) == 0)
        return;
    snprintf(a->preflight_said, sizeof(a->preflight_said), "%s", m.u.preflight.reason);
    snprintf(a->preflight_ckpt, sizeof(a->preflight_ckpt), "%s", m.u.preflight.checkpoint);
    a->preflight_had_ckpt = m.u.preflight.has_checkpoint;
    a->preflight_logged = true;
    agent__send_to_daemon(a, &m);
}

/* The ranks are muster-train when the program they run is (docs/rank-env.md). */
bool agent__runs_trainer(const struct agent *a, const struct job_spec *spec)
{
    bool from_job;
    char **argv = agent__rank_command(a, spec, &from_job);
    const char *prog = argv && argv[0] ? argv[0] : "";
    const char *base = strrchr(prog, '/');
    bool trainer = strcmp(base ? base + 1 : prog, "muster-train") == 0;
    if (from_job)
        cmdline_free(argv);
    return trainer;
}

/* What a pre-flight of spec checks on this node (the clock aside). */
static void preflight_inputs_of(struct agent *a, const struct job_spec *spec, struct preflight_inputs *in)
{
    memset(in, 0, sizeof(*in));
    in->spec = *spec;
    a->trainer = agent__runs_trainer(a, spec);
    in->trainer = a->trainer;
    in->kind = a->cfg->devices.kind;
    in->ndevices = a->cfg->devices.n;
    memcpy(in->devices, a->cfg->devices.ids, sizeof(in->devices));
    bool from_job;
    char **argv = agent__rank_command(a, spec, &from_job);
    int argc = 0;
    while (argv && argv[argc])
        argc++;
    if (argc == 0 || cmdline_from_argv(argc, argv, in->cmd, sizeof(in->cmd)) != 0)
        in->cmd[0] = in->cmd[1] = '\0';
    if (from_job)
        cmdline_free(argv);
    agent__python_hook_path(a, spec, a->trainer, in->python_path, sizeof(in->python_path));
    snprintf(in->node, sizeof(in->node), "%s", a->cfg->node);
    in->user = &a->cfg->rank_user;
}

/* The pre-flight HELLO promised, of the job WELCOME carries. */
void agent__start_preflight(struct agent *a, const struct proto_welcome *w)
{
    static struct preflight_inputs in; /* large; the loop thread's alone */
    struct job_spec spec;
    char err[PREFLIGHT_WHY_MAX];
    a->preflight_logged = false;
    if (!w->job || job_spec_from_json(w->job, "WELCOME", &spec, err, sizeof(err)) != 0) {
        if (!w->job)
            snprintf(err, sizeof(err), "musterd sent no job to check");
        a->trainer = false;
        agent__on_preflight_done(&a->pf, !w->job, err);
        return;
    }
    memckpt_welcome(&a->mem, &spec); /* its list goes from the first heartbeat: musterd waits for every member's */
    memdrain_job(&a->drain, &spec);  /* the drained ones are listed first: a node lost with its buddy needs them */
    if (!a->have_assign && spec.spare_nodes > 0)
        a->spec = spec; /* the job a spare node's warm spare process starts from (agent__keep_spare_unassigned) */
    preflight_inputs_of(a, &spec, &in);
    if (w->time_ms) {
        int64_t now = agent__wall_ms();
        in.have_clock = true;
        in.rtt_ms = now - a->hello_wall_ms;
        in.skew_ms = now - (int64_t)w->time_ms;
    }
    agent_preflight_start(&a->pf, &in);
}

/*
 * A generation is over (COMMAND park or stop) and the job names
 * checkpoint_latest: the node checks again and reports the latest checkpoint
 * it has now, which musterd compares before the next generation starts.
 */
void agent__recheck_checkpoint(struct agent *a)
{
    static struct preflight_inputs in;
    if (!a->have_assign || !a->spec.checkpoint_latest[0])
        return;
    preflight_inputs_of(a, &a->spec, &in);
    a->preflight_logged = false; /* the report goes out even when it is what it was */
    agent_preflight_start(&a->pf, &in);
}
