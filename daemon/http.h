/*
 * http: the REST API of musterd, served by libmicrohttpd on its own thread
 * from a struct snapshot (never from loop state).
 *
 *   GET  /healthz              200 "ok\n" (text/plain)
 *   GET  /v1/status            SNAP_STATUS as published
 *   GET  /v1/nodes             {"nodes": [...]} taken from SNAP_STATUS
 *   GET  /v1/ranks             {"ranks": [...]} taken from SNAP_STATUS
 *   GET  /v1/events            SNAP_EVENTS
 *   GET  /v1/ranks/{rank}/log  a piece of a rank's output log, fetched from its
 *                              node by the loop (daemon/logfetch.h): the
 *                              connection is suspended until the answer comes
 *   GET  /metrics              Prometheus text exposition, from SNAP_STATUS
 *   GET  /                     the dashboard (HTML + JS polling /v1/status)
 *   POST /v1/job/stop          admin: "Authorization: Bearer <admin token>"
 *   POST /v1/job/restart       admin
 *   POST /v1/job/checkpoint    admin: 202, or 409 when the job has no
 *                              checkpoint_dir or is not running
 *   POST /v1/nodes/{name}/drain admin
 * Errors are JSON {"error": "...", "detail": "..."} with a fitting status.
 */
#ifndef MUSTER_HTTP_H
#define MUSTER_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/logfetch.h"
#include "daemon/snapshot.h"

enum http_admin_action { HTTP_ADMIN_STOP, HTTP_ADMIN_RESTART, HTTP_ADMIN_DRAIN, HTTP_ADMIN_CHECKPOINT };

/*
 * Called on the HTTP thread for an authorised admin request; must only
 * queue the request for the loop (locked queue + uv_async_send) and return.
 * node is the drain target, else NULL.
 */
typedef void (*http_admin_fn)(void *ctx, enum http_admin_action action, const char *node);

/*
 * Called on the HTTP thread for a valid log request; hands it to the loop
 * (logfetch_submit) and returns. req->done runs exactly once, on any thread.
 */
typedef void (*http_log_fn)(void *ctx, struct logfetch_req *req);

struct http_config {
    const char *addr;        /* IPv4 address to bind, e.g. "127.0.0.1" */
    uint16_t port;           /* 0 = pick a free port (see http_port) */
    const char *admin_token; /* NULL: admin endpoints answer 403 */
    http_log_fn log;         /* NULL: rank logs answer 503 */
    int checkpoints;         /* the job has a checkpoint_dir: checkpoints can be asked for */
    void *log_ctx;
};

struct http_server;

/* Returns 0 or a negative errno; err says what failed (e.g. port in use). */
int http_start(struct http_server **out, const struct http_config *cfg,
               struct snapshot *snap, http_admin_fn admin, void *ctx,
               char *err, size_t errlen);
uint16_t http_port(const struct http_server *srv);
void http_stop(struct http_server *srv);

#endif
