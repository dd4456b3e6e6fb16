#include "ctl/ctl_render.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- values ------------------------------------------------------------- */

#define CELL 64

static int num(const json_t *obj, const char *key, double *v)
{
    json_t *j = json_object_get(obj, key);
    if (!json_is_number(j))
        return 0;
    *v = json_number_value(j);
    return 1;
}

static const char *str(const json_t *obj, const char *key, const char *dflt)
{
    const char *s = json_string_value(json_object_get(obj, key));
    return s ? s : dflt;
}

static long long integer(const json_t *obj, const char *key)
{
    double v;
    return num(obj, key, &v) ? (long long)v : 0;
}

static void fmt_int(char *buf, const json_t *obj, const char *key)
{
    double v;
    if (num(obj, key, &v))
        snprintf(buf, CELL, "%lld", (long long)v);
    else
        snprintf(buf, CELL, "-");
}

static void fmt_loss(char *buf, const json_t *obj, const char *key)
{
    double v;
    if (num(obj, key, &v))
        snprintf(buf, CELL, "%.4f", v);
    else
        snprintf(buf, CELL, "-");
}

/* 950, 12.3k, 4.56M */
static void fmt_rate(char *buf, const json_t *obj, const char *key)
{
    double v;
    if (!num(obj, key, &v))
        snprintf(buf, CELL, "-");
    else if (v >= 1e6)
        snprintf(buf, CELL, "%.2fM", v / 1e6);
    else if (v >= 1e3)
        snprintf(buf, CELL, "%.1fk", v / 1e3);
    else
        snprintf(buf, CELL, "%.0f", v);
}

static void fmt_pct(char *buf, const json_t *obj, const char *key)
{
    double v;
    if (num(obj, key, &v))
        snprintf(buf, CELL, "%.1f%%", 100.0 * v);
    else
        snprintf(buf, CELL, "-");
}

static void fmt_age(char *buf, const json_t *obj, const char *key)
{
    double v;
    if (num(obj, key, &v))
        snprintf(buf, CELL, "%.1fs", v / 1000.0);
    else
        snprintf(buf, CELL, "-");
}

static void fmt_duration(char *buf, double s)
{
    long long t = (long long)s;
    if (t >= 3600)
        snprintf(buf, CELL, "%lldh%02lldm", t / 3600, t % 3600 / 60);
    else if (t >= 60)
        snprintf(buf, CELL, "%lldm%02llds", t / 60, t % 60);
    else
        snprintf(buf, CELL, "%llds", t);
}

/* [0,1,2,3,8,9] -> "0-3,8-9" */
static void fmt_ranges(char *buf, const json_t *arr)
{
    size_t n = json_array_size(arr), used = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && used < CELL - 1;) {
        long long a = json_integer_value(json_array_get(arr, i)), b = a;
        size_t j = i + 1;
        while (j < n && json_integer_value(json_array_get(arr, j)) == b + 1)
            b = json_integer_value(json_array_get(arr, j++));
        int w = a == b ? snprintf(buf + used, CELL - used, "%s%lld", used ? "," : "", a)
                       : snprintf(buf + used, CELL - used, "%s%lld-%lld", used ? "," : "", a, b);
        used += (size_t)w;
        i = j;
    }
    if (used >= CELL)
        strcpy(buf + CELL - 4, "...");
    if (!buf[0])
        snprintf(buf, CELL, "-");
}

/* ---- tables ------------------------------------------------------------- */

struct table {
    size_t ncols, nrows;
    const char *const *titles;
    const int *right; /* right-aligned columns */
    char (*cells)[CELL];
};

static char *cell(struct table *t, size_t row, size_t col)
{
    return t->cells[row * t->ncols + col];
}

