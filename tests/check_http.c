/*
 * http: the REST server driven over loopback with libcurl, from a snapshot
 * the test publishes itself, plus the Prometheus renderer on its own.
 * Every test starts its own server on 127.0.0.1, port 0 (checked fixture:
 * it runs in the forked child).
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "daemon/http.h"
#include "daemon/metrics.h"
#include "daemon/snapshot.h"

#define TOKEN "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"

static const char status_doc[] =
    "{\"job\":\"demo\",\"state\":\"running\",\"reason\":null,\"generation\":3,"
    "\"world_size\":4,\"restarts\":1,\"max_restarts\":5,\"step\":120,\"loss\":2.5,"
    "\"tokens_per_s\":1000.5,\"comm_frac\":0.25,\"uptime_s\":61.5,\"last_checkpoint_step\":100,"
    "\"nodes\":[{\"name\":\"a\",\"state\":\"joined\",\"addr\":\"10.0.0.1\",\"devices\":2,"
    "\"kind\":\"cpu\",\"ranks\":[0,1],\"heartbeat_age_ms\":250},"
    "{\"name\":\"b\",\"state\":\"lost\",\"addr\":\"10.0.0.2\",\"devices\":2,"
    "\"kind\":\"cpu\",\"ranks\":[2,3],\"heartbeat_age_ms\":null}],"
    "\"ranks\":[{\"rank\":0,\"node\":\"a\",\"local_rank\":0,\"device\":0,\"state\":\"running\","
    "\"step\":120,\"loss\":2.5,\"tokens_per_s\":500,\"comm_frac\":0.2,\"heartbeat_age_ms\":1500},"
    "{\"rank\":1,\"node\":\"a\",\"local_rank\":1,\"device\":1,\"state\":\"running\","
    "\"step\":120,\"loss\":null,\"tokens_per_s\":500.5,\"comm_frac\":0.3,\"heartbeat_age_ms\":null}]}";

static const char events_doc[] =
    "{\"events\":[{\"seq\":1,\"time\":\"2024-01-01T00:00:00Z\",\"generation\":1,"
    "\"kind\":\"node_joined\",\"node\":\"a\",\"rank\":null,\"message\":\"a joined\"}]}";

/* ---- fixture ------------------------------------------------------------ */

static struct snapshot snap;
static struct http_server *srv;
static uint16_t port;

static struct {
    pthread_mutex_t lock;
    int calls;
    enum http_admin_action action;
    char node[64];
} rec = {PTHREAD_MUTEX_INITIALIZER, 0, 0, ""};

static void record(void *ctx, enum http_admin_action action, const char *node)
{
    ck_assert_ptr_eq(ctx, &rec);
    pthread_mutex_lock(&rec.lock);
    rec.calls++;
    rec.action = action;
    snprintf(rec.node, sizeof(rec.node), "%s", node ? node : "(null)");
    pthread_mutex_unlock(&rec.lock);
}

static int recorded(enum http_admin_action *action, char *node)
{
    pthread_mutex_lock(&rec.lock);
    int calls = rec.calls;
    if (action)
        *action = rec.action;
    if (node)
        strcpy(node, rec.node);
    pthread_mutex_unlock(&rec.lock);
    return calls;
}

/* ---- a stand-in for the loop's side of rank logs ------------------------- */

enum fake_mode {
    FAKE_LATER,  /* answered 200 from another thread after 100 ms */
    FAKE_AT_ONCE, /* refused inside the call (503), as logfetch does when full */
    FAKE_HOLD,   /* kept until the test answers it */
};

static struct {
    pthread_mutex_t lock;
    enum fake_mode mode;
    int calls;
    struct logfetch_req query; /* a copy of the last one */
    struct logfetch_req *held;
} fake = {PTHREAD_MUTEX_INITIALIZER, FAKE_LATER, 0, {0}, NULL};

static void *answer_later(void *arg)
{
    struct logfetch_req *req = arg;
    usleep(100000);
    req->status = 200;
    req->body = strdup("{\"rank\":1,\"data\":\"hello\\n\"}");
    req->done(req);
    return NULL;
}

