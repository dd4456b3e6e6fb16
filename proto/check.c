/*
 * proto/check.c: what makes a message valid beyond its JSON shape, shared by
 * the encoder (refuse to send it) and the decoder (refuse to accept it);
 * plus the names of codes, types and enums.
 */
#include <math.h>
#include <string.h>

#include "proto/check.h"

const char *const proto_device_kind_json[PROTO_DEV_GPU + 1] = {
    [PROTO_DEV_CPU] = "cpu",
    [PROTO_DEV_GPU] = "gpu",
};

const char *const proto_rank_state_json[PROTO_RANK_STATE_MAX + 1] = {
    [PROTO_RANK_STARTING] = "starting",
    [PROTO_RANK_RUNNING] = "running",
    [PROTO_RANK_STOPPING] = "stopping",
    [PROTO_RANK_EXITED] = "exited",
};

const char *const proto_command_json[PROTO_CMD_MAX + 1] = {
    [PROTO_CMD_STOP] = "stop",
    [PROTO_CMD_START] = "start",
    [PROTO_CMD_SHUTDOWN] = "shutdown",
    [PROTO_CMD_CHECKPOINT] = "checkpoint",
    [PROTO_CMD_PARK] = "park",
    [PROTO_CMD_YIELD] = "yield",
    [PROTO_CMD_STACKS] = "stacks",
};

const char *const proto_restore_json[PROTO_RESTORE_MAX + 1] = {
    [PROTO_RESTORE_NONE] = "",
    [PROTO_RESTORE_MEMORY] = "memory",
    [PROTO_RESTORE_DISK] = "disk",
    [PROTO_RESTORE_SEED] = "seed",
};

const char *const proto_split_json[PROTO_SPLIT_NKINDS] = {
    [PROTO_SPLIT_COMPUTE] = "compute_frac",
    [PROTO_SPLIT_COLLECTIVE] = "collective_frac",
    [PROTO_SPLIT_GPU] = "gpu_frac",
    [PROTO_SPLIT_DATA] = "data_frac",
};

/* A rank entry's time split: none (all zero), or a window of 0 < split_s <=
 * PROTO_SPLIT_S_MAX whose shares are each 0..1 and together at most 1 (a
 * little over, for the rounding of four shares). */
static int split_ok(const struct proto_rank_beat *b)
{
    double sum = 0;
    if (b->split_s == 0) {
        for (int k = 0; k < PROTO_SPLIT_NKINDS; k++)
            if (b->split[k] != 0)
                return 0;
        return b->split_steps == 0;
    }
    if (!isfinite(b->split_s) || b->split_s < 0 || b->split_s > PROTO_SPLIT_S_MAX || b->split_steps > PROTO_U64_MAX)
        return 0;
    for (int k = 0; k < PROTO_SPLIT_NKINDS; k++) {
        if (!isfinite(b->split[k]) || b->split[k] < 0 || b->split[k] > 1)
            return 0;
        sum += b->split[k];
    }
    return sum <= 1.0 + 1e-6;
}

const char *const proto_log_error_json[PROTO_LOG_ERROR_MAX + 1] = {
    [PROTO_LOG_OK] = "",
    [PROTO_LOG_NO_LOG] = "no_log",
    [PROTO_LOG_BEYOND_END] = "beyond_end",
    [PROTO_LOG_UNREADABLE] = "unreadable",
    [PROTO_LOG_BUSY] = "busy",
};