static void table_print(FILE *f, struct table *t)
{
    size_t width[16] = {0};
    for (size_t c = 0; c < t->ncols; c++) {
        width[c] = strlen(t->titles[c]);
        for (size_t r = 0; r < t->nrows; r++)
            if (strlen(cell(t, r, c)) > width[c])
                width[c] = strlen(cell(t, r, c));
    }
    for (size_t r = 0; r <= t->nrows; r++) {
        for (size_t c = 0; c < t->ncols; c++) {
            const char *s = r == 0 ? t->titles[c] : cell(t, r - 1, c);
            int w = (int)width[c];
            if (c == t->ncols - 1 && !t->right[c])
                fputs(s, f);
            else
                fprintf(f, t->right[c] ? "%*s" : "%-*s", w, s);
            fputs(c == t->ncols - 1 ? "\n" : "  ", f);
        }
    }
}

static void table_render(FILE *f, const json_t *rows, size_t ncols, const char *const *titles,
                         const int *right, void (*fill)(char (*row)[CELL], const json_t *item))
{
    struct table t = {ncols, json_array_size(rows), titles, right, NULL};
    t.cells = calloc(t.nrows * ncols + 1, CELL);
    if (!t.cells)
        return;
    for (size_t r = 0; r < t.nrows; r++)
        fill(&t.cells[r * ncols], json_array_get(rows, r));
    table_print(f, &t);
    free(t.cells);
}

static void node_row(char (*row)[CELL], const json_t *n)
{
    snprintf(row[0], CELL, "%s", str(n, "name", "?"));
    /* a joined node that cannot run the job shows it (the reason below the table) */
    const char *fit = str(n, "fit", "fit");
    const int joined = strcmp(str(n, "state", "?"), "joined") == 0;
    /* a hot spare (job key spare_nodes) that is fit is "spare": ready to take a lost node's place */
    const int spare = joined && strcmp(str(n, "role", "member"), "spare") == 0;
    snprintf(row[1], CELL, "%s", joined && strcmp(fit, "fit") != 0 ? fit : spare ? "spare" : str(n, "state", "?"));
    snprintf(row[2], CELL, "%s", str(n, "health", "-"));
    snprintf(row[3], CELL, "%s", str(n, "addr", "-"));
    snprintf(row[4], CELL, "%s", str(n, "kind", "-"));
    fmt_int(row[5], n, "devices");
    fmt_ranges(row[6], json_object_get(n, "ranks"));
    fmt_int(row[7], n, "step_min");
    fmt_rate(row[8], n, "tokens_per_s");
    fmt_age(row[9], n, "heartbeat_age_ms");
}

void render_nodes(FILE *f, const json_t *nodes)
{
    static const char *const titles[] = {"NODE", "STATE", "HEALTH", "ADDRESS", "KIND",
                                         "DEVICES", "RANKS", "STEP", "TOKENS/S", "HEARTBEAT"};
    static const int right[] = {0, 0, 0, 0, 0, 1, 0, 1, 1, 1};
    if (json_array_size(nodes) == 0) {
        fputs("no nodes\n", f);
        return;
    }
    table_render(f, nodes, 10, titles, right, node_row);
    size_t i;
    json_t *n;
    json_array_foreach(nodes, i, n) {
        const char *why = str(n, "unfit_reason", NULL);
        if (why)
            fprintf(f, "node %s is unfit: %s\n", str(n, "name", "?"), why);
    }
}

static void rank_row(char (*row)[CELL], const json_t *r)
{
    fmt_int(row[0], r, "rank");
    snprintf(row[1], CELL, "%s", str(r, "node", "?"));
    fmt_int(row[2], r, "local_rank");
    fmt_int(row[3], r, "device");
    snprintf(row[4], CELL, "%s", str(r, "state", "?"));
    fmt_int(row[5], r, "step");
    fmt_loss(row[6], r, "loss");
    fmt_rate(row[7], r, "tokens_per_s");
    fmt_pct(row[8], r, "comm_frac");
    fmt_age(row[9], r, "heartbeat_age_ms");
    /* where it is: a stopped or hung rank says so first (cut to the cell); a
     * stopped one's frame says more than the call it was stopped in */
    const char *where = str(r, "where", NULL), *waiting = str(r, "waiting", NULL);
    const char *mark = json_is_true(json_object_get(r, "stopped")) ? "stopped"
                       : json_is_true(json_object_get(r, "hung")) ? "hung" : NULL;
    if (waiting && !(mark && mark[0] == 's' && where))
        snprintf(row[10], CELL, "%s%swaiting in %s", mark ? mark : "", mark ? ", " : "", waiting);
    else if (where || mark)
        snprintf(row[10], CELL, "%s%s%s", mark ? mark : "", mark && where ? " at " : "", where ? where : "");
    else
        snprintf(row[10], CELL, "-");
}

