/*
 * proto/codec.c: frames and the JSON mapping of each message.
 *
 * Decoding goes header -> JSON object -> C struct -> semantic check; the
 * encoder runs the same semantic check (proto/check.c) before it builds any
 * JSON, so that whatever one side accepts the other can produce and the
 * other way round: decode(encode(m)) == m for every valid m.
 *
 * Field errors are ordered: unknown fields first, then each field in the
 * order the message lists them (missing, wrong JSON type, out of range),
 * then the checks that span fields.
 */
#include <math.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include "proto/check.h"
#include "proto/fastbeat.h"
#include "proto/internal.h"
#include "proto/proto.h"

#define TRY(expr)              \
    do {                       \
        int rc_ = (expr);      \
        if (rc_ < 0)           \
            return rc_;        \
    } while (0)

/* ---- reading fields out of a decoded JSON object ---- */

/* Every key of obj must be one of keys (NULL-terminated). */
static int check_keys(json_t *obj, const char *const *keys)
{
    const char *key;
    json_t *value;

    json_object_foreach(obj, key, value) {
        const char *const *k = keys;
        while (*k && strcmp(*k, key) != 0)
            k++;
        if (!*k)
            return PROTO_E_UNKNOWN_FIELD;
    }
    return 0;
}

static int int_value(json_t *v, json_int_t min, json_int_t max, json_int_t *out)
{
    if (!json_is_integer(v))
        return PROTO_E_FIELD_TYPE;
    if (json_integer_value(v) < min || json_integer_value(v) > max)
        return PROTO_E_RANGE;
    *out = json_integer_value(v);
    return 0;
}

static int get_int(json_t *obj, const char *key, json_int_t min, json_int_t max,
                   json_int_t *out)
{
    json_t *v = json_object_get(obj, key);

    if (!v)
        return PROTO_E_MISSING;
    return int_value(v, min, max, out);
}

static int get_u64(json_t *obj, const char *key, uint64_t *out)
{
    json_int_t x;

    TRY(get_int(obj, key, 0, (json_int_t)PROTO_U64_MAX, &x));
    *out = (uint64_t)x;
    return 0;
}

static int get_u32(json_t *obj, const char *key, uint32_t *out)
{
    json_int_t x;

    TRY(get_int(obj, key, 0, UINT32_MAX, &x));
    *out = (uint32_t)x;
    return 0;
}

static int get_i32(json_t *obj, const char *key, int32_t *out)
{
    json_int_t x;

    TRY(get_int(obj, key, INT32_MIN, INT32_MAX, &x));
    *out = (int32_t)x;
    return 0;
}

