/*
 * ctl_http: musterctl's one way to talk to musterd, a bounded libcurl
 * request (connect 2 s, total 5 s unless said otherwise, body at most 16 MiB).
 */
#ifndef MUSTER_CTL_HTTP_H
#define MUSTER_CTL_HTTP_H

#include <stddef.h>

struct ctl_reply {
    long status; /* HTTP status code */
    char *body;  /* NUL-terminated, malloc'd */
    size_t len;
};

/*
 * method "GET" or "POST" to base + path; token, when not NULL, goes in
 * "Authorization: Bearer". base may list several musterd ("URL,URL": the
 * musterd of one job, one leading): each is tried in turn until one is
 * reached, and a standby's 307 to the leader is followed once. Returns 0
 * with *out filled (any HTTP status), or -1 with err = "cannot reach
 * musterd at <url>: <curl error>" (the last one tried).
 */
int ctl_request(const char *base, const char *method, const char *path, const char *token,
                struct ctl_reply *out, char *err, size_t errlen);
/* Like ctl_request, with a total timeout of timeout_ms (a request that waits on a node). */
int ctl_request_within(const char *base, const char *method, const char *path, const char *token,
                       long timeout_ms, struct ctl_reply *out, char *err, size_t errlen);
void ctl_reply_free(struct ctl_reply *r);

#endif
