/*
 * http_host: which names a request may address musterd's REST by. A page on
 * another site can make the operator's browser talk to the REST port in two
 * ways: by a name of its own that it re-points at the master (DNS
 * rebinding: the browser sends the attacker's name as Host and lets the page
 * read the answers), or by a cross-site request (the browser sends the
 * page's Origin). So every request but /healthz must name an allowed host in
 * Host, and an Origin, when there is one, must be http(s)://an allowed host.
 *
 * Allowed: the address REST is bound to; when bound to a loopback address,
 * "localhost", any 127.x.y.z and [::1]; when bound to 0.0.0.0, "localhost",
 * [::1] and any IPv4 address (a literal address cannot be rebound: a page
 * can only reach it under its own origin) and the names musterd adds (its
 * host name, the advertised one); and the names of rest_hosts. A name without a port
 * takes the REST port; "NAME:PORT" allows that port (a proxy in front).
 * Names are compared without case and without a trailing dot.
 *
 * Pure: no sockets, no allocation.
 */
#ifndef MUSTER_HTTP_HOST_H
#define MUSTER_HTTP_HOST_H

#include <stddef.h>
#include <stdint.h>

#define HTTP_HOSTS_MAX 16    /* names in rest_hosts, plus musterd's own */
#define HTTP_HOST_NAME_MAX 253

struct http_hosts {
    uint32_t bind;   /* IPv4 REST is bound to, network order (0 = every address) */
    uint16_t port;   /* the REST port */
    unsigned n;
    struct {
        char name[HTTP_HOST_NAME_MAX + 1]; /* lower case, no trailing dot */
        uint16_t port;                     /* 0 = the REST port */
    } names[HTTP_HOSTS_MAX];
};

/* bind: the IPv4 address REST is bound to, as text. 0 or -EINVAL. */
int http_hosts_init(struct http_hosts *h, const char *bind, uint16_t port);

/*
 * Adds the names of list: "NAME[:PORT]" separated by commas (spaces around
 * them allowed); "" adds none. 0, -EINVAL (err names the entry) or -ENOSPC
 * (more than HTTP_HOSTS_MAX names in all).
 */
int http_hosts_add(struct http_hosts *h, const char *list, char *err, size_t errlen);

/* 0 when list is a valid rest_hosts value (as http_hosts_add would take it). */
int http_hosts_valid_list(const char *list);

/* 1 when a Host header's value names this server, else 0. */
int http_host_allowed(const struct http_hosts *h, const char *host);

/* 1 when an Origin header's value is http:// or https:// an allowed host. */
int http_origin_allowed(const struct http_hosts *h, const char *origin);

#endif
