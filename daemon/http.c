#include "daemon/http.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <stdatomic.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>

#include "common/log.h"
#include "daemon/dashboard.h"
#include "daemon/http_host.h"
#include "daemon/plan_http.h"
#include "daemon/restdoc.h"

/* Threads serving REST: a document rendered for the first time (tens of ms at
 * 32k ranks) or a slow reader holds up only the connections of its thread. */
#define HTTP_THREADS 4
/* libmicrohttpd's own limit per thread, above the guard's (which binds). */
#define HTTP_MHD_SLACK 64
#define HTTP_IDLE_TIMEOUT_S 10 /* an answer that stops draining */
#define HTTP_BODY_LIMIT 4096 /* admin bodies are ignored; anything bigger is refused */
#define NODE_NAME_MAX 63

#define CT_JSON "application/json"
#define CT_METRICS "text/plain; version=0.0.4; charset=utf-8"
#define CT_TEXT "text/plain; charset=utf-8"
#define CT_HTML "text/html; charset=utf-8"

struct http_server {
    struct MHD_Daemon *mhd;
    struct snapshot *snap;
    http_admin_fn admin;
    void *ctx;
    char *admin_token; /* NULL: admin disabled */
    char *read_token;  /* NULL: reads are open */
    int checkpoints;   /* the job has a checkpoint_dir */
    http_log_fn log;
    void *log_ctx;
    uint16_t port;
    atomic_int logs_open; /* log requests handed to the loop and not yet completed */
    struct http_guard *guard;
    struct http_hosts hosts; /* the names requests may address it by */
};

/* A log request's way through the connection (suspended while the loop fetches). */
enum log_state {
    LOG_NONE,    /* not a log request, or not yet handed over */
    LOG_WAITING, /* handed to the loop; the connection is suspended */
    LOG_DONE,    /* answered (lr.status, lr.body); the connection is resumed */
};

/* Per-request state, kept in MHD's con_cls from the first call to the last. */
struct request {
    size_t body_len;
    struct MHD_Connection *conn;
    struct http_server *srv; /* set when a log request is handed to the loop */
    enum log_state log_state; /* set to LOG_DONE by the loop, read after the resume */
    struct logfetch_req lr;
};

/* ---- responses ---------------------------------------------------------- */

/* Adds the common headers to r and queues it: its answer starts going out. */
static enum MHD_Result queue(struct MHD_Connection *c, unsigned status, struct MHD_Response *r,
                             const char *ctype, const char *allow)
{
    if (!r)
        return MHD_NO; /* out of memory: MHD closes the connection */
    http_guard_answering(c);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-store");
    MHD_add_response_header(r, "X-Content-Type-Options", "nosniff");
    if (allow)
        MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (status == MHD_HTTP_UNAUTHORIZED) {
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"musterd\"");
        /* A browser asks its user once (any name, the read token as the password) and sends it after. */
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Basic realm=\"musterd\", charset=\"UTF-8\"");
    }
    enum MHD_Result ret = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ret;
}

/* Queues body (malloc'd, taken over) with status and content type. */
static enum MHD_Result reply(struct MHD_Connection *c, unsigned status, const char *ctype,
                             char *body, const char *allow)
{
    if (!body)
        return MHD_NO;
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
    if (!r)
        free(body);
    return queue(c, status, r, ctype, allow);
}

static void release_view(void *cls)
{
    snap_view_unref(cls);
}

/* Queues text that lives in v; the response holds v's reference (taken over). */
static enum MHD_Result reply_view(struct MHD_Connection *c, struct snap_view *v, const char *text,
                                  size_t len, const char *ctype)
{
    if (!text) {
        snap_view_unref(v);
        return MHD_NO;
    }
    struct MHD_Response *r =
        MHD_create_response_from_buffer_with_free_callback_cls(len, (void *)text, release_view, v);
    if (!r)
        snap_view_unref(v);
    return queue(c, MHD_HTTP_OK, r, ctype, NULL);
}

static char *dump(json_t *doc)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return text;
}

/* {"error": error, "detail": detail}, detail left out when NULL. */
static enum MHD_Result reply_error(struct MHD_Connection *c, unsigned status, const char *error,
                                   const char *detail, const char *allow)
{
    json_t *doc = json_object();
    json_object_set_new(doc, "error", json_string(error));
    if (detail)
        json_object_set_new(doc, "detail", json_string(detail));
    return reply(c, status, CT_JSON, dump(doc), allow);
}

static enum MHD_Result reply_starting(struct MHD_Connection *c)
{
    return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "starting",
                       "musterd has not published its state yet", NULL);
}

/* ---- query parameters ----------------------------------------------------- */

/* Calls param(ctx, key, value) for each query parameter until one fails (its
 * error in err). Returns 0 or -EINVAL. */
struct query_walk {
    int (*param)(void *ctx, const char *key, const char *value, char *err, size_t errlen);
    void *ctx;
    char err[256];
};

static enum MHD_Result query_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct query_walk *w = cls;
    return w->param(w->ctx, key, value, w->err, sizeof(w->err)) == 0 ? MHD_YES : MHD_NO;
}

static int walk_query(struct MHD_Connection *c, struct query_walk *w)
{
    w->err[0] = '\0';
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, query_arg, w);
    return w->err[0] ? -EINVAL : 0;
}

static int no_param(void *ctx, const char *key, const char *value, char *err, size_t errlen)
{
    snprintf(err, errlen, "unknown parameter '%.40s' (%s takes none)", key, (const char *)ctx);
    return -EINVAL;
}

static enum MHD_Result reply_bad_query(struct MHD_Connection *c, const char *detail)
{
    return reply_error(c, MHD_HTTP_BAD_REQUEST, "invalid query", detail, NULL);
}

/* ---- read endpoints ----------------------------------------------------- */

/* The current view for a request whose query w accepts; NULL after answering
 * (400 for the query, 503 before the first publish) with *ret. */
