/*
 * persist: group commit of the state file (daemon/state.h). The loop asks
 * for rdv's state to be made durable (persist_request); the write itself
 * (temp file, fsync, rename, fsync of the directory) runs on libuv's thread
 * pool from a copy the loop made, so the loop never waits on the disk.
 *
 * Coalescing: at most one write is in flight, and one starts at most every
 * PERSIST_SPACING_MS. Requests that come meanwhile are folded into the next
 * write, which copies the state from rdv when it starts (one O(members) copy
 * per write, none per request); a write whose content equals the last one's
 * is not made. N agents joining, or lost, at once cost a bounded number of
 * writes, not 2N.
 *
 * Ordering: each request that changes the content gets a sequence number,
 * and on_durable(seq) says that the file on disk holds the state of every
 * request up to seq. musterd holds the frames rdv sends after a request until
 * that request is durable (server_hold), which keeps the rule that the state
 * file records a generation before any frame names it.
 *
 * A write that fails is logged and retried every PERSIST_RETRY_MS with the
 * newest state; the frames it held are let go (as before group commit: a
 * full state disk must not stop a running job), and the old file stays
 * whole.
 */
#ifndef MUSTER_PERSIST_H
#define MUSTER_PERSIST_H

#include <stddef.h>
#include <stdint.h>

#include <uv.h>

#include "daemon/rdv.h"

#define PERSIST_SPACING_MS 20

/* Where the state goes instead of the file (runs on the pool thread). */
typedef int (*persist_sink_fn)(void *ctx, const struct rdv_saved *s, char *err, size_t errlen);
#define PERSIST_RETRY_MS 1000

struct persist {
    uv_loop_t *loop;
    const char *dir;
    uv_work_t work;
    uv_timer_t timer;       /* spacing and retries */
    void (*on_durable)(void *ctx, uint64_t seq);
    void *ctx;
    persist_sink_fn sink;   /* NULL: the state file */
    void *sink_ctx;
    const struct rdv *rdv;      /* copied from when a write starts */

    struct rdv_saved *next;     /* scratch for the next write's content (loop's) */
    struct rdv_saved *inflight; /* the thread pool's while busy */
    struct rdv_saved *last;     /* content of the newest write started */
    uint64_t seq;           /* last sequence number given out */
    uint64_t writing;       /* sequence number the write in flight makes durable */
    uint64_t durable;       /* newest sequence number on disk (or given up on) */
    uint64_t last_start_ms;
    int have_last;          /* last holds something */
    int pending;            /* requests since the last write started */
    int busy;               /* a write is in flight */
    int closing;            /* persist_close ran: write what is pending, then close */
    int rc;                 /* result of the write in flight (the pool thread's) */
    char err[512];

    uint64_t writes;        /* writes completed (each: 2 fsyncs) */
    uint64_t failures;
};

/* on_durable runs on the loop thread. Returns 0 or -ENOMEM. */
int persist_init(struct persist *p, uv_loop_t *loop, const char *dir,
                 void (*on_durable)(void *ctx, uint64_t seq), void *ctx);

/*
 * The state goes to sink instead of the file (daemon/store_etcd.h). A write
 * that fails there holds its frames until a later write succeeds: another
 * musterd may take over from that store, and must not find a generation
 * older than one an agent has seen.
 */
void persist_set_sink(struct persist *p, persist_sink_fn sink, void *ctx);

/*
 * rdv's state is to be made durable (r must outlive p). Returns the
 * sequence number whose durability covers it; on_durable reports it, or
 * already has when nothing changed since the last write.
 */
uint64_t persist_request(struct persist *p, const struct rdv *r);

/* Writes what is pending (at once), then closes the timer; the loop runs
 * until the last write is done. */
void persist_close(struct persist *p);

/* Frees the buffers, once the loop has finished. */
void persist_free(struct persist *p);

#endif
