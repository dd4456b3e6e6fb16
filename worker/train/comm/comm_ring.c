/*
 * COMM_RING: the collectives over a TCP ring, for CPUs.
 *
 * Forming the ring. comm_unique_id() binds rank 0's listener and writes
 * (address, port, nonce) into the id. Every other rank opens its own
 * listener, connects to rank 0 and sends a JOIN hello (rank, world, nonce,
 * its listener's address); rank 0 answers each with a status and, once all
 * have joined, the table of listeners. Then every rank connects to its
 * successor's listener (LINK hello) and accepts its predecessor on its own.
 * A hello with the wrong nonce, world or rank is refused and closed, so a
 * stale or stray connection cannot join.
 *
 * Moving data. Each rank writes only to its successor (send_fd) and reads
 * only from its predecessor (recv_fd). A ring step sends one block while it
 * receives another, on non-blocking sockets under poll() with POLL_MS ticks,
 * so an abort is seen within a tick and a closed peer at once; received
 * elements are reduced as they arrive. On any error both sockets are shut
 * down, so the failure travels around the ring instead of leaving a rank
 * waiting.
 *
 * Algorithms (N ranks, r this rank, blocks indexed mod N):
 *   reduce-scatter  N-1 steps; step s sends block r-s-1 (own input at s = 0,
 *                   the partial received at s-1 later) and receives block
 *                   r-s-2, adding its own input; block r is complete last.
 *   all-gather      N-1 steps; step s forwards block r-s, receives r-s-1.
 *   all-reduce      reduce-scatter then all-gather, in place, blocks of
 *                   count/N elements (the first count%N one longer).
 *   broadcast       a pipelined chain root -> root+1 -> ... -> root-1.
 *   barrier         an all-gather of one byte per rank.
 *   shift           one step: bytes to the successor, others from the predecessor;
 *                   backwards, the same over the same two sockets the other way.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <math.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "worker/train/comm/comm_impl.h"

#define POLL_MS 100             /* abort and timeout are checked this often */
#define NONCE_BYTES 32
#define ID_MAGIC "MRNG"
#define ID_VERSION 1
#define HELLO_MAGIC "MCR1"
#define HELLO_BYTES 64
#define ENTRY_BYTES 20          /* one listener in rank 0's table */
#define HELLO_READ_MS 2000      /* a connection gets this long to say hello */
#define IO_CHUNK (4u << 20)     /* largest single send()/recv() */

enum hello_kind { HELLO_JOIN = 1, HELLO_LINK = 2 };

/* An endpoint as it travels in ids, hellos and the table. */
struct endpoint {
    uint8_t family; /* 4 or 6 */
    uint16_t port;
    uint8_t addr[16];
};

struct ring {
    int send_fd;    /* to the successor */
    int recv_fd;    /* from the predecessor */
    uint8_t *ws;    /* workspace for partial sums */
    size_t ws_size;
};

/* ---- time and small helpers ---------------------------------------- */

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static int mod(int a, int n)
{
    return ((a % n) + n) % n;
}

static void put16(uint8_t *p, uint16_t v) { p[0] = v >> 8; p[1] = v & 0xff; }
static uint16_t get16(const uint8_t *p) { return (uint16_t)(p[0] << 8 | p[1]); }

static void put32(uint8_t *p, uint32_t v)
{
    put16(p, v >> 16);
    put16(p + 2, v & 0xffff);
}

static uint32_t get32(const uint8_t *p)
{
    return (uint32_t)get16(p) << 16 | get16(p + 2);
}

static int nonce_eq(const uint8_t *a, const uint8_t *b)
{
    uint8_t diff = 0;
    for (int i = 0; i < NONCE_BYTES; i++)
        diff |= a[i] ^ b[i];
    return diff == 0;
}

/* ---- addresses ------------------------------------------------------- */

static socklen_t ep_to_sockaddr(const struct endpoint *ep, struct sockaddr_storage *ss)
{
    memset(ss, 0, sizeof(*ss));
    if (ep->family == 6) {
        struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
        s6->sin6_family = AF_INET6;
        s6->sin6_port = htons(ep->port);
        memcpy(&s6->sin6_addr, ep->addr, 16);
        return sizeof(*s6);
    }
    struct sockaddr_in *s4 = (struct sockaddr_in *)ss;
    s4->sin_family = AF_INET;
    s4->sin_port = htons(ep->port);
    memcpy(&s4->sin_addr, ep->addr, 4);
    return sizeof(*s4);
}