void render_ranks(FILE *f, const json_t *ranks)
{
    static const char *const titles[] = {"RANK", "NODE", "LOCAL", "DEVICE", "STATE", "STEP",
                                         "LOSS", "TOKENS/S", "COMM", "HEARTBEAT", "WHERE"};
    static const int right[] = {1, 0, 1, 1, 0, 1, 1, 1, 1, 1, 0};
    if (json_array_size(ranks) == 0) {
        fputs("no ranks\n", f);
        return;
    }
    table_render(f, ranks, 11, titles, right, rank_row);
}

/* ---- summary, events, progress ------------------------------------------ */

/* "  what: 30 running, 2 exited": the non-zero counts of an object of counts. */
static void counts_line(FILE *f, const char *what, const json_t *counts)
{
    const char *key;
    json_t *n;
    int any = 0;
    json_object_foreach((json_t *)counts, key, n) {
        if (!json_integer_value(n))
            continue;
        if (!any)
            fprintf(f, "  %s: ", what);
        fprintf(f, "%s%lld %s", any ? ", " : "", (long long)json_integer_value(n), key);
        any = 1;
    }
    if (any)
        fputc('\n', f);
}

void render_summary(FILE *f, const json_t *st)
{
    char loss[CELL], rate[CELL], comm[CELL], up[CELL];
    const char *reason = str(st, "reason", NULL);
    double v;

    fmt_loss(loss, st, "loss");
    fmt_rate(rate, st, "tokens_per_s");
    fmt_pct(comm, st, "comm_frac");
    if (num(st, "uptime_s", &v))
        fmt_duration(up, v);
    else
        snprintf(up, CELL, "-");

    fprintf(f, "job %s: %s%s%s%s\n", str(st, "job", "?"), str(st, "state", "?"),
            reason ? " (" : "", reason ? reason : "", reason ? ")" : "");
    fprintf(f, "  generation %lld, world size %lld, nodes %lld joined", integer(st, "generation"),
            integer(st, "world_size"), integer(json_object_get(st, "nodes_by_state"), "joined"));
    if (num(st, "nodes_wanted", &v))
        fprintf(f, " of %lld wanted", (long long)v);
    long long spares_wanted = integer(json_object_get(st, "spares"), "wanted");
    if (spares_wanted > 0)
        fprintf(f, " + %lld spare%s", spares_wanted, spares_wanted == 1 ? "" : "s");
    fprintf(f, ", restarts %lld of %lld, daemon up %s\n", integer(st, "restarts"),
            integer(st, "max_restarts"), up);
    const json_t *sp = json_object_get(st, "spares");
    if (integer(sp, "wanted") > 0) {
        fprintf(f, "  spares: %lld of %lld joined, %lld ready, %lld replacement%s", integer(sp, "joined"),
                integer(sp, "wanted"), integer(sp, "ready"), integer(sp, "replacements"),
                integer(sp, "replacements") == 1 ? "" : "s");
        const json_t *x = json_object_get(sp, "last_replacement");
        if (json_is_object(x))
            fprintf(f, "; last: node %s %s, spare node %s took its place (node rank %lld) in generation %lld",
                    str(x, "lost", "?"), str(x, "why", "lost"), str(x, "spare", "?"), integer(x, "node_rank"),
                    integer(x, "generation"));
        fputc('\n', f);
    }
    counts_line(f, "ranks", json_object_get(st, "ranks_by_state"));
    counts_line(f, "node health", json_object_get(st, "nodes_by_health"));
    if (num(st, "step", &v)) {
        double steps, step_s;
        fprintf(f, "  step %lld", (long long)v);
        if (num(st, "steps", &steps))
            fprintf(f, " of %lld", (long long)steps);
        if (num(st, "step_s", &step_s) && step_s > 0)
            fprintf(f, " (%.3g steps/s)", 1 / step_s);
        fprintf(f, ", loss %s, %s tokens/s, %s of step time in communication\n", loss, rate, comm);
    } else
        fputs("  step unknown: the ranks do not report progress (see the rank contract in PROTOCOL.md)\n", f);
    const json_t *plan = json_object_get(st, "plan"), *me = json_object_get(st, "measured");
    const char *kind = str(plan, "kind", "");
    if (strcmp(kind, "program") == 0) {
        /* a program's plan: its predicted communication against the measured step */
        const json_t *pc = json_object_get(plan, "comm");
        fprintf(f, "  plan (%s, %s): %.1f MB sent per step per GPU, %.3f s in communication", str(plan, "parallelism", "?"),
                str(plan, "precision", "?"), json_number_value(json_object_get(pc, "sent_per_step")) / 1e6,
                json_number_value(json_object_get(pc, "comm_s")));
        if (json_is_true(json_object_get(plan, "step_time_measured")))
            fprintf(f, " = %.1f %% of the measured %.3f s step\n",
                    100.0 * json_number_value(json_object_get(pc, "comm_frac")),
                    json_number_value(json_object_get(pc, "step_time")));
        else
            fputs(" (no step time measured yet)\n", f);
    } else if (json_is_object(plan)) {
        char pc[CELL], mc[CELL];
        double peak = json_number_value(json_object_get(json_object_get(plan, "memory"), "peak"));
        double sent = json_number_value(json_object_get(json_object_get(plan, "comm"), "sent_per_step"));
        fmt_pct(pc, json_object_get(plan, "comm"), "comm_frac");
        fmt_pct(mc, me, "comm_frac");
        fprintf(f, "  plan vs measured: communication %s vs %s; sent per step %.1f MiB vs ", pc, mc, sent / 1048576.0);
        if (num(me, "sent_per_step", &v))
            fprintf(f, "%.1f MiB", v / 1048576.0);
        else
            fputs("-", f);
        fprintf(f, "; peak memory per rank %.1f MiB vs ", peak / 1048576.0);
        if (num(me, "peak_mem", &v))
            fprintf(f, "%.1f MiB\n", v / 1048576.0);
        else
            fputs("-\n", f);
    }
    /* the ranks musterd names slow (fail-slow), each with its evidence */
    const json_t *slow = json_object_get(st, "slow_ranks");
    for (size_t i = 0; json_is_array(slow) && i < json_array_size(slow); i++)
        fprintf(f, "  slow: %s\n", str(json_array_get(slow, i), "message", "?"));
    if (num(st, "last_checkpoint_step", &v))
        fprintf(f, "  last committed checkpoint: step %lld\n", (long long)v);
    else
        fputs("  no committed checkpoint yet\n", f);
    const json_t *fail = json_object_get(st, "last_failure");
    if (json_is_object(fail)) {
        const char *said = str(fail, "reason", NULL);
        const char *cls = str(fail, "class", "exit");
        int telling = strcmp(cls, "exit") != 0 && strcmp(cls, "signal") != 0; /* how already says those */
        fprintf(f, "  last failure: rank %lld on node %s %s in generation %lld%s%s%s%s%s\n", integer(fail, "rank"),
                str(fail, "node", "?"), str(fail, "how", "ended"), integer(fail, "generation"), said ? ": " : "",
                said ? said : "", telling ? " [" : "", telling ? cls : "", telling ? "]" : "");
    }
}

