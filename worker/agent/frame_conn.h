/*
 * frame_conn: proto frames over one libuv stream (the TCP connection to the
 * daemon, or a rank's control socketpair). Reads are reassembled into whole
 * frames (at most PROTO_MAX_SEALED) and handed to on_msg; writes are encoded
 * and queued, with a bound on the bytes waiting in the queue. Given a
 * channel (fconn_seal_tx, fconn_seal_rx: the daemon's link after the
 * handshake), frames are sealed as they are queued and opened as they are
 * read; a frame that fails its MAC fails the stream (PROTO_E_MAC).
 *
 * Lifecycle: fconn_new_tcp()/fconn_new_pipe() init the handle; the owner
 * calls fconn_close() (idempotent) when done or when on_fail fires, and the
 * memory is freed in the close callback, after on_closed. No callback runs
 * after fconn_close() except on_closed.
 */
#ifndef MUSTER_WORKER_FRAME_CONN_H
#define MUSTER_WORKER_FRAME_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "proto/proto.h"

/* Bytes a connection may have waiting to be written before it is failed. */
#define FCONN_WRITE_QUEUE_MAX (4u * 1024u * 1024u)

struct fconn;

/* A decoded frame; msg is cleared by the caller after the callback. */
typedef void (*fconn_msg_cb)(struct fconn *c, struct proto_msg *msg);
/*
 * A complete frame whose payload did not decode (err: enum proto_err); it is
 * skipped and reading goes on. Without this callback it fails the stream.
 */
typedef void (*fconn_bad_cb)(struct fconn *c, int err);
/*
 * The stream failed or ended: err is UV_EOF for a clean end between frames,
 * else a libuv error or a negative proto_err; why says it in words. The
 * owner should close c.
 */
typedef void (*fconn_fail_cb)(struct fconn *c, int err, const char *why);
/* The handle is closed; c is freed right after. */
typedef void (*fconn_closed_cb)(struct fconn *c);

struct fconn {
    union {
        uv_handle_t handle;
        uv_stream_t stream;
        uv_tcp_t tcp;
        uv_pipe_t pipe;
    } h;
    void *data; /* owner's */
    fconn_msg_cb on_msg;
    fconn_bad_cb on_bad;
    fconn_fail_cb on_fail;
    fconn_closed_cb on_closed;
    uint8_t *rbuf; /* unconsumed input, rlen bytes of rcap */
    size_t rlen, rcap;
    size_t wq_bytes; /* encoded bytes handed to uv_write, not yet written */
    int encode_err; /* proto_err of the last encoding failure */
    struct proto_channel *ch; /* owned; NULL: plain frames */
    bool seal_tx, open_rx;    /* frames sent / read from now on are sealed */
    bool reading;
    bool closing;
};

/* Returns NULL when out of memory or when the handle cannot be initialised. */
struct fconn *fconn_new_tcp(uv_loop_t *loop, void *data);
/* Wraps an open stream file descriptor (taken over: closed with c). */
struct fconn *fconn_new_pipe(uv_loop_t *loop, int fd, void *data);

/* Starts delivering frames to on_msg. Returns 0 or a libuv error. */
int fconn_start(struct fconn *c);

/*
 * Encodes and queues msg. Returns 0 or a libuv error: UV_EPIPE when closing,
 * UV_ENOBUFS when the write queue is over FCONN_WRITE_QUEUE_MAX, UV_EPROTO
 * when msg does not encode (the proto_err is left in c->encode_err).
 */
int fconn_send(struct fconn *c, const struct proto_msg *msg);

/* Queues the encoded frame[0..len) as it is (sealed first once seal_tx is
 * set): what fconn_send does after encoding. Same returns. */
int fconn_send_frame(struct fconn *c, const uint8_t *frame, size_t len);

/* Takes ch over (freed with c): frames read from now on must be sealed
 * under it; fconn_seal_tx then seals the frames sent after that call. */
void fconn_seal_rx(struct fconn *c, struct proto_channel *ch);
void fconn_seal_tx(struct fconn *c);

/* Stops reading (the stream stays open; nothing more reaches on_msg). */
void fconn_stop(struct fconn *c);

void fconn_close(struct fconn *c);

#endif
