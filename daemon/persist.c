#include "daemon/persist.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "common/log.h"
#include "daemon/state.h"

/* The members in use: the rest of the (large) struct is never copied or compared. */
static void saved_copy(struct rdv_saved *dst, const struct rdv_saved *src)
{
    memcpy(dst, src, offsetof(struct rdv_saved, members) + src->nmembers * sizeof(src->members[0]));
}

static int saved_equal(const struct rdv_saved *a, const struct rdv_saved *b)
{
    if (a->state != b->state || a->generation != b->generation || a->restarts != b->restarts ||
        a->world_size != b->world_size || a->last_checkpoint_step != b->last_checkpoint_step ||
        a->nmembers != b->nmembers || strcmp(a->job, b->job) != 0 || strcmp(a->reason, b->reason) != 0 ||
        a->replacements != b->replacements)
        return 0;
    for (uint32_t i = 0; i < a->nmembers; i++) {
        const struct rdv_saved_member *x = &a->members[i], *y = &b->members[i];
        if (x->first_rank != y->first_rank || x->ndevices != y->ndevices || strcmp(x->name, y->name) != 0)
            return 0;
    }
    return 1;
}

int persist_init(struct persist *p, uv_loop_t *loop, const char *dir,
                 void (*on_durable)(void *ctx, uint64_t seq), void *ctx)
{
    memset(p, 0, sizeof(*p));
    p->loop = loop;
    p->dir = dir;
    p->on_durable = on_durable;
    p->ctx = ctx;
    p->next = malloc(sizeof(*p->next));
    p->inflight = malloc(sizeof(*p->inflight));
    p->last = malloc(sizeof(*p->last));
    if (!p->next || !p->inflight || !p->last) {
        persist_free(p);
        return -ENOMEM;
    }
    uv_timer_init(loop, &p->timer);
    p->timer.data = p;
    p->work.data = p;
    return 0;
}

static void kick(struct persist *p);

static void on_timer(uv_timer_t *t) { kick(t->data); }

/* Pool thread: the one place that touches p->inflight while busy. */
static void do_write(uv_work_t *w)
{
    struct persist *p = w->data;
    p->rc = p->sink ? p->sink(p->sink_ctx, p->inflight, p->err, sizeof(p->err))
                    : state_write(p->dir, p->inflight, p->err, sizeof(p->err));
}

static void after_write(uv_work_t *w, int status)
{
    struct persist *p = w->data;
    p->busy = 0;
    if (status == 0 && p->rc == 0) {
        p->writes++;
        log_debug("state file written (request %llu, %u members, %llu writes)",
                  (unsigned long long)p->writing, p->inflight->nmembers, (unsigned long long)p->writes);
    } else {
        p->failures++;
        log_error("%s not written: %s; retrying every %d ms", p->sink ? "state" : "state file",
                  status ? uv_strerror(status) : p->err, PERSIST_RETRY_MS);
        p->have_last = 0;           /* the next write goes to disk whatever its content */
        if (!p->closing)
            p->pending = 1;         /* retried with the state as it is then */
        p->last_start_ms = uv_now(p->loop) + PERSIST_RETRY_MS - PERSIST_SPACING_MS;
    }
    /* Frames held for this write go out either way (see persist.h), but
     * for a store that is shared by several musterd (persist_set_sink). */
    if (p->sink && !(status == 0 && p->rc == 0)) {
        kick(p);
        return;
    }
    if (p->writing > p->durable)
        p->durable = p->writing;
    p->on_durable(p->ctx, p->durable);
    kick(p);
}

/*
 * Starts the pending write if none is in flight and the spacing allows (else
 * arms the timer). The state is copied from rdv only now, so that any number
 * of requests between two writes cost one copy.
 */
static void kick(struct persist *p)
{
    if (!p->pending || p->busy)
        goto idle;
    uint64_t now = uv_now(p->loop), due = p->last_start_ms + PERSIST_SPACING_MS;
    if (!p->closing && p->writes + p->failures > 0 && now < due) {
        uv_timer_start(&p->timer, on_timer, due - now, 0);
        return;
    }
    rdv_save(p->rdv, p->next);
    p->pending = 0;
    if (p->have_last && saved_equal(p->next, p->last)) {
        /* What the last write (done: nothing is in flight) put on disk. */
        p->durable = p->seq;
        p->on_durable(p->ctx, p->durable);
        goto idle;
    }
    struct rdv_saved *t = p->inflight;
    p->inflight = p->next;
    p->next = t;
    saved_copy(p->last, p->inflight);
    p->have_last = 1;
    p->writing = p->seq;
    p->last_start_ms = now;
    int rc = uv_queue_work(p->loop, &p->work, do_write, after_write);
    if (rc == 0) {
        p->busy = 1;
        return;
    }
    p->rc = rc;
    snprintf(p->err, sizeof(p->err), "cannot queue the write: %s", uv_strerror(rc));
    after_write(&p->work, 0);
    return;
idle:
    if (p->closing && !p->busy && !p->pending && !uv_is_closing((uv_handle_t *)&p->timer))
        uv_close((uv_handle_t *)&p->timer, NULL);
}

void persist_set_sink(struct persist *p, persist_sink_fn sink, void *ctx)
{
    p->sink = sink;
    p->sink_ctx = ctx;
}

uint64_t persist_request(struct persist *p, const struct rdv *r)
{
    p->rdv = r;
    if (!p->pending) {
        p->pending = 1;
        p->seq++;
    }
    kick(p);
    return p->seq;
}

void persist_close(struct persist *p)
{
    p->closing = 1;
    uv_timer_stop(&p->timer);
    kick(p);
}

void persist_free(struct persist *p)
{
    free(p->next);
    free(p->inflight);
    free(p->last);
    p->next = p->inflight = p->last = NULL;
}
