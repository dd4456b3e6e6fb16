#include "daemon/metrics.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

/* Every job state, in life order; muster_job_state is one-hot over these. */
static const char *const job_states[] = {"waiting", "forming", "running", "recovering",
                                         "completed", "stopped", "failed"};
static const char *const node_states[] = {"joined", "lost", "left"};

#define NELEMS(a) (sizeof(a) / sizeof((a)[0]))

static void header(FILE *f, const char *name, const char *type, const char *help)
{
    fprintf(f, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

/* Sample values: Go's ParseFloat spellings for the non-finite ones. */
static void value(FILE *f, double v)
{
    if (isnan(v))
        fputs(" NaN\n", f);
    else if (isinf(v))
        fputs(v > 0 ? " +Inf\n" : " -Inf\n", f);
    else if (v == floor(v) && fabs(v) < 9007199254740992.0)
        fprintf(f, " %.0f\n", v);
    else
        fprintf(f, " %.10g\n", v);
}

/* Label values escape backslash, double quote and line feed. */
static void label_value(FILE *f, const char *s)
{
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '\\')
            fputs("\\\\", f);
        else if (*s == '"')
            fputs("\\\"", f);
        else if (*s == '\n')
            fputs("\\n", f);
        else
            fputc(*s, f);
    }
    fputc('"', f);
}

/* A number field of obj; false when absent, null or not a number. */
static int num(const json_t *obj, const char *key, double *v)
{
    json_t *j = json_object_get(obj, key);
    if (!json_is_number(j))
        return 0;
    *v = json_number_value(j);
    return 1;
}

static const char *str(const json_t *obj, const char *key)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : "";
}

/* One unlabelled sample, skipped (HELP and TYPE kept) when the field is missing. */
static void scalar(FILE *f, const json_t *st, const char *key, const char *name,
                   const char *type, double scale, const char *help)
{
    double v;
    header(f, name, type, help);
    if (num(st, key, &v)) {
        fputs(name, f);
        value(f, v * scale);
    }
}

static void job_state(FILE *f, const json_t *st)
{
    const char *state = str(st, "state");
    header(f, "muster_job_state", "gauge", "1 for the job's current state, 0 for the others");
    for (size_t i = 0; i < NELEMS(job_states); i++)
        fprintf(f, "muster_job_state{state=\"%s\"} %d\n", job_states[i],
                strcmp(state, job_states[i]) == 0);
}

static void nodes(FILE *f, const json_t *st)
{
    const json_t *arr = json_object_get(st, "nodes");
    size_t i;
    json_t *n;
    double v;

    header(f, "muster_nodes", "gauge", "Nodes known to the daemon, by state");
    for (size_t s = 0; s < NELEMS(node_states); s++) {
        int count = 0;
        json_array_foreach(arr, i, n) {
            count += strcmp(str(n, "state"), node_states[s]) == 0;
        }
        fprintf(f, "muster_nodes{state=\"%s\"} %d\n", node_states[s], count);
    }

    header(f, "muster_node_devices", "gauge", "Devices (GPUs or CPU slots) a node reported");
    json_array_foreach(arr, i, n) {
        if (!num(n, "devices", &v))
            continue;
        fputs("muster_node_devices{node=", f);
        label_value(f, str(n, "name"));
        fputc('}', f);
        value(f, v);
    }
    header(f, "muster_node_heartbeat_age_seconds", "gauge",
           "Seconds since the last heartbeat of a node's agent");
    json_array_foreach(arr, i, n) {
        if (!num(n, "heartbeat_age_ms", &v))
            continue;
        fputs("muster_node_heartbeat_age_seconds{node=", f);
        label_value(f, str(n, "name"));
        fputc('}', f);
        value(f, v / 1000.0);
    }
}

struct rank_metric {
    const char *key;
    const char *name;
    double scale;
    const char *help;
};

static const struct rank_metric rank_metrics[] = {
    {"step", "muster_rank_step", 1.0, "Last step a rank reported"},
    {"loss", "muster_rank_loss", 1.0, "Last training loss a rank reported"},
    {"tokens_per_s", "muster_rank_tokens_per_second", 1.0, "Training throughput of a rank"},
    {"comm_frac", "muster_rank_comm_fraction", 1.0,
     "Fraction of a rank's step time spent in communication"},
    {"heartbeat_age_ms", "muster_rank_heartbeat_age_seconds", 0.001,
     "Seconds since a rank's last heartbeat"},
};

static void ranks(FILE *f, const json_t *st)
{
    const json_t *arr = json_object_get(st, "ranks");
    for (size_t m = 0; m < NELEMS(rank_metrics); m++) {
        const struct rank_metric *rm = &rank_metrics[m];
        size_t i;
        json_t *r;
        double v, rank;
        header(f, rm->name, "gauge", rm->help);
        json_array_foreach(arr, i, r) {
            if (!num(r, "rank", &rank) || !num(r, rm->key, &v))
                continue;
            fprintf(f, "%s{rank=\"%.0f\",node=", rm->name, rank);
            label_value(f, str(r, "node"));
            fputc('}', f);
            value(f, v * rm->scale);
        }
    }
}

int metrics_render(const char *status_json, char **out, char *err, size_t errlen)
{
    json_error_t jerr;
    json_t *st = json_loads(status_json, 0, &jerr);
    if (!json_is_object(st)) {
        snprintf(err, errlen, "status document is not a JSON object: %s",
                 st ? "wrong type" : jerr.text);
        json_decref(st);
        return -EINVAL;
    }

    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) {
        json_decref(st);
        return -ENOMEM;
    }

    job_state(f, st);
    scalar(f, st, "generation", "muster_generation", "gauge",
           1.0, "Current generation (bumped at every re-formation)");
    scalar(f, st, "world_size", "muster_world_size", "gauge", 1.0,
           "Ranks in the current generation");
    scalar(f, st, "restarts", "muster_restarts_total", "counter", 1.0,
           "Restarts (new generations after a failure) of the job");
    scalar(f, st, "max_restarts", "muster_max_restarts", "gauge", 1.0,
           "Restarts allowed before the job is failed");
    scalar(f, st, "step", "muster_step", "gauge", 1.0, "Training step of the job");
    scalar(f, st, "loss", "muster_loss", "gauge", 1.0, "Training loss of the job");
    scalar(f, st, "tokens_per_s", "muster_tokens_per_second", "gauge", 1.0,
           "Training throughput of the whole job");
    scalar(f, st, "comm_frac", "muster_comm_fraction", "gauge", 1.0,
           "Fraction of step time spent in communication");
    scalar(f, st, "last_checkpoint_step", "muster_last_checkpoint_step", "gauge", 1.0,
           "Step of the last committed checkpoint");
    scalar(f, st, "nodes_wanted", "muster_nodes_wanted", "gauge", 1.0,
           "Nodes the job needs to form a generation");
    scalar(f, st, "stale_frames", "muster_stale_frames_total", "counter", 1.0,
           "Frames refused because they carried an older generation");
    scalar(f, st, "uptime_s", "muster_uptime_seconds", "gauge", 1.0,
           "Seconds since musterd started");
    nodes(f, st);
    ranks(f, st);

    json_decref(st);
    if (fclose(f) != 0) {
        free(text);
        return -ENOMEM;
    }
    *out = text;
    return 0;
}
