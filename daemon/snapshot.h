/*
 * snapshot: how the REST thread sees daemon state without touching loop
 * objects. The loop thread renders documents (JSON text) and publishes them
 * here; the HTTP thread takes a copy under the lock. Admin requests travel
 * the other way through http_admin_fn, which the daemon implements with a
 * locked queue and uv_async_send.
 *
 * Documents:
 *   SNAP_STATUS  the object of GET /v1/status:
 *     {"job": str, "state": str, "reason": str|null, "generation": int,
 *      "world_size": int, "restarts": int, "max_restarts": int,
 *      "step": int, "loss": num|null, "tokens_per_s": num, "comm_frac": num,
 *      "uptime_s": num, "last_checkpoint_step": int|null,
 *      "nodes": [{"name": str, "state": "joined"|"lost"|"left",
 *                 "addr": str, "devices": int, "kind": "cpu"|"gpu",
 *                 "ranks": [int...], "heartbeat_age_ms": int|null}],
 *      "ranks": [{"rank": int, "node": str, "local_rank": int, "device": int,
 *                 "state": "starting"|"running"|"stopping"|"exited"|"completed"|"pending",
 *                 "step": int, "loss": num|null, "tokens_per_s": num,
 *                 "comm_frac": num, "heartbeat_age_ms": int|null}]}
 *   SNAP_EVENTS  the object of GET /v1/events:
 *     {"events": [{"seq": int, "time": "RFC 3339 UTC", "generation": int,
 *                  "kind": str, "node": str|null, "rank": int|null,
 *                  "message": str}]}   (oldest first, bounded ring)
 */
#ifndef MUSTER_SNAPSHOT_H
#define MUSTER_SNAPSHOT_H

#include <pthread.h>
#include <stddef.h>

enum snap_doc { SNAP_STATUS = 0, SNAP_EVENTS = 1, SNAP_NDOCS = 2 };

struct snapshot {
    pthread_mutex_t lock;
    char *doc[SNAP_NDOCS]; /* NUL-terminated JSON text, or NULL before first publish */
    unsigned long version; /* bumped on every publish */
    int read[SNAP_NDOCS];  /* copied since it was last published */
};

void snapshot_init(struct snapshot *s);
void snapshot_destroy(struct snapshot *s);
/* Loop thread: replace a document; takes ownership of text (malloc'd). */
void snapshot_publish(struct snapshot *s, enum snap_doc which, char *text);
/* Any thread: a malloc'd copy of a document, or NULL if none yet. */
char *snapshot_copy(struct snapshot *s, enum snap_doc which);
/* Loop thread: 1 when someone copied the document since it was published,
 * so that a refresh that changes only figures can wait for a reader. */
int snapshot_was_read(struct snapshot *s, enum snap_doc which);

#endif