int proto_valid_name(const char *s)
{
    size_t n;

    if (!s)
        return 0;
    n = strnlen(s, PROTO_NAME_MAX);
    if (n == 0 || n == PROTO_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') ||
              (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

/* NUL-terminated within cap, at least min bytes, each in [lo, hi]. */
static int valid_ascii(const char *s, size_t cap, size_t min, char lo, char hi)
{
    size_t n = strnlen(s, cap);

    if (n == cap || n < min)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (s[i] < lo || s[i] > hi)
            return 0;
    return 1;
}

/* Machine-readable codes: 1..cap-1 bytes of [a-z0-9_]. */
static int valid_code(const char *s, size_t cap)
{
    size_t n = strnlen(s, cap);

    if (n == 0 || n == cap)
        return 0;
    for (size_t i = 0; i < n; i++)
        if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
              s[i] == '_'))
            return 0;
    return 1;
}

/* Length of the well-formed UTF-8 sequence at p[0..n) (no overlong forms,
 * no surrogates, nothing above U+10FFFF: what jansson accepts), 0 if none. */
static size_t utf8_seq(const unsigned char *p, size_t n)
{
    unsigned int c = p[0], more;
    uint32_t cp, min;

    if (c < 0x80)
        return 1;
    if (c >= 0xc2 && c <= 0xdf)
        more = 1, cp = c & 0x1f, min = 0x80;
    else if (c >= 0xe0 && c <= 0xef)
        more = 2, cp = c & 0x0f, min = 0x800;
    else if (c >= 0xf0 && c <= 0xf4)
        more = 3, cp = c & 0x07, min = 0x10000;
    else
        return 0;
    if (n <= more)
        return 0;
    for (unsigned int k = 1; k <= more; k++) {
        if ((p[k] & 0xc0) != 0x80)
            return 0;
        cp = cp << 6 | (p[k] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
        return 0;
    return more + 1;
}

/* NUL-terminated within cap and well-formed UTF-8. */
static int valid_utf8(const char *s, size_t cap)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strnlen(s, cap);

    if (n == cap)
        return 0;
    for (size_t i = 0, k; i < n; i += k)
        if ((k = utf8_seq(p + i, n - i)) == 0)
            return 0;
    return 1;
}

/* Log text: at most max bytes of UTF-8 with no control character but
 * newline and tab (what proto_text_sanitize leaves). */
static int valid_log_text(const char *s, size_t max)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strnlen(s, max + 1);

    if (n > max)
        return 0;
    for (size_t i = 0, k; i < n; i += k) {
        if ((k = utf8_seq(p + i, n - i)) == 0)
            return 0;
        if (k == 1 && p[i] < 0x20 && p[i] != '\n' && p[i] != '\t')
            return 0;
    }
    return 1;
}

int proto_valid_label(const char *s, size_t cap)
{
    const unsigned char *p = (const unsigned char *)s;
    size_t n = strnlen(s, cap);

    if (n == 0 || n == cap)
        return 0;
    for (size_t i = 0, k; i < n; i += k) {
        if ((k = utf8_seq(p + i, n - i)) == 0)
            return 0;
        if ((k == 1 && (p[i] < 0x20 || p[i] == 0x7f)) || (k == 2 && p[i] == 0xc2 && p[i + 1] < 0xa0))
            return 0; /* C0, DEL, C1 (U+0080..U+009F) */
    }
    return 1;
}

void proto_text_sanitize(char *s)
{
    unsigned char *p = (unsigned char *)s;
    size_t n = strlen(s);

    for (size_t i = 0, k; i < n; i += k) {
        k = utf8_seq(p + i, n - i);
        if (k == 0) {
            p[i] = '?';
            k = 1;
        } else if (k == 1 && p[i] < 0x20 && p[i] != '\n' && p[i] != '\t') {
            p[i] = ' ';
        }
    }
}

void proto_log_sanitize(char *buf, size_t len)
{
    for (size_t i = 0; i < len; i++)
        if (buf[i] == '\0')
            buf[i] = ' ';
    buf[len] = '\0';
    proto_text_sanitize(buf);
}

static int check_hello(const struct proto_hello *h)
{
    if (!proto_valid_name(h->node) ||
        !valid_ascii(h->addr, sizeof(h->addr), 1, '!', '~') ||
        (unsigned int)h->kind > PROTO_DEV_GPU ||
        h->ndevices < 1 || h->ndevices > PROTO_MAX_LOCAL_RANKS ||
        h->device_mem_mb > PROTO_U64_MAX || h->generation > PROTO_U64_MAX ||
        h->free_port > 65535 || h->session > PROTO_U64_MAX ||
        (h->domain[0] && !proto_valid_name(h->domain)) ||
        !valid_ascii(h->agent_version, sizeof(h->agent_version), 0, ' ', '~'))
        return PROTO_E_RANGE;
    for (uint32_t i = 0; i < h->ndevices; i++)
        for (uint32_t j = 0; j < i; j++)
            if (h->devices[i] == h->devices[j])
                return PROTO_E_RANGE;
    /* GPU facts: at most one per device offered (gpus[i] is devices[i]'s), free within total */
    if (h->ngpus > h->ndevices)
        return PROTO_E_RANGE;
    for (uint32_t i = 0; i < h->ngpus; i++)
        if (!valid_ascii(h->gpus[i].name, sizeof(h->gpus[i].name), 1, ' ', '~') ||
            h->gpus[i].total_mb > PROTO_U64_MAX || h->gpus[i].free_mb > h->gpus[i].total_mb)
            return PROTO_E_RANGE;
    return h->host_mem_mb > PROTO_U64_MAX ? PROTO_E_RANGE : 0;
}

static int check_welcome(const struct proto_welcome *w)
{
    if (w->heartbeat_interval_ms == 0 || w->heartbeat_timeout_ms == 0 ||
        w->lease_ms == 0 || w->session > PROTO_U64_MAX || w->time_ms > PROTO_U64_MAX || w->term > PROTO_U64_MAX ||
        (w->job && !json_is_object(w->job)))
        return PROTO_E_RANGE;
    return 0;
}

/* A reason exactly when unfit. */
static int check_preflight(const struct proto_preflight *p)
{
    if (!valid_utf8(p->reason, sizeof(p->reason)) || (p->fit != 0) == (p->reason[0] != '\0'))
        return PROTO_E_RANGE;
    /* the name reaches events, status and terminals: no control character */
    if (p->has_checkpoint && p->checkpoint[0] && !proto_valid_label(p->checkpoint, sizeof(p->checkpoint)))
        return PROTO_E_RANGE;
    return 0;
}

static int check_code_reason(const char *code, size_t code_cap,
                             const char *reason, size_t reason_cap)
{
    if (!valid_code(code, code_cap) || !valid_utf8(reason, reason_cap))
        return PROTO_E_RANGE;
    return 0;
}

/* Ranks, local ranks and devices are each distinct; local ranks are thus
 * exactly 0..nranks-1. */
static int check_assign(const struct proto_assign *a)
{
    if (a->generation < 1 || a->generation > PROTO_U64_MAX || a->term > PROTO_U64_MAX ||
        a->world_size < 1 || a->nranks < 1 ||
        a->nranks > PROTO_MAX_LOCAL_RANKS || !json_is_object(a->job) ||
        a->nnodes < 1 || a->node_rank >= a->nnodes ||
        a->master_port < 1 || a->master_port > 65535 ||
        !valid_ascii(a->master_addr, sizeof(a->master_addr), 1, '!', '~') ||
        (a->memckpt[0] && !proto_valid_label(a->memckpt, sizeof(a->memckpt))) ||
        (a->memckpt_from[0] && (!a->has_memckpt || !a->memckpt[0] || !proto_valid_name(a->memckpt_from))) ||
        (a->memckpt_drained && (!a->has_memckpt || !a->memckpt[0] || a->memckpt_from[0])))
        return PROTO_E_RANGE;
    for (uint32_t i = 0; i < a->nranks; i++) {
        const struct proto_rank_slot *s = &a->ranks[i];
        if (s->rank >= a->world_size || s->local_rank >= a->nranks)
            return PROTO_E_RANGE;
        for (uint32_t j = 0; j < i; j++)
            if (s->rank == a->ranks[j].rank ||
                s->local_rank == a->ranks[j].local_rank ||
                s->device == a->ranks[j].device)
                return PROTO_E_RANGE;
    }
    return 0;
}

/* n checkpoint names: labels, each once (they reach status and events). */
static int valid_names(const char (*names)[PROTO_CKPT_NAME_MAX], uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) {
        if (!proto_valid_label(names[i], PROTO_CKPT_NAME_MAX))
            return 0;
        for (uint32_t j = 0; j < i; j++)
            if (strcmp(names[i], names[j]) == 0)
                return 0;
    }
    return 1;
}

