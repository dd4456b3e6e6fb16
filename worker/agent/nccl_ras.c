/* nccl_ras: NCCL's RAS service asked and read (nccl_ras.h). */
#include "worker/agent/nccl_ras.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <unistd.h>

#include <jansson.h>

#include "worker/agent/agent_join.h"

/* ---- the exchange --------------------------------------------------------- */

static int fail(struct ras_query *q, int err, const char *fmt, const char *arg)
{
    snprintf(q->error, sizeof(q->error), fmt, arg);
    q->phase = RAS_DONE;
    return err;
}

static void command(struct ras_query *q, const char *text)
{
    q->outlen = (size_t)snprintf(q->out, sizeof(q->out), "%s\n", text);
    q->outoff = 0;
    q->inlen = 0;
    if (q->in)
        q->in[0] = '\0';
}

/* What the server said, for an error: its first line, printable, short. */
static const char *said(struct ras_query *q)
{
    static char line[48];
    size_t i = 0;
    for (; i < q->inlen && i + 1 < sizeof(line) && q->in[i] != '\n'; i++)
        line[i] = (q->in[i] >= 0x20 && q->in[i] < 0x7f) ? q->in[i] : '?';
    line[i] = '\0';
    return line;
}

static int append(struct ras_query *q, const char *buf, size_t n)
{
    if (q->inlen + n + 1 > q->incap) {
        if (q->inlen + n + 1 > RAS_ANSWER_MAX)
            return fail(q, -EMSGSIZE, "the answer is over %s bytes", "4 MiB");
        size_t cap = q->incap ? q->incap : 4096;
        while (cap < q->inlen + n + 1)
            cap *= 2;
        char *p = realloc(q->in, cap);
        if (!p)
            return fail(q, -ENOMEM, "out of memory for %s", "the answer");
        q->in = p;
        q->incap = cap;
    }
    memcpy(q->in + q->inlen, buf, n);
    q->inlen += n;
    q->in[q->inlen] = '\0';
    return 0;
}

int ras_on_bytes(struct ras_query *q, const char *buf, size_t n)
{
    if (q->phase == RAS_DONE || q->phase == RAS_CONNECTING)
        return 0;
    if (n == 0) { /* EOF: the end of the document, or a server that gave up */
        if (q->phase != RAS_STATUS)
            return fail(q, -EPROTO, "RAS closed the connection after \"%s\"", said(q));
        q->phase = RAS_DONE;
        return 0;
    }
    int rc = append(q, buf, n);
    if (rc)
        return rc;
    if (q->phase == RAS_STATUS || !memchr(q->in, '\n', q->inlen))
        return 0; /* the document runs to EOF; the other answers are one line */
    switch (q->phase) {
    case RAS_HELLO:
        if (strncasecmp(q->in, "SERVER PROTOCOL ", 16) != 0)
            return fail(q, -EPROTO, "not NCCL's RAS: it answered \"%s\"", said(q));
        q->server_protocol = atoi(q->in + 16);
        q->phase = RAS_TIMEOUT;
        {
            char cmd[32];
            snprintf(cmd, sizeof(cmd), "TIMEOUT %d", RAS_PEER_TIMEOUT_S);
            command(q, cmd);
        }
        return 0;
    case RAS_TIMEOUT:
        if (strncasecmp(q->in, "OK", 2) != 0)
            return fail(q, -EPROTO, "RAS refused TIMEOUT: \"%s\"", said(q));
        q->phase = RAS_FORMAT;
        command(q, "SET FORMAT json");
        return 0;
    case RAS_FORMAT:
        if (strncasecmp(q->in, "OK", 2) != 0)
            return fail(q, -ENOTSUP, "RAS has no JSON format (NCCL before 2.28.7): \"%s\"", said(q));
        q->phase = RAS_STATUS;
        command(q, "STATUS");
        return 0;
    default:
        return 0;
    }
}

