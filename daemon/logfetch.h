/*
 * logfetch: GET /v1/ranks/{rank}/log on musterd's side of the wire. The
 * HTTP thread submits a request (a locked queue plus uv_async, the only way
 * into the loop); on the loop, logfetch finds the node that holds the rank,
 * sends it LOG_REQUEST with a fresh id, and completes the request when the
 * matching LOG_DATA arrives, when that node's connection closes, after
 * LOGFETCH_TIMEOUT_MS, or at shutdown: whichever comes first.
 *
 * Completing fills req->status and req->body (a JSON document: the log
 * piece, or {"error", "detail"}) and calls req->done exactly once: on the
 * loop thread, or on the submitting thread when the request is refused at
 * once (too many in flight, shutting down). After done, logfetch no longer
 * touches req.
 */
#ifndef MUSTER_LOGFETCH_H
#define MUSTER_LOGFETCH_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "proto/proto.h"

/*
 * Requests submitted and not yet completed. Each holds a suspended HTTP
 * connection, and the REST server takes 64 connections: half stay free for
 * status and the dashboard.
 */
#define LOGFETCH_MAX_INFLIGHT 32
#define LOGFETCH_TIMEOUT_MS 5000

struct logfetch_req {
    /* The query (set by the submitter). */
    uint32_t rank;
    uint64_t generation; /* 0 = the newest */
    uint64_t offset;
    uint32_t tail;       /* > 0: the last tail bytes instead of offset */
    uint32_t max;        /* 1..PROTO_LOG_MAX */
    void (*done)(struct logfetch_req *req);
    void *data;          /* the submitter's */

    /* The answer, set before done runs: an HTTP status and a JSON body
     * (malloc'd, the submitter frees it; NULL when out of memory). */
    unsigned status;
    char *body;

    /* logfetch's own. */
    uint32_t id;
    char node[PROTO_NAME_MAX];
    uint64_t deadline_ms;
    struct logfetch_req *next;
};

struct logfetch_ops {
    void *ctx;
    /*
     * The node holding rank in the current layout and whether it is
     * connected: 0, or -ENOENT with why filled in when there is no such rank.
     */
    int (*locate)(void *ctx, uint32_t rank, char node[PROTO_NAME_MAX], bool *connected, char *why,
                  size_t cap);
    /* Queue msg to the connected node. */
    void (*send)(void *ctx, const char *node, const struct proto_msg *msg);
};

struct logfetch {
    uv_loop_t *loop;
    uv_async_t async;
    struct logfetch_ops ops;
    pthread_mutex_t lock;
    /* Under lock: */
    struct logfetch_req *queue; /* submitted, not yet taken by the loop; oldest first */
    unsigned inflight;          /* submitted, not yet completed */
    bool closed;                /* logfetch_close ran: submissions are refused */
    /* Loop only: */
    struct logfetch_req *pending; /* LOG_REQUEST sent, answer awaited */
    uint32_t next_id;
};

/* Returns 0 or a libuv error. */
int logfetch_init(struct logfetch *lf, uv_loop_t *loop, const struct logfetch_ops *ops);

/* Any thread. done follows, once (at once when refused). */
void logfetch_submit(struct logfetch *lf, struct logfetch_req *req);

/* Loop: a LOG_DATA from node. */
void logfetch_data(struct logfetch *lf, const char *node, const struct proto_log_data *d);

/* Loop: node's connection closed; its pending requests fail. */
void logfetch_node_lost(struct logfetch *lf, const char *node);

/* Loop: requests past their deadline fail. Call every ~100 ms. */
void logfetch_tick(struct logfetch *lf, uint64_t now_ms);

/* Loop: completes every request (503) and closes the async handle. */
void logfetch_close(struct logfetch *lf);

/* Once the loop has run its close callbacks and no thread submits any more. */
void logfetch_destroy(struct logfetch *lf);

#endif