static struct snap_view *view_for(struct http_server *srv, struct MHD_Connection *c, struct query_walk *w,
                                  enum MHD_Result *ret)
{
    if (walk_query(c, w) != 0) {
        *ret = reply_bad_query(c, w->err);
        return NULL;
    }
    struct snap_view *v = snapshot_acquire(srv->snap);
    if (!v)
        *ret = reply_starting(c);
    return v;
}

static enum MHD_Result get_status(struct http_server *srv, struct MHD_Connection *c)
{
    struct query_walk w = {no_param, "/v1/status", ""};
    enum MHD_Result ret;
    struct snap_view *v = view_for(srv, c, &w, &ret);
    if (!v)
        return ret;
    size_t len = 0;
    const char *text = restdoc_get(v, SNAP_DOC_STATUS, &len);
    return reply_view(c, v, text, len, CT_JSON);
}

/* Events and history: JSON text the loop rendered into the view. */
static enum MHD_Result get_loop_doc(struct http_server *srv, struct MHD_Connection *c, const char *path,
                                    int history)
{
    struct query_walk w = {no_param, (void *)path, ""};
    enum MHD_Result ret;
    struct snap_view *v = view_for(srv, c, &w, &ret);
    if (!v)
        return ret;
    const char *text = history ? v->history : v->events;
    if (!text) {
        snap_view_unref(v);
        return reply_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal error",
                           history ? "no history was published" : "no events were published", NULL);
    }
    return reply_view(c, v, text, history ? v->history_len : v->events_len, CT_JSON);
}

static enum MHD_Result get_events(struct http_server *srv, struct MHD_Connection *c)
{
    return get_loop_doc(srv, c, "/v1/events", 0);
}

static enum MHD_Result get_history(struct http_server *srv, struct MHD_Connection *c)
{
    return get_loop_doc(srv, c, "/v1/history", 1);
}

/* The latest set of stacks: JSON text the loop rendered when the set changed. */
static enum MHD_Result get_stacks(struct http_server *srv, struct MHD_Connection *c)
{
    struct query_walk w = {no_param, "/v1/stacks", ""};
    enum MHD_Result ret;
    struct snap_view *v = view_for(srv, c, &w, &ret);
    if (!v)
        return ret;
    if (!v->stacks) {
        snap_view_unref(v);
        return reply_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal error", "no stacks were published", NULL);
    }
    return reply_view(c, v, v->stacks->text, v->stacks->len, CT_JSON);
}

/* /v1/plan's query: network_gbit and tflops, at most once each (their values are plan_http_doc's to check). */
struct plan_params {
    const char *network, *tflops;
};

static int plan_param(void *ctx, const char *key, const char *value, char *err, size_t errlen)
{
    struct plan_params *pp = ctx;
    const char **slot = strcmp(key, "network_gbit") == 0 ? &pp->network
                        : strcmp(key, "tflops") == 0     ? &pp->tflops
                                                         : NULL;
    if (!slot) {
        snprintf(err, errlen, "unknown parameter '%.40s' (network_gbit, tflops)", key);
        return -EINVAL;
    }
    if (*slot) {
        snprintf(err, errlen, "%s: given twice", key);
        return -EINVAL;
    }
    *slot = value ? value : "";
    return 0;
}

/* GET /v1/plan[?network_gbit=G&tflops=X] (daemon/plan_http.h), from the view's summary. */
static enum MHD_Result get_plan(struct http_server *srv, struct MHD_Connection *c)
{
    struct plan_params pp = {0};
    struct query_walk w = {plan_param, &pp, ""};
    enum MHD_Result ret;
    struct snap_view *v = view_for(srv, c, &w, &ret);
    if (!v)
        return ret;
    pthread_mutex_lock(&v->head_lock);
    json_t *head = json_deep_copy(v->head); /* the planning below runs without the lock */
    pthread_mutex_unlock(&v->head_lock);
    snap_view_unref(v);
    if (!head)
        return reply_error(c, MHD_HTTP_INTERNAL_SERVER_ERROR, "internal error", "out of memory", NULL);
    char err[256];
    json_t *doc = plan_http_doc(head, pp.network, pp.tflops, err, sizeof(err));
    json_decref(head);
    if (!doc)
        return reply_bad_query(c, err);
    return reply(c, MHD_HTTP_OK, CT_JSON, dump(doc), NULL);
}

struct list_params {
    enum restdoc_list list;
    struct restdoc_query q;
};

static int list_param(void *ctx, const char *key, const char *value, char *err, size_t errlen)
{
    struct list_params *lp = ctx;
    return restdoc_query_param(&lp->q, lp->list, key, value, err, errlen);
}

/* /v1/ranks and /v1/nodes: the cached whole list, or a page rendered for the query. */
static enum MHD_Result get_list(struct http_server *srv, struct MHD_Connection *c, enum restdoc_list list)
{
    struct list_params lp = {.list = list};
    struct query_walk w = {list_param, &lp, ""};
    enum MHD_Result ret;
    struct snap_view *v = view_for(srv, c, &w, &ret);
    if (!v)
        return ret;
    size_t len = 0;
    if (!lp.q.any) {
        const char *text = restdoc_get(v, list == RESTDOC_RANKS ? SNAP_DOC_RANKS : SNAP_DOC_NODES, &len);
        return reply_view(c, v, text, len, CT_JSON);
    }
    char *page = restdoc_list(v, list, &lp.q, &len);
    snap_view_unref(v);
    return reply(c, MHD_HTTP_OK, CT_JSON, page, NULL);
}

static enum MHD_Result get_nodes(struct http_server *srv, struct MHD_Connection *c)
{
    return get_list(srv, c, RESTDOC_NODES);
}

static enum MHD_Result get_ranks(struct http_server *srv, struct MHD_Connection *c)
{
    return get_list(srv, c, RESTDOC_RANKS);
}

