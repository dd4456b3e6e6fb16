/*
 * rest-load: a fixed-rate HTTP load generator for musterd's REST port
 * (loopback), for tests/bench/bench_rest.sh. Requests go out on a schedule
 * (open loop: one every 1/RATE s, over CONNS kept-alive connections, one
 * request in flight per connection); a request that has to wait for a free
 * connection is late, and its latency counts from when it was due, so a
 * slow server cannot hide its stalls by slowing the generator down.
 *
 * Prints one "key=value" line each: requests, errors (non-2xx or a broken
 * connection), p50_ms, p99_ms, max_ms (from when each request was due),
 * sent_p99_ms (from when it was actually sent: what is left when the
 * generator itself ran late), bytes (of the last answer), rate (requests
 * answered per second). Exit 0, or 1 when some request failed,
 * 2 on a usage error.
 *
 * Several --path options are taken in turn (e.g. pages of /v1/ranks).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define MAX_CONNS 64
#define MAX_PATHS 64

struct conn {
    int fd;
    int busy;
    double due;       /* when the request in flight was due */
    double sent;      /* when it was sent */
    char *buf;        /* the answer so far */
    size_t len, cap;
};

static uint16_t port;
static double rate = 1000, seconds = 10;
static int nconns = 8;
static const char *paths[MAX_PATHS];
static int npaths;

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static int dial(void)
{
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(port)};
    inet_pton(AF_INET, "127.0.0.1", &sa.sin_addr);
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return -1;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

