/*
 * musterctl: the command-line client of musterd's REST API.
 *
 *   musterctl [--server URL] [--admin-token-file FILE] [--json] COMMAND
 *
 * Exit status: 0 success, 2 usage error, 1 runtime failure (musterd
 * unreachable, an HTTP error, a job that ended in failure under `watch`).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <curl/curl.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/rand.h>

#include "ctl/ctl_http.h"
#include "ctl/ctl_args.h"
#include "ctl/ctl_doctor.h"
#include "ctl/ctl_plan.h"
#include "ctl/ctl_render.h"

#define DEFAULT_SERVER "http://127.0.0.1:29471"
#define TOKEN_BYTES 32
#define TOKEN_MAX 1024

enum { EXIT_OK = 0, EXIT_FAIL = 1, EXIT_USAGE = 2 };

struct ctl {
    char server[1024];     /* base URL without a trailing slash */
    const char *token_file;
    const char *read_token; /* $MUSTER_READ_TOKEN, sent with reads; NULL = none */
    int json;              /* print raw JSON */
    int polling;           /* events --follow, watch: errors are retried */
};

static volatile sig_atomic_t interrupted;

static void on_sigint(int sig)
{
    interrupted = 1;
}

static void usage(FILE *f)
{
    fputs("Usage: musterctl [OPTION]... COMMAND [ARG]...\n"
          "Show and steer a muster training job through musterd's REST API.\n"
          "\n"
          "Commands:\n"
          "  status              job summary, the nodes (unhealthy first) and the ranks\n"
          "                      (for a large job: the failing and the slowest ones)\n"
          "  nodes [FILTER]...   the nodes table, with each node's health and rollup\n"
          "  ranks [FILTER]...   the ranks table\n"
          "      filters: --state S[,S...]  --node NAME  --offset N  --limit N, and for\n"
          "      nodes --health H[,H...]  --order name|health (docs/rest.md)\n"
          "  events [--follow]   recent events; --follow keeps printing new ones\n"
          "  watch               redraw the status every second (Ctrl-C stops); into a\n"
          "                      pipe or file, one line per change; ends with the job\n"
          "  logs RANK [-f|--follow] [--generation G] [--tail BYTES]\n"
          "                      a rank's output (stdout and stderr) from its node: the\n"
          "                      last BYTES (default 65536) of the newest generation, or\n"
          "                      of generation G; --follow prints new lines as they come\n"
          "                      and goes on into the next generation after a restart\n"
          "  stop                stop the job (admin)\n"
          "  restart             restart the job in a new generation (admin)\n"
          "  checkpoint          checkpoint the running job at its next step boundary (admin)\n"
          "  drain NODE          take NODE out of the job (admin)\n"
          "  stacks [--full]     ask every rank for its stack and say where each is, ranks\n"
          "                      in the same place on one line; --full prints the stacks\n"
          "                      (admin)\n"
          "  plan [JOB|PRESET] [--parallelism P] [--params N] [--precision P] [--nodes N]\n"
          "       [--gpus-per-node G] [--device-memory GB] [--network NET] [--accum N]\n"
          "       [--micro-batch N] [--seq-len N] [--step-time S] ... (plan --help)\n"
          "                      memory per GPU, bytes per gradient sync and per step and\n"
          "                      the time in communication, for muster-train or a DDP,\n"
          "                      FSDP or DeepSpeed ZeRO program (docs/plan.md); without\n"
          "                      JOB, the running job's plan, predicted beside measured\n"
          "  doctor [--job JOB] [--token-file FILE] [--devices-per-node G]\n"
          "         [--control-port PORT] (doctor --help)\n"
          "                      check this node: daemon reachable, token file, --server's\n"
          "                      ports, devices, clock, and JOB's data and checkpoint_dir\n"
          "  token new FILE [--force]\n"
          "                      write a new random admin token to FILE (mode 0600)\n"
          "\n"
          "Options:\n"
          "  --server URL[,URL...]     musterd's REST address (default $MUSTER_SERVER,\n"
          "                            else " DEFAULT_SERVER "); several musterd of\n"
          "                            one job (etcd store): each in turn, and a\n"
          "                            standby's redirect to the leader is followed\n"
          "  --admin-token-file FILE   admin token for stop, restart, checkpoint, drain,\n"
          "                            stacks\n"
          "                            (default $MUSTER_ADMIN_TOKEN)\n"
          "  Reads send $MUSTER_READ_TOKEN when it is set (musterd's read_token_file)\n"
          "  --json                    print the server's JSON instead of tables\n"
          "  -h, --help                show this help and exit\n"
          "  --version                 show the version and exit\n"
          "\n"
          "Exit status: 0 success, 1 failure (musterd unreachable, HTTP error, job\n"
          "failed under watch), 2 usage error.\n",
          f);
}

static int usage_error(const char *fmt, const char *arg)
{
    fputs("musterctl: ", stderr);
    fprintf(stderr, fmt, arg);
    fputs("\nTry 'musterctl --help'.\n", stderr);
    return EXIT_USAGE;
}

/* ---- requests ----------------------------------------------------------- */