static void fake_log(void *ctx, struct logfetch_req *req)
{
    ck_assert_ptr_eq(ctx, &fake);
    pthread_mutex_lock(&fake.lock);
    fake.calls++;
    fake.query = *req;
    enum fake_mode mode = fake.mode;
    if (mode == FAKE_HOLD)
        fake.held = req;
    pthread_mutex_unlock(&fake.lock);
    if (mode == FAKE_LATER) {
        pthread_t th;
        ck_assert_int_eq(pthread_create(&th, NULL, answer_later, req), 0);
        pthread_detach(th);
    } else if (mode == FAKE_AT_ONCE) {
        req->status = 503;
        req->body = strdup("{\"error\":\"too many log requests in flight\",\"detail\":\"x\"}");
        req->done(req);
    }
}

static void start_server(const char *token)
{
    struct http_config cfg = {.addr = "127.0.0.1", .port = 0, .admin_token = token, .log = fake_log,
                              .log_ctx = &fake};
    char err[256] = "";
    pthread_mutex_lock(&rec.lock);
    rec.calls = 0;
    pthread_mutex_unlock(&rec.lock);
    pthread_mutex_lock(&fake.lock);
    fake.mode = FAKE_LATER;
    fake.calls = 0;
    fake.held = NULL;
    pthread_mutex_unlock(&fake.lock);
    snapshot_init(&snap);
    int rc = http_start(&srv, &cfg, &snap, record, &rec, err, sizeof(err));
    ck_assert_msg(rc == 0, "http_start: %d %s", rc, err);
    port = http_port(srv);
    ck_assert_uint_ne(port, 0);
    curl_global_init(CURL_GLOBAL_DEFAULT);
}

static void setup_admin(void) { start_server(TOKEN); }
static void setup_no_admin(void) { start_server(NULL); }

static void teardown(void)
{
    http_stop(srv);
    srv = NULL;
    snapshot_destroy(&snap);
    curl_global_cleanup();
}

static void publish_all(void)
{
    snapshot_publish(&snap, SNAP_STATUS, strdup(status_doc));
    snapshot_publish(&snap, SNAP_EVENTS, strdup(events_doc));
}

/* ---- client ------------------------------------------------------------- */

struct resp {
    long status;
    char body[65536];
    size_t len;
    char headers[4096];
    size_t hlen;
};

static size_t on_body(char *d, size_t sz, size_t n, void *p)
{
    struct resp *r = p;
    size_t len = sz * n;
    if (r->len + len >= sizeof(r->body))
        return 0;
    memcpy(r->body + r->len, d, len);
    r->len += len;
    r->body[r->len] = '\0';
    return len;
}

static size_t on_header(char *d, size_t sz, size_t n, void *p)
{
    struct resp *r = p;
    size_t len = sz * n;
    if (r->hlen + len < sizeof(r->headers)) {
        memcpy(r->headers + r->hlen, d, len);
        r->hlen += len;
        r->headers[r->hlen] = '\0';
    }
    return len;
}

/* method GET/POST/HEAD; auth is a whole header line or NULL; body for POST. */
static struct resp *request(const char *method, const char *path, const char *auth,
                            const char *body)
{
    static struct resp r;
    char url[256];
    memset(&r, 0, sizeof(r));
    snprintf(url, sizeof(url), "http://127.0.0.1:%u%s", port, path);
    CURL *h = curl_easy_init();
    struct curl_slist *hdrs = NULL;
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 3000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &r);
    curl_easy_setopt(h, CURLOPT_HEADERFUNCTION, on_header);
    curl_easy_setopt(h, CURLOPT_HEADERDATA, &r);
    if (strcmp(method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body ? body : "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, (long)(body ? strlen(body) : 0));
    } else if (strcmp(method, "HEAD") == 0) {
        curl_easy_setopt(h, CURLOPT_NOBODY, 1L);
    }
    if (auth) {
        hdrs = curl_slist_append(hdrs, auth);
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    }
    CURLcode cc = curl_easy_perform(h);
    ck_assert_msg(cc == CURLE_OK, "%s %s: %s", method, path, curl_easy_strerror(cc));
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &r.status);
    curl_slist_free_all(hdrs);
    curl_easy_cleanup(h);
    return &r;
}