/* A string that must fit buf with its NUL; content is checked later. */
static int get_str(json_t *obj, const char *key, char *buf, size_t cap)
{
    json_t *v = json_object_get(obj, key);

    if (!v)
        return PROTO_E_MISSING;
    if (!json_is_string(v))
        return PROTO_E_FIELD_TYPE;
    if (json_string_length(v) >= cap)
        return PROTO_E_RANGE;
    memcpy(buf, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

static int hex_digit(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

/* Exactly 2 * n lowercase hex digits. */
static int get_hex(json_t *obj, const char *key, uint8_t *out, size_t n)
{
    json_t *v = json_object_get(obj, key);
    const char *s;

    if (!v)
        return PROTO_E_MISSING;
    if (!json_is_string(v))
        return PROTO_E_FIELD_TYPE;
    if (json_string_length(v) != 2 * n)
        return PROTO_E_RANGE;
    s = json_string_value(v);
    for (size_t i = 0; i < n; i++) {
        int hi = hex_digit(s[2 * i]), lo = hex_digit(s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return PROTO_E_RANGE;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 0;
}

/* One of names[lo..hi]; *out is its index. */
static int get_enum(json_t *obj, const char *key, const char *const *names,
                    int lo, int hi, int *out)
{
    json_t *v = json_object_get(obj, key);

    if (!v)
        return PROTO_E_MISSING;
    if (!json_is_string(v))
        return PROTO_E_FIELD_TYPE;
    for (int i = lo; i <= hi; i++) {
        if (strcmp(json_string_value(v), names[i]) == 0) {
            *out = i;
            return 0;
        }
    }
    return PROTO_E_RANGE;
}

/* A JSON number (integer or real); null reads as NaN where null_ok. */
static int get_number(json_t *obj, const char *key, int null_ok, double *out)
{
    json_t *v = json_object_get(obj, key);

    if (!v)
        return PROTO_E_MISSING;
    if (null_ok && json_is_null(v)) {
        *out = NAN;
        return 0;
    }
    if (!json_is_number(v))
        return PROTO_E_FIELD_TYPE;
    *out = json_number_value(v);
    return 0;
}

static int get_array(json_t *obj, const char *key, size_t max, json_t **out)
{
    json_t *v = json_object_get(obj, key);

    if (!v)
        return PROTO_E_MISSING;
    if (!json_is_array(v))
        return PROTO_E_FIELD_TYPE;
    if (json_array_size(v) > max)
        return PROTO_E_RANGE;
    *out = v;
    return 0;
}

/* ---- decoding each message (structure and types; then proto_check) ---- */

/* An optional boolean: absent is false. */
static int get_bool(json_t *obj, const char *key, int *out)
{
    json_t *v = json_object_get(obj, key);

    *out = 0;
    if (!v)
        return 0;
    if (!json_is_boolean(v))
        return PROTO_E_FIELD_TYPE;
    *out = json_is_true(v);
    return 0;
}

/* An optional label: absent is "", present is at least one byte (proto_check
 * checks the rest). */
static int get_label(json_t *obj, const char *key, char *buf, size_t cap)
{
    buf[0] = '\0';
    if (!json_object_get(obj, key))
        return 0;
    TRY(get_str(obj, key, buf, cap));
    return buf[0] ? 0 : PROTO_E_RANGE;
}

/* A required string of at most max bytes, as a malloc'd copy (content is checked later). */
static int get_owned_str(json_t *obj, const char *key, size_t max, char **out)
{
    json_t *v = json_object_get(obj, key);

    if (!v)
        return PROTO_E_MISSING;
    if (!json_is_string(v))
        return PROTO_E_FIELD_TYPE;
    if (json_string_length(v) > max)
        return PROTO_E_RANGE;
    *out = malloc(json_string_length(v) + 1); /* freed by proto_msg_clear */
    if (!*out)
        return PROTO_E_NOMEM;
    memcpy(*out, json_string_value(v), json_string_length(v) + 1);
    return 0;
}

static int dec_gpu(json_t *o, struct proto_gpu *g)
{
    static const char *const keys[] = {"name", "total_mb", "free_mb", NULL};

    if (!json_is_object(o))
        return PROTO_E_FIELD_TYPE;
    TRY(check_keys(o, keys));
    TRY(get_str(o, "name", g->name, sizeof(g->name)));
    TRY(get_u64(o, "total_mb", &g->total_mb));
    return get_u64(o, "free_mb", &g->free_mb);
}

static int dec_hello(json_t *o, struct proto_hello *h)
{
    static const char *const keys[] = {"node", "addr", "kind", "devices",
        "device_mem_mb", "generation", "agent_version", "free_port", "nonce", "session", "gpus",
        "host_mem_mb", "preflight", "domain", NULL};
    json_t *devices;
    int kind;

    TRY(check_keys(o, keys));
    TRY(get_str(o, "node", h->node, sizeof(h->node)));
    TRY(get_str(o, "addr", h->addr, sizeof(h->addr)));
    TRY(get_enum(o, "kind", proto_device_kind_json, PROTO_DEV_CPU, PROTO_DEV_GPU, &kind));
    h->kind = (enum proto_device_kind)kind;
    TRY(get_array(o, "devices", PROTO_MAX_LOCAL_RANKS, &devices));
    h->ndevices = (uint32_t)json_array_size(devices);
    for (uint32_t i = 0; i < h->ndevices; i++) {
        json_int_t d;
        TRY(int_value(json_array_get(devices, i), 0, UINT32_MAX, &d));
        h->devices[i] = (uint32_t)d;
    }
    TRY(get_u64(o, "device_mem_mb", &h->device_mem_mb));
    TRY(get_u64(o, "generation", &h->generation));
    TRY(get_u32(o, "free_port", &h->free_port));
    TRY(get_str(o, "agent_version", h->agent_version, sizeof(h->agent_version)));
    TRY(get_hex(o, "nonce", h->nonce, sizeof(h->nonce)));
    /* Optional: the session to resume, device facts and the pre-flight promise. */
    if (json_object_get(o, "session"))
        TRY(get_u64(o, "session", &h->session));
    json_t *gpus;
    if (json_object_get(o, "gpus")) {
        TRY(get_array(o, "gpus", PROTO_MAX_LOCAL_RANKS, &gpus));
        h->ngpus = (uint32_t)json_array_size(gpus);
        for (uint32_t i = 0; i < h->ngpus; i++)
            TRY(dec_gpu(json_array_get(gpus, i), &h->gpus[i]));
    }
    if (json_object_get(o, "host_mem_mb"))
        TRY(get_u64(o, "host_mem_mb", &h->host_mem_mb));
    if (json_object_get(o, "domain")) { /* absent = none; present, a name (check_hello) */
        TRY(get_str(o, "domain", h->domain, sizeof(h->domain)));
        if (!h->domain[0])
            return PROTO_E_RANGE;
    }
    return get_bool(o, "preflight", &h->preflight);
}

static int dec_challenge(json_t *o, struct proto_challenge *c)
{
    static const char *const keys[] = {"nonce", "hmac", NULL};

    TRY(check_keys(o, keys));
    TRY(get_hex(o, "nonce", c->nonce, sizeof(c->nonce)));
    return get_hex(o, "hmac", c->hmac, sizeof(c->hmac));
}

static int dec_response(json_t *o, struct proto_response *r)
{
    static const char *const keys[] = {"hmac", NULL};

    TRY(check_keys(o, keys));
    return get_hex(o, "hmac", r->hmac, sizeof(r->hmac));
}

/* The optional "term" (absent: 0). */
static int get_term(json_t *o, uint64_t *term)
{
    return json_object_get(o, "term") ? get_u64(o, "term", term) : 0;
}

static int dec_welcome(json_t *o, struct proto_welcome *w)
{
    static const char *const keys[] = {"heartbeat_interval_ms",
        "heartbeat_timeout_ms", "lease_ms", "session", "time_ms", "job", "term", NULL};

    TRY(check_keys(o, keys));
    TRY(get_u32(o, "heartbeat_interval_ms", &w->heartbeat_interval_ms));
    TRY(get_u32(o, "heartbeat_timeout_ms", &w->heartbeat_timeout_ms));
    TRY(get_u32(o, "lease_ms", &w->lease_ms));
    /* Optional: the session, musterd's clock and the job spec for the pre-flight. */
    if (json_object_get(o, "session"))
        TRY(get_u64(o, "session", &w->session));
    if (json_object_get(o, "time_ms"))
        TRY(get_u64(o, "time_ms", &w->time_ms));
    TRY(get_term(o, &w->term));
    json_t *job = json_object_get(o, "job");
    if (job && !json_is_object(job))
        return PROTO_E_FIELD_TYPE;
    w->job = job ? json_incref(job) : NULL; /* released by proto_msg_clear */
    return 0;
}

static int dec_preflight(json_t *o, struct proto_preflight *p)
{
    static const char *const keys[] = {"fit", "reason", "trainer", "checkpoint", NULL};
    json_t *fit;

    TRY(check_keys(o, keys));
    fit = json_object_get(o, "fit");
    if (!fit)
        return PROTO_E_MISSING;
    TRY(get_bool(o, "fit", &p->fit));
    TRY(get_str(o, "reason", p->reason, sizeof(p->reason)));
    p->has_checkpoint = json_object_get(o, "checkpoint") != NULL;
    if (p->has_checkpoint)
        TRY(get_str(o, "checkpoint", p->checkpoint, sizeof(p->checkpoint)));
    return get_bool(o, "trainer", &p->trainer);
}

/* REJECT and ERROR share their shape. */
static int dec_code_reason(json_t *o, char *code, size_t code_cap, char *reason,
                           size_t reason_cap)
{
    static const char *const keys[] = {"code", "reason", NULL};

    TRY(check_keys(o, keys));
    TRY(get_str(o, "code", code, code_cap));
    return get_str(o, "reason", reason, reason_cap);
}

static int dec_slot(json_t *o, struct proto_rank_slot *s)
{
    static const char *const keys[] = {"rank", "local_rank", "device", NULL};

    if (!json_is_object(o))
        return PROTO_E_FIELD_TYPE;
    TRY(check_keys(o, keys));
    TRY(get_u32(o, "rank", &s->rank));
    TRY(get_u32(o, "local_rank", &s->local_rank));
    return get_u32(o, "device", &s->device);
}

static int dec_assign(json_t *o, struct proto_assign *a)
{
    static const char *const keys[] = {"generation", "world_size", "ranks",
        "node_rank", "nnodes", "restart_count", "master_addr", "master_port",
        "job", "term", "memory_checkpoint", "memory_checkpoint_from", "memory_checkpoint_drained", NULL};
    json_t *ranks, *job;

    TRY(check_keys(o, keys));
    TRY(get_u64(o, "generation", &a->generation));
    TRY(get_u32(o, "world_size", &a->world_size));
    TRY(get_array(o, "ranks", PROTO_MAX_LOCAL_RANKS, &ranks));
    a->nranks = (uint32_t)json_array_size(ranks);
    for (uint32_t i = 0; i < a->nranks; i++)
        TRY(dec_slot(json_array_get(ranks, i), &a->ranks[i]));
    TRY(get_u32(o, "node_rank", &a->node_rank));
    TRY(get_u32(o, "nnodes", &a->nnodes));
    TRY(get_u32(o, "restart_count", &a->restart_count));
    TRY(get_str(o, "master_addr", a->master_addr, sizeof(a->master_addr)));
    TRY(get_u32(o, "master_port", &a->master_port));
    TRY(get_term(o, &a->term));
    a->has_memckpt = json_object_get(o, "memory_checkpoint") != NULL;
    a->memckpt[0] = '\0';
    if (a->has_memckpt)
        TRY(get_str(o, "memory_checkpoint", a->memckpt, sizeof(a->memckpt)));
    TRY(get_label(o, "memory_checkpoint_from", a->memckpt_from, sizeof(a->memckpt_from))); /* optional */
    a->memckpt_drained = 0; /* optional */
    if (json_object_get(o, "memory_checkpoint_drained"))
        TRY(get_bool(o, "memory_checkpoint_drained", &a->memckpt_drained));
    job = json_object_get(o, "job");
    if (!job)
        return PROTO_E_MISSING;
    if (!json_is_object(job))
        return PROTO_E_FIELD_TYPE;
    a->job = json_incref(job); /* released by proto_msg_clear */
    return 0;
}

static int dec_unique_id(json_t *o, struct proto_unique_id *u)
{
    static const char *const keys[] = {"generation", "id", "term", NULL};

    TRY(check_keys(o, keys));
    TRY(get_u64(o, "generation", &u->generation));
    TRY(get_term(o, &u->term));
    return get_hex(o, "id", u->id, sizeof(u->id));
}

static int dec_beat(json_t *o, struct proto_rank_beat *b)
{
    static const char *const keys[] = {"rank", "state", "step", "loss",
        "tokens_per_s", "comm_frac", "checkpoint_step", "silent", "step_bytes",
        "peak_mem", "rejoin", "restore_from", "restore_step", "yielded", "step_s", "step_age_ms",
        "total_steps", "where", "waiting", "stopped", "split_s", "split_steps", "compute_frac",
        "collective_frac", "gpu_frac", "data_frac", NULL};
    int state;

    if (!json_is_object(o))
        return PROTO_E_FIELD_TYPE;
    TRY(check_keys(o, keys));
    TRY(get_u32(o, "rank", &b->rank));
    TRY(get_enum(o, "state", proto_rank_state_json, 0, PROTO_RANK_STATE_MAX,
                 &state));
    b->state = (enum proto_rank_state)state;
    TRY(get_u64(o, "step", &b->step));
    TRY(get_number(o, "loss", 1, &b->loss));
    TRY(get_number(o, "tokens_per_s", 0, &b->tokens_per_s));
    TRY(get_number(o, "comm_frac", 0, &b->comm_frac));
    /* Optional (absent = 0): what the rank measured of its plan. */
    b->step_bytes = b->peak_mem = 0;
    if (json_object_get(o, "step_bytes"))
        TRY(get_u64(o, "step_bytes", &b->step_bytes));
    if (json_object_get(o, "peak_mem"))
        TRY(get_u64(o, "peak_mem", &b->peak_mem));
    /* Optional (absent = 0, no checkpoint): ranks without checkpoints omit it. */
    b->checkpoint_step = 0;
    if (json_object_get(o, "checkpoint_step"))
        TRY(get_u64(o, "checkpoint_step", &b->checkpoint_step));
    /* Optional (absent = false): only agents send it, and only as true. */
    b->silent = 0;
    json_t *silent = json_object_get(o, "silent");
    if (silent) {
        if (!json_is_boolean(silent))
            return PROTO_E_FIELD_TYPE;
        b->silent = json_is_true(silent);
    }
    /* Optional (absent = false): ranks that can join the next generation in place. */
    b->rejoin = 0;
    json_t *rejoin = json_object_get(o, "rejoin");
    if (rejoin) {
        if (!json_is_boolean(rejoin))
            return PROTO_E_FIELD_TYPE;
        b->rejoin = json_is_true(rejoin);
    }
    /* Optional (absent = false): left the generation at a step boundary on COMMAND yield. */
    b->yielded = 0;
    json_t *yielded = json_object_get(o, "yielded");
    if (yielded) {
        if (!json_is_boolean(yielded))
            return PROTO_E_FIELD_TYPE;
        b->yielded = json_is_true(yielded);
    }
    /* Optional pair: how this generation's state was restored, and at which step. */
    int from = PROTO_RESTORE_NONE;
    b->restore_step = 0;
    if (json_object_get(o, "restore_from")) {
        TRY(get_enum(o, "restore_from", proto_restore_json, 1, PROTO_RESTORE_MAX, &from));
        TRY(get_u64(o, "restore_step", &b->restore_step));
    } else if (json_object_get(o, "restore_step")) {
        return PROTO_E_MISSING;
    }
    b->restore_from = (enum proto_restore)from;
    /* Optional: the rank's own account of its progress and of where it is. */
    b->step_s = 0;
    if (json_object_get(o, "step_s"))
        TRY(get_number(o, "step_s", 0, &b->step_s));
    b->has_step_age = json_object_get(o, "step_age_ms") != NULL;
    b->step_age_ms = 0;
    if (b->has_step_age)
        TRY(get_u64(o, "step_age_ms", &b->step_age_ms));
    b->total_steps = 0;
    if (json_object_get(o, "total_steps"))
        TRY(get_u64(o, "total_steps", &b->total_steps));
    TRY(get_label(o, "where", b->where, sizeof(b->where)));
    TRY(get_label(o, "waiting", b->waiting, sizeof(b->waiting)));
    /* Optional group: the time split; its shares come with split_s or not at all. */
    b->split_s = 0;
    b->split_steps = 0;
    memset(b->split, 0, sizeof(b->split));
    if (json_object_get(o, "split_s")) {
        TRY(get_number(o, "split_s", 0, &b->split_s));
        if (!(b->split_s > 0))
            return PROTO_E_RANGE; /* present means a window was measured */
        for (int k = 0; k < PROTO_SPLIT_NKINDS; k++)
            TRY(get_number(o, proto_split_json[k], 0, &b->split[k]));
        if (json_object_get(o, "split_steps"))
            TRY(get_u64(o, "split_steps", &b->split_steps));
    } else {
        if (json_object_get(o, "split_steps"))
            return PROTO_E_MISSING;
        for (int k = 0; k < PROTO_SPLIT_NKINDS; k++)
            if (json_object_get(o, proto_split_json[k]))
                return PROTO_E_MISSING;
    }
    return get_bool(o, "stopped", &b->stopped);
}

/* An array of checkpoint names (already bounded by its caller) into names[]. */
static int dec_names(json_t *arr, char (*names)[PROTO_CKPT_NAME_MAX], uint32_t *n)
{
    for (size_t i = 0; i < json_array_size(arr); i++) {
        json_t *e = json_array_get(arr, i);
        if (!json_is_string(e))
            return PROTO_E_FIELD_TYPE;
        if (json_string_length(e) == 0 || json_string_length(e) >= PROTO_CKPT_NAME_MAX)
            return PROTO_E_RANGE;
        memcpy(names[i], json_string_value(e), json_string_length(e) + 1);
        (*n)++;
    }
    return 0;
}

static int dec_heartbeat(json_t *o, struct proto_heartbeat *h)
{
    static const char *const keys[] = {"generation", "seq", "free_port", "ack", "ranks", "memory_checkpoints",
                                       "memory_replica_of", "memory_replicas", "spare_note",
                                       "memory_drained", NULL};
    json_t *ranks, *mem;

    TRY(check_keys(o, keys));
    TRY(get_u64(o, "generation", &h->generation));
    TRY(get_u64(o, "seq", &h->seq));
    h->free_port = 0; /* optional */
    if (json_object_get(o, "free_port"))
        TRY(get_u32(o, "free_port", &h->free_port));
    h->no_ack = 0; /* optional: absent = answer it */
    if (json_object_get(o, "ack")) {
        int ack;
        TRY(get_bool(o, "ack", &ack));
        h->no_ack = !ack;
    }
    TRY(get_array(o, "ranks", PROTO_MAX_LOCAL_RANKS, &ranks));
    h->nranks = (uint32_t)json_array_size(ranks);
    for (uint32_t i = 0; i < h->nranks; i++) {
        memset(&h->ranks[i], 0, sizeof(h->ranks[i])); /* proto_decode leaves the entries as they were */
        TRY(dec_beat(json_array_get(ranks, i), &h->ranks[i]));
    }
    h->has_memckpt = json_object_get(o, "memory_checkpoints") != NULL; /* optional */
    h->nmemckpt = 0;
    if (h->has_memckpt) {
        TRY(get_array(o, "memory_checkpoints", PROTO_MEMCKPT_MAX, &mem));
        TRY(dec_names(mem, h->memckpt, &h->nmemckpt));
    }
    TRY(get_label(o, "spare_note", h->spare_note, sizeof(h->spare_note))); /* optional */
    h->has_drained = json_object_get(o, "memory_drained") != NULL; /* optional */
    h->ndrained = 0;
    if (h->has_drained) {
        TRY(get_array(o, "memory_drained", PROTO_MEMCKPT_MAX, &mem));
        TRY(dec_names(mem, h->drained, &h->ndrained));
    }
    /* optional, together: whose replicas it holds, and which */
    TRY(get_label(o, "memory_replica_of", h->replica_of, sizeof(h->replica_of)));
    h->nreplica = 0;
    if (!h->replica_of[0])
        return json_object_get(o, "memory_replicas") ? PROTO_E_RANGE : 0;
    TRY(get_array(o, "memory_replicas", PROTO_MEMCKPT_MAX, &mem));
    return dec_names(mem, h->replica, &h->nreplica);
}

static int dec_rank_exit(json_t *o, struct proto_rank_exit *e)
{
    static const char *const keys[] = {"generation", "rank", "exit_code",
        "signal", "reason", "detail", NULL};

    TRY(check_keys(o, keys));
    TRY(get_u64(o, "generation", &e->generation));
    TRY(get_u32(o, "rank", &e->rank));
    TRY(get_i32(o, "exit_code", &e->exit_code));
    TRY(get_i32(o, "signal", &e->signal));
    /* Optional (absent = ""): what the rank said about its failure. */
    e->reason[0] = e->detail[0] = '\0';
    if (json_object_get(o, "reason"))
        TRY(get_str(o, "reason", e->reason, sizeof(e->reason)));
    if (json_object_get(o, "detail"))
        TRY(get_str(o, "detail", e->detail, sizeof(e->detail)));
    return PROTO_OK;
}

static int dec_command(json_t *o, struct proto_command_msg *c)
{
    static const char *const keys[] = {"generation", "action", "term", NULL};
    int action;

    TRY(check_keys(o, keys));
    TRY(get_u64(o, "generation", &c->generation));
    TRY(get_term(o, &c->term));
    TRY(get_enum(o, "action", proto_command_json, 1, PROTO_CMD_MAX, &action));
    c->action = (enum proto_command)action;
    return 0;
}

static int dec_log_request(json_t *o, struct proto_log_request *q)
{
    static const char *const keys[] = {"id", "rank", "generation", "offset", "tail",
        "max", NULL};

    TRY(check_keys(o, keys));
    TRY(get_u32(o, "id", &q->id));
    TRY(get_u32(o, "rank", &q->rank));
    TRY(get_u64(o, "generation", &q->generation));
    TRY(get_u64(o, "offset", &q->offset));
    TRY(get_u32(o, "tail", &q->tail));
    return get_u32(o, "max", &q->max);
}

static int dec_log_data(json_t *o, struct proto_log_data *d)
{
    static const char *const keys[] = {"id", "rank", "generation", "newest", "offset",
        "next_offset", "size", "error", "reason", "data", NULL};
    int error;

    TRY(check_keys(o, keys));
    TRY(get_u32(o, "id", &d->id));
    TRY(get_u32(o, "rank", &d->rank));
    TRY(get_u64(o, "generation", &d->generation));
    TRY(get_u64(o, "newest", &d->newest));
    TRY(get_u64(o, "offset", &d->offset));
    TRY(get_u64(o, "next_offset", &d->next_offset));
    TRY(get_u64(o, "size", &d->size));
    TRY(get_enum(o, "error", proto_log_error_json, PROTO_LOG_OK, PROTO_LOG_ERROR_MAX, &error));
    d->error = (enum proto_log_error)error;
    TRY(get_str(o, "reason", d->reason, sizeof(d->reason)));
    return get_owned_str(o, "data", PROTO_LOG_MAX, &d->data);
}

static int dec_stacks(json_t *o, struct proto_stacks *k)
{
    static const char *const keys[] = {"generation", "rank", "pid", "stopped", "text", "error", "fr", "ras", NULL};

    TRY(check_keys(o, keys));
    TRY(get_u64(o, "generation", &k->generation));
    TRY(get_u32(o, "rank", &k->rank));
    TRY(get_u32(o, "pid", &k->pid));
    TRY(get_bool(o, "stopped", &k->stopped));
    TRY(get_owned_str(o, "text", PROTO_STACKS_MAX, &k->text));
    if (json_object_get(o, "fr")) /* optional */
        TRY(get_owned_str(o, "fr", PROTO_FR_MAX, &k->fr));
    if (json_object_get(o, "ras")) /* optional */
        TRY(get_owned_str(o, "ras", PROTO_RAS_MAX, &k->ras));
    k->error[0] = '\0'; /* optional */
    return json_object_get(o, "error") ? get_str(o, "error", k->error, sizeof(k->error)) : 0;
}

/* ---- base64 (RFC 4648, with padding), strict: what MEM_FILE's data is sent as ---- */

static int b64_value(unsigned char c)
{
    if (c >= 'A' && c <= 'Z')
        return c - 'A';
    if (c >= 'a' && c <= 'z')
        return c - 'a' + 26;
    if (c >= '0' && c <= '9')
        return c - '0' + 52;
    return c == '+' ? 62 : c == '/' ? 63 : -1;
}

/* s[0..n) into out (room for n / 4 * 3); *len the bytes. Anything but
 * canonical padded base64 is PROTO_E_RANGE. */
static int b64_decode(const char *s, size_t n, uint8_t *out, uint32_t *len)
{
    size_t o = 0;
    if (n % 4)
        return PROTO_E_RANGE;
    for (size_t i = 0; i < n; i += 4) {
        int pad = (s[i + 3] == '=') + (s[i + 2] == '=' && s[i + 3] == '=');
        if (pad && i + 4 != n)
            return PROTO_E_RANGE;
        int v[4];
        for (int k = 0; k < 4 - pad; k++)
            if ((v[k] = b64_value((unsigned char)s[i + k])) < 0)
                return PROTO_E_RANGE;
        uint32_t w = (uint32_t)v[0] << 18 | (uint32_t)v[1] << 12 | (pad < 2 ? (uint32_t)v[2] << 6 : 0) |
                     (pad < 1 ? (uint32_t)v[3] : 0);
        if ((pad == 1 && (w & 0xff)) || (pad == 2 && (w & 0xffff)))
            return PROTO_E_RANGE; /* bits past the data: not the canonical form */
        out[o++] = (uint8_t)(w >> 16);
        if (pad < 2)
            out[o++] = (uint8_t)(w >> 8);
        if (pad < 1)
            out[o++] = (uint8_t)w;
    }
    *len = (uint32_t)o;
    return 0;
}

static char *b64_encode(const uint8_t *p, uint32_t n)
{
    static const char digits[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    char *s = malloc((size_t)(n + 2) / 3 * 4 + 1), *o = s;
    if (!s)
        return NULL;
    for (uint32_t i = 0; i < n; i += 3) {
        uint32_t w = (uint32_t)p[i] << 16 | (i + 1 < n ? (uint32_t)p[i + 1] << 8 : 0) | (i + 2 < n ? p[i + 2] : 0);
        *o++ = digits[w >> 18 & 63];
        *o++ = digits[w >> 12 & 63];
        *o++ = i + 1 < n ? digits[w >> 6 & 63] : '=';
        *o++ = i + 2 < n ? digits[w & 63] : '=';
    }
    *o = '\0';
    return s;
}

static int dec_mem_file(json_t *o, struct proto_mem_file *f)
{
    static const char *const keys[] = {"owner", "tag", "restore", "begin", "end", "path", "offset", "size", "data",
                                       NULL};

    TRY(check_keys(o, keys));
    TRY(get_str(o, "owner", f->owner, sizeof(f->owner)));
    TRY(get_str(o, "tag", f->tag, sizeof(f->tag)));
    TRY(get_bool(o, "restore", &f->restore));
    TRY(get_bool(o, "begin", &f->begin));
    TRY(get_bool(o, "end", &f->end));
    TRY(get_str(o, "path", f->path, sizeof(f->path)));
    TRY(get_u64(o, "offset", &f->offset));
    TRY(get_u64(o, "size", &f->size));
    json_t *v = json_object_get(o, "data");
    if (!v)
        return PROTO_E_MISSING;
    if (!json_is_string(v))
        return PROTO_E_FIELD_TYPE;
    size_t n = json_string_length(v);
    if (n > (size_t)PROTO_MEMDATA_MAX / 3 * 4)
        return PROTO_E_RANGE;
    if (n == 0)
        return 0;
    f->data = malloc(n / 4 * 3); /* freed by proto_msg_clear */
    if (!f->data)
        return PROTO_E_NOMEM;
    return b64_decode(json_string_value(v), n, f->data, &f->len);
}

static int dec_mem_fetch(json_t *o, struct proto_mem_fetch *f)
{
    static const char *const keys[] = {"owner", "tag", NULL};

    TRY(check_keys(o, keys));
    TRY(get_str(o, "owner", f->owner, sizeof(f->owner)));
    return get_str(o, "tag", f->tag, sizeof(f->tag));
}

static int dec_body(json_t *o, struct proto_msg *m)
{
    switch (m->type) {
    case PROTO_HELLO: return dec_hello(o, &m->u.hello);
    case PROTO_CHALLENGE: return dec_challenge(o, &m->u.challenge);
    case PROTO_RESPONSE: return dec_response(o, &m->u.response);
    case PROTO_WELCOME: return dec_welcome(o, &m->u.welcome);
    case PROTO_REJECT:
        return dec_code_reason(o, m->u.reject.code, sizeof(m->u.reject.code),
                               m->u.reject.reason, sizeof(m->u.reject.reason));
    case PROTO_ASSIGN: return dec_assign(o, &m->u.assign);
    case PROTO_UNIQUE_ID: return dec_unique_id(o, &m->u.unique_id);
    case PROTO_HEARTBEAT: return dec_heartbeat(o, &m->u.heartbeat);
    case PROTO_RANK_EXIT: return dec_rank_exit(o, &m->u.rank_exit);
    case PROTO_COMMAND: return dec_command(o, &m->u.command);
    case PROTO_ERROR:
        return dec_code_reason(o, m->u.error.code, sizeof(m->u.error.code),
                               m->u.error.reason, sizeof(m->u.error.reason));
    case PROTO_LOG_REQUEST: return dec_log_request(o, &m->u.log_request);
    case PROTO_LOG_DATA: return dec_log_data(o, &m->u.log_data);
    case PROTO_PREFLIGHT: return dec_preflight(o, &m->u.preflight);
    case PROTO_STACKS: return dec_stacks(o, &m->u.stacks);
    case PROTO_MEM_FILE: return dec_mem_file(o, &m->u.mem_file);
    case PROTO_MEM_FETCH: return dec_mem_fetch(o, &m->u.mem_fetch);
    }
    return PROTO_E_TYPE;
}

/* The payload of a complete frame whose header is valid, through jansson. */
int proto_decode_payload_json(const uint8_t *p, size_t n, struct proto_msg *m)
{
    json_error_t jerr;
    json_t *root;
    int rc;

    if (n == 0)
        return PROTO_E_JSON;
    /* EOF check off so that jerr.position says where the object ended:
     * anything after it, whitespace included, is an error. */
    root = json_loadb((const char *)p, n,
                      JSON_REJECT_DUPLICATES | JSON_DISABLE_EOF_CHECK, &jerr);
    if (!root)
        return json_error_code(&jerr) == json_error_out_of_memory
                   ? PROTO_E_NOMEM : PROTO_E_JSON;
    if (!json_is_object(root) || jerr.position < 0 || (size_t)jerr.position != n)
        rc = PROTO_E_JSON;
    else
        rc = dec_body(root, m);
    if (rc == 0)
        rc = proto_check(m);
    json_decref(root);
    return rc;
}

static uint32_t get_be32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

static uint16_t get_be16(const uint8_t *p)
{
    return (uint16_t)(p[0] << 8 | p[1]);
}

int proto__header(const uint8_t *buf, size_t len, uint32_t max, uint32_t *plen, uint16_t *type)
{
    if (len < PROTO_HEADER_LEN)
        return PROTO_NEED_MORE;
    *plen = get_be32(buf);
    *type = get_be16(buf + 6);
    return *plen > max ? PROTO_E_OVERSIZE
           : get_be16(buf + 4) != PROTO_VERSION ? PROTO_E_VERSION
           : *type < PROTO_HELLO || *type > PROTO_TYPE_MAX ? PROTO_E_TYPE : PROTO_OK;
}

int proto__decode_body(uint16_t type, const uint8_t *p, size_t n, struct proto_msg *msg)
{
    int rc;

    /* A heartbeat's decoders clear each rank entry they fill (proto_decode's contract). */
    if (type == PROTO_HEARTBEAT) {
        proto_heartbeat_start(msg);
    } else {
        memset(msg, 0, sizeof(*msg));
        msg->type = (enum proto_type)type;
    }
    /* Heartbeats, nearly every frame musterd reads, take the fast path when they can. */
    if (msg->type == PROTO_HEARTBEAT && fastbeat_decode(p, n, msg) == 0)
        rc = PROTO_OK;
    else
        rc = proto_decode_payload_json(p, n, msg);
    if (rc < 0) {
        proto_msg_clear(msg);
        memset(msg, 0, sizeof(*msg));
    }
    return rc;
}

int proto_decode(const uint8_t *buf, size_t len, struct proto_msg *msg,
                 size_t *consumed)
{
    uint32_t plen;
    uint16_t type;
    int rc;

    /* Not the whole message for a frame not all here (a read loop asks once
     * more after its last frame): only its type, so that it owns nothing. */
    msg->type = (enum proto_type)0;
    if (consumed)
        *consumed = 0;
    rc = proto__header(buf, len, PROTO_MAX_PAYLOAD, &plen, &type);
    if (rc == PROTO_NEED_MORE)
        return rc;
    if (rc < 0) {
        memset(msg, 0, sizeof(*msg));
        return rc;
    }
    if (len - PROTO_HEADER_LEN < plen)
        return PROTO_NEED_MORE;
    rc = proto__decode_body(type, buf + PROTO_HEADER_LEN, plen, msg);
    if (rc == PROTO_E_NOMEM)
        return rc;
    if (consumed)
        *consumed = PROTO_HEADER_LEN + (size_t)plen;
    return rc;
}

int proto_decode_eof(const uint8_t *buf, size_t len, struct proto_msg *msg,
                     size_t *consumed)
{
    int rc = proto_decode(buf, len, msg, consumed);

    return rc == PROTO_NEED_MORE && len > 0 ? PROTO_E_TRUNCATED : rc;
}

void proto_heartbeat_start(struct proto_msg *msg)
{
    msg->type = PROTO_HEARTBEAT;
    memset(&msg->u.heartbeat, 0, offsetof(struct proto_heartbeat, ranks));
}

void proto_msg_clear(struct proto_msg *msg)
{
    if (msg && msg->type == PROTO_ASSIGN && msg->u.assign.job) {
        json_decref(msg->u.assign.job);
        msg->u.assign.job = NULL;
    }
    if (msg && msg->type == PROTO_WELCOME && msg->u.welcome.job) {
        json_decref(msg->u.welcome.job);
        msg->u.welcome.job = NULL;
    }
    if (msg && msg->type == PROTO_LOG_DATA) {
        free(msg->u.log_data.data);
        msg->u.log_data.data = NULL;
    }
    if (msg && msg->type == PROTO_STACKS) {
        free(msg->u.stacks.text);
        msg->u.stacks.text = NULL;
        free(msg->u.stacks.fr);
        msg->u.stacks.fr = NULL;
        free(msg->u.stacks.ras);
        msg->u.stacks.ras = NULL;
    }
    if (msg && msg->type == PROTO_MEM_FILE) {
        free(msg->u.mem_file.data);
        msg->u.mem_file.data = NULL;
        msg->u.mem_file.len = 0;
    }
}

/* ---- encoding (the message has passed proto_check) ---- */

/* Takes v; a NULL v is a failed jansson allocation. */
static int put(json_t *o, const char *key, json_t *v)
{
    return v && json_object_set_new(o, key, v) == 0 ? 0 : PROTO_E_NOMEM;
}

static int put_uint(json_t *o, const char *key, uint64_t x)
{
    return put(o, key, json_integer((json_int_t)x));
}

static int put_hex(json_t *o, const char *key, const uint8_t *bytes, size_t n)
{
    static const char digits[] = "0123456789abcdef";
    char text[2 * PROTO_UID_LEN + 1];

    for (size_t i = 0; i < n; i++) {
        text[2 * i] = digits[bytes[i] >> 4];
        text[2 * i + 1] = digits[bytes[i] & 15];
    }
    text[2 * n] = '\0';
    return put(o, key, json_string(text));
}

static int enc_hello(json_t *o, const struct proto_hello *h)
{
    json_t *devices = json_array();

    TRY(put(o, "node", json_string(h->node)));
    TRY(put(o, "addr", json_string(h->addr)));
    TRY(put(o, "kind", json_string(proto_device_kind_json[h->kind])));
    TRY(put(o, "devices", devices));
    for (uint32_t i = 0; i < h->ndevices; i++)
        if (json_array_append_new(devices, json_integer(h->devices[i])) != 0)
            return PROTO_E_NOMEM;
    TRY(put_uint(o, "device_mem_mb", h->device_mem_mb));
    TRY(put_uint(o, "generation", h->generation));
    TRY(put_uint(o, "free_port", h->free_port));
    TRY(put(o, "agent_version", json_string(h->agent_version)));
    TRY(put_hex(o, "nonce", h->nonce, PROTO_NONCE_LEN));
    if (h->session)
        TRY(put_uint(o, "session", h->session));
    if (h->ngpus) {
        json_t *gpus = json_array();
        TRY(put(o, "gpus", gpus));
        for (uint32_t i = 0; i < h->ngpus; i++) {
            json_t *g = json_object();
            if (!g || json_array_append_new(gpus, g) != 0)
                return PROTO_E_NOMEM;
            TRY(put(g, "name", json_string(h->gpus[i].name)));
            TRY(put_uint(g, "total_mb", h->gpus[i].total_mb));
            TRY(put_uint(g, "free_mb", h->gpus[i].free_mb));
        }
    }
    if (h->host_mem_mb)
        TRY(put_uint(o, "host_mem_mb", h->host_mem_mb));
    if (h->domain[0])
        TRY(put(o, "domain", json_string(h->domain)));
    return h->preflight ? put(o, "preflight", json_true()) : PROTO_OK;
}

static int enc_slot(json_t *ranks, const struct proto_rank_slot *s)
{
    json_t *o = json_object();

    if (!o || json_array_append_new(ranks, o) != 0)
        return PROTO_E_NOMEM;
    TRY(put_uint(o, "rank", s->rank));
    TRY(put_uint(o, "local_rank", s->local_rank));
    return put_uint(o, "device", s->device);
}

/* Every field but the job, which comes last. */
static int enc_assign_head(json_t *o, const struct proto_assign *a)
{
    json_t *ranks = json_array();

    TRY(put_uint(o, "generation", a->generation));
    TRY(put_uint(o, "world_size", a->world_size));
    TRY(put(o, "ranks", ranks));
    for (uint32_t i = 0; i < a->nranks; i++)
        TRY(enc_slot(ranks, &a->ranks[i]));
    TRY(put_uint(o, "node_rank", a->node_rank));
    TRY(put_uint(o, "nnodes", a->nnodes));
    TRY(put_uint(o, "restart_count", a->restart_count));
    TRY(put(o, "master_addr", json_string(a->master_addr)));
    TRY(put_uint(o, "master_port", a->master_port));
    if (a->has_memckpt)
        TRY(put(o, "memory_checkpoint", json_string(a->memckpt)));
    if (a->memckpt_from[0])
        TRY(put(o, "memory_checkpoint_from", json_string(a->memckpt_from)));
    if (a->memckpt_drained)
        TRY(put(o, "memory_checkpoint_drained", json_true()));
    return a->term ? put_uint(o, "term", a->term) : PROTO_OK;
}

static int enc_assign(json_t *o, const struct proto_assign *a)
{
    TRY(enc_assign_head(o, a));
    /* json_object_set takes its own reference: the caller keeps theirs. */
    return json_object_set(o, "job", a->job) == 0 ? 0 : PROTO_E_NOMEM;
}

static int enc_beat(json_t *ranks, const struct proto_rank_beat *b)
{
    json_t *o = json_object();

    if (!o || json_array_append_new(ranks, o) != 0)
        return PROTO_E_NOMEM;
    TRY(put_uint(o, "rank", b->rank));
    TRY(put(o, "state", json_string(proto_rank_state_json[b->state])));
    TRY(put_uint(o, "step", b->step));
    TRY(put(o, "loss", isfinite(b->loss) ? json_real(b->loss) : json_null()));
    TRY(put(o, "tokens_per_s", json_real(b->tokens_per_s)));
    TRY(put(o, "comm_frac", json_real(b->comm_frac)));
    if (b->checkpoint_step)
        TRY(put_uint(o, "checkpoint_step", b->checkpoint_step));
    if (b->step_bytes)
        TRY(put_uint(o, "step_bytes", b->step_bytes));
    if (b->peak_mem)
        TRY(put_uint(o, "peak_mem", b->peak_mem));
    if (b->rejoin)
        TRY(put(o, "rejoin", json_true()));
    if (b->yielded)
        TRY(put(o, "yielded", json_true()));
    if (b->restore_from != PROTO_RESTORE_NONE) {
        TRY(put(o, "restore_from", json_string(proto_restore_json[b->restore_from])));
        TRY(put_uint(o, "restore_step", b->restore_step));
    }
    if (b->silent)
        TRY(put(o, "silent", json_true()));
    if (b->step_s != 0)
        TRY(put(o, "step_s", json_real(b->step_s)));
    if (b->has_step_age)
        TRY(put_uint(o, "step_age_ms", b->step_age_ms));
    if (b->total_steps)
        TRY(put_uint(o, "total_steps", b->total_steps));
    if (b->where[0])
        TRY(put(o, "where", json_string(b->where)));
    if (b->waiting[0])
        TRY(put(o, "waiting", json_string(b->waiting)));
    if (b->split_s > 0) {
        TRY(put(o, "split_s", json_real(b->split_s)));
        if (b->split_steps)
            TRY(put_uint(o, "split_steps", b->split_steps));
        for (int k = 0; k < PROTO_SPLIT_NKINDS; k++)
            TRY(put(o, proto_split_json[k], json_real(b->split[k])));
    }
    return b->stopped ? put(o, "stopped", json_true()) : PROTO_OK;
}

static int put_names(json_t *o, const char *key, const char (*names)[PROTO_CKPT_NAME_MAX], uint32_t n)
{
    json_t *arr = json_array();
    TRY(put(o, key, arr));
    for (uint32_t i = 0; i < n && i < PROTO_MEMCKPT_MAX; i++)
        if (json_array_append_new(arr, json_string(names[i])) != 0)
            return PROTO_E_NOMEM;
    return 0;
}

static int enc_heartbeat(json_t *o, const struct proto_heartbeat *h)
{
    json_t *ranks = json_array();

    TRY(put_uint(o, "generation", h->generation));
    TRY(put_uint(o, "seq", h->seq));
    if (h->free_port)
        TRY(put_uint(o, "free_port", h->free_port));
    if (h->no_ack)
        TRY(put(o, "ack", json_false()));
    TRY(put(o, "ranks", ranks));
    for (uint32_t i = 0; i < h->nranks; i++)
        TRY(enc_beat(ranks, &h->ranks[i]));
    if (h->has_memckpt)
        TRY(put_names(o, "memory_checkpoints", h->memckpt, h->nmemckpt));
    if (h->spare_note[0])
        TRY(put(o, "spare_note", json_string(h->spare_note)));
    if (h->has_drained)
        TRY(put_names(o, "memory_drained", h->drained, h->ndrained));
    if (!h->replica_of[0])
        return 0;
    TRY(put(o, "memory_replica_of", json_string(h->replica_of)));
    return put_names(o, "memory_replicas", h->replica, h->nreplica);
}

static int enc_code_reason(json_t *o, const char *code, const char *reason)
{
    TRY(put(o, "code", json_string(code)));
    return put(o, "reason", json_string(reason));
}

static int enc_log_request(json_t *o, const struct proto_log_request *q)
{
    TRY(put_uint(o, "id", q->id));
    TRY(put_uint(o, "rank", q->rank));
    TRY(put_uint(o, "generation", q->generation));
    TRY(put_uint(o, "offset", q->offset));
    TRY(put_uint(o, "tail", q->tail));
    return put_uint(o, "max", q->max);
}

static int enc_log_data(json_t *o, const struct proto_log_data *d)
{
    TRY(put_uint(o, "id", d->id));
    TRY(put_uint(o, "rank", d->rank));
    TRY(put_uint(o, "generation", d->generation));
    TRY(put_uint(o, "newest", d->newest));
    TRY(put_uint(o, "offset", d->offset));
    TRY(put_uint(o, "next_offset", d->next_offset));
    TRY(put_uint(o, "size", d->size));
    TRY(put(o, "error", json_string(proto_log_error_json[d->error])));
    TRY(put(o, "reason", json_string(d->reason)));
    return put(o, "data", json_string(d->data ? d->data : ""));
}

static int enc_body(json_t *o, const struct proto_msg *m)
{
    switch (m->type) {
    case PROTO_HELLO: return enc_hello(o, &m->u.hello);
    case PROTO_CHALLENGE:
        TRY(put_hex(o, "nonce", m->u.challenge.nonce, PROTO_NONCE_LEN));
        return put_hex(o, "hmac", m->u.challenge.hmac, PROTO_HMAC_LEN);
    case PROTO_RESPONSE:
        return put_hex(o, "hmac", m->u.response.hmac, PROTO_HMAC_LEN);
    case PROTO_WELCOME:
        TRY(put_uint(o, "heartbeat_interval_ms", m->u.welcome.heartbeat_interval_ms));
        TRY(put_uint(o, "heartbeat_timeout_ms", m->u.welcome.heartbeat_timeout_ms));
        TRY(put_uint(o, "lease_ms", m->u.welcome.lease_ms));
        if (m->u.welcome.session)
            TRY(put_uint(o, "session", m->u.welcome.session));
        if (m->u.welcome.time_ms)
            TRY(put_uint(o, "time_ms", m->u.welcome.time_ms));
        if (m->u.welcome.term)
            TRY(put_uint(o, "term", m->u.welcome.term));
        /* json_object_set takes its own reference: the caller keeps theirs. */
        return !m->u.welcome.job || json_object_set(o, "job", m->u.welcome.job) == 0 ? 0 : PROTO_E_NOMEM;
    case PROTO_REJECT:
        return enc_code_reason(o, m->u.reject.code, m->u.reject.reason);
    case PROTO_ASSIGN: return enc_assign(o, &m->u.assign);
    case PROTO_UNIQUE_ID:
        TRY(put_uint(o, "generation", m->u.unique_id.generation));
        TRY(put_hex(o, "id", m->u.unique_id.id, PROTO_UID_LEN));
        return m->u.unique_id.term ? put_uint(o, "term", m->u.unique_id.term) : PROTO_OK;
    case PROTO_HEARTBEAT: return enc_heartbeat(o, &m->u.heartbeat);
    case PROTO_RANK_EXIT:
        TRY(put_uint(o, "generation", m->u.rank_exit.generation));
        TRY(put_uint(o, "rank", m->u.rank_exit.rank));
        TRY(put(o, "exit_code", json_integer(m->u.rank_exit.exit_code)));
        TRY(put(o, "signal", json_integer(m->u.rank_exit.signal)));
        if (m->u.rank_exit.reason[0])
            TRY(put(o, "reason", json_string(m->u.rank_exit.reason)));
        return m->u.rank_exit.detail[0] ? put(o, "detail", json_string(m->u.rank_exit.detail)) : PROTO_OK;
    case PROTO_COMMAND:
        TRY(put_uint(o, "generation", m->u.command.generation));
        TRY(put(o, "action", json_string(proto_command_json[m->u.command.action])));
        return m->u.command.term ? put_uint(o, "term", m->u.command.term) : PROTO_OK;
    case PROTO_ERROR:
        return enc_code_reason(o, m->u.error.code, m->u.error.reason);
    case PROTO_LOG_REQUEST: return enc_log_request(o, &m->u.log_request);
    case PROTO_LOG_DATA: return enc_log_data(o, &m->u.log_data);
    case PROTO_PREFLIGHT:
        TRY(put(o, "fit", json_boolean(m->u.preflight.fit)));
        TRY(put(o, "reason", json_string(m->u.preflight.reason)));
        if (m->u.preflight.has_checkpoint)
            TRY(put(o, "checkpoint", json_string(m->u.preflight.checkpoint)));
        return m->u.preflight.trainer ? put(o, "trainer", json_true()) : PROTO_OK;
    case PROTO_STACKS:
        TRY(put_uint(o, "generation", m->u.stacks.generation));
        TRY(put_uint(o, "rank", m->u.stacks.rank));
        TRY(put_uint(o, "pid", m->u.stacks.pid));
        if (m->u.stacks.stopped)
            TRY(put(o, "stopped", json_true()));
        TRY(put(o, "text", json_string(m->u.stacks.text ? m->u.stacks.text : "")));
        if (m->u.stacks.fr && m->u.stacks.fr[0])
            TRY(put(o, "fr", json_string(m->u.stacks.fr)));
        if (m->u.stacks.ras && m->u.stacks.ras[0])
            TRY(put(o, "ras", json_string(m->u.stacks.ras)));
        return m->u.stacks.error[0] ? put(o, "error", json_string(m->u.stacks.error)) : PROTO_OK;
    case PROTO_MEM_FILE: {
        const struct proto_mem_file *f = &m->u.mem_file;
        TRY(put(o, "owner", json_string(f->owner)));
        TRY(put(o, "tag", json_string(f->tag)));
        if (f->restore)
            TRY(put(o, "restore", json_true()));
        if (f->begin)
            TRY(put(o, "begin", json_true()));
        if (f->end)
            TRY(put(o, "end", json_true()));
        TRY(put(o, "path", json_string(f->path)));
        TRY(put_uint(o, "offset", f->offset));
        TRY(put_uint(o, "size", f->size));
        char *b64 = b64_encode(f->data, f->len);
        if (!b64)
            return PROTO_E_NOMEM;
        json_t *v = json_stringn_nocheck(b64, strlen(b64));
        free(b64);
        return put(o, "data", v);
    }
    case PROTO_MEM_FETCH:
        TRY(put(o, "owner", json_string(m->u.mem_fetch.owner)));
        return put(o, "tag", json_string(m->u.mem_fetch.tag));
    }
    return PROTO_E_TYPE;
}

/*
 * An ASSIGN whose job comes rendered (job_text), as the bytes jansson writes
 * for it: its fields in table order, then "job" last. A daemon sends one to
 * every node when a generation opens. The fields are integers and an
 * address of printable ASCII, which is written as it is unless it holds a
 * character JSON escapes ('"' or '\\': jansson writes the fields then).
 */
static int enc_assign_rendered(const struct proto_assign *a, uint8_t *out, size_t cap)
{
    static const char job_key[] = ",\"job\":";
    char head[8192]; /* 64 slots of at most 65 bytes, and the rest: under 4.5 KiB */
    size_t n = 0;

    if (strpbrk(a->master_addr, "\"\\") || a->has_memckpt) { /* text that needs escaping: jansson writes it */
        json_t *root = json_object();
        int rc = root ? enc_assign_head(root, a) : PROTO_E_NOMEM;
        if (rc == 0 && ((n = json_dumpb(root, head, sizeof(head), JSON_COMPACT)) == 0 || n > sizeof(head)))
            rc = PROTO_E_NOMEM;
        json_decref(root);
        if (rc < 0)
            return rc;
        n--; /* its closing brace: the job follows */
    } else {
        n += (size_t)snprintf(head, sizeof(head), "{\"generation\":%llu,\"world_size\":%u,\"ranks\":[",
                              (unsigned long long)a->generation, a->world_size);
        for (uint32_t i = 0; i < a->nranks; i++)
            n += (size_t)snprintf(head + n, sizeof(head) - n, "%s{\"rank\":%u,\"local_rank\":%u,\"device\":%u}",
                                  i ? "," : "", a->ranks[i].rank, a->ranks[i].local_rank, a->ranks[i].device);
        n += (size_t)snprintf(head + n, sizeof(head) - n,
                              "],\"node_rank\":%u,\"nnodes\":%u,\"restart_count\":%u,\"master_addr\":\"%s\","
                              "\"master_port\":%u",
                              a->node_rank, a->nnodes, a->restart_count, a->master_addr, a->master_port);
        if (a->term)
            n += (size_t)snprintf(head + n, sizeof(head) - n, ",\"term\":%llu", (unsigned long long)a->term);
    }
    size_t jl = strlen(a->job_text), total = n + (sizeof(job_key) - 1) + jl + 1;
    if (out && total <= cap) {
        memcpy(out, head, n);
        memcpy(out + n, job_key, sizeof(job_key) - 1);
        memcpy(out + n + sizeof(job_key) - 1, a->job_text, jl);
        out[total - 1] = '}';
    }
    return total > INT32_MAX ? PROTO_E_RANGE : (int)total;
}

/* The payload of a checked message, through jansson (an ASSIGN with its job
 * rendered: by hand, the same bytes). */
int proto_encode_payload_json(const struct proto_msg *msg, uint8_t *out, size_t cap)
{
    if (msg->type == PROTO_ASSIGN && msg->u.assign.job_text)
        return enc_assign_rendered(&msg->u.assign, out, cap);

    json_t *root = json_object();
    size_t n = 0;
    int rc;

    if (!root)
        return PROTO_E_NOMEM;
    rc = enc_body(root, msg);
    /* json_dumpb answers the full size even when it does not fit. */
    if (rc == 0 && (n = json_dumpb(root, (char *)out, out ? cap : 0, JSON_COMPACT)) == 0)
        rc = PROTO_E_NOMEM;
    json_decref(root);
    return rc < 0 ? rc : n > INT32_MAX ? PROTO_E_RANGE : (int)n;
}

int proto_encode(const struct proto_msg *msg, uint8_t *out, size_t cap)
{
    TRY(proto_check(msg));
    uint8_t *body = cap > PROTO_HEADER_LEN ? out + PROTO_HEADER_LEN : NULL;
    size_t room = body ? cap - PROTO_HEADER_LEN : 0;
    /* the fast path writes the fields of every heartbeat; the rare memory checkpoint lists and spare notes go
     * through jansson */
    int rc = msg->type == PROTO_HEARTBEAT && !msg->u.heartbeat.has_memckpt && !msg->u.heartbeat.replica_of[0] &&
                     !msg->u.heartbeat.spare_note[0] && !msg->u.heartbeat.has_drained
                 ? fastbeat_encode(&msg->u.heartbeat, body, room)
                 : proto_encode_payload_json(msg, body, room);
    if (rc < 0)
        return rc;
    size_t n = (size_t)rc;
    if (n > PROTO_MAX_PAYLOAD)
        return PROTO_E_RANGE;
    if (!body || n > room)
        return PROTO_E_NOSPACE;
    out[0] = (uint8_t)(n >> 24);
    out[1] = (uint8_t)(n >> 16);
    out[2] = (uint8_t)(n >> 8);
    out[3] = (uint8_t)n;
    out[4] = (uint8_t)(PROTO_VERSION >> 8);
    out[5] = (uint8_t)PROTO_VERSION;
    out[6] = (uint8_t)(msg->type >> 8);
    out[7] = (uint8_t)msg->type;
    return (int)(PROTO_HEADER_LEN + n);
}
