/*
 * leader: the election of one musterd among two or three for a job, as a
 * state machine. Pure logic: it owns no socket and reads no clock; the
 * store's thread (daemon/store_etcd.h) asks it what to send to etcd next,
 * and feeds it the answers with the CLOCK_MONOTONIC time in milliseconds.
 *
 *   candidate  no leader known: get a lease (TTL ttl_s), then create the
 *              leader key under it if nobody holds it (a transaction)
 *   leader     this musterd created the key: its term is the key's create
 *              revision. It keeps the lease alive every ttl/6, and acts
 *              (ASSIGN, COMMAND, new generations) only until
 *              acting_until = (send time of the newest keepalive etcd
 *              answered) + ttl - ttl/3: etcd renews the lease when the
 *              keepalive arrives, after it was sent, so the lease cannot
 *              end before lease_until = that send time + ttl, and ttl/3 is
 *              left for frames in flight and clocks that run at different
 *              rates. Between acting_until and lease_until it is unsure:
 *              it does not act, but a keepalive answered then (the lease
 *              is alive, so the key is still its own) makes it act again.
 *              This rides out the loss of etcd's raft leader: no member
 *              answers a keepalive until the others elect a new one (one
 *              to two election timeouts), and the new one gives every
 *              lease a whole TTL again, so the lease never ends meanwhile.
 *              Quorum lost: when a keepalive fails, the store asks every
 *              member whether it knows a raft leader (leader_probed). If
 *              some answer and none does, etcd has no quorum: no lease can
 *              end and no other musterd can be elected until a raft leader
 *              is (etcd gives every lease a whole TTL when one is), so the
 *              lease lives at least a TTL after each such probe was sent.
 *              The leader then holds: it goes on past acting_until while
 *              the newest such probe is younger than ttl - ttl/3 (what it
 *              sends then cannot change the membership: a new generation
 *              waits for its state write, which needs quorum and the
 *              leader key), and is deposed only once neither a keepalive
 *              nor such a probe has answered within a TTL.
 *   standby    another musterd holds the key (leader, term): watch the
 *              key, and run again (candidate) when it is deleted.
 *   deposed    was leader and lost it (keepalive answered "gone", a state
 *              write refused, its own key deleted or written by another,
 *              which the store watches while it leads, or lease_until
 *              passed): never acts again.
 */
#ifndef MUSTER_LEADER_H
#define MUSTER_LEADER_H

#include <stdint.h>

#define LEADER_ADDR_MAX 280
/* The leader key's value: its control address, a space, its REST URL. */
#define LEADER_VALUE_MAX (2 * LEADER_ADDR_MAX + 16)
#define LEADER_WHY_MAX 200
/* Keepalives per TTL: a recent answer leaves time to ride out an etcd election. */
#define LEADER_KEEPALIVES 6

enum leader_role { LEADER_CANDIDATE, LEADER_LEADING, LEADER_STANDBY, LEADER_DEPOSED };

/* What the store's thread is to send next. */
enum leader_action {
    LEADER_WAIT,      /* nothing until the time leader_next says */
    LEADER_GRANT,     /* /v3/lease/grant */
    LEADER_CAMPAIGN,  /* /v3/kv/txn: create the leader key if absent */
    LEADER_KEEPALIVE, /* /v3/lease/keepalive */
    LEADER_WATCH,     /* /v3/watch the leader key from watch_from */
};

struct leader {
    enum leader_role role;
    uint64_t ttl_ms;
    int64_t lease;          /* 0 = none (a candidate gets one) */
    int64_t term;           /* leading: create revision of the leader key */
    char leader[LEADER_VALUE_MAX]; /* standby: the leader key's value */
    int64_t leader_term;    /* standby: its term */
    int64_t watch_from;     /* standby: first revision the watch must see */
    uint64_t acting_until;  /* leading: see above */
    uint64_t lease_until;   /* leading: see above */
    uint64_t next_keepalive;
    uint64_t no_quorum_since; /* leading: first probe of this quorum loss (0: none) */
    uint64_t no_quorum_seen;  /* leading: newest probe that found no raft leader */
    uint64_t retry_at;      /* candidate: after a failed request, wait until then */
    char why[LEADER_WHY_MAX]; /* deposed: why */
};

void leader_init(struct leader *l, int ttl_s);

/* The next request at now; *due_ms: when to ask again if WAIT. */
enum leader_action leader_next(struct leader *l, uint64_t now_ms, uint64_t *due_ms);

/* Answers. sent_ms: when the request went out. */
void leader_granted(struct leader *l, int64_t lease);
/* The campaign's transaction: won (term = its revision), or lost to the
 * key's holder (holder's value, create revision; rev: the answer's revision). */
void leader_campaigned(struct leader *l, int won, int64_t rev, const char *holder, int64_t holder_term);
void leader_kept(struct leader *l, uint64_t sent_ms, int64_t ttl_s);
/* After a failed keepalive, every member was asked (at sent_ms) whether it
 * knows a raft leader: answered of them did, with_leader of those know one. */
void leader_probed(struct leader *l, uint64_t sent_ms, int answered, int with_leader);
/* A request failed (etcd unreachable or refused): a candidate waits and
 * starts again; a leader keeps trying until lease_until. */
void leader_failed(struct leader *l, uint64_t now_ms);
/* The watched key was deleted (rev: the deletion's revision). */
void leader_watch_deleted(struct leader *l, int64_t rev);
/* Leadership is gone for a reason the store saw (lease ended, write refused). */
void leader_depose(struct leader *l, const char *why);

/* Leading, and within acting_until or holding through a quorum loss; once
 * the lease could have ended, deposed (says why). */
int leader_acting(struct leader *l, uint64_t now_ms);
/* Leading through a quorum loss (since no_quorum_since), past acting_until. */
int leader_holding(const struct leader *l, uint64_t now_ms);
/* Leading, past acting_until but not lease_until: lease_until (the caller
 * may wait that long for a keepalive's answer); 0 otherwise. */
uint64_t leader_unsure(const struct leader *l, uint64_t now_ms);

const char *leader_role_name(enum leader_role r);

#endif
