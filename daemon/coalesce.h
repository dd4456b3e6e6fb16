/*
 * coalesce: fewer wakeups for a busy libuv loop. Agents' heartbeats come
 * spread over the second, so a loop left to itself wakes for one or two
 * frames at a time: at 4096 agents beating once a second, musterd woke
 * about 1300 times a second, and each wakeup (a context switch and an
 * epoll_wait) cost more than reading the frames it found.
 *
 * After a loop iteration that handled events from at least min_events
 * sources (the caller notes each with coalesce_note), the loop sleeps
 * wait_us before it polls again, so that one wakeup then takes the frames
 * of that time together. An iteration that handled fewer never waits: an
 * idle or lightly loaded daemon answers at once. Cost: under load, a frame waits up to wait_us
 * longer before it is read, and timers run up to wait_us late.
 */
#ifndef MUSTER_COALESCE_H
#define MUSTER_COALESCE_H

#include <stdint.h>

#include <uv.h>

struct coalesce {
    uv_check_t check;    /* runs after each poll phase */
    unsigned events;     /* sources noted in the iteration that is ending */
    unsigned min_events; /* an iteration with this many sources waits */
    unsigned wait_us;
    uint64_t pass;       /* iterations ended: a source's mark for the one it noted in */
    uint64_t iterations; /* iterations that handled an event */
    uint64_t waits;      /* of those, the ones that waited */
};

/* Starts on loop (the check handle does not keep the loop alive). Answers
 * 0 or a libuv error code. */
int coalesce_start(struct coalesce *c, uv_loop_t *loop, unsigned min_events, unsigned wait_us);

/* An event from a source (a connection) in this iteration: a source counts
 * once per iteration, since libuv reads a busy stream several times in one
 * iteration and those are one connection's frames, not many agents'. *mark
 * is the source's own, zeroed with it. */
static inline void coalesce_note(struct coalesce *c, uint64_t *mark)
{
    if (*mark != c->pass + 1) {
        *mark = c->pass + 1;
        c->events++;
    }
}

/* Closes the handle; c must live until the loop has run its close. */
void coalesce_close(struct coalesce *c);

#endif
