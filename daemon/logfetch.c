#include "daemon/logfetch.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "common/log.h"

/* ---- answers ------------------------------------------------------------ */

static char *dump(json_t *doc)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return text;
}

/* The shape of every REST error: {"error": ..., "detail": ...}. */
static char *error_body(const char *error, const char *detail)
{
    return dump(json_pack("{s:s, s:s}", "error", error, "detail", detail));
}

static char *piece_body(const struct logfetch_req *req, const struct proto_log_data *d)
{
    return dump(json_pack("{s:i, s:s, s:I, s:I, s:I, s:I, s:I, s:s}", "rank", (json_int_t)d->rank, "node",
                          req->node, "generation", (json_int_t)d->generation, "newest_generation",
                          (json_int_t)d->newest, "offset", (json_int_t)d->offset, "next_offset",
                          (json_int_t)d->next_offset, "size", (json_int_t)d->size, "data",
                          d->data ? d->data : ""));
}

/* The one way a request ends: the answer set, then done (which may free req). */
static void complete(struct logfetch *lf, struct logfetch_req *req, unsigned status, char *body)
{
    req->status = status;
    req->body = body;
    pthread_mutex_lock(&lf->lock);
    lf->inflight--;
    pthread_mutex_unlock(&lf->lock);
    req->done(req);
}

static void fail(struct logfetch *lf, struct logfetch_req *req, unsigned status, const char *error,
                 const char *fmt, ...) __attribute__((format(printf, 5, 6)));

static void fail(struct logfetch *lf, struct logfetch_req *req, unsigned status, const char *error,
                 const char *fmt, ...)
{
    char detail[PROTO_REASON_MAX + 128];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof(detail), fmt, ap);
    va_end(ap);
    proto_text_sanitize(detail); /* a reason cut short may end inside a character */
    complete(lf, req, status, error_body(error, detail));
}

/* ---- the loop's side ---------------------------------------------------- */

static void start(struct logfetch *lf, struct logfetch_req *req)
{
    char why[256] = "";
    bool connected = false;
    if (lf->ops.locate(lf->ops.ctx, req->rank, req->node, &connected, why, sizeof(why)) != 0) {
        fail(lf, req, 404, "no such rank", "%s", why);
        return;
    }
    if (!connected) {
        fail(lf, req, 503, "node not connected", "rank %u is on node %s, which is not connected", req->rank,
             req->node);
        return;
    }
    req->id = lf->next_id++;
    req->deadline_ms = uv_now(lf->loop) + LOGFETCH_TIMEOUT_MS;
    req->next = lf->pending;
    lf->pending = req;
    struct proto_msg m = {.type = PROTO_LOG_REQUEST};
    m.u.log_request = (struct proto_log_request){req->id, req->rank, req->generation, req->offset, req->tail,
                                                 req->max};
    log_debug("log of rank %u: LOG_REQUEST %u to node %s", req->rank, req->id, req->node);
    /* Last: a send that fails closes the connection, and logfetch_node_lost completes req. */
    lf->ops.send(lf->ops.ctx, req->node, &m);
}

/* Takes every submitted request off the queue and starts it. */
static void on_async(uv_async_t *h)
{
    struct logfetch *lf = h->data;
    pthread_mutex_lock(&lf->lock);
    struct logfetch_req *queue = lf->queue;
    lf->queue = NULL;
    pthread_mutex_unlock(&lf->lock);
    while (queue) {
        struct logfetch_req *req = queue;
        queue = req->next;
        start(lf, req);
    }
}

/* Removes and returns the first pending request that match() accepts, or NULL. */
static struct logfetch_req *take_pending(struct logfetch *lf, bool (*match)(const struct logfetch_req *, const void *),
                                         const void *arg)
{
    for (struct logfetch_req **p = &lf->pending; *p; p = &(*p)->next) {
        if (match(*p, arg)) {
            struct logfetch_req *req = *p;
            *p = req->next;
            return req;
        }
    }
    return NULL;
}

struct answer_key {
    const char *node;
    const struct proto_log_data *d;
};

static bool is_answered_by(const struct logfetch_req *req, const void *arg)
{
    const struct answer_key *k = arg;
    return req->id == k->d->id && req->rank == k->d->rank && strcmp(req->node, k->node) == 0;
}

static bool is_on_node(const struct logfetch_req *req, const void *arg)
{
    return strcmp(req->node, arg) == 0;
}

static bool is_late(const struct logfetch_req *req, const void *arg)
{
    return req->deadline_ms <= *(const uint64_t *)arg;
}