/* Errors go to stderr; polling commands print a repeated one only once. */
static void report(const struct ctl *ctl, const char *msg)
{
    static char last[1400];
    if (ctl->polling && strcmp(msg, last) == 0)
        return;
    snprintf(last, sizeof(last), "%s", msg);
    fprintf(stderr, "musterctl: %s\n", msg);
}

/* Prints the JSON error of a reply: "musterctl: <error>: <detail> (HTTP n)". */
static void print_http_error(const struct ctl *ctl, const struct ctl_reply *r)
{
    char msg[1400];
    json_t *doc = json_loads(r->body, 0, NULL);
    const char *error = json_string_value(json_object_get(doc, "error"));
    const char *detail = json_string_value(json_object_get(doc, "detail"));
    if (ctl->json && doc && !ctl->polling)
        printf("%s\n", r->body);
    if (error)
        snprintf(msg, sizeof(msg), "%s%s%s (HTTP %ld)", error, detail ? ": " : "",
                 detail ? detail : "", r->status);
    else
        snprintf(msg, sizeof(msg), "musterd answered HTTP %ld", r->status);
    report(ctl, msg);
    json_decref(doc);
}

/*
 * One request whose 2xx answer is a JSON object. Returns the object (and
 * the raw text in *raw when wanted) or NULL after printing why.
 */
static json_t *fetch(const struct ctl *ctl, const char *method, const char *path,
                     const char *token, char **raw)
{
    struct ctl_reply r;
    char err[1400];
    if (ctl_request(ctl->server, method, path, token ? token : ctl->read_token, &r, err, sizeof(err)) != 0) {
        report(ctl, err);
        return NULL;
    }
    if (r.status < 200 || r.status > 299) {
        print_http_error(ctl, &r);
        ctl_reply_free(&r);
        return NULL;
    }
    json_error_t jerr;
    json_t *doc = json_loads(r.body, 0, &jerr);
    if (!json_is_object(doc)) {
        fprintf(stderr, "musterctl: %s%s answered something that is not a JSON object: %s\n",
                ctl->server, path, doc ? "wrong type" : jerr.text);
        json_decref(doc);
        ctl_reply_free(&r);
        return NULL;
    }
    if (raw)
        *raw = r.body;
    else
        ctl_reply_free(&r);
    return doc;
}

/* ---- read commands ------------------------------------------------------ */

/* Tables of `status` and `watch` stay this long; the lists have the rest. */
#define STATUS_NODES 32
#define STATUS_RANKS 64

/* "(shown of matched WHAT ...)" under a table that does not hold everything. */
static void note_more(const json_t *doc, const char *what, const char *hint)
{
    long long matched = json_integer_value(json_object_get(doc, "matched"));
    size_t shown = json_array_size(json_object_get(doc, what));
    if (matched > (long long)shown)
        printf("(%zu of %lld %s shown%s)\n", shown, matched, what, hint);
}

/* The tables under a status summary: nodes unhealthy first, then the ranks,
 * or for a large job the failing and the slowest ranks the summary names. */
static void show_tables(const struct ctl *ctl, const json_t *st)
{
    char path[64];
    snprintf(path, sizeof(path), "/v1/nodes?order=health&limit=%d", STATUS_NODES);
    json_t *nodes = fetch(ctl, "GET", path, NULL, NULL);
    fputc('\n', stdout);
    if (nodes) {
        render_nodes(stdout, json_object_get(nodes, "nodes"));
        note_more(nodes, "nodes", ", unhealthy first: `musterctl nodes` lists them all");
    }
    json_decref(nodes);
    fputc('\n', stdout);
    if (json_integer_value(json_object_get(st, "world_size")) <= STATUS_RANKS) {
        snprintf(path, sizeof(path), "/v1/ranks?limit=%d", STATUS_RANKS);
        json_t *ranks = fetch(ctl, "GET", path, NULL, NULL);
        if (ranks)
            render_ranks(stdout, json_object_get(ranks, "ranks"));
        json_decref(ranks);
        return;
    }
    const json_t *failing = json_object_get(st, "failing_ranks");
    if (json_array_size(failing)) {
        printf("ranks needing attention (%lld in all, worst first):\n",
               json_integer_value(json_object_get(st, "failing_ranks_total")));
        render_ranks(stdout, failing);
        fputc('\n', stdout);
    }
    puts("slowest ranks:");
    render_ranks(stdout, json_object_get(st, "slowest_ranks"));
}

static int cmd_show(const struct ctl *ctl, const char *what, const char *query)
{
    char path[600], *raw = NULL;
    snprintf(path, sizeof(path), "/v1/%s%s%s", what, query[0] ? "?" : "", query);
    json_t *doc = fetch(ctl, "GET", path, NULL, &raw);
    if (!doc)
        return EXIT_FAIL;
    if (ctl->json) {
        printf("%s\n", raw);
    } else if (strcmp(what, "status") == 0) {
        render_summary(stdout, doc);
        show_tables(ctl, doc);
    } else {
        int nodes = strcmp(what, "nodes") == 0;
        if (nodes)
            render_nodes(stdout, json_object_get(doc, "nodes"));
        else
            render_ranks(stdout, json_object_get(doc, "ranks"));
        note_more(doc, what, ": --offset and --limit page through them");
    }
    free(raw);
    json_decref(doc);
    return EXIT_OK;
}