/* The whole answer is in buf: 1 (its status in *status), 0 not yet, -1 malformed. */
static int answer_complete(const struct conn *c, int *status, size_t *body)
{
    const char *end = memmem(c->buf, c->len, "\r\n\r\n", 4);
    if (!end)
        return 0;
    if (c->len < 12 || strncmp(c->buf, "HTTP/1.1 ", 9) != 0)
        return -1;
    *status = atoi(c->buf + 9);
    size_t head = (size_t)(end - c->buf) + 4;
    const char *cl = NULL;
    for (const char *p = c->buf; p < end; p = strstr(p, "\r\n") + 2) {
        if (strncasecmp(p, "Content-Length:", 15) == 0) {
            cl = p + 15;
            break;
        }
    }
    if (!cl)
        return -1; /* musterd always sends a length */
    *body = (size_t)strtoull(cl, NULL, 10);
    return c->len >= head + *body ? 1 : 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void usage(FILE *f)
{
    fputs("Usage: rest-load --port PORT --path PATH [--path PATH]... [--rate R] [--seconds S] [--conns C]\n"
          "Requests PATH on 127.0.0.1:PORT at R per second (default 1000) for S seconds (default 10)\n"
          "over C kept-alive connections (default 8, at most 64); prints latency percentiles.\n",
          f);
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"port", required_argument, NULL, 'p'}, {"path", required_argument, NULL, 'P'},
        {"rate", required_argument, NULL, 'r'}, {"seconds", required_argument, NULL, 's'},
        {"conns", required_argument, NULL, 'c'}, {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0},
    };
    int o;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'p': port = (uint16_t)atoi(optarg); break;
        case 'P':
            if (npaths < MAX_PATHS)
                paths[npaths++] = optarg;
            break;
        case 'r': rate = atof(optarg); break;
        case 's': seconds = atof(optarg); break;
        case 'c': nconns = atoi(optarg); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!port || !npaths || rate <= 0 || rate > 100000 || seconds <= 0 || seconds > 600 || nconns < 1 ||
        nconns > MAX_CONNS) {
        usage(stderr);
        return 2;
    }

    static struct conn conns[MAX_CONNS];
    static struct pollfd pfd[MAX_CONNS];
    size_t total = (size_t)(rate * seconds);
    double *lat = calloc(total, sizeof(double)), *slat = calloc(total, sizeof(double));
    if (!lat || !slat)
        return 1;
    for (int i = 0; i < nconns; i++) {
        conns[i].fd = dial();
        conns[i].cap = 1 << 16;
        conns[i].buf = malloc(conns[i].cap);
        if (conns[i].fd < 0 || !conns[i].buf) {
            fprintf(stderr, "rest-load: cannot connect to 127.0.0.1:%u: %s\n", port, strerror(errno));
            return 1;
        }
    }

    size_t sent = 0, done = 0, errors = 0, last_bytes = 0;
    double start = now_s(), give_up = start + seconds + 10;
    while (done + errors < total && now_s() < give_up) {
        double now = now_s();
        /* every request due by now goes out on a free connection */
        for (int i = 0; i < nconns && sent < total && start + (double)sent / rate <= now; i++) {
            struct conn *c = &conns[i];
            if (c->busy)
                continue;
            if (c->fd < 0 && (c->fd = dial()) < 0) {
                errors++;
                sent++;
                continue;
            }
            char req[512];
            int n = snprintf(req, sizeof(req), "GET %s HTTP/1.1\r\nHost: 127.0.0.1:%u\r\n\r\n", paths[sent % (size_t)npaths], port);
            c->due = start + (double)sent / rate;
            sent++;
            if (send(c->fd, req, (size_t)n, MSG_NOSIGNAL) != n) {
                if (errors < 5)
                    fprintf(stderr, "rest-load: send: %s\n", strerror(errno));
                close(c->fd);
                c->fd = -1;
                errors++;
                continue;
            }
            c->busy = 1;
            c->len = 0;
            c->sent = now_s();
        }
        for (int i = 0; i < nconns; i++) {
            pfd[i].fd = conns[i].busy ? conns[i].fd : -1;
            pfd[i].events = POLLIN;
        }
        /* sleep until the next request is due or an answer comes: no spinning,
         * the generator shares the cores with the server */
        double next_due = sent < total ? start + (double)sent / rate : now + 0.01, wait = next_due - now;
        if (wait < 0)
            wait = 0;
        struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
        if (ppoll(pfd, (nfds_t)nconns, &ts, NULL) < 0 && errno != EINTR)
            break;
        for (int i = 0; i < nconns; i++) {
            struct conn *c = &conns[i];
            if (!c->busy || !(pfd[i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            if (c->cap - c->len < 16384) {
                char *nb = realloc(c->buf, c->cap * 2);
                if (!nb)
                    return 1;
                c->buf = nb;
                c->cap *= 2;
            }
            ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
            int status = 0;
            size_t body = 0;
            int complete = n > 0 ? (c->len += (size_t)n, answer_complete(c, &status, &body)) : -1;
            if (complete == 0)
                continue;
            c->busy = 0;
            if (complete < 0 || status < 200 || status > 299) {
                if (errors++ < 5)
                    fprintf(stderr, "rest-load: %s\n", n == 0 ? "connection closed by the server"
                                                    : n < 0 ? strerror(errno)
                                                    : complete < 0 ? "malformed answer"
                                                                   : "HTTP error status");
                close(c->fd);
                c->fd = -1;
                continue;
            }
            slat[done] = (now_s() - c->sent) * 1000.0;
            lat[done++] = (now_s() - c->due) * 1000.0;
            last_bytes = body;
        }
    }
    double elapsed = now_s() - start;
    qsort(lat, done, sizeof(double), cmp_double);
    qsort(slat, done, sizeof(double), cmp_double);
    printf("requests=%zu\nerrors=%zu\n", done, errors + (total - done - errors));
    if (done) {
        printf("p50_ms=%.3f\np99_ms=%.3f\nmax_ms=%.3f\nsent_p99_ms=%.3f\n", lat[done / 2],
               lat[(size_t)((double)done * 0.99)], lat[done - 1], slat[(size_t)((double)done * 0.99)]);
        printf("bytes=%zu\nrate=%.0f\n", last_bytes, (double)done / elapsed);
    }
    for (int i = 0; i < nconns; i++) {
        if (conns[i].fd >= 0)
            close(conns[i].fd);
        free(conns[i].buf);
    }
    free(lat);
    free(slat);
    return done == total ? 0 : 1;
}
