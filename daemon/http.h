/*
 * http: the REST API of musterd, served by libmicrohttpd on a small pool of
 * threads from the snapshot's current view (never from loop state). Full
 * documents are rendered once per view and sent from the view's memory
 * (daemon/restdoc.h); docs/rest.md is the reference.
 *
 *   GET  /healthz              200 "ok\n" (text/plain)
 *   GET  /v1/status            the job's summary: its size does not grow with
 *                              the job (counts, failing and slowest ranks,
 *                              unhealthy nodes)
 *   GET  /v1/nodes             every node with its ranks' rollup; ?state=,
 *                              ?health=, ?node=, ?order=name|health,
 *                              ?offset=, ?limit=
 *   GET  /v1/ranks             every rank; ?state=, ?node=, ?offset=, ?limit=
 *   GET  /v1/events            the loop's events (a bounded ring)
 *   GET  /v1/history           step, loss, tokens/s over the whole run,
 *                              down-sampled (daemon/history.h)
 *   GET  /v1/ranks/{rank}/log  a piece of a rank's output log, fetched from its
 *                              node by the loop (daemon/logfetch.h): the
 *                              connection is suspended until the answer comes
 *   GET  /v1/stacks            the latest set of the ranks' stacks (a hang's,
 *                              or one asked for), rendered by the loop
 *   GET  /metrics              Prometheus text: job and node series;
 *                              ?ranks=1 adds the per-rank ones
 *   GET  /                     the dashboard
 *   POST /v1/job/stop          admin: "Authorization: Bearer <admin token>"
 *   POST /v1/job/restart       admin
 *   POST /v1/job/checkpoint    admin: 202, or 409 when the job has no
 *                              checkpoint_dir or is not running
 *   POST /v1/nodes/{name}/drain admin
 *   POST /v1/stacks            admin: 202, fresh stacks asked of every node;
 *                              409 when no generation runs
 * With a read token, every GET but /healthz (the dashboard and endpoints
 * added later included) needs it, as "Bearer <token>" or as Basic's
 * password (a browser asks once): 401 otherwise.
 * Every request but /healthz must address musterd by an allowed name
 * (Host, and Origin when a browser sends one: daemon/http_host.h), else
 * 421 (Host) or 403 (Origin). Admin POSTs take the admin token as Bearer
 * only (never Basic) and Content-Type: application/json (else 415), so a
 * cross-site form cannot make one.
 * Errors are JSON {"error": "...", "detail": "..."} with a fitting status; a
 * bad query parameter is a 400 whose detail names it.
 *
 * Hostile clients meet daemon/http_guard.h: a whole-request deadline and
 * per-address and total connection limits enforced by evicting the slowest
 * request, so slow clients never starve a quick one.
 */
#ifndef MUSTER_HTTP_H
#define MUSTER_HTTP_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/http_guard.h"
#include "daemon/logfetch.h"
#include "daemon/snapshot.h"

enum http_admin_action { HTTP_ADMIN_STOP, HTTP_ADMIN_RESTART, HTTP_ADMIN_DRAIN, HTTP_ADMIN_CHECKPOINT, HTTP_ADMIN_STACKS };

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

/* Defaults of struct http_config's limits (0 there = these). */
#define HTTP_CONNECTION_LIMIT 512 /* REST connections in all (musterd keeps open files for them) */
#define HTTP_ADDR_LIMIT 64        /* from one client address */
#define HTTP_REQUEST_MS 5000      /* headers and body of a request arrive within this */
#define HTTP_SLOW_ANSWER_MS 10000 /* an answer sent longer may be evicted for a new connection */

struct http_config {
    const char *addr;        /* IPv4 address to bind, e.g. "127.0.0.1" */
    uint16_t port;           /* 0 = pick a free port (see http_port) */
    const char *admin_token; /* NULL: admin endpoints answer 403 */
    const char *read_token;  /* every GET but /healthz needs it (or the admin token); NULL: reads open */
    const char *hosts;       /* more names REST may be addressed by, "NAME[:PORT],..." (http_host.h); NULL = none */
    http_log_fn log;         /* NULL: rank logs answer 503 */
    int checkpoints;         /* the job has a checkpoint_dir: checkpoints can be asked for */
    void *log_ctx;
    unsigned max_conns;      /* 0 = HTTP_CONNECTION_LIMIT */
    unsigned max_per_addr;   /* 0 = HTTP_ADDR_LIMIT */
    unsigned request_ms;     /* 0 = HTTP_REQUEST_MS */
    unsigned slow_answer_ms; /* 0 = HTTP_SLOW_ANSWER_MS */
};

struct http_server;

/* Returns 0 or a negative errno; err says what failed (e.g. port in use). */
int http_start(struct http_server **out, const struct http_config *cfg,
               struct snapshot *snap, http_admin_fn admin, void *ctx,
               char *err, size_t errlen);
uint16_t http_port(const struct http_server *srv);
/* Connections closed by the guard so far, and open now (daemon/http_guard.h). */
void http_guard_counts(struct http_server *srv, struct http_guard_stats *out);
void http_stop(struct http_server *srv);

#endif