/* Sleeps up to ms, cut short by Ctrl-C. */
static void nap(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (!interrupted && nanosleep(&ts, &ts) != 0 && errno == EINTR)
        ;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec / 1e9;
}

static void print_events(const struct ctl *ctl, const json_t *events, long long after,
                         long long *last)
{
    size_t i;
    json_t *ev;
    json_array_foreach(events, i, ev) {
        long long seq = json_integer_value(json_object_get(ev, "seq"));
        if (seq <= after)
            continue;
        if (ctl->json) {
            char *line = json_dumps(ev, JSON_COMPACT);
            if (line)
                printf("%s\n", line);
            free(line);
        } else {
            render_event(stdout, ev);
        }
        if (seq > *last)
            *last = seq;
    }
    fflush(stdout);
}

static int cmd_events(struct ctl *ctl, int follow)
{
    long long last = 0;
    char *raw = NULL;
    json_t *doc = fetch(ctl, "GET", "/v1/events", NULL, follow ? NULL : &raw);
    if (!doc)
        return EXIT_FAIL;
    if (!follow && ctl->json)
        printf("%s\n", raw);
    else
        print_events(ctl, json_object_get(doc, "events"), -1, &last);
    free(raw);
    json_decref(doc);

    /* --follow: poll once a second; keep going while musterd restarts. */
    ctl->polling = 1;
    while (follow && !interrupted) {
        nap(1000);
        if (interrupted)
            break;
        doc = fetch(ctl, "GET", "/v1/events", NULL, NULL);
        if (!doc)
            continue;
        json_t *events = json_object_get(doc, "events");
        size_t n = json_array_size(events);
        json_t *tail = json_array_get(events, n ? n - 1 : 0);
        long long newest = json_integer_value(json_object_get(tail, "seq"));
        if (newest < last)
            last = 0; /* a new musterd numbers its events from the start */
        print_events(ctl, events, last, &last);
        json_decref(doc);
    }
    return EXIT_OK;
}

static int terminal_state(const char *state)
{
    return state && (strcmp(state, "completed") == 0 || strcmp(state, "stopped") == 0 ||
                     strcmp(state, "failed") == 0);
}

/* A change worth a line when watching into a pipe: anything but the clocks. */
static char *change_key(const json_t *st)
{
    json_t *key = json_pack("{s:O?,s:O?,s:O?,s:O?,s:O?,s:O?}", "state",
                            json_object_get(st, "state"), "generation",
                            json_object_get(st, "generation"), "world_size",
                            json_object_get(st, "world_size"), "restarts",
                            json_object_get(st, "restarts"), "step", json_object_get(st, "step"),
                            "loss", json_object_get(st, "loss"));
    char *text = key ? json_dumps(key, JSON_COMPACT | JSON_SORT_KEYS) : NULL;
    json_decref(key);
    return text;
}

static int cmd_watch(struct ctl *ctl)
{
    int tty = isatty(STDOUT_FILENO);
    char *last_key = NULL;
    double last_step = -1, last_t = 0, rate = -1;
    int rc = EXIT_OK;

    ctl->polling = 1;
    while (!interrupted) {
        double t0 = now_s();
        char *raw = NULL;
        json_t *st = fetch(ctl, "GET", "/v1/status", NULL, &raw);
        if (st) {
            double step = json_number_value(json_object_get(st, "step"));
            double step_s = json_number_value(json_object_get(st, "step_s"));
            if (step_s > 0) /* the ranks time their steps: no need to guess from two polls */
                rate = 1 / step_s;
            else if (last_step >= 0 && step >= last_step && t0 > last_t)
                rate = rate < 0 ? (step - last_step) / (t0 - last_t)
                                : 0.7 * rate + 0.3 * (step - last_step) / (t0 - last_t);
            else if (step < last_step)
                rate = -1;
            last_step = step;
            last_t = t0;

            if (tty) {
                char stamp[16];
                time_t now = time(NULL);
                struct tm tm;
                localtime_r(&now, &tm);
                strftime(stamp, sizeof(stamp), "%H:%M:%S", &tm);
                fputs("\033[H\033[2J", stdout);
                render_summary(stdout, st);
                render_progress(stdout, st, rate);
                show_tables(ctl, st);
                printf("\n%s  %s  (Ctrl-C to quit)\n", ctl->server, stamp);
            } else {
                char *key = change_key(st);
                if (!last_key || !key || strcmp(key, last_key) != 0) {
                    if (ctl->json)
                        printf("%s\n", raw);
                    else
                        render_status_line(stdout, st);
                }
                free(last_key);
                last_key = key;
            }
            fflush(stdout);
            const char *state = json_string_value(json_object_get(st, "state"));
            int done = terminal_state(state);
            if (done)
                rc = strcmp(state, "failed") == 0 ? EXIT_FAIL : EXIT_OK;
            free(raw);
            json_decref(st);
            if (done)
                break;
        }
        double spent = now_s() - t0;
        if (spent < 1.0)
            nap((long)((1.0 - spent) * 1000));
    }
    free(last_key);
    return rc;
}