static int metrics_param(void *ctx, const char *key, const char *value, char *err, size_t errlen)
{
    int *ranks = ctx;
    if (strcmp(key, "ranks") != 0) {
        snprintf(err, errlen, "unknown parameter '%.40s' (ranks)", key);
        return -EINVAL;
    }
    if (!value || (strcmp(value, "0") != 0 && strcmp(value, "1") != 0)) {
        snprintf(err, errlen, "ranks: expected 0 or 1, got '%.40s'", value ? value : "");
        return -EINVAL;
    }
    *ranks = value[0] == '1';
    return 0;
}

static enum MHD_Result get_metrics(struct http_server *srv, struct MHD_Connection *c)
{
    int ranks = 0;
    struct query_walk w = {metrics_param, &ranks, ""};
    enum MHD_Result ret;
    struct snap_view *v = view_for(srv, c, &w, &ret);
    if (!v)
        return ret;
    size_t len = 0;
    const char *text = restdoc_get(v, ranks ? SNAP_DOC_METRICS_RANKS : SNAP_DOC_METRICS, &len);
    return reply_view(c, v, text, len, CT_METRICS);
}

static enum MHD_Result get_healthz(struct http_server *srv, struct MHD_Connection *c)
{
    return reply(c, MHD_HTTP_OK, CT_TEXT, strdup("ok\n"), NULL);
}

static enum MHD_Result get_dashboard(struct http_server *srv, struct MHD_Connection *c)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(
        strlen(dashboard_html), (void *)dashboard_html, MHD_RESPMEM_PERSISTENT);
    if (r)
        /* The page is self-contained: inline script and style, fetches to itself only. */
        MHD_add_response_header(r, "Content-Security-Policy",
                                "default-src 'none'; script-src 'unsafe-inline'; "
                                "style-src 'unsafe-inline'; connect-src 'self'; img-src 'self' data:");
    return queue(c, MHD_HTTP_OK, r, CT_HTML, NULL);
}

/* ---- rank logs ------------------------------------------------------------ */

#define LOG_PREFIX "/v1/ranks/"
#define LOG_SUFFIX "/log"

/* Decimal digits only, no sign, at most max; 0 or -EINVAL. */
static int parse_uint(const char *s, size_t len, uint64_t max, uint64_t *out)
{
    uint64_t v = 0;
    if (len == 0 || len > 20)
        return -EINVAL;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9')
            return -EINVAL;
        uint64_t d = (uint64_t)(s[i] - '0');
        if (d > max || v > (max - d) / 10)
            return -EINVAL;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* The query parameters of a log request, checked one by one. */
struct log_query {
    struct logfetch_req *lr;
    unsigned seen; /* bit per parameter */
    char error[200];
};

static const struct {
    const char *name;
    uint64_t min, max;
    const char *expect;
} log_params[] = {
    {"offset", 0, PROTO_U64_MAX, "a byte offset 0..9007199254740991"},
    {"tail", 1, UINT32_MAX, "a number of bytes 1..4294967295"},
    {"max", 1, PROTO_LOG_MAX, "a number of bytes 1..65536"},
    {"generation", 0, PROTO_U64_MAX, "a generation (0 = the newest)"},
};

static enum MHD_Result log_query_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct log_query *q = cls;
    size_t i = 0, n = sizeof(log_params) / sizeof(log_params[0]);
    while (i < n && strcmp(key, log_params[i].name) != 0)
        i++;
    if (i == n) {
        snprintf(q->error, sizeof(q->error), "unknown parameter '%.40s' (offset, tail, max, generation)", key);
        return MHD_NO;
    }
    if (q->seen & (1u << i)) {
        snprintf(q->error, sizeof(q->error), "%s: given twice", key);
        return MHD_NO;
    }
    q->seen |= 1u << i;
    uint64_t v;
    if (!value || parse_uint(value, strlen(value), log_params[i].max, &v) != 0 || v < log_params[i].min) {
        snprintf(q->error, sizeof(q->error), "%s: expected %s, got '%.40s'", key, log_params[i].expect,
                 value ? value : "");
        return MHD_NO;
    }
    switch (i) {
    case 0: q->lr->offset = v; break;
    case 1: q->lr->tail = (uint32_t)v; break;
    case 2: q->lr->max = (uint32_t)v; break;
    default: q->lr->generation = v; break;
    }
    return MHD_YES;
}

/* The loop's answer is in: let MHD call on_request again (any thread). */
static void log_done(struct logfetch_req *lr)
{
    struct request *rq = lr->data;
    rq->log_state = LOG_DONE;
    MHD_resume_connection(rq->conn);
}

static enum MHD_Result get_rank_log(struct http_server *srv, struct MHD_Connection *c, struct request *rq,
                                    const char *rank_text, size_t rank_len)
{
    if (rq->log_state == LOG_DONE) {
        char *body = rq->lr.body;
        rq->lr.body = NULL;
        return reply(c, rq->lr.status, CT_JSON, body, NULL);
    }
    uint64_t rank;
    if (parse_uint(rank_text, rank_len, UINT32_MAX, &rank) != 0) {
        char detail[128];
        snprintf(detail, sizeof(detail), "'%.*s' is not a rank (0..4294967295)", (int)(rank_len > 40 ? 40 : rank_len),
                 rank_text);
        return reply_error(c, MHD_HTTP_BAD_REQUEST, "invalid rank", detail, NULL);
    }
    memset(&rq->lr, 0, sizeof(rq->lr));
    rq->lr.rank = (uint32_t)rank;
    rq->lr.max = PROTO_LOG_MAX;
    struct log_query q = {.lr = &rq->lr};
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, log_query_arg, &q);
    if (!q.error[0] && rq->lr.tail && (q.seen & 1u))
        snprintf(q.error, sizeof(q.error), "give offset or tail, not both");
    if (q.error[0])
        return reply_error(c, MHD_HTTP_BAD_REQUEST, "invalid query", q.error, NULL);
    if (!srv->log)
        return reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "logs unavailable",
                           "this server does not serve rank logs", NULL);
    rq->conn = c;
    rq->lr.done = log_done;
    rq->lr.data = rq;
    rq->log_state = LOG_WAITING;
    rq->srv = srv;
    atomic_fetch_add(&srv->logs_open, 1);
    /* Suspended first: the answer may come (and resume it) before this returns. */
    MHD_suspend_connection(c);
    srv->log(srv->log_ctx, &rq->lr);
    return MHD_YES;
}

