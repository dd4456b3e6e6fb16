/*
 * comm-bench: ring all-gather and reduce-scatter bandwidth on loopback,
 * next to what one TCP connection streams on loopback in the same run.
 *
 *   comm-bench [--ranks 2,4] [--min-mib 1] [--max-mib 64] [--seconds S]
 *
 * Ranks are threads of this process, each with its own ring sockets. Size is
 * the whole buffer (all-gather output, reduce-scatter input), f32; as in
 * nccl-tests, algbw = size / time and busbw = algbw * (N-1)/N, which is
 * what each link carries. On one machine the N links of the ring share the
 * cores and the loopback device, so "sum/raw" = N * busbw / raw TCP says how
 * much of what a single stream gets the whole ring moves (1.0 = as much).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "worker/train/comm/comm.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* ---- raw TCP: one connection streaming on loopback ------------------- */

struct stream {
    int fd;
    size_t total;
};

static void *stream_writer(void *arg)
{
    struct stream *s = arg;
    size_t chunk = 4u << 20;
    char *buf = calloc(1, chunk);
    for (size_t done = 0; done < s->total;) {
        ssize_t n = write(s->fd, buf, chunk < s->total - done ? chunk : s->total - done);
        if (n <= 0)
            break;
        done += (size_t)n;
    }
    free(buf);
    close(s->fd);
    return NULL;
}

static double raw_tcp_gbps(size_t total)
{
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(sa);
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, len) < 0 || listen(lfd, 1) < 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &len) < 0)
        return -1;
    struct stream s = {.fd = socket(AF_INET, SOCK_STREAM, 0), .total = total};
    if (connect(s.fd, (struct sockaddr *)&sa, len) < 0)
        return -1;
    int rfd = accept(lfd, NULL, NULL);
    close(lfd);
    size_t chunk = 4u << 20;
    char *buf = malloc(chunk);
    pthread_t t;
    double t0 = now_s();
    pthread_create(&t, NULL, stream_writer, &s);
    size_t got = 0;
    for (ssize_t n; (n = read(rfd, buf, chunk)) > 0;)
        got += (size_t)n;
    double dt = now_s() - t0;
    pthread_join(t, NULL);
    close(rfd);
    free(buf);
    return got == total ? (double)total / dt / 1e9 : -1;
}

/* ---- the ring -------------------------------------------------------- */

struct rank {
    pthread_t thread;
    int rank, world, iters;
    const uint8_t *id;
    size_t bytes;          /* whole buffer */
    double ag_s, rs_s;     /* per call */
    int rc;
};

static int timed(struct comm *c, int iters, int gather, float *big, float *small,
                 size_t count, double *per_call)
{
    int rc = gather ? comm_all_gather(c, small, big, count, COMM_F32)
                    : comm_reduce_scatter(c, big, small, count, COMM_F32, COMM_SUM);
    if (rc == 0)
        rc = comm_barrier(c);
    double t0 = now_s();
    for (int i = 0; rc == 0 && i < iters; i++)
        rc = gather ? comm_all_gather(c, small, big, count, COMM_F32)
                    : comm_reduce_scatter(c, big, small, count, COMM_F32, COMM_SUM);
    if (rc == 0)
        rc = comm_barrier(c);
    *per_call = (now_s() - t0) / iters;
    return rc;
}

static void *rank_main(void *arg)
{
    struct rank *r = arg;
    struct comm *c;
    r->rc = comm_init(&c, COMM_RING, r->rank, r->world, r->id, 30000);
    if (r->rc < 0)
        return NULL;
    size_t count = r->bytes / sizeof(float) / (size_t)r->world;
    float *big = calloc(count * (size_t)r->world, sizeof(float));
    float *small = calloc(count, sizeof(float));
    r->rc = timed(c, r->iters, 1, big, small, count, &r->ag_s);
    if (r->rc == 0)
        r->rc = timed(c, r->iters, 0, big, small, count, &r->rs_s);
    free(big);
    free(small);
    comm_destroy(c);
    return NULL;
}

