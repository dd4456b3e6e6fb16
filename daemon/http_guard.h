/*
 * http_guard: REST under hostile clients. libmicrohttpd's own timeout is per
 * idle period, so a client trickling one byte every few seconds would hold
 * its connection forever, and its connection limit lets one slow client
 * class take every slot. The guard keeps its own table of the REST
 * connections (MHD_OPTION_NOTIFY_CONNECTION) and enforces:
 *
 *   - a whole-request deadline: from the moment a connection opens (or its
 *     previous answer was sent) to the moment the request's headers and body
 *     are all in, at most request_ms, however slowly they trickle. A
 *     sweeping thread closes a connection past it with a 408, unless its
 *     headers are all in the socket, unread: then libmicrohttpd's thread is
 *     the slow one (busy answering another connection).
 *   - a per-address limit and a total limit, enforced by eviction: a new
 *     connection over either limit closes the oldest connection that is
 *     still sending its request (from the same address for the per-address
 *     limit, from any address for the total), with a 408; failing that, the
 *     oldest whose answer has been going out for over slow_answer_ms (a
 *     reader too slow to drain it). Only when every connection concerned is
 *     busy with a recent answer is the new one refused, with a 503. So slow
 *     clients crowd out slow clients, never a quick request for /v1/status
 *     or an admin action.
 *
 * A connection is closed with shutdown(2) on its socket; libmicrohttpd then
 * sees the end of the stream and closes it the usual way. The table is
 * locked, and libmicrohttpd reports a connection closed before it closes
 * its socket, so the guard never touches a descriptor that was reused.
 */
#ifndef MUSTER_HTTP_GUARD_H
#define MUSTER_HTTP_GUARD_H

#include <microhttpd.h>

struct http_guard_limits {
    unsigned max_conns;    /* REST connections in all */
    unsigned max_per_addr; /* from one client address */
    unsigned request_ms;   /* a request's headers and body arrive within this */
    unsigned slow_answer_ms; /* an answer still being sent after this may be evicted */
};

struct http_guard_stats {
    unsigned open;           /* connections now */
    unsigned long timed_out; /* closed past the request deadline */
    unsigned long evicted;   /* closed to make room for a new connection */
    unsigned long refused;   /* new connections closed: no room */
};

struct http_guard;

/* Starts the sweeping thread. Returns 0 or a negative errno. */
int http_guard_start(struct http_guard **out, const struct http_guard_limits *lim);
/* After MHD_stop_daemon: every connection is closed by then. */
void http_guard_stop(struct http_guard *g);

/* MHD_OPTION_NOTIFY_CONNECTION callback; cls is the guard. */
void http_guard_notify(void *cls, struct MHD_Connection *c, void **socket_context,
                       enum MHD_ConnectionNotificationCode code);
/* The request on c is all in (headers and body): its deadline stops, before
 * the answer is made, so a slow answer to make is never taken for a slow
 * request. */
void http_guard_received(struct MHD_Connection *c);
/* The answer on c is queued: from now it is going out (slow_answer_ms). */
void http_guard_answering(struct MHD_Connection *c);
/* The request on c ended (MHD_OPTION_NOTIFY_COMPLETED): the deadline of the
 * next one on the same connection starts now. */
void http_guard_completed(struct MHD_Connection *c);

void http_guard_stats(struct http_guard *g, struct http_guard_stats *out);

#endif
