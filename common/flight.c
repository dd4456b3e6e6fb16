#include "common/flight.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

const char *flight_strerror(int err)
{
    switch (err) {
    case 0: return "ok";
    case FLIGHT_E_SIZE: return "too long, or too many process groups or ops";
    case FLIGHT_E_SYNTAX: return "expected PG DESC ENTERED COMPLETED [SEQ:OP ...]";
    case FLIGHT_E_NAME: return "a name empty, too long or not of [A-Za-z0-9_.-]";
    case FLIGHT_E_NUMBER: return "a number that is not a decimal below 2^63";
    case FLIGHT_E_ORDER: return "numbers out of order (COMPLETED > ENTERED, or ops not ascending up to ENTERED)";
    case FLIGHT_E_DUP: return "a process group listed twice";
    }
    return "unknown error";
}

/* ---- parsing ----------------------------------------------------------- */

static int name_byte(char c, int dots)
{
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           (dots && (c == '.' || c == '-'));
}

/* A token [p, e) as a name of 1..cap-1 bytes into out. */
static int take_name(const char *p, const char *e, char *out, size_t cap, int dots)
{
    size_t n = (size_t)(e - p);
    if (n == 0 || n >= cap)
        return FLIGHT_E_NAME;
    for (size_t i = 0; i < n; i++)
        if (!name_byte(p[i], dots))
            return FLIGHT_E_NAME;
    memcpy(out, p, n);
    out[n] = '\0';
    return 0;
}

/* A token [p, e) as a decimal below 2^63, without sign or leading zeros. */
static int take_number(const char *p, const char *e, uint64_t *out)
{
    if (p == e || (e - p > 1 && *p == '0'))
        return FLIGHT_E_NUMBER;
    uint64_t v = 0;
    for (; p < e; p++) {
        if (*p < '0' || *p > '9' || v > (UINT64_C(1) << 63) / 10)
            return FLIGHT_E_NUMBER;
        v = v * 10 + (uint64_t)(*p - '0');
    }
    if (v >= UINT64_C(1) << 63)
        return FLIGHT_E_NUMBER;
    *out = v;
    return 0;
}

/* One line [p, e): PG DESC ENTERED COMPLETED [SEQ:OP ...], tokens one space apart. */
static int parse_line(const char *p, const char *e, struct flight_pg *g)
{
    const char *tok[4 + FLIGHT_MAX_OPS + 1], *end[4 + FLIGHT_MAX_OPS + 1];
    unsigned n = 0;
    const char *s = p;
    for (const char *q = p;; q++) {
        if (q == e || *q == ' ') {
            if (q == s)
                return FLIGHT_E_SYNTAX; /* empty token: two spaces, or one at an end */
            if (n == 4 + FLIGHT_MAX_OPS)
                return FLIGHT_E_SIZE;
            tok[n] = s;
            end[n++] = q;
            s = q + 1;
            if (q == e)
                break;
        }
    }
    if (n < 4)
        return FLIGHT_E_SYNTAX;
    int rc;
    memset(g, 0, sizeof(*g));
    if ((rc = take_name(tok[0], end[0], g->name, sizeof(g->name), 1)) ||
        (rc = take_name(tok[1], end[1], g->desc, sizeof(g->desc), 1)) ||
        (rc = take_number(tok[2], end[2], &g->entered)) || (rc = take_number(tok[3], end[3], &g->completed)))
        return rc;
    if (g->completed > g->entered)
        return FLIGHT_E_ORDER;
    for (unsigned i = 4; i < n; i++) {
        const char *colon = memchr(tok[i], ':', (size_t)(end[i] - tok[i]));
        if (!colon)
            return FLIGHT_E_SYNTAX;
        struct flight_op *o = &g->ops[g->nops];
        if ((rc = take_number(tok[i], colon, &o->seq)) ||
            (rc = take_name(colon + 1, end[i], o->op, sizeof(o->op), 0)))
            return rc;
        if (o->seq == 0 || o->seq > g->entered || (g->nops && o->seq <= g->ops[g->nops - 1].seq))
            return FLIGHT_E_ORDER;
        g->nops++;
    }
    return 0;
}

