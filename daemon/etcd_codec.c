#include "daemon/etcd_codec.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>
#include <openssl/evp.h>

/* ---- endpoints --------------------------------------------------------- */

static int valid_host(const char *h, size_t n)
{
    if (n == 0)
        return 0;
    if (h[0] == '[')
        return n > 2 && h[n - 1] == ']' && strspn(h + 1, "0123456789abcdefABCDEF:.") == n - 2;
    return strspn(h, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-_") >= n;
}

int etcd_endpoints_parse(const char *spec, struct etcd_endpoints *out, char *err, size_t errlen)
{
    /* etcd:// is plain HTTP, as http://; https:// is TLS. */
    static const char *const schemes[][2] = {{"etcd://", "http"}, {"http://", "http"}, {"https://", "https"}};
    const char *proto = NULL, *p = spec;
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]) && !proto; i++)
        if (strncmp(spec, schemes[i][0], strlen(schemes[i][0])) == 0) {
            proto = schemes[i][1];
            p = spec + strlen(schemes[i][0]);
        }
    if (!proto) {
        snprintf(err, errlen, "expected etcd://, http:// or https:// then HOST:PORT[,HOST:PORT...], got '%s'", spec);
        return -EINVAL;
    }
    out->tls = strcmp(proto, "https") == 0;
    for (;;) {
        size_t n = strcspn(p, ",");
        const char *colon = NULL;
        for (size_t i = 0; i < n; i++)
            if (p[i] == ':')
                colon = p + i;
        char *end;
        long port = colon ? strtol(colon + 1, &end, 10) : 0;
        if (!colon || end != p + n || colon + 1 == end || port < 1 || port > 65535 ||
            !valid_host(p, (size_t)(colon - p)) || (size_t)(colon - p) > 256) {
            snprintf(err, errlen, "'%.*s' in '%s': expected HOST:PORT (a name, IPv4 or [IPv6], port 1..65535)",
                     (int)n, p, spec);
            return -EINVAL;
        }
        if (out->n == ETCD_MAX_ENDPOINTS) {
            snprintf(err, errlen, "'%s': more than %d members", spec, ETCD_MAX_ENDPOINTS);
            return -EINVAL;
        }
        snprintf(out->url[out->n++], ETCD_URL_MAX, "%s://%.*s", proto, (int)n, p);
        if (p[n] == '\0')
            return 0;
        p += n + 1;
    }
}

/* ---- the leader key's value -------------------------------------------- */

/* n bytes of printable ASCII without spaces. */
static int graphic(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (p[i] < 0x21 || p[i] > 0x7e)
            return 0;
    return 1;
}

int etcd_leader_value_ok(const char *v, size_t len, size_t part_max, char *why, size_t whylen)
{
    if (!v || strlen(v) != len) {
        snprintf(why, whylen, "%s", v ? "a NUL byte in it" : "no value");
        return 0;
    }
    size_t ctl = strcspn(v, " ");
    const char *rest = v[ctl] ? v + ctl + 1 : v + ctl;
    size_t rlen = strlen(rest);
    if (ctl == 0 || ctl > part_max || !graphic(v, ctl) || !memchr(v, ':', ctl)) {
        snprintf(why, whylen, "the control address is not HOST:PORT of at most %zu printable bytes", part_max);
        return 0;
    }
    if (rlen && (rlen > part_max || !graphic(rest, rlen) ||
                 (strncmp(rest, "http://", 7) != 0 && strncmp(rest, "https://", 8) != 0))) {
        snprintf(why, whylen, "the REST address is not an http:// or https:// URL of at most %zu printable bytes",
                 part_max);
        return 0;
    }
    return 1;
}

/* ---- base64 ------------------------------------------------------------ */

char *etcd_b64(const void *data, size_t len)
{
    if (len > (size_t)INT32_MAX / 2)
        return NULL;
    char *out = malloc(4 * ((len + 2) / 3) + 1);
    if (out)
        EVP_EncodeBlock((unsigned char *)out, data, (int)len);
    return out;
}

