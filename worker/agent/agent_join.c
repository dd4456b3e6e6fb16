#include "worker/agent/agent_join.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void backoff_init(struct backoff *b, uint64_t base_ms, uint64_t cap_ms)
{
    b->base_ms = base_ms;
    b->cap_ms = cap_ms;
    b->attempt = 0;
}

uint64_t backoff_ceiling(const struct backoff *b)
{
    uint64_t c = b->base_ms;
    for (unsigned i = 0; i < b->attempt && c < b->cap_ms; i++)
        c *= 2;
    return c < b->cap_ms ? c : b->cap_ms;
}

uint64_t backoff_next(struct backoff *b, uint32_t r)
{
    uint64_t ceiling = backoff_ceiling(b);
    if (b->attempt < 64)
        b->attempt++;
    return (uint64_t)r % (ceiling + 1);
}

void backoff_reset(struct backoff *b) { b->attempt = 0; }

int daemon_list_parse(const char *s, struct daemon_list *l, char *err, size_t errlen)
{
    char host[HOSTPORT_HOST_MAX];
    uint16_t port;
    memset(l, 0, sizeof(*l));
    for (;;) {
        size_t n = strcspn(s, ",");
        if (l->n == AGENT_MAX_DAEMONS) {
            snprintf(err, errlen, "--daemon: at most %d daemons", AGENT_MAX_DAEMONS);
            return -EINVAL;
        }
        if (n >= DAEMON_ADDR_MAX) {
            snprintf(err, errlen, "--daemon: '%.*s...' is too long", 40, s);
            return -EINVAL;
        }
        memcpy(l->addr[l->n], s, n);
        l->addr[l->n][n] = '\0';
        char why[320];
        if (hostport_parse(l->addr[l->n], host, &port, why, sizeof(why)) != 0) {
            snprintf(err, errlen, "--daemon: %s", why);
            return -EINVAL;
        }
        l->n++;
        if (s[n] == '\0')
            return 0;
        s += n + 1;
    }
}

int daemon_list_follow(struct daemon_list *l, const char *reason)
{
    char addr[DAEMON_ADDR_MAX], host[HOSTPORT_HOST_MAX], err[160];
    uint16_t port;
    size_t n = strcspn(reason, " ");
    if (n == 0 || n >= sizeof(addr) || strncmp(reason + n, " leads", 6) != 0)
        return 0;
    memcpy(addr, reason, n);
    addr[n] = '\0';
    if (hostport_parse(addr, host, &port, err, sizeof(err)) != 0)
        return 0;
    for (unsigned i = 0; i < l->n; i++)
        if (strcmp(l->addr[i], addr) == 0) {
            l->cur = i;
            return 1;
        }
    return -1;
}

void daemon_list_next(struct daemon_list *l)
{
    if (l->n)
        l->cur = (l->cur + 1) % l->n;
}

int daemon_list_term(struct daemon_list *l, uint64_t term)
{
    if (term < l->term)
        return -ESTALE;
    l->term = term;
    return 0;
}
