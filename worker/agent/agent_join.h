/*
 * agent_join: the pure parts of joining the daemon: the --daemon list
 * (common/hostport.h's HOST:PORT, comma-separated) and the reconnect
 * backoff (exponential, capped, full jitter).
 */
#ifndef MUSTER_WORKER_AGENT_JOIN_H
#define MUSTER_WORKER_AGENT_JOIN_H

#include <stddef.h>
#include <stdint.h>

#include "common/hostport.h"

/*
 * The daemons an agent may join (--daemon a:29470,b:29470: the musterd of
 * one job, one leading, the others standing by). The agent joins the
 * current one; when it is unreachable the next one is tried, and a standby's
 * REJECT not_leader names the leader, which becomes current.
 */
#define AGENT_MAX_DAEMONS 8
#define DAEMON_ADDR_MAX (HOSTPORT_HOST_MAX + 16)

struct daemon_list {
    unsigned n, cur;
    char addr[AGENT_MAX_DAEMONS][DAEMON_ADDR_MAX]; /* HOST:PORT, each valid for hostport_parse */
    uint64_t term; /* the highest leader's term seen in a frame (0: none, or no store) */
};

/* "HOST:PORT[,HOST:PORT...]". Returns 0 or -EINVAL with the reason in err. */
int daemon_list_parse(const char *s, struct daemon_list *l, char *err, size_t errlen);
/*
 * A REJECT not_leader's reason, "HOST:PORT leads; ...": the leader becomes
 * current when it is one of the list. Returns 1 then; 0 when the reason
 * names no leader, -1 when it names one not in the list (current is
 * unchanged): the name comes from etcd's leader key, and an agent runs what
 * a daemon's ASSIGN says, so it joins only the daemons it was given.
 */
int daemon_list_follow(struct daemon_list *l, const char *reason);
/* The next daemon in the list becomes current. */
void daemon_list_next(struct daemon_list *l);
/*
 * The term a daemon's WELCOME, ASSIGN, UNIQUE_ID or COMMAND carries: 0 when
 * it is not lower than any seen (the highest is kept), -ESTALE when it is:
 * the frame comes from a deposed leader and must not be obeyed. Term 0 (a
 * daemon without a store) is accepted while no term was seen.
 */
int daemon_list_term(struct daemon_list *l, uint64_t term);

#define BACKOFF_BASE_MS 200
#define BACKOFF_CAP_MS 5000

struct backoff {
    uint64_t base_ms;
    uint64_t cap_ms;
    unsigned attempt; /* retries since the last reset */
};

void backoff_init(struct backoff *b, uint64_t base_ms, uint64_t cap_ms);
/* Upper bound of the next delay: min(cap, base * 2^attempt). */
uint64_t backoff_ceiling(const struct backoff *b);
/*
 * Next delay in ms, uniform in [0, backoff_ceiling()] given a uniform random
 * 32-bit value r ("full jitter"); counts one more attempt.
 */
uint64_t backoff_next(struct backoff *b, uint32_t r);
/* After a successful join: the next failure waits at most base again. */
void backoff_reset(struct backoff *b);

#endif
