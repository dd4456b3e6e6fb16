#include "daemon/store_etcd.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <curl/curl.h>
#include <openssl/crypto.h>

#include "common/log.h"
#include "daemon/etcd_codec.h"

#define STORE_KEY_MAX 320
#define STORE_TOKEN_MAX 1024
#define STORE_EVENTS 16
/* Requests other than the watch: a member that does not answer in this
 * long is taken as lost (the next request goes to the next member). */
#define STORE_REQUEST_MS 1000
#define STORE_CONNECT_MS 500
/* A watch that broke is set up again after this long. */
#define STORE_REWATCH_MS 200
/* The largest answer (or watch line) taken: etcd's own requests are at most
 * 1.5 MiB by default (--max-request-bytes), so more than this is not etcd. */
#define STORE_ANSWER_MAX (16u << 20)

struct buf {
    char *p;
    size_t len, cap;
    int overflow; /* more than STORE_ANSWER_MAX came */
};

struct store {
    uv_loop_t *loop;
    uv_async_t async;
    void (*on_event)(void *ctx, struct store_event *ev);
    void *ctx;
    struct etcd_endpoints ep;
    char leader_key[STORE_KEY_MAX], state_key[STORE_KEY_MAX];
    char value[LEADER_VALUE_MAX]; /* the leader key's, when this musterd leads */
    char ca[PATH_MAX], cert[PATH_MAX], key[PATH_MAX]; /* TLS; "" = not given */
    char user[STORE_USER_MAX], password[STORE_PASSWORD_MAX]; /* etcd's auth; "" = off */

    pthread_t thread;
    int started;
    pthread_t own_thread;   /* own_watch_main */
    int own_started;
    pthread_mutex_t lock;   /* everything below */
    pthread_cond_t wake;
    pthread_cond_t kept;    /* a keepalive answered or failed, or deposed, or stop */
    int stop;
    int cur;                /* the member requests go to */
    struct leader el;
    int elected_told;       /* STORE_ELECTED was queued */
    int deposed_told;       /* STORE_DEPOSED was queued */
    int keepalive_failed;   /* the last keepalive did */
    int no_quorum_told;     /* STORE_NO_QUORUM was queued, STORE_QUORUM not yet */
    char token[STORE_TOKEN_MAX]; /* etcd's auth token ("" = none yet) */
    struct store_event events[STORE_EVENTS];
    int nevents;

    pthread_mutex_t write_lock; /* the pool thread's handle */
    CURL *wh;
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* ---- loop side --------------------------------------------------------- */

/* Called with the lock held: an event for the loop. */
static void post(struct store *s, const struct store_event *ev)
{
    if (s->nevents == STORE_EVENTS) {
        free(ev->state);
        log_error("internal: the store's event queue is full; an event is dropped");
        return;
    }
    s->events[s->nevents++] = *ev;
    uv_async_send(&s->async);
}

/* Called with the lock held: a deposition not yet told is queued. */
static void tell_deposed(struct store *s)
{
    if (s->el.role != LEADER_DEPOSED || s->deposed_told)
        return;
    s->deposed_told = 1;
    struct store_event ev = {.kind = STORE_DEPOSED, .term = s->el.term};
    snprintf(ev.why, sizeof(ev.why), "%s", s->el.why);
    post(s, &ev);
    pthread_cond_signal(&s->wake);
    pthread_cond_broadcast(&s->kept);
}

static void on_async(uv_async_t *a)
{
    struct store *s = a->data;
    struct store_event evs[STORE_EVENTS];
    pthread_mutex_lock(&s->lock);
    int n = s->nevents;
    memcpy(evs, s->events, sizeof(evs[0]) * (size_t)n);
    s->nevents = 0;
    pthread_mutex_unlock(&s->lock);
    for (int i = 0; i < n; i++)
        s->on_event(s->ctx, &evs[i]);
}

/* An absolute CLOCK_MONOTONIC time for pthread_cond_timedwait. */
static struct timespec mono_at(uint64_t due)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    uint64_t now = mono_ms(), ms = due > now ? due - now : 0;
    ts.tv_sec += (time_t)(ms / 1000);
    ts.tv_nsec += (long)(ms % 1000) * 1000000L;
    if (ts.tv_nsec >= 1000000000L) {
        ts.tv_sec++;
        ts.tv_nsec -= 1000000000L;
    }
    return ts;
}

int store_acting(struct store *s)
{
    pthread_mutex_lock(&s->lock);
    int acting = leader_acting(&s->el, mono_ms());
    /* Unsure (no keepalive answered lately, e.g. while etcd elects a new
     * raft leader): the loop waits for one, at most until the lease could
     * have ended, rather than act or drop what it sends. */
    uint64_t until;
    while (!acting && !s->stop && (until = leader_unsure(&s->el, mono_ms())) != 0) {
        struct timespec ts = mono_at(until);
        pthread_cond_timedwait(&s->kept, &s->lock, &ts);
        acting = leader_acting(&s->el, mono_ms());
    }
    tell_deposed(s);
    pthread_mutex_unlock(&s->lock);
    return acting;
}

