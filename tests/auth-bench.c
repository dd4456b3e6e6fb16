/*
 * auth-bench: what the join handshake and the sealed channel (protocol 2,
 * proto/auth.c, proto/channel.c) cost in CPU, one core, no sockets.
 *
 *   auth-bench [--seconds S] [--ranks R]
 *
 * One "key=value" line each:
 *   handshake_us   both sides' cryptography of one join: the HELLO's digest
 *                  (each side), two nonces, two proofs made and two checked,
 *                  two channels derived (HKDF-SHA256, keyed HMAC contexts)
 *   beat_bytes     a HEARTBEAT of R rank entries, plain frame
 *   plain_ns       encode + decode of that heartbeat, plain
 *   sealed_ns      encode + seal + open (verify and decode), sealed
 *   seal_ns        the channel's own share per frame, both ends (seal + MAC check)
 *   echo_bytes     the daemon's echo (a heartbeat with no entries), plain frame
 *   echo_seal_ns   the channel's share for that echo
 */
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "proto/proto.h"

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static void check(int ok, const char *what)
{
    if (!ok) {
        fprintf(stderr, "auth-bench: %s failed\n", what);
        exit(1);
    }
}

static const uint8_t token[] = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
#define TOKEN_LEN (sizeof(token) - 1)

/* One join's cryptography, both sides, as musterd and muster-worker do it. */
static void handshake(const uint8_t *hello, size_t len, const struct proto_hello *h)
{
    struct proto_bind a, d;
    uint8_t pd[PROTO_HMAC_LEN], pa[PROTO_HMAC_LEN];
    check(proto_bind_hello(&a, hello, len, h) == 0, "agent's digest");
    check(proto_bind_hello(&d, hello, len, h) == 0, "daemon's digest");
    check(proto_nonce(d.daemon_nonce) == 0, "nonce");
    check(proto_proof(token, TOKEN_LEN, &d, PROTO_SIDE_DAEMON, pd) == 0, "daemon's proof");
    memcpy(a.daemon_nonce, d.daemon_nonce, PROTO_NONCE_LEN);
    check(proto_proof_verify(token, TOKEN_LEN, &a, PROTO_SIDE_DAEMON, pd), "daemon's proof checked");
    struct proto_channel *ca = proto_channel_new(token, TOKEN_LEN, &a, PROTO_SIDE_AGENT);
    check(proto_proof(token, TOKEN_LEN, &a, PROTO_SIDE_AGENT, pa) == 0, "agent's proof");
    check(proto_proof_verify(token, TOKEN_LEN, &d, PROTO_SIDE_AGENT, pa), "agent's proof checked");
    struct proto_channel *cd = proto_channel_new(token, TOKEN_LEN, &d, PROTO_SIDE_DAEMON);
    check(ca && cd, "channels");
    proto_channel_free(ca);
    proto_channel_free(cd);
}

static void fill_beat(struct proto_msg *m, uint32_t nranks, uint64_t step)
{
    proto_heartbeat_start(m);
    m->u.heartbeat.generation = 3;
    m->u.heartbeat.seq = step;
    m->u.heartbeat.free_port = 29500;
    m->u.heartbeat.nranks = nranks;
    for (uint32_t i = 0; i < nranks; i++) {
        struct proto_rank_beat *b = &m->u.heartbeat.ranks[i];
        memset(b, 0, sizeof(*b));
        b->rank = 8 * 17 + i;
        b->state = PROTO_RANK_RUNNING;
        b->step = step;
        b->loss = 2.0 + 1.0 / (double)(step + 1) + (double)i / 7000.0;
        b->tokens_per_s = 98765.4321 + (double)i;
        b->comm_frac = 0.123456789;
    }
}

/* ns per frame of encode (+ seal) + (open | decode) for a heartbeat of nranks. */
static double frame_ns(struct proto_channel *tx, struct proto_channel *rx, uint32_t nranks, double seconds,
                       size_t *bytes)
{
    static uint8_t buf[PROTO_MAX_SEALED];
    static struct proto_msg m, got;
    long n = 0;
    double t0 = now_s(), t;
    do {
        for (int k = 0; k < 256; k++, n++) {
            fill_beat(&m, nranks, (uint64_t)n);
            int len = proto_encode(&m, buf, PROTO_MAX_FRAME);
            check(len > 0, "encode");
            *bytes = (size_t)len;
            size_t used;
            if (tx) {
                len = proto_seal(tx, buf, (size_t)len, sizeof(buf));
                check(len > 0 && proto_open(rx, buf, (size_t)len, &got, &used) == PROTO_OK, "seal and open");
            } else {
                check(proto_decode(buf, (size_t)len, &got, &used) == PROTO_OK, "decode");
            }
        }
        t = now_s();
    } while (t - t0 < seconds);
    return (t - t0) * 1e9 / (double)n;
}

