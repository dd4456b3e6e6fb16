/*
 * daemon/rdv_hang.c: hangs and stacks: finding a hung rank, asking every
 * rank for its stack before the generation fails, and saying where each was
 * (see rdv.h; the progress timeout is daemon/hang.h's).
 *
 * Naming (name_hung): a rank whose process is stopped, else a quiet one (no
 * heartbeat entry for three intervals while its node beats), else the ranks
 * not inside a collective while others wait in one, else the rank found
 * stuck; with where each is and the ranks waiting as ranges ("ranks 0-2, 5").
 *
 * A stopped process is conclusive: a rank seen stopped while its reporting
 * peers have not stepped either, both for HANG_STOPPED_MS, is hung then,
 * without waiting for the progress timeout (stopped_due). A rank that exits
 * with a collective's error (a timeout, a peer's connection closed) while a
 * peer is stopped or quiet is put down to that peer (rdv__blame_peer).
 */
#include "daemon/rdv_internal.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/sbuf.h"
#include "common/flight.h"

void rdv__stacks_clear(struct rdv_stacks *k)
{
    for (uint32_t i = 0; i < k->nranks; i++) {
        free(k->ranks[i].text);
        free(k->ranks[i].fr);
        free(k->ranks[i].ras);
    }
    free(k->ranks);
    k->ranks = NULL;
    k->nranks = k->nanswered = 0;
    k->bytes = 0;
    k->cut = 0;
}

/* Of len bytes of UTF-8, how many to keep so that at most want are kept
 * and no character is split. */
static size_t utf8_prefix(const char *s, size_t len, size_t want)
{
    if (len <= want)
        return len;
    while (want > 0 && ((unsigned char)s[want] & 0xC0) == 0x80)
        want--;
    return want;
}

/*
 * A dump as kept: its first bytes within k->rank_max and what the set has
 * left of k->total_max (room, counted as JSON text), with
 * a line that says what was cut, as a JSON string literal. NULL when out of
 * memory; *cut gets the bytes not kept.
 */
static char *kept_text(const struct rdv_stacks *k, const char *dump, size_t room, uint32_t *cut, size_t *out_len)
{
    static const char marker[] = "\n[musterd cut %zu bytes of this dump: it keeps %zu bytes a rank, %zu in all]";
    size_t len = strlen(dump), keep = utf8_prefix(dump, len, k->rank_max);
    char note[160];
    struct sbuf b = {0};
    for (;;) {
        b.len = 0;
        note[0] = '\0';
        if (keep < len)
            snprintf(note, sizeof(note), marker, len - keep, k->rank_max, k->total_max);
        char *part = strndup(dump, keep);
        if (!part) {
            free(b.p);
            return NULL;
        }
        struct sbuf t = {0};
        sb_put(&t, part, keep);
        sb_put(&t, note, strlen(note));
        free(part);
        char *whole = sb_finish(&t, NULL);
        if (!whole) {
            free(b.p);
            return NULL;
        }
        sb_json_str(&b, whole);
        free(whole);
        /* escaping can double a text: cut more until it fits what the set has left */
        if (b.failed || b.len <= room || keep == 0)
            break;
        size_t over = b.len - room;
        keep = utf8_prefix(dump, len, keep > over ? keep - over : 0);
    }
    if (b.len > room) { /* not even the note fits: nothing is kept */
        free(b.p);
        *cut = (uint32_t)len;
        *out_len = 0;
        return NULL;
    }
    *cut = (uint32_t)(len - keep);
    return sb_finish(&b, out_len);
}

/* How long rank rk's step has stood still. A rank that times its own
 * steps (step_age_ms) is judged as of its latest entry, by its own clock,
 * while its entries come (a step seen late is not a stall); by now once it
 * is quiet, and a rank that does not time them by now. */
