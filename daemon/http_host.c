#include "daemon/http_host.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/*
 * Splits "NAME[:PORT]" or "[V6][:PORT]" (len bytes of s) into a lower-case
 * name without a trailing dot and a port (-1 when none is given). 0, or
 * -EINVAL when it is neither.
 */
static int split(const char *s, size_t len, char name[HTTP_HOST_NAME_MAX + 1], long *port)
{
    size_t nlen, i = 0;
    const char *rest;
    if (len > 0 && s[0] == '[') {
        const char *close = memchr(s, ']', len);
        if (!close || close == s + 1)
            return -EINVAL;
        nlen = (size_t)(close - s - 1);
        if (nlen > HTTP_HOST_NAME_MAX)
            return -EINVAL;
        for (i = 0; i < nlen; i++) {
            char ch = s[1 + i];
            if (!isxdigit((unsigned char)ch) && ch != ':' && ch != '.')
                return -EINVAL;
            name[i] = (char)tolower((unsigned char)ch);
        }
        name[nlen] = '\0';
        rest = close + 1;
    } else {
        const char *colon = memchr(s, ':', len);
        nlen = colon ? (size_t)(colon - s) : len;
        if (nlen > 0 && s[nlen - 1] == '.')
            nlen--; /* "localhost." is "localhost" */
        if (nlen == 0 || nlen > HTTP_HOST_NAME_MAX)
            return -EINVAL;
        for (i = 0; i < nlen; i++) {
            char ch = s[i];
            if (!isalnum((unsigned char)ch) && ch != '.' && ch != '-' && ch != '_')
                return -EINVAL;
            name[i] = (char)tolower((unsigned char)ch);
        }
        name[nlen] = '\0';
        rest = colon ? colon : s + len;
    }
    size_t left = len - (size_t)(rest - s);
    *port = -1;
    if (left == 0)
        return 0;
    if (rest[0] != ':' || left < 2 || left > 6)
        return -EINVAL;
    long p = 0;
    for (i = 1; i < left; i++) {
        if (!isdigit((unsigned char)rest[i]))
            return -EINVAL;
        p = p * 10 + (rest[i] - '0');
    }
    if (p < 1 || p > 65535)
        return -EINVAL;
    *port = p;
    return 0;
}

int http_hosts_init(struct http_hosts *h, const char *bind, uint16_t port)
{
    struct in_addr a;
    memset(h, 0, sizeof(*h));
    if (inet_pton(AF_INET, bind, &a) != 1)
        return -EINVAL;
    h->bind = a.s_addr;
    h->port = port;
    return 0;
}

/* Calls one(ctx, s, len) for each comma-separated entry of list, trimmed. */
static int each_entry(const char *list, int (*one)(void *ctx, const char *s, size_t len), void *ctx)
{
    const char *p = list;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        const char *s = p;
        while (len > 0 && isspace((unsigned char)*s))
            s++, len--;
        while (len > 0 && isspace((unsigned char)s[len - 1]))
            len--;
        int rc = one(ctx, s, len);
        if (rc != 0)
            return rc;
        if (!end)
            break;
        p = end + 1;
    }
    return 0;
}

static int check_one(void *ctx, const char *s, size_t len)
{
    char name[HTTP_HOST_NAME_MAX + 1];
    long port;
    (void)ctx;
    return split(s, len, name, &port);
}

int http_hosts_valid_list(const char *list)
{
    return each_entry(list, check_one, NULL);
}

struct add_ctx {
    struct http_hosts *h;
    char *err;
    size_t errlen;
};

static int add_one(void *ctx, const char *s, size_t len)
{
    struct add_ctx *a = ctx;
    char name[HTTP_HOST_NAME_MAX + 1];
    long port;
    if (split(s, len, name, &port) != 0) {
        snprintf(a->err, a->errlen, "'%.*s' is not NAME or NAME:PORT", (int)(len > 80 ? 80 : len), s);
        return -EINVAL;
    }
    if (a->h->n == HTTP_HOSTS_MAX) {
        snprintf(a->err, a->errlen, "more than %d host names", HTTP_HOSTS_MAX);
        return -ENOSPC;
    }
    snprintf(a->h->names[a->h->n].name, sizeof(a->h->names[0].name), "%s", name);
    a->h->names[a->h->n].port = port < 0 ? 0 : (uint16_t)port;
    a->h->n++;
    return 0;
}

int http_hosts_add(struct http_hosts *h, const char *list, char *err, size_t errlen)
{
    struct add_ctx a = {h, err, errlen};
    return each_entry(list, add_one, &a);
}

static int is_loopback(uint32_t addr_be)
{
    return (ntohl(addr_be) >> 24) == 127;
}

/* name and port as split gives them, port already defaulted. */
static int allowed(const struct http_hosts *h, const char *name, long port)
{
    for (unsigned i = 0; i < h->n; i++)
        if (strcmp(h->names[i].name, name) == 0 && port == (h->names[i].port ? h->names[i].port : h->port))
            return 1;
    if (port != h->port)
        return 0;
    struct in_addr a;
    if (inet_pton(AF_INET, name, &a) == 1)
        return h->bind == 0 || a.s_addr == h->bind || (is_loopback(h->bind) && is_loopback(a.s_addr));
    /* what "localhost" resolves to is this host's business, not a page's */
    return (h->bind == 0 || is_loopback(h->bind)) && (strcmp(name, "localhost") == 0 || strcmp(name, "::1") == 0);
}

int http_host_allowed(const struct http_hosts *h, const char *host)
{
    char name[HTTP_HOST_NAME_MAX + 1];
    long port;
    if (!host || split(host, strlen(host), name, &port) != 0)
        return 0;
    return allowed(h, name, port < 0 ? 80 : port);
}

int http_origin_allowed(const struct http_hosts *h, const char *origin)
{
    char name[HTTP_HOST_NAME_MAX + 1];
    long port;
    long def;
    const char *rest;
    if (strncasecmp(origin, "http://", 7) == 0) {
        rest = origin + 7;
        def = 80;
    } else if (strncasecmp(origin, "https://", 8) == 0) {
        rest = origin + 8;
        def = 443;
    } else {
        return 0; /* "null" (a sandboxed page, a file, a redirect) or another scheme */
    }
    if (split(rest, strlen(rest), name, &port) != 0)
        return 0;
    return allowed(h, name, port < 0 ? def : port);
}
