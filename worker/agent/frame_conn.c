#include "worker/agent/frame_conn.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define RBUF_INITIAL (64u * 1024u)

struct fconn_write {
    uv_write_t req;
    struct fconn *c;
    size_t len;
    uint8_t bytes[];
};

/* One frame being encoded at a time: the loop is single-threaded. */
static uint8_t encode_scratch[PROTO_MAX_SEALED];

static struct fconn *fconn_alloc(void *data)
{
    struct fconn *c = calloc(1, sizeof(*c));
    if (!c)
        return NULL;
    c->rbuf = malloc(RBUF_INITIAL);
    if (!c->rbuf) {
        free(c);
        return NULL;
    }
    c->rcap = RBUF_INITIAL;
    c->data = data;
    c->h.handle.data = c;
    return c;
}

static void fconn_free(struct fconn *c)
{
    proto_channel_free(c->ch);
    free(c->rbuf);
    free(c);
}

struct fconn *fconn_new_tcp(uv_loop_t *loop, void *data)
{
    struct fconn *c = fconn_alloc(data);
    if (!c)
        return NULL;
    if (uv_tcp_init(loop, &c->h.tcp) != 0) {
        fconn_free(c);
        return NULL;
    }
    return c;
}

static void on_close_early(uv_handle_t *h) { fconn_free(h->data); }

struct fconn *fconn_new_pipe(uv_loop_t *loop, int fd, void *data)
{
    struct fconn *c = fconn_alloc(data);
    if (!c)
        return NULL;
    if (uv_pipe_init(loop, &c->h.pipe, 0) != 0) {
        fconn_free(c);
        return NULL;
    }
    if (uv_pipe_open(&c->h.pipe, fd) != 0) {
        uv_close(&c->h.handle, on_close_early);
        return NULL;
    }
    return c;
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct fconn *c = h->data;
    (void)suggested;
    if (c->rlen == c->rcap && c->rcap < PROTO_MAX_SEALED) {
        size_t ncap = c->rcap * 2 < PROTO_MAX_SEALED ? c->rcap * 2 : PROTO_MAX_SEALED;
        uint8_t *n = realloc(c->rbuf, ncap);
        if (n) {
            c->rbuf = n;
            c->rcap = ncap;
        }
    }
    /* A full buffer yields len 0: libuv reports UV_ENOBUFS to on_read. */
    *buf = uv_buf_init((char *)c->rbuf + c->rlen, (unsigned)(c->rcap - c->rlen));
}

static void fail(struct fconn *c, int err, const char *why)
{
    if (!c->closing && c->on_fail)
        c->on_fail(c, err, why);
}

/* Hands every complete frame in rbuf to on_msg; keeps the rest. */
static void drain_frames(struct fconn *c, bool eof)
{
    size_t off = 0;
    while (!c->closing) {
        struct proto_msg msg;
        size_t consumed = 0;
        int rc = c->open_rx ? proto_open(c->ch, c->rbuf + off, c->rlen - off, &msg, &consumed)
                            : proto_decode(c->rbuf + off, c->rlen - off, &msg, &consumed);
        if (rc == PROTO_NEED_MORE && eof && c->rlen > off)
            rc = PROTO_E_TRUNCATED;
        if (rc == PROTO_NEED_MORE)
            break;
        if (rc < 0 && consumed > 0 && c->on_bad) {
            off += consumed;
            c->on_bad(c, rc);
            continue;
        }
        if (rc != PROTO_OK) {
            char why[160];
            snprintf(why, sizeof(why), "protocol error: %s", proto_strerror(rc));
            fail(c, rc, why);
            return;
        }
        off += consumed;
        c->on_msg(c, &msg);
        proto_msg_clear(&msg);
    }
    if (off > 0 && !c->closing) {
        memmove(c->rbuf, c->rbuf + off, c->rlen - off);
        c->rlen -= off;
    }
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct fconn *c = s->data;
    (void)buf;
    if (c->closing)
        return;
    if (nread > 0) {
        c->rlen += (size_t)nread;
        drain_frames(c, false);
        return;
    }
    if (nread == 0)
        return;
    if (nread == UV_EOF) {
        drain_frames(c, true);
        if (c->rlen > 0)
            fail(c, PROTO_E_TRUNCATED, "connection closed inside a frame");
        else
            fail(c, UV_EOF, "connection closed by peer");
        return;
    }
    if (nread == UV_ENOBUFS) {
        fail(c, PROTO_E_OVERSIZE, "protocol error: frame larger than the maximum");
        return;
    }
    char why[160];
    snprintf(why, sizeof(why), "read failed: %s", uv_strerror((int)nread));
    fail(c, (int)nread, why);
}

