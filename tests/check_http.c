/*
 * http: the REST server driven over loopback with libcurl, from a snapshot
 * the test publishes itself, plus the Prometheus renderer on its own.
 * Every test starts its own server on 127.0.0.1, port 0 (checked fixture:
 * it runs in the forked child).
 */
#include <arpa/inet.h>
#include <check.h>
#include <errno.h>
#include <math.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>

#include "daemon/history.h"
#include "daemon/http.h"
#include "daemon/http_host.h"
#include "daemon/metrics.h"
#include "daemon/rdv.h"
#include "daemon/restdoc.h"
#include "daemon/snapshot.h"
#include "daemon/view_build.h"

#define TOKEN "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
/* base64 of "op:" TOKEN, Basic's form of it */
#define BASIC_TOKEN "b3A6MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWYwMTIzNDU2Nzg5YWJjZGVmMDEyMzQ1Njc4OWFiY2RlZg=="

/* The job-level fields of the test job (what rdv_summary_json gives). */
static const char head_doc[] =
    "{\"job\":\"demo\",\"state\":\"running\",\"reason\":null,\"generation\":3,"
    "\"world_size\":4,\"restarts\":1,\"max_restarts\":5,\"step\":120,\"loss\":2.5,"
    "\"tokens_per_s\":1000.5,\"comm_frac\":0.25,\"uptime_s\":61.5,\"last_checkpoint_step\":100}";

static const char events_doc[] =
    "{\"events\":[{\"seq\":1,\"time\":\"2024-01-01T00:00:00Z\",\"generation\":1,"
    "\"kind\":\"node_joined\",\"node\":\"a\",\"rank\":null,\"message\":\"a joined\"}]}";

static const char history_doc[] = "{\"stride\":1,\"samples\":2,\"capacity\":1024,\"step\":[1,2],"
                                  "\"loss\":[3.0,2.5],\"tokens_per_s\":[10.0,11.0],\"time_s\":[1.0,2.0],"
                                  "\"generation\":[1,1]}";

static void set_node(struct snap_view *v, uint32_t i, const char *name, int state, uint32_t first, uint32_t n,
                     int64_t age)
{
    struct snap_node *nd = &v->nodes[i];
    snprintf(nd->name, sizeof(nd->name), "%s", name);
    snprintf(nd->addr, sizeof(nd->addr), "10.0.0.%u", i + 1);
    nd->state = (uint8_t)state;
    nd->ndevices = n;
    nd->first_rank = first;
    nd->nranks = n;
    nd->heartbeat_age_ms = age;
}

static void set_rank(struct snap_view *v, uint32_t i, uint32_t node, int state, uint64_t step, double loss,
                     double tps, int64_t age)
{
    struct snap_rank *rk = &v->ranks[i];
    rk->rank = i;
    rk->node = node;
    rk->local_rank = i - v->nodes[node].first_rank;
    rk->device = rk->local_rank;
    rk->state = (uint8_t)state;
    rk->step = step;
    rk->loss = loss;
    rk->tokens_per_s = tps;
    rk->comm_frac = 0.25;
    rk->heartbeat_age_ms = age;
    rk->step_age_ms = -1;
}

/*
 * A view as the loop would publish it: job demo, running, generation 3; node
 * a joined with ranks 0-1 running, node b lost with ranks 2-3 exited (rank 2
 * the failed one). node_a names node a (escaping tests give odd names).
 */
static struct snap_view *test_view(const char *node_a)
{
    struct snap_view *v = snap_view_new(2, 4);
    ck_assert_ptr_nonnull(v);
    v->head = json_loads(head_doc, 0, NULL);
    ck_assert_ptr_nonnull(v->head);
    snprintf(v->state, sizeof(v->state), "running");
    v->events = strdup(events_doc);
    v->events_len = strlen(events_doc);
    v->history = strdup(history_doc);
    v->history_len = strlen(history_doc);
    v->stale_after_ms = 5000;
    set_node(v, 0, node_a, RDV_NODE_JOINED, 0, 2, 250);
    set_node(v, 1, "b", RDV_NODE_LOST, 2, 2, -1);
    set_rank(v, 0, 0, RDV_RANK_RUNNING, 120, 2.5, 500, 1500);
    set_rank(v, 1, 0, RDV_RANK_RUNNING, 121, NAN, 500.5, -1);
    set_rank(v, 2, 1, RDV_RANK_EXITED, 100, 3.0, 0, 9000);
    set_rank(v, 3, 1, RDV_RANK_EXITED, 100, NAN, 0, 9000);
    v->ranks[0].step_age_ms = 800;
    v->ranks[2].failed = 1;
    snprintf(v->failure_reason, sizeof(v->failure_reason), "CUDA error: out of memory \"x\"");
    view_derive(v);
    return v;
}

/* ---- fixture ------------------------------------------------------------ */

static struct snapshot snap;
static struct http_server *srv;
static uint16_t port;

static struct {
    pthread_mutex_t lock;
    int calls;
    enum http_admin_action action;
    char node[64];
    unsigned delay_ms; /* the action takes this long (a loop slow to take it) */
} rec = {PTHREAD_MUTEX_INITIALIZER, 0, 0, "", 0};

static void record(void *ctx, enum http_admin_action action, const char *node)
{
    ck_assert_ptr_eq(ctx, &rec);
    if (rec.delay_ms)
        usleep(rec.delay_ms * 1000u);
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
    struct logfetch_req *held; /* the last one held */
    struct logfetch_req *all_held[8];
    int nheld;
} fake = {PTHREAD_MUTEX_INITIALIZER, FAKE_LATER, 0, {0}, NULL, {NULL}, 0};

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
    if (mode == FAKE_HOLD) {
        fake.held = req;
        if (fake.nheld < 8)
            fake.all_held[fake.nheld++] = req;
    }
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

/* Limits of the guard for the next server (0 = musterd's defaults). */
static struct {
    unsigned max_conns, max_per_addr, request_ms, slow_answer_ms;
} limits;

static const char *read_token; /* for the next server */

