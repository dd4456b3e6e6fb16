/*
 * agent_rank: one rank process supervised by the agent: uv_spawn with the
 * control socketpair as fd 3, stdout/stderr re-emitted line by line on the
 * agent's stderr as "rank N: ..." and appended to its log (rank_log.h; the
 * owner opens it right after the spawn, before any output is read), stop
 * with SIGTERM then SIGKILL after a grace period, exit status reported at
 * once.
 *
 * Handles: the process, the control connection (frame_conn), two output
 * pipes and the kill timer. Each is closed when it is done with (process and
 * control at exit, output pipes at EOF); the struct is freed when every
 * handle is closed and the owner has released it. rank_close() closes
 * whatever is still open (agent shutdown).
 */
#ifndef MUSTER_WORKER_AGENT_RANK_H
#define MUSTER_WORKER_AGENT_RANK_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "common/ratelimit.h"
#include "proto/proto.h"
#include "worker/agent/frame_conn.h"
#include "worker/agent/rank_env.h"
#include "worker/agent/rank_log.h"

/* Longest output line re-emitted as one; longer lines are split. */
#define RANK_LINE_MAX 4096
/* Bytes of the latest stderr lines kept to explain a failure. */
#define RANK_TAIL_MAX 4096
/* After the process ends, its stderr is read to the end for at most this long. */
#define RANK_DRAIN_MS 250

struct agent_rank;

struct rank_callbacks {
    void *data;
    /* A frame from the rank's control socket. */
    void (*on_msg)(struct agent_rank *r, struct proto_msg *msg);
    /* The process ended (and its stderr was read to the end, or RANK_DRAIN_MS
     * passed): exit_code -1 when signalled, signal 0 when exited. */
    void (*on_exit)(struct agent_rank *r, int exit_code, int signal);
};

struct rank_output {
    uv_pipe_t pipe;
    struct agent_rank *r;
    bool open;
    bool keep_tail; /* stderr: keep the latest lines in tail */
    size_t len;
    char line[RANK_LINE_MAX];
    size_t tail_len;
    char tail[RANK_TAIL_MAX + 1]; /* whole lines, oldest first, NUL-terminated */
};

struct agent_rank {
    struct rank_callbacks cb;
    uint64_t generation; /* of the assignment it was spawned for */
    uint32_t rank, local_rank;
    int pid;
    uint64_t spawned_ms; /* uv_now at spawn */
    bool spoke;          /* it has sent a frame on its control socket */
    uint64_t heard_ms;   /* uv_now when its last frame came (0: none yet) */
    uint64_t beat_ms;    /* uv_now when its last HEARTBEAT came (0: none yet) */
    uint64_t frame_gap_ms; /* the longest time between two of its frames (0: fewer than two):
                            * its cadence, once a step for a program with long steps */
    char error_file[PATH_MAX + 16]; /* its TORCHELASTIC_ERROR_FILE; "" = none */
    unsigned bad_frames;  /* frames on its control socket that did not decode */
    struct ratelimit ignored_log; /* lines about its ignored frames (common/ratelimit.h) */
    struct proto_rank_beat beat; /* latest state, as reported to the daemon */
    bool beat_unrelayed;         /* beat came from the rank after the last heartbeat to the daemon */
    bool spare;           /* a warm spare no slot has taken yet (spare.h): no identity, no log */
    uint64_t rejoined_from; /* rejoined in place from this generation and has not yet said
                             * where its state in the new one came from (0: no) */
    struct rank_log log; /* its output in <rank dir>/output.log; closed at the end of both streams */

    uv_process_t proc;
    struct fconn *ctl;
    struct rank_output out, err;
    uv_timer_t kill_timer; /* grace after SIGTERM; then the stderr drain after exit */
    int open_handles;
    int exit_code, exit_signal;
    bool reaped;   /* process ended; on_exit waits for stderr to drain */
    bool running;  /* process not yet reaped and reported */
    bool stopping; /* SIGTERM sent */
    bool released; /* owner no longer refers to it */
    struct agent_rank **list; /* every rank object, for shutdown */
    struct agent_rank *next;
};

/*
 * Spawns argv with env for id. *list is the owner's list of rank objects.
 * On success returns the rank (state starting); on failure NULL with the
 * libuv error in *err (nothing left to close).
 */
struct agent_rank *rank_spawn(uv_loop_t *loop, struct agent_rank **list, char **argv,
                              char **env, const struct rank_identity *id,
                              const struct rank_callbacks *cb, int *err);

/*
 * A warm spare (spare.h): spawned as a rank is, but with no identity, no log
 * and handoff_fd as its fd 4 (the caller closes its copy). It goes on *list.
 */
struct agent_rank *rank_spawn_spare(uv_loop_t *loop, struct agent_rank **list, char **argv, char **env,
                                    int handoff_fd, const struct rank_callbacks *cb, int *err);

/*
 * The spare r becomes the rank id: it moves to *list and takes id and cb.
 * Its process, pipes and control socket stay; the owner opens its log.
 */
void rank_take_up(struct agent_rank *r, struct agent_rank **list, const struct rank_identity *id,
                  const struct rank_callbacks *cb);

/* Sends a frame on the control socket; errors are logged, not fatal. */
void rank_send(struct agent_rank *r, const struct proto_msg *msg);

/*
 * COMMAND stop over the control socket, SIGTERM, SIGKILL after grace_ms.
 * No-op when already stopping or exited.
 */
void rank_stop(struct agent_rank *r, uint64_t generation, uint64_t grace_ms);

/* SIGKILL now (second signal at shutdown). */
void rank_kill(struct agent_rank *r);

/* The owner forgets r; it is freed once its handles are closed. */
void rank_release(struct agent_rank *r);

/* Closes every handle still open (the process is assumed gone or abandoned). */
void rank_close(struct agent_rank *r);

#endif