uint64_t store_no_quorum_since(struct store *s)
{
    pthread_mutex_lock(&s->lock);
    uint64_t since = s->el.role == LEADER_LEADING && s->no_quorum_told ? s->el.no_quorum_since : 0;
    pthread_mutex_unlock(&s->lock);
    return since;
}

/* Part part (0: the control address, 1: the REST URL) of the leader key's value. */
static void leader_part(struct store *s, int part, char *out, size_t cap)
{
    pthread_mutex_lock(&s->lock);
    const char *v = s->el.role == LEADER_LEADING ? s->value : s->el.leader;
    size_t n = strcspn(v, " ");
    if (part == 0)
        snprintf(out, cap, "%.*s", (int)n, v);
    else
        snprintf(out, cap, "%s", v[n] ? v + n + 1 : "");
    pthread_mutex_unlock(&s->lock);
}

void store_leader(struct store *s, char *out, size_t cap) { leader_part(s, 0, out, cap); }

void store_leader_rest(struct store *s, char *out, size_t cap) { leader_part(s, 1, out, cap); }

/* ---- HTTP -------------------------------------------------------------- */

static size_t on_body(char *data, size_t size, size_t n, void *ctx)
{
    struct buf *b = ctx;
    size_t len = size * n;
    if (len > STORE_ANSWER_MAX || b->len + len > STORE_ANSWER_MAX) {
        b->overflow = 1;
        return 0; /* ends the transfer: CURLE_WRITE_ERROR */
    }
    if (b->len + len + 1 > b->cap) {
        size_t cap = (b->len + len + 1) * 2;
        char *p = realloc(b->p, cap);
        if (!p)
            return 0;
        b->p = p;
        b->cap = cap;
    }
    memcpy(b->p + b->len, data, len);
    b->len += len;
    b->p[b->len] = '\0';
    return len;
}

static int member(struct store *s)
{
    pthread_mutex_lock(&s->lock);
    int i = s->cur;
    pthread_mutex_unlock(&s->lock);
    return i;
}

/* The member i failed: later requests go to the next one (unless another
 * thread moved on already). */
static void next_member(struct store *s, int i, const char *why)
{
    pthread_mutex_lock(&s->lock);
    if (s->cur == i) {
        s->cur = (i + 1) % s->ep.n;
        log_warn_limited("etcd member %s: %s; asking %s from now on", s->ep.url[i], why, s->ep.url[s->cur]);
    }
    pthread_mutex_unlock(&s->lock);
}

/* The token etcd's auth gave (""= none yet), for the Authorization header. */
static void token_get(struct store *s, char *out, size_t cap)
{
    pthread_mutex_lock(&s->lock);
    snprintf(out, cap, "%s", s->token);
    pthread_mutex_unlock(&s->lock);
}

/* Sets up h for one POST: TLS as configured, the auth token if any. Returns
 * the header list to free after the transfer (NULL: none). */
static struct curl_slist *set_common(struct store *s, CURL *h, const char *url, const char *body, struct buf *resp,
                                     int with_token)
{
    curl_easy_reset(h);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_body);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, resp);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, (long)STORE_CONNECT_MS);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPALIVE, 1L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPIDLE, 2L);
    curl_easy_setopt(h, CURLOPT_TCP_KEEPINTVL, 1L);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, s->ep.tls ? "https" : "http");
    if (s->ca[0])
        curl_easy_setopt(h, CURLOPT_CAINFO, s->ca);
    if (s->cert[0]) {
        curl_easy_setopt(h, CURLOPT_SSLCERT, s->cert);
        curl_easy_setopt(h, CURLOPT_SSLKEY, s->key);
    }
    char token[STORE_TOKEN_MAX], header[STORE_TOKEN_MAX + 32];
    token_get(s, token, sizeof(token));
    if (!with_token || !token[0])
        return NULL;
    snprintf(header, sizeof(header), "Authorization: %s", token);
    struct curl_slist *hdrs = curl_slist_append(NULL, header);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdrs);
    return hdrs;
}

static int perform(struct store *s, CURL *h, int i, const char *path, const char *body, long timeout_ms,
                   struct buf *resp, int with_token, char *err, size_t errlen, CURLcode *curl_rc)
{
    char url[ETCD_URL_MAX + 64];
    snprintf(url, sizeof(url), "%s%s", s->ep.url[i], path);
    resp->len = 0;
    resp->overflow = 0;
    char detail[CURL_ERROR_SIZE] = "";
    struct curl_slist *hdrs = set_common(s, h, url, body, resp, with_token);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, detail); /* names the TLS failure, where there is one */
    CURLcode rc = curl_easy_perform(h);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, NULL);
    curl_slist_free_all(hdrs);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    *curl_rc = rc;
    if (rc == CURLE_OK && resp->len > 0 && (status == 200 || status >= 400))
        return 0;
    if (rc == CURLE_OK)
        snprintf(err, errlen, "%s%s: HTTP status %ld without an answer", s->ep.url[i], path, status);
    else if (resp->overflow)
        snprintf(err, errlen, "%s%s: an answer larger than %u MiB (not etcd's)", s->ep.url[i], path,
                 STORE_ANSWER_MAX >> 20);
    else
        snprintf(err, errlen, "%s%s: %s", s->ep.url[i], path, detail[0] ? detail : curl_easy_strerror(rc));
    return -EIO;
}

