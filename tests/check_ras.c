/*
 * nccl_ras: the RAS client protocol fed bytes, the findings read from RAS
 * status documents in NCCL's JSON format (recorded shapes: a rank behind, one
 * ahead, dead and unresponsive peers, an async error, a healthy job), bad
 * documents, and the query over a real socket against a forked server.
 */
#include <check.h>
#include <errno.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "worker/agent/nccl_ras.h"

static const char *feed(struct ras_query *q, const char *s)
{
    ras_on_bytes(q, s, strlen(s));
    q->out[q->outlen] = '\0';
    return q->out;
}

START_TEST(ras_protocol_steps)
{
    struct ras_query q;
    memset(&q, 0, sizeof(q));
    q.fd = -1;
    q.phase = RAS_HELLO;
    ck_assert_str_eq(feed(&q, "SERVER PROTOCOL"), ""); /* half a line: nothing yet */
    ck_assert_int_eq(q.phase, RAS_HELLO);
    ck_assert_str_eq(feed(&q, " 2\n"), "TIMEOUT 1\n");
    ck_assert_int_eq(q.server_protocol, 2);
    ck_assert_int_eq(q.phase, RAS_TIMEOUT);
    ck_assert_str_eq(feed(&q, "OK\n"), "SET FORMAT json\n");
    ck_assert_str_eq(feed(&q, "OK\n"), "STATUS\n");
    ck_assert_int_eq(q.phase, RAS_STATUS);
    feed(&q, "{\"communicators\": \n");
    feed(&q, "[]}\n");
    ck_assert_int_eq(q.phase, RAS_STATUS); /* the document runs to EOF */
    ck_assert_int_eq(ras_on_bytes(&q, NULL, 0), 0);
    ck_assert_int_eq(q.phase, RAS_DONE);
    ck_assert_str_eq(q.error, "");
    ck_assert_str_eq(q.in, "{\"communicators\": \n[]}\n");
    ras_end(&q);
}
END_TEST

START_TEST(ras_protocol_refusals)
{
    struct ras_query q;
    memset(&q, 0, sizeof(q));
    q.fd = -1;
    q.phase = RAS_HELLO;
    ck_assert_int_eq(ras_on_bytes(&q, "HTTP/1.1 400 Bad Request\r\n", 26), -EPROTO);
    ck_assert_int_eq(q.phase, RAS_DONE);
    ck_assert_ptr_nonnull(strstr(q.error, "not NCCL's RAS: it answered \"HTTP/1.1 400 Bad Request?\""));
    ras_end(&q);

    memset(&q, 0, sizeof(q));
    q.fd = -1;
    q.phase = RAS_HELLO;
    feed(&q, "SERVER PROTOCOL 2\n");
    feed(&q, "OK\n");
    ck_assert_int_eq(ras_on_bytes(&q, "ERROR: unknown command\n", 23), -ENOTSUP);
    ck_assert_ptr_nonnull(strstr(q.error, "no JSON format (NCCL before 2.28.7)"));
    ras_end(&q);

    memset(&q, 0, sizeof(q));
    q.fd = -1;
    q.phase = RAS_HELLO;
    ck_assert_int_eq(ras_on_bytes(&q, NULL, 0), -EPROTO); /* EOF before the handshake */
    ck_assert_ptr_nonnull(strstr(q.error, "closed the connection"));
    ras_end(&q);
}
END_TEST

/* A RAS document of one communicator whose ranks issued counts[i] AllReduce (and 7 Broadcast each). */
static char *doc_of(const int *counts, int n, const char *missing)
{
    static char buf[16384];
    int len = snprintf(buf, sizeof(buf), "{\"nccl_version\": \"2.28.9\", \"communicators_count\": 1, "
                       "\"communicators\": [{\"hash\": \"0x5eed\", \"size\": %d, \"ranks_count\": %d, \"ranks\": [",
                       n + (missing ? 1 : 0), n);
    for (int i = 0; i < n; i++)
        len += snprintf(buf + len, sizeof(buf) - len,
                        "%s{\"rank\": %d, \"host\": \"10.0.0.%d\", \"pid\": %d, \"cuda_dev\": %d, \"nvml_dev\": %d, "
                        "\"status\": {\"init_state\": 0, \"async_error\": 0, \"finalize_called\": false, "
                        "\"destroy_flag\": false, \"abort_flag\": false}, \"collective_counts\": {\"Broadcast\": 7, "
                        "\"AllReduce\": %d, \"AllGather\": 0}}",
                        i ? ", " : "", i, i / 2 + 1, 1000 + i, i % 2, i % 2, counts[i]);
    snprintf(buf + len, sizeof(buf) - len, "], \"missing_ranks\": [%s]}], \"ras\": {\"collection_time_sec\": 0.01, "
             "\"timeouts_count\": 0}}", missing ? missing : "");
    return buf;
}