static void start_server(const char *token)
{
    struct http_config cfg = {.addr = "127.0.0.1", .port = 0, .admin_token = token, .read_token = read_token,
                              .log = fake_log,
                              .log_ctx = &fake, .max_conns = limits.max_conns,
                              .max_per_addr = limits.max_per_addr, .request_ms = limits.request_ms,
                              .slow_answer_ms = limits.slow_answer_ms};
    char err[256] = "";
    pthread_mutex_lock(&rec.lock);
    rec.calls = 0;
    rec.delay_ms = 0;
    pthread_mutex_unlock(&rec.lock);
    pthread_mutex_lock(&fake.lock);
    fake.mode = FAKE_LATER;
    fake.calls = 0;
    fake.held = NULL;
    fake.nheld = 0;
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
static void setup_read_token(void)
{
    read_token = "reader-secret";
    start_server(TOKEN);
    read_token = NULL;
}
/* Small limits, so that the guard's work shows in a fraction of a second. */
static void setup_guarded(void)
{
    limits.max_conns = 6;
    limits.max_per_addr = 4;
    limits.request_ms = 400;
    start_server(NULL);
}
/* Room for many admin calls at once (the loop's slowness, not the limits, is under test). */
static void setup_guarded_admin(void)
{
    limits.max_conns = 32;
    limits.max_per_addr = 16;
    limits.request_ms = 400;
    start_server(TOKEN);
}
/* and answers going out for over 300 ms count as slow */
static void setup_slow_readers(void)
{
    limits.slow_answer_ms = 300;
    setup_guarded();
}

static void teardown(void)
{
    http_stop(srv);
    srv = NULL;
    snapshot_destroy(&snap);
    curl_global_cleanup();
}

static void publish_all(void)
{
    snapshot_publish(&snap, test_view("a"));
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

/* The Content-Type line of a POST (what musterctl sends; NULL = none), and up
 * to 4 more header lines for the next requests (a Host, an Origin). */
static const char *post_type = "Content-Type: application/json";
static const char *extra[5];

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
    if (strcmp(method, "POST") == 0 && post_type)
        hdrs = curl_slist_append(hdrs, post_type);
    if (auth)
        hdrs = curl_slist_append(hdrs, auth);
    for (int i = 0; i < 4 && extra[i]; i++)
        hdrs = curl_slist_append(hdrs, extra[i]);
    if (hdrs)
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
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
    const char *paths[] = {"/v1/status", "/v1/nodes", "/v1/ranks", "/v1/ranks?state=running", "/v1/events",
                           "/v1/history", "/metrics"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++)
        assert_error(get(paths[i]), 503, "starting");
    struct resp *r = get("/healthz");
    ck_assert_int_eq(r->status, 200);
    ck_assert_str_eq(r->body, "ok\n");
}
END_TEST

static json_t *get_json(const char *path)
{
    struct resp *r = get(path);
    ck_assert_msg(r->status == 200, "%s: %ld %s", path, r->status, r->body);
    assert_header(r, "Content-Type: application/json");
    assert_header(r, "Cache-Control: no-store");
    json_t *doc = json_loads(r->body, 0, NULL);
    ck_assert_msg(json_is_object(doc), "%s: not a JSON object: %s", path, r->body);
    return doc;
}

static long long int_at(const json_t *obj, const char *key)
{
    json_t *j = json_object_get(obj, key);
    ck_assert_msg(json_is_integer(j), "\"%s\" is not an integer", key);
    return json_integer_value(j);
}

START_TEST(test_status_summary)
{
    publish_all();
    json_t *st = get_json("/v1/status");
    ck_assert_str_eq(json_string_value(json_object_get(st, "job")), "demo");
    ck_assert_str_eq(json_string_value(json_object_get(st, "state")), "running");
    ck_assert_int_eq(int_at(st, "generation"), 3);
    ck_assert_int_eq(int_at(st, "step"), 120);
    ck_assert_int_eq(int_at(st, "version"), 1);
    /* the per-rank and per-node tables live in /v1/ranks and /v1/nodes */
    ck_assert_ptr_null(json_object_get(st, "ranks"));
    ck_assert_ptr_null(json_object_get(st, "nodes"));
    json_t *rs = json_object_get(st, "ranks_by_state");
    ck_assert_int_eq(int_at(rs, "running"), 2);
    ck_assert_int_eq(int_at(rs, "exited"), 2);
    ck_assert_int_eq(int_at(rs, "pending"), 0);
    ck_assert_int_eq(int_at(json_object_get(st, "nodes_by_state"), "joined"), 1);
    ck_assert_int_eq(int_at(json_object_get(st, "nodes_by_state"), "lost"), 1);
    ck_assert_int_eq(int_at(json_object_get(st, "nodes_by_health"), "lost"), 1);
    ck_assert_int_eq(int_at(json_object_get(st, "nodes_by_health"), "ok"), 1);
    ck_assert_int_eq(int_at(st, "unhealthy_nodes_total"), 1);
    json_t *un = json_object_get(st, "unhealthy_nodes");
    ck_assert_int_eq(json_array_size(un), 1);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(un, 0), "name")), "b");
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(un, 0), "health")), "lost");
    /* failing: the exited ranks, the one that failed with its error */
    ck_assert_int_eq(int_at(st, "failing_ranks_total"), 2);
    json_t *fr = json_object_get(st, "failing_ranks");
    ck_assert_int_eq(json_array_size(fr), 2);
    ck_assert_int_eq(int_at(json_array_get(fr, 0), "rank"), 2);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(fr, 0), "error")),
                     "CUDA error: out of memory \"x\"");
    ck_assert(json_is_null(json_object_get(json_array_get(fr, 1), "error")));
    /* slowest: running ranks, lowest step first */
    json_t *sr = json_object_get(st, "slowest_ranks");
    ck_assert_int_eq(json_array_size(sr), 2);
    ck_assert_int_eq(int_at(json_array_get(sr, 0), "rank"), 0);
    ck_assert_int_eq(int_at(json_array_get(sr, 1), "rank"), 1);
    json_decref(st);

    /* a later publish is what the next request sees */
    struct snap_view *v = test_view("a");
    json_object_set_new(v->head, "state", json_string("stopped"));
    snapshot_publish(&snap, v);
    st = get_json("/v1/status");
    ck_assert_str_eq(json_string_value(json_object_get(st, "state")), "stopped");
    ck_assert_int_eq(int_at(st, "version"), 2);
    json_decref(st);
    ck_assert_str_eq(get("/v1/events")->body, events_doc);
    ck_assert_str_eq(get("/v1/history")->body, history_doc);
}
END_TEST

enum { NODES = 4096, PER = 8 };

/* 4096 nodes x 8 ranks, running but for node gpu-0077, lost with its ranks exited. */
static struct snap_view *big_view(void)
{
    struct snap_view *big = snap_view_new(NODES, NODES * PER);
    ck_assert_ptr_nonnull(big);
    big->head = json_loads(head_doc, 0, NULL);
    big->stale_after_ms = 5000;
    for (uint32_t n = 0; n < NODES; n++) {
        char name[32];
        snprintf(name, sizeof(name), "gpu-%04u", n);
        set_node(big, n, name, n == 77 ? RDV_NODE_LOST : RDV_NODE_JOINED, n * PER, PER, n == 77 ? -1 : 300);
        for (uint32_t l = 0; l < PER; l++)
            set_rank(big, n * PER + l, n, n == 77 ? RDV_RANK_EXITED : RDV_RANK_RUNNING, 1000 + (n * PER + l) % 7,
                     2.0, 900, 300);
    }
    view_derive(big);
    return big;
}

/* The summary stays small however many ranks the job has; the lists do not. */
START_TEST(test_status_size_does_not_grow)
{
    size_t small_len, big_len, ranks_len;
    struct snap_view *small = test_view("a");
    char *small_status = strdup(restdoc_get(small, SNAP_DOC_STATUS, &small_len));
    struct snap_view *big = big_view();
    const char *status = restdoc_get(big, SNAP_DOC_STATUS, &big_len);
    restdoc_get(big, SNAP_DOC_RANKS, &ranks_len);
    ck_assert_ptr_nonnull(status);
    ck_assert_msg(big_len < 4 * small_len + 16384, "status: %zu bytes at 32768 ranks, %zu at 4", big_len, small_len);
    ck_assert_msg(ranks_len > 100 * big_len, "ranks list %zu bytes, status %zu", ranks_len, big_len);
    json_t *st = json_loads(status, 0, NULL);
    ck_assert_int_eq(int_at(json_object_get(st, "ranks_by_state"), "running"), (NODES - 1) * PER);
    ck_assert_int_eq(int_at(st, "failing_ranks_total"), PER);
    ck_assert_int_eq(int_at(json_array_get(json_object_get(st, "failing_ranks"), 0), "rank"), 77 * PER);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(st, "unhealthy_nodes"), 0),
                                                       "name")),
                     "gpu-0077");
    ck_assert_int_eq(json_array_size(json_object_get(st, "slowest_ranks")), SNAP_TOP_RANKS);
    ck_assert_int_eq(int_at(json_array_get(json_object_get(st, "slowest_ranks"), 0), "step"), 1000);
    json_decref(st);
    free(small_status);
    snap_view_unref(small);
    snap_view_unref(big);
}
END_TEST

/* A hung rank, and a live one whose process is stopped, need attention even
 * while their heartbeats come: they lead the failing list and their nodes are
 * stale; the healthy ranks are not listed. */