static struct resp *get(const char *path) { return request("GET", path, NULL, NULL); }

static void assert_header(const struct resp *r, const char *line)
{
    ck_assert_msg(strcasestr(r->headers, line) != NULL, "header '%s' missing in:\n%s", line,
                  r->headers);
}

static void assert_error(const struct resp *r, long status, const char *error)
{
    ck_assert_int_eq(r->status, status);
    assert_header(r, "Content-Type: application/json");
    json_t *doc = json_loads(r->body, 0, NULL);
    ck_assert_msg(doc != NULL, "error body is not JSON: %s", r->body);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "error")), error);
    json_decref(doc);
}

static void assert_has_line(const char *text, const char *line)
{
    char want[512];
    snprintf(want, sizeof(want), "\n%s\n", line);
    /* every line of interest follows a HELP/TYPE line, so it starts after '\n' */
    ck_assert_msg(strstr(text, want) != NULL, "line '%s' missing in:\n%s", line, text);
}

/* ---- read endpoints ----------------------------------------------------- */

START_TEST(test_starting)
{
    assert_error(get("/v1/status"), 503, "starting");
    assert_error(get("/v1/nodes"), 503, "starting");
    assert_error(get("/v1/events"), 503, "starting");
    assert_error(get("/metrics"), 503, "starting");
    struct resp *r = get("/healthz");
    ck_assert_int_eq(r->status, 200);
    ck_assert_str_eq(r->body, "ok\n");
}
END_TEST

START_TEST(test_status_as_published)
{
    publish_all();
    struct resp *r = get("/v1/status");
    ck_assert_int_eq(r->status, 200);
    assert_header(r, "Content-Type: application/json");
    assert_header(r, "Cache-Control: no-store");
    ck_assert_str_eq(r->body, status_doc);
    r = get("/v1/events");
    ck_assert_int_eq(r->status, 200);
    ck_assert_str_eq(r->body, events_doc);

    /* a later publish is what the next request sees */
    snapshot_publish(&snap, SNAP_STATUS, strdup("{\"state\":\"stopped\",\"nodes\":[],\"ranks\":[]}"));
    ck_assert_str_eq(get("/v1/status")->body, "{\"state\":\"stopped\",\"nodes\":[],\"ranks\":[]}");
}
END_TEST

START_TEST(test_nodes_and_ranks)
{
    publish_all();
    json_t *status = json_loads(status_doc, 0, NULL);
    const char *keys[] = {"nodes", "ranks"};
    for (int i = 0; i < 2; i++) {
        char path[32];
        snprintf(path, sizeof(path), "/v1/%s", keys[i]);
        struct resp *r = get(path);
        ck_assert_int_eq(r->status, 200);
        json_t *doc = json_loads(r->body, 0, NULL);
        ck_assert_msg(json_is_object(doc) && json_object_size(doc) == 1, "%s: %s", path, r->body);
        ck_assert_msg(json_equal(json_object_get(doc, keys[i]), json_object_get(status, keys[i])),
                      "%s: %s", path, r->body);
        json_decref(doc);
    }
    json_decref(status);
}
END_TEST

START_TEST(test_malformed_status)
{
    snapshot_publish(&snap, SNAP_STATUS, strdup("{\"state\":\"running\"}"));
    assert_error(get("/v1/nodes"), 500, "internal error");
    ck_assert_int_eq(get("/v1/status")->status, 200);
}
END_TEST

