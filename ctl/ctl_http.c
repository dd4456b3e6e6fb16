#include "ctl/ctl_http.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <curl/curl.h>

#define CTL_CONNECT_TIMEOUT_MS 2000L
#define CTL_TOTAL_TIMEOUT_MS 5000L
#define CTL_BODY_MAX (16u << 20)

struct sink {
    char *buf;
    size_t len, cap;
    int overflow;
};

static size_t on_data(char *data, size_t size, size_t nmemb, void *userp)
{
    struct sink *s = userp;
    size_t n = size * nmemb;
    if (s->len + n + 1 > CTL_BODY_MAX) {
        s->overflow = 1;
        return 0; /* makes curl fail with CURLE_WRITE_ERROR */
    }
    if (s->len + n + 1 > s->cap) {
        size_t cap = s->cap ? s->cap : 4096;
        while (cap < s->len + n + 1)
            cap *= 2;
        char *nb = realloc(s->buf, cap);
        if (!nb)
            return 0;
        s->buf = nb;
        s->cap = cap;
    }
    memcpy(s->buf + s->len, data, n);
    s->len += n;
    s->buf[s->len] = '\0';
    return n;
}

int ctl_request(const char *base, const char *method, const char *path, const char *token,
                struct ctl_reply *out, char *err, size_t errlen)
{
    return ctl_request_within(base, method, path, token, CTL_TOTAL_TIMEOUT_MS, out, err, errlen);
}

/*
 * One request to url. Returns 0 with *out filled, or -1 with err; *unreached
 * says whether the server was not reached at all (the next one may be), and
 * *location is a 307 or 308's target (malloc'd; NULL = none).
 */
static int request_url(const char *base, const char *url, const char *method, const char *token, long timeout_ms,
                       struct ctl_reply *out, char **location, int *unreached, char *err, size_t errlen)
{
    char auth[1024], curl_err[CURL_ERROR_SIZE] = "";
    struct sink sink = {0};
    struct curl_slist *headers = NULL;
    int rc = -1;

    memset(out, 0, sizeof(*out));
    *location = NULL;
    *unreached = 0;
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(err, errlen, "cannot reach musterd at %s: cannot initialise libcurl", base);
        return -1;
    }
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, CTL_CONNECT_TIMEOUT_MS);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, curl_err);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_data);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &sink);
    curl_easy_setopt(h, CURLOPT_USERAGENT, "musterctl/" MUSTER_VERSION);
    if (strcmp(method, "POST") == 0) {
        /* admin calls take a JSON content type (an empty body is one) */
        curl_easy_setopt(h, CURLOPT_POST, 1L);
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
        curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE, 0L);
        headers = curl_slist_append(headers, "Content-Type: application/json");
    }
    if (token) {
        snprintf(auth, sizeof(auth), "Authorization: Bearer %s", token);
        headers = curl_slist_append(headers, auth);
    }
    if (headers)
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, headers);

    CURLcode cc = curl_easy_perform(h);
    *unreached = cc == CURLE_COULDNT_CONNECT || cc == CURLE_COULDNT_RESOLVE_HOST ||
                 (cc == CURLE_OPERATION_TIMEDOUT && sink.len == 0);
    if (cc != CURLE_OK) {
        snprintf(err, errlen, "cannot reach musterd at %s: %s", base,
                 sink.overflow ? "reply larger than 16 MiB"
                 : curl_err[0] ? curl_err
                               : curl_easy_strerror(cc));
        free(sink.buf);
    } else {
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &out->status);
        char *to = NULL;
        if ((out->status == 307 || out->status == 308) && curl_easy_getinfo(h, CURLINFO_REDIRECT_URL, &to) == CURLE_OK &&
            to)
            *location = strdup(to);
        out->body = sink.buf ? sink.buf : strdup("");
        out->len = sink.len;
        rc = out->body ? 0 : -1;
        if (rc < 0)
            snprintf(err, errlen, "out of memory");
    }
    curl_slist_free_all(headers);
    curl_easy_cleanup(h);
    return rc;
}

/* The length of url's origin: "scheme://host[:port]", up to the path. */
static size_t origin_len(const char *url)
{
    const char *p = strstr(url, "://");
    if (!p)
        return 0;
    p += 3;
    return (size_t)(p - url) + strcspn(p, "/?#");
}

/* Whether url's origin is that of one of the servers of list. */
static int listed_origin(const char *list, const char *url)
{
    size_t n = origin_len(url);
    for (const char *b = list; n && *b;) {
        size_t m = strcspn(b, ",");
        if (origin_len(b) == n && strncasecmp(b, url, n) == 0)
            return 1;
        b += m + (b[m] == ',');
    }
    return 0;
}

int ctl_request_within(const char *base, const char *method, const char *path, const char *token,
                       long timeout_ms, struct ctl_reply *out, char *err, size_t errlen)
{
    char one[1024], url[2048];
    int rc = -1, unreached = 1;
    memset(out, 0, sizeof(*out));
    /* Every entry a URL: "a,,b" or a trailing comma is a mistake, not "the default". */
    for (const char *b = base;;) {
        size_t n = strcspn(b, ",");
        if (n == 0 || n >= sizeof(one)) {
            snprintf(err, errlen, "--server '%s': %s", base,
                     n ? "an entry longer than 1023 bytes" : "an empty entry (expected URL[,URL...])");
            return -1;
        }
        if (b[n] == '\0')
            break;
        b += n + 1;
    }
    /* Each server of the list in turn while none is reached. */
    for (const char *b = base; *b && unreached;) {
        size_t n = strcspn(b, ",");
        snprintf(one, sizeof(one), "%.*s", (int)n, b);
        b += n + (b[n] == ',');
        snprintf(url, sizeof(url), "%s%s", one, path);
        char *location;
        rc = request_url(one, url, method, token, timeout_ms, out, &location, &unreached, err, errlen);
        if (rc == 0 && location) {
            /* A standby names the leader (from etcd: whatever the leader key
             * holds). Asked once; the token goes only to a server of the list,
             * never to a host named by someone else. */
            char *again = NULL;
            ctl_reply_free(out);
            if (token && !listed_origin(base, location)) {
                snprintf(err, errlen,
                         "the musterd at %s stands by and names the leader at %.*s, which is not in --server: "
                         "the token is sent only to the servers named (add it to --server)",
                         one, (int)origin_len(location), location);
                rc = -1;
            } else {
                rc = request_url(location, location, method, token, timeout_ms, out, &again, &unreached, err, errlen);
            }
            if (rc == 0 && again) {
                ctl_reply_free(out);
                snprintf(err, errlen,
                         "the musterd at %s sent to %s, which sent on to %s: no leader answers (an election in "
                         "progress?); ask again in a few seconds",
                         one, location, again);
                rc = -1;
            }
            free(again);
            free(location);
            break;
        }
    }
    return rc;
}

void ctl_reply_free(struct ctl_reply *r)
{
    free(r->body);
    r->body = NULL;
}