int main(int argc, char **argv)
{
    double seconds = 2.0;
    int nranks = 8;
    static const struct option opts[] = {{"seconds", required_argument, NULL, 's'},
                                         {"ranks", required_argument, NULL, 'r'},
                                         {"help", no_argument, NULL, 'h'},
                                         {NULL, 0, NULL, 0}};
    int c;
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        if (c == 's')
            seconds = atof(optarg);
        else if (c == 'r')
            nranks = atoi(optarg);
        else {
            fprintf(stderr, "usage: auth-bench [--seconds S] [--ranks R (1..%d)]\n", PROTO_MAX_LOCAL_RANKS);
            return c == 'h' ? 0 : 2;
        }
    }
    if (seconds <= 0 || nranks < 1 || nranks > PROTO_MAX_LOCAL_RANKS) {
        fprintf(stderr, "auth-bench: --seconds > 0, --ranks 1..%d\n", PROTO_MAX_LOCAL_RANKS);
        return 2;
    }

    /* A HELLO of 8 GPUs, as an agent sends it. */
    static uint8_t hello[PROTO_MAX_FRAME];
    struct proto_msg hm;
    memset(&hm, 0, sizeof(hm));
    hm.type = PROTO_HELLO;
    struct proto_hello *h = &hm.u.hello;
    snprintf(h->node, sizeof(h->node), "gpu-0417");
    snprintf(h->addr, sizeof(h->addr), "10.4.1.17");
    h->kind = PROTO_DEV_GPU;
    h->ndevices = 8;
    for (uint32_t i = 0; i < 8; i++)
        h->devices[i] = i;
    snprintf(h->agent_version, sizeof(h->agent_version), "0.1.0");
    check(proto_nonce(h->nonce) == 0, "nonce");
    int hlen = proto_encode(&hm, hello, sizeof(hello));
    check(hlen > 0, "HELLO");

    long joins = 0;
    double t0 = now_s(), t;
    do {
        for (int k = 0; k < 64; k++, joins++)
            handshake(hello, (size_t)hlen, h);
        t = now_s();
    } while (t - t0 < seconds);
    printf("handshake_us=%.1f\n", (t - t0) * 1e6 / (double)joins);

    struct proto_bind b;
    check(proto_bind_hello(&b, hello, (size_t)hlen, h) == 0 && proto_nonce(b.daemon_nonce) == 0, "bind");
    struct proto_channel *ca = proto_channel_new(token, TOKEN_LEN, &b, PROTO_SIDE_AGENT);
    struct proto_channel *cd = proto_channel_new(token, TOKEN_LEN, &b, PROTO_SIDE_DAEMON);
    check(ca && cd, "channels");
    size_t bytes = 0, echo_bytes = 0;
    /* Alternating, so that a machine whose load changes weighs on both alike. */
    double plain = 0, sealed = 0, echo_plain = 0, echo_sealed = 0;
    for (int round = 0; round < 4; round++) {
        plain += frame_ns(NULL, NULL, (uint32_t)nranks, seconds / 8, &bytes);
        sealed += frame_ns(ca, cd, (uint32_t)nranks, seconds / 8, &bytes);
        echo_plain += frame_ns(NULL, NULL, 0, seconds / 8, &echo_bytes);
        echo_sealed += frame_ns(ca, cd, 0, seconds / 8, &echo_bytes);
    }
    printf("beat_bytes=%zu\n", bytes);
    printf("plain_ns=%.0f\n", plain / 4);
    printf("sealed_ns=%.0f\n", sealed / 4);
    printf("seal_ns=%.0f\n", (sealed - plain) / 4);
    printf("echo_bytes=%zu\n", echo_bytes);
    printf("echo_seal_ns=%.0f\n", (echo_sealed - echo_plain) / 4);
    proto_channel_free(ca);
    proto_channel_free(cd);
    return 0;
}