START_TEST(ras_findings_behind_and_ahead)
{
    struct ras_finding f[8];
    size_t n;
    char why[256];
    const int behind[] = {1832, 1832, 1831, 1832};
    char *d = doc_of(behind, 4, NULL);
    ck_assert_int_eq(ras_findings(d, strlen(d), f, 8, &n, why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(f[0].kind, RAS_BEHIND);
    ck_assert_int_eq(f[0].rank, 2);
    ck_assert_int_eq(f[0].pid, 1002);
    ck_assert_str_eq(f[0].host, "10.0.0.2");
    ck_assert_str_eq(f[0].op, "AllReduce");
    ck_assert_uint_eq(f[0].count, 1831);
    ck_assert_uint_eq(f[0].peers_count, 1832);
    ck_assert_uint_eq(f[0].npeers, 3);
    char line[512];
    ras_finding_text(&f[0], line, sizeof(line));
    ck_assert_str_eq(line, "NCCL RAS: rank 2 of NCCL communicator 0x5eed (4 ranks; host 10.0.0.2, pid 1002, GPU 0) "
                           "has issued 1831 AllReduce where 3 rank(s) have issued 1832: it is behind, its peers wait "
                           "for it");

    const int ahead[] = {40, 41, 40, 40};
    d = doc_of(ahead, 4, NULL);
    ck_assert_int_eq(ras_findings(d, strlen(d), f, 8, &n, why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(f[0].kind, RAS_AHEAD);
    ck_assert_int_eq(f[0].rank, 1);

    /* Two ranks, one skipped: a tie goes to the larger count, the other is behind. */
    const int two[] = {9, 10};
    d = doc_of(two, 2, NULL);
    ck_assert_int_eq(ras_findings(d, strlen(d), f, 8, &n, why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(f[0].kind, RAS_BEHIND);
    ck_assert_int_eq(f[0].rank, 0);

    const int healthy[] = {500, 500, 500, 500};
    d = doc_of(healthy, 4, NULL);
    ck_assert_int_eq(ras_findings(d, strlen(d), f, 8, &n, why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 0);
}
END_TEST

START_TEST(ras_findings_missing_and_errors)
{
    struct ras_finding f[8];
    size_t n;
    char why[256];
    const int c[] = {12, 12, 12};
    char *d = doc_of(c, 3, "{\"rank\": 3, \"host\": \"10.0.0.9\", \"pid\": 77, \"cuda_dev\": 1, \"nvml_dev\": 1, "
                           "\"status\": {\"unresponsive\": true, \"considered_dead\": true}}");
    ck_assert_int_eq(ras_findings(d, strlen(d), f, 8, &n, why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(f[0].kind, RAS_DEAD);
    ck_assert_int_eq(f[0].rank, 3);
    ck_assert_int_eq(f[0].pid, 77);
    ck_assert_int_eq(f[0].comm_size, 4);

    d = doc_of(c, 3, "{\"rank\": 3, \"host\": \"10.0.0.9\", \"pid\": 77, \"cuda_dev\": 1, \"nvml_dev\": 1, "
                     "\"status\": {\"unresponsive\": true, \"considered_dead\": false}}");
    ck_assert_int_eq(ras_findings(d, strlen(d), f, 8, &n, why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(f[0].kind, RAS_UNRESPONSIVE);

    const char *err = "{\"communicators\": [{\"hash\": \"0x1\", \"size\": 2, \"ranks\": ["
                      "{\"rank\": 0, \"pid\": 5, \"status\": {\"async_error\": 6}, \"collective_counts\": {\"AllReduce\": 3}},"
                      "{\"rank\": 1, \"pid\": 6, \"status\": {\"async_error\": 0}, \"collective_counts\": {\"AllReduce\": 3}}],"
                      " \"missing_ranks\": []}]}";
    ck_assert_int_eq(ras_findings(err, strlen(err), f, 8, &n, why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 1);
    ck_assert_int_eq(f[0].kind, RAS_ASYNC_ERROR);
    ck_assert_uint_eq(f[0].count, 6);
    ck_assert_str_eq(f[0].host, "unknown");

    /* More findings than room: counted, the first cap stored. */
    const int spread[] = {1, 2, 3, 4, 5, 6, 6, 6, 6, 6};
    d = doc_of(spread, 10, NULL);
    ck_assert_int_eq(ras_findings(d, strlen(d), f, 2, &n, why, sizeof(why)), 0);
    ck_assert_uint_eq(n, 5);
    ck_assert_int_eq(f[1].rank, 1);
}
END_TEST

START_TEST(ras_findings_bad_documents)
{
    struct ras_finding f[4];
    size_t n;
    char why[256];
    const char *bad[] = {
        "Communicators: 2 (text format, NCCL before 2.28.7)",
        "{\"communicators\": 3}",
        "{\"nccl_version\": \"2.28\"}",
        "{\"communicators\": [{\"ranks\": [{\"host\": \"a\"}]}]}",
        "{\"communicators\": [{\"ranks\": [{\"rank\": -4}]}]}",
        "{\"communicators\": [{\"ranks\": [], \"missing_ranks\": {}}]}",
        "{\"communicators\": [7]}",
        "{\"communicators\": [], \"communicators\": []}",
    };
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        n = 99;
        ck_assert_int_eq(ras_findings(bad[i], strlen(bad[i]), f, 4, &n, why, sizeof(why)), -EINVAL);
        ck_assert_uint_eq(n, 0);
        ck_assert_ptr_nonnull(strstr(why, "not a RAS status document"));
    }
}
END_TEST

/* The lines an agent attaches to a rank: findings about its process group, on this machine only. */
START_TEST(ras_rank_text_is_local)
{
    struct ras_finding f[3];
    memset(f, 0, sizeof(f));
    for (int i = 0; i < 3; i++) {
        f[i].kind = RAS_BEHIND;
        snprintf(f[i].comm, sizeof(f[i].comm), "0x1");
        f[i].comm_size = 4;
        f[i].rank = i;
        snprintf(f[i].op, sizeof(f[i].op), "AllReduce");
        f[i].count = 9;
        f[i].peers_count = 10;
        f[i].npeers = 3;
    }
    f[0].pid = (int32_t)getpid();
    snprintf(f[0].host, sizeof(f[0].host), "127.0.0.1");
    f[1].pid = (int32_t)getpid(); /* the same PID on another node */
    snprintf(f[1].host, sizeof(f[1].host), "192.0.2.77");
    f[2].pid = 1; /* init: not in this process group */
    snprintf(f[2].host, sizeof(f[2].host), "127.0.0.1");
    char *t = ras_rank_text(f, 3, (int)getpgrp());
    ck_assert_ptr_nonnull(t); /* this process is in its own process group */
    ck_assert_ptr_nonnull(strstr(t, "NCCL RAS: rank 0 of NCCL communicator 0x1"));
    ck_assert_ptr_null(strchr(t, '\n')); /* rank 1 (another host) and 2 (another group) left out */
    free(t);
    ck_assert_ptr_null(ras_rank_text(f + 1, 2, (int)getpgrp()));
    ck_assert_ptr_null(ras_rank_text(f, 3, 0));
}
END_TEST

/* A RAS server in a child: the handshake, then the document and EOF (or, mode 1, silence). */
static pid_t serve(uint16_t *port, const char *doc, int mode)
{
    int ls = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    ck_assert_int_eq(bind(ls, (struct sockaddr *)&a, sizeof(a)), 0);
    socklen_t al = sizeof(a);
    getsockname(ls, (struct sockaddr *)&a, &al);
    *port = ntohs(a.sin_port);
    ck_assert_int_eq(listen(ls, 1), 0);
    pid_t pid = fork();
    if (pid == 0) {
        alarm(10);
        int c = accept(ls, NULL, NULL);
        char buf[256];
        const char *answers[] = {"SERVER PROTOCOL 2\n", "OK\n", "OK\n"};
        for (int i = 0; i < 4; i++) {
            size_t got = 0;
            while (got < sizeof(buf) - 1 && (got == 0 || buf[got - 1] != '\n')) {
                ssize_t r = read(c, buf + got, 1);
                if (r <= 0)
                    _exit(1);
                got += (size_t)r;
            }
            if (mode == 1)
                pause();
            if (i < 3)
                (void)!write(c, answers[i], strlen(answers[i]));
        }
        (void)!write(c, doc, strlen(doc));
        close(c);
        _exit(0);
    }
    close(ls);
    return pid;
}

static uint64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

START_TEST(ras_query_over_a_socket)
{
    const int c[] = {3, 2};
    char *doc = doc_of(c, 2, NULL);
    uint16_t port;
    pid_t pid = serve(&port, doc, 0);
    char addr[32];
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    struct ras_query q;
    ck_assert_int_eq(ras_begin(&q, addr, now_ms(), 5000), 0);
    int done = 0;
    for (int i = 0; i < 500 && !done; i++) {
        done = ras_poll(&q, now_ms());
        if (!done)
            usleep(10000);
    }
    ck_assert_int_eq(done, 1);
    ck_assert_str_eq(q.error, "");
    ck_assert_str_eq(q.in, doc);
    ras_end(&q);
    waitpid(pid, NULL, 0);

    /* Silence after the handshake: done at the deadline, saying where it stopped. */
    pid = serve(&port, doc, 1);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", port);
    uint64_t t0 = now_ms();
    ck_assert_int_eq(ras_begin(&q, addr, t0, 300), 0);
    done = 0;
    for (int i = 0; i < 200 && !done; i++) {
        done = ras_poll(&q, now_ms());
        if (!done)
            usleep(10000);
    }
    ck_assert_int_eq(done, 1);
    ck_assert_ptr_nonnull(strstr(q.error, "did not answer in time (at the handshake)"));
    ck_assert_uint_ge(now_ms() - t0, 300);
    ras_end(&q);
    kill(pid, SIGKILL);
    waitpid(pid, NULL, 0);

    /* Nothing listening (a CPU job): done at once. */
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    bind(s, (struct sockaddr *)&a, sizeof(a));
    socklen_t al = sizeof(a);
    getsockname(s, (struct sockaddr *)&a, &al);
    snprintf(addr, sizeof(addr), "127.0.0.1:%u", ntohs(a.sin_port));
    close(s); /* bound once, now free: refused */
    int rc = ras_begin(&q, addr, now_ms(), 1000);
    done = rc != 0;
    for (int i = 0; i < 100 && !done; i++) {
        done = ras_poll(&q, now_ms());
        if (!done)
            usleep(10000);
    }
    ck_assert_int_eq(done, 1);
    ck_assert_ptr_nonnull(strstr(q.error, "nothing answers at the RAS address"));
    ras_end(&q);

    ck_assert_int_eq(ras_begin(&q, "ras.example:28028", now_ms(), 1000), -EINVAL);
    ck_assert_ptr_nonnull(strstr(q.error, "not a numeric address"));
    ras_end(&q);
}
END_TEST

Suite *make_ras_suite(void)
{
    Suite *s = suite_create("ras");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, ras_protocol_steps);
    tcase_add_test(tc, ras_protocol_refusals);
    tcase_add_test(tc, ras_findings_behind_and_ahead);
    tcase_add_test(tc, ras_findings_missing_and_errors);
    tcase_add_test(tc, ras_findings_bad_documents);
    tcase_add_test(tc, ras_query_over_a_socket);
    tcase_add_test(tc, ras_rank_text_is_local);
    suite_add_tcase(s, tc);
    return s;
}