/* etcd's auth: a token for the user, from member i. 0, or -EIO / -EACCES
 * (refused: a wrong user or password) with err. */
static int authenticate(struct store *s, CURL *h, int i, struct buf *resp, char *err, size_t errlen)
{
    char token[STORE_TOKEN_MAX];
    CURLcode crc;
    char *body = etcd_body_auth(s->user, s->password);
    if (!body) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = perform(s, h, i, "/v3/auth/authenticate", body, STORE_REQUEST_MS, resp, 0, err, errlen, &crc);
    OPENSSL_cleanse(body, strlen(body));
    free(body);
    if (rc != 0)
        return rc;
    rc = etcd_parse_auth(resp->p, resp->len, token, sizeof(token), err, errlen);
    if (rc != 0) {
        log_warn_limited("etcd: authentication as '%s' failed: %s", s->user, err);
        return rc == -EIO ? -EACCES : rc;
    }
    pthread_mutex_lock(&s->lock);
    snprintf(s->token, sizeof(s->token), "%s", token);
    pthread_mutex_unlock(&s->lock);
    OPENSSL_cleanse(token, sizeof(token));
    return 0;
}

/* POSTs body to path on member i (one try; with etcd's auth, a token got
 * first or again when etcd no longer takes it): 0 with the answer in resp,
 * or -EIO (no answer; err says why, *curl_rc how). */
static int request_to(struct store *s, CURL *h, int i, const char *path, const char *body, long timeout_ms,
                      struct buf *resp, char *err, size_t errlen, CURLcode *curl_rc)
{
    *curl_rc = CURLE_OK;
    for (int tries = 0; tries < 2; tries++) {
        char token[STORE_TOKEN_MAX];
        token_get(s, token, sizeof(token));
        if (s->user[0] && !token[0] && authenticate(s, h, i, resp, err, errlen) != 0)
            return -EIO;
        int rc = perform(s, h, i, path, body, timeout_ms, resp, 1, err, errlen, curl_rc);
        if (rc != 0 || !s->user[0] || !etcd_unauthenticated(resp->p, resp->len))
            return rc;
        pthread_mutex_lock(&s->lock);
        if (strcmp(s->token, token) == 0)
            s->token[0] = '\0'; /* expired (or never valid): a new one */
        pthread_mutex_unlock(&s->lock);
    }
    return 0; /* the refusal is the answer: its parser says so */
}

/*
 * POSTs body to path on the current member (one try). Returns 0 with the
 * answer in resp (an etcd error too: its parser says so), or -EIO when the
 * member did not answer (and the next member is the current one).
 */
static int request(struct store *s, CURL *h, const char *path, const char *body, long timeout_ms, struct buf *resp,
                   char *err, size_t errlen)
{
    CURLcode rc;
    int i = member(s);
    if (request_to(s, h, i, path, body, timeout_ms, resp, err, errlen, &rc) == 0)
        return 0;
    next_member(s, i, rc == CURLE_OK ? "no answer" : curl_easy_strerror(rc));
    return -EIO;
}

/* ---- the thread -------------------------------------------------------- */

static void wait_until(struct store *s, uint64_t due)
{
    pthread_mutex_lock(&s->lock);
    uint64_t now = mono_ms();
    if (!s->stop && due > now) {
        struct timespec ts = mono_at(due - now > 1000 ? now + 1000 : due);
        pthread_cond_timedwait(&s->wake, &s->lock, &ts);
    }
    pthread_mutex_unlock(&s->lock);
}

static int stopping(struct store *s)
{
    pthread_mutex_lock(&s->lock);
    int stop = s->stop;
    pthread_mutex_unlock(&s->lock);
    return stop;
}

static void do_grant(struct store *s, CURL *h, struct buf *resp, int ttl_s)
{
    char err[512];
    int64_t id = 0, ttl = 0;
    char *body = etcd_body_grant(ttl_s);
    int rc = body ? request(s, h, "/v3/lease/grant", body, STORE_REQUEST_MS, resp, err, sizeof(err)) : -ENOMEM;
    free(body);
    if (rc == 0)
        rc = etcd_parse_grant(resp->p, resp->len, &id, &ttl, err, sizeof(err));
    pthread_mutex_lock(&s->lock);
    if (rc == 0)
        leader_granted(&s->el, id);
    else
        leader_failed(&s->el, mono_ms());
    pthread_mutex_unlock(&s->lock);
    if (rc != 0)
        log_warn_limited("etcd: no lease: %s", rc == -ENOMEM ? "out of memory" : err);
}

/* The stored state after winning: read until a member answers (a bounded
 * number of rounds); NULL and *ok = 1 when there is none. */
static char *read_state(struct store *s, CURL *h, struct buf *resp, int *ok)
{
    char err[512];
    char *body = etcd_body_range(s->state_key);
    *ok = 0;
    for (int tries = 0; body && tries < 3 * s->ep.n && !stopping(s); tries++) {
        int64_t rev;
        struct etcd_kv kv;
        int rc = request(s, h, "/v3/kv/range", body, STORE_REQUEST_MS, resp, err, sizeof(err));
        if (rc == 0)
            rc = etcd_parse_range(resp->p, resp->len, &rev, &kv, err, sizeof(err));
        if (rc == 0) {
            free(body);
            *ok = 1;
            return kv.present ? kv.value : NULL;
        }
        log_warn("etcd: cannot read the job's state: %s", err);
    }
    free(body);
    return NULL;
}

