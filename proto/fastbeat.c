/* proto/fastbeat.c: HEARTBEAT read and written without a JSON tree (see fastbeat.h). */
#include <math.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "proto/check.h"
#include "proto/fastbeat.h"
#include "proto/realnum.h"

/* ---- reading: a cursor over the payload; every reader answers 1 (read) or 0 (not ours) ---- */

struct cur {
    const uint8_t *p, *end;
};

static int eat(struct cur *c, char ch)
{
    if (c->p < c->end && *c->p == (uint8_t)ch) {
        c->p++;
        return 1;
    }
    return 0;
}

static int is_digit(const struct cur *c, const uint8_t *at) { return at < c->end && *at >= '0' && *at <= '9'; }

/* "[a-z_]+": a key or an enumeration's value, with nothing to unescape,
 * read in place: *at and *len get its text. Answers 1, or 0. */
static int plain_string(struct cur *c, const uint8_t **at, size_t *len)
{
    if (!eat(c, '"'))
        return 0;
    const uint8_t *s = c->p;
    while (c->p < c->end && ((*c->p >= 'a' && *c->p <= 'z') || *c->p == '_'))
        c->p++;
    *at = s;
    *len = (size_t)(c->p - s);
    return *len > 0 && eat(c, '"');
}

/* Whether the len bytes at s spell k, whole. */
static int key_is(const uint8_t *s, size_t len, const char *k)
{
    size_t i = 0;
    while (i < len && k[i] == (char)s[i])
        i++;
    return i == len && k[i] == '\0';
}

/* A JSON integer 0 | [1-9][0-9]{0,15}, not the start of a real, at most max. */
static int uint_value(struct cur *c, uint64_t max, uint64_t *out)
{
    const uint8_t *s = c->p;
    uint64_t v = 0;
    while (is_digit(c, c->p) && c->p - s < 17)
        v = v * 10 + (uint64_t)(*c->p++ - '0');
    size_t len = (size_t)(c->p - s);
    if (len == 0 || len > 16 || (len > 1 && *s == '0') || v > max)
        return 0;
    if (c->p < c->end && (*c->p == '.' || *c->p == 'e' || *c->p == 'E'))
        return 0;
    *out = v;
    return 1;
}

static int u64_value(struct cur *c, uint64_t *out) { return uint_value(c, PROTO_U64_MAX, out); }

static int u32_value(struct cur *c, uint32_t *out)
{
    uint64_t v;
    if (!uint_value(c, UINT32_MAX, &v))
        return 0;
    *out = (uint32_t)v;
    return 1;
}

/* A JSON number, integer or real, by the grammar of RFC 8259; read as the JSON decoder reads it. */
static int number_value(struct cur *c, double *out)
{
    const uint8_t *s = c->p;
    int real = 0;
    eat(c, '-');
    const uint8_t *digits = c->p;
    while (is_digit(c, c->p))
        c->p++;
    if (c->p == digits || (c->p - digits > 1 && *digits == '0'))
        return 0;
    if (eat(c, '.')) {
        real = 1;
        if (!is_digit(c, c->p))
            return 0;
        while (is_digit(c, c->p))
            c->p++;
    }
    if (eat(c, 'e') || eat(c, 'E')) {
        real = 1;
        if (!eat(c, '+'))
            eat(c, '-');
        if (!is_digit(c, c->p))
            return 0;
        while (is_digit(c, c->p))
            c->p++;
    }
    size_t len = (size_t)(c->p - s);
    if (!real) {
        /* Exact in a double (below 2^53); longer integers are left to the JSON decoder. */
        if (c->p - digits > 15)
            return 0;
        long long v = 0;
        for (const uint8_t *d = digits; d < c->p; d++)
            v = v * 10 + (*d - '0');
        *out = (double)(*s == '-' ? -v : v);
        return 1;
    }
    return proto_read_real((const char *)s, len, out);
}

/* A string with nothing to unescape (no backslash: those are left to the
 * JSON decoder) of 1..cap-1 bytes, copied into buf with its NUL. Control
 * bytes are not JSON; the rest of the label rules is proto_check's. */
static int label_value(struct cur *c, char *buf, size_t cap)
{
    if (!eat(c, '"'))
        return 0;
    const uint8_t *s = c->p;
    while (c->p < c->end && *c->p != '"' && *c->p != '\\' && *c->p >= 0x20)
        c->p++;
    size_t len = (size_t)(c->p - s);
    if (len == 0 || len >= cap || !eat(c, '"'))
        return 0;
    memcpy(buf, s, len);
    buf[len] = '\0';
    return 1;
}

