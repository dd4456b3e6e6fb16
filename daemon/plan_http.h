/*
 * plan_http: the document of GET /v1/plan, made on a REST thread from the
 * summary of the published view (which carries the loop's plan of the
 * members' real devices, daemon/fitness.h) and the request's query:
 * network_gbit and tflops plan it again at another bandwidth or device speed.
 */
#ifndef MUSTER_PLAN_HTTP_H
#define MUSTER_PLAN_HTTP_H

#include <stddef.h>

#include <jansson.h>

/*
 * {"job", "state", "time_ms": musterd's wall clock, "plan": object|null,
 *  "plan_note": why there is no plan|null, "measured": {...}}.
 * summary: the job-level fields of /v1/status (rdv_summary_json), the
 * caller's alone while this runs. network and tflops may be NULL. Returns
 * NULL with the reason in err for a bad query value (the caller answers 400).
 */
json_t *plan_http_doc(const json_t *summary, const char *network, const char *tflops, char *err, size_t errlen);

#endif