static int ep_from_sockaddr(struct endpoint *ep, const struct sockaddr *sa)
{
    memset(ep, 0, sizeof(*ep));
    if (sa->sa_family == AF_INET6) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        ep->family = 6;
        ep->port = ntohs(s6->sin6_port);
        memcpy(ep->addr, &s6->sin6_addr, 16);
        return 0;
    }
    if (sa->sa_family == AF_INET) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        ep->family = 4;
        ep->port = ntohs(s4->sin_port);
        memcpy(ep->addr, &s4->sin_addr, 4);
        return 0;
    }
    return -EAFNOSUPPORT;
}

static void ep_put(uint8_t *p, const struct endpoint *ep)
{
    p[0] = ep->family;
    p[1] = 0;
    put16(p + 2, ep->port);
    memcpy(p + 4, ep->addr, 16);
}

static int ep_get(struct endpoint *ep, const uint8_t *p)
{
    ep->family = p[0];
    ep->port = get16(p + 2);
    memcpy(ep->addr, p + 4, 16);
    return (ep->family == 4 || ep->family == 6) ? 0 : COMM_E_PROTO;
}

/* Rank 0's address: $MUSTER_COMM_ADDR, else the first non-loopback IPv4
 * interface that is up, else 127.0.0.1 (port 0). */
static int local_endpoint(struct endpoint *ep)
{
    const char *env = getenv("MUSTER_COMM_ADDR");
    if (env && *env) {
        struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
        struct addrinfo *res = NULL;
        if (getaddrinfo(env, NULL, &hints, &res) != 0 || !res)
            return -EADDRNOTAVAIL;
        int rc = ep_from_sockaddr(ep, res->ai_addr);
        freeaddrinfo(res);
        ep->port = 0;
        return rc;
    }
    struct ifaddrs *ifs = NULL;
    int found = -1;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET)
                continue;
            if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK))
                continue;
            found = ep_from_sockaddr(ep, i->ifa_addr);
            break;
        }
        freeifaddrs(ifs);
    }
    if (found != 0) {
        memset(ep, 0, sizeof(*ep));
        ep->family = 4;
        uint32_t lo = htonl(INADDR_LOOPBACK);
        memcpy(ep->addr, &lo, 4);
    }
    ep->port = 0;
    return 0;
}

/* ---- sockets --------------------------------------------------------- */

/* A non-blocking listener on ep (port 0: ephemeral); ep gets the port. */
static int listen_on(struct endpoint *ep)
{
    struct sockaddr_storage ss;
    socklen_t len = ep_to_sockaddr(ep, &ss);
    int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -errno;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
    if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 64) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    len = sizeof(ss);
    if (getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
        int rc = -errno;
        close(fd);
        return rc;
    }
    ep_from_sockaddr(ep, (struct sockaddr *)&ss);
    return fd;
}

/* The flag that gives up the formation under way on this thread (comm_init_cancelable). */
static _Thread_local const atomic_int *init_cancel;

static int cancelled(void) { return init_cancel && atomic_load(init_cancel); }

/* Waits for events on fd until the deadline: >0 ready, -ETIMEDOUT, -ECANCELED, -errno. */
static int wait_fd(int fd, short events, uint64_t deadline)
{
    for (;;) {
        uint64_t now = now_ms();
        if (cancelled())
            return -ECANCELED;
        if (now >= deadline)
            return -ETIMEDOUT;
        uint64_t left = deadline - now;
        struct pollfd p = {.fd = fd, .events = events};
        int n = poll(&p, 1, left > POLL_MS ? POLL_MS : (int)left);
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n > 0)
            return n;
    }
}