static int bool_value(struct cur *c, int *out)
{
    if (c->end - c->p >= 4 && memcmp(c->p, "true", 4) == 0) {
        c->p += 4;
        *out = 1;
        return 1;
    }
    if (c->end - c->p >= 5 && memcmp(c->p, "false", 5) == 0) {
        c->p += 5;
        *out = 0;
        return 1;
    }
    return 0;
}

static int null_value(struct cur *c)
{
    if (c->end - c->p >= 4 && memcmp(c->p, "null", 4) == 0) {
        c->p += 4;
        return 1;
    }
    return 0;
}

static int enum_value(struct cur *c, const char *const *names, int lo, int hi, int *out)
{
    const uint8_t *at;
    size_t len;
    if (!plain_string(c, &at, &len))
        return 0;
    for (int i = lo; i <= hi; i++)
        if (key_is(at, len, names[i])) {
            *out = i;
            return 1;
        }
    return 0;
}

/* The key at the cursor (a plain string) as its index in keys; -1 when it
 * is none of them. Senders write the keys in table order, so the one after
 * the last found (hint) is tried first. */
static int read_key(struct cur *c, const char *const *keys, int hint)
{
    const uint8_t *at;
    size_t len;
    if (!plain_string(c, &at, &len))
        return -1;
    if (keys[hint] && key_is(at, len, keys[hint]))
        return hint;
    for (int i = 0; keys[i]; i++)
        if (key_is(at, len, keys[i]))
            return i;
    return -1;
}

/*
 * '{' key ':' value (',' key ':' value)* '}' with each key of keys at most
 * once: value(i) reads the value of keys[i]. *seen gets the keys read.
 */
static int object(struct cur *c, const char *const *keys, unsigned *seen,
                  int (*value)(struct cur *, int, void *), void *ctx)
{
    *seen = 0;
    if (!eat(c, '{') || eat(c, '}'))
        return 0;
    int next = 0;
    do {
        int i = read_key(c, keys, next);
        if (i < 0 || !eat(c, ':') || (*seen & (1u << i)) || !value(c, i, ctx))
            return 0;
        *seen |= 1u << i;
        next = i + 1;
    } while (eat(c, ','));
    return eat(c, '}');
}

enum beat_key {
    B_RANK, B_STATE, B_STEP, B_LOSS, B_TOKENS, B_COMM, B_CKPT, B_SILENT, B_STEP_BYTES, B_PEAK, B_REJOIN,
    B_RESTORE_FROM, B_RESTORE_STEP, B_YIELDED, B_STEP_S, B_STEP_AGE, B_TOTAL_STEPS, B_WHERE, B_WAITING,
    B_STOPPED, B_SPLIT_S, B_SPLIT_STEPS, B_SPLIT0,
};
static const char *const beat_keys[] = {"rank", "state", "step", "loss", "tokens_per_s", "comm_frac",
    "checkpoint_step", "silent", "step_bytes", "peak_mem", "rejoin", "restore_from", "restore_step", "yielded",
    "step_s", "step_age_ms", "total_steps", "where", "waiting", "stopped", "split_s", "split_steps",
    "compute_frac", "collective_frac", "gpu_frac", "data_frac", NULL};
/* the time split's shares: keys B_SPLIT0.. in proto_split_json's order */
#define BEAT_SHARES (((1u << PROTO_SPLIT_NKINDS) - 1) << B_SPLIT0)
#define BEAT_REQUIRED (1u << B_RANK | 1u << B_STATE | 1u << B_STEP | 1u << B_LOSS | 1u << B_TOKENS | 1u << B_COMM)

static int beat_value(struct cur *c, int key, void *ctx)
{
    struct proto_rank_beat *b = ctx;
    int e;
    switch ((enum beat_key)key) {
    case B_RANK: return u32_value(c, &b->rank);
    case B_STATE:
        if (!enum_value(c, proto_rank_state_json, 0, PROTO_RANK_STATE_MAX, &e))
            return 0;
        b->state = (enum proto_rank_state)e;
        return 1;
    case B_STEP: return u64_value(c, &b->step);
    case B_LOSS:
        if (null_value(c)) {
            b->loss = NAN;
            return 1;
        }
        return number_value(c, &b->loss);
    case B_TOKENS: return number_value(c, &b->tokens_per_s);
    case B_COMM: return number_value(c, &b->comm_frac);
    case B_CKPT: return u64_value(c, &b->checkpoint_step);
    case B_SILENT: return bool_value(c, &b->silent);
    case B_STEP_BYTES: return u64_value(c, &b->step_bytes);
    case B_PEAK: return u64_value(c, &b->peak_mem);
    case B_REJOIN: return bool_value(c, &b->rejoin);
    case B_RESTORE_FROM:
        if (!enum_value(c, proto_restore_json, 1, PROTO_RESTORE_MAX, &e))
            return 0;
        b->restore_from = (enum proto_restore)e;
        return 1;
    case B_RESTORE_STEP: return u64_value(c, &b->restore_step);
    case B_YIELDED: return bool_value(c, &b->yielded);
    case B_STEP_S: return number_value(c, &b->step_s);
    case B_STEP_AGE:
        b->has_step_age = 1;
        return u64_value(c, &b->step_age_ms);
    case B_TOTAL_STEPS: return u64_value(c, &b->total_steps);
    case B_WHERE: return label_value(c, b->where, sizeof(b->where));
    case B_WAITING: return label_value(c, b->waiting, sizeof(b->waiting));
    case B_STOPPED: return bool_value(c, &b->stopped);
    case B_SPLIT_S: return number_value(c, &b->split_s);
    case B_SPLIT_STEPS: return u64_value(c, &b->split_steps);
    case B_SPLIT0: break; /* a share: below */
    }
    if (key >= B_SPLIT0 && key < B_SPLIT0 + PROTO_SPLIT_NKINDS)
        return number_value(c, &b->split[key - B_SPLIT0]);
    return 0;
}