void render_event(FILE *f, const json_t *ev)
{
    double rank;
    const char *node = str(ev, "node", NULL);
    fprintf(f, "%s  g%lld  %-14s ", str(ev, "time", "?"), integer(ev, "generation"),
            str(ev, "kind", "?"));
    if (node)
        fprintf(f, "%s ", node);
    if (num(ev, "rank", &rank))
        fprintf(f, "rank %lld ", (long long)rank);
    fprintf(f, "%s%s\n", node || num(ev, "rank", &rank) ? "- " : "", str(ev, "message", ""));
}

void render_progress(FILE *f, const json_t *st, double steps_per_s)
{
    char loss[CELL], rate[CELL];
    double step = 0, steps = 0;
    num(st, "step", &step);
    fmt_loss(loss, st, "loss");
    fmt_rate(rate, st, "tokens_per_s");

    if (num(st, "steps", &steps) && steps > 0) {
        enum { BAR = 30 };
        double frac = step / steps;
        if (frac > 1)
            frac = 1;
        char bar[BAR + 1];
        int full = (int)(frac * BAR);
        for (int i = 0; i < BAR; i++)
            bar[i] = i < full ? '#' : '.';
        bar[BAR] = '\0';
        fprintf(f, "[%s] %5.1f%%  step %.0f/%.0f", bar, 100 * frac, step, steps);
        if (steps_per_s > 0 && step < steps) {
            char eta[CELL];
            fmt_duration(eta, (steps - step) / steps_per_s);
            fprintf(f, "  eta %s", eta);
        }
    } else {
        fprintf(f, "step %.0f", step);
    }
    if (steps_per_s >= 0)
        fprintf(f, "  %.2f steps/s", steps_per_s);
    fprintf(f, "  loss %s  %s tokens/s\n", loss, rate);
}