START_TEST(test_hung_and_stopped_ranks_need_attention)
{
    struct snap_view *v = snap_view_new(3, 6);
    ck_assert_ptr_nonnull(v);
    v->head = json_loads(head_doc, 0, NULL);
    v->stale_after_ms = 5000;
    set_node(v, 0, "a", RDV_NODE_JOINED, 0, 2, 200);
    set_node(v, 1, "b", RDV_NODE_JOINED, 2, 2, 200);
    set_node(v, 2, "c", RDV_NODE_JOINED, 4, 2, 200);
    for (uint32_t i = 0; i < 6; i++)
        set_rank(v, i, i / 2, RDV_RANK_RUNNING, 40, 2.0, 100, 300);
    v->ranks[3].hung = 1;
    v->ranks[3].step_age_ms = 42000;
    v->ranks[4].stopped = 1;
    view_derive(v);
    size_t len;
    json_t *st = json_loads(restdoc_get(v, SNAP_DOC_STATUS, &len), 0, NULL);
    ck_assert_ptr_nonnull(st);
    ck_assert_int_eq(int_at(st, "failing_ranks_total"), 2);
    json_t *fr = json_object_get(st, "failing_ranks");
    ck_assert_int_eq(int_at(json_array_get(fr, 0), "rank"), 3);
    ck_assert(json_is_true(json_object_get(json_array_get(fr, 0), "hung")));
    ck_assert_int_eq(int_at(json_array_get(fr, 0), "step_age_ms"), 42000);
    ck_assert_int_eq(int_at(json_array_get(fr, 1), "rank"), 4);
    ck_assert_int_eq(int_at(json_object_get(st, "nodes_by_health"), "stale"), 2);
    ck_assert_int_eq(int_at(json_object_get(st, "nodes_by_health"), "ok"), 1);
    json_decref(st);
    snap_view_unref(v);
}
END_TEST

/* A whole document is rendered once per view and then served as it is. */
START_TEST(test_documents_cached_per_version)
{
    publish_all();
    struct snap_view *v = snapshot_acquire(&snap);
    ck_assert_ptr_null(v->doc[SNAP_DOC_RANKS].text);
    struct resp *r = get("/v1/ranks");
    ck_assert_int_eq(r->status, 200);
    char *first = strdup(r->body);
    const char *cached = v->doc[SNAP_DOC_RANKS].text;
    ck_assert_ptr_nonnull(cached);
    ck_assert_str_eq(cached, first);
    ck_assert_str_eq(get("/v1/ranks")->body, first);
    ck_assert_ptr_eq(v->doc[SNAP_DOC_RANKS].text, cached); /* not rendered again */
    ck_assert_ptr_null(v->doc[SNAP_DOC_METRICS_RANKS].text);
    get("/metrics");
    ck_assert_ptr_nonnull(v->doc[SNAP_DOC_METRICS].text);
    ck_assert_ptr_null(v->doc[SNAP_DOC_METRICS_RANKS].text);
    snap_view_unref(v);
    free(first);
}
END_TEST

static void assert_ranks(json_t *doc, const char *key, const int *want, size_t n)
{
    json_t *arr = json_object_get(doc, key);
    ck_assert_int_eq(json_array_size(arr), n);
    for (size_t i = 0; i < n; i++) {
        json_t *item = json_array_get(arr, i);
        if (strcmp(key, "ranks") == 0)
            ck_assert_int_eq(int_at(item, "rank"), want[i]);
        else
            ck_assert_str_eq(json_string_value(json_object_get(item, "name")), want[i] ? "b" : "a");
    }
    json_decref(doc);
}

START_TEST(test_lists_filter_and_paginate)
{
    publish_all();
    json_t *d = get_json("/v1/ranks");
    ck_assert_int_eq(int_at(d, "total"), 4);
    ck_assert_int_eq(int_at(d, "matched"), 4);
    ck_assert(json_is_null(json_object_get(d, "next_offset")));
    json_t *r0 = json_array_get(json_object_get(d, "ranks"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(r0, "node")), "a");
    ck_assert_str_eq(json_string_value(json_object_get(r0, "state")), "running");
    ck_assert_int_eq(int_at(r0, "heartbeat_age_ms"), 1500);
    ck_assert_int_eq(int_at(r0, "step_age_ms"), 800);
    ck_assert(json_is_null(json_object_get(json_array_get(json_object_get(d, "ranks"), 1), "step_age_ms")));
    ck_assert(json_real_value(json_object_get(r0, "loss")) == 2.5);
    ck_assert(json_is_null(json_object_get(json_array_get(json_object_get(d, "ranks"), 1), "loss")));
    assert_ranks(d, "ranks", (int[]){0, 1, 2, 3}, 4);

    assert_ranks(get_json("/v1/ranks?state=exited"), "ranks", (int[]){2, 3}, 2);
    assert_ranks(get_json("/v1/ranks?node=a"), "ranks", (int[]){0, 1}, 2);
    assert_ranks(get_json("/v1/ranks?node=b&state=running,exited"), "ranks", (int[]){2, 3}, 2);
    assert_ranks(get_json("/v1/ranks?node=zz"), "ranks", NULL, 0);
    d = get_json("/v1/ranks?offset=1&limit=2");
    ck_assert_int_eq(int_at(d, "next_offset"), 3);
    ck_assert_int_eq(int_at(d, "matched"), 4);
    assert_ranks(d, "ranks", (int[]){1, 2}, 2);
    d = get_json("/v1/ranks?offset=3&limit=2");
    ck_assert(json_is_null(json_object_get(d, "next_offset")));
    assert_ranks(d, "ranks", (int[]){3}, 1);
    assert_ranks(get_json("/v1/ranks?offset=9"), "ranks", NULL, 0);

    d = get_json("/v1/nodes");
    json_t *b = json_array_get(json_object_get(d, "nodes"), 1);
    ck_assert_str_eq(json_string_value(json_object_get(b, "health")), "lost");
    ck_assert_int_eq(int_at(json_object_get(b, "rank_states"), "exited"), 2);
    ck_assert_int_eq(json_array_size(json_object_get(b, "ranks")), 2);
    json_t *a = json_array_get(json_object_get(d, "nodes"), 0);
    ck_assert_int_eq(int_at(a, "step_min"), 120);
    ck_assert_int_eq(int_at(a, "step_max"), 121);
    ck_assert(json_real_value(json_object_get(a, "tokens_per_s")) == 1000.5);
    assert_ranks(d, "nodes", (int[]){0, 1}, 2);
    assert_ranks(get_json("/v1/nodes?order=health"), "nodes", (int[]){1, 0}, 2);
    assert_ranks(get_json("/v1/nodes?order=health&limit=1"), "nodes", (int[]){1}, 1);
    assert_ranks(get_json("/v1/nodes?health=ok"), "nodes", (int[]){0}, 1);
    assert_ranks(get_json("/v1/nodes?state=lost,left"), "nodes", (int[]){1}, 1);
    assert_ranks(get_json("/v1/nodes?node=a"), "nodes", (int[]){0}, 1);
}
END_TEST

/* Fitness and device facts in /v1/nodes, an unfit node among the summary's
 * unhealthy ones, measured figures in /v1/ranks, and GET /v1/plan from the summary. */