static int beat(struct cur *c, struct proto_rank_beat *b)
{
    unsigned seen;
    memset(b, 0, sizeof(*b));
    if (!object(c, beat_keys, &seen, beat_value, b) || (seen & BEAT_REQUIRED) != BEAT_REQUIRED)
        return 0;
    /* restore_from and restore_step come together or not at all; so do
     * split_s (> 0) and the four shares, and split_steps only with them. */
    if (seen & 1u << B_SPLIT_S) {
        if ((seen & BEAT_SHARES) != BEAT_SHARES || !(b->split_s > 0))
            return 0;
    } else if (seen & (BEAT_SHARES | 1u << B_SPLIT_STEPS)) {
        return 0;
    }
    return !(seen & 1u << B_RESTORE_FROM) == !(seen & 1u << B_RESTORE_STEP);
}

enum hb_key { H_GENERATION, H_SEQ, H_FREE_PORT, H_ACK, H_RANKS };
static const char *const hb_keys[] = {"generation", "seq", "free_port", "ack", "ranks", NULL};
#define HB_REQUIRED (1u << H_GENERATION | 1u << H_SEQ | 1u << H_RANKS)

static int hb_value(struct cur *c, int key, void *ctx)
{
    struct proto_heartbeat *h = ctx;
    switch ((enum hb_key)key) {
    case H_GENERATION: return u64_value(c, &h->generation);
    case H_SEQ: return u64_value(c, &h->seq);
    case H_FREE_PORT: return u32_value(c, &h->free_port);
    case H_ACK: {
        int ack;
        if (!bool_value(c, &ack))
            return 0;
        h->no_ack = !ack;
        return 1;
    }
    case H_RANKS:
        if (!eat(c, '['))
            return 0;
        if (eat(c, ']'))
            return 1;
        do {
            if (h->nranks == PROTO_MAX_LOCAL_RANKS || !beat(c, &h->ranks[h->nranks]))
                return 0;
            h->nranks++;
        } while (eat(c, ','));
        return eat(c, ']');
    }
    return 0;
}

int fastbeat_decode(const uint8_t *p, size_t n, struct proto_msg *m)
{
    struct proto_heartbeat *h = &m->u.heartbeat;
    struct cur c = {p, p + n};
    unsigned seen;
    h->free_port = 0;
    h->no_ack = 0;
    h->nranks = 0;
    if (object(&c, hb_keys, &seen, hb_value, h) && (seen & HB_REQUIRED) == HB_REQUIRED && c.p == c.end &&
        proto_check(m) == 0)
        return 0;
    /* Zeroed again as far as it was written: its head, the entries read and the one that failed. */
    uint32_t written = h->nranks < PROTO_MAX_LOCAL_RANKS ? h->nranks + 1 : PROTO_MAX_LOCAL_RANKS;
    memset(h, 0, offsetof(struct proto_heartbeat, ranks) + written * sizeof(h->ranks[0]));
    return 1;
}

/* ---- writing ---- */

struct out {
    char *p;
    size_t len, cap;
    int full;
};

static void put(struct out *o, const char *s, size_t n)
{
    if (o->full || n > o->cap - o->len) {
        o->full = 1;
        return;
    }
    memcpy(o->p + o->len, s, n);
    o->len += n;
}

static void puts_(struct out *o, const char *s) { put(o, s, strlen(s)); }

/* ,"key": (the first field of an object is written with its brace instead) */
static void put_key(struct out *o, const char *key)
{
    puts_(o, ",\"");
    puts_(o, key);
    puts_(o, "\":");
}