int fconn_start(struct fconn *c)
{
    if (c->closing)
        return UV_EPIPE;
    int rc = uv_read_start(&c->h.stream, on_alloc, on_read);
    if (rc == 0)
        c->reading = true;
    return rc;
}

static void on_write(uv_write_t *req, int status)
{
    struct fconn_write *w = (struct fconn_write *)req;
    struct fconn *c = w->c;
    c->wq_bytes -= w->len;
    free(w);
    if (status < 0 && status != UV_ECANCELED) {
        char why[160];
        snprintf(why, sizeof(why), "write failed: %s", uv_strerror(status));
        fail(c, status, why);
    }
}

int fconn_send(struct fconn *c, const struct proto_msg *msg)
{
    if (c->closing)
        return UV_EPIPE;
    int n = proto_encode(msg, encode_scratch, sizeof(encode_scratch) - PROTO_MAC_LEN);
    if (n < 0) {
        c->encode_err = n;
        return UV_EPROTO;
    }
    return fconn_send_frame(c, encode_scratch, (size_t)n);
}

int fconn_send_frame(struct fconn *c, const uint8_t *frame, size_t len)
{
    if (c->closing)
        return UV_EPIPE;
    if (len > PROTO_MAX_FRAME)
        return UV_EINVAL;
    size_t n = len;
    if (c->wq_bytes + n + (c->seal_tx ? PROTO_MAC_LEN : 0) > FCONN_WRITE_QUEUE_MAX)
        return UV_ENOBUFS;
    struct fconn_write *w = malloc(sizeof(*w) + n + PROTO_MAC_LEN);
    if (!w)
        return UV_ENOMEM;
    w->c = c;
    memcpy(w->bytes, frame, n);
    if (c->seal_tx) {
        int k = proto_seal(c->ch, w->bytes, n, n + PROTO_MAC_LEN);
        if (k < 0) {
            free(w);
            c->encode_err = k;
            return UV_EPROTO;
        }
        n = (size_t)k;
    }
    w->len = n;
    uv_buf_t b = uv_buf_init((char *)w->bytes, (unsigned)n);
    int rc = uv_write(&w->req, &c->h.stream, &b, 1, on_write);
    if (rc != 0) {
        free(w);
        return rc;
    }
    c->wq_bytes += w->len;
    return 0;
}

void fconn_stop(struct fconn *c)
{
    if (c->reading && !c->closing)
        uv_read_stop(&c->h.stream);
    c->reading = false;
}

static void on_closed(uv_handle_t *h)
{
    struct fconn *c = h->data;
    if (c->on_closed)
        c->on_closed(c);
    fconn_free(c);
}

void fconn_close(struct fconn *c)
{
    if (!c || c->closing)
        return;
    c->closing = true;
    uv_close(&c->h.handle, on_closed);
}

void fconn_seal_rx(struct fconn *c, struct proto_channel *ch)
{
    proto_channel_free(c->ch);
    c->ch = ch;
    c->open_rx = ch != NULL;
    c->seal_tx = false;
}

void fconn_seal_tx(struct fconn *c) { c->seal_tx = c->ch != NULL; }