START_TEST(test_metrics)
{
    publish_all();
    struct resp *r = get("/metrics");
    ck_assert_int_eq(r->status, 200);
    assert_header(r, "Content-Type: text/plain; version=0.0.4");
    assert_has_line(r->body, "# TYPE muster_generation gauge");
    assert_has_line(r->body, "muster_generation 3");
    assert_has_line(r->body, "muster_world_size 4");
    assert_has_line(r->body, "# TYPE muster_restarts_total counter");
    assert_has_line(r->body, "muster_restarts_total 1");
    assert_has_line(r->body, "muster_step 120");
    assert_has_line(r->body, "muster_loss 2.5");
    assert_has_line(r->body, "muster_tokens_per_second 1000.5");
    assert_has_line(r->body, "muster_comm_fraction 0.25");
    assert_has_line(r->body, "muster_job_state{state=\"running\"} 1");
    assert_has_line(r->body, "muster_job_state{state=\"waiting\"} 0");
    assert_has_line(r->body, "muster_job_state{state=\"failed\"} 0");
    assert_has_line(r->body, "muster_nodes{state=\"joined\"} 1");
    assert_has_line(r->body, "muster_nodes{state=\"lost\"} 1");
    assert_has_line(r->body, "muster_nodes{state=\"left\"} 0");
    assert_has_line(r->body, "muster_rank_step{rank=\"0\",node=\"a\"} 120");
    assert_has_line(r->body, "muster_rank_loss{rank=\"0\",node=\"a\"} 2.5");
    assert_has_line(r->body, "muster_rank_heartbeat_age_seconds{rank=\"0\",node=\"a\"} 1.5");
    /* null values leave their sample out */
    ck_assert_ptr_null(strstr(r->body, "muster_rank_loss{rank=\"1\""));
    ck_assert_ptr_null(strstr(r->body, "muster_rank_heartbeat_age_seconds{rank=\"1\""));
    /* exactly one job state is 1 */
    int ones = 0;
    for (const char *p = r->body; (p = strstr(p, "muster_job_state{")); p++)
        ones += strncmp(strchr(p, '}'), "} 1\n", 4) == 0;
    ck_assert_int_eq(ones, 1);
}
END_TEST

START_TEST(test_metrics_escaping)
{
    char *out = NULL, err[128];
    const char *doc = "{\"state\":\"forming\",\"nodes\":[],\"ranks\":[{\"rank\":7,"
                      "\"node\":\"x\\\"y\\\\z\\nw\",\"step\":5}]}";
    ck_assert_int_eq(metrics_render(doc, &out, err, sizeof(err)), 0);
    assert_has_line(out, "muster_rank_step{rank=\"7\",node=\"x\\\"y\\\\z\\nw\"} 5");
    assert_has_line(out, "muster_job_state{state=\"forming\"} 1");
    free(out);
    ck_assert_int_eq(metrics_render("[1]", &out, err, sizeof(err)), -EINVAL);
    ck_assert_int_eq(metrics_render("{", &out, err, sizeof(err)), -EINVAL);
}
END_TEST

START_TEST(test_dashboard)
{
    struct resp *r = get("/");
    ck_assert_int_eq(r->status, 200);
    assert_header(r, "Content-Type: text/html");
    ck_assert_ptr_nonnull(strstr(r->body, "/v1/status"));
    ck_assert_ptr_nonnull(strstr(r->body, "<canvas"));
    ck_assert_ptr_null(strstr(r->body, "http://"));
    ck_assert_ptr_null(strstr(r->body, "https://"));
}
END_TEST

/* ---- admin -------------------------------------------------------------- */

START_TEST(test_admin_auth)
{
    enum http_admin_action action;
    char node[64];

    assert_error(request("POST", "/v1/job/stop", NULL, NULL), 401, "unauthorized");
    assert_header(request("POST", "/v1/job/stop", NULL, NULL), "WWW-Authenticate: Bearer");
    assert_error(request("POST", "/v1/job/stop", "Authorization: Bearer nope", NULL), 401,
                 "unauthorized");
    assert_error(request("POST", "/v1/job/stop", "Authorization: Basic " TOKEN, NULL), 401,
                 "unauthorized");
    assert_error(request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN "0", NULL), 401,
                 "unauthorized");
    ck_assert_int_eq(recorded(NULL, NULL), 0);

    struct resp *r = request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, NULL);
    ck_assert_int_eq(r->status, 202);
    ck_assert_str_eq(r->body, "{\"accepted\":\"stop\"}");
    ck_assert_int_eq(recorded(&action, node), 1);
    ck_assert_int_eq(action, HTTP_ADMIN_STOP);
    ck_assert_str_eq(node, "(null)");

    r = request("POST", "/v1/job/restart", "Authorization: Bearer " TOKEN, NULL);
    ck_assert_int_eq(r->status, 202);
    ck_assert_int_eq(recorded(&action, node), 2);
    ck_assert_int_eq(action, HTTP_ADMIN_RESTART);

    /* drain checks the node against the published status */
    assert_error(request("POST", "/v1/nodes/gpu-node_07.rack2/drain",
                         "Authorization: Bearer " TOKEN, NULL),
                 503, "starting");
    snapshot_publish(&snap, SNAP_STATUS,
                     strdup("{\"nodes\":[{\"name\":\"a\"},{\"name\":\"gpu-node_07.rack2\"}]}"));
    r = request("POST", "/v1/nodes/gpu-node_07.rack2/drain", "Authorization: Bearer " TOKEN, NULL);
    ck_assert_int_eq(r->status, 202);
    ck_assert_str_eq(r->body, "{\"accepted\":\"drain\",\"node\":\"gpu-node_07.rack2\"}");
    ck_assert_int_eq(recorded(&action, node), 3);
    ck_assert_int_eq(action, HTTP_ADMIN_DRAIN);
    ck_assert_str_eq(node, "gpu-node_07.rack2");
    r = request("POST", "/v1/nodes/gpu-node_07/drain", "Authorization: Bearer " TOKEN, NULL);
    assert_error(r, 404, "no such node");
    ck_assert_int_eq(recorded(NULL, NULL), 3);
}
END_TEST