int ras_begin(struct ras_query *q, const char *addr, uint64_t now_ms, uint32_t deadline_ms)
{
    memset(q, 0, sizeof(*q));
    q->fd = -1;
    q->deadline_ms = now_ms + deadline_ms;
    char host[HOSTPORT_HOST_MAX], err[128];
    uint16_t port;
    if (!addr || !addr[0])
        addr = RAS_DEFAULT_ADDR;
    if (hostport_parse(addr, host, &port, err, sizeof(err)) != 0)
        return fail(q, -EINVAL, "NCCL_RAS_ADDR: %s", err);
    if (strcmp(host, "localhost") == 0)
        snprintf(host, sizeof(host), "127.0.0.1");
    struct sockaddr_storage ss;
    socklen_t sl;
    memset(&ss, 0, sizeof(ss));
    struct sockaddr_in *in4 = (struct sockaddr_in *)&ss;
    struct sockaddr_in6 *in6 = (struct sockaddr_in6 *)&ss;
    if (inet_pton(AF_INET, host, &in4->sin_addr) == 1) {
        in4->sin_family = AF_INET;
        in4->sin_port = htons(port);
        sl = sizeof(*in4);
    } else if (inet_pton(AF_INET6, host, &in6->sin6_addr) == 1) {
        in6->sin6_family = AF_INET6;
        in6->sin6_port = htons(port);
        sl = sizeof(*in6);
    } else {
        return fail(q, -EINVAL, "NCCL_RAS_ADDR: %s is not a numeric address (the agent asks its own node)", host);
    }
    q->fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (q->fd < 0)
        return fail(q, -errno, "socket: %s", strerror(errno));
    q->phase = RAS_CONNECTING;
    if (connect(q->fd, (struct sockaddr *)&ss, sl) != 0 && errno != EINPROGRESS) {
        int e = errno;
        ras_end(q);
        return fail(q, -e, "nothing answers at the RAS address: %s", strerror(e));
    }
    command(q, "CLIENT PROTOCOL 2");
    return 0;
}

int ras_poll(struct ras_query *q, uint64_t now_ms)
{
    while (q->phase != RAS_DONE) {
        if (now_ms >= q->deadline_ms) {
            static const char *names[] = {"connecting", "the handshake", "TIMEOUT", "SET FORMAT", "STATUS"};
            fail(q, -ETIMEDOUT, "RAS did not answer in time (at %s)", names[q->phase]);
            break;
        }
        struct pollfd p = {.fd = q->fd, .events = q->outoff < q->outlen ? POLLOUT : POLLIN};
        if (poll(&p, 1, 0) <= 0)
            return 0;
        if (q->phase == RAS_CONNECTING) {
            int e = 0;
            socklen_t el = sizeof(e);
            if (getsockopt(q->fd, SOL_SOCKET, SO_ERROR, &e, &el) != 0 || e != 0) {
                fail(q, -(e ? e : errno), "nothing answers at the RAS address: %s", strerror(e ? e : errno));
                break;
            }
            q->phase = RAS_HELLO;
            continue;
        }
        if (q->outoff < q->outlen) {
            ssize_t w = send(q->fd, q->out + q->outoff, q->outlen - q->outoff, MSG_NOSIGNAL);
            if (w < 0) {
                if (errno == EAGAIN || errno == EINTR)
                    return 0;
                fail(q, -errno, "writing to RAS: %s", strerror(errno));
                break;
            }
            q->outoff += (size_t)w;
            continue;
        }
        char buf[16384];
        ssize_t r = recv(q->fd, buf, sizeof(buf), 0);
        if (r < 0) {
            if (errno == EAGAIN || errno == EINTR)
                return 0;
            fail(q, -errno, "reading from RAS: %s", strerror(errno));
            break;
        }
        ras_on_bytes(q, buf, (size_t)r);
    }
    if (q->fd >= 0) {
        close(q->fd);
        q->fd = -1;
    }
    return 1;
}

void ras_end(struct ras_query *q)
{
    if (q->fd >= 0)
        close(q->fd);
    free(q->in);
    memset(q, 0, sizeof(*q));
    q->fd = -1;
    q->phase = RAS_DONE;
}

/* ---- reading the document ------------------------------------------------- */

static int bad(char *why, size_t whylen, const char *what, int i)
{
    snprintf(why, whylen, "not a RAS status document: %s (communicator %d)", what, i);
    return -EINVAL;
}

static void put(struct ras_finding *out, size_t cap, size_t *n, const struct ras_finding *f)
{
    if (*n < cap)
        out[*n] = *f;
    (*n)++;
}