/* ---- admin endpoints ---------------------------------------------------- */

static const char *const action_names[] = {
    [HTTP_ADMIN_STOP] = "stop",
    [HTTP_ADMIN_RESTART] = "restart",
    [HTTP_ADMIN_DRAIN] = "drain",
    [HTTP_ADMIN_CHECKPOINT] = "checkpoint",
    [HTTP_ADMIN_STACKS] = "stacks",
};

static void sha256(const char *s, size_t len, unsigned char out[32])
{
    unsigned int n = 0;
    if (!EVP_Digest(s, len, out, &n, EVP_sha256(), NULL))
        memset(out, 0, 32);
}

/* Both sides hashed first, so that the comparison is constant-time whatever the lengths. */
static int token_equal(const char *want_tok, const char *tok, size_t len)
{
    unsigned char want[32], got[32];
    sha256(want_tok, strlen(want_tok), want);
    sha256(tok, len, got);
    return CRYPTO_memcmp(want, got, sizeof(want)) == 0;
}

/*
 * The token a request carries: "Bearer <token>" (musterctl, scripts), or,
 * when basic_too, "Basic" with the token as the password (what a browser
 * sends once its user has answered the prompt; the user name is ignored).
 * Copied into out; 0 when there is none.
 *
 * Basic is for reads only: a browser that has it attaches it by itself to
 * every request to the origin, a cross-site form's POST included, so it
 * cannot vouch that the operator meant an action. Reads keep it for the
 * dashboard: another site's page cannot read the answers (same-origin
 * policy, and the Host and Origin checks against DNS rebinding).
 */
static size_t request_token(struct MHD_Connection *c, char *out, size_t cap, int basic_too)
{
    const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    int basic = auth && strncasecmp(auth, "Basic ", 6) == 0;
    if (!auth || (basic && !basic_too) || (!basic && strncasecmp(auth, "Bearer ", 7) != 0))
        return 0;
    const char *tok = auth + (basic ? 6 : 7);
    while (*tok == ' ')
        tok++;
    size_t len = strlen(tok);
    while (len > 0 && (tok[len - 1] == ' ' || tok[len - 1] == '\t'))
        len--;
    if (len == 0 || len >= cap)
        return 0;
    if (!basic) {
        memcpy(out, tok, len);
        out[len] = '\0';
        return len;
    }
    if (len % 4 != 0 || len / 4 * 3 >= cap)
        return 0;
    unsigned char raw[1024];
    if (len / 4 * 3 >= sizeof(raw))
        return 0;
    int n = EVP_DecodeBlock(raw, (const unsigned char *)tok, (int)len);
    if (n < 0)
        return 0;
    n -= (tok[len - 1] == '=') + (tok[len - 2] == '='); /* EVP_DecodeBlock counts the padding */
    const unsigned char *colon = memchr(raw, ':', (size_t)n);
    if (!colon)
        return 0;
    size_t plen = (size_t)n - (size_t)(colon + 1 - raw);
    memcpy(out, colon + 1, plen);
    out[plen] = '\0';
    OPENSSL_cleanse(raw, sizeof(raw));
    return plen;
}

/* The request carries the admin token, as Bearer. */
static int authorized(const struct http_server *srv, struct MHD_Connection *c)
{
    char tok[1024];
    size_t len = request_token(c, tok, sizeof(tok), 0);
    int ok = len > 0 && token_equal(srv->admin_token, tok, len);
    OPENSSL_cleanse(tok, sizeof(tok));
    return ok;
}

/* A read may go ahead: reads are open, or it carries the read token (or the admin one). */
static int may_read(const struct http_server *srv, struct MHD_Connection *c)
{
    if (!srv->read_token)
        return 1;
    char tok[1024];
    size_t len = request_token(c, tok, sizeof(tok), 1);
    int ok = len > 0 && (token_equal(srv->read_token, tok, len) ||
                         (srv->admin_token && token_equal(srv->admin_token, tok, len)));
    OPENSSL_cleanse(tok, sizeof(tok));
    return ok;
}

static void client_addr(struct MHD_Connection *c, char *buf, size_t len)
{
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(buf, len, "?");
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET) {
        const struct sockaddr_in *sin = (const struct sockaddr_in *)ci->client_addr;
        inet_ntop(AF_INET, &sin->sin_addr, buf, (socklen_t)len);
    }
}

/* 1..63 characters of [A-Za-z0-9._-], the node names agents may use. */
static int node_name_valid(const char *s, size_t len)
{
    if (len == 0 || len > NODE_NAME_MAX)
        return 0;
    for (size_t i = 0; i < len; i++) {
        char ch = s[i];
        if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
              ch == '.' || ch == '_' || ch == '-'))
            return 0;
    }
    return 1;
}

/* Whether the current view lists the node: 1, 0, or -1 before the first publish. */
static int node_known(struct http_server *srv, const char *name)
{
    struct snap_view *v = snapshot_acquire(srv->snap);
    if (!v)
        return -1;
    int found = restdoc_find_node(v, name) >= 0;
    snap_view_unref(v);
    return found;
}

