/*
 * ratelimit: one log line per peer per interval. A peer (a node's
 * connection, a rank) that sends frames to be ignored, one after another,
 * must not write a line per frame: each peer keeps a struct ratelimit, and
 * a line about it goes out at most once per interval, saying how many were
 * held back since the one before. (LOG_LIMITED in common/log.h limits a call
 * site over all peers; this keeps one noisy peer from hiding the others.)
 * The count of a peer that falls quiet goes out with its next line; the
 * callers keep counters of their own for the totals.
 *
 * Pure: the caller gives the time.
 */
#ifndef MUSTER_RATELIMIT_H
#define MUSTER_RATELIMIT_H

#include <stddef.h>
#include <stdint.h>

#define RATELIMIT_PEER_MS 10000 /* one line per peer per 10 s */

struct ratelimit {
    uint64_t last_ms;     /* when the last line went out */
    unsigned long held;   /* lines held back since */
    int used;             /* a line has gone out */
};

/*
 * 1 when a line may be written at now_ms (none in the interval_ms before):
 * *held is then the number held back since the last one, and starts again
 * at 0. Else 0, and this one is counted.
 */
int ratelimit_pass(struct ratelimit *rl, uint64_t now_ms, uint64_t interval_ms, unsigned long *held);

/* " (N more like it held back)" for a line that ratelimit_pass let through, "" when N is 0. */
const char *ratelimit_note(unsigned long held, char *buf, size_t cap);

#endif
