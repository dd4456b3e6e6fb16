/*
 * rank_stacks: a rank's Python stacks, dumped on request (COMMAND stacks).
 *
 * muster's start-up hook (clients/python/startup/) arms faulthandler in
 * every Python process of a rank: on MUSTER_STACKS_SIGNAL it writes every
 * thread's stack to MUSTER_RANK_DIR/stacks-PID.txt. faulthandler writes
 * from the signal handler itself, so a process whose main thread is
 * blocked in native code (a collective) dumps too. A dump starts by
 * truncating each armed process's file and signalling it; it is complete
 * once every file holds bytes that stopped growing, or at the deadline.
 * A stopped process (SIGSTOP, a debugger) cannot dump: it is not
 * signalled, and the answer says so at once.
 *
 * No loop here: the agent polls stacks_poll from a timer.
 */
#ifndef MUSTER_WORKER_RANK_STACKS_H
#define MUSTER_WORKER_RANK_STACKS_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define STACKS_MAX_PROCS 8       /* armed processes of one rank dumped at most */
#define STACKS_DEADLINE_MS 1000  /* a dump not complete by then is sent as it is */

struct stacks_proc {
    int pid;
    char path[4200];
    int64_t last_size; /* at the previous poll; -1 = not polled yet */
    int done;
};

struct stacks_dump {
    uint64_t generation;
    uint32_t rank;
    int rank_pid;       /* the rank's process, which leads its process group */
    int stopped;        /* it was stopped when asked */
    unsigned nprocs;
    struct stacks_proc procs[STACKS_MAX_PROCS];
    char error[PROTO_REASON_MAX]; /* why there is nothing to wait for; "" = dumping */
};

/* Whether process pid is stopped (state T or t in /proc/PID/stat); 0 also when unknown. */
int rank_stopped(int pid);

/*
 * Starts a dump of the processes of rank_pid's process group armed in dir:
 * truncates their files and sends them signum. Returns 1 when there is
 * something to wait for, 0 when d->error says why not (no hook, stopped).
 */
int stacks_begin(struct stacks_dump *d, const char *dir, int rank_pid, int signum);

/* One poll: 1 when every signalled process has written a dump that stopped growing. */
int stacks_poll(struct stacks_dump *d);

/*
 * The STACKS message of a dump, polled or not (at the deadline): each
 * process's part headed by "process PID:", at most PROTO_STACKS_MAX bytes,
 * sanitized; m->u.stacks.text is malloc'd (proto_msg_clear frees it).
 * Returns 0, or -ENOMEM.
 */
int stacks_message(const struct stacks_dump *d, struct proto_msg *m, int timed_out);

#endif
