/*
 * hostport.c: the HOST:PORT grammar of hostport.h. Pure: no resolving, no
 * allocation; each refusal names the part that was wrong.
 */
#include "common/hostport.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

int hostport_parse_flags(const char *s, unsigned flags, char host[HOSTPORT_HOST_MAX], uint16_t *port, char *err,
                         size_t errlen)
{
    const char *colon, *h = s;
    size_t hlen;
    if (s[0] == '[') {
        const char *close = strchr(s, ']');
        if (!close || close[1] != ':') {
            snprintf(err, errlen, "expected [IPv6]:PORT, got '%s'", s);
            return -EINVAL;
        }
        h = s + 1;
        hlen = (size_t)(close - h);
        colon = close + 1;
    } else {
        colon = strrchr(s, ':');
        if (!colon) {
            snprintf(err, errlen, "expected HOST:PORT, got '%s' (no port)", s);
            return -EINVAL;
        }
        if (memchr(s, ':', (size_t)(colon - s))) {
            snprintf(err, errlen, "write an IPv6 address as [ADDR]:PORT, got '%s'", s);
            return -EINVAL;
        }
        hlen = (size_t)(colon - s);
    }
    if (hlen == 0 || hlen >= HOSTPORT_HOST_MAX) {
        snprintf(err, errlen, "expected HOST:PORT with a host of 1..%d bytes, got '%s'", HOSTPORT_HOST_MAX - 1, s);
        return -EINVAL;
    }
    const char *p = colon + 1;
    unsigned long lo = (flags & HOSTPORT_PORT_ZERO) ? 0 : 1, v = 0;
    size_t digits = strspn(p, "0123456789");
    for (size_t i = 0; i < digits && v <= 65535; i++) /* past 65535 it is too big, however long */
        v = v * 10 + (unsigned long)(p[i] - '0');
    if (digits == 0 || p[digits] != '\0' || v < lo || v > 65535) {
        snprintf(err, errlen, "port must be %lu..65535, got '%s'", lo, p);
        return -EINVAL;
    }
    memcpy(host, h, hlen);
    host[hlen] = '\0';
    *port = (uint16_t)v;
    return 0;
}

int hostport_parse(const char *s, char host[HOSTPORT_HOST_MAX], uint16_t *port, char *err, size_t errlen)
{
    return hostport_parse_flags(s, 0, host, port, err, errlen);
}
