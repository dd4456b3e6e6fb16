/*
 * server: musterd's control port. Accepts agent connections on the libuv
 * loop, runs each through the join handshake (HELLO, CHALLENGE, RESPONSE),
 * then hands its frames to rdv and sends what rdv asks for. Limits: a
 * joined-connection count that follows the job's size (server_conn_limit),
 * a per-connection write queue, and deadlines for the handshake. A node
 * rdv does not know that verifies over the limit gets REJECT "full" naming
 * it; a node rdv knows is never refused for room.
 *
 * Until its RESPONSE verifies a connection costs a few hundred bytes (a
 * shared read buffer, a small one for a partial frame) and sits in a pool
 * of its own: pool and per-address limits, both met by closing the oldest
 * stranger, so that a flood of unauthenticated connections neither grows
 * musterd nor takes a member's place. A HELLO naming a node rdv knows
 * leaves the pool (one such claim per name; a newer one takes the name only
 * when it names the node's session, which its agent alone knows). The
 * listen backlog is the system's maximum (net.core.somaxconn), so that
 * thousands of agents starting together are not dropped at SYN time.
 * Under load the loop takes many agents' frames per wakeup
 * (SERVER_COALESCE_MIN, daemon/coalesce.h).
 */
#ifndef MUSTER_SERVER_H
#define MUSTER_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/rdv.h"
#include "proto/proto.h"

/* Connections beyond the job's nodes: rejoining members whose old
 * connection is not yet known dead, refused non-members, handshakes. */
#define SERVER_CONN_MARGIN 64
#define SERVER_HANDSHAKE_MS 5000
#define SERVER_HELLO_MS 2000 /* from accept to HELLO: an agent sends it at once */
/* Before authentication: the largest frame (a HELLO of PROTO_MAX_LOCAL_RANKS
 * GPUs fits, tests/check_proto.c), and the unauthenticated connections one
 * peer address may hold (the pool as a whole holds server_conn_limit). */
#define SERVER_PREAUTH_FRAME_MAX (16u * 1024u)
#define SERVER_PREAUTH_PER_ADDR 64
#define SERVER_MAX_WRITE_QUEUE (4u * 1024u * 1024u)
#define SERVER_CLOSE_MS 2000 /* a closing connection's queued frames get this long to go out */
/* auth_failed events: one per address and node name per interval, and at
 * most this many per interval in all; the rest are counted in the next. */
#define SERVER_AUTH_NOTE_MS 10000
#define SERVER_AUTH_NOTES_MAX 8
#define SERVER_AUTH_NOTE_SLOTS 64
/* Under load, a loop iteration that read frames from this many connections
 * waits this long before the next poll (daemon/coalesce.h): at 4096 agents
 * x 8 ranks a fifth less CPU; a frame waits at most 1 ms more. */
#define SERVER_COALESCE_MIN 2
#define SERVER_COALESCE_US 1000

struct server_config {
    const char *addr;     /* IPv4 address to bind */
    uint16_t port;        /* 0 = any free port (see server_port) */
    const uint8_t *token; /* cluster token (may be empty) */
    size_t token_len;
    unsigned max_conns;   /* joined connections (server_conn_limit) */
    unsigned preauth_max; /* unauthenticated connections; 0 = max_conns */
    unsigned preauth_per_addr; /* of them from one address; 0 = SERVER_PREAUTH_PER_ADDR */
    /* Rank logs (daemon/logfetch.h) are none of rdv's business: LOG_DATA
     * from a joined node goes to log_data, and node_gone hears of every
     * joined node's connection that closes (NULL: neither). */
    void (*log_data)(void *ctx, const char *node, const struct proto_log_data *d);
    void (*node_gone)(void *ctx, const char *node);
    /* Asked for every authenticated HELLO before rdv is: nonzero refuses
     * it with REJECT code and reason (a standby musterd: daemon/store_etcd.h).
     * NULL: every HELLO goes to rdv. */
    int (*admit)(void *ctx, char code[32], char reason[PROTO_REASON_MAX]);
    void *hook_ctx;
};

struct server;

int server_start(struct server **out, uv_loop_t *loop, const struct server_config *cfg, struct rdv *rdv,
                 char *err, size_t errlen);
uint16_t server_port(const struct server *srv);
/* Connections a job of `nodes` nodes needs: nodes + nodes/4 + SERVER_CONN_MARGIN. */
unsigned server_conn_limit(int nodes);
/* Closes pending handshakes that ran past SERVER_HELLO_MS / SERVER_HANDSHAKE_MS. */
void server_tick(struct server *srv);
/* Closes the listener and every connection; memory goes in close callbacks. */
void server_close(struct server *srv);
/* Frees what is left once the loop has run the close callbacks. */
void server_free(struct server *srv);

/*
 * The state-file rule (rdv_ops.changed): frames rdv sends after
 * server_hold(seq) wait, in order per connection, until
 * server_release(seq') with seq' >= seq says that state write seq is
 * durable. Frames the server sends itself (CHALLENGE, REJECT) never wait.
 */
void server_hold(struct server *srv, uint64_t seq);
void server_release(struct server *srv, uint64_t seq);

/* rdv_ops for a server (ctx = the server). */
void server_send(void *ctx, const char *node, const struct proto_msg *msg);
/* Bytes waiting to go to the node (its write queue and held frames); 0 when it is not joined. */
size_t server_queued(struct server *s, const char *node);
void server_disconnect(void *ctx, const char *node, const char *why);

#endif
