/*
 * rank_stacks: a rank's Python stacks, dumped on request (COMMAND stacks).
 *
 * muster's start-up hook (clients/python/muster_rank/hook.py) arms two
 * ways in a Python rank to write every thread's stack to
 * MUSTER_RANK_DIR/stacks-PID.txt: a thread that dumps with the GIL when a
 * byte comes on stacks-PID.fifo, and faulthandler on MUSTER_STACKS_SIGNAL,
 * which dumps from the signal handler without the GIL. The thread is asked
 * first: faulthandler walking threads that run Python meanwhile can crash
 * the rank (CPython issue 116008). The signal follows only when the thread
 * wrote nothing within STACKS_FALLBACK_MS: a thread holds the GIL inside
 * native code, nothing runs Python, and faulthandler's walk is safe: sent
 * only while the request byte is still unread in the FIFO (the thread
 * never ran) and the process is still the rank's. A process armed by an
 * older hook (no FIFO) gets the signal at once; one whose FIFO nobody
 * reads (exiting, or exec'd into another program, which a real-time
 * signal would terminate) is not asked at all.
 * A dump starts by truncating each armed process's file; it is complete
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
#define STACKS_FALLBACK_MS 400   /* the hook's thread silent this long: faulthandler's signal */

struct stacks_proc {
    int pid;
    char path[4200];
    int64_t last_size; /* at the previous poll; -1 = not polled yet */
    int done;
    int signalled;     /* faulthandler's signal sent or decided against (at once without a FIFO, else the fallback) */
};

struct stacks_dump {
    uint64_t generation;
    uint32_t rank;
    int rank_pid;       /* the rank's process, which leads its process group */
    int stopped;        /* it was stopped when asked */
    int signum;         /* faulthandler's signal */
    uint64_t begun_ms;
    char dir[4096];     /* the rank's directory, where its processes' FIFOs are */
    unsigned nprocs;
    struct stacks_proc procs[STACKS_MAX_PROCS];
    char error[PROTO_REASON_MAX]; /* why there is nothing to wait for; "" = dumping */
};

/* Whether process pid is stopped (state T or t in /proc/PID/stat); 0 also when unknown. */
int rank_stopped(int pid);

/*
 * Starts a dump of the processes of rank_pid's process group armed in dir
 * at now_ms: truncates their files and asks each through its FIFO (or,
 * without one, sends it signum). Returns 1 when there is something to wait
 * for, 0 when d->error says why not (no hook, stopped).
 */
int stacks_begin(struct stacks_dump *d, const char *dir, int rank_pid, int signum, uint64_t now_ms);

/* One poll at now_ms: 1 when every asked process has written a dump that
 * stopped growing. A process asked through its FIFO that wrote nothing for
 * STACKS_FALLBACK_MS gets signum then. */
int stacks_poll(struct stacks_dump *d, uint64_t now_ms);

/*
 * The STACKS message of a dump, polled or not (at the deadline): each
 * process's part headed by "process PID:", at most PROTO_STACKS_MAX bytes,
 * sanitized; m->u.stacks.text is malloc'd (proto_msg_clear frees it).
 * Returns 0, or -ENOMEM.
 */
int stacks_message(const struct stacks_dump *d, struct proto_msg *m, int timed_out);

#endif