static void put_u(struct out *o, uint64_t v)
{
    char buf[24];
    int n = snprintf(buf, sizeof(buf), "%llu", (unsigned long long)v);
    put(o, buf, (size_t)n);
}

static void put_uint(struct out *o, const char *key, uint64_t v)
{
    put_key(o, key);
    put_u(o, v);
}

/* As jansson writes a real: "%.17g", ".0" when that reads as an integer, no '+' or leading zeros in the exponent. */
static void put_real(struct out *o, const char *key, double v)
{
    char g[48];
    snprintf(g, sizeof(g), "%.17g", v);
    char *e = strchr(g, 'e');
    if (!e && !strchr(g, '.'))
        strcat(g, ".0");
    if (e) {
        char *d = e + 1, *w = e + 1;
        if (*d == '-')
            *w++ = *d++;
        else if (*d == '+')
            d++;
        while (*d == '0' && d[1])
            d++;
        memmove(w, d, strlen(d) + 1);
    }
    put_key(o, key);
    puts_(o, g);
}

/* "name" of an enumeration, or a literal (true, null) */
static void put_name(struct out *o, const char *key, const char *name)
{
    put_key(o, key);
    puts_(o, "\"");
    puts_(o, name);
    puts_(o, "\"");
}

/* "text" with '"' and '\\' escaped, as jansson writes a string that
 * proto_check allows (no control characters, UTF-8 as it is). */
static void put_text(struct out *o, const char *key, const char *text)
{
    put_key(o, key);
    puts_(o, "\"");
    for (const char *run = text; *run;) {
        size_t n = strcspn(run, "\"\\");
        put(o, run, n);
        run += n;
        if (*run) {
            char esc[2] = {'\\', *run++};
            put(o, esc, 2);
        }
    }
    puts_(o, "\"");
}

static void put_literal(struct out *o, const char *key, const char *lit)
{
    put_key(o, key);
    puts_(o, lit);
}

int fastbeat_encode(const struct proto_heartbeat *h, uint8_t *out, size_t cap)
{
    struct out o = {(char *)out, 0, cap, 0};
    puts_(&o, "{\"generation\":");
    put_u(&o, h->generation);
    put_uint(&o, "seq", h->seq);
    if (h->free_port)
        put_uint(&o, "free_port", h->free_port);
    if (h->no_ack)
        put_literal(&o, "ack", "false");
    puts_(&o, ",\"ranks\":[");
    for (uint32_t i = 0; i < h->nranks && !o.full; i++) {
        const struct proto_rank_beat *b = &h->ranks[i];
        puts_(&o, i ? ",{\"rank\":" : "{\"rank\":");
        put_u(&o, b->rank);
        put_name(&o, "state", proto_rank_state_json[b->state]);
        put_uint(&o, "step", b->step);
        if (isfinite(b->loss))
            put_real(&o, "loss", b->loss);
        else
            put_literal(&o, "loss", "null");
        put_real(&o, "tokens_per_s", b->tokens_per_s);
        put_real(&o, "comm_frac", b->comm_frac);
        if (b->checkpoint_step)
            put_uint(&o, "checkpoint_step", b->checkpoint_step);
        if (b->step_bytes)
            put_uint(&o, "step_bytes", b->step_bytes);
        if (b->peak_mem)
            put_uint(&o, "peak_mem", b->peak_mem);
        if (b->rejoin)
            put_literal(&o, "rejoin", "true");
        if (b->yielded)
            put_literal(&o, "yielded", "true");
        if (b->restore_from != PROTO_RESTORE_NONE) {
            put_name(&o, "restore_from", proto_restore_json[b->restore_from]);
            put_uint(&o, "restore_step", b->restore_step);
        }
        if (b->silent)
            put_literal(&o, "silent", "true");
        if (b->step_s != 0)
            put_real(&o, "step_s", b->step_s);
        if (b->has_step_age)
            put_uint(&o, "step_age_ms", b->step_age_ms);
        if (b->total_steps)
            put_uint(&o, "total_steps", b->total_steps);
        if (b->where[0])
            put_text(&o, "where", b->where);
        if (b->waiting[0])
            put_text(&o, "waiting", b->waiting);
        if (b->split_s > 0) {
            put_real(&o, "split_s", b->split_s);
            if (b->split_steps)
                put_uint(&o, "split_steps", b->split_steps);
            for (int k = 0; k < PROTO_SPLIT_NKINDS; k++)
                put_real(&o, proto_split_json[k], b->split[k]);
        }
        if (b->stopped)
            put_literal(&o, "stopped", "true");
        puts_(&o, "}");
    }
    puts_(&o, "]}");
    return o.full ? PROTO_E_NOSPACE : (int)o.len;
}