/* The job state of the current view into state ("" before the first publish). */
static void job_state(struct http_server *srv, char *state, size_t len)
{
    struct snap_view *v = snapshot_acquire(srv->snap);
    snprintf(state, len, "%s", v ? v->state : "");
    snap_view_unref(v);
}

/* Whether a checkpoint or stacks can be asked for now; else the answer that says why. */
static enum MHD_Result action_refused(struct http_server *srv, struct MHD_Connection *c,
                                      enum http_admin_action action, int *refused)
{
    char state[32], detail[160];
    *refused = 1;
    if (action == HTTP_ADMIN_CHECKPOINT && !srv->checkpoints)
        return reply_error(c, MHD_HTTP_CONFLICT, "no checkpoint_dir",
                           "this job has no checkpoint_dir: its ranks have nowhere to write a "
                           "checkpoint (set checkpoint_dir in the job spec)",
                           NULL);
    job_state(srv, state, sizeof(state));
    if (!state[0])
        return reply_starting(c);
    if (strcmp(state, "running") != 0 && (action == HTTP_ADMIN_CHECKPOINT || strcmp(state, "forming") != 0)) {
        snprintf(detail, sizeof(detail), "the job is %s: %s", state,
                 action == HTTP_ADMIN_CHECKPOINT ? "a checkpoint is taken by running ranks (state running)"
                                                 : "stacks are dumped by the ranks of a generation (state "
                                                   "running or forming)");
        return reply_error(c, MHD_HTTP_CONFLICT, "not running", detail, NULL);
    }
    *refused = 0;
    return MHD_YES;
}

/* Content-Type is application/json (parameters such as charset allowed):
 * what no HTML form can send, so a cross-site form cannot make an admin call. */
static int json_content_type(struct MHD_Connection *c)
{
    const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
    if (!ct)
        return 0;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    size_t n = strlen(CT_JSON);
    if (strncasecmp(ct, CT_JSON, n) != 0)
        return 0;
    ct += n;
    while (*ct == ' ' || *ct == '\t')
        ct++;
    return *ct == '\0' || *ct == ';';
}

static enum MHD_Result admin(struct http_server *srv, struct MHD_Connection *c,
                             enum http_admin_action action, const char *node, size_t node_len)
{
    char peer[INET_ADDRSTRLEN];
    client_addr(c, peer, sizeof(peer));
    if (!srv->admin_token)
        return reply_error(c, MHD_HTTP_FORBIDDEN, "admin disabled",
                           "start musterd with --admin-token-file", NULL);
    if (!authorized(srv, c)) {
        const char *auth = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
        int basic = auth && strncasecmp(auth, "Basic ", 6) == 0;
        log_warn_limited("http: refused %s from %s: %s", action_names[action], peer,
                         basic ? "Basic authorization (admin calls take Bearer only)" : "missing or wrong admin token");
        return reply_error(c, MHD_HTTP_UNAUTHORIZED, "unauthorized",
                           basic ? "admin calls take the admin token as \"Authorization: Bearer <admin token>\", "
                                   "not as Basic (a browser would send Basic by itself)"
                                 : "send \"Authorization: Bearer <admin token>\"",
                           NULL);
    }
    if (!json_content_type(c)) {
        const char *ct = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_TYPE);
        char detail[160];
        snprintf(detail, sizeof(detail), "admin calls take \"Content-Type: application/json\"; got %s%.60s%s",
                 ct ? "'" : "", ct ? ct : "none", ct ? "'" : "");
        log_warn_limited("http: refused %s from %s: content type %.60s", action_names[action], peer,
                         ct ? ct : "none");
        return reply_error(c, MHD_HTTP_UNSUPPORTED_MEDIA_TYPE, "unsupported media type", detail, NULL);
    }

    if (action == HTTP_ADMIN_CHECKPOINT || action == HTTP_ADMIN_STACKS) {
        int refused;
        enum MHD_Result r = action_refused(srv, c, action, &refused);
        if (refused) {
            log_warn("http: refused %s from %s: %s", action_names[action], peer,
                     action == HTTP_ADMIN_STACKS || srv->checkpoints ? "the job is not running"
                                                                     : "the job has no checkpoint_dir");
            return r;
        }
    }
    json_t *doc = json_pack("{s:s}", "accepted", action_names[action]);
    char name[NODE_NAME_MAX + 1] = "";
    if (action == HTTP_ADMIN_DRAIN) {
        if (!node_name_valid(node, node_len)) {
            json_decref(doc);
            return reply_error(c, MHD_HTTP_BAD_REQUEST, "invalid node name",
                               "a node name is 1 to 63 characters of A-Z a-z 0-9 . _ -", NULL);
        }
        memcpy(name, node, node_len);
        name[node_len] = '\0';
        int known = node_known(srv, name);
        if (known <= 0) {
            json_decref(doc);
            if (known < 0)
                return reply_starting(c);
            char detail[128];
            snprintf(detail, sizeof(detail), "node '%s' is not part of this job (see /v1/nodes)",
                     name);
            return reply_error(c, MHD_HTTP_NOT_FOUND, "no such node", detail, NULL);
        }
        json_object_set_new(doc, "node", json_string(name));
    }
    log_info("http: %s%s%s requested from %s", action_names[action], name[0] ? " " : "", name,
             peer);
    srv->admin(srv->ctx, action, name[0] ? name : NULL);
    return reply(c, MHD_HTTP_ACCEPTED, CT_JSON, dump(doc), NULL);
}

/* ---- a standby sends clients to the leader -------------------------------- */

struct location {
    char *p;
    size_t len, cap;
    int first, overflow;
};

static void loc_put(struct location *l, const char *s, size_t n)
{
    if (l->len + n + 1 > l->cap) {
        l->overflow = 1;
        return;
    }
    memcpy(l->p + l->len, s, n);
    l->len += n;
    l->p[l->len] = '\0';
}