START_TEST(test_plan_and_fitness)
{
    struct snap_view *v = test_view("a");
    struct snap_node *a = &v->nodes[0];
    a->fit = SNAP_FIT_UNFIT;
    a->unfit_reason = "data d.bin: No such file or directory";
    snprintf(a->gpu_name, sizeof(a->gpu_name), "NVIDIA Test GPU");
    a->device_mem_mb = 81559;
    a->device_free_mb = 80000;
    a->host_mem_mb = 65536;
    v->ranks[0].step_bytes = 102744;
    v->ranks[0].peak_mem = 1u << 20;
    json_object_set_new(v->head, "plan", json_null());
    json_object_set_new(v->head, "plan_note", json_string("the job runs its own rank program (rank_cmd)"));
    json_object_set_new(v->head, "measured", json_pack("{s:f, s:i, s:n}", "comm_frac", 0.25, "sent_per_step", 102744,
                                                       "peak_mem"));
    view_derive(v);
    snapshot_publish(&snap, v);

    json_t *doc = get_json("/v1/nodes?node=a"), *n = json_array_get(json_object_get(doc, "nodes"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(n, "health")), "unfit");
    ck_assert_str_eq(json_string_value(json_object_get(n, "fit")), "unfit");
    ck_assert_str_eq(json_string_value(json_object_get(n, "unfit_reason")), "data d.bin: No such file or directory");
    ck_assert_str_eq(json_string_value(json_object_get(n, "gpu_name")), "NVIDIA Test GPU");
    ck_assert_int_eq(int_at(n, "device_mem_mb"), 81559);
    ck_assert_int_eq(int_at(n, "device_free_mb"), 80000);
    ck_assert_int_eq(int_at(n, "host_mem_mb"), 65536);
    json_decref(doc);
    doc = get_json("/v1/nodes?node=b");
    n = json_array_get(json_object_get(doc, "nodes"), 0);
    ck_assert_str_eq(json_string_value(json_object_get(n, "fit")), "fit");
    ck_assert(json_is_null(json_object_get(n, "unfit_reason")) && json_is_null(json_object_get(n, "gpu_name")) &&
              json_is_null(json_object_get(n, "host_mem_mb")));
    json_decref(doc);

    json_t *st = get_json("/v1/status");
    ck_assert_int_eq(int_at(json_object_get(st, "nodes_by_health"), "unfit"), 1);
    json_t *bad = json_object_get(st, "unhealthy_nodes");
    ck_assert_int_eq(json_array_size(bad), 2); /* b lost, then a unfit */
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(bad, 1), "name")), "a");
    ck_assert_int_eq(int_at(json_object_get(st, "measured"), "sent_per_step"), 102744);
    json_decref(st);

    doc = get_json("/v1/ranks?node=a");
    json_t *ranks = json_object_get(doc, "ranks");
    ck_assert_int_eq(int_at(json_array_get(ranks, 0), "step_bytes"), 102744);
    ck_assert_int_eq(int_at(json_array_get(ranks, 0), "peak_mem"), 1 << 20);
    ck_assert(json_is_null(json_object_get(json_array_get(ranks, 1), "step_bytes")));
    json_decref(doc);

    doc = get_json("/v1/plan");
    ck_assert_str_eq(json_string_value(json_object_get(doc, "job")), "demo");
    ck_assert_str_eq(json_string_value(json_object_get(doc, "state")), "running");
    ck_assert(json_is_null(json_object_get(doc, "plan")));
    ck_assert_str_eq(json_string_value(json_object_get(doc, "plan_note")), "the job runs its own rank program (rank_cmd)");
    ck_assert(json_is_integer(json_object_get(doc, "time_ms")));
    ck_assert_int_eq(int_at(json_object_get(doc, "measured"), "sent_per_step"), 102744);
    json_decref(doc);
    static const char *const bad_queries[][2] = {
        {"/v1/plan?network_gbit=fast", "network_gbit: expected"},
        {"/v1/plan?tflops=0", "tflops: expected"},
        {"/v1/plan?network_gbit=1&network_gbit=2", "given twice"},
        {"/v1/plan?world=8", "unknown parameter"},
    };
    for (size_t i = 0; i < sizeof(bad_queries) / sizeof(bad_queries[0]); i++) {
        struct resp *r = get(bad_queries[i][0]);
        ck_assert_msg(r->status == 400 && strstr(r->body, bad_queries[i][1]), "%s: %ld %s", bad_queries[i][0],
                      r->status, r->body);
    }
}
END_TEST

START_TEST(test_list_bad_queries)
{
    publish_all();
    static const struct {
        const char *path, *names;
    } bad[] = {
        {"/v1/ranks?state=bogus", "state"},
        {"/v1/ranks?state=", "state"},
        {"/v1/ranks?state=running,", "state"},
        {"/v1/ranks?state=joined", "state"},
        {"/v1/ranks?limit=0", "limit"},
        {"/v1/ranks?limit=x", "limit"},
        {"/v1/ranks?limit=100001", "limit"},
        {"/v1/ranks?offset=-1", "offset"},
        {"/v1/ranks?offset=99999999999", "offset"},
        {"/v1/ranks?node=a;b", "node"},
        {"/v1/ranks?health=ok", "health"},
        {"/v1/ranks?state=running&state=exited", "state"},
        {"/v1/nodes?order=size", "order"},
        {"/v1/nodes?health=sick", "health"},
        {"/v1/nodes?state=running", "state"},
        {"/v1/nodes?frobnicate=1", "frobnicate"},
        {"/v1/status?verbose=1", "verbose"},
        {"/v1/events?since=3", "since"},
        {"/metrics?ranks=2", "ranks"},
        {"/metrics?rank=1", "rank"},
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        struct resp *r = get(bad[i].path);
        assert_error(r, 400, "invalid query");
        json_t *doc = json_loads(r->body, 0, NULL);
        const char *detail = json_string_value(json_object_get(doc, "detail"));
        ck_assert_msg(detail && strstr(detail, bad[i].names), "%s: detail '%s' does not name %s", bad[i].path,
                      detail ? detail : "(none)", bad[i].names);
        json_decref(doc);
    }
}
END_TEST

static void assert_has_lines(const char *text, const char *const *lines, size_t n)
{
    for (size_t i = 0; i < n; i++)
        assert_has_line(text, lines[i]);
}

START_TEST(test_metrics)
{
    static const char *const job_and_nodes[] = {
        "# TYPE muster_generation gauge",
        "muster_generation 3",
        "muster_world_size 4",
        "# TYPE muster_restarts_total counter",
        "muster_restarts_total 1",
        "muster_step 120",
        "muster_loss 2.5",
        "muster_tokens_per_second 1000.5",
        "muster_comm_fraction 0.25",
        "muster_job_state{state=\"running\"} 1",
        "muster_job_state{state=\"waiting\"} 0",
        "muster_job_state{state=\"failed\"} 0",
        "muster_nodes{state=\"joined\"} 1",
        "muster_nodes{state=\"lost\"} 1",
        "muster_nodes{state=\"left\"} 0",
        "muster_ranks{state=\"running\"} 2",
        "muster_ranks{state=\"exited\"} 2",
        "muster_nodes_health{health=\"lost\"} 1",
        "muster_node_up{node=\"a\"} 1",
        "muster_node_up{node=\"b\"} 0",
        "muster_node_healthy{node=\"b\"} 0",
        "muster_node_step{node=\"a\"} 120",
        "muster_node_tokens_per_second{node=\"a\"} 1000.5",
        "muster_node_heartbeat_age_seconds{node=\"a\"} 0.25",
        "muster_node_ranks_running{node=\"b\"} 0",
    };
    static const char *const per_rank[] = {
        "muster_rank_step{rank=\"0\",node=\"a\"} 120",
        "muster_rank_loss{rank=\"0\",node=\"a\"} 2.5",
        "muster_rank_heartbeat_age_seconds{rank=\"0\",node=\"a\"} 1.5",
        "muster_rank_step{rank=\"3\",node=\"b\"} 100",
    };
    publish_all();
    struct resp *r = get("/metrics");
    ck_assert_int_eq(r->status, 200);
    assert_header(r, "Content-Type: text/plain; version=0.0.4");
    assert_has_lines(r->body, job_and_nodes, sizeof(job_and_nodes) / sizeof(job_and_nodes[0]));
    /* null values leave their sample out; no per-rank series unless asked */
    ck_assert_ptr_null(strstr(r->body, "muster_node_heartbeat_age_seconds{node=\"b\""));
    ck_assert_ptr_null(strstr(r->body, "muster_rank_"));
    /* exactly one job state is 1 */
    int ones = 0;
    for (const char *p = r->body; (p = strstr(p, "muster_job_state{")); p++)
        ones += strncmp(strchr(p, '}'), "} 1\n", 4) == 0;
    ck_assert_int_eq(ones, 1);

    r = get("/metrics?ranks=1");
    ck_assert_int_eq(r->status, 200);
    assert_has_lines(r->body, job_and_nodes, sizeof(job_and_nodes) / sizeof(job_and_nodes[0]));
    assert_has_lines(r->body, per_rank, sizeof(per_rank) / sizeof(per_rank[0]));
    ck_assert_ptr_null(strstr(r->body, "muster_rank_loss{rank=\"1\""));
    ck_assert_ptr_null(strstr(r->body, "muster_rank_heartbeat_age_seconds{rank=\"1\""));
    ck_assert_ptr_null(strstr(get("/metrics?ranks=0")->body, "muster_rank_"));
}
END_TEST