int proto_valid_mem_path(const char *path)
{
    size_t n = strnlen(path, PROTO_MEMPATH_MAX);
    if (n == 0 || n >= PROTO_MEMPATH_MAX)
        return 0;
    const char *part = path;
    for (size_t i = 0; i <= n; i++) {
        if (i < n && path[i] != '/') {
            unsigned char c = (unsigned char)path[i];
            if (c < 0x20 || c == 0x7f)
                return 0;
            continue;
        }
        size_t len = (size_t)(path + i - part);
        if (len == 0 || (len == 1 && part[0] == '.') || (len == 2 && part[0] == '.' && part[1] == '.'))
            return 0;
        part = path + i + 1;
    }
    return 1;
}

static int check_heartbeat(const struct proto_heartbeat *h)
{
    if (h->generation > PROTO_U64_MAX || h->seq > PROTO_U64_MAX ||
        h->free_port > 65535 || h->nranks > PROTO_MAX_LOCAL_RANKS)
        return PROTO_E_RANGE;
    /* the note reaches events and terminals (musterctl events): one line, no control character */
    if (h->spare_note[0] && !proto_valid_label(h->spare_note, sizeof(h->spare_note)))
        return PROTO_E_RANGE;
    for (uint32_t i = 0; i < h->nranks; i++) {
        const struct proto_rank_beat *b = &h->ranks[i];
        if ((unsigned int)b->state > PROTO_RANK_STATE_MAX ||
            b->step > PROTO_U64_MAX ||
            !isfinite(b->tokens_per_s) || b->tokens_per_s < 0 ||
            !isfinite(b->comm_frac) || b->comm_frac < 0 || b->comm_frac > 1 ||
            b->step_bytes > PROTO_U64_MAX || b->peak_mem > PROTO_U64_MAX ||
            (unsigned int)b->restore_from > PROTO_RESTORE_MAX || b->restore_step > PROTO_U64_MAX ||
            !isfinite(b->step_s) || b->step_s < 0 || b->step_age_ms > PROTO_U64_MAX ||
            (!b->has_step_age && b->step_age_ms != 0) || b->total_steps > PROTO_U64_MAX ||
            (b->where[0] && !proto_valid_label(b->where, sizeof(b->where))) ||
            (b->waiting[0] && !proto_valid_label(b->waiting, sizeof(b->waiting))) || !split_ok(b))
            return PROTO_E_RANGE;
        for (uint32_t j = 0; j < i; j++)
            if (b->rank == h->ranks[j].rank)
                return PROTO_E_RANGE;
    }
    /* the names reach status and events: labels, each once */
    if (h->nmemckpt > (h->has_memckpt ? PROTO_MEMCKPT_MAX : 0))
        return PROTO_E_RANGE;
    if (!valid_names(h->memckpt, h->nmemckpt))
        return PROTO_E_RANGE;
    if (h->ndrained > (h->has_drained ? PROTO_MEMCKPT_MAX : 0) || !valid_names(h->drained, h->ndrained))
        return PROTO_E_RANGE;
    if (h->nreplica > (h->replica_of[0] ? PROTO_MEMCKPT_MAX : 0) || (h->replica_of[0] && !proto_valid_name(h->replica_of)))
        return PROTO_E_RANGE;
    return valid_names(h->replica, h->nreplica) ? 0 : PROTO_E_RANGE;
}