/* Percent-encodes all but RFC 3986's unreserved characters. */
static void loc_escaped(struct location *l, const char *s)
{
    for (; *s; s++) {
        char hex[4];
        if (isalnum((unsigned char)*s) || strchr("-._~", *s)) {
            loc_put(l, s, 1);
        } else {
            snprintf(hex, sizeof(hex), "%%%02X", (unsigned char)*s);
            loc_put(l, hex, 3);
        }
    }
}

static enum MHD_Result loc_arg(void *cls, enum MHD_ValueKind kind, const char *key, const char *value)
{
    struct location *l = cls;
    (void)kind;
    loc_put(l, l->first ? "?" : "&", 1);
    l->first = 0;
    loc_escaped(l, key);
    if (value) {
        loc_put(l, "=", 1);
        loc_escaped(l, value);
    }
    return MHD_YES;
}

/*
 * A standby's REST holds nothing of the job (its figures live in the
 * leader's memory only), so every request but the health check and the
 * metrics (this process's own) is answered with 307 and the same path and
 * query at the leader, which it published in etcd; 503 while no leader is
 * known. 0 when this musterd leads (or has no store): serve the request.
 */
static int redirect_to_leader(struct http_server *srv, struct MHD_Connection *c, const char *url,
                              enum MHD_Result *ret)
{
    if (strcmp(url, "/healthz") == 0 || strcmp(url, "/metrics") == 0)
        return 0;
    struct snap_view *v = snapshot_acquire(srv->snap);
    if (!v || !v->standby) {
        if (v)
            snap_view_unref(v);
        return 0;
    }
    char buf[SNAP_URL_MAX + 4096];
    struct location l = {.p = buf, .cap = sizeof(buf), .first = 1};
    buf[0] = '\0';
    loc_put(&l, v->leader_rest, strlen(v->leader_rest));
    int known = v->leader_rest[0] != '\0';
    snap_view_unref(v);
    if (!known) {
        *ret = reply_error(c, MHD_HTTP_SERVICE_UNAVAILABLE, "no leader",
                           "this musterd stands by and no leader is elected yet: ask again in a few seconds", NULL);
        return 1;
    }
    loc_put(&l, url, strlen(url));
    MHD_get_connection_values(c, MHD_GET_ARGUMENT_KIND, loc_arg, &l);
    if (l.overflow) {
        *ret = reply_error(c, MHD_HTTP_URI_TOO_LONG, "request too long", "the query is too long to send on", NULL);
        return 1;
    }
    json_t *doc = json_pack("{s:s, s:s, s:s}", "error", "not the leader", "detail",
                            "this musterd stands by; the leader answers at the address in location", "location", buf);
    struct MHD_Response *r = NULL;
    char *body = dump(doc);
    if (body && !(r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE)))
        free(body);
    if (r)
        MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, buf);
    *ret = queue(c, MHD_HTTP_TEMPORARY_REDIRECT, r, CT_JSON, NULL);
    return 1;
}

/* ---- names ---------------------------------------------------------------- */

/*
 * Host names an allowed host and Origin, when present, too (daemon/http_host.h);
 * else answers 421 or 403 naming what came, and returns 1. /healthz answers
 * whatever name a probe uses: it tells nothing.
 */
static int misaddressed(struct http_server *srv, struct MHD_Connection *c, const char *url, enum MHD_Result *ret)
{
    if (strcmp(url, "/healthz") == 0)
        return 0;
    const char *host = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_HOST);
    const char *origin = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_ORIGIN);
    char peer[INET_ADDRSTRLEN], detail[320];
    if (!host || !http_host_allowed(&srv->hosts, host)) {
        client_addr(c, peer, sizeof(peer));
        snprintf(detail, sizeof(detail),
                 "Host %s%.100s%s is not a name of this musterd (its REST address, or one in rest_hosts; "
                 "port %u)",
                 host ? "'" : "", host ? host : "missing", host ? "'" : "", srv->hosts.port);
        log_warn_limited("http: refused %s from %s: Host %.100s is not an allowed name", url, peer,
                         host ? host : "missing");
        *ret = reply_error(c, MHD_HTTP_MISDIRECTED_REQUEST, "misdirected request", detail, NULL);
        return 1;
    }
    if (origin && !http_origin_allowed(&srv->hosts, origin)) {
        client_addr(c, peer, sizeof(peer));
        snprintf(detail, sizeof(detail),
                 "Origin '%.100s' is not this musterd: requests from another site's pages are refused", origin);
        log_warn_limited("http: refused %s from %s: Origin %.100s is another site", url, peer, origin);
        *ret = reply_error(c, MHD_HTTP_FORBIDDEN, "cross-origin request", detail, NULL);
        return 1;
    }
    return 0;
}

/* ---- routing ------------------------------------------------------------ */

typedef enum MHD_Result (*get_fn)(struct http_server *srv, struct MHD_Connection *c);

static const struct {
    const char *path;
    get_fn get;                    /* GET and HEAD, else NULL */
    int post;                      /* POST carries out action */
    enum http_admin_action action;
} routes[] = {
    {"/", get_dashboard, 0, 0},
    {"/healthz", get_healthz, 0, 0},
    {"/metrics", get_metrics, 0, 0},
    {"/v1/status", get_status, 0, 0},
    {"/v1/nodes", get_nodes, 0, 0},
    {"/v1/ranks", get_ranks, 0, 0},
    {"/v1/events", get_events, 0, 0},
    {"/v1/history", get_history, 0, 0},
    {"/v1/plan", get_plan, 0, 0},
    {"/v1/stacks", get_stacks, 1, HTTP_ADMIN_STACKS},
    {"/v1/job/stop", NULL, 1, HTTP_ADMIN_STOP},
    {"/v1/job/restart", NULL, 1, HTTP_ADMIN_RESTART},
    {"/v1/job/checkpoint", NULL, 1, HTTP_ADMIN_CHECKPOINT},
};