START_TEST(test_odd_names_escaped)
{
    struct snap_view *v = test_view("x\"y\\z\nw");
    size_t len;
    const char *m = restdoc_get(v, SNAP_DOC_METRICS_RANKS, &len);
    assert_has_line(m, "muster_rank_step{rank=\"0\",node=\"x\\\"y\\\\z\\nw\"} 120");
    assert_has_line(m, "muster_node_up{node=\"x\\\"y\\\\z\\nw\"} 1");
    json_t *nodes = json_loads(restdoc_get(v, SNAP_DOC_NODES, &len), 0, NULL);
    ck_assert_ptr_nonnull(nodes);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(nodes, "nodes"), 0), "name")),
                     "x\"y\\z\nw");
    json_decref(nodes);
    json_t *ranks = json_loads(restdoc_get(v, SNAP_DOC_RANKS, &len), 0, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(json_array_get(json_object_get(ranks, "ranks"), 2), "error")),
                     "CUDA error: out of memory \"x\"");
    json_decref(ranks);
    snap_view_unref(v);
}
END_TEST

/* /v1/history from hostile values: losses and rates near DBL_MAX folded together
 * (coarsening), infinities, NaN, one point. Every array keeps one entry per step and
 * every entry is a finite number or null. */
START_TEST(test_history_of_extreme_values)
{
    struct history h;
    ck_assert_int_eq(history_init(&h, 4), 0);
    history_add(&h, 1, 1.0, 1.0, 0.1, 1);
    json_t *j = history_json(&h);
    ck_assert_uint_eq(json_array_size(json_object_get(j, "loss")), 1);
    json_decref(j);
    const double v[] = {1.7e308, 1.7e308, -1.7e308, INFINITY, NAN, 1.7e308, 1e308, 1.7e308};
    for (uint64_t step = 2; step < 64; step++)
        history_add(&h, step, v[step % 8], v[(step + 3) % 8], 0.1 * (double)step, 1 + step / 20);
    ck_assert_uint_gt(h.stride, 1); /* points were folded together */
    j = history_json(&h);
    size_t n = json_array_size(json_object_get(j, "step"));
    ck_assert_uint_gt(n, 0);
    const char *keys[] = {"loss", "tokens_per_s", "time_s", "generation"};
    for (size_t k = 0; k < 4; k++) {
        json_t *a = json_object_get(j, keys[k]), *e;
        size_t i;
        ck_assert_msg(json_array_size(a) == n, "%s has %zu entries for %zu steps", keys[k], json_array_size(a), n);
        json_array_foreach(a, i, e)
            ck_assert_msg(json_is_null(e) || (json_is_number(e) && isfinite(json_number_value(e))),
                          "%s[%zu] is neither null nor a finite number", keys[k], i);
    }
    char *text = json_dumps(j, JSON_COMPACT);
    ck_assert_ptr_nonnull(text);
    ck_assert_ptr_null(strstr(text, "nan"));
    ck_assert_ptr_null(strstr(text, "inf"));
    free(text);
    json_decref(j);
    history_free(&h);
}
END_TEST

START_TEST(test_dashboard)
{
    struct resp *r = get("/");
    ck_assert_int_eq(r->status, 200);
    assert_header(r, "Content-Type: text/html");
    ck_assert_ptr_nonnull(strstr(r->body, "/v1/status"));
    ck_assert_ptr_nonnull(strstr(r->body, "<svg id=\"chart\""));
    ck_assert_ptr_null(strstr(r->body, "http://"));
    ck_assert_ptr_null(strstr(r->body, "https://"));
}
END_TEST

/* ---- names: Host and Origin ---------------------------------------------- */

START_TEST(test_host_names)
{
    struct http_hosts h;
    char err[160];
    ck_assert_int_eq(http_hosts_init(&h, "127.0.0.1", 8000), 0);
    ck_assert_int_eq(http_hosts_add(&h, "master1, proxy.example:443 ,", err, sizeof(err)), 0);
    const char *ok[] = {"127.0.0.1:8000", "localhost:8000", "LocalHost.:8000", "127.0.0.2:8000", "[::1]:8000",
                        "master1:8000", "MASTER1:8000", "proxy.example:443"};
    const char *no[] = {"127.0.0.1", "127.0.0.1:8001", "evil.example:8000", "localhost.evil.example:8000", "",
                        "127.0.0.1:8000:1", "127.0.0.1:0", "127.0.0.1:99999", "127.0.0.1:", "[::2]:8000",
                        "10.0.0.1:8000", "master1:443", "proxy.example:8000", "proxy.example", "a b:8000",
                        "[::1", "master1:80x0"};
    for (size_t i = 0; i < sizeof(ok) / sizeof(ok[0]); i++)
        ck_assert_msg(http_host_allowed(&h, ok[i]), "Host '%s' refused", ok[i]);
    for (size_t i = 0; i < sizeof(no) / sizeof(no[0]); i++)
        ck_assert_msg(!http_host_allowed(&h, no[i]), "Host '%s' allowed", no[i]);
    ck_assert(!http_host_allowed(&h, NULL));

    const char *ook[] = {"http://127.0.0.1:8000", "http://localhost:8000", "https://proxy.example",
                         "HTTP://master1:8000"};
    const char *ono[] = {"null", "http://evil.example:8000", "http://127.0.0.1:8000/", "ftp://127.0.0.1:8000",
                         "http://127.0.0.1", "http://localhost:8080", "127.0.0.1:8000", ""};
    for (size_t i = 0; i < sizeof(ook) / sizeof(ook[0]); i++)
        ck_assert_msg(http_origin_allowed(&h, ook[i]), "Origin '%s' refused", ook[i]);
    for (size_t i = 0; i < sizeof(ono) / sizeof(ono[0]); i++)
        ck_assert_msg(!http_origin_allowed(&h, ono[i]), "Origin '%s' allowed", ono[i]);

    /* bound to one address that is not loopback: that address and the names added, nothing else */
    ck_assert_int_eq(http_hosts_init(&h, "10.0.0.5", 29471), 0);
    ck_assert(http_host_allowed(&h, "10.0.0.5:29471"));
    ck_assert(!http_host_allowed(&h, "localhost:29471"));
    ck_assert(!http_host_allowed(&h, "127.0.0.1:29471"));
    ck_assert(!http_host_allowed(&h, "10.0.0.6:29471"));
    /* bound to every address: any literal address, localhost, and the names added */
    ck_assert_int_eq(http_hosts_init(&h, "0.0.0.0", 29471), 0);
    ck_assert_int_eq(http_hosts_add(&h, "gpu-master", err, sizeof(err)), 0);
    ck_assert(http_host_allowed(&h, "192.168.7.9:29471"));
    ck_assert(http_host_allowed(&h, "localhost:29471"));
    ck_assert(http_host_allowed(&h, "gpu-master:29471"));
    ck_assert(!http_host_allowed(&h, "rebound.evil.example:29471"));
    ck_assert(!http_host_allowed(&h, "192.168.7.9:29472"));

    /* rest_hosts values */
    ck_assert_int_eq(http_hosts_valid_list("a.example, b:8080,[::1]:9"), 0);
    ck_assert_int_ne(http_hosts_valid_list("a b"), 0);
    ck_assert_int_ne(http_hosts_valid_list("a:b"), 0);
    ck_assert_int_ne(http_hosts_valid_list("a:0"), 0);
    ck_assert_int_ne(http_hosts_valid_list("http://a"), 0);
    ck_assert_int_eq(http_hosts_add(&h, "ok, x/y", err, sizeof(err)), -EINVAL);
    ck_assert_msg(strstr(err, "'x/y'") != NULL, "error: %s", err);
    ck_assert_int_eq(http_hosts_init(&h, "127.0.0.1", 1), 0);
    ck_assert_int_eq(http_hosts_add(&h, "a,b,c,d,e,f,g,h,i,j,k,l,m,n,o,p,q", err, sizeof(err)), -ENOSPC);
    ck_assert_int_eq(http_hosts_init(&h, "localhost", 1), -EINVAL);
}
END_TEST

/* A request by another name (DNS rebinding) is refused with 421, one from
 * another site's page with 403; /healthz answers any name. */