/* ---- logs --------------------------------------------------------------- */

#define LOG_TIMEOUT_MS 8000L /* musterd gives the rank's node 5 s to answer */
#define LOG_POLL_MS 500
#define LOG_TAIL_DEFAULT 65536ULL

struct log_reader {
    struct ctl *ctl;
    const char *rank;
    unsigned long long generation; /* being read */
    unsigned long long next;       /* offset to ask for next */
    unsigned long long size;       /* bytes in that generation at the last answer */
    unsigned long long newest;     /* newest generation the rank's node has */
    int mid_line;                  /* the last byte printed was not a newline */
};

/*
 * GET /v1/ranks/R/log?QUERY. Returns the answer (a 2xx log piece), or NULL
 * with *status the HTTP status (0: musterd unreachable or a malformed
 * answer), after saying why unless quiet.
 */
static json_t *log_get(struct log_reader *lr, const char *query, long *status, int quiet)
{
    char path[256], err[1400];
    struct ctl_reply r;
    snprintf(path, sizeof(path), "/v1/ranks/%s/log?%s", lr->rank, query);
    *status = 0;
    if (ctl_request_within(lr->ctl->server, "GET", path, lr->ctl->read_token, LOG_TIMEOUT_MS, &r, err, sizeof(err)) !=
        0) {
        if (!quiet)
            report(lr->ctl, err);
        return NULL;
    }
    *status = r.status;
    json_t *doc = r.status >= 200 && r.status <= 299 ? json_loads(r.body, 0, NULL) : NULL;
    if (r.status < 200 || r.status > 299) {
        if (!quiet)
            print_http_error(lr->ctl, &r);
    } else if (!json_is_string(json_object_get(doc, "data"))) {
        fprintf(stderr, "musterctl: %s%s answered something that is not a log piece\n", lr->ctl->server, path);
        json_decref(doc);
        doc = NULL;
        *status = 0;
    }
    ctl_reply_free(&r);
    return doc;
}

static unsigned long long doc_uint(const json_t *doc, const char *key)
{
    return (unsigned long long)json_integer_value(json_object_get(doc, key));
}

/* Prints a piece and moves the reader past it. asked: the offset asked for, or -1 for a tail. */
static void log_print(struct log_reader *lr, json_t *doc, long long asked)
{
    unsigned long long offset = doc_uint(doc, "offset");
    if (asked >= 0 && offset > (unsigned long long)asked)
        fprintf(stderr, "musterctl: rank %s: %llu bytes of generation %llu were rotated away before they were read\n",
                lr->rank, offset - (unsigned long long)asked, doc_uint(doc, "generation"));
    json_t *data = json_object_get(doc, "data");
    size_t len = json_string_length(data);
    if (lr->ctl->json && (len > 0 || asked < 0)) {
        /* One object a line; a follower's empty answers are left out. */
        char *line = json_dumps(doc, JSON_COMPACT);
        if (line)
            printf("%s\n", line);
        free(line);
    } else if (!lr->ctl->json && len > 0) {
        fwrite(json_string_value(data), 1, len, stdout);
        lr->mid_line = json_string_value(data)[len - 1] != '\n';
    }
    fflush(stdout);
    lr->generation = doc_uint(doc, "generation");
    lr->next = doc_uint(doc, "next_offset");
    lr->size = doc_uint(doc, "size");
    lr->newest = doc_uint(doc, "newest_generation");
}

/* The next piece from where the reader stands; 0 or the HTTP status (-1: unreachable). */
static long log_next(struct log_reader *lr)
{
    char query[128];
    long status;
    snprintf(query, sizeof(query), "generation=%llu&offset=%llu&max=65536", lr->generation, lr->next);
    long long asked = (long long)lr->next;
    json_t *doc = log_get(lr, query, &status, 0);
    if (!doc)
        return status ? status : -1;
    log_print(lr, doc, asked);
    json_decref(doc);
    return 0;
}

/* A restart: the newer generation's log, from its start. */
static void log_switch(struct log_reader *lr, unsigned long long generation)
{
    if (!lr->ctl->json) {
        printf("%s--- rank %s, generation %llu ---\n", lr->mid_line ? "\n" : "", lr->rank, generation);
        fflush(stdout);
    }
    lr->mid_line = 0;
    lr->generation = generation;
    lr->next = 0;
}

