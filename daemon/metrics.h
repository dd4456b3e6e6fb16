/*
 * metrics: the Prometheus text exposition (format 0.0.4) of GET /metrics,
 * rendered from a snapshot view (daemon/snapshot.h). Job- and node-level
 * series always; the per-rank series (five per rank: 160k lines at 32k
 * ranks) only when asked for (GET /metrics?ranks=1).
 */
#ifndef MUSTER_METRICS_H
#define MUSTER_METRICS_H

#include <stddef.h>

#include "daemon/snapshot.h"

/* A malloc'd NUL-terminated text (its length in *len), or NULL on ENOMEM. */
char *metrics_render(struct snap_view *v, int with_ranks, size_t *len);

#endif