static uint64_t stalled_ms(const struct rdv *r, const struct rdv_rank *rk, uint64_t now_ms)
{
    const uint64_t quiet = 3 * (uint64_t)r->spec->heartbeat_interval_ms;
    uint64_t as_of = rk->timed && rk->entry_ms && now_ms - rk->entry_ms <= quiet ? rk->entry_ms : now_ms;
    return as_of > rk->progress_ms ? as_of - rk->progress_ms : 0;
}

/* Asks every member node for its ranks' stacks (COMMAND stacks): the set
 * of r->stacks starts over for the current generation. */
int rdv__ask_stacks(struct rdv *r)
{
    struct rdv_stacks *k = &r->stacks;
    rdv__stacks_clear(k);
    if (!(k->ranks = calloc(r->world_size ? r->world_size : 1, sizeof(*k->ranks))))
        return -ENOMEM;
    k->nranks = r->world_size;
    k->generation = r->generation;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    k->wall_ms = (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
    k->version++;
    k->asked++;
    for (uint32_t i = 0; i < r->nnodes; i++)
        if (r->nodes[i].member && r->nodes[i].state == RDV_NODE_JOINED)
            rdv__send_command(r, i, PROTO_CMD_STACKS);
    return 0;
}

/* Every running rank of the generation asked for has answered. */
int rdv__stacks_complete(const struct rdv *r)
{
    const struct rdv_stacks *k = &r->stacks;
    if (k->generation != r->generation || k->nranks != r->world_size)
        return 0;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (r->ranks[i].state == RDV_RANK_RUNNING && !k->ranks[i].answered)
            return 0;
    return 1;
}

void rdv__on_stacks(struct rdv *r, uint32_t node, const struct proto_stacks *x)
{
    struct rdv_stacks *k = &r->stacks;
    const struct rdv_node *nd = &r->nodes[node];
    if (x->generation != k->generation || x->rank >= k->nranks || !nd->member || x->rank < nd->first_rank ||
        x->rank >= nd->first_rank + nd->ndevices)
        return;
    struct rdv_stack *e = &k->ranks[x->rank];
    char *text = NULL, *fr = NULL, *ras = NULL;
    static struct flight_rank parsed; /* only to check it: the loop's, 2 KiB */
    size_t len = 0;
    uint32_t cut = 0;
    k->bytes -= e->len; /* an answer again replaces the one before */
    if (x->text && x->text[0]) {
        size_t room = k->total_max > k->bytes ? k->total_max - k->bytes : 0;
        text = kept_text(k, x->text, room, &cut, &len);
        if (!text && !cut) {
            k->bytes += e->len;
            return; /* out of memory */
        }
    }
    k->cut -= e->cut;
    if (x->fr && x->fr[0] && flight_parse(x->fr, strlen(x->fr), &parsed, NULL) == 0 && !(fr = strdup(x->fr))) {
        free(text);
        k->bytes += e->len;
        k->cut += e->cut;
        return; /* out of memory */
    }
    if (x->ras && x->ras[0]) {
        if (!(ras = strdup(x->ras))) {
            free(text);
            free(fr);
            k->bytes += e->len;
            k->cut += e->cut;
            return; /* out of memory */
        }
        proto_log_sanitize(ras, strlen(ras)); /* lines of text, as the agent said them */
    }
    free(e->text);
    free(e->fr);
    free(e->ras);
    e->text = text;
    e->len = len;
    e->cut = cut;
    k->bytes += len;
    k->cut += cut;
    e->fr = fr;
    e->ras = ras;
    if (!e->answered)
        k->nanswered++;
    e->answered = 1;
    e->pid = x->pid;
    e->stopped = x->stopped;
    snprintf(e->error, sizeof(e->error), "%s", x->error);
    k->version++;
    rdv__changed(r, 0);
}

/* One line per group of ranks in the same place, into out: "rank 3 (node b,
 * pid 1234, stopped): train.py:88 in compute_loss", "ranks 0-2: waiting in
 * all_reduce (...)", "rank 1: no stack: <its error>". From what the ranks
 * said in their heartbeats and what their STACKS said. */
void rdv__stacks_summary(const struct rdv *r, char *out, size_t cap)
{
    size_t len = 0;
    uint32_t *group = malloc((size_t)r->world_size * sizeof(uint32_t));
    char *done = calloc(r->world_size ? r->world_size : 1, 1);
    out[0] = '\0';
    if (!group || !done) {
        free(group);
        free(done);
        return;
    }
    const struct rdv_stacks *k = &r->stacks;
    int have = k->generation == r->generation && k->nranks == r->world_size;
    uint32_t blamed;
    char verdict[PROTO_REASON_MAX];
    if (rdv__flight_verdict(r, verdict, sizeof(verdict), &blamed) == 1)
        len = (size_t)snprintf(out, cap, "flight recorder: %s\n", verdict);
    if (len >= cap)
        len = 0;
    for (uint32_t i = 0; have && i < r->world_size && len + 1 < cap; i++) {
        const char *ras = k->ranks[i].ras;
        for (const char *l = ras; l && *l && len + 1 < cap;) {
            const char *nl = strchr(l, '\n');
            int n = nl ? (int)(nl - l) : (int)strlen(l);
            int w = snprintf(out + len, cap - len, "rank %u (node %s): %.*s\n", i, r->nodes[r->ranks[i].node].name,
                             n, l);
            if (w < 0 || (size_t)w >= cap - len) {
                out[len] = '\0';
                break;
            }
            len += (size_t)w;
            l = nl ? nl + 1 : l + n;
        }
    }
    for (uint32_t i = 0; i < r->world_size && len + 1 < cap; i++) {
        const struct rdv_rank *rk = &r->ranks[i];
        const struct rdv_stack *e = have ? &k->ranks[i] : NULL;
        if (done[i])
            continue;
        char line[PROTO_REASON_MAX + PROTO_WHERE_MAX + 200];
        if (rk->stopped || (e && e->stopped) || (!rk->waiting[0] && rk->where[0])) {
            /* a rank of its own: stopped, or busy outside a collective */
            snprintf(line, sizeof(line), "rank %u (node %s%s%.0u%s): %s%s%s\n", i, r->nodes[rk->node].name,
                     e && e->pid ? ", pid " : "", e && e->pid ? e->pid : 0, rk->stopped || (e && e->stopped) ?
                     ", stopped" : "", rk->where[0] ? rk->where : "where is not known",
                     e && !e->text && e->error[0] ? "; no stack: " : "", e && !e->text ? e->error : "");
            done[i] = 1;
        } else {
            /* the ranks in the same call (or in the same unknown place) */
            uint32_t n = 0;
            for (uint32_t j = i; j < r->world_size; j++) {
                const struct rdv_rank *o = &r->ranks[j];
                if (!done[j] && !o->stopped && !(have && k->ranks[j].stopped) && (o->waiting[0] || !o->where[0]) &&
                    strcmp(o->waiting, rk->waiting) == 0) {
                    group[n++] = j;
                    done[j] = 1;
                }
            }
            char ranks[200];
            hang_ranges(ranks, sizeof(ranks), group, n);
            if (rk->waiting[0])
                snprintf(line, sizeof(line), "%s: waiting in %s\n", ranks, rk->waiting);
            else
                snprintf(line, sizeof(line), "%s: where is not known (no report of it%s%s)\n", ranks,
                         e && !e->text && e->error[0] ? "; " : "", e && !e->text ? e->error : "");
        }
        size_t n = strlen(line);
        if (len + n >= cap)
            break;
        memcpy(out + len, line, n + 1);
        len += n;
    }
    if (len && out[len - 1] == '\n')
        out[--len] = '\0';
    proto_text_sanitize(out);
    free(group);
    free(done);
}

/* Whether rank i of r is quiet: running and reporting, but no heartbeat
 * entry from it for three intervals while its node beats. */
static int rank_quiet(const struct rdv *r, uint32_t i, uint64_t now_ms)
{
    const uint64_t quiet = 3 * (uint64_t)r->spec->heartbeat_interval_ms;
    const struct rdv_rank *rk = &r->ranks[i];
    return rk->state == RDV_RANK_RUNNING && !rk->silent && rk->last_beat_ms && now_ms - rk->last_beat_ms > quiet &&
           now_ms - r->nodes[rk->node].last_seen_ms <= quiet;
}

/* When rank i of r is hung by the stopped rule (above) unless something
 * changes: HANG_STOPPED_MS after the later of its stop and its running,
 * reporting peers' last step; 0 when the rule does not apply (not stopped,
 * or no such peer). */
static uint64_t stopped_due(const struct rdv *r, uint32_t i)
{
    const struct rdv_rank *rk = &r->ranks[i];
#ifdef MUSTER_MUTANT_NO_STOPPED_RULE
    /* A broken detector for `make check-mutants` only (tests/mutants.sh): a stopped rank waits for the timeout. */
    return 0;
#endif
    if (rk->state != RDV_RANK_RUNNING || !rk->stopped)
        return 0;
    uint64_t since = rk->stopped_since_ms;
    int peers = 0;
    for (uint32_t j = 0; j < r->world_size; j++) {
        const struct rdv_rank *p = &r->ranks[j];
        if (j == i || p->state != RDV_RANK_RUNNING || p->silent || p->stopped)
            continue;
        if (p->progress_ms > since) /* it stepped since: it has waited only from then on */
            since = p->progress_ms;
        peers++;
    }
    return peers ? since + HANG_STOPPED_MS : 0;
}

int rdv__blame_peer(const struct rdv *r, uint32_t exited, uint64_t now_ms, const char **why)
{
    for (uint32_t j = 0; j < r->world_size; j++)
        if (j != exited && r->ranks[j].state == RDV_RANK_RUNNING && r->ranks[j].stopped) {
            *why = "whose process is stopped (SIGSTOP or a debugger)";
            return (int)j;
        }
    for (uint32_t j = 0; j < r->world_size; j++)
        if (j != exited && rank_quiet(r, j, now_ms)) {
            *why = "from which no heartbeat came while its node answers";
            return (int)j;
        }
    return -1;
}

/* The running ranks inside a collective, and the call the lowest of them is in. */
static uint32_t waiting_ranks(const struct rdv *r, uint32_t *out, const char **call)
{
    uint32_t n = 0;
    *call = NULL;
    for (uint32_t i = 0; i < r->world_size; i++) {
        const struct rdv_rank *rk = &r->ranks[i];
        if (rk->state != RDV_RANK_RUNNING || !rk->waiting[0] || rk->stopped)
            continue;
        if (!*call)
            *call = rk->waiting;
        out[n++] = i;
    }
    return n;
}

/* "; ranks 0-2 wait in all_reduce (distributed_c10d.py)" when some do. */
static void waiting_tail(const struct rdv *r, char *out, size_t cap, uint32_t *scratch)
{
    const char *call;
    uint32_t n = waiting_ranks(r, scratch, &call);
    out[0] = '\0';
    if (n == 0)
        return;
    char ranks[160];
    hang_ranges(ranks, sizeof(ranks), scratch, n);
    snprintf(out, cap, "; %s %s in %s", ranks, n == 1 ? "waits" : "wait", call);
}

/* " at train.py:88 in compute_loss" when the rank said where it is. */
static void where_at(const struct rdv_rank *rk, char *out, size_t cap)
{
    if (rk->where[0])
        snprintf(out, cap, " at %s", rk->where);
    else
        out[0] = '\0';
}

/*
 * Says which rank of r is hung, now that rank stuck (running, its step
 * still for limit_ms) was found: *culprit (the rank to fail the generation
 * for) and the sentence into what.
 */
static void name_hung(const struct rdv *r, uint32_t stuck, uint64_t now_ms, uint64_t limit_ms, uint32_t *culprit,
                      char *what, size_t cap)
{
    uint32_t *scratch = malloc((size_t)r->world_size * sizeof(uint32_t));
    uint32_t *others = malloc((size_t)r->world_size * sizeof(uint32_t));
    const struct rdv_rank *st = &r->ranks[stuck];
    char tail[320], where[PROTO_WHERE_MAX + 8], timing[96];
    snprintf(timing, sizeof(timing), "every rank stuck at step %llu for %.1f s (progress timeout %.1f s)",
             (unsigned long long)st->step, (double)(now_ms - st->progress_ms) / 1000.0, (double)limit_ms / 1000.0);
    if (!scratch || !others) { /* out of memory: the plain wording, no lists */
        *culprit = stuck;
        snprintf(what, cap, "rank %u on node %s is hung: %s", stuck, r->nodes[st->node].name, timing);
        free(scratch);
        free(others);
        return;
    }
    waiting_tail(r, tail, sizeof(tail), scratch);

    /* (a) a process seen stopped */
    uint32_t nstopped = 0;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (r->ranks[i].state == RDV_RANK_RUNNING && r->ranks[i].stopped)
            others[nstopped++] = i;
    if (nstopped) {
        const struct rdv_rank *q = &r->ranks[others[0]];
        *culprit = others[0];
        where_at(q, where, sizeof(where));
        /* found by the stopped rule or the progress timeout: both facts hold */
        snprintf(timing, sizeof(timing), "seen stopped for %.1f s, every rank stuck at step %llu for %.1f s",
                 (double)(now_ms - q->stopped_since_ms) / 1000.0, (unsigned long long)st->step,
                 (double)(now_ms - st->progress_ms) / 1000.0);
        if (nstopped == 1) {
            snprintf(what, cap, "rank %u on node %s is hung: its process is stopped (SIGSTOP or a debugger)%s%s; %s",
                     others[0], r->nodes[q->node].name, where, tail, timing);
        } else {
            char ranks[160];
            hang_ranges(ranks, sizeof(ranks), others, nstopped);
            snprintf(what, cap, "%s are hung: their processes are stopped (SIGSTOP or a debugger; rank %u on node "
                     "%s%s)%s; %s", ranks, others[0], r->nodes[q->node].name, where, tail, timing);
        }
        goto done;
    }
    /* (b) quiet: its agent stopped hearing from it while the node beats */
    uint32_t quietest = r->world_size;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (rank_quiet(r, i, now_ms) &&
            (quietest == r->world_size || r->ranks[i].last_beat_ms < r->ranks[quietest].last_beat_ms))
            quietest = i;
    if (quietest < r->world_size) {
        const struct rdv_rank *q = &r->ranks[quietest];
        *culprit = quietest;
        where_at(q, where, sizeof(where));
        snprintf(what, cap, "rank %u on node %s is hung: no heartbeat from it for %.1f s while its node answers%s, "
                 "and %s%s", quietest, r->nodes[q->node].name, (double)(now_ms - q->last_beat_ms) / 1000.0, where,
                 timing, tail);
        goto done;
    }
    /* (c) outside any collective while others wait in one */
    const char *call;
    uint32_t nwait = waiting_ranks(r, scratch, &call), nout = 0;
    if (nwait) {
        for (uint32_t i = 0; i < r->world_size; i++)
            if (r->ranks[i].state == RDV_RANK_RUNNING && !r->ranks[i].silent && !r->ranks[i].waiting[0])
                others[nout++] = i;
    }
    if (nwait && nout) {
        const struct rdv_rank *q = &r->ranks[others[0]];
        *culprit = others[0];
        char waiters[160];
        hang_ranges(waiters, sizeof(waiters), scratch, nwait);
        if (q->where[0])
            snprintf(where, sizeof(where), "at %s", q->where);
        else
            snprintf(where, sizeof(where), "where is not known");
        if (nout == 1) {
            snprintf(what, cap, "rank %u on node %s is hung: it is not in a collective (%s) while %s %s in %s; %s",
                     others[0], r->nodes[q->node].name, where, waiters, nwait == 1 ? "waits" : "wait", call, timing);
        } else {
            char ranks[160];
            hang_ranges(ranks, sizeof(ranks), others, nout);
            snprintf(what, cap, "%s are hung: not in a collective (rank %u on node %s %s) while %s %s in %s; %s",
                     ranks, others[0], r->nodes[q->node].name, where, waiters, nwait == 1 ? "waits" : "wait", call,
                     timing);
        }
        goto done;
    }
    /* (d) the rank found stuck */
    *culprit = stuck;
    where_at(st, where, sizeof(where));
    snprintf(what, cap, "rank %u on node %s is hung: stuck at step %llu for %.1f s (progress timeout %.1f s)%s%s",
             stuck, r->nodes[st->node].name, (unsigned long long)st->step,
             (double)(now_ms - st->progress_ms) / 1000.0, (double)limit_ms / 1000.0, st->waiting[0] ? "" : where,
             tail);
done:
    free(scratch);
    free(others);
}

/* Without the flight recorder's verdict, NCCL's RAS may name the rank: the
 * first rank whose process RAS says is behind in a collective's count (its
 * peers wait in one it never issued), else one RAS says is dead. */
static void ras_named(struct rdv *r)
{
    const struct rdv_stacks *k = &r->stacks;
    if (k->generation != r->generation || k->nranks != r->world_size)
        return;
    static const char *const rule[] = {"it is behind", "considered dead"};
    for (size_t w = 0; w < sizeof(rule) / sizeof(rule[0]); w++)
        for (uint32_t i = 0; i < r->world_size; i++) {
            const char *ras = k->ranks[i].ras, *hit = ras ? strstr(ras, rule[w]) : NULL;
            if (!hit)
                continue;
            const char *start = hit;
            while (start > ras && start[-1] != '\n')
                start--;
            const char *end = strchr(hit, '\n');
            int n = end ? (int)(end - start) : (int)strlen(start);
            r->hang_rank = (int)i;
            r->hang_node = (int)r->ranks[i].node;
            snprintf(r->hang_what, sizeof(r->hang_what), "rank %u on node %s is hung: %.*s", i,
                     r->nodes[r->hang_node].name, n, start);
            proto_text_sanitize(r->hang_what);
            return;
        }
}

/* When the ranks' flight recorders name the rank behind: the rules of
 * name_hung named it too (a rank outside any collective) and the verdict
 * adds the collective to their words (where it is), or they named another
 * (a rank that skipped a collective waits in the next one like its peers,
 * and every rank waits) and the verdict is the reason. */
static void flight_named(struct rdv *r)
{
    uint32_t culprit;
    char verdict[PROTO_REASON_MAX], what[PROTO_REASON_MAX];
    if (rdv__flight_verdict(r, verdict, sizeof(verdict), &culprit) != 1 || culprit >= r->world_size) {
        ras_named(r);
        return;
    }
    if (r->hang_rank == (int)culprit)
        snprintf(what, sizeof(what), "%s; torch's flight recorder: %s", r->hang_what, verdict);
    else
        snprintf(what, sizeof(what), "rank %u on node %s is hung: %s (torch's flight recorder)", culprit,
                 r->nodes[r->ranks[culprit].node].name, verdict);
    r->hang_rank = (int)culprit;
    r->hang_node = (int)r->ranks[culprit].node;
    memcpy(r->hang_what, what, sizeof(r->hang_what));
    proto_text_sanitize(r->hang_what);
}

/* The hung generation's stacks came (or their wait ran out): fail it, with
 * where each rank was in the event and in last_failure. */
void rdv__finish_hang(struct rdv *r, uint64_t now_ms)
{
    r->hang_pending = 0;
    flight_named(r);
    struct rdv_failure *f = &r->last_failure;
    memset(f, 0, sizeof(*f));
    f->generation = r->generation;
    f->rank = (uint32_t)r->hang_rank;
    snprintf(f->node, sizeof(f->node), "%s", r->nodes[r->hang_node].name);
    snprintf(f->how, sizeof(f->how), "is hung");
    f->cls = (int)FAILURE_EXIT;
    snprintf(f->reason, sizeof(f->reason), "%s", r->hang_what);
    rdv__stacks_summary(r, f->detail, sizeof(f->detail));
    rdv__event(r, "rank_hung", r->hang_node, r->hang_rank, "%s", r->hang_what);
    if (f->detail[0])
        rdv__event(r, "rank_stacks", r->hang_node, r->hang_rank, "%s", f->detail);
    rdv__fail_generation(r, now_ms, r->hang_node, r->hang_rank, r->hang_what);
}

/* A hung rank found: ask for the stacks first, so that they are dumped
 * before the ranks are stopped; finish_hang fails the generation. */
static void found_hung(struct rdv *r, uint32_t stuck, uint64_t limit, uint64_t now_ms)
{
    uint32_t culprit = stuck;
    name_hung(r, stuck, now_ms, limit, &culprit, r->hang_what, sizeof(r->hang_what));
#ifdef MUSTER_MUTANT_HANG_NAMES_RANK0
    /* A broken detector for `make check-mutants` only (tests/mutants.sh): it names rank 0, whichever hung. */
    culprit = 0;
    snprintf(r->hang_what, sizeof(r->hang_what), "rank 0 on node %s is hung", r->nodes[r->ranks[0].node].name);
#endif
    proto_text_sanitize(r->hang_what);
    r->hang_rank = (int)culprit;
    r->hang_node = (int)r->ranks[culprit].node;
    r->hang_generation = r->generation;
    r->hang_fail_at_ms = now_ms + HANG_STACKS_WAIT_MS;
    r->hang_pending = 1;
    if (rdv__ask_stacks(r) != 0 || rdv__stacks_complete(r))
        rdv__finish_hang(r, now_ms);
}

/* A rank that heartbeats but whose step stands still is hung (e.g. in a
 * collective); so is a silent one whose process stays stopped. */
void rdv__check_progress(struct rdv *r, uint64_t now_ms)
{
    if (r->hang_pending) {
        if (r->hang_generation != r->generation || r->state != RDV_RUNNING)
            r->hang_pending = 0;
        else if (now_ms >= r->hang_fail_at_ms || rdv__stacks_complete(r))
            rdv__finish_hang(r, now_ms);
        return;
    }
    const uint64_t limit = hang_timeout_ms(&r->steps, r->spec->progress_timeout_ms);
    r->progress_limit_ms = limit;
    if (limit == 0 || r->state != RDV_RUNNING || r->yielding) /* yielding ranks stop on purpose */
        return;
    if (now_ms < r->hang_due_ms)
        return;
    uint64_t oldest = now_ms, due = UINT64_MAX;
    for (uint32_t i = 0; i < r->world_size; i++) {
        const struct rdv_rank *rk = &r->ranks[i];
        if (rk->state != RDV_RANK_RUNNING)
            continue;
        const uint64_t stop_due = stopped_due(r, i); /* conclusive: no need to wait for the timeout */
        if (stop_due && now_ms >= stop_due) {
            found_hung(r, i, HANG_STOPPED_MS, now_ms);
            return;
        }
        if (stop_due && stop_due < due)
            due = stop_due;
        if (rk->silent) { /* only a process seen stopped counts */
            if (!rk->stopped)
                continue;
            if (rk->stopped_since_ms < oldest)
                oldest = rk->stopped_since_ms;
            if (now_ms - rk->stopped_since_ms > limit) {
                found_hung(r, i, limit, now_ms);
                return;
            }
            continue;
        }
        if (rk->progress_ms < oldest)
            oldest = rk->progress_ms;
        if (stalled_ms(r, rk, now_ms) > limit) {
            found_hung(r, i, limit, now_ms);
            return;
        }
    }
    /* A rank's progress only moves later, and one that starts to count
     * (running, no longer silent, stopped) starts its clock now. */
    r->hang_due_ms = oldest + limit + 1;
    if (due < r->hang_due_ms) /* a stopped rank is judged again when its bound is over */
        r->hang_due_ms = due;
}