/* Host, PID, GPU and rank of a rank object; 0, or -1 when it is not one. */
static int rank_fields(json_t *r, struct ras_finding *f)
{
    json_t *rank = json_object_get(r, "rank"), *pid = json_object_get(r, "pid");
    json_t *dev = json_object_get(r, "cuda_dev"), *host = json_object_get(r, "host");
    if (!json_is_integer(rank) || json_integer_value(rank) < 0 || json_integer_value(rank) > INT32_MAX)
        return -1;
    f->rank = (int32_t)json_integer_value(rank);
    f->pid = json_is_integer(pid) && json_integer_value(pid) > 0 && json_integer_value(pid) <= INT32_MAX
                 ? (int32_t)json_integer_value(pid) : -1;
    f->cuda_dev = json_is_integer(dev) && json_integer_value(dev) >= -1 && json_integer_value(dev) < 4096
                      ? (int32_t)json_integer_value(dev) : -1;
    snprintf(f->host, sizeof(f->host), "%s", json_is_string(host) ? json_string_value(host) : "unknown");
    for (char *c = f->host; *c; c++)
        if (*c < 0x20 || *c > 0x7e)
            *c = '?';
    return 0;
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The count most ranks hold (the larger on a tie: the others are behind it), and how many hold it. */
static uint64_t mode_of(uint64_t *v, size_t n, uint32_t *times)
{
    qsort(v, n, sizeof(*v), cmp_u64);
    uint64_t best = 0;
    uint32_t best_n = 0;
    for (size_t i = 0; i < n;) {
        size_t j = i;
        while (j < n && v[j] == v[i])
            j++;
        if ((uint32_t)(j - i) >= best_n) {
            best = v[i];
            best_n = (uint32_t)(j - i);
        }
        i = j;
    }
    *times = best_n;
    return best;
}

static int comm_findings(json_t *c, int ci, struct ras_finding *out, size_t cap, size_t *n, char *why,
                         size_t whylen)
{
    json_t *ranks = json_object_get(c, "ranks"), *missing = json_object_get(c, "missing_ranks");
    json_t *hash = json_object_get(c, "hash"), *size = json_object_get(c, "size");
    if (!json_is_array(ranks))
        return bad(why, whylen, "no \"ranks\" list", ci);
    if (missing && !json_is_array(missing))
        return bad(why, whylen, "\"missing_ranks\" is not a list", ci);
    struct ras_finding base;
    memset(&base, 0, sizeof(base));
    snprintf(base.comm, sizeof(base.comm), "%s", json_is_string(hash) ? json_string_value(hash) : "?");
    for (char *s = base.comm; *s; s++)
        if (*s < 0x20 || *s > 0x7e)
            *s = '?';
    base.comm_size = json_is_integer(size) && json_integer_value(size) > 0 && json_integer_value(size) <= INT32_MAX
                         ? (int32_t)json_integer_value(size) : (int32_t)json_array_size(ranks);
    size_t nr = json_array_size(ranks);
    if (nr > (size_t)1 << 20)
        return bad(why, whylen, "over a million ranks", ci);

    /* Every op any rank has a count of; a rank without one for it has issued none. */
    size_t i;
    json_t *r;
    json_array_foreach(ranks, i, r) {
        struct ras_finding f = base;
        if (!json_is_object(r) || rank_fields(r, &f) != 0)
            return bad(why, whylen, "a rank without a rank number", ci);
        json_t *st = json_object_get(r, "status"), *ae = st ? json_object_get(st, "async_error") : NULL;
        if (json_is_integer(ae) && json_integer_value(ae) != 0) {
            f.kind = RAS_ASYNC_ERROR;
            f.count = (uint64_t)json_integer_value(ae);
            put(out, cap, n, &f);
        }
    }
    uint64_t *v = nr ? calloc(nr, sizeof(*v)) : NULL;
    if (nr && !v) {
        snprintf(why, whylen, "out of memory");
        return -ENOMEM;
    }
    json_t *first = nr ? json_object_get(json_array_get(ranks, 0), "collective_counts") : NULL;
    const char *op;
    json_t *ignored;
    /* The ops are the same keys in every rank's object (NCCL writes all of them). */
    json_object_foreach(first, op, ignored) {
        json_array_foreach(ranks, i, r) {
            json_t *cc = json_object_get(r, "collective_counts"), *cv = cc ? json_object_get(cc, op) : NULL;
            v[i] = json_is_integer(cv) && json_integer_value(cv) > 0 ? (uint64_t)json_integer_value(cv) : 0;
        }
        uint32_t times;
        uint64_t *sorted = malloc(nr * sizeof(*sorted));
        if (!sorted) {
            free(v);
            snprintf(why, whylen, "out of memory");
            return -ENOMEM;
        }
        memcpy(sorted, v, nr * sizeof(*v));
        uint64_t common = mode_of(sorted, nr, &times);
        free(sorted);
        if (times == nr)
            continue;
        json_array_foreach(ranks, i, r) {
            if (v[i] == common)
                continue;
            struct ras_finding f = base;
            rank_fields(r, &f);
            f.kind = v[i] < common ? RAS_BEHIND : RAS_AHEAD;
            snprintf(f.op, sizeof(f.op), "%s", op);
            for (char *s = f.op; *s; s++)
                if (*s < 0x20 || *s > 0x7e)
                    *s = '?';
            f.count = v[i];
            f.peers_count = common;
            f.npeers = times;
            put(out, cap, n, &f);
        }
    }
    free(v);
    json_array_foreach(missing, i, r) {
        struct ras_finding f = base;
        if (!json_is_object(r) || rank_fields(r, &f) != 0)
            return bad(why, whylen, "a missing rank without a rank number", ci);
        json_t *st = json_object_get(r, "status");
        f.kind = json_is_true(json_object_get(st, "considered_dead")) ? RAS_DEAD : RAS_UNRESPONSIVE;
        put(out, cap, n, &f);
    }
    return 0;
}

int ras_findings(const char *text, size_t len, struct ras_finding *out, size_t cap, size_t *n, char *why,
                 size_t whylen)
{
    *n = 0;
    why[0] = '\0';
    json_error_t jerr;
    json_t *doc = json_loadb(text, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!doc) {
        snprintf(why, whylen, "not a RAS status document: %s (line %d)", jerr.text, jerr.line);
        return -EINVAL;
    }
    json_t *comms = json_object_get(doc, "communicators");
    int rc = 0;
    if (!json_is_array(comms)) {
        snprintf(why, whylen, "not a RAS status document: no \"communicators\" list");
        rc = -EINVAL;
    }
    size_t i;
    json_t *c;
    json_array_foreach(comms, i, c) {
        if (!json_is_object(c)) {
            rc = bad(why, whylen, "not an object", (int)i);
            break;
        }
        if ((rc = comm_findings(c, (int)i, out, cap, n, why, whylen)) != 0)
            break;
    }
    json_decref(doc);
    if (rc)
        *n = 0;
    return rc;
}

int ras_finding_text(const struct ras_finding *f, char *buf, size_t cap)
{
    char who[160];
    snprintf(who, sizeof(who), "rank %d of NCCL communicator %s (%d ranks; host %s, pid %d, GPU %d)", f->rank,
             f->comm, f->comm_size, f->host, f->pid, f->cuda_dev);
    switch (f->kind) {
    case RAS_BEHIND:
        return snprintf(buf, cap, "NCCL RAS: %s has issued %" PRIu64 " %s where %u rank(s) have issued %" PRIu64
                        ": it is behind, its peers wait for it", who, f->count, f->op, f->npeers, f->peers_count);
    case RAS_AHEAD:
        return snprintf(buf, cap, "NCCL RAS: %s has issued %" PRIu64 " %s where %u rank(s) have issued %" PRIu64
                        ": it issued one they did not", who, f->count, f->op, f->npeers, f->peers_count);
    case RAS_DEAD:
        return snprintf(buf, cap, "NCCL RAS: %s is missing: NCCL considers it dead", who);
    case RAS_UNRESPONSIVE:
        return snprintf(buf, cap, "NCCL RAS: %s is missing: its RAS thread does not answer", who);
    case RAS_ASYNC_ERROR:
        return snprintf(buf, cap, "NCCL RAS: %s has asynchronous NCCL error %" PRIu64, who, f->count);
    }
    return snprintf(buf, cap, "NCCL RAS: %s", who);
}

/* Whether host (numeric, as RAS prints it) is an address of one of this machine's interfaces. */
static bool host_is_here(const char *host)
{
    struct ifaddrs *ifs;
    if (getifaddrs(&ifs) != 0)
        return false;
    bool here = false;
    for (struct ifaddrs *i = ifs; i && !here; i = i->ifa_next) {
        char buf[INET6_ADDRSTRLEN] = "";
        if (!i->ifa_addr)
            continue;
        if (i->ifa_addr->sa_family == AF_INET)
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, buf, sizeof(buf));
        else if (i->ifa_addr->sa_family == AF_INET6)
            inet_ntop(AF_INET6, &((struct sockaddr_in6 *)i->ifa_addr)->sin6_addr, buf, sizeof(buf));
        here = buf[0] && strcmp(buf, host) == 0;
    }
    freeifaddrs(ifs);
    return here;
}

char *ras_rank_text(const struct ras_finding *out, size_t n, int rank_pid)
{
    char *text = NULL;
    size_t len = 0;
    for (size_t i = 0; i < n && rank_pid > 0; i++) {
        const struct ras_finding *f = &out[i];
        if (f->pid <= 0 || (f->pid != rank_pid && getpgid(f->pid) != rank_pid) || !host_is_here(f->host))
            continue;
        char line[512];
        int l = ras_finding_text(f, line, sizeof(line));
        if (l <= 0 || len + (size_t)l + 2 > RAS_RANK_TEXT_MAX)
            break;
        char *p = realloc(text, len + (size_t)l + 2);
        if (!p)
            break;
        text = p;
        len += (size_t)snprintf(text + len, (size_t)l + 2, "%s%s", len ? "\n" : "", line);
    }
    return text;
}