int flight_parse(const char *buf, size_t len, struct flight_rank *out, unsigned *line)
{
    unsigned at = 0;
    int rc = 0;
    memset(out, 0, sizeof(*out));
    if (len > FLIGHT_TEXT_MAX) {
        rc = FLIGHT_E_SIZE;
        goto out;
    }
    const char *p = buf, *e = buf + len;
    while (p < e) {
        at++;
        const char *nl = memchr(p, '\n', (size_t)(e - p));
        const char *le = nl ? nl : e;
        if (out->npgs == FLIGHT_MAX_PGS) {
            rc = FLIGHT_E_SIZE;
            goto out;
        }
        struct flight_pg *g = &out->pgs[out->npgs];
        if ((rc = parse_line(p, le, g)) != 0)
            goto out;
        for (unsigned i = 0; i < out->npgs; i++)
            if (strcmp(out->pgs[i].name, g->name) == 0) {
                rc = FLIGHT_E_DUP;
                goto out;
            }
        out->npgs++;
        p = nl ? nl + 1 : e;
    }
out:
    if (line)
        *line = rc ? at : 0;
    if (rc)
        memset(out, 0, sizeof(*out));
    return rc;
}

/* ---- the rule ----------------------------------------------------------- */

static const struct flight_pg *find_pg(const struct flight_rank *r, const char *name)
{
    for (unsigned i = 0; r && i < r->npgs; i++)
        if (strcmp(r->pgs[i].name, name) == 0)
            return &r->pgs[i];
    return NULL;
}

/* The op of g's collective #seq, "" when g does not hold it. */
static const char *op_at(const struct flight_pg *g, uint64_t seq)
{
    for (unsigned i = 0; i < g->nops; i++)
        if (g->ops[i].seq == seq)
            return g->ops[i].op;
    return "";
}

/* "rank 3", "ranks 0-2, 5" for the sorted ranks ids[0..n). */
static void ranges(char *out, size_t cap, const uint32_t *ids, uint32_t n)
{
    size_t len = (size_t)snprintf(out, cap, "%s", n == 1 ? "rank " : "ranks ");
    for (uint32_t i = 0; i < n && len < cap;) {
        uint32_t j = i;
        while (j + 1 < n && ids[j + 1] == ids[j] + 1)
            j++;
        int w = j == i ? snprintf(out + len, cap - len, "%s%u", i ? ", " : "", ids[i])
                       : snprintf(out + len, cap - len, "%s%u-%u", i ? ", " : "", ids[i], ids[j]);
        if (w < 0)
            break;
        len += (size_t)w;
        i = j + 1;
    }
    if (len >= cap && cap > 4) /* cut: say so rather than end in the middle of a number */
        snprintf(out + cap - 5, 5, "...");
}

#define OPS_TALLY 8 /* distinct ops counted at one number; more count as none */

/* The op most of members' collectives #seq are (ties: the lowest rank's), "" when none is known. */
static const char *majority_op(const struct flight_pg *const *g, uint32_t n, uint64_t seq)
{
    const char *op[OPS_TALLY];
    uint32_t count[OPS_TALLY], nop = 0, best = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (!g[i] || g[i]->entered < seq)
            continue;
        const char *o = op_at(g[i], seq);
        if (!o[0])
            continue;
        uint32_t k = 0;
        while (k < nop && strcmp(op[k], o) != 0)
            k++;
        if (k == nop) {
            if (nop == OPS_TALLY)
                continue;
            op[nop] = o;
            count[nop++] = 0;
        }
        count[k]++;
    }
    for (uint32_t k = 1; k < nop; k++)
        if (count[k] > count[best])
            best = k;
    return nop ? op[best] : "";
}

/*
 * One process group's verdict: g[i] is rank i's entry for it (NULL: not a
 * member, or no summary). Returns 1 with the sentence, 0 when it blames
 * nobody; blamed, in and past are scratch of n each.
 */