/* Connects to ep before the deadline, retrying while nobody listens yet. */
static int connect_to(const struct endpoint *ep, uint64_t deadline)
{
    struct sockaddr_storage ss;
    socklen_t len = ep_to_sockaddr(ep, &ss);
    for (;;) {
        int fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
        if (fd < 0)
            return -errno;
        int rc = 0;
        if (connect(fd, (struct sockaddr *)&ss, len) < 0) {
            rc = errno == EINPROGRESS ? wait_fd(fd, POLLOUT, deadline) : -errno;
            if (rc > 0) {
                int err = 0;
                socklen_t elen = sizeof(err);
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &elen);
                rc = -err;
            }
        }
        if (rc == 0) {
            int one = 1;
            setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
            return fd;
        }
        close(fd);
        if (rc != -ECONNREFUSED || now_ms() + 50 >= deadline || cancelled())
            return cancelled() ? -ECANCELED : rc;
        usleep(50 * 1000);
    }
}

/* Reads or writes exactly len bytes before the deadline (set-up traffic). */
static int io_all(int fd, void *buf, size_t len, int writing, uint64_t deadline)
{
    uint8_t *p = buf;
    while (len > 0) {
        ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0)
            return -ECONNRESET;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return errno == EPIPE ? -ECONNRESET : -errno;
        int rc = wait_fd(fd, writing ? POLLOUT : POLLIN, deadline);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* ---- the id and rank 0's pending listeners ---------------------------- */

struct pending {
    struct pending *next;
    uint8_t nonce[NONCE_BYTES];
    int fd;
};

static pthread_mutex_t pending_lock = PTHREAD_MUTEX_INITIALIZER;
static struct pending *pending_head;

struct ring_id {
    struct endpoint root;
    uint8_t nonce[NONCE_BYTES];
};

static void id_put(uint8_t id[COMM_ID_BYTES], const struct ring_id *rid)
{
    memcpy(id, ID_MAGIC, 4);
    id[4] = ID_VERSION;
    ep_put(id + 8, &rid->root);
    memcpy(id + 8 + ENTRY_BYTES, rid->nonce, NONCE_BYTES);
}

static int id_get(struct ring_id *rid, const uint8_t id[COMM_ID_BYTES])
{
    if (memcmp(id, ID_MAGIC, 4) != 0 || id[4] != ID_VERSION)
        return -EINVAL;
    if (ep_get(&rid->root, id + 8) < 0)
        return -EINVAL;
    memcpy(rid->nonce, id + 8 + ENTRY_BYTES, NONCE_BYTES);
    return 0;
}

int comm_ring_unique_id(uint8_t id[COMM_ID_BYTES])
{
    struct ring_id rid;
    int rc = local_endpoint(&rid.root);
    if (rc < 0)
        return rc;
    if (getrandom(rid.nonce, NONCE_BYTES, 0) != NONCE_BYTES)
        return -EIO;
    struct pending *p = calloc(1, sizeof(*p));
    if (!p)
        return -ENOMEM;
    p->fd = listen_on(&rid.root);
    if (p->fd < 0) {
        rc = p->fd;
        free(p);
        return rc;
    }
    memcpy(p->nonce, rid.nonce, NONCE_BYTES);
    pthread_mutex_lock(&pending_lock);
    p->next = pending_head;
    pending_head = p;
    pthread_mutex_unlock(&pending_lock);
    id_put(id, &rid);
    return 0;
}

/* Rank 0 takes the listener comm_unique_id() left for this id, or binds the
 * id's address again when the id was made in another process. */
static int take_listener(struct ring_id *rid)
{
    int fd = -1;
    pthread_mutex_lock(&pending_lock);
    for (struct pending **pp = &pending_head; *pp; pp = &(*pp)->next) {
        if (nonce_eq((*pp)->nonce, rid->nonce)) {
            struct pending *p = *pp;
            *pp = p->next;
            fd = p->fd;
            free(p);
            break;
        }
    }
    pthread_mutex_unlock(&pending_lock);
    return fd >= 0 ? fd : listen_on(&rid->root);
}

/* ---- hellos ---------------------------------------------------------- */

struct hello {
    enum hello_kind kind;
    int rank, world;
    struct endpoint listen; /* JOIN: where this rank accepts its predecessor */
    uint8_t nonce[NONCE_BYTES];
};

static void hello_put(uint8_t buf[HELLO_BYTES], const struct hello *h)
{
    memset(buf, 0, HELLO_BYTES);
    memcpy(buf, HELLO_MAGIC, 4);
    buf[4] = (uint8_t)h->kind;
    put32(buf + 8, (uint32_t)h->rank);
    put32(buf + 12, (uint32_t)h->world);
    ep_put(buf + 16, &h->listen);
    memcpy(buf + 32, h->nonce, NONCE_BYTES);
}

static int hello_get(struct hello *h, const uint8_t buf[HELLO_BYTES])
{
    if (memcmp(buf, HELLO_MAGIC, 4) != 0)
        return COMM_E_PROTO;
    h->kind = buf[4];
    h->rank = (int)get32(buf + 8);
    h->world = (int)get32(buf + 12);
    memcpy(h->nonce, buf + 32, NONCE_BYTES);
    if (h->kind == HELLO_JOIN)
        return ep_get(&h->listen, buf + 16);
    return h->kind == HELLO_LINK ? 0 : COMM_E_PROTO;
}

/* Accepts one connection on lfd and reads its hello: the fd, or -errno
 * (-EAGAIN: that connection was bad, try the next one). */
static int accept_hello(int lfd, struct hello *h, uint64_t deadline)
{
    int rc = wait_fd(lfd, POLLIN, deadline);
    if (rc < 0)
        return rc;
    int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (fd < 0)
        return (errno == EAGAIN || errno == EINTR || errno == ECONNABORTED) ? -EAGAIN : -errno;
    uint8_t buf[HELLO_BYTES];
    uint64_t hello_deadline = now_ms() + HELLO_READ_MS;
    if (hello_deadline > deadline)
        hello_deadline = deadline;
    if (io_all(fd, buf, HELLO_BYTES, 0, hello_deadline) < 0 || hello_get(h, buf) < 0) {
        close(fd);
        return now_ms() >= deadline ? -ETIMEDOUT : -EAGAIN;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    return fd;
}

static void send_status(int fd, int err, uint64_t deadline)
{
    uint8_t st[4];
    put32(st, (uint32_t)err);
    io_all(fd, st, 4, 1, deadline);
}

/* ---- rendezvous ------------------------------------------------------ */

/* Rank 0: collects a JOIN from every other rank and sends them the table. */
static int gather_joins(int lfd, const struct ring_id *rid, int world,
                        struct endpoint *table, uint64_t deadline)
{
    int *fds = malloc(sizeof(int) * (size_t)world);
    if (!fds)
        return -ENOMEM;
    for (int i = 0; i < world; i++)
        fds[i] = -1;
    int joined = 1, rc = 0;
    while (joined < world) {
        struct hello h;
        int fd = accept_hello(lfd, &h, deadline);
        if (fd == -EAGAIN)
            continue;
        if (fd < 0) {
            rc = fd;
            break;
        }
        int err = 0;
        if (h.kind != HELLO_JOIN)
            err = EPROTO;
        else if (!nonce_eq(h.nonce, rid->nonce))
            err = EACCES;
        else if (h.world != world || h.rank < 1 || h.rank >= world)
            err = EINVAL;
        else if (fds[h.rank] >= 0)
            err = EEXIST;
        if (err) {
            send_status(fd, err, deadline);
            close(fd);
            continue;
        }
        fds[h.rank] = fd;
        table[h.rank] = h.listen;
        joined++;
    }
    size_t tlen = 4 + (size_t)world * ENTRY_BYTES;
    uint8_t *msg = rc == 0 ? malloc(tlen) : NULL;
    if (rc == 0 && !msg)
        rc = -ENOMEM;
    if (msg) {
        put32(msg, 0);
        for (int i = 0; i < world; i++)
            ep_put(msg + 4 + (size_t)i * ENTRY_BYTES, &table[i]);
    }
    for (int i = 1; i < world; i++) {
        if (fds[i] < 0)
            continue;
        if (rc == 0)
            rc = io_all(fds[i], msg, tlen, 1, deadline);
        close(fds[i]);
    }
    free(msg);
    free(fds);
    return rc;
}

/* Rank > 0: opens its own listener on the address it reaches rank 0 from,
 * joins, and reads the table. Returns the listener or -errno. */
static int join_root(const struct ring_id *rid, int rank, int world,
                     struct endpoint *table, uint64_t deadline)
{
    int fd = connect_to(&rid->root, deadline);
    if (fd < 0)
        return fd;
    struct sockaddr_storage ss;
    socklen_t len = sizeof(ss);
    struct hello h = {.kind = HELLO_JOIN, .rank = rank, .world = world};
    int rc = getsockname(fd, (struct sockaddr *)&ss, &len) < 0 ? -errno
             : ep_from_sockaddr(&h.listen, (struct sockaddr *)&ss);
    int lfd = -1;
    if (rc == 0) {
        h.listen.port = 0;
        lfd = rc = listen_on(&h.listen);
    }
    uint8_t buf[HELLO_BYTES];
    if (rc >= 0) {
        memcpy(h.nonce, rid->nonce, NONCE_BYTES);
        hello_put(buf, &h);
        rc = io_all(fd, buf, HELLO_BYTES, 1, deadline);
    }
    if (rc >= 0)
        rc = io_all(fd, buf, 4, 0, deadline);
    if (rc >= 0 && get32(buf) != 0)
        rc = -(int)get32(buf);
    for (int i = 0; rc >= 0 && i < world; i++) {
        rc = io_all(fd, buf, ENTRY_BYTES, 0, deadline);
        if (rc >= 0)
            rc = ep_get(&table[i], buf);
    }
    close(fd);
    if (rc < 0) {
        if (lfd >= 0)
            close(lfd);
        return rc;
    }
    return lfd;
}

/* Every rank: connect to the successor, accept the predecessor. */
static int link_ring(struct ring *r, int lfd, const struct ring_id *rid, int rank,
                     int world, const struct endpoint *table, uint64_t deadline)
{
    int fd = connect_to(&table[(rank + 1) % world], deadline);
    if (fd < 0)
        return fd;
    struct hello h = {.kind = HELLO_LINK, .rank = rank, .world = world};
    memcpy(h.nonce, rid->nonce, NONCE_BYTES);
    uint8_t buf[HELLO_BYTES];
    hello_put(buf, &h);
    int rc = io_all(fd, buf, HELLO_BYTES, 1, deadline);
    if (rc < 0) {
        close(fd);
        return rc;
    }
    r->send_fd = fd;
    int pred = mod(rank - 1, world);
    for (;;) {
        struct hello in;
        int pfd = accept_hello(lfd, &in, deadline);
        if (pfd == -EAGAIN)
            continue;
        if (pfd < 0)
            return pfd;
        if (in.kind == HELLO_LINK && in.rank == pred && in.world == world &&
            nonce_eq(in.nonce, rid->nonce)) {
            r->recv_fd = pfd;
            return 0;
        }
        if (in.kind == HELLO_JOIN)
            send_status(pfd, nonce_eq(in.nonce, rid->nonce) ? EEXIST : EACCES, deadline);
        close(pfd);
    }
}

/* ---- moving data ----------------------------------------------------- */

/* One ring step: send sbuf to the successor while receiving rbuf from the
 * predecessor. With a reduction, every element that has arrived becomes
 * out[i] = rbuf[i] op local[i] (scaled by 1/world on the last step of AVG);
 * rbuf may be out. With forward, sbuf is rbuf and only what has arrived is
 * sent on. */
struct step {
    const uint8_t *sbuf;
    size_t slen;
    uint8_t *rbuf;
    size_t rlen;
    int forward;
    int back;             /* against the ring: send to the predecessor, receive from the successor */
    const uint8_t *local; /* NULL: no reduction */
    uint8_t *out;
    enum comm_dtype dtype;
    enum comm_op op;
    int scale;            /* divide by world */
};

static float bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static uint16_t f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)(u >> 16 | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1);         /* round to nearest, ties to even */
    return (uint16_t)(u >> 16);
}

