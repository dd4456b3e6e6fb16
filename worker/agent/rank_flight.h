/*
 * rank_flight: a rank's flight recorder summary, asked for beside its
 * stacks (COMMAND stacks) and sent up in its STACKS (`fr`).
 *
 * With the recorder on (the job's flight_recorder, TORCH_FR_BUFFER_SIZE),
 * the start-up hook (clients/python/muster_rank/flight.py) of each Python
 * process of a rank makes MUSTER_RANK_DIR/fr-PID.fifo and a thread that
 * waits on it. Asking removes fr-PID.txt and writes one byte into the FIFO
 * (non-blocking: a process that is not reading makes no wait); the thread
 * reads torch's recorder, though the main thread waits in a collective,
 * and renames its summary to fr-PID.txt. The summary is the rank's word:
 * it is read bounded and must pass flight_parse (common/flight.h) before it
 * goes up.
 *
 * No loop here: the agent polls flight_ask_poll from its stacks timer.
 */
#ifndef MUSTER_WORKER_RANK_FLIGHT_H
#define MUSTER_WORKER_RANK_FLIGHT_H

#include <stddef.h>

#define FLIGHT_ASK_MAX_PROCS 8 /* processes of one rank asked at most */

struct flight_ask {
    unsigned nprocs;
    int pids[FLIGHT_ASK_MAX_PROCS];
    char dir[4096];
};

/* Asks the live processes of rank_pid's process group armed in dir. Returns
 * 1 when one was asked (something to wait for), else 0. */
int flight_ask_begin(struct flight_ask *f, const char *dir, int rank_pid);

/* 1 when every process asked has written its summary. */
int flight_ask_poll(const struct flight_ask *f);

/*
 * The first non-empty summary of the processes asked, malloc'd, or NULL
 * (none, or bad: then why says so, naming the process, else why is "").
 */
char *flight_ask_read(const struct flight_ask *f, char *why, size_t cap);

#endif