static int blame_pg(const struct flight_pg *const *g, uint32_t n, uint32_t *blamed, uint32_t *in, uint32_t *past,
                    char *out, size_t cap, uint32_t *culprit)
{
    uint32_t members = 0, nb = 0, nin = 0, npast = 0;
    uint64_t lo = UINT64_MAX, hi = 0;
    int pending = 0;
    const char *name = NULL, *desc = NULL;
    for (uint32_t i = 0; i < n; i++) {
        if (!g[i])
            continue;
        members++;
        if (!name) {
            name = g[i]->name;
            desc = g[i]->desc;
        }
        if (g[i]->entered < lo)
            lo = g[i]->entered;
        if (g[i]->entered > hi)
            hi = g[i]->entered;
        if (g[i]->completed < g[i]->entered)
            pending = 1;
    }
    if (members < 2 || !pending)
        return 0; /* nothing to compare, or nobody inside a collective */

    uint64_t seq;
    const char *op;
    char theirs[64] = "";
    if (lo < hi) { /* the ranks at lo never entered lo + 1 */
        seq = lo + 1;
        op = majority_op(g, n, seq);
        for (uint32_t i = 0; i < n; i++) {
            if (!g[i])
                continue;
            if (g[i]->entered == lo)
                blamed[nb++] = i;
            else if (g[i]->entered == seq && g[i]->completed < seq)
                in[nin++] = i;
            else
                past[npast++] = i;
        }
        const char *last = op_at(g[blamed[0]], lo);
        if (nb == 1 && lo && last[0])
            snprintf(theirs, sizeof(theirs), " (its last is %s #%llu)", last, (unsigned long long)lo);
        else if (nb == 1)
            snprintf(theirs, sizeof(theirs), " (its last is #%llu)", (unsigned long long)lo);
        else
            snprintf(theirs, sizeof(theirs), " (their last is #%llu)", (unsigned long long)lo);
    } else { /* all at hi: those not in the op most are in never entered it */
        seq = hi;
        op = majority_op(g, n, seq);
        if (!op[0])
            return 0;
        const char *other = NULL;
        for (uint32_t i = 0; i < n; i++) {
            if (!g[i])
                continue;
            const char *o = op_at(g[i], seq);
            if (o[0] && strcmp(o, op) != 0) {
                blamed[nb++] = i;
                if (!other)
                    other = o;
            } else if (g[i]->completed < seq) {
                in[nin++] = i;
            } else {
                past[npast++] = i;
            }
        }
        if (nb == 0)
            return 0;
        if (nb == 1)
            snprintf(theirs, sizeof(theirs), " (its #%llu is %s)", (unsigned long long)seq, other);
        else
            snprintf(theirs, sizeof(theirs), " (rank %u's #%llu is %s)", blamed[0], (unsigned long long)seq, other);
    }

    char who[160], waiters[160] = "", passed[160] = "", group[96] = "";
    ranges(who, sizeof(who), blamed, nb);
    if (nin)
        ranges(waiters, sizeof(waiters), in, nin);
    if (npast)
        ranges(passed, sizeof(passed), past, npast);
    if (strcmp(desc, "default_pg") != 0)
        snprintf(group, sizeof(group), " of process group %s (%s)", name, desc);
    snprintf(out, cap, "%s never entered %s%s#%llu%s%s; %s%s%s%s%s%s", who, op, op[0] ? " " : "collective ",
             (unsigned long long)seq, group, theirs, waiters, nin ? (nin == 1 ? " waits in it" : " wait in it") : "",
             nin && npast ? ", " : "", passed, npast ? (npast == 1 ? " is past it" : " are past it") : "",
             nin || npast ? "" : "nobody else is in it");
    *culprit = blamed[0];
    return 1;
}

#define SEEN_MAX 64 /* process groups judged at most */

int flight_blame(const struct flight_rank *const *ranks, uint32_t n, char *out, size_t cap, uint32_t *culprit)
{
    out[0] = '\0';
    const struct flight_pg **g = calloc(n ? n : 1, sizeof(*g));
    uint32_t *scratch = malloc(3 * (size_t)(n ? n : 1) * sizeof(uint32_t));
    if (!g || !scratch) {
        free(g);
        free(scratch);
        return -ENOMEM;
    }
    const char *seen[SEEN_MAX];
    unsigned nseen = 0;
    int found = 0;
    for (uint32_t r = 0; r < n && !found && nseen < SEEN_MAX; r++) {
        for (unsigned p = 0; ranks[r] && p < ranks[r]->npgs && !found && nseen < SEEN_MAX; p++) {
            const char *name = ranks[r]->pgs[p].name;
            unsigned k = 0;
            while (k < nseen && strcmp(seen[k], name) != 0)
                k++;
            if (k < nseen)
                continue;
            seen[nseen++] = name;
            for (uint32_t i = 0; i < n; i++)
                g[i] = find_pg(ranks[i], name);
            found = blame_pg(g, n, scratch, scratch + n, scratch + 2 * (size_t)n, out, cap, culprit);
        }
    }
    free(g);
    free(scratch);
    return found;
}
