/*
 * etcd_codec: the requests and answers of etcd's v3 JSON gateway
 * (/v3/kv/txn, /v3/kv/range, /v3/lease/grant, /v3/lease/keepalive,
 * /v3/lease/revoke, /v3/watch, /v3/maintenance/status, /v3/auth/authenticate) as text, and the store's endpoint list.
 * Pure code: no socket, no thread, so that it is unit-tested on raw bytes.
 *
 * On that gateway keys and values are base64 (OpenSSL's EVP routines here)
 * and 64-bit integers are JSON strings; a field equal to its default (0,
 * false, empty) is left out of an answer, and is read as that default.
 * A gateway error is {"error": ..., "message": ...} (a stream's is
 * {"error": {"message": ...}}): the parsers return -EIO with the message.
 */
#ifndef MUSTER_ETCD_CODEC_H
#define MUSTER_ETCD_CODEC_H

#include <stddef.h>
#include <stdint.h>

#define ETCD_MAX_ENDPOINTS 8
#define ETCD_URL_MAX 300

/* The members a client may ask, in order. */
struct etcd_endpoints {
    int n;
    int tls; /* https:// */
    char url[ETCD_MAX_ENDPOINTS][ETCD_URL_MAX]; /* "http://h1:2379" or "https://h1:2379" */
};

/* "etcd://" or "http://" (plain HTTP), or "https://" (TLS), then
 * HOST:PORT[,HOST:PORT...]. Returns 0 or -EINVAL with err saying what was
 * expected. */
int etcd_endpoints_parse(const char *spec, struct etcd_endpoints *out, char *err, size_t errlen);

/* Whether the leader key's value (len bytes) is what a musterd writes:
 * "HOST:PORT" then optionally " " and an http:// or https:// URL, each at
 * most part_max bytes of printable ASCII without spaces. No: why says what. */
int etcd_leader_value_ok(const char *v, size_t len, size_t part_max, char *why, size_t whylen);

/* Base64 of len bytes, NUL-terminated (malloc'd; NULL = out of memory). */
char *etcd_b64(const void *data, size_t len);
/* The bytes of base64 text, NUL-terminated (malloc'd), *outlen without the
 * NUL. Returns 0, -EINVAL (not base64) or -ENOMEM. */
int etcd_unb64(const char *text, char **out, size_t *outlen);

/* Request bodies: malloc'd JSON text, NULL = out of memory. */
char *etcd_body_grant(int ttl_s);
char *etcd_body_lease(int64_t lease); /* keepalive and revoke */
/* Create key = value under lease if key does not exist; else read it. */
char *etcd_body_campaign(const char *key, const char *value, int64_t lease);
/* Put key = value if guard was created at revision guard_rev (and so is
 * still the same incarnation: the leader key of the term guard_rev). */
char *etcd_body_put_if(const char *guard, int64_t guard_rev, const char *key, const char *value);
char *etcd_body_range(const char *key);
/* Watch key from revision start_rev on (0 = from now). */
char *etcd_body_watch(const char *key, int64_t start_rev);

/* One key's entry; value is malloc'd (NUL-terminated), NULL when absent. */
struct etcd_kv {
    int present;
    int64_t create_rev, mod_rev, lease;
    char *value;
    size_t value_len;
};
void etcd_kv_free(struct etcd_kv *kv);

/* Each returns 0, or -EIO (an etcd error) / -EINVAL (not its answer) with
 * err saying what; *revision is the store's revision the answer is of. */
int etcd_parse_grant(const char *text, size_t len, int64_t *id, int64_t *ttl, char *err, size_t errlen);
/* *ttl = 0: the lease is gone (ended or revoked). */
int etcd_parse_keepalive(const char *text, size_t len, int64_t *ttl, char *err, size_t errlen);
/* A txn's answer: *succeeded, and kv the first range of whichever branch ran (if any). */
int etcd_parse_txn(const char *text, size_t len, int *succeeded, int64_t *revision, struct etcd_kv *kv, char *err,
                   size_t errlen);
int etcd_parse_range(const char *text, size_t len, int64_t *revision, struct etcd_kv *kv, char *err, size_t errlen);

/*
 * /v3/maintenance/status of one member (body "{}"): whether it knows a
 * raft leader (*has_leader: "leader" is a member id other than 0). A member
 * without quorum answers none, with "etcdserver: no leader" among its
 * "errors": that text, or the first error, goes to why ("" = none).
 */
int etcd_parse_status(const char *text, size_t len, int *has_leader, char *why, size_t whylen, char *err,
                      size_t errlen);

/* etcd's auth (/v3/auth/authenticate): the body, and the token of the
 * answer (written to token, cap bytes; -EIO: refused, e.g. a wrong
 * password; -EINVAL: no token). Later requests carry it in the
 * Authorization header. */
char *etcd_body_auth(const char *user, const char *password);
int etcd_parse_auth(const char *text, size_t len, char *token, size_t cap, char *err, size_t errlen);
/* The answer is etcd's refusal for want of a (valid) token: authenticate
 * again and retry. */
int etcd_unauthenticated(const char *text, size_t len);

/* One message of a watch stream (one line). */
struct etcd_watch_msg {
    int created;   /* the watch is set up */
    int canceled;  /* etcd ended it (e.g. its start revision was compacted) */
    int deleted;   /* an event deleted the key */
    int put;       /* an event wrote it */
    int64_t revision;
};
int etcd_parse_watch(const char *text, size_t len, struct etcd_watch_msg *m, char *err, size_t errlen);

#endif