static bool any(const struct logfetch_req *req, const void *arg)
{
    return true;
}

void logfetch_data(struct logfetch *lf, const char *node, const struct proto_log_data *d)
{
    struct answer_key key = {node, d};
    struct logfetch_req *req = take_pending(lf, is_answered_by, &key);
    if (!req) {
        log_debug("LOG_DATA %u from node %s answers no pending request (late?); dropped", d->id, node);
        return;
    }
    switch (d->error) {
    case PROTO_LOG_OK:
        complete(lf, req, 200, piece_body(req, d));
        return;
    case PROTO_LOG_NO_LOG:
        fail(lf, req, 404, "no log", "%s", d->reason);
        return;
    case PROTO_LOG_BEYOND_END:
        fail(lf, req, 416, "offset beyond the end", "%s", d->reason);
        return;
    case PROTO_LOG_UNREADABLE:
        fail(lf, req, 502, "log unreadable", "node %s: %s", node, d->reason);
        return;
    case PROTO_LOG_BUSY:
        fail(lf, req, 503, "node busy", "%s", d->reason);
        return;
    }
    fail(lf, req, 502, "log unreadable", "node %s answered with an unknown error", node);
}

void logfetch_node_lost(struct logfetch *lf, const char *node)
{
    struct logfetch_req *req;
    while ((req = take_pending(lf, is_on_node, node)))
        fail(lf, req, 503, "node not connected", "node %s (rank %u) disconnected before it answered", node,
             req->rank);
}

void logfetch_tick(struct logfetch *lf, uint64_t now_ms)
{
    struct logfetch_req *req;
    while ((req = take_pending(lf, is_late, &now_ms))) {
        log_warn("node %s did not answer a request for rank %u's log within %d s", req->node, req->rank,
                 LOGFETCH_TIMEOUT_MS / 1000);
        fail(lf, req, 504, "node did not answer", "node %s did not answer for rank %u's log within %d s",
             req->node, req->rank, LOGFETCH_TIMEOUT_MS / 1000);
    }
}

/* ---- any thread --------------------------------------------------------- */

void logfetch_submit(struct logfetch *lf, struct logfetch_req *req)
{
    bool closed, full = false;
    req->status = 0;
    req->body = NULL;
    req->next = NULL;
    pthread_mutex_lock(&lf->lock);
    closed = lf->closed;
    if (!closed && lf->inflight >= LOGFETCH_MAX_INFLIGHT) {
        full = true;
    } else if (!closed) {
        lf->inflight++;
        struct logfetch_req **tail = &lf->queue;
        while (*tail)
            tail = &(*tail)->next;
        *tail = req;
        /* Under the lock, so that it never comes after logfetch_close's uv_close. */
        uv_async_send(&lf->async);
    }
    pthread_mutex_unlock(&lf->lock);
    if (closed || full) {
        char detail[128];
        snprintf(detail, sizeof(detail), "%d requests for rank logs are waiting on nodes already; try again",
                 LOGFETCH_MAX_INFLIGHT);
        req->status = 503;
        req->body = closed ? error_body("shutting down", "musterd is shutting down")
                           : error_body("too many log requests in flight", detail);
        req->done(req);
    }
}

/* ---- lifecycle ---------------------------------------------------------- */

int logfetch_init(struct logfetch *lf, uv_loop_t *loop, const struct logfetch_ops *ops)
{
    memset(lf, 0, sizeof(*lf));
    lf->loop = loop;
    lf->ops = *ops;
    int rc = uv_async_init(loop, &lf->async, on_async);
    if (rc != 0)
        return rc;
    lf->async.data = lf;
    pthread_mutex_init(&lf->lock, NULL);
    return 0;
}

void logfetch_close(struct logfetch *lf)
{
    pthread_mutex_lock(&lf->lock);
    bool was_closed = lf->closed;
    lf->closed = true;
    struct logfetch_req *queue = lf->queue;
    lf->queue = NULL;
    pthread_mutex_unlock(&lf->lock);
    if (was_closed)
        return;
    uv_close((uv_handle_t *)&lf->async, NULL);
    struct logfetch_req *req;
    while ((req = take_pending(lf, any, NULL)))
        fail(lf, req, 503, "shutting down", "musterd is shutting down");
    while (queue) {
        req = queue;
        queue = req->next;
        fail(lf, req, 503, "shutting down", "musterd is shutting down");
    }
}

void logfetch_destroy(struct logfetch *lf)
{
    pthread_mutex_destroy(&lf->lock);
}