void render_status_line(FILE *f, const json_t *st)
{
    char loss[CELL], stamp[32];
    time_t now = time(NULL);
    struct tm tm;
    gmtime_r(&now, &tm);
    strftime(stamp, sizeof(stamp), "%Y-%m-%dT%H:%M:%SZ", &tm);
    fmt_loss(loss, st, "loss");
    fprintf(f, "%s state=%s generation=%lld world_size=%lld restarts=%lld step=%lld loss=%s "
               "tokens_per_s=%.0f\n",
            stamp, str(st, "state", "?"), integer(st, "generation"), integer(st, "world_size"),
            integer(st, "restarts"), integer(st, "step"), loss,
            json_number_value(json_object_get(st, "tokens_per_s")));
}

void render_stacks(FILE *f, const json_t *k, int full)
{
    const json_t *ranks = json_object_get(k, "ranks");
    if (!json_is_integer(json_object_get(k, "generation"))) {
        fputs("no stacks asked for yet\n", f);
        return;
    }
    fprintf(f, "stacks of generation %lld, asked for at %s: %lld of %lld ranks answered\n", integer(k, "generation"),
            str(k, "requested", "?"), integer(k, "answered"), integer(k, "expected"));
    const char *summary = str(k, "summary", NULL);
    if (summary)
        fprintf(f, "%s\n", summary);
    if (!full)
        return;
    size_t i;
    const json_t *r;
    json_array_foreach(ranks, i, r) {
        double pid;
        fprintf(f, "\n--- rank %lld (node %s", integer(r, "rank"), str(r, "node", "?"));
        if (num(r, "pid", &pid))
            fprintf(f, ", pid %lld", (long long)pid);
        fprintf(f, "%s) ---\n", json_is_true(json_object_get(r, "stopped")) ? ", stopped" : "");
        const char *text = str(r, "text", NULL), *error = str(r, "error", NULL);
        if (text)
            fprintf(f, "%s%s", text, text[0] && text[strlen(text) - 1] != '\n' ? "\n" : "");
        else if (error)
            fprintf(f, "no stack: %s\n", error);
        else
            fputs(json_is_true(json_object_get(r, "answered")) ? "no stack\n" : "no answer\n", f);
    }
}
