/* daemon/coalesce.c: wait after a busy loop iteration (see coalesce.h). */
#include "daemon/coalesce.h"

#include <errno.h>
#include <time.h>

static void on_check(uv_check_t *h)
{
    struct coalesce *c = h->data;
    if (c->events) {
        c->iterations++;
        if (c->events >= c->min_events) {
            c->waits++;
            struct timespec ts = {.tv_sec = c->wait_us / 1000000, .tv_nsec = (long)(c->wait_us % 1000000) * 1000};
            while (nanosleep(&ts, &ts) == -1 && errno == EINTR)
                ;
        }
    }
    c->events = 0;
    c->pass++;
}

int coalesce_start(struct coalesce *c, uv_loop_t *loop, unsigned min_events, unsigned wait_us)
{
    *c = (struct coalesce){.min_events = min_events ? min_events : 1, .wait_us = wait_us};
    int rc = uv_check_init(loop, &c->check);
    if (rc)
        return rc;
    c->check.data = c;
    rc = uv_check_start(&c->check, on_check);
    if (rc) {
        uv_close((uv_handle_t *)&c->check, NULL);
        return rc;
    }
    uv_unref((uv_handle_t *)&c->check);
    return 0;
}

void coalesce_close(struct coalesce *c)
{
    if (!uv_is_closing((uv_handle_t *)&c->check))
        uv_close((uv_handle_t *)&c->check, NULL);
}
