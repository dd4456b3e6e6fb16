#include "daemon/plan_http.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>

#include "common/plan.h"
#include "common/plan_prog.h"

/* A query number within [lo, hi]; 0 or -EINVAL. */
static int query_num(const char *text, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (errno || end == text || *end || !isfinite(v) || v < lo || v > hi)
        return -EINVAL;
    *out = v;
    return 0;
}

json_t *plan_http_doc(const json_t *summary, const char *network, const char *tflops, char *err, size_t errlen)
{
    double gbit = 0, tf = 0;
    if (network && query_num(network, PLAN_MIN_GBIT, PLAN_MAX_GBIT, &gbit)) {
        snprintf(err, errlen, "network_gbit: expected %g to %g (Gbit/s), got '%.64s'", PLAN_MIN_GBIT, PLAN_MAX_GBIT,
                 network);
        return NULL;
    }
    if (tflops && query_num(tflops, PLAN_MIN_TFLOPS, PLAN_MAX_TFLOPS, &tf)) {
        snprintf(err, errlen, "tflops: expected %g to %g, got '%.64s'", PLAN_MIN_TFLOPS, PLAN_MAX_TFLOPS, tflops);
        return NULL;
    }
    const json_t *st = summary;
    json_t *plan = json_object_get(st, "plan"), *out = NULL;
    struct plan_input in;
    struct plan p;
    char why[512] = "";
    struct plan_prog_input pin;
    struct plan_prog pp;
    const char *kind = json_string_value(json_object_get(plan, "kind"));
    if (kind && strcmp(kind, "program") == 0) {
        if ((gbit > 0 || tf > 0) && plan_prog_input_from_json(plan, &pin) == 0) {
            if (gbit > 0)
                pin.inter.gbit = gbit;
            if (tf > 0)
                pin.tflops = tf;
            if (plan_prog_compute(&pin, &pp, why, sizeof(why)) == 0) {
                out = plan_prog_json(&pp);
                json_object_set(out, "step_time_measured", json_object_get(plan, "step_time_measured"));
            }
        }
    } else if (json_is_object(plan) && (gbit > 0 || tf > 0) && plan_input_from_json(plan, &in) == 0) {
        if (gbit > 0)
            in.network_gbit = gbit;
        if (tf > 0)
            in.tflops = tf;
        if (plan_compute(&in, &p, why, sizeof(why)) == 0)
            out = plan_json(&p, json_string_value(json_object_get(plan, "model")));
    }
    struct timeval tv;
    gettimeofday(&tv, NULL);
    json_t *note = json_object_get(st, "plan_note"), *measured = json_object_get(st, "measured");
    json_t *doc = json_pack("{s:O, s:O, s:I, s:O, s:O, s:O}", "job", json_object_get(st, "job"), "state",
                            json_object_get(st, "state"), "time_ms",
                            (json_int_t)tv.tv_sec * 1000 + tv.tv_usec / 1000, "plan",
                            out ? out : plan ? plan : json_null(), "plan_note", note ? note : json_null(),
                            "measured", measured ? measured : json_null());
    json_decref(out);
    return doc;
}