static void do_campaign(struct store *s, CURL *h, struct buf *resp)
{
    char err[512];
    int succeeded = 0;
    int64_t rev = 0;
    struct etcd_kv kv = {0};
    pthread_mutex_lock(&s->lock);
    int64_t lease = s->el.lease;
    pthread_mutex_unlock(&s->lock);
    char *body = etcd_body_campaign(s->leader_key, s->value, lease);
    int rc = body ? request(s, h, "/v3/kv/txn", body, STORE_REQUEST_MS, resp, err, sizeof(err)) : -ENOMEM;
    free(body);
    if (rc == 0)
        rc = etcd_parse_txn(resp->p, resp->len, &succeeded, &rev, &kv, err, sizeof(err));
    if (rc == 0 && !succeeded && !kv.present) {
        /* Deleted between the compare and the range: run again. */
        rc = -EAGAIN;
        snprintf(err, sizeof(err), "the leader key went away during the campaign");
    }
    if (rc != 0) {
        etcd_kv_free(&kv);
        pthread_mutex_lock(&s->lock);
        leader_failed(&s->el, mono_ms());
        pthread_mutex_unlock(&s->lock);
        log_warn_limited("etcd: campaign for %s not decided: %s", s->leader_key, err);
        return;
    }
    /* Whoever may write the key may write anything: a value not as a musterd
     * writes it names no leader (REST answers 503, agents are told "another
     * musterd"), rather than go into a Location header or a REJECT. */
    char why[160];
    if (!succeeded && !etcd_leader_value_ok(kv.value, kv.value_len, LEADER_ADDR_MAX - 1, why, sizeof(why))) {
        log_warn_limited("etcd: the leader key %s (term %lld) holds %zu bytes that are not a musterd's "
                         "\"HOST:PORT URL\": %s; the leader is taken as unknown",
                         s->leader_key, (long long)kv.create_rev, kv.value_len, why);
        free(kv.value);
        kv.value = NULL;
        kv.value_len = 0;
    }
    pthread_mutex_lock(&s->lock);
    leader_campaigned(&s->el, succeeded, rev, kv.value, kv.create_rev);
    pthread_mutex_unlock(&s->lock);
    if (succeeded) {
        /* Told to the loop once the first keepalive answers (announce). */
        log_info("etcd: won the election for %s (term %lld)", s->leader_key, (long long)rev);
    } else {
        struct store_event ev = {.kind = STORE_STANDBY, .term = kv.create_rev};
        const char *v = kv.value ? kv.value : "";
        snprintf(ev.leader, sizeof(ev.leader), "%.*s", (int)strcspn(v, " "), v); /* its control address */
        pthread_mutex_lock(&s->lock);
        post(s, &ev);
        pthread_mutex_unlock(&s->lock);
    }
    etcd_kv_free(&kv);
}

/* Leading and acting for the first time: the loop is told, with the stored state. */
static void announce(struct store *s, CURL *h, struct buf *resp)
{
    int ok;
    struct store_event ev = {.kind = STORE_ELECTED};
    ev.state = read_state(s, h, resp, &ok);
    pthread_mutex_lock(&s->lock);
    ev.term = s->el.term;
    if (!ok)
        leader_depose(&s->el, "elected, but no etcd member gave the job's state");
    if (s->el.role == LEADER_LEADING)
        post(s, &ev);
    else
        free(ev.state);
    s->elected_told = 1;
    tell_deposed(s);
    pthread_mutex_unlock(&s->lock);
}

/*
 * Every member is asked whether it knows a raft leader (its status: served
 * by the member itself, without quorum). A short timeout each: the probe
 * runs in the keepalive's cadence.
 */
static void probe_quorum(struct store *s, CURL *h, struct buf *resp, int *answered, int *with_leader, char *why,
                         size_t whylen)
{
    long timeout = (long)(s->el.ttl_ms / LEADER_KEEPALIVES); /* ttl_ms is set once: no lock */
    for (int i = 0; i < s->ep.n && !stopping(s); i++) {
        char err[512], said[LEADER_WHY_MAX];
        CURLcode crc;
        int has = 0;
        if (request_to(s, h, i, "/v3/maintenance/status", "{}", timeout, resp, err, sizeof(err), &crc) != 0 ||
            etcd_parse_status(resp->p, resp->len, &has, said, sizeof(said), err, sizeof(err)) != 0) {
            log_debug("etcd: status of member %s: %s", s->ep.url[i], err);
            continue;
        }
        (*answered)++;
        *with_leader += has;
        if (!has && said[0] && !why[0])
            snprintf(why, whylen, "%s", said);
    }
}