static float apply(enum comm_op op, float a, float b)
{
    return op == COMM_MAX ? fmaxf(a, b) : a + b;
}

static void reduce_range(const struct step *st, size_t from, size_t to, float world)
{
    if (st->dtype == COMM_F32) {
        const float *in = (const float *)st->rbuf, *loc = (const float *)st->local;
        float *out = (float *)st->out;
        if (st->op == COMM_MAX) {
            for (size_t i = from; i < to; i++)
                out[i] = fmaxf(in[i], loc[i]);
        } else if (st->scale) {
            for (size_t i = from; i < to; i++)
                out[i] = (in[i] + loc[i]) / world;
        } else {
            for (size_t i = from; i < to; i++)
                out[i] = in[i] + loc[i];
        }
        return;
    }
    const uint16_t *in = (const uint16_t *)st->rbuf, *loc = (const uint16_t *)st->local;
    uint16_t *out = (uint16_t *)st->out;
    for (size_t i = from; i < to; i++) {
        float v = apply(st->op, bf16_to_f32(in[i]), bf16_to_f32(loc[i]));
        out[i] = f32_to_bf16(st->scale ? v / world : v);
    }
}

static int io_error(int err)
{
    return (err == EPIPE || err == ECONNRESET || err == ENOTCONN || err == ESHUTDOWN)
               ? -ECONNRESET : -err;
}