START_TEST(test_host_and_origin_checked)
{
    char host[64], origin[96], badport[64];
    publish_all();
    snprintf(host, sizeof(host), "Host: rebound.evil.example:%u", port);
    extra[0] = host;
    struct resp *r = get("/v1/status");
    assert_error(r, 421, "misdirected request");
    ck_assert_msg(strstr(r->body, "rebound.evil.example") != NULL, "detail: %s", r->body);
    r = get("/");
    ck_assert_int_eq(r->status, 421);
    ck_assert_int_eq(get("/healthz")->status, 200);
    r = request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, NULL);
    ck_assert_int_eq(r->status, 421);
    snprintf(badport, sizeof(badport), "Host: 127.0.0.1:%u", port == 65535 ? 1 : port + 1);
    extra[0] = badport;
    ck_assert_int_eq(get("/v1/events")->status, 421);
    snprintf(host, sizeof(host), "Host: localhost:%u", port);
    extra[0] = host;
    ck_assert_int_eq(get("/v1/status")->status, 200);

    extra[0] = "Origin: http://evil.example";
    r = get("/v1/events");
    assert_error(r, 403, "cross-origin request");
    ck_assert_msg(strstr(r->body, "http://evil.example") != NULL, "detail: %s", r->body);
    r = request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, NULL);
    assert_error(r, 403, "cross-origin request");
    extra[0] = "Origin: null";
    ck_assert_int_eq(get("/v1/status")->status, 403);
    ck_assert_int_eq(recorded(NULL, NULL), 0);

    /* the dashboard's own fetches: Origin is the page's, that is the server */
    snprintf(origin, sizeof(origin), "Origin: http://127.0.0.1:%u", port);
    extra[0] = origin;
    ck_assert_int_eq(get("/v1/status")->status, 200);
    r = request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, NULL);
    ck_assert_int_eq(r->status, 202);
    ck_assert_int_eq(recorded(NULL, NULL), 1);
    extra[0] = NULL;
}
END_TEST

/* ---- admin -------------------------------------------------------------- */

START_TEST(test_admin_auth)
{
    enum http_admin_action action;
    char node[64];
    struct resp *r;

    assert_error(request("POST", "/v1/job/stop", NULL, NULL), 401, "unauthorized");
    assert_header(request("POST", "/v1/job/stop", NULL, NULL), "WWW-Authenticate: Bearer");
    assert_error(request("POST", "/v1/job/stop", "Authorization: Bearer nope", NULL), 401,
                 "unauthorized");
    assert_error(request("POST", "/v1/job/stop", "Authorization: Basic " TOKEN, NULL), 401,
                 "unauthorized");
    assert_error(request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN "0", NULL), 401,
                 "unauthorized");
    /* the right token as Basic's password ("op:TOKEN"): what a browser would attach to a cross-site form */
    r = request("POST", "/v1/job/stop", "Authorization: Basic " BASIC_TOKEN, NULL);
    assert_error(r, 401, "unauthorized");
    ck_assert_msg(strstr(r->body, "not as Basic") != NULL, "detail: %s", r->body);
    /* the right Bearer token, but not a JSON content type: what a form or a simple request sends */
    const char *types[] = {NULL, "Content-Type: text/plain", "Content-Type: application/x-www-form-urlencoded",
                           "Content-Type: multipart/form-data; boundary=x", "Content-Type: application/jsonp"};
    for (size_t i = 0; i < sizeof(types) / sizeof(types[0]); i++) {
        post_type = types[i];
        r = request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, NULL);
        assert_error(r, 415, "unsupported media type");
        ck_assert_msg(strstr(r->body, "application/json") != NULL, "detail: %s", r->body);
    }
    post_type = "Content-Type: application/json";
    ck_assert_int_eq(recorded(NULL, NULL), 0);
    /* Basic still reads (the dashboard's browser) */
    ck_assert_int_eq(request("GET", "/v1/status", "Authorization: Basic " BASIC_TOKEN, NULL)->status, 503);

    post_type = "Content-Type: Application/JSON; charset=utf-8";
    r = request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, NULL);
    post_type = "Content-Type: application/json";
    ck_assert_int_eq(r->status, 202);
    ck_assert_str_eq(r->body, "{\"accepted\":\"stop\"}");
    ck_assert_int_eq(recorded(&action, node), 1);
    ck_assert_int_eq(action, HTTP_ADMIN_STOP);
    ck_assert_str_eq(node, "(null)");

    r = request("POST", "/v1/job/restart", "Authorization: Bearer " TOKEN, NULL);
    ck_assert_int_eq(r->status, 202);
    ck_assert_int_eq(recorded(&action, node), 2);
    ck_assert_int_eq(action, HTTP_ADMIN_RESTART);

    /* drain checks the node against the published view */
    assert_error(request("POST", "/v1/nodes/gpu-node_07.rack2/drain",
                         "Authorization: Bearer " TOKEN, NULL),
                 503, "starting");
    snapshot_publish(&snap, test_view("gpu-node_07.rack2"));
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

/* A standby (a store, another musterd leads) sends every request but its
 * own /healthz and /metrics to the leader, path and query kept; admin
 * requests only with the token; 503 while no leader is known. */
START_TEST(test_standby_redirects_to_the_leader)
{
    struct snap_view *v = test_view("a");
    v->standby = 1;
    snapshot_publish(&snap, v);
    assert_error(get("/v1/status"), 503, "no leader");
    v = test_view("a");
    v->standby = 1;
    snprintf(v->leader_rest, sizeof(v->leader_rest), "http://10.0.0.7:29471");
    json_object_set_new(v->head, "store", json_pack("{s:s, s:s, s:b}", "role", "standby", "leader", "10.0.0.7:29470",
                                                     "quorum", 1));
    snapshot_publish(&snap, v);
    struct resp *r = get("/v1/ranks?state=running,exited&node=gpu%20a");
    assert_error(r, 307, "not the leader");
    assert_header(r, "Location: http://10.0.0.7:29471/v1/ranks?state=running%2Cexited&node=gpu%20a\r\n");
    json_t *doc = json_loads(r->body, 0, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(doc, "location")),
                     "http://10.0.0.7:29471/v1/ranks?state=running%2Cexited&node=gpu%20a");
    json_decref(doc);
    r = get("/");
    ck_assert_int_eq(r->status, 307);
    assert_header(r, "Location: http://10.0.0.7:29471/\r\n");
    ck_assert_int_eq(get("/healthz")->status, 200);
    ck_assert_int_eq(get("/metrics")->status, 200);
    assert_has_line(get("/metrics")->body, "muster_store_leader 0");
    assert_has_line(get("/metrics")->body, "muster_store_quorum 1");
    /* Admin: redirected with the token; without it, refused here as anywhere. */
    r = request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, NULL);
    ck_assert_int_eq(r->status, 307);
    assert_header(r, "Location: http://10.0.0.7:29471/v1/job/stop\r\n");
    assert_error(request("POST", "/v1/job/stop", NULL, NULL), 401, "unauthorized");
    ck_assert_int_eq(recorded(NULL, NULL), 0);
    /* Leading again: served here. */
    publish_all();
    ck_assert_int_eq(get("/v1/status")->status, 200);
}
END_TEST

/* With a read token every GET but /healthz needs it, whatever the path. */
START_TEST(test_read_token)
{
    publish_all();
    static const char *const paths[] = {"/", "/v1/status", "/v1/nodes", "/v1/ranks", "/v1/events", "/metrics",
                                        "/v1/ranks/1/log", "/v1/no-such-endpoint"};
    for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
        struct resp *r = get(paths[i]);
        ck_assert_msg(r->status == 401, "GET %s without the read token: %ld", paths[i], r->status);
        assert_header(r, "WWW-Authenticate: Basic");
        r = request("GET", paths[i], "Authorization: Bearer reader-secreT", NULL);
        ck_assert_msg(r->status == 401, "GET %s with a wrong read token: %ld", paths[i], r->status);
    }
    ck_assert_int_eq(get("/healthz")->status, 200);
    ck_assert_int_eq(request("GET", "/v1/status", "Authorization: Bearer reader-secret", NULL)->status, 200);
    ck_assert_int_eq(request("GET", "/v1/status", "Authorization: Bearer " TOKEN, NULL)->status, 200);
    ck_assert_int_eq(request("GET", "/v1/no-such-endpoint", "Authorization: Bearer reader-secret", NULL)->status, 404);
    /* A browser's Basic answer: any user name, the token as the password ("me:reader-secret"). */
    ck_assert_int_eq(request("GET", "/", "Authorization: Basic bWU6cmVhZGVyLXNlY3JldA==", NULL)->status, 200);
    /* "me:reader-secreT" */
    ck_assert_int_eq(request("GET", "/", "Authorization: Basic bWU6cmVhZGVyLXNlY3JlVA==", NULL)->status, 401);
    ck_assert_int_eq(request("GET", "/", "Authorization: Basic !!!!", NULL)->status, 401);
    /* The read token is not the admin token. */
    assert_error(request("POST", "/v1/job/stop", "Authorization: Bearer reader-secret", NULL), 401, "unauthorized");
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

