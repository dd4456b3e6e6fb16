#include "daemon/http_guard.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "common/log.h"

#define SWEEP_MS 100

/* One REST connection, from libmicrohttpd's "started" to its "closed". */
struct guard_conn {
    struct guard_conn *prev, *next;
    struct http_guard *g;
    int fd;
    uint32_t addr;     /* IPv4, network order; 0 when unknown */
    uint64_t since_ms; /* receiving: when the request began to be awaited;
                        * else when its answer began */
    int receiving;     /* a request is awaited: the deadline runs */
    int closing;       /* shut down by the guard, not yet closed by libmicrohttpd */
};

struct http_guard {
    struct http_guard_limits lim;
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int stopping;
    pthread_t sweeper;
    struct guard_conn *head; /* newest first */
    struct http_guard_stats stats;
};

static uint64_t mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

/* Answers c with status and a JSON error, then ends its stream. The
 * connection is between requests or still receiving one, so nothing else
 * was written on it; libmicrohttpd then reads the end and closes it. */
static void shut(struct guard_conn *c, int status, const char *error, const char *detail)
{
    char body[256], msg[512];
    int bl = snprintf(body, sizeof(body), "{\"error\":\"%s\",\"detail\":\"%s\"}", error, detail);
    int ml = snprintf(msg, sizeof(msg),
                      "HTTP/1.1 %d %s\r\nContent-Type: application/json\r\nConnection: close\r\n"
                      "Cache-Control: no-store\r\nContent-Length: %d\r\n\r\n%s",
                      status, status == 408 ? "Request Timeout" : "Service Unavailable", bl, body);
    if (send(c->fd, msg, (size_t)ml, MSG_DONTWAIT | MSG_NOSIGNAL) < 0)
        log_debug("http: answering %d before closing: %s", status, strerror(errno));
    shutdown(c->fd, SHUT_RDWR);
    c->closing = 1;
    c->receiving = 0;
}

static void addr_text(uint32_t addr, char *buf, size_t len)
{
    struct in_addr in = {.s_addr = addr};
    if (!addr || !inet_ntop(AF_INET, &in, buf, (socklen_t)len))
        snprintf(buf, len, "?");
}

/* The oldest connection still awaiting its request, from addr (0 = any), other than not. */
static struct guard_conn *oldest_receiving(struct http_guard *g, uint32_t addr, const struct guard_conn *not)
{
    struct guard_conn *best = NULL;
    for (struct guard_conn *c = g->head; c; c = c->next)
        if (c != not && c->fd >= 0 && c->receiving && !c->closing && (!addr || c->addr == addr) &&
            (!best || c->since_ms <= best->since_ms))
            best = c;
    return best;
}

/* The connection from addr (0 = any), other than not, whose answer has been
 * going out longest, if for over slow_answer_ms: a reader too slow for it. */
static struct guard_conn *slowest_answer(struct http_guard *g, uint32_t addr, const struct guard_conn *not)
{
    struct guard_conn *best = NULL;
    uint64_t now = mono_ms();
    for (struct guard_conn *c = g->head; c; c = c->next)
        if (c != not && c->fd >= 0 && !c->receiving && !c->closing && (!addr || c->addr == addr) &&
            now - c->since_ms > g->lim.slow_answer_ms && (!best || c->since_ms <= best->since_ms))
            best = c;
    return best;
}

/* Called with the lock held, c just linked: evict or refuse over a limit. */
static void admit(struct http_guard *g, struct guard_conn *c)
{
    unsigned total = 0, same = 0;
    for (struct guard_conn *o = g->head; o; o = o->next) {
        if (o->closing)
            continue;
        total++;
        same += c->addr && o->addr == c->addr;
    }
    uint32_t scope;
    if (c->addr && same > g->lim.max_per_addr)
        scope = c->addr;
    else if (total > g->lim.max_conns)
        scope = 0;
    else
        return;

    char who[INET_ADDRSTRLEN];
    addr_text(c->addr, who, sizeof(who));
    struct guard_conn *victim = oldest_receiving(g, scope, c);
    if (victim) {
        char vwho[INET_ADDRSTRLEN];
        addr_text(victim->addr, vwho, sizeof(vwho));
        shut(victim, 408, "request timeout",
             "the connection was reclaimed for a new one: send the whole request at once");
        g->stats.evicted++;
        log_info_limited("http: %s over the limit of %u connections%s: closed the slowest request, from %s", who,
                         scope ? g->lim.max_per_addr : g->lim.max_conns, scope ? " per address" : "", vwho);
        return;
    }
    victim = slowest_answer(g, scope, c);
    if (victim) {
        /* mid-answer: nothing more may be written, the stream just ends */
        shutdown(victim->fd, SHUT_RDWR);
        victim->closing = 1;
        g->stats.evicted++;
        log_info_limited("http: %s over the limit of %u connections%s: closed the slowest reader", who,
                         scope ? g->lim.max_per_addr : g->lim.max_conns, scope ? " per address" : "");
        return;
    }
    shut(c, 503, "too many connections", "every REST connection is busy answering a request: try again");
    g->stats.refused++;
    log_warn_limited("http: refused a connection from %s: %u connections%s, all answering", who,
                     scope ? g->lim.max_per_addr : g->lim.max_conns, scope ? " from it" : "");
}