#define DRAIN_PREFIX "/v1/nodes/"
#define DRAIN_SUFFIX "/drain"

static enum MHD_Result dispatch(struct http_server *srv, struct MHD_Connection *c, struct request *rq,
                                const char *url, const char *method)
{
    int is_get = strcmp(method, MHD_HTTP_METHOD_GET) == 0 ||
                 strcmp(method, MHD_HTTP_METHOD_HEAD) == 0;
    int is_post = strcmp(method, MHD_HTTP_METHOD_POST) == 0;
    enum MHD_Result ret;

    if (misaddressed(srv, c, url, &ret))
        return ret;

    /* Every read but the health check, whatever its path (endpoints added later included). */
    if (is_get && strcmp(url, "/healthz") != 0 && !may_read(srv, c)) {
        char peer[INET_ADDRSTRLEN];
        client_addr(c, peer, sizeof(peer));
        log_warn_limited("http: refused GET %s from %s: missing or wrong read token", url, peer);
        return reply_error(c, MHD_HTTP_UNAUTHORIZED, "unauthorized",
                           "reads need the read token: \"Authorization: Bearer <read token>\" (or the admin token)",
                           NULL);
    }

    if ((is_get || (is_post && srv->admin_token && authorized(srv, c))) && redirect_to_leader(srv, c, url, &ret))
        return ret;

    for (size_t i = 0; i < sizeof(routes) / sizeof(routes[0]); i++) {
        if (strcmp(url, routes[i].path) != 0)
            continue;
        if (is_get && routes[i].get)
            return routes[i].get(srv, c);
        if (is_post && routes[i].post)
            return admin(srv, c, routes[i].action, NULL, 0);
        return reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed",
                           routes[i].get && routes[i].post ? "this endpoint takes GET or POST"
                           : routes[i].get                 ? "this endpoint takes GET"
                                                           : "this endpoint takes POST",
                           routes[i].get && routes[i].post ? "GET, HEAD, POST" : routes[i].get ? "GET, HEAD" : "POST");
    }

    size_t len = strlen(url), pre = strlen(LOG_PREFIX), suf = strlen(LOG_SUFFIX);
    if (len > pre + suf && strncmp(url, LOG_PREFIX, pre) == 0 && strcmp(url + len - suf, LOG_SUFFIX) == 0 &&
        !memchr(url + pre, '/', len - pre - suf)) {
        if (!is_get)
            return reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed",
                               "this endpoint takes GET", "GET, HEAD");
        return get_rank_log(srv, c, rq, url + pre, len - pre - suf);
    }

    pre = strlen(DRAIN_PREFIX);
    suf = strlen(DRAIN_SUFFIX);
    if (len >= pre + suf && strncmp(url, DRAIN_PREFIX, pre) == 0 &&
        strcmp(url + len - suf, DRAIN_SUFFIX) == 0) {
        if (!is_post)
            return reply_error(c, MHD_HTTP_METHOD_NOT_ALLOWED, "method not allowed",
                               "this endpoint takes POST", "POST");
        return admin(srv, c, HTTP_ADMIN_DRAIN, url + pre, len - pre - suf);
    }
    return reply_error(c, MHD_HTTP_NOT_FOUND, "not found",
                       "see GET /v1/status, /v1/nodes, /v1/ranks, /v1/ranks/{rank}/log, /v1/events, "
                       "/v1/history, /v1/stacks, /metrics, /healthz",
                       NULL);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
                                  const char *method, const char *version, const char *upload_data,
                                  size_t *upload_data_size, void **con_cls)
{
    struct http_server *srv = cls;
    struct request *rq = *con_cls;

    if (!rq) {
        /* First call: headers only. Refuse a declared oversized body at once. */
        rq = calloc(1, sizeof(*rq));
        if (!rq)
            return MHD_NO;
        *con_cls = rq;
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > HTTP_BODY_LIMIT)
            return reply_error(c, MHD_HTTP_CONTENT_TOO_LARGE, "request body too large",
                               "requests take no body (limit 4096 bytes)", NULL);
        return MHD_YES;
    }
    if (*upload_data_size > 0) {
        /* Bodies are ignored; an undeclared oversized one drops the connection. */
        rq->body_len += *upload_data_size;
        *upload_data_size = 0;
        return rq->body_len > HTTP_BODY_LIMIT ? MHD_NO : MHD_YES;
    }
    http_guard_received(c); /* all in: the time to make the answer is ours, not the client's */
    return dispatch(srv, c, rq, url, method);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                         enum MHD_RequestTerminationCode toe)
{
    struct request *rq = *con_cls;
    http_guard_completed(c);
    if (rq && rq->log_state != LOG_NONE)
        atomic_fetch_sub(&rq->srv->logs_open, 1);
    if (rq)
        free(rq->lr.body); /* an answer never sent: the connection closed first */
    free(rq);
    *con_cls = NULL;
}

static void on_mhd_log(void *cls, const char *fmt, va_list ap)
{
    char line[512];
    vsnprintf(line, sizeof(line), fmt, ap);
    size_t len = strlen(line);
    while (len > 0 && line[len - 1] == '\n')
        line[--len] = '\0';
    log_debug("http: libmicrohttpd: %s", line);
}

/* ---- lifecycle ---------------------------------------------------------- */

/*
 * MHD reports a failed bind only through its log, so try the bind here
 * first (with SO_REUSEADDR, as MHD does) to name the real cause.
 */
static int probe_bind(const struct sockaddr_in *sa)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1, rc = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (const struct sockaddr *)sa, sizeof(*sa)) != 0)
        rc = -errno;
    close(fd);
    return rc;
}