static void do_keepalive(struct store *s, CURL *h, struct buf *resp)
{
    char err[512];
    int64_t ttl = 0;
    uint64_t sent = mono_ms();
    pthread_mutex_lock(&s->lock);
    int64_t lease = s->el.lease;
    /* Not longer than a quarter of the lease: the next member gets its turn
     * in time. After a failure, a twelfth: a member without quorum holds a
     * keepalive until it times out, and the probe that follows must find
     * the quorum lost before the lease could end. */
    long timeout = (long)(s->el.ttl_ms / (s->keepalive_failed ? 12 : 4));
    pthread_mutex_unlock(&s->lock);
    char *body = etcd_body_lease(lease);
    int rc = body ? request(s, h, "/v3/lease/keepalive", body, timeout, resp, err, sizeof(err)) : -ENOMEM;
    free(body);
    if (rc == 0)
        rc = etcd_parse_keepalive(resp->p, resp->len, &ttl, err, sizeof(err));
    if (rc != 0)
        log_warn_limited("etcd: lease keepalive failed: %s", err);
    /* Failed for want of quorum (members answer, none knows a raft leader),
     * or because this musterd is cut off (none answers)? */
    int answered = 0, with_leader = 0;
    uint64_t probed = mono_ms();
    char no_leader[LEADER_WHY_MAX] = "";
    if (rc != 0 && rc != -ENOMEM)
        probe_quorum(s, h, resp, &answered, &with_leader, no_leader, sizeof(no_leader));
    pthread_mutex_lock(&s->lock);
    uint64_t now = mono_ms(), unsure = leader_unsure(&s->el, now), lost = s->el.no_quorum_since;
    s->keepalive_failed = rc != 0;
    if (rc == 0) {
        leader_kept(&s->el, sent, ttl);
    } else {
        leader_probed(&s->el, probed, answered, with_leader);
        leader_failed(&s->el, now);
    }
    int acting = leader_acting(&s->el, now);
    /* Told once it lasts longer than an etcd election would (a third of the
     * TTL): while members elect a new raft leader none knows one either. */
    uint64_t since = s->el.no_quorum_since;
    if (since && !s->no_quorum_told && now - since >= s->el.ttl_ms / 3) {
        struct store_event ev = {.kind = STORE_NO_QUORUM, .term = s->el.term};
        snprintf(ev.why, sizeof(ev.why), "%d of %d etcd members answer, none knows a raft leader (%s)", answered,
                 s->ep.n, no_leader[0] ? no_leader : "no leader");
        post(s, &ev);
        s->no_quorum_told = 1;
    } else if (lost && !since && s->no_quorum_told) {
        s->no_quorum_told = 0;
        if (s->el.role == LEADER_LEADING) {
            struct store_event ev = {.kind = STORE_QUORUM, .term = s->el.term};
            snprintf(ev.why, sizeof(ev.why), "etcd has a quorum again after %.1f s: the lease was kept",
                     (double)(now - lost) / 1000.0);
            post(s, &ev);
        }
    }
    tell_deposed(s);
    pthread_cond_broadcast(&s->kept);
    pthread_mutex_unlock(&s->lock);
    if (unsure && acting)
        log_info("etcd: a keepalive answered %llu ms before the lease could have ended: acting again",
                 (unsigned long long)(unsure - now));
}

struct watch_ctx {
    struct store *s;
    struct buf line;
    int any_write;          /* a write ends the watch too (the leader's own key) */
    int deleted, canceled, put;
    int64_t revision;
    char malformed[512]; /* a line that is not a watch answer: why ("" = none) */
};

/* Stream bytes: complete lines are messages. Returning less than given ends the transfer. */
static size_t on_watch(char *data, size_t size, size_t n, void *ctx)
{
    struct watch_ctx *w = ctx;
    size_t len = size * n;
    if (on_body(data, 1, len, &w->line) != len)
        return 0;
    char *nl;
    while ((nl = memchr(w->line.p, '\n', w->line.len)) != NULL) {
        size_t one = (size_t)(nl - w->line.p);
        struct etcd_watch_msg m;
        char err[512];
        if (etcd_parse_watch(w->line.p, one, &m, err, sizeof(err)) != 0) {
            snprintf(w->malformed, sizeof(w->malformed), "%s", err);
            return 0;
        }
        memmove(w->line.p, nl + 1, w->line.len - one - 1);
        w->line.len -= one + 1;
        w->revision = m.revision;
        if (m.deleted || m.canceled || (w->any_write && m.put)) {
            w->deleted = m.deleted;
            w->canceled = m.canceled;
            w->put = m.put;
            return 0;
        }
    }
    return len;
}

static int watch_progress(void *ctx, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    (void)a, (void)b, (void)c, (void)d;
    return stopping(ctx);
}

/*
 * A watch that said nothing for a TTL: is its member still serving (a
 * linearizable read needs etcd's quorum, which a stopped member or one cut
 * off from the others cannot give), and is the leader key still the one
 * this standby follows? The watch alone cannot tell: an idle watch and one
 * whose member stalled look the same. Yes: it watches again from where it
 * was; the key gone or made anew: it campaigns; no answer: the next member.
 */