static void started(struct http_guard *g, struct MHD_Connection *mc, void **socket_context)
{
    struct guard_conn *c = calloc(1, sizeof(*c));
    if (!c)
        return; /* unguarded but served: out of memory is not the client's fault */
    c->g = g;
    c->fd = -1;
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CONNECTION_FD);
    if (ci)
        c->fd = ci->connect_fd;
    ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
        c->addr = ((const struct sockaddr_in *)ci->client_addr)->sin_addr.s_addr;
    c->since_ms = mono_ms();
    c->receiving = 1;
    *socket_context = c;
    pthread_mutex_lock(&g->lock);
    c->next = g->head;
    if (g->head)
        g->head->prev = c;
    g->head = c;
    g->stats.open++;
    if (c->fd >= 0)
        admit(g, c);
    pthread_mutex_unlock(&g->lock);
}

static void closed(struct http_guard *g, void **socket_context)
{
    struct guard_conn *c = *socket_context;
    if (!c)
        return;
    pthread_mutex_lock(&g->lock);
    if (c->prev)
        c->prev->next = c->next;
    else
        g->head = c->next;
    if (c->next)
        c->next->prev = c->prev;
    g->stats.open--;
    pthread_mutex_unlock(&g->lock);
    *socket_context = NULL;
    free(c);
}

void http_guard_notify(void *cls, struct MHD_Connection *mc, void **socket_context,
                       enum MHD_ConnectionNotificationCode code)
{
    struct http_guard *g = cls;
    if (code == MHD_CONNECTION_NOTIFY_STARTED)
        started(g, mc, socket_context);
    else
        closed(g, socket_context);
}

static struct guard_conn *conn_of(struct MHD_Connection *mc)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(mc, MHD_CONNECTION_INFO_SOCKET_CONTEXT);
    return ci ? ci->socket_context : NULL;
}

void http_guard_received(struct MHD_Connection *mc)
{
    struct guard_conn *c = conn_of(mc);
    if (!c)
        return;
    pthread_mutex_lock(&c->g->lock);
    if (c->receiving)
        c->since_ms = mono_ms();
    c->receiving = 0;
    pthread_mutex_unlock(&c->g->lock);
}

void http_guard_answering(struct MHD_Connection *mc)
{
    struct guard_conn *c = conn_of(mc);
    if (!c)
        return;
    pthread_mutex_lock(&c->g->lock);
    c->receiving = 0;
    if (!c->closing)
        c->since_ms = mono_ms();
    pthread_mutex_unlock(&c->g->lock);
}

void http_guard_completed(struct MHD_Connection *mc)
{
    struct guard_conn *c = conn_of(mc);
    if (!c)
        return;
    pthread_mutex_lock(&c->g->lock);
    if (!c->closing) {
        c->receiving = 1;
        c->since_ms = mono_ms();
    }
    pthread_mutex_unlock(&c->g->lock);
}

/* The request's headers are all in the socket, unread: the connection's
 * thread of libmicrohttpd is busy with another one (a big document to
 * render, an action the loop is slow to take), and the wait is ours, not the
 * client's. A peek reads nothing; a request whose headers do not fit in it
 * is no request a client of ours sends. */
static int whole_request_unread(int fd)
{
    char buf[8192];
    ssize_t n = recv(fd, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    return n >= 4 && memmem(buf, (size_t)n, "\r\n\r\n", 4) != NULL;
}

static void *sweep(void *arg)
{
    struct http_guard *g = arg;
    pthread_mutex_lock(&g->lock);
    while (!g->stopping) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += SWEEP_MS * 1000000L;
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&g->wake, &g->lock, &until);
        uint64_t now = mono_ms();
        for (struct guard_conn *c = g->head; c && !g->stopping; c = c->next) {
            if (!c->receiving || c->closing || c->fd < 0 || now - c->since_ms < g->lim.request_ms ||
                whole_request_unread(c->fd))
                continue;
            char who[INET_ADDRSTRLEN], detail[128];
            addr_text(c->addr, who, sizeof(who));
            snprintf(detail, sizeof(detail), "the request did not arrive whole within %u ms", g->lim.request_ms);
            shut(c, 408, "request timeout", detail);
            g->stats.timed_out++;
            log_info_limited("http: closed a connection from %s: no whole request within %u ms", who,
                             g->lim.request_ms);
        }
    }
    pthread_mutex_unlock(&g->lock);
    return NULL;
}

int http_guard_start(struct http_guard **out, const struct http_guard_limits *lim)
{
    struct http_guard *g = calloc(1, sizeof(*g));
    if (!g)
        return -ENOMEM;
    g->lim = *lim;
    pthread_mutex_init(&g->lock, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&g->wake, &ca);
    pthread_condattr_destroy(&ca);
    int rc = pthread_create(&g->sweeper, NULL, sweep, g);
    if (rc != 0) {
        pthread_cond_destroy(&g->wake);
        pthread_mutex_destroy(&g->lock);
        free(g);
        return -rc;
    }
    *out = g;
    return 0;
}

void http_guard_stop(struct http_guard *g)
{
    if (!g)
        return;
    pthread_mutex_lock(&g->lock);
    g->stopping = 1;
    pthread_cond_signal(&g->wake);
    pthread_mutex_unlock(&g->lock);
    pthread_join(g->sweeper, NULL);
    while (g->head) { /* none once libmicrohttpd stopped; freed all the same */
        struct guard_conn *c = g->head;
        g->head = c->next;
        free(c);
    }
    pthread_cond_destroy(&g->wake);
    pthread_mutex_destroy(&g->lock);
    free(g);
}

void http_guard_stats(struct http_guard *g, struct http_guard_stats *out)
{
    pthread_mutex_lock(&g->lock);
    *out = g->stats;
    pthread_mutex_unlock(&g->lock);
}
