/*
 * store-bench: musterd's cost per state write, the state file
 * (daemon/state.h: temp file, fsync, rename, fsync of the directory)
 * against etcd (daemon/store_etcd.h: a transaction conditioned on leading),
 * each N writes of the same 16-member state in a row, as persist's pool
 * thread makes them. Usage: store-bench DIR etcd://H:P,... [N]
 * Prints one line per store: median and p99 in microseconds.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <uv.h>

#include "daemon/state.h"
#include "daemon/store_etcd.h"

static int elected;

static void on_event(void *ctx, struct store_event *ev)
{
    if (ev->kind == STORE_ELECTED)
        elected = 1;
    else
        fprintf(stderr, "store-bench: not elected (%s)\n", ev->kind == STORE_STANDBY ? "another leads" : ev->why);
    free(ev->state);
    uv_stop(ctx);
}

static void give_up(uv_timer_t *t) { uv_stop(t->loop); }

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3;
}

static int cmp(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void report(const char *what, double *t, int n)
{
    qsort(t, (size_t)n, sizeof(t[0]), cmp);
    printf("%-6s median %.0f us, p99 %.0f us (%d writes)\n", what, t[n / 2], t[n * 99 / 100], n);
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: store-bench DIR etcd://HOST:PORT[,...] [N]\n");
        return 2;
    }
    int n = argc > 3 ? atoi(argv[3]) : 200;
    if (n < 1 || n > 100000)
        return 2;
    static struct rdv_saved s;
    snprintf(s.job, sizeof(s.job), "bench");
    s.state = RDV_RUNNING;
    s.generation = 3;
    s.world_size = 128;
    s.last_checkpoint_step = 1000;
    s.nmembers = 16;
    for (uint32_t i = 0; i < s.nmembers; i++) {
        snprintf(s.members[i].name, sizeof(s.members[i].name), "node-%02u", i);
        s.members[i].first_rank = i * 8;
        s.members[i].ndevices = 8;
    }
    double *t = malloc(sizeof(double) * (size_t)n);
    char err[512];
    for (int i = 0; i < n; i++) {
        double t0 = now_us();
        if (state_write(argv[1], &s, err, sizeof(err)) != 0) {
            fprintf(stderr, "store-bench: %s\n", err);
            return 1;
        }
        t[i] = now_us() - t0;
    }
    report("file", t, n);

    uv_loop_t loop;
    uv_loop_init(&loop);
    struct store *st;
    struct store_config cfg = {.endpoints = argv[2], .job = "store-bench", .advertise = "127.0.0.1:1", .ttl_s = 3};
    if (store_open(&st, &loop, &cfg, on_event, &loop, err, sizeof(err)) != 0) {
        fprintf(stderr, "store-bench: %s\n", err);
        return 1;
    }
    /* The loop runs until the election's event stops it, 10 s at most. */
    uv_timer_t guard;
    uv_timer_init(&loop, &guard);
    uv_timer_start(&guard, give_up, 10000, 0);
    uv_run(&loop, UV_RUN_DEFAULT);
    int rc = 0;
    if (elected) {
        char *text = state_to_text(&s);
        for (int i = 0; i < n && rc == 0; i++) {
            double t0 = now_us();
            rc = store_write_state(st, text, err, sizeof(err));
            t[i] = now_us() - t0;
        }
        free(text);
        if (rc == 0)
            report("etcd", t, n);
        else
            fprintf(stderr, "store-bench: %s\n", err);
    } else {
        rc = 1;
    }
    uv_close((uv_handle_t *)&guard, NULL);
    store_close(st);
    uv_run(&loop, UV_RUN_DEFAULT);
    store_free(st);
    uv_loop_close(&loop);
    free(t);
    return rc != 0;
}