START_TEST(test_drain_bad_names)
{
    const char *bad[] = {"/v1/nodes//drain", "/v1/nodes/a%20b/drain", "/v1/nodes/a/b/drain",
                         "/v1/nodes/a;rm/drain",
                         "/v1/nodes/0123456789012345678901234567890123456789012345678901234567890123/drain"};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
        assert_error(request("POST", bad[i], "Authorization: Bearer " TOKEN, NULL), 400,
                     "invalid node name");
    ck_assert_int_eq(recorded(NULL, NULL), 0);
    /* authentication comes first: no token, no validation hints */
    assert_error(request("POST", "/v1/nodes/a;b/drain", NULL, NULL), 401, "unauthorized");
}
END_TEST

START_TEST(test_admin_disabled)
{
    struct resp *r = request("POST", "/v1/job/restart", "Authorization: Bearer " TOKEN, NULL);
    assert_error(r, 403, "admin disabled");
    ck_assert_ptr_nonnull(strstr(r->body, "--admin-token-file"));
    ck_assert_int_eq(recorded(NULL, NULL), 0);
}
END_TEST

START_TEST(test_body_limit)
{
    static char big[5000];
    memset(big, 'x', sizeof(big) - 1);
    assert_error(request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, big), 413,
                 "request body too large");
    ck_assert_int_eq(recorded(NULL, NULL), 0);
    /* a small body is ignored */
    ck_assert_int_eq(request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, "{}")->status,
                     202);
}
END_TEST

/* ---- routing and start-up ----------------------------------------------- */

START_TEST(test_routing_errors)
{
    publish_all();
    assert_error(get("/v2/status"), 404, "not found");
    assert_error(get("/v1/status/"), 404, "not found");
    struct resp *r = request("POST", "/v1/status", NULL, NULL);
    assert_error(r, 405, "method not allowed");
    assert_header(r, "Allow: GET, HEAD");
    r = get("/v1/job/stop");
    assert_error(r, 405, "method not allowed");
    assert_header(r, "Allow: POST");
    ck_assert_int_eq(get("/v1/nodes/a/drain")->status, 405);
    r = request("HEAD", "/v1/status", NULL, NULL);
    ck_assert_int_eq(r->status, 200);
    ck_assert_uint_eq(r->len, 0);
    ck_assert_int_eq(recorded(NULL, NULL), 0);
}
END_TEST

START_TEST(test_port_in_use)
{
    struct http_server *second = NULL;
    struct snapshot s2;
    char err[256] = "", want[64];
    snapshot_init(&s2);
    struct http_config cfg = {.addr = "127.0.0.1", .port = port};
    int rc = http_start(&second, &cfg, &s2, record, &rec, err, sizeof(err));
    ck_assert_int_eq(rc, -EADDRINUSE);
    ck_assert_ptr_null(second);
    snprintf(want, sizeof(want), "127.0.0.1:%u is already in use", port);
    ck_assert_msg(strstr(err, want) != NULL, "message: %s", err);
    ck_assert_msg(strstr(err, "ss -ltnp") != NULL, "message: %s", err);

    struct http_config bad = {.addr = "localhost:1"};
    ck_assert_int_eq(http_start(&second, &bad, &s2, record, &rec, err, sizeof(err)), -EINVAL);
    snapshot_destroy(&s2);
}
END_TEST