static void recheck_leader(struct store *s, CURL *h, struct buf *resp)
{
    char err[512];
    int64_t rev;
    struct etcd_kv kv = {0};
    char *body = etcd_body_range(s->leader_key);
    int rc = body ? request(s, h, "/v3/kv/range", body, STORE_REQUEST_MS, resp, err, sizeof(err)) : -ENOMEM;
    free(body);
    if (rc == 0)
        rc = etcd_parse_range(resp->p, resp->len, &rev, &kv, err, sizeof(err));
    if (rc != 0) {
        log_warn_limited("etcd: the watch of the leader was silent for a TTL and its member did not answer: %s",
                         rc == -ENOMEM ? "out of memory" : err);
        wait_until(s, mono_ms() + STORE_REWATCH_MS);
        return;
    }
    pthread_mutex_lock(&s->lock);
    if (s->el.role == LEADER_STANDBY && (!kv.present || kv.create_rev != s->el.leader_term)) {
        log_info("etcd: the leader key %s (term %lld then) is %s: running for leader", s->leader_key,
                 (long long)s->el.leader_term, kv.present ? "another's now" : "gone");
        s->el.role = LEADER_CANDIDATE; /* the campaign reads the key afresh */
    }
    pthread_mutex_unlock(&s->lock);
    etcd_kv_free(&kv);
}

/* One watch of the leader key from revision from on member i, for
 * at most a TTL (ttl_ms is set once: no lock), its events into w, progress
 * (and the way to abort it) through progress(data). -ENOMEM, or curl's code. */
static int watch_leader_key(struct store *s, CURL *h, int i, int64_t from, struct watch_ctx *w,
                            curl_xferinfo_callback progress, void *data)
{
    char url[ETCD_URL_MAX + 64];
    char *body = etcd_body_watch(s->leader_key, from);
    if (!body)
        return -ENOMEM;
    snprintf(url, sizeof(url), "%s/v3/watch", s->ep.url[i]);
    struct curl_slist *hdrs = set_common(s, h, url, body, &w->line, 1);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_watch);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, w);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, data);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, (long)s->el.ttl_ms);
    CURLcode rc = curl_easy_perform(h);
    curl_slist_free_all(hdrs);
    free(body);
    free(w->line.p);
    return (int)rc;
}

static void do_watch(struct store *s, CURL *h, struct buf *resp)
{
    pthread_mutex_lock(&s->lock);
    int64_t from = s->el.watch_from;
    pthread_mutex_unlock(&s->lock);
    int i = member(s);
    struct watch_ctx w = {.s = s};
    /* At most a TTL: then recheck_leader (a stalled member sends nothing, as an idle one). */
    int got = watch_leader_key(s, h, i, from, &w, watch_progress, s);
    if (got < 0)
        return;
    CURLcode rc = (CURLcode)got;
    pthread_mutex_lock(&s->lock);
    if (w.deleted) {
        log_info("etcd: the leader key was deleted (revision %lld): running for leader",
                 (long long)w.revision);
        leader_watch_deleted(&s->el, w.revision);
    } else if (w.canceled) {
        /* The revision to start from is gone (compacted): campaign again, which reads the key afresh. */
        s->el.role = LEADER_CANDIDATE;
    }
    pthread_mutex_unlock(&s->lock);
    if (w.deleted || w.canceled || rc == CURLE_ABORTED_BY_CALLBACK)
        return;
    if (rc == CURLE_OPERATION_TIMEDOUT) {
        recheck_leader(s, h, resp);
        return;
    }
    char why[160];
    if (w.line.overflow)
        snprintf(why, sizeof(why), "a watch line longer than %u MiB (not etcd's)", STORE_ANSWER_MAX >> 20);
    else if (w.malformed[0])
        snprintf(why, sizeof(why), "the watch: %.100s", w.malformed);
    else
        snprintf(why, sizeof(why), "%s", rc == CURLE_OK ? "the watch ended" : curl_easy_strerror(rc));
    next_member(s, i, why);
    wait_until(s, mono_ms() + STORE_REWATCH_MS);
}

/* ---- the leader watches its own key -------------------------------------- */

/* How long the watcher waits before it looks again (not leading, or a watch that broke). */
#define STORE_OWN_POLL_MS 100

struct own_ctx {
    struct store *s;
    int64_t term;
};

/* Ends the transfer at stop, or once this musterd no longer leads in term. */
static int own_progress(void *ctx, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d)
{
    struct own_ctx *o = ctx;
    (void)a, (void)b, (void)c, (void)d;
    pthread_mutex_lock(&o->s->lock);
    int end = o->s->stop || o->s->el.role != LEADER_LEADING || o->s->el.term != o->term;
    pthread_mutex_unlock(&o->s->lock);
    return end;
}

/*
 * The leader watches its own key from the revision after its creation:
 * deleted, or written by anyone (this musterd never writes it again), while
 * its lease is alive, it no longer stands for this musterd's leadership and
 * a standby may already be campaigning; so it steps down at once instead of
 * at its next refused write. On a thread of its own: the store's thread
 * blocks in its requests and waits between keepalives. A watch that breaks
 * is set up again from the same revision, at the next member.
 */