/* ---- hostile clients ------------------------------------------------------- */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* "GET path HTTP/1.1" with a Host naming the server, and the blank line when whole. */
static const char *raw_get(const char *path, int whole)
{
    static char text[256];
    snprintf(text, sizeof(text), "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n%s", path, port, whole ? "\r\n" : "");
    return text;
}

/* A raw connection to the server that has sent text (no request yet if partial). */
static int raw_connect(const char *text)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    ck_assert_int_ge(fd, 0);
    ck_assert_int_eq(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
    if (text)
        ck_assert_int_eq(send(fd, text, strlen(text), MSG_NOSIGNAL), (ssize_t)strlen(text));
    return fd;
}

/* Reads what comes on fd until the server closes it or ms pass; returns the
 * bytes read (into buf) and whether it was closed in *closed. */
static size_t raw_read(int fd, char *buf, size_t cap, int ms, int *closed)
{
    size_t len = 0;
    uint64_t until = now_ms() + (uint64_t)ms;
    *closed = 0;
    while (now_ms() < until && len + 1 < cap) {
        struct timeval tv = {0, 20000};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
        ssize_t n = recv(fd, buf + len, cap - 1 - len, 0);
        if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
            *closed = 1;
            break;
        }
        if (n > 0)
            len += (size_t)n;
    }
    buf[len] = '\0';
    return len;
}

/* A client that trickles a header byte every 100 ms is cut off at the deadline, with a 408. */
START_TEST(test_request_deadline)
{
    publish_all();
    int fd = raw_connect(raw_get("/v1/status", 0));
    uint64_t t0 = now_ms(), closed_at = 0;
    char buf[1024];
    size_t have = 0;
    for (int i = 0; i < 30 && !closed_at; i++) { /* at most 3 s */
        send(fd, "X", 1, MSG_NOSIGNAL);
        int closed;
        have += raw_read(fd, buf + have, sizeof(buf) - have, 100, &closed);
        if (closed)
            closed_at = now_ms();
    }
    close(fd);
    ck_assert_msg(closed_at, "a trickling request was not cut off within 3 s");
    ck_assert_msg(closed_at - t0 >= 350 && closed_at - t0 < 1500, "cut off after %llu ms (deadline 400 ms)",
                  (unsigned long long)(closed_at - t0));
    ck_assert_msg(strncmp(buf, "HTTP/1.1 408", 12) == 0, "answer: %s", buf);
    struct http_guard_stats st;
    http_guard_counts(srv, &st);
    ck_assert_uint_eq(st.timed_out, 1);

    /* a quick request on a kept-alive connection is answered, and the idle
     * connection after it is closed at the deadline too */
    fd = raw_connect(raw_get("/v1/status", 1));
    int closed;
    raw_read(fd, buf, sizeof(buf), 200, &closed);
    ck_assert_msg(strncmp(buf, "HTTP/1.1 200", 12) == 0 && !closed, "answer: %.80s", buf);
    for (uint64_t until = now_ms() + 1500; !closed && now_ms() < until;) /* the rest of the answer, then EOF */
        raw_read(fd, buf, sizeof(buf), (int)(until - now_ms()), &closed);
    ck_assert_msg(closed, "an idle kept-alive connection outlived the deadline");
    close(fd);
}
END_TEST

/* Slow connections from one address make room for a quick request from it. */
START_TEST(test_per_address_eviction)
{
    publish_all();
    int slow[4];
    for (int i = 0; i < 4; i++) {
        slow[i] = raw_connect("GET /v1/status HTTP/1.1\r\n");
        usleep(20000);
    }
    uint64_t t0 = now_ms();
    struct resp *r = get("/v1/status");
    ck_assert_int_eq(r->status, 200);
    ck_assert_msg(now_ms() - t0 < 300, "status took %llu ms", (unsigned long long)(now_ms() - t0));
    char buf[512];
    int closed;
    raw_read(slow[0], buf, sizeof(buf), 300, &closed);
    ck_assert_msg(closed && strncmp(buf, "HTTP/1.1 408", 12) == 0, "the oldest slow connection: closed %d, '%s'",
                  closed, buf);
    raw_read(slow[3], buf, sizeof(buf), 50, &closed);
    ck_assert_msg(!closed, "the newest slow connection was closed too");
    struct http_guard_stats st;
    http_guard_counts(srv, &st);
    ck_assert_uint_ge(st.evicted, 1);
    ck_assert_uint_eq(st.refused, 0);
    for (int i = 0; i < 4; i++)
        close(slow[i]);
}
END_TEST

/* When every connection is busy answering, a new one is refused with a 503. */
START_TEST(test_refused_when_all_answering)
{
    pthread_mutex_lock(&fake.lock);
    fake.mode = FAKE_HOLD;
    pthread_mutex_unlock(&fake.lock);
    int held[4]; /* suspended log requests: being answered, as far as the guard knows */
    for (int i = 0; i < 4; i++)
        held[i] = raw_connect(raw_get("/v1/ranks/1/log", 1));
    for (int i = 0; i < 100 && fake_calls(NULL) < 4; i++)
        usleep(10000);
    ck_assert_int_eq(fake_calls(NULL), 4);
    int fd = raw_connect(NULL);
    char buf[512];
    int closed;
    raw_read(fd, buf, sizeof(buf), 1000, &closed);
    ck_assert_msg(closed && strncmp(buf, "HTTP/1.1 503", 12) == 0, "closed %d, answer '%s'", closed, buf);
    ck_assert_ptr_nonnull(strstr(buf, "too many connections"));
    close(fd);
    struct http_guard_stats st;
    http_guard_counts(srv, &st);
    ck_assert_uint_eq(st.refused, 1);
    pthread_mutex_lock(&fake.lock);
    ck_assert_int_eq(fake.nheld, 4);
    for (int i = 0; i < fake.nheld; i++) {
        struct logfetch_req *req = fake.all_held[i];
        req->status = 503;
        req->body = strdup("{\"error\":\"shutting down\"}");
        req->done(req);
    }
    pthread_mutex_unlock(&fake.lock);
    for (int i = 0; i < 4; i++)
        close(held[i]);
}
END_TEST

/* The deadline is the client's: a request all in whose answer takes longer
 * than request_ms to make (a loop slow to take an action, a big document
 * rendered on a loaded machine) is answered, not closed with a 408. */
START_TEST(test_slow_answer_is_not_a_slow_request)
{
    rec.delay_ms = 700;
    struct resp *r = request("POST", "/v1/job/stop", "Authorization: Bearer " TOKEN, NULL);
    ck_assert_msg(r->status == 202 || r->status == 200, "status %ld: %s", r->status, r->body);
    ck_assert_int_eq(recorded(NULL, NULL), 1);
    struct http_guard_stats st;
    http_guard_counts(srv, &st);
    ck_assert_uint_eq(st.timed_out, 0);
}
END_TEST

/* Eight whole requests at once, each answered after 700 ms, on libmicrohttpd's
 * four threads: at least one waits unread behind another's answer for longer
 * than request_ms. The wait is the server's: each is answered, none 408'd. */
START_TEST(test_request_waiting_on_a_busy_thread_is_not_timed_out)
{
    rec.delay_ms = 700;
    char text[512];
    snprintf(text, sizeof(text), "POST /v1/job/stop HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n"
             "Authorization: Bearer " TOKEN "\r\nContent-Type: application/json\r\nContent-Length: 0\r\nConnection: close\r\n\r\n", port);
    int fd[8];
    for (int i = 0; i < 8; i++)
        fd[i] = raw_connect(text);
    for (int i = 0; i < 8; i++) {
        char buf[1024] = "";
        size_t have = 0;
        int closed = 0;
        for (int k = 0; k < 60 && have < 12 && !closed; k++) /* at most 6 s each */
            have += raw_read(fd[i], buf + have, sizeof(buf) - have, 100, &closed);
        ck_assert_msg(strncmp(buf, "HTTP/1.1 20", 11) == 0, "request %d answered '%.40s'", i, buf);
        close(fd[i]);
    }
    ck_assert_int_eq(recorded(NULL, NULL), 8); /* (answered connections left open are the guard's to close) */
}
END_TEST

