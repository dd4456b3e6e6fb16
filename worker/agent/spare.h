/*
 * spare: the warm spare of a node (job key warm_spares). A Python process
 * started ahead with the ranks' fixed environment, that imports torch,
 * torch.distributed and the job's warm_imports (clients/python/muster_spare.py)
 * and then waits, holding no device and no process group. When the agent must
 * start a rank, the spare becomes it: the agent writes the rank's argv,
 * environment and working directory to the spare's hand-off socket (its fd
 * 4) and closes it; the spare sets them and runs the script as __main__. Its
 * process, output pipes and control socket (fd 3) were the agent's from its
 * spawn, so from then on it is that rank (PID, log, exit, signals, stacks).
 *
 * The spare is spawned a moment after the ranks (SPARE_DELAY_MS), and again
 * a while after it was taken (SPARE_AGAIN_MS), so that its own start never
 * competes with the start of the ranks or of the generation it healed.
 * One that dies untaken is replaced, SPARE_MAX_DEATHS times in a row at most.
 * It dies with the agent: EOF on its hand-off socket ends it.
 *
 * On a GPU node. The spare sees no device (CUDA_VISIBLE_DEVICES empty), and
 * must never touch the CUDA driver: initialised then, it has "no GPU" for
 * the life of the process, and so would the rank it becomes. After torch and
 * after each warm import it looks (libcuda mapped, or torch.cuda
 * initialised); when an import did, it writes a report on its hand-off socket
 * ({"cuda_import": NAME, "how": ...}, spare_parse_report) and exits untaken.
 * The agent then starts the next spare without that import (dropped for as
 * long as the job's command and warm_imports stay the same; not counted as a
 * death), or none when torch itself touched it, and says so in its log and
 * in its heartbeats (spare_note: musterd's event warm_spare_unfit). On a
 * A spare that wrote on its hand-off socket, or closed it, is never handed a
 * rank (it is on its way out, or would exit as that rank): spare_take kills
 * it, so that its report is read at its exit, and the rank starts afresh. On a
 * node with job GPUs the spare's environment also has DS_ACCELERATOR=cuda
 * (unless the ranks' sets it), for DeepSpeed picks its accelerator once, at
 * import, and by probing would pick the CPU in a process that sees no GPU.
 */
#ifndef MUSTER_WORKER_SPARE_H
#define MUSTER_WORKER_SPARE_H

#include <stdbool.h>
#include <stddef.h>

#include <uv.h>

#include "common/jobspec.h"
#include "worker/agent/agent_rank.h"
#include "worker/agent/rank_user.h"

/* The spare's hand-off socket is its file descriptor 4. */
#define SPARE_HANDOFF_FD 4
/* A spare starts this long after the ranks did, or after one died; after one
 * was taken, SPARE_AGAIN_MS later: its import must not slow the generation
 * that the taken spare is joining. */
#define SPARE_DELAY_MS 3000
#define SPARE_AGAIN_MS 10000
/*
 * What the spare's interpreter runs: `PYTHON -c SPARE_START ARGS...`, which is
 * `python -m muster_spare ARGS...` without the agent's working directory
 * first on sys.path (-m and -c put it there: a muster_spare.py or a torch/
 * planted in it would run in place of muster's). -P does that only from
 * Python 3.11 on; this works with any Python 3. It ends with the module's
 * name so that ps and pgrep -f show "muster_spare ARGS...".
 */
#define SPARE_START                                                                                               \
    "import runpy, sys; sys.path[:1] = [p for p in sys.path[:1] if p]; "                                      \
    "runpy.run_module('muster_spare', run_name='__main__', alter_sys=True)  # muster_spare"
/* Spares that die untaken in a row before the agent stops starting them. */
#define SPARE_MAX_DEATHS 3

struct spare_pool {
    uv_loop_t *loop;
    uv_timer_t timer;          /* the delayed start */
    struct agent_rank *list;   /* rank objects of spares not yet freed */
    struct agent_rank *r;      /* the live spare; NULL = none */
    int handoff_fd;            /* the agent's end of its hand-off socket; -1 = none */
    char **env;                /* the next spare's environment (owned); NULL = no spare wanted */
    char **argv;               /* the ranks' command (owned): the spare runs `argv[0] -c SPARE_START argv[1..]` */
    unsigned deaths;           /* spares that died untaken in a row */
    bool gpus;                 /* the node's ranks use GPUs: DS_ACCELERATOR=cuda for the spare */
    char imports[512];         /* the job's warm_imports that dropped applies to */
    char dropped[512];         /* warm imports that touched the CUDA driver, comma-separated: left out */
    char note[PROTO_REASON_MAX]; /* the last of that, in words, for the heartbeat's spare_note; "" = none */
    bool closing;              /* the agent is exiting: no new spare */
    const struct rank_user *user; /* who the spare runs as (NULL or unset: the agent) */
    void (*on_gone)(void *data); /* a spare ended while closing */
    void *data;
};

void spare_init(struct spare_pool *p, uv_loop_t *loop, void (*on_gone)(void *data), void *data);

/*
 * Whether spec's ranks (argv, with the hook path pypath, "" = no hook) can
 * have a warm spare. false with why "" when warm_spares is off; false with
 * why set when it is on but cannot be (not `PYTHON script.py ...` or
 * `PYTHON -m module ...`, no start-up hook).
 */
bool spare_usable(const struct job_spec *spec, char *const *argv, const char *pypath, char *why, size_t cap);

/*
 * Wants a spare for the rank command argv with rank_env (a rank's
 * environment, taken over: its per-rank variables are dropped,
 * CUDA_VISIBLE_DEVICES is emptied) importing imports; started after
 * SPARE_DELAY_MS unless one lives. A live spare of another command is stopped.
 * Its command line shows the rank's (ps, pgrep -f find it as they find a rank).
 */
void spare_want(struct spare_pool *p, char *const *argv, char **rank_env, const char *imports);

/*
 * The report of a spare whose import touched the CUDA driver, as its hand-off
 * socket carried it (buf, len bytes): {"cuda_import": NAME, "how": TEXT},
 * NAME a module name (letters, digits, _ and .), TEXT printable ASCII. 0 with
 * name and how set, or -EINVAL (anything else; what it was in why).
 */
int spare_parse_report(const char *buf, size_t len, char name[128], char how[160], char *why, size_t cap);

/* imports (comma-separated module names) without name, in out (cap bytes);
 * false when name is not one of them. */
bool spare_without_import(const char *imports, const char *name, char *out, size_t cap);

/*
 * The agent's end fd of a spare's hand-off socket has nothing to read: the
 * spare wrote no report and did not close its end. A spare that did cannot
 * be handed a rank (it is exiting, or would not read it).
 */
bool spare_handoff_quiet(int fd);

/* No spare wanted any more: a live one is stopped. */
void spare_drop(struct spare_pool *p);

/*
 * The live spare becomes the rank argv/env: the hand-off is written and the
 * rank object returned (the caller calls rank_take_up); NULL when there is no
 * spare of this command or the hand-off failed (the spare is then stopped).
 */
struct agent_rank *spare_take(struct spare_pool *p, char *const *argv, char *const *env);

/* The agent exits: the spare is killed; on_gone follows once it is gone. */
void spare_stop(struct spare_pool *p);

/* A spare process still runs. */
bool spare_running(const struct spare_pool *p);

/* Closes every handle (after spare_running turned false). */
void spare_close(struct spare_pool *p);

#endif
