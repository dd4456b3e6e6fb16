/*
 * metrics: the Prometheus text exposition (format 0.0.4) of GET /metrics,
 * rendered from the SNAP_STATUS document. Pure code: text in, text out.
 */
#ifndef MUSTER_METRICS_H
#define MUSTER_METRICS_H

#include <stddef.h>

/*
 * Renders status_json (SNAP_STATUS text) as metrics. Returns 0 and a
 * malloc'd NUL-terminated text in *out, -EINVAL if the document is not a
 * JSON object (err says why), -ENOMEM.
 */
int metrics_render(const char *status_json, char **out, char *err, size_t errlen);

#endif