/* Review probes: the peek must not keep a request that never completes. */
static uint64_t lives_ms(int fd, int limit_ms, char *buf, size_t cap)
{
    uint64_t t0 = now_ms();
    int closed = 0;
    size_t have = 0;
    while (!closed && now_ms() - t0 < (uint64_t)limit_ms)
        have += raw_read(fd, buf + have, cap - have, 50, &closed);
    return closed ? now_ms() - t0 : 0;
}

START_TEST(test_whole_headers_with_a_body_never_sent_are_cut)
{
    publish_all();
    char text[512], buf[4096];
    snprintf(text, sizeof(text), "POST /v1/job/stop HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nContent-Length: 100\r\n\r\n", port);
    int fd = raw_connect(text);
    uint64_t t = lives_ms(fd, 3000, buf, sizeof(buf));
    close(fd);
    ck_assert_msg(t && t < 1500, "CL body never sent: lived %llu ms, '%.40s'", (unsigned long long)t, buf);
    /* pipelined: a whole GET, then the headers of a POST whose body never comes */
    snprintf(text, sizeof(text), "GET /v1/status HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n\r\n"
             "POST /v1/job/stop HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nContent-Length: 100\r\n\r\n", port, port);
    fd = raw_connect(text);
    t = lives_ms(fd, 3000, buf, sizeof(buf));
    close(fd);
    ck_assert_msg(t && t < 1500, "pipelined: lived %llu ms", (unsigned long long)t);
    /* body trickled, each byte group a CRLFCRLF */
    snprintf(text, sizeof(text), "POST /v1/job/stop HTTP/1.1\r\nHost: 127.0.0.1:%u\r\nContent-Length: 4000\r\n\r\n", port);
    fd = raw_connect(text);
    uint64_t t0 = now_ms();
    int closed = 0;
    while (!closed && now_ms() - t0 < 3000) {
        send(fd, "\r\n\r\n", 4, MSG_NOSIGNAL);
        raw_read(fd, buf, sizeof(buf), 100, &closed);
    }
    close(fd);
    ck_assert_msg(closed && now_ms() - t0 < 1500, "trickled CRLFCRLF body: lived %llu ms (closed %d)",
                  (unsigned long long)(now_ms() - t0), closed);
}
END_TEST

/* Readers too slow to drain a big answer make room for a quick request. */
START_TEST(test_slow_readers_evicted)
{
    snapshot_publish(&snap, big_view());
    int slow[4];
    for (int i = 0; i < 4; i++) {
        struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
        inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
        slow[i] = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        int small = 4096; /* a 6 MB list cannot fit in the socket buffers */
        setsockopt(slow[i], SOL_SOCKET, SO_RCVBUF, &small, sizeof(small));
        ck_assert_int_eq(connect(slow[i], (struct sockaddr *)&sa, sizeof(sa)), 0);
        const char *req = raw_get("/v1/ranks", 1);
        ck_assert_int_eq(send(slow[i], req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
    }
    for (int i = 0; i < 4; i++) { /* each answer is going out (at most 5 s) */
        char byte;
        for (int k = 0; k < 500 && recv(slow[i], &byte, 1, MSG_PEEK | MSG_DONTWAIT) != 1; k++)
            usleep(10000);
        ck_assert_int_eq(recv(slow[i], &byte, 1, MSG_PEEK | MSG_DONTWAIT), 1);
        char head[13] = "";
        for (int k = 0; k < 100 && recv(slow[i], head, 12, MSG_PEEK | MSG_DONTWAIT) < 12; k++)
            usleep(10000);
        ck_assert_msg(strncmp(head, "HTTP/1.1 200", 12) == 0, "slow reader %d was answered '%.12s'", i, head);
    }
    usleep(500000); /* and has been for longer than 300 ms */
    uint64_t t0 = now_ms();
    struct resp *r = get("/v1/status");
    ck_assert_int_eq(r->status, 200);
    ck_assert_msg(now_ms() - t0 < 500, "status took %llu ms", (unsigned long long)(now_ms() - t0));
    struct http_guard_stats st;
    http_guard_counts(srv, &st);
    for (int k = 0; k < 200 && st.evicted == 0; k++) { /* counted by the server's thread: up to 2 s on a loaded machine */
        usleep(10000);
        http_guard_counts(srv, &st);
    }
    ck_assert_uint_eq(st.evicted, 1);
    ck_assert_uint_eq(st.refused, 0);
    for (int i = 0; i < 4; i++)
        close(slow[i]);
}
END_TEST

Suite *make_http_suite(void)
{
    Suite *s = suite_create("http");

    TCase *tc = tcase_create("read");
    tcase_add_checked_fixture(tc, setup_admin, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_starting);
    tcase_add_test(tc, test_status_summary);
    tcase_add_test(tc, test_status_size_does_not_grow);
    tcase_add_test(tc, test_hung_and_stopped_ranks_need_attention);
    tcase_add_test(tc, test_documents_cached_per_version);
    tcase_add_test(tc, test_lists_filter_and_paginate);
    tcase_add_test(tc, test_list_bad_queries);
    tcase_add_test(tc, test_plan_and_fitness);
    tcase_add_test(tc, test_metrics);
    tcase_add_test(tc, test_odd_names_escaped);
    tcase_add_test(tc, test_dashboard);
    tcase_add_test(tc, test_history_of_extreme_values);
    tcase_add_test(tc, test_routing_errors);
    tcase_add_test(tc, test_port_in_use);
    suite_add_tcase(s, tc);

    tc = tcase_create("admin");
    tcase_add_checked_fixture(tc, setup_admin, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_admin_auth);
    tcase_add_test(tc, test_host_and_origin_checked);
    tcase_add_test(tc, test_standby_redirects_to_the_leader);
    tcase_add_test(tc, test_drain_bad_names);
    tcase_add_test(tc, test_body_limit);
    suite_add_tcase(s, tc);

    tc = tcase_create("hosts");
    tcase_add_test(tc, test_host_names);
    suite_add_tcase(s, tc);

    tc = tcase_create("logs");
    tcase_add_checked_fixture(tc, setup_no_admin, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_log_query_reaches_the_loop);
    tcase_add_test(tc, test_log_bad_queries);
    tcase_add_test(tc, test_log_answered_at_shutdown);
    tcase_add_test(tc, test_log_unavailable_without_a_loop);
    suite_add_tcase(s, tc);

    tc = tcase_create("guard");
    tcase_add_checked_fixture(tc, setup_guarded, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_request_deadline);
    tcase_add_test(tc, test_per_address_eviction);
    tcase_add_test(tc, test_refused_when_all_answering);
    tcase_add_test(tc, test_whole_headers_with_a_body_never_sent_are_cut);
    suite_add_tcase(s, tc);

    tc = tcase_create("guard_slow_readers");
    tcase_add_checked_fixture(tc, setup_slow_readers, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_slow_readers_evicted);
    suite_add_tcase(s, tc);

    tc = tcase_create("guard_admin");
    tcase_add_checked_fixture(tc, setup_guarded_admin, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_slow_answer_is_not_a_slow_request);
    tcase_add_test(tc, test_request_waiting_on_a_busy_thread_is_not_timed_out);
    suite_add_tcase(s, tc);

    tc = tcase_create("read_token");
    tcase_add_checked_fixture(tc, setup_read_token, teardown);
    tcase_add_test(tc, test_read_token);
    suite_add_tcase(s, tc);

    tc = tcase_create("admin_disabled");
    tcase_add_checked_fixture(tc, setup_no_admin, teardown);
    tcase_set_timeout(tc, 10);
    tcase_add_test(tc, test_admin_disabled);
    suite_add_tcase(s, tc);
    return s;
}