static int cmd_logs(struct ctl *ctl, const char *rank, int follow, unsigned long long generation,
                    unsigned long long tail)
{
    struct log_reader lr = {.ctl = ctl, .rank = rank};
    char query[128];
    long status;
    snprintf(query, sizeof(query), "generation=%llu&tail=%llu&max=65536", generation, tail);
    json_t *doc = log_get(&lr, query, &status, 0);
    if (!doc)
        return EXIT_FAIL;
    log_print(&lr, doc, -1);
    json_decref(doc);
    /* A tail longer than one answer, or one that began in the older file. */
    while (lr.next < lr.size && !interrupted) {
        unsigned long long before = lr.next;
        if (log_next(&lr) != 0)
            return EXIT_FAIL;
        if (lr.next == before)
            break; /* no progress: what is left is for the follower's next poll */
    }

    /* --follow: poll from where the last answer ended; keep going through
     * restarts of the rank and of musterd. */
    ctl->polling = 1;
    int more = 0; /* the last answer moved on and left bytes: ask again at once */
    while (follow && !interrupted) {
        if (!more)
            nap(LOG_POLL_MS);
        if (interrupted)
            break;
        unsigned long long before = lr.next;
        status = log_next(&lr);
        more = status == 0 && lr.next > before && lr.next < lr.size;
        if (status == 0 && lr.next >= lr.size && lr.newest > lr.generation) {
            log_switch(&lr, lr.newest); /* caught up with a generation that is over */
        } else if (status == 404) {
            /* Its node lost that generation's log (pruned, or the rank moved): the newest one. */
            snprintf(query, sizeof(query), "generation=0&offset=0&max=1");
            doc = log_get(&lr, query, &status, 1);
            unsigned long long newest = doc ? doc_uint(doc, "generation") : 0;
            json_decref(doc);
            if (newest > lr.generation)
                log_switch(&lr, newest);
        }
    }
    return EXIT_OK;
}

/* ---- admin commands ----------------------------------------------------- */

/* Token from --admin-token-file, else $MUSTER_ADMIN_TOKEN; returns an exit code. */
static int load_token(const struct ctl *ctl, char *buf, size_t len)
{
    if (ctl->token_file) {
        FILE *f = fopen(ctl->token_file, "r");
        if (!f) {
            fprintf(stderr, "musterctl: cannot read admin token file %s: %s\n", ctl->token_file,
                    strerror(errno));
            return EXIT_FAIL;
        }
        struct stat sb;
        if (fstat(fileno(f), &sb) == 0 && (sb.st_mode & 077))
            fprintf(stderr, "musterctl: warning: %s is readable by others (chmod 600 %s)\n",
                    ctl->token_file, ctl->token_file);
        if (!fgets(buf, (int)len, f))
            buf[0] = '\0';
        fclose(f);
    } else if (getenv("MUSTER_ADMIN_TOKEN")) {
        snprintf(buf, len, "%s", getenv("MUSTER_ADMIN_TOKEN"));
    } else {
        fputs("musterctl: this command needs the admin token: --admin-token-file FILE or "
              "MUSTER_ADMIN_TOKEN\nTry 'musterctl --help'.\n",
              stderr);
        return EXIT_USAGE;
    }
    size_t n = strlen(buf);
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' ' ||
                     buf[n - 1] == '\t'))
        buf[--n] = '\0';
    if (n == 0) {
        fprintf(stderr, "musterctl: the admin token %s%s is empty\n",
                ctl->token_file ? "in " : "from MUSTER_ADMIN_TOKEN",
                ctl->token_file ? ctl->token_file : "");
        return EXIT_FAIL;
    }
    return EXIT_OK;
}

static int cmd_admin(const struct ctl *ctl, const char *path)
{
    char token[TOKEN_MAX], *raw = NULL;
    int rc = load_token(ctl, token, sizeof(token));
    if (rc != EXIT_OK)
        return rc;
    json_t *doc = fetch(ctl, "POST", path, token, &raw);
    OPENSSL_cleanse(token, sizeof(token));
    if (!doc)
        return EXIT_FAIL;
    if (ctl->json) {
        printf("%s\n", raw);
    } else {
        const char *node = json_string_value(json_object_get(doc, "node"));
        printf("musterd accepted: %s%s%s\n", json_string_value(json_object_get(doc, "accepted")),
               node ? " " : "", node ? node : "");
    }
    free(raw);
    json_decref(doc);
    return EXIT_OK;
}

/* ---- stacks ------------------------------------------------------------- */

/* How long `stacks` waits for every rank's answer, and how often it looks. */
#define STACKS_WAIT_MS 3000
#define STACKS_POLL_MS 200

/* POST /v1/stacks, then GET /v1/stacks until the new set is whole or
 * STACKS_WAIT_MS passed; prints the set where each rank is (full: and the
 * stack texts). */