static void bind_error(char *err, size_t errlen, const char *addr, uint16_t port, int rc)
{
    if (rc == -EADDRINUSE)
        snprintf(err, errlen,
                 "%s:%u is already in use (another musterd? see `ss -ltnp 'sport = :%u'`)", addr,
                 port, port);
    else if (rc == -EADDRNOTAVAIL)
        snprintf(err, errlen, "cannot bind %s:%u: no local interface has address %s", addr, port,
                 addr);
    else if (rc == -EACCES)
        snprintf(err, errlen, "cannot bind %s:%u: permission denied (ports below 1024 need root)",
                 addr, port);
    else
        snprintf(err, errlen, "cannot serve REST on %s:%u: %s", addr, port, strerror(-rc));
}

int http_start(struct http_server **out, const struct http_config *cfg, struct snapshot *snap,
               http_admin_fn admin_fn, void *ctx, char *err, size_t errlen)
{
    const char *addr = cfg->addr ? cfg->addr : "127.0.0.1";
    struct sockaddr_in sa;
    memset(&sa, 0, sizeof(sa));
    sa.sin_family = AF_INET;
    sa.sin_port = htons(cfg->port);
    if (inet_pton(AF_INET, addr, &sa.sin_addr) != 1) {
        snprintf(err, errlen, "REST address '%s' is not an IPv4 address", addr);
        return -EINVAL;
    }
    if (cfg->port != 0) {
        int rc = probe_bind(&sa);
        if (rc < 0) {
            bind_error(err, errlen, addr, cfg->port, rc);
            return rc;
        }
    }

    struct http_server *srv = calloc(1, sizeof(*srv));
    if (!srv) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    srv->snap = snap;
    srv->admin = admin_fn;
    srv->ctx = ctx;
    srv->log = cfg->log;
    srv->log_ctx = cfg->log_ctx;
    srv->checkpoints = cfg->checkpoints;
    if ((cfg->admin_token && !(srv->admin_token = strdup(cfg->admin_token))) ||
        (cfg->read_token && !(srv->read_token = strdup(cfg->read_token)))) {
        free(srv->admin_token);
        free(srv->read_token);
        free(srv);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }

    char herr[160] = "";
    if (http_hosts_init(&srv->hosts, addr, cfg->port) != 0 ||
        http_hosts_add(&srv->hosts, cfg->hosts ? cfg->hosts : "", herr, sizeof(herr)) != 0) {
        snprintf(err, errlen, "REST host names: %s", herr);
        free(srv->admin_token);
        free(srv->read_token);
        free(srv);
        return -EINVAL;
    }

    struct http_guard_limits lim = {
        .max_conns = cfg->max_conns ? cfg->max_conns : HTTP_CONNECTION_LIMIT,
        .max_per_addr = cfg->max_per_addr ? cfg->max_per_addr : HTTP_ADDR_LIMIT,
        .request_ms = cfg->request_ms ? cfg->request_ms : HTTP_REQUEST_MS,
        .slow_answer_ms = cfg->slow_answer_ms ? cfg->slow_answer_ms : HTTP_SLOW_ANSWER_MS,
    };
    int grc = http_guard_start(&srv->guard, &lim);
    if (grc != 0) {
        snprintf(err, errlen, "cannot start the REST connection guard: %s", strerror(-grc));
        free(srv->admin_token);
        free(srv->read_token);
        free(srv);
        return grc;
    }
    errno = 0;
    /* libmicrohttpd shares its connection limit out among its threads: each
     * gets room for all, so that the guard's limits are the ones that bind. */
    srv->mhd = MHD_start_daemon(
        MHD_USE_AUTO | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_ERROR_LOG |
            MHD_ALLOW_SUSPEND_RESUME, /* log requests wait for the loop's answer */
        cfg->port, NULL,
        NULL, on_request, srv, MHD_OPTION_SOCK_ADDR, (struct sockaddr *)&sa,
        MHD_OPTION_THREAD_POOL_SIZE, (unsigned int)HTTP_THREADS,
        MHD_OPTION_CONNECTION_LIMIT, (unsigned int)((lim.max_conns + HTTP_MHD_SLACK) * HTTP_THREADS),
        MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)HTTP_IDLE_TIMEOUT_S,
        MHD_OPTION_NOTIFY_CONNECTION, http_guard_notify, srv->guard,
        MHD_OPTION_NOTIFY_COMPLETED, on_completed, NULL, MHD_OPTION_EXTERNAL_LOGGER, on_mhd_log,
        NULL, MHD_OPTION_END);
    if (!srv->mhd) {
        int rc = errno ? -errno : -EIO;
        bind_error(err, errlen, addr, cfg->port, rc);
        http_guard_stop(srv->guard);
        free(srv->admin_token);
        free(srv->read_token);
        free(srv);
        return rc;
    }

    const union MHD_DaemonInfo *di = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_BIND_PORT);
    srv->port = di ? di->port : cfg->port;
    /* port 0: no request can come before the caller learns the port from us */
    srv->hosts.port = srv->port;
    *out = srv;
    return 0;
}

uint16_t http_port(const struct http_server *srv)
{
    return srv->port;
}

void http_guard_counts(struct http_server *srv, struct http_guard_stats *out)
{
    http_guard_stats(srv->guard, out);
}

/* Log requests the loop answered at shutdown are resumed but not yet written:
 * MHD's thread gets a bounded moment to send them before it is stopped. */
#define HTTP_STOP_DRAIN_MS 1000

void http_stop(struct http_server *srv)
{
    if (!srv)
        return;
    for (int waited = 0; atomic_load(&srv->logs_open) > 0 && waited < HTTP_STOP_DRAIN_MS; waited += 10)
        usleep(10 * 1000);
    MHD_stop_daemon(srv->mhd);
    http_guard_stop(srv->guard);
    if (srv->admin_token)
        OPENSSL_cleanse(srv->admin_token, strlen(srv->admin_token));
    if (srv->read_token)
        OPENSSL_cleanse(srv->read_token, strlen(srv->read_token));
    free(srv->admin_token);
    free(srv->read_token);
    free(srv);
}
