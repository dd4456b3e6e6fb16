/*
 * flight: each rank's torch flight recorder, summed up in a few bytes, and
 * the rank that is behind (issue 32, item 5).
 *
 * torch (2.11) records every collective of a process group in its flight
 * recorder when TORCH_FR_BUFFER_SIZE > 0, gloo's as NCCL's: a sequence
 * number per process group (collective_seq_id), the op ("gloo:all_reduce")
 * and the group's last enqueued and last completed numbers. The agent turns
 * it on for Python ranks; on a suspected hang (COMMAND stacks) the start-up
 * hook's thread (clients/python/muster_rank/flight.py) reads its process's
 * recorder while the main thread waits in the collective and writes one
 * line per process group, which the agent checks with flight_parse and
 * sends up with the rank's STACKS (`fr`):
 *
 *   PG DESC ENTERED COMPLETED [SEQ:OP ...]
 *   0 default_pg 37 36 35:all_reduce 36:all_reduce 37:barrier
 *
 * PG is torch's name of the group (the same on every rank of it), DESC its
 * description, ENTERED the last collective the rank entered, COMPLETED the
 * last it saw complete (0: none), then the ops of its last (at most
 * FLIGHT_MAX_OPS) collectives, by ascending number.
 *
 * Why a summary and not the dump: a dump is tens of kilobytes per rank with
 * stack frames; what tells the culprit is the last numbers and ops, and
 * comparing them across ranks is a few lines of C in musterd, which has
 * every rank's answer (torch's own analyser needs every dump in one Python).
 *
 * The rule (flight_blame), per process group, over the ranks that have it:
 *  - some ranks entered fewer collectives (ENTERED = m < the others'): they
 *    never entered #m+1, which the others did: "rank 2 never entered
 *    all_reduce #31; ranks 0-1, 3 wait in it" (or "are past it");
 *  - all entered the same #M but not the same op (a rank skipped one and
 *    went on to its next collective, which took the skipped one's number):
 *    the ranks not in the op most are in never entered it: "rank 2 never
 *    entered all_reduce #37 (its #37 is barrier); ranks 0-1, 3 wait in it";
 *  - all in the same op at the same number, or all done: the recorder
 *    blames nobody (a peer stuck inside the collective, a wedged link).
 * The first group, in the lowest rank's order, that blames somebody speaks.
 */
#ifndef MUSTER_COMMON_FLIGHT_H
#define MUSTER_COMMON_FLIGHT_H

#include <stddef.h>
#include <stdint.h>

#define FLIGHT_TEXT_MAX 2048 /* bytes of one rank's summary */
#define FLIGHT_MAX_PGS 8     /* process groups per rank */
#define FLIGHT_MAX_OPS 4     /* last collectives per group */
#define FLIGHT_NAME_MAX 32   /* PG and DESC: 1..31 bytes of [A-Za-z0-9_.-] */
#define FLIGHT_OP_MAX 24     /* OP: 1..23 bytes of [A-Za-z0-9_] */

struct flight_op {
    uint64_t seq;
    char op[FLIGHT_OP_MAX];
};

struct flight_pg {
    char name[FLIGHT_NAME_MAX];
    char desc[FLIGHT_NAME_MAX];
    uint64_t entered, completed; /* completed <= entered */
    unsigned nops;
    struct flight_op ops[FLIGHT_MAX_OPS]; /* ascending seq, each <= entered */
};

struct flight_rank {
    unsigned npgs;
    struct flight_pg pgs[FLIGHT_MAX_PGS];
};

enum flight_err {
    FLIGHT_E_SIZE = -1,   /* longer than FLIGHT_TEXT_MAX, or too many groups or ops */
    FLIGHT_E_SYNTAX = -2, /* not PG DESC ENTERED COMPLETED [SEQ:OP ...] */
    FLIGHT_E_NAME = -3,   /* a PG, DESC or OP empty, too long or with other bytes */
    FLIGHT_E_NUMBER = -4, /* a number not decimal, or past 2^63 */
    FLIGHT_E_ORDER = -5,  /* COMPLETED > ENTERED, ops not ascending or past ENTERED */
    FLIGHT_E_DUP = -6,    /* the same PG twice */
};

/*
 * Parses one rank's summary buf[0..len) (no NUL needed; "" = no process
 * group yet) into *out. Returns 0, or a negative enum flight_err with *line
 * (when not NULL) the 1-based line at fault.
 */
int flight_parse(const char *buf, size_t len, struct flight_rank *out, unsigned *line);

const char *flight_strerror(int err);

/*
 * Compares ranks[0..n) (index = global rank; NULL = no summary: left out)
 * by the rule above. Returns 1 with the sentence in out and the lowest
 * blamed rank in *culprit, 0 when the recorder blames nobody, -ENOMEM.
 */
int flight_blame(const struct flight_rank *const *ranks, uint32_t n, char *out, size_t cap, uint32_t *culprit);

#endif