/* ---- rank logs ------------------------------------------------------------ */

static int fake_calls(struct logfetch_req *query)
{
    pthread_mutex_lock(&fake.lock);
    int n = fake.calls;
    if (query)
        *query = fake.query;
    pthread_mutex_unlock(&fake.lock);
    return n;
}

START_TEST(test_log_query_reaches_the_loop)
{
    struct logfetch_req q;
    struct resp *r = get("/v1/ranks/7/log?offset=123&max=100&generation=4");
    ck_assert_int_eq(r->status, 200); /* answered after the connection was suspended */
    assert_header(r, "Content-Type: application/json");
    ck_assert_str_eq(r->body, "{\"rank\":1,\"data\":\"hello\\n\"}");
    ck_assert_int_eq(fake_calls(&q), 1);
    ck_assert_uint_eq(q.rank, 7);
    ck_assert_uint_eq(q.offset, 123);
    ck_assert_uint_eq(q.max, 100);
    ck_assert_uint_eq(q.generation, 4);
    ck_assert_uint_eq(q.tail, 0);

    /* Defaults: from offset 0 of the newest generation, 64 KiB at most. */
    ck_assert_int_eq(get("/v1/ranks/4294967295/log?tail=10")->status, 200);
    fake_calls(&q);
    ck_assert_uint_eq(q.rank, 4294967295u);
    ck_assert_uint_eq(q.tail, 10);
    ck_assert_uint_eq(q.offset, 0);
    ck_assert_uint_eq(q.max, PROTO_LOG_MAX);
    ck_assert_uint_eq(q.generation, 0);
    r = request("HEAD", "/v1/ranks/0/log", NULL, NULL);
    ck_assert_int_eq(r->status, 200);
    ck_assert_uint_eq(r->len, 0);

    /* Answered inside the call (refused at once). */
    pthread_mutex_lock(&fake.lock);
    fake.mode = FAKE_AT_ONCE;
    pthread_mutex_unlock(&fake.lock);
    assert_error(get("/v1/ranks/1/log"), 503, "too many log requests in flight");
    ck_assert_int_eq(fake_calls(NULL), 4);
}
END_TEST

START_TEST(test_log_bad_queries)
{
    static const struct {
        const char *path;
        const char *error, *detail;
    } bad[] = {
        {"/v1/ranks/x/log", "invalid rank", "'x' is not a rank (0..4294967295)"},
        {"/v1/ranks/-1/log", "invalid rank", NULL},
        {"/v1/ranks/4294967296/log", "invalid rank", NULL},
        {"/v1/ranks/1/log?offset=abc", "invalid query", "offset: expected a byte offset 0..9007199254740991, got 'abc'"},
        {"/v1/ranks/1/log?offset=9007199254740992", "invalid query", NULL},
        {"/v1/ranks/1/log?offset=-5", "invalid query", NULL},
        {"/v1/ranks/1/log?offset=", "invalid query", NULL},
        {"/v1/ranks/1/log?tail=0", "invalid query", "tail: expected a number of bytes 1..4294967295, got '0'"},
        {"/v1/ranks/1/log?max=0", "invalid query", NULL},
        {"/v1/ranks/1/log?max=65537", "invalid query", "max: expected a number of bytes 1..65536, got '65537'"},
        {"/v1/ranks/1/log?generation=1.5", "invalid query", NULL},
        {"/v1/ranks/1/log?offset=1&tail=3", "invalid query", "give offset or tail, not both"},
        {"/v1/ranks/1/log?offset=1&offset=2", "invalid query", "offset: given twice"},
        {"/v1/ranks/1/log?lines=10", "invalid query", "unknown parameter 'lines' (offset, tail, max, generation)"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct resp *r = get(bad[i].path);
        assert_error(r, 400, bad[i].error);
        if (bad[i].detail) {
            json_t *doc = json_loads(r->body, 0, NULL);
            ck_assert_str_eq(json_string_value(json_object_get(doc, "detail")), bad[i].detail);
            json_decref(doc);
        }
    }
    assert_error(get("/v1/ranks/1/log/"), 404, "not found");
    assert_error(get("/v1/ranks/1/2/log"), 404, "not found");
    assert_error(get("/v1/ranks//log"), 404, "not found");
    struct resp *r = request("POST", "/v1/ranks/1/log", NULL, NULL);
    assert_error(r, 405, "method not allowed");
    assert_header(r, "Allow: GET, HEAD");
    ck_assert_int_eq(fake_calls(NULL), 0);
}
END_TEST

static void *get_in_background(void *arg)
{
    char url[128];
    snprintf(url, sizeof(url), "http://127.0.0.1:%u/v1/ranks/2/log", port);
    CURL *h = curl_easy_init();
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 3000L);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, arg);
    curl_easy_perform(h); /* the server may close it unanswered: either is fine */
    curl_easy_cleanup(h);
    return NULL;
}