static int run_step(struct comm *c, const struct step *st)
{
    struct ring *r = c->be;
    size_t es = comm_dtype_size(st->dtype);
    size_t sdone = 0, rdone = 0, reduced = 0;
    float world = (float)c->world;
    const int out_fd = st->back ? r->recv_fd : r->send_fd, in_fd = st->back ? r->send_fd : r->recv_fd;
    uint64_t last = now_ms();
    while (sdone < st->slen || rdone < st->rlen) {
        if (atomic_load(&c->aborted))
            return -ECANCELED;
        size_t sendable = st->forward && rdone < st->slen ? rdone : st->slen;
        struct pollfd p[2] = {{.fd = -1}, {.fd = -1}};
        /* The peer written to is not writing to us in this step (nor, before
         * it has read all we send, in a later one): POLLIN on it is its EOF. */
        if (sdone < sendable)
            p[0] = (struct pollfd){.fd = out_fd, .events = POLLOUT | POLLIN};
        if (rdone < st->rlen)
            p[1] = (struct pollfd){.fd = in_fd, .events = POLLIN};
        int n = poll(p, 2, POLL_MS);
        if (n < 0 && errno != EINTR)
            return -errno;
        int progress = 0;
        if (n > 0 && p[0].revents) {
            if (p[0].revents & (POLLIN | POLLERR | POLLHUP))
                return -ECONNRESET;
            size_t len = sendable - sdone;
            ssize_t k = send(out_fd, st->sbuf + sdone, len > IO_CHUNK ? IO_CHUNK : len,
                             MSG_NOSIGNAL | MSG_DONTWAIT);
            if (k > 0) {
                sdone += (size_t)k;
                atomic_fetch_add(&c->bytes_sent, (uint64_t)k);
                progress = 1;
            } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return io_error(errno);
            }
        }
        if (n > 0 && p[1].revents) {
            size_t len = st->rlen - rdone;
            ssize_t k = recv(in_fd, st->rbuf + rdone, len > IO_CHUNK ? IO_CHUNK : len,
                             MSG_DONTWAIT);
            if (k == 0)
                return -ECONNRESET;
            if (k > 0) {
                rdone += (size_t)k;
                atomic_fetch_add(&c->bytes_recv, (uint64_t)k);
                progress = 1;
                if (st->local) {
                    size_t upto = rdone / es;
                    reduce_range(st, reduced, upto, world);
                    reduced = upto;
                }
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return io_error(errno);
            }
        }
        uint64_t now = now_ms();
        if (progress)
            last = now;
        else if (now - last >= (uint64_t)atomic_load(&c->timeout_ms))
            return -ETIMEDOUT;
    }
    return 0;
}