/* A file of a checkpoint: a relative path of plain parts, the piece inside the file, an end without either. */
static int check_mem_file(const struct proto_mem_file *f)
{
    if (!proto_valid_name(f->owner) || !proto_valid_label(f->tag, sizeof(f->tag)) || f->offset > PROTO_U64_MAX ||
        f->size > PROTO_U64_MAX || f->len > PROTO_MEMDATA_MAX || (f->len && !f->data))
        return PROTO_E_RANGE;
    if (f->end)
        return f->path[0] || f->len || f->offset || f->size ? PROTO_E_RANGE : 0;
    if (!proto_valid_mem_path(f->path) || f->offset > f->size || f->len > f->size - f->offset)
        return PROTO_E_RANGE;
    return 0;
}

/* Exactly one of the two says how the process ended. */
static int check_rank_exit(const struct proto_rank_exit *e)
{
    int exited = e->signal == 0 && e->exit_code >= 0 && e->exit_code <= 255;
    int killed = e->signal >= 1 && e->signal <= 127 && e->exit_code == -1;

    if (e->generation > PROTO_U64_MAX || !(exited || killed) ||
        !valid_utf8(e->reason, sizeof(e->reason)) ||
        !valid_utf8(e->detail, sizeof(e->detail)))
        return PROTO_E_RANGE;
    return 0;
}

