/*
 * store_etcd: musterd's job state in etcd, and the election of the musterd
 * that leads the job (daemon/leader.h), for two or three musterd that run
 * one job (`store`: etcd://h1:2379,h2:2379,...).
 *
 * Keys, under one prefix per job (/muster/<job>/):
 *   leader  "CONTROL REST": the control address (HOST:PORT) and the REST
 *           base URL of the musterd that leads, under its lease; its create
 *           revision is the leader's term
 *   state   what the state file holds without a store (daemon/state.h),
 *           the same JSON text
 *
 * A thread of its own talks to etcd through libcurl on etcd's JSON gateway
 * (daemon/etcd_codec.h): lease grant and keepalive, the campaign, a watch
 * of the leader key while standing by (a streaming answer: no polling). It
 * hands what happened to the loop through a locked queue and uv_async_send.
 * Each request goes to one member; one that fails moves the client to the
 * next member, so a member lost costs one request's timeout at most.
 *
 * Writes of the state (store_write_state) are made from persist's pool
 * thread (daemon/persist.h), each a transaction that puts the state only if
 * the leader key is still the one this musterd created: a deposed leader's
 * write fails, and it stops.
 */
#ifndef MUSTER_STORE_ETCD_H
#define MUSTER_STORE_ETCD_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/leader.h"

#define STORE_TTL_DEFAULT_S 3
#define STORE_PREFIX "/muster/"
#define STORE_USER_MAX 128
#define STORE_PASSWORD_MAX 1024

struct store_config {
    const char *endpoints; /* etcd://h1:2379,... */
    const char *job;       /* the job's name: the key prefix */
    const char *advertise; /* this musterd's control address, HOST:PORT */
    const char *rest;      /* its REST base URL (http://HOST:PORT), for clients sent to the leader */
    int ttl_s;             /* the leader lease's TTL */
    /* Optional (NULL or ""): TLS files (PEM) for https:// members, and
     * etcd's auth (a token from /v3/auth/authenticate on every request). */
    const char *ca, *cert, *key;
    const char *user, *password;
};

enum store_event_kind {
    STORE_ELECTED, /* this musterd leads (term); state: the stored state (NULL = none) */
    STORE_STANDBY, /* another leads (leader, term) */
    STORE_DEPOSED, /* this musterd led and no longer does (why) */
    STORE_NO_QUORUM, /* leading, and etcd lost its quorum: holding (why) */
    STORE_QUORUM,  /* leading, and etcd has a quorum again (why) */
};

struct store_event {
    enum store_event_kind kind;
    int64_t term;
    char leader[LEADER_ADDR_MAX];
    char why[LEADER_WHY_MAX];
    char *state; /* malloc'd; the handler takes it */
};

struct store;

/* on_event runs on the loop's thread. Returns 0, or -EINVAL / -ENOMEM with err. */
int store_open(struct store **out, uv_loop_t *loop, const struct store_config *cfg,
               void (*on_event)(void *ctx, struct store_event *ev), void *ctx, char *err, size_t errlen);

/* Leading, with a lease that cannot have ended yet (a fresh CLOCK_MONOTONIC
 * reading), acting or holding through a quorum loss (daemon/leader.h).
 * Any thread. Once false after leading, it stays false. */
int store_acting(struct store *s);

/* Leading through a quorum loss of etcd that lasted longer than an etcd
 * election (STORE_NO_QUORUM was told): since when (CLOCK_MONOTONIC ms); 0
 * otherwise. Any thread. */
uint64_t store_no_quorum_since(struct store *s);

/* The leader's control address as last seen ("" = none known). Any thread. */
void store_leader(struct store *s, char *out, size_t cap);
/* The leader's REST base URL as last seen ("" = none known). Any thread. */
void store_leader_rest(struct store *s, char *out, size_t cap);

/*
 * Puts the state's text if this musterd still leads (persist's pool thread).
 * Returns 0, -EPERM (the leader key is no longer this musterd's: deposed),
 * or -EIO (no member answered; err says why).
 */
int store_write_state(struct store *s, const char *text, char *err, size_t errlen);

/* Stops the thread; a lease held is revoked, so that a standby leads at once.
 * Closes the async handle; store_free once the loop has run. */
void store_close(struct store *s);
void store_free(struct store *s);

#endif