static int cmd_stacks(const struct ctl *ctl, int full)
{
    char token[TOKEN_MAX], *raw = NULL;
    int rc = load_token(ctl, token, sizeof(token));
    if (rc != EXIT_OK)
        return rc;
    json_t *doc = fetch(ctl, "GET", "/v1/stacks", NULL, NULL); /* the set before ours */
    json_t *accepted = doc ? fetch(ctl, "POST", "/v1/stacks", token, NULL) : NULL;
    OPENSSL_cleanse(token, sizeof(token));
    if (!accepted) {
        json_decref(doc);
        return EXIT_FAIL;
    }
    json_decref(accepted);
    json_int_t before = json_integer_value(json_object_get(doc, "set"));
    double until = now_s() + STACKS_WAIT_MS / 1000.0;
    int fresh = 0;
    for (;;) {
        json_decref(doc);
        free(raw);
        raw = NULL;
        if (!(doc = fetch(ctl, "GET", "/v1/stacks", NULL, &raw)))
            return EXIT_FAIL;
        fresh = json_integer_value(json_object_get(doc, "set")) > before;
        if ((fresh && json_integer_value(json_object_get(doc, "answered")) >=
                          json_integer_value(json_object_get(doc, "expected"))) ||
            now_s() >= until || interrupted)
            break;
        nap(STACKS_POLL_MS);
    }
    if (ctl->json) {
        printf("%s\n", raw);
    } else {
        if (!fresh)
            printf("(no new set within %.0f s: a hang's stacks were being collected; the latest set follows)\n",
                   STACKS_WAIT_MS / 1000.0);
        render_stacks(stdout, doc, full);
    }
    free(raw);
    json_decref(doc);
    return EXIT_OK;
}

/* ---- token new ---------------------------------------------------------- */

static int cmd_token_new(const char *path, int force)
{
    unsigned char bytes[TOKEN_BYTES];
    char hex[2 * TOKEN_BYTES + 2];
    if (RAND_bytes(bytes, sizeof(bytes)) != 1) {
        fputs("musterctl: cannot get random bytes from OpenSSL\n", stderr);
        return EXIT_FAIL;
    }
    for (size_t i = 0; i < sizeof(bytes); i++)
        snprintf(hex + 2 * i, 3, "%02x", bytes[i]);
    hex[2 * TOKEN_BYTES] = '\n';
    hex[2 * TOKEN_BYTES + 1] = '\0';
    OPENSSL_cleanse(bytes, sizeof(bytes));

    int flags = O_WRONLY | O_CREAT | O_CLOEXEC | O_NOFOLLOW | (force ? O_TRUNC : O_EXCL);
    int fd = open(path, flags, 0600);
    if (fd < 0) {
        if (errno == EEXIST)
            fprintf(stderr, "musterctl: %s exists; not overwriting it (use --force)\n", path);
        else
            fprintf(stderr, "musterctl: cannot create %s: %s\n", path, strerror(errno));
        OPENSSL_cleanse(hex, sizeof(hex));
        return EXIT_FAIL;
    }
    size_t len = strlen(hex);
    int ok = fchmod(fd, 0600) == 0 && write(fd, hex, len) == (ssize_t)len && fsync(fd) == 0;
    int saved = errno;
    OPENSSL_cleanse(hex, sizeof(hex));
    if (close(fd) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        fprintf(stderr, "musterctl: cannot write %s: %s\n", path, strerror(saved));
        return EXIT_FAIL;
    }
    return EXIT_OK;
}

/* ---- arguments ---------------------------------------------------------- */

/* Decimal digits only, at most max; 0 or -1. */
static int parse_count(const char *s, unsigned long long max, unsigned long long *out)
{
    unsigned long long v = 0;
    if (!*s || strlen(s) > 20)
        return -1;
    for (; *s; s++) {
        unsigned d = (unsigned)(*s - '0');
        if (*s < '0' || *s > '9' || v > (max - d) / 10)
            return -1;
        v = v * 10 + d;
    }
    *out = v;
    return 0;
}

/* GET for ctl_plan and ctl_doctor: ctx is a struct ctl whose server is set here. */
static json_t *sub_get(void *ctx, const char *server, const char *path)
{
    struct ctl *ctl = ctx;
    snprintf(ctl->server, sizeof(ctl->server), "%s", server);
    size_t sl = strlen(ctl->server);
    while (sl > 0 && ctl->server[sl - 1] == '/')
        ctl->server[--sl] = '\0';
    return fetch(ctl, "GET", path, NULL, NULL);
}

/* The command word: the first argument that is neither an option nor an option's value. */
static const char *command_word(int argc, char **argv)
{
    static const char *const with_value[] = {"--server", "--admin-token-file", "--generation", "--tail", "--state",
                                             "--node", "--health", "--order", "--offset", "--limit"};
    for (int i = 1; i < argc; i++) {
        if (argv[i][0] != '-')
            return argv[i];
        for (size_t k = 0; k < sizeof(with_value) / sizeof(with_value[0]) && !strchr(argv[i], '='); k++)
            if (strcmp(argv[i], with_value[k]) == 0) {
                i++;
                break;
            }
    }
    return NULL;
}

/* plan and doctor parse their own options (docs/plan.md). */
static int sub_main(int argc, char **argv, const char *word)
{
    struct ctl ctl = {.read_token = getenv("MUSTER_READ_TOKEN")};
    const char *server = getenv("MUSTER_SERVER");
    if (!server || !*server)
        server = DEFAULT_SERVER;
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fputs("musterctl: cannot initialise libcurl\n", stderr);
        return EXIT_FAIL;
    }
    int rc = strcmp(word, "plan") == 0 ? ctl_plan_main(argc, argv, server, sub_get, &ctl)
                                       : ctl_doctor_main(argc, argv, server, sub_get, &ctl);
    curl_global_cleanup();
    return rc;
}