/* One way to read: from an offset, or the tail. */
static int check_log_request(const struct proto_log_request *q)
{
    if (q->generation > PROTO_U64_MAX || q->offset > PROTO_U64_MAX ||
        q->max < 1 || q->max > PROTO_LOG_MAX || (q->tail > 0 && q->offset != 0))
        return PROTO_E_RANGE;
    return 0;
}

/* next_offset is offset plus the bytes carried, within what was written;
 * an error carries no bytes and says why. */
static int check_log_data(const struct proto_log_data *d)
{
    const char *data = d->data ? d->data : "";

    if (d->generation > PROTO_U64_MAX || d->newest > PROTO_U64_MAX ||
        d->offset > PROTO_U64_MAX || d->next_offset > PROTO_U64_MAX ||
        d->size > PROTO_U64_MAX || (unsigned int)d->error > PROTO_LOG_ERROR_MAX ||
        !valid_utf8(d->reason, sizeof(d->reason)) || !valid_log_text(data, PROTO_LOG_MAX))
        return PROTO_E_RANGE;
    if (d->next_offset < d->offset || d->next_offset - d->offset != strlen(data) ||
        d->next_offset > d->size)
        return PROTO_E_RANGE;
    if (d->error != PROTO_LOG_OK && (data[0] != '\0' || d->reason[0] == '\0'))
        return PROTO_E_RANGE;
    return 0;
}

/* A text or words for its absence; no text without a process that dumped it. */
static int check_stacks(const struct proto_stacks *k)
{
    const char *text = k->text ? k->text : "", *fr = k->fr ? k->fr : "";

    if (k->generation > PROTO_U64_MAX || k->pid > INT32_MAX ||
        !valid_utf8(k->error, sizeof(k->error)) || !valid_log_text(text, PROTO_STACKS_MAX) ||
        !valid_log_text(fr, PROTO_FR_MAX) || (fr[0] && k->pid == 0))
        return PROTO_E_RANGE;
    if ((text[0] == '\0' && k->error[0] == '\0') || (k->pid == 0 && text[0] != '\0'))
        return PROTO_E_RANGE;
    return 0;
}

uint32_t proto_stall_ms(uint32_t timeout_ms)
{
    return timeout_ms / 4 > PROTO_STALL_MIN_MS ? timeout_ms / 4 : PROTO_STALL_MIN_MS;
}

uint32_t proto_ack_every_ms(uint32_t interval_ms, uint32_t timeout_ms, uint32_t lease_ms)
{
    if (interval_ms == 0)
        return 0;
    /* A stall is seen within three quarters of the timeout of the last answer
     * (the stall time is at least a quarter, so this is at most half of it). */
    const uint32_t seen = (uint32_t)((uint64_t)timeout_ms * 3 / 4), stall = proto_stall_ms(timeout_ms);
    uint32_t room = seen > stall ? seen - stall : 0;
    if (room > lease_ms / 2)
        room = lease_ms / 2;
    uint32_t n = room / interval_ms;
    return (n ? n : 1) * interval_ms;
}

int proto_ack_due(uint64_t beats, uint32_t interval_ms, uint32_t ack_every_ms)
{
    return beats * interval_ms >= ack_every_ms;
}

int proto_check(const struct proto_msg *m)
{
    switch (m->type) {
    case PROTO_HELLO: return check_hello(&m->u.hello);
    case PROTO_CHALLENGE: return 0;
    case PROTO_RESPONSE: return 0;
    case PROTO_WELCOME: return check_welcome(&m->u.welcome);
    case PROTO_REJECT:
        return check_code_reason(m->u.reject.code, sizeof(m->u.reject.code),
                                 m->u.reject.reason, sizeof(m->u.reject.reason));
    case PROTO_ASSIGN: return check_assign(&m->u.assign);
    case PROTO_UNIQUE_ID:
        return m->u.unique_id.generation > PROTO_U64_MAX || m->u.unique_id.term > PROTO_U64_MAX ? PROTO_E_RANGE : 0;
    case PROTO_HEARTBEAT: return check_heartbeat(&m->u.heartbeat);
    case PROTO_RANK_EXIT: return check_rank_exit(&m->u.rank_exit);
    case PROTO_COMMAND:
        if (m->u.command.generation > PROTO_U64_MAX || m->u.command.term > PROTO_U64_MAX ||
            m->u.command.action < PROTO_CMD_STOP ||
            m->u.command.action > PROTO_CMD_MAX)
            return PROTO_E_RANGE;
        return 0;
    case PROTO_ERROR:
        return check_code_reason(m->u.error.code, sizeof(m->u.error.code),
                                 m->u.error.reason, sizeof(m->u.error.reason));
    case PROTO_LOG_REQUEST: return check_log_request(&m->u.log_request);
    case PROTO_LOG_DATA: return check_log_data(&m->u.log_data);
    case PROTO_PREFLIGHT: return check_preflight(&m->u.preflight);
    case PROTO_STACKS: return check_stacks(&m->u.stacks);
    case PROTO_MEM_FILE: return check_mem_file(&m->u.mem_file);
    case PROTO_MEM_FETCH:
        return proto_valid_name(m->u.mem_fetch.owner) &&
                       proto_valid_label(m->u.mem_fetch.tag, sizeof(m->u.mem_fetch.tag))
                   ? 0
                   : PROTO_E_RANGE;
    }
    return PROTO_E_TYPE;
}