int etcd_unb64(const char *text, char **out, size_t *outlen)
{
    size_t n = strlen(text);
    *out = NULL;
    *outlen = 0;
    if (n % 4 != 0 || n > (size_t)INT32_MAX / 2 ||
        strspn(text, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=") != n)
        return -EINVAL;
    size_t pad = n && text[n - 1] == '=' ? (n > 1 && text[n - 2] == '=' ? 2 : 1) : 0;
    if (memchr(text, '=', n - pad))
        return -EINVAL;
    unsigned char *buf = malloc(n / 4 * 3 + 1);
    if (!buf)
        return -ENOMEM;
    int got = n ? EVP_DecodeBlock(buf, (const unsigned char *)text, (int)n) : 0;
    if (got < 0 || (size_t)got < pad) {
        free(buf);
        return -EINVAL;
    }
    *outlen = (size_t)got - pad; /* EVP_DecodeBlock counts the padding as zero bytes */
    buf[*outlen] = '\0';
    *out = (char *)buf;
    return 0;
}

/* ---- requests ---------------------------------------------------------- */

static char *dump(json_t *doc)
{
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return text;
}

/* The gateway reads 64-bit integers from strings. */
static json_t *i64(int64_t v)
{
    char s[24];
    snprintf(s, sizeof(s), "%lld", (long long)v);
    return json_string(s);
}

/* A base64 JSON string of a NUL-terminated text (NULL = out of memory). */
static json_t *b64s(const char *s)
{
    char *b = etcd_b64(s, strlen(s));
    json_t *j = b ? json_string(b) : NULL;
    free(b);
    return j;
}

char *etcd_body_grant(int ttl_s) { return dump(json_pack("{s:o}", "TTL", i64(ttl_s))); }

char *etcd_body_lease(int64_t lease) { return dump(json_pack("{s:o}", "ID", i64(lease))); }

char *etcd_body_campaign(const char *key, const char *value, int64_t lease)
{
    return dump(json_pack("{s:[{s:o, s:s, s:s, s:o}], s:[{s:{s:o, s:o, s:o}}], s:[{s:{s:o}}]}", "compare", "key",
                          b64s(key), "target", "CREATE", "result", "EQUAL", "create_revision", i64(0), "success",
                          "request_put", "key", b64s(key), "value", b64s(value), "lease", i64(lease), "failure",
                          "request_range", "key", b64s(key)));
}

char *etcd_body_put_if(const char *guard, int64_t guard_rev, const char *key, const char *value)
{
    return dump(json_pack("{s:[{s:o, s:s, s:s, s:o}], s:[{s:{s:o, s:o}}]}", "compare", "key", b64s(guard), "target",
                          "CREATE", "result", "EQUAL", "create_revision", i64(guard_rev), "success", "request_put",
                          "key", b64s(key), "value", b64s(value)));
}

char *etcd_body_range(const char *key) { return dump(json_pack("{s:o}", "key", b64s(key))); }

char *etcd_body_watch(const char *key, int64_t start_rev)
{
    json_t *req = json_pack("{s:o}", "key", b64s(key));
    if (req && start_rev > 0)
        json_object_set_new(req, "start_revision", i64(start_rev));
    return dump(req ? json_pack("{s:o}", "create_request", req) : NULL);
}

/* ---- answers ----------------------------------------------------------- */

void etcd_kv_free(struct etcd_kv *kv)
{
    free(kv->value);
    memset(kv, 0, sizeof(*kv));
}

/* An int64 field: a JSON string of digits or a number; absent = 0. */
static int get_i64(const json_t *obj, const char *name, int64_t *out)
{
    const json_t *v = json_object_get(obj, name);
    *out = 0;
    if (!v)
        return 0;
    if (json_is_integer(v)) {
        *out = json_integer_value(v);
        return 0;
    }
    const char *s = json_string_value(v);
    char *end;
    if (!s || !*s)
        return -EINVAL;
    errno = 0;
    long long x = strtoll(s, &end, 10);
    if (errno || *end)
        return -EINVAL;
    *out = x;
    return 0;
}

static int bad(char *err, size_t errlen, const char *what, const char *detail)
{
    snprintf(err, errlen, "etcd answered %s: %s", what, detail);
    return -EINVAL;
}

/*
 * Loads an answer and turns a gateway error into -EIO: the unary form
 * {"error": "...", "code": N, "message": "..."} and a stream's
 * {"error": {"grpc_code": N, "message": "..."}}.
 */
static int load(const char *text, size_t len, const char *what, json_t **out, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *doc = json_loadb(text, len, 0, &jerr);
    *out = NULL;
    if (!json_is_object(doc)) {
        json_decref(doc);
        if (doc)
            return bad(err, errlen, what, "not a JSON object");
        /* Not JSON: the gateway's own words, at most a line of them. */
        const char *nl = memchr(text, '\n', len);
        size_t line = nl ? (size_t)(nl - text) : len;
        snprintf(err, errlen, "etcd answered %s with text, not JSON: '%.*s'", what, (int)(line < 160 ? line : 160),
                 text);
        return -EINVAL;
    }
    json_t *e = json_object_get(doc, "error");
    if (e) {
        const char *msg = json_string_value(json_object_get(json_is_object(e) ? e : doc, "message"));
        if (!msg)
            msg = json_is_string(e) ? json_string_value(e) : "(no message)";
        snprintf(err, errlen, "etcd refused %s: %s", what, msg);
        json_decref(doc);
        return -EIO;
    }
    *out = doc;
    return 0;
}

static int get_revision(const json_t *doc, int64_t *rev)
{
    return get_i64(json_object_get(doc, "header"), "revision", rev);
}

/* The first entry of a range answer (kvs may be absent: no such key). */
static int read_kv(const json_t *range, struct etcd_kv *kv)
{
    const json_t *kvs = json_object_get(range, "kvs");
    const json_t *e = json_array_get(kvs, 0);
    memset(kv, 0, sizeof(*kv));
    if (kvs && !json_is_array(kvs))
        return -EINVAL;
    if (!e)
        return 0;
    const char *v = json_string_value(json_object_get(e, "value"));
    if (!json_is_object(e) || get_i64(e, "create_revision", &kv->create_rev) || get_i64(e, "mod_revision", &kv->mod_rev) ||
        get_i64(e, "lease", &kv->lease))
        return -EINVAL;
    if (etcd_unb64(v ? v : "", &kv->value, &kv->value_len) != 0)
        return -EINVAL;
    kv->present = 1;
    return 0;
}

int etcd_parse_grant(const char *text, size_t len, int64_t *id, int64_t *ttl, char *err, size_t errlen)
{
    json_t *doc;
    int rc = load(text, len, "the lease grant", &doc, err, errlen);
    if (rc)
        return rc;
    if (get_i64(doc, "ID", id) || get_i64(doc, "TTL", ttl) || *id == 0 || *ttl <= 0)
        rc = bad(err, errlen, "the lease grant", "no lease ID and TTL");
    json_decref(doc);
    return rc;
}

int etcd_parse_keepalive(const char *text, size_t len, int64_t *ttl, char *err, size_t errlen)
{
    json_t *doc;
    int rc = load(text, len, "the lease keepalive", &doc, err, errlen);
    if (rc)
        return rc;
    json_t *res = json_object_get(doc, "result");
    if (!json_is_object(res) || get_i64(res, "TTL", ttl) || *ttl < 0)
        rc = bad(err, errlen, "the lease keepalive", "no result");
    json_decref(doc);
    return rc;
}

char *etcd_body_auth(const char *user, const char *password)
{
    json_t *doc = json_pack("{s:s, s:s}", "name", user, "password", password);
    char *text = doc ? json_dumps(doc, JSON_COMPACT) : NULL;
    json_decref(doc);
    return text;
}

int etcd_parse_auth(const char *text, size_t len, char *token, size_t cap, char *err, size_t errlen)
{
    json_t *doc;
    int rc = load(text, len, "the authentication", &doc, err, errlen);
    if (rc)
        return rc;
    const char *t = json_string_value(json_object_get(doc, "token"));
    /* A token goes into a header: printable ASCII only. */
    if (!t || !*t || strlen(t) >= cap || strspn(t, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
                                                   "+/=._-") != strlen(t))
        rc = bad(err, errlen, "the authentication", "no token, or a token that is not base64-like text");
    else
        snprintf(token, cap, "%s", t);
    json_decref(doc);
    return rc;
}

int etcd_unauthenticated(const char *text, size_t len)
{
    json_t *doc = json_loadb(text, len, 0, NULL);
    json_t *e = json_object_get(doc, "error");
    const char *msg = json_string_value(json_object_get(json_is_object(e) ? e : doc, "message"));
    json_int_t code = json_integer_value(json_object_get(json_is_object(e) ? e : doc, json_is_object(e) ? "grpc_code" : "code"));
    /* gRPC's Unauthenticated (16): a token that expired or was never given. */
    int yes = e && (code == 16 || (msg && (strstr(msg, "invalid auth token") || strstr(msg, "user name is empty"))));
    json_decref(doc);
    return yes;
}

int etcd_parse_status(const char *text, size_t len, int *has_leader, char *why, size_t whylen, char *err,
                      size_t errlen)
{
    json_t *doc;
    *has_leader = 0;
    if (whylen)
        why[0] = '\0';
    int rc = load(text, len, "the member's status", &doc, err, errlen);
    if (rc)
        return rc;
    /* A member id is a u64 in a string: only whether it is 0 matters here. */
    const json_t *leader = json_object_get(doc, "leader");
    const char *id = json_string_value(leader);
    const json_t *errors = json_object_get(doc, "errors");
    if ((leader && (!id || !*id || strspn(id, "0123456789") != strlen(id))) || (errors && !json_is_array(errors)) ||
        !json_is_object(json_object_get(doc, "header"))) {
        rc = bad(err, errlen, "the member's status", "a malformed leader, errors or header");
    } else {
        *has_leader = id && strspn(id, "0") != strlen(id);
        const char *first = json_string_value(json_array_get(errors, 0));
        if (first && whylen)
            snprintf(why, whylen, "%s", first);
    }
    json_decref(doc);
    return rc;
}

int etcd_parse_txn(const char *text, size_t len, int *succeeded, int64_t *revision, struct etcd_kv *kv, char *err,
                   size_t errlen)
{
    json_t *doc;
    memset(kv, 0, sizeof(*kv));
    int rc = load(text, len, "the transaction", &doc, err, errlen);
    if (rc)
        return rc;
    const json_t *ok = json_object_get(doc, "succeeded");
    const json_t *resp = json_object_get(doc, "responses");
    *succeeded = json_is_true(ok);
    if ((ok && !json_is_boolean(ok)) || (resp && !json_is_array(resp)) || get_revision(doc, revision) ||
        *revision <= 0) {
        rc = bad(err, errlen, "the transaction", "no header revision or a malformed result");
        goto out;
    }
    size_t i;
    json_t *r;
    json_array_foreach(resp, i, r) {
        json_t *range = json_object_get(r, "response_range");
        if (range) {
            if (read_kv(range, kv) != 0)
                rc = bad(err, errlen, "the transaction", "a malformed key entry");
            break;
        }
    }
out:
    json_decref(doc);
    return rc;
}

int etcd_parse_range(const char *text, size_t len, int64_t *revision, struct etcd_kv *kv, char *err, size_t errlen)
{
    json_t *doc;
    memset(kv, 0, sizeof(*kv));
    int rc = load(text, len, "the range", &doc, err, errlen);
    if (rc)
        return rc;
    if (get_revision(doc, revision) || *revision <= 0 || read_kv(doc, kv) != 0)
        rc = bad(err, errlen, "the range", "no header revision or a malformed key entry");
    json_decref(doc);
    return rc;
}

int etcd_parse_watch(const char *text, size_t len, struct etcd_watch_msg *m, char *err, size_t errlen)
{
    json_t *doc;
    memset(m, 0, sizeof(*m));
    int rc = load(text, len, "the watch", &doc, err, errlen);
    if (rc)
        return rc;
    json_t *res = json_object_get(doc, "result");
    json_t *events = json_object_get(res, "events");
    if (!json_is_object(res) || get_revision(res, &m->revision) || (events && !json_is_array(events))) {
        rc = bad(err, errlen, "the watch", "no result");
        goto out;
    }
    m->created = json_is_true(json_object_get(res, "created"));
    m->canceled = json_is_true(json_object_get(res, "canceled"));
    size_t i;
    json_t *e;
    json_array_foreach(events, i, e) {
        const char *type = json_string_value(json_object_get(e, "type"));
        if (type && strcmp(type, "DELETE") == 0)
            m->deleted = 1;
        else if (!type || strcmp(type, "PUT") == 0) /* PUT is the enum's 0: the gateway leaves it out */
            m->put = 1;
    }
out:
    json_decref(doc);
    return rc;
}