static void *own_watch_main(void *arg)
{
    struct store *s = arg;
    CURL *h = curl_easy_init();
    if (!h) {
        log_error("etcd: cannot set up libcurl: the leader does not watch its own key");
        return NULL;
    }
    for (;;) {
        pthread_mutex_lock(&s->lock);
        int stop = s->stop, leading = s->el.role == LEADER_LEADING;
        int64_t term = s->el.term;
        pthread_mutex_unlock(&s->lock);
        if (stop)
            break;
        if (!leading || !term) {
            usleep(STORE_OWN_POLL_MS * 1000);
            continue;
        }
        int i = member(s);
        struct watch_ctx w = {.s = s, .any_write = 1};
        struct own_ctx o = {.s = s, .term = term};
        int got = watch_leader_key(s, h, i, term + 1, &w, own_progress, &o); /* then set up anew */
        if (got < 0) {
            usleep(STORE_OWN_POLL_MS * 1000);
            continue;
        }
        CURLcode rc = (CURLcode)got;
        if (w.deleted || w.put || w.canceled) {
            char why[LEADER_WHY_MAX];
            if (w.canceled)
                snprintf(why, sizeof(why),
                         "etcd ended the watch of the leader key %s (its revision was compacted): it may no longer "
                         "be this musterd's", s->leader_key);
            else
                snprintf(why, sizeof(why),
                         "the leader key %s was %s in etcd (revision %lld) while the lease was alive: another "
                         "musterd may lead", s->leader_key, w.deleted ? "deleted" : "overwritten",
                         (long long)w.revision);
            pthread_mutex_lock(&s->lock);
            if (!s->stop && s->el.role == LEADER_LEADING && s->el.term == term) {
                log_warn("etcd: %s", why);
                leader_depose(&s->el, why);
                tell_deposed(s);
            }
            pthread_mutex_unlock(&s->lock);
            continue;
        }
        if (rc != CURLE_OK && rc != CURLE_ABORTED_BY_CALLBACK && rc != CURLE_OPERATION_TIMEDOUT) {
            log_warn_limited("etcd member %s: the leader's watch of its own key: %s", s->ep.url[i],
                             w.malformed[0] ? w.malformed : curl_easy_strerror(rc));
            usleep(STORE_OWN_POLL_MS * 1000);
        }
    }
    curl_easy_cleanup(h);
    return NULL;
}

static void revoke_lease(struct store *s, CURL *h, struct buf *resp)
{
    char err[512];
    pthread_mutex_lock(&s->lock);
    int64_t lease = s->el.role == LEADER_LEADING ? s->el.lease : 0;
    pthread_mutex_unlock(&s->lock);
    if (!lease)
        return;
    char *body = etcd_body_lease(lease);
    for (int tries = 0; body && tries < s->ep.n; tries++)
        if (request(s, h, "/v3/lease/revoke", body, STORE_REQUEST_MS, resp, err, sizeof(err)) == 0) {
            log_info("etcd: lease revoked: a standby leads now");
            break;
        }
    free(body);
}

static void *thread_main(void *arg)
{
    struct store *s = arg;
    CURL *h = curl_easy_init();
    struct buf resp = {0};
    if (!h) {
        pthread_mutex_lock(&s->lock);
        s->el.role = LEADER_DEPOSED;
        pthread_mutex_unlock(&s->lock);
        log_error("etcd: cannot set up libcurl: the store is not reachable");
        return NULL;
    }
    int ttl_s = (int)(s->el.ttl_ms / 1000);
    while (!stopping(s)) {
        uint64_t due;
        pthread_mutex_lock(&s->lock);
        enum leader_action act = leader_next(&s->el, mono_ms(), &due);
        pthread_mutex_unlock(&s->lock);
        switch (act) {
        case LEADER_GRANT: do_grant(s, h, &resp, ttl_s); break;
        case LEADER_CAMPAIGN: do_campaign(s, h, &resp); break;
        case LEADER_KEEPALIVE: do_keepalive(s, h, &resp); break;
        case LEADER_WATCH: do_watch(s, h, &resp); break;
        case LEADER_WAIT:
            pthread_mutex_lock(&s->lock);
            leader_acting(&s->el, mono_ms());
            tell_deposed(s);
            pthread_mutex_unlock(&s->lock);
            wait_until(s, due);
            break;
        }
        pthread_mutex_lock(&s->lock);
        int first = s->el.role == LEADER_LEADING && !s->elected_told && leader_acting(&s->el, mono_ms());
        pthread_mutex_unlock(&s->lock);
        if (first)
            announce(s, h, &resp);
    }
    revoke_lease(s, h, &resp);
    free(resp.p);
    curl_easy_cleanup(h);
    return NULL;
}

/* ---- writes ------------------------------------------------------------ */