const char *proto_strerror(int err)
{
    switch (err) {
    case PROTO_OK: return "success";
    case PROTO_NEED_MORE: return "incomplete frame, more bytes needed";
    case PROTO_E_OVERSIZE: return "frame length exceeds the protocol limit";
    case PROTO_E_VERSION: return "unsupported protocol version";
    case PROTO_E_TYPE: return "unknown message type";
    case PROTO_E_JSON: return "payload is not one well-formed JSON object";
    case PROTO_E_MISSING: return "a required field is missing";
    case PROTO_E_FIELD_TYPE: return "a field has the wrong JSON type";
    case PROTO_E_RANGE: return "a field value is out of range or malformed";
    case PROTO_E_TRUNCATED: return "connection ended in the middle of a frame";
    case PROTO_E_UNKNOWN_FIELD: return "a field this protocol version does not define";
    case PROTO_E_NOSPACE: return "output buffer too small for the frame";
    case PROTO_E_CRYPTO: return "the cryptographic library failed";
    case PROTO_E_NOMEM: return "out of memory";
    case PROTO_E_MAC: return "frame failed authentication (its MAC does not verify)";
    }
    return "unknown protocol error code";
}

const char *proto_type_name(enum proto_type type)
{
    static const char *const names[PROTO_TYPE_MAX + 1] = {
        [PROTO_HELLO] = "HELLO",         [PROTO_CHALLENGE] = "CHALLENGE",
        [PROTO_RESPONSE] = "RESPONSE",   [PROTO_WELCOME] = "WELCOME",
        [PROTO_REJECT] = "REJECT",       [PROTO_ASSIGN] = "ASSIGN",
        [PROTO_UNIQUE_ID] = "UNIQUE_ID", [PROTO_HEARTBEAT] = "HEARTBEAT",
        [PROTO_RANK_EXIT] = "RANK_EXIT", [PROTO_COMMAND] = "COMMAND",
        [PROTO_ERROR] = "ERROR",         [PROTO_LOG_REQUEST] = "LOG_REQUEST",
        [PROTO_LOG_DATA] = "LOG_DATA",   [PROTO_PREFLIGHT] = "PREFLIGHT",
        [PROTO_STACKS] = "STACKS",       [PROTO_MEM_FILE] = "MEM_FILE",
        [PROTO_MEM_FETCH] = "MEM_FETCH",
    };

    if ((unsigned int)type > PROTO_TYPE_MAX || !names[type])
        return "unknown";
    return names[type];
}

const char *proto_rank_state_name(enum proto_rank_state state)
{
    if ((unsigned int)state > PROTO_RANK_STATE_MAX)
        return "unknown";
    return proto_rank_state_json[state];
}

const char *proto_command_name(enum proto_command cmd)
{
    if ((unsigned int)cmd > PROTO_CMD_MAX || !proto_command_json[cmd])
        return "unknown";
    return proto_command_json[cmd];
}

const char *proto_restore_name(enum proto_restore from)
{
    if ((unsigned int)from > PROTO_RESTORE_MAX)
        return "unknown";
    return proto_restore_json[from];
}

const char *proto_log_error_name(enum proto_log_error err)
{
    if ((unsigned int)err > PROTO_LOG_ERROR_MAX)
        return "unknown";
    return err == PROTO_LOG_OK ? "ok" : proto_log_error_json[err];
}