/* Workspace of at least bytes, kept across calls. */
static uint8_t *workspace(struct ring *r, size_t bytes)
{
    if (r->ws_size < bytes) {
        uint8_t *ws = malloc(bytes);
        if (!ws)
            return NULL;
        free(r->ws);
        r->ws = ws;
        r->ws_size = bytes;
    }
    return r->ws;
}

/* Fails the communicator on the wire: peers see EOF and fail in turn, so
 * every error of a collective, local ones included, goes through here. */
static int fail(struct comm *c, int rc)
{
    struct ring *r = c->be;
    if (rc < 0) {
        shutdown(r->send_fd, SHUT_RDWR);
        shutdown(r->recv_fd, SHUT_RDWR);
    }
    return rc;
}

/* All-gather over blocks at off[b], len[b] bytes of buf; block r is in place. */
static int gather_blocks(struct comm *c, uint8_t *buf, const size_t *off, const size_t *len)
{
    int n = c->world, me = c->rank;
    for (int s = 0; s < n - 1; s++) {
        int sb = mod(me - s, n), rb = mod(me - s - 1, n);
        struct step st = {.sbuf = buf + off[sb], .slen = len[sb],
                          .rbuf = buf + off[rb], .rlen = len[rb], .dtype = COMM_F32};
        int rc = run_step(c, &st);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Block layout of count elements of es bytes split over world ranks: the
 * first count % world blocks get one element more. */
static int split_blocks(int world, size_t count, size_t es, size_t **off, size_t **len)
{
    *off = malloc(sizeof(size_t) * (size_t)world);
    *len = malloc(sizeof(size_t) * (size_t)world);
    if (!*off || !*len) {
        free(*off);
        free(*len);
        return -ENOMEM;
    }
    size_t base = count / (size_t)world, extra = count % (size_t)world, at = 0;
    for (int b = 0; b < world; b++) {
        (*len)[b] = (base + ((size_t)b < extra)) * es;
        (*off)[b] = at;
        at += (*len)[b];
    }
    return 0;
}

static int ring_all_gather(struct comm *c, const void *send, void *recv, size_t count,
                           enum comm_dtype dtype)
{
    size_t bytes = count * comm_dtype_size(dtype);
    uint8_t *out = recv;
    if (out + (size_t)c->rank * bytes != (const uint8_t *)send)
        memmove(out + (size_t)c->rank * bytes, send, bytes);
    size_t *off, *len;
    int rc = split_blocks(c->world, count * (size_t)c->world, comm_dtype_size(dtype), &off, &len);
    if (rc < 0)
        return fail(c, rc);
    rc = gather_blocks(c, out, off, len);
    free(off);
    free(len);
    return fail(c, rc);
}

static int ring_reduce_scatter(struct comm *c, const void *send, void *recv, size_t count,
                               enum comm_dtype dtype, enum comm_op op)
{
    int n = c->world, me = c->rank;
    size_t bytes = count * comm_dtype_size(dtype);
    const uint8_t *in = send;
    uint8_t *dst = recv;
    int in_place = dst == in + (size_t)me * bytes;
    /* Two partials (ping-pong: one is sent while the next is received),
     * and a landing buffer when the result overwrites its own input. */
    uint8_t *ws = workspace(c->be, bytes * (in_place ? 3 : 2));
    if (!ws)
        return fail(c, -ENOMEM);
    uint8_t *partial[2] = {ws, ws + bytes};
    for (int s = 0; s < n - 1; s++) {
        int sb = mod(me - s - 1, n), rb = mod(me - s - 2, n), last = s == n - 2;
        struct step st = {.sbuf = s == 0 ? in + (size_t)sb * bytes : partial[(s - 1) % 2],
                          .slen = bytes,
                          .rlen = bytes,
                          .local = in + (size_t)rb * bytes,
                          .out = last ? dst : partial[s % 2],
                          .dtype = dtype,
                          .op = op,
                          .scale = last && op == COMM_AVG};
        st.rbuf = st.out == st.local ? ws + 2 * bytes : st.out;
        int rc = run_step(c, &st);
        if (rc < 0)
            return fail(c, rc);
    }
    return 0;
}

static int ring_all_reduce(struct comm *c, void *buf, size_t count, enum comm_dtype dtype,
                           enum comm_op op)
{
    int n = c->world, me = c->rank;
    size_t *off, *len;
    int rc = split_blocks(n, count, comm_dtype_size(dtype), &off, &len);
    if (rc < 0)
        return fail(c, rc);
    uint8_t *b = buf;
    uint8_t *land = workspace(c->be, len[0]); /* block 0 is the longest */
    if (!land)
        rc = -ENOMEM;
    /* Reduce-scatter in place: the partial of a block replaces this rank's
     * input for it, which is needed only once. */
    for (int s = 0; rc == 0 && s < n - 1; s++) {
        int sb = mod(me - s - 1, n), rb = mod(me - s - 2, n);
        struct step st = {.sbuf = b + off[sb], .slen = len[sb],
                          .rbuf = land, .rlen = len[rb],
                          .local = b + off[rb], .out = b + off[rb],
                          .dtype = dtype, .op = op,
                          .scale = s == n - 2 && op == COMM_AVG};
        rc = run_step(c, &st);
    }
    if (rc == 0)
        rc = gather_blocks(c, b, off, len);
    free(off);
    free(len);
    return fail(c, rc);
}

static int ring_broadcast(struct comm *c, void *buf, size_t bytes, int root)
{
    int pos = mod(c->rank - root, c->world);
    struct step st = {.sbuf = buf, .slen = pos == c->world - 1 ? 0 : bytes,
                      .rbuf = buf, .rlen = pos == 0 ? 0 : bytes,
                      .forward = pos != 0, .dtype = COMM_F32};
    return fail(c, run_step(c, &st));
}

static int ring_barrier(struct comm *c)
{
    uint8_t *tok = workspace(c->be, (size_t)c->world);
    size_t *off, *len;
    int rc = tok ? split_blocks(c->world, (size_t)c->world, 1, &off, &len) : -ENOMEM;
    if (rc < 0)
        return fail(c, rc);
    tok[c->rank] = 1;
    rc = gather_blocks(c, tok, off, len);
    free(off);
    free(len);
    return fail(c, rc);
}

static int ring_shift(struct comm *c, const void *send, size_t sbytes, void *recv, size_t rbytes, int back)
{
    struct step st = {.sbuf = send, .slen = sbytes, .rbuf = recv, .rlen = rbytes, .back = back, .dtype = COMM_F32};
    return fail(c, run_step(c, &st));
}

static void ring_abort(struct comm *c)
{
    fail(c, -ECANCELED);
}

static void ring_destroy(struct comm *c)
{
    struct ring *r = c->be;
    if (!r)
        return;
    if (r->send_fd >= 0)
        close(r->send_fd);
    if (r->recv_fd >= 0)
        close(r->recv_fd);
    free(r->ws);
    free(r);
}

static const struct comm_ops ring_ops = {
    .all_gather = ring_all_gather,
    .reduce_scatter = ring_reduce_scatter,
    .all_reduce = ring_all_reduce,
    .broadcast = ring_broadcast,
    .barrier = ring_barrier,
    .shift = ring_shift,
    .abort = ring_abort,
    .destroy = ring_destroy,
};

int comm_ring_init(struct comm *c, const uint8_t id[COMM_ID_BYTES], int timeout_ms)
{
    struct ring_id rid;
    int rc = id_get(&rid, id);
    if (rc < 0)
        return rc;
    uint64_t deadline = now_ms() + (uint64_t)timeout_ms;
    struct ring *r = calloc(1, sizeof(*r));
    struct endpoint *table = calloc((size_t)c->world, sizeof(*table));
    if (!r || !table) {
        free(r);
        free(table);
        return -ENOMEM;
    }
    r->send_fd = r->recv_fd = -1;
    c->be = r;
    c->ops = &ring_ops;
    init_cancel = c->init_cancel;
    int lfd;
    if (c->rank == 0) {
        lfd = take_listener(&rid);
        if (lfd >= 0 && c->world > 1) {
            struct sockaddr_storage ss;
            socklen_t len = sizeof(ss);
            getsockname(lfd, (struct sockaddr *)&ss, &len);
            ep_from_sockaddr(&table[0], (struct sockaddr *)&ss);
            rc = gather_joins(lfd, &rid, c->world, table, deadline);
        }
    } else {
        lfd = join_root(&rid, c->rank, c->world, table, deadline);
    }
    if (lfd < 0)
        rc = lfd;
    if (rc == 0 && c->world > 1)
        rc = link_ring(r, lfd, &rid, c->rank, c->world, table, deadline);
    if (lfd >= 0)
        close(lfd);
    free(table);
    init_cancel = NULL;
    if (rc < 0) {
        ring_destroy(c);
        c->be = NULL;
    }
    return rc;
}