int store_write_state(struct store *s, const char *text, char *err, size_t errlen)
{
    pthread_mutex_lock(&s->lock);
    int64_t term = s->el.role == LEADER_LEADING ? s->el.term : 0;
    pthread_mutex_unlock(&s->lock);
    if (!term) {
        snprintf(err, errlen, "this musterd does not lead the job");
        return -EPERM;
    }
    char *body = etcd_body_put_if(s->leader_key, term, s->state_key, text);
    if (!body) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    struct buf resp = {0};
    int rc = -EIO;
    pthread_mutex_lock(&s->write_lock);
    for (int tries = 0; tries < s->ep.n; tries++) {
        int succeeded = 0;
        int64_t rev;
        struct etcd_kv kv;
        rc = request(s, s->wh, "/v3/kv/txn", body, STORE_REQUEST_MS, &resp, err, errlen);
        if (rc == 0)
            rc = etcd_parse_txn(resp.p, resp.len, &succeeded, &rev, &kv, err, errlen);
        if (rc == 0) {
            etcd_kv_free(&kv);
            if (!succeeded) {
                snprintf(err, errlen, "the leader key %s is no longer of term %lld", s->leader_key,
                         (long long)term);
                pthread_mutex_lock(&s->lock);
                leader_depose(&s->el, "a state write was refused: another musterd leads");
                tell_deposed(s);
                pthread_mutex_unlock(&s->lock);
                rc = -EPERM;
            }
            break;
        }
        rc = -EIO; /* an etcd error (e.g. no quorum) or no answer: the next member */
    }
    pthread_mutex_unlock(&s->write_lock);
    free(resp.p);
    free(body);
    return rc;
}

/* ---- life -------------------------------------------------------------- */

int store_open(struct store **out, uv_loop_t *loop, const struct store_config *cfg,
               void (*on_event)(void *ctx, struct store_event *ev), void *ctx, char *err, size_t errlen)
{
    *out = NULL;
    struct store *s = calloc(1, sizeof(*s));
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    int rc = etcd_endpoints_parse(cfg->endpoints, &s->ep, err, errlen);
    if (rc != 0) {
        free(s);
        return rc;
    }
    s->loop = loop;
    s->on_event = on_event;
    s->ctx = ctx;
    snprintf(s->leader_key, sizeof(s->leader_key), STORE_PREFIX "%s/leader", cfg->job);
    snprintf(s->state_key, sizeof(s->state_key), STORE_PREFIX "%s/state", cfg->job);
    snprintf(s->value, sizeof(s->value), "%s %s", cfg->advertise, cfg->rest ? cfg->rest : "");
    snprintf(s->ca, sizeof(s->ca), "%s", cfg->ca ? cfg->ca : "");
    snprintf(s->cert, sizeof(s->cert), "%s", cfg->cert ? cfg->cert : "");
    snprintf(s->key, sizeof(s->key), "%s", cfg->key ? cfg->key : "");
    snprintf(s->user, sizeof(s->user), "%s", cfg->user ? cfg->user : "");
    snprintf(s->password, sizeof(s->password), "%s", cfg->password ? cfg->password : "");
    leader_init(&s->el, cfg->ttl_s);
    curl_global_init(CURL_GLOBAL_DEFAULT); /* before the thread: not thread-safe */
    pthread_mutex_init(&s->lock, NULL);
    pthread_mutex_init(&s->write_lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&s->wake, &ca);
    pthread_cond_init(&s->kept, &ca);
    pthread_condattr_destroy(&ca);
    s->wh = curl_easy_init();
    if (!s->wh || uv_async_init(loop, &s->async, on_async) != 0) {
        snprintf(err, errlen, "cannot set up libcurl or the loop's wakeup");
        if (s->wh)
            curl_easy_cleanup(s->wh);
        free(s);
        return -ENOMEM;
    }
    s->async.data = s;
    /* The loop's life is not the store's: musterd's shutdown ends the loop, then closes the store. */
    uv_unref((uv_handle_t *)&s->async);
    rc = pthread_create(&s->thread, NULL, thread_main, s);
    if (rc != 0) {
        snprintf(err, errlen, "cannot start the store's thread: %s", strerror(rc));
        uv_close((uv_handle_t *)&s->async, NULL);
        *out = s; /* store_free after the loop ran the close */
        return -rc;
    }
    s->started = 1;
    if (pthread_create(&s->own_thread, NULL, own_watch_main, s) == 0)
        s->own_started = 1;
    else
        log_error("etcd: cannot start the leader's watch of its own key: it steps down only when a write is refused");
    *out = s;
    return 0;
}

void store_close(struct store *s)
{
    if (!s)
        return;
    pthread_mutex_lock(&s->lock);
    s->stop = 1;
    pthread_cond_signal(&s->wake);
    pthread_cond_broadcast(&s->kept);
    pthread_mutex_unlock(&s->lock);
    if (s->started)
        pthread_join(s->thread, NULL);
    s->started = 0;
    if (s->own_started)
        pthread_join(s->own_thread, NULL);
    s->own_started = 0;
    if (!uv_is_closing((uv_handle_t *)&s->async))
        uv_close((uv_handle_t *)&s->async, NULL);
}

void store_free(struct store *s)
{
    if (!s)
        return;
    OPENSSL_cleanse(s->password, sizeof(s->password));
    OPENSSL_cleanse(s->token, sizeof(s->token));
    for (int i = 0; i < s->nevents; i++)
        free(s->events[i].state);
    curl_easy_cleanup(s->wh);
    pthread_mutex_destroy(&s->lock);
    pthread_mutex_destroy(&s->write_lock);
    pthread_cond_destroy(&s->wake);
    pthread_cond_destroy(&s->kept);
    free(s);
}