/* "--FILTER VALUE" or "--FILTER=VALUE" for one of names: its value into values. */
static int filter_option(int argc, char **argv, int *i, const char *const *names, const char **values, int *missing)
{
    char opt[16];
    for (int k = 0; k < 6; k++) {
        snprintf(opt, sizeof(opt), "--%s", names[k]);
        const char *v = ctl_option_value(argc, argv, i, opt, missing);
        if (v) {
            values[k] = v;
            return 1;
        }
        if (*missing)
            return 0;
    }
    return 0;
}

/* The filters given, as a query string for cmd's list; the server checks the values. */
static int filter_query(const char *cmd, const char *const *names, const char **values, char *query, size_t cap)
{
    int nodes = strcmp(cmd, "nodes") == 0, ranks = strcmp(cmd, "ranks") == 0;
    size_t used = 0;
    for (int k = 0; k < 6; k++) {
        if (!values[k])
            continue;
        if (!nodes && !ranks)
            return usage_error("--%s only goes with 'nodes' and 'ranks'", names[k]);
        if (ranks && (strcmp(names[k], "health") == 0 || strcmp(names[k], "order") == 0))
            return usage_error("--%s only goes with 'nodes'", names[k]);
        const char *v = values[k];
        if (!*v || strspn(v, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._,-") != strlen(v))
            return usage_error("'%s' is not a filter value (letters, digits and . _ , -)", v);
        int n = snprintf(query + used, cap - used, "%s%s=%s", used ? "&" : "", names[k], v);
        if (n < 0 || (size_t)n >= cap - used)
            return usage_error("filter '%s' is too long", v);
        used += (size_t)n;
    }
    return EXIT_OK;
}

int main(int argc, char **argv)
{
    const char *word = command_word(argc, argv);
    int version = 0;
    for (int i = 1; i < argc; i++)
        version |= strcmp(argv[i], "--version") == 0;
    /* plan and doctor answer --help with their own flags */
    if (word && !version && (strcmp(word, "plan") == 0 || strcmp(word, "doctor") == 0))
        return sub_main(argc, argv, word);

    struct ctl ctl = {.read_token = getenv("MUSTER_READ_TOKEN")};
    const char *server = getenv("MUSTER_SERVER");
    char *args[8];
    int nargs = 0, follow = 0, force = 0, full = 0;
    const char *generation_arg = NULL, *tail_arg = NULL;
    /* list filters, passed on as the query of /v1/nodes or /v1/ranks */
    static const char *const filters[] = {"state", "node", "health", "order", "offset", "limit"};
    const char *filter_arg[6] = {NULL};
    char query[512] = "";

    /* Options may come before or after the command. */
    for (int i = 1; i < argc; i++) {
        int missing = 0;
        const char *v;
        if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return EXIT_OK;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("musterctl %s\n", MUSTER_VERSION);
            return EXIT_OK;
        } else if (strcmp(argv[i], "--json") == 0) {
            ctl.json = 1;
        } else if (strcmp(argv[i], "--follow") == 0 || strcmp(argv[i], "-f") == 0) {
            follow = 1;
        } else if (strcmp(argv[i], "--force") == 0) {
            force = 1;
        } else if (strcmp(argv[i], "--full") == 0) {
            full = 1;
        } else if ((v = ctl_option_value(argc, argv, &i, "--server", &missing))) {
            server = v;
        } else if ((v = ctl_option_value(argc, argv, &i, "--admin-token-file", &missing))) {
            ctl.token_file = v;
        } else if ((v = ctl_option_value(argc, argv, &i, "--generation", &missing))) {
            generation_arg = v;
        } else if ((v = ctl_option_value(argc, argv, &i, "--tail", &missing))) {
            tail_arg = v;
        } else if (filter_option(argc, argv, &i, filters, filter_arg, &missing)) {
            continue;
        } else if (missing) {
            return usage_error("option '%s' needs a value", argv[i]);
        } else if (argv[i][0] == '-' && argv[i][1] != '\0') {
            return usage_error("unknown option '%s'", argv[i]);
        } else if (nargs < (int)(sizeof(args) / sizeof(args[0]))) {
            args[nargs++] = argv[i];
        } else {
            return usage_error("too many arguments (from '%s')", argv[i]);
        }
    }
    if (nargs == 0)
        return usage_error("%s", "no command given");

    if (!server || !*server)
        server = DEFAULT_SERVER;
    /* One URL, or the musterd of one job as a list (URL,URL: ctl_http.h). */
    ctl.server[0] = '\0';
    for (const char *b = server;;) {
        size_t n = strcspn(b, ","), sl = strlen(ctl.server);
        if ((strncmp(b, "http://", 7) != 0 && strncmp(b, "https://", 8) != 0) || n <= 8)
            return usage_error("--server '%s' is not an http:// or https:// URL (or a list of them, "
                               "comma-separated)", server);
        if (sl + n + 2 > sizeof(ctl.server))
            return usage_error("--server '%.40s...' is too long", server);
        snprintf(ctl.server + sl, sizeof(ctl.server) - sl, "%s%.*s", sl ? "," : "", (int)n, b);
        sl = strlen(ctl.server);
        while (sl > 0 && ctl.server[sl - 1] == '/')
            ctl.server[--sl] = '\0';
        if (!b[n])
            break;
        b += n + 1;
    }

    const char *cmd = args[0];
    int want_args = 1;
    if (strcmp(cmd, "drain") == 0)
        want_args = 2;
    else if (strcmp(cmd, "token") == 0)
        want_args = 3;
    else if (strcmp(cmd, "logs") == 0)
        want_args = 2;
    if (follow && strcmp(cmd, "events") != 0 && strcmp(cmd, "logs") != 0)
        return usage_error("--follow only goes with 'events' and 'logs'%s", "");
    if ((generation_arg || tail_arg) && strcmp(cmd, "logs") != 0)
        return usage_error("%s only goes with 'logs'", generation_arg ? "--generation" : "--tail");
    unsigned long long generation = 0, tail = LOG_TAIL_DEFAULT;
    if (generation_arg && parse_count(generation_arg, 9007199254740991ULL, &generation) != 0)
        return usage_error("--generation: expected a generation (1, 2, ...; 0 = the newest), got '%s'",
                           generation_arg);
    if (tail_arg && (parse_count(tail_arg, 4294967295ULL, &tail) != 0 || tail == 0))
        return usage_error("--tail: expected a number of bytes 1..4294967295, got '%s'", tail_arg);
    if (force && strcmp(cmd, "token") != 0)
        return usage_error("--force only goes with 'token new'%s", "");
    if (full && strcmp(cmd, "stacks") != 0)
        return usage_error("--full only goes with 'stacks'%s", "");
    int rc = filter_query(cmd, filters, filter_arg, query, sizeof(query));
    if (rc != EXIT_OK)
        return rc;

    static const char *const known[] = {"status", "nodes", "ranks", "events", "watch",
                                        "stop", "restart", "checkpoint", "drain", "token", "logs", "stacks"};
    int is_known = 0;
    for (size_t k = 0; k < sizeof(known) / sizeof(known[0]); k++)
        is_known |= strcmp(cmd, known[k]) == 0;
    if (!is_known)
        return usage_error("unknown command '%s'", cmd);
    if (nargs != want_args) {
        if (strcmp(cmd, "drain") == 0)
            return usage_error("%s", "usage: musterctl drain NODE");
        if (strcmp(cmd, "token") == 0)
            return usage_error("%s", "usage: musterctl token new FILE [--force]");
        if (strcmp(cmd, "logs") == 0)
            return usage_error("%s", "usage: musterctl logs RANK [-f] [--generation G] [--tail BYTES]");
        return usage_error("'%s' takes no arguments", cmd);
    }

    if (strcmp(cmd, "token") == 0) {
        if (strcmp(args[1], "new") != 0)
            return usage_error("unknown token command '%s' (expected 'new')", args[1]);
        return cmd_token_new(args[2], force);
    }
    unsigned long long rank;
    if (strcmp(cmd, "logs") == 0 && parse_count(args[1], 4294967295ULL, &rank) != 0)
        return usage_error("'%s' is not a rank (0, 1, 2, ...)", args[1]);

    struct sigaction sa;
    memset(&sa, 0, sizeof(sa));
    sa.sa_handler = on_sigint;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != CURLE_OK) {
        fputs("musterctl: cannot initialise libcurl\n", stderr);
        return EXIT_FAIL;
    }

    if (strcmp(cmd, "status") == 0 || strcmp(cmd, "nodes") == 0 || strcmp(cmd, "ranks") == 0) {
        rc = cmd_show(&ctl, cmd, query);
    } else if (strcmp(cmd, "events") == 0) {
        rc = cmd_events(&ctl, follow);
    } else if (strcmp(cmd, "watch") == 0) {
        rc = cmd_watch(&ctl);
    } else if (strcmp(cmd, "logs") == 0) {
        rc = cmd_logs(&ctl, args[1], follow, generation, tail);
    } else if (strcmp(cmd, "stop") == 0) {
        rc = cmd_admin(&ctl, "/v1/job/stop");
    } else if (strcmp(cmd, "restart") == 0) {
        rc = cmd_admin(&ctl, "/v1/job/restart");
    } else if (strcmp(cmd, "checkpoint") == 0) {
        rc = cmd_admin(&ctl, "/v1/job/checkpoint");
    } else if (strcmp(cmd, "stacks") == 0) {
        rc = cmd_stacks(&ctl, full);
    } else {
        char path[256];
        const char *node = args[1];
        size_t n = strlen(node);
        if (n == 0 || n > 63 || strspn(node, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
                                              "0123456789._-") != n) {
            curl_global_cleanup();
            return usage_error("'%s' is not a node name (1 to 63 of A-Z a-z 0-9 . _ -)", node);
        }
        snprintf(path, sizeof(path), "/v1/nodes/%s/drain", node);
        rc = cmd_admin(&ctl, path);
    }
    curl_global_cleanup();
    return rc;
}