/* A request answered as the server stops (what musterd's shutdown does:
 * logfetch_close, then http_stop) leaves no connection suspended. */
START_TEST(test_log_answered_at_shutdown)
{
    static struct resp body;
    pthread_t th;
    pthread_mutex_lock(&fake.lock);
    fake.mode = FAKE_HOLD;
    pthread_mutex_unlock(&fake.lock);
    ck_assert_int_eq(pthread_create(&th, NULL, get_in_background, &body), 0);
    struct logfetch_req *held = NULL;
    for (int i = 0; i < 200 && !held; i++) {
        usleep(10000);
        pthread_mutex_lock(&fake.lock);
        held = fake.held;
        pthread_mutex_unlock(&fake.lock);
    }
    ck_assert_ptr_nonnull(held);
    held->status = 503;
    held->body = strdup("{\"error\":\"shutting down\"}");
    held->done(held);
    http_stop(srv);
    srv = NULL;
    pthread_join(th, NULL);
}
END_TEST

START_TEST(test_log_unavailable_without_a_loop)
{
    struct http_server *plain = NULL;
    struct snapshot s2;
    char err[256] = "", url[128];
    snapshot_init(&s2);
    struct http_config cfg = {.addr = "127.0.0.1"};
    ck_assert_int_eq(http_start(&plain, &cfg, &s2, record, &rec, err, sizeof(err)), 0);
    uint16_t saved = port;
    port = http_port(plain);
    snprintf(url, sizeof(url), "/v1/ranks/0/log");
    assert_error(get(url), 503, "logs unavailable");
    port = saved;
    http_stop(plain);
    snapshot_destroy(&s2);
}
END_TEST

Suite *make_http_suite(void)
{
    Suite *s = suite_create("http");

    TCase *tc = tcase_create("read");
    tcase_add_checked_fixture(tc, setup_admin, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_starting);
    tcase_add_test(tc, test_status_as_published);
    tcase_add_test(tc, test_nodes_and_ranks);
    tcase_add_test(tc, test_malformed_status);
    tcase_add_test(tc, test_metrics);
    tcase_add_test(tc, test_metrics_escaping);
    tcase_add_test(tc, test_dashboard);
    tcase_add_test(tc, test_routing_errors);
    tcase_add_test(tc, test_port_in_use);
    suite_add_tcase(s, tc);

    tc = tcase_create("admin");
    tcase_add_checked_fixture(tc, setup_admin, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_admin_auth);
    tcase_add_test(tc, test_drain_bad_names);
    tcase_add_test(tc, test_body_limit);
    suite_add_tcase(s, tc);

    tc = tcase_create("logs");
    tcase_add_checked_fixture(tc, setup_no_admin, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_log_query_reaches_the_loop);
    tcase_add_test(tc, test_log_bad_queries);
    tcase_add_test(tc, test_log_answered_at_shutdown);
    tcase_add_test(tc, test_log_unavailable_without_a_loop);
    suite_add_tcase(s, tc);

    tc = tcase_create("admin_disabled");
    tcase_add_checked_fixture(tc, setup_no_admin, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_admin_disabled);
    suite_add_tcase(s, tc);
    return s;
}