static int bench_ring(int world, size_t bytes, int iters, double *ag_s, double *rs_s)
{
    uint8_t id[COMM_ID_BYTES];
    int rc = comm_unique_id(COMM_RING, id);
    if (rc < 0)
        return rc;
    struct rank *rks = calloc((size_t)world, sizeof(*rks));
    for (int i = 0; i < world; i++) {
        rks[i] = (struct rank){.rank = i, .world = world, .iters = iters, .id = id,
                               .bytes = bytes};
        pthread_create(&rks[i].thread, NULL, rank_main, &rks[i]);
    }
    *ag_s = *rs_s = 0;
    for (int i = 0; i < world; i++) {
        pthread_join(rks[i].thread, NULL);
        if (rks[i].rc < 0 && rc == 0)
            rc = rks[i].rc;
        if (rks[i].ag_s > *ag_s)
            *ag_s = rks[i].ag_s;
        if (rks[i].rs_s > *rs_s)
            *rs_s = rks[i].rs_s;
    }
    free(rks);
    return rc;
}

static void usage(void)
{
    fprintf(stderr, "usage: comm-bench [--ranks 2,4] [--min-mib 1] [--max-mib 64] "
                    "[--seconds S]\n");
    exit(2);
}

int main(int argc, char **argv)
{
    const char *ranks = "2,4";
    int min_mib = 1, max_mib = 64;
    double seconds = 0.3; /* aim per measurement */
    for (int i = 1; i < argc; i++) {
        if (i + 1 >= argc)
            usage();
        if (!strcmp(argv[i], "--ranks"))
            ranks = argv[++i];
        else if (!strcmp(argv[i], "--min-mib"))
            min_mib = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--max-mib"))
            max_mib = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--seconds"))
            seconds = atof(argv[++i]);
        else
            usage();
    }
    if (min_mib < 1 || max_mib < min_mib || seconds <= 0)
        usage();
    if (!getenv("MUSTER_COMM_ADDR"))
        setenv("MUSTER_COMM_ADDR", "127.0.0.1", 1);

    double raw = raw_tcp_gbps((size_t)2 << 30);
    printf("raw loopback TCP, one connection: %.2f GB/s\n\n", raw);
    printf("%-6s %5s %6s %12s %12s %8s %12s %12s %8s\n", "ranks", "MiB", "iters",
           "AG algbw", "AG busbw", "sum/raw", "RS algbw", "RS busbw", "sum/raw");
    char *list = strdup(ranks);
    for (char *save = NULL, *tok = strtok_r(list, ",", &save); tok;
         tok = strtok_r(NULL, ",", &save)) {
        int world = atoi(tok);
        if (world < 1)
            usage();
        for (int mib = min_mib; mib <= max_mib; mib *= 4) {
            size_t bytes = (size_t)mib << 20;
            /* a first guess at 1 GB/s, enough calls to fill `seconds` */
            int iters = (int)(seconds * 1e9 / (double)bytes);
            if (iters < 3)
                iters = 3;
            double ag, rs;
            int rc = bench_ring(world, bytes, iters, &ag, &rs);
            if (rc < 0) {
                fprintf(stderr, "comm-bench: %d ranks, %d MiB: %s\n", world, mib,
                        comm_strerror(rc));
                return 1;
            }
            double bus = world > 1 ? (double)(world - 1) / world : 1;
            double ag_alg = (double)bytes / ag / 1e9, rs_alg = (double)bytes / rs / 1e9;
            printf("%-6d %5d %6d %7.2f GB/s %7.2f GB/s %8.2f %7.2f GB/s %7.2f GB/s %8.2f\n",
                   world, mib, iters, ag_alg, ag_alg * bus, world * ag_alg * bus / raw,
                   rs_alg, rs_alg * bus, world * rs_alg * bus / raw);
            fflush(stdout);
        }
    }
    free(list);
    return 0;
}
