#include "worker/agent/agent_rank.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "common/log.h"

static void list_remove(struct agent_rank *r)
{
    for (struct agent_rank **p = r->list; *p; p = &(*p)->next) {
        if (*p == r) {
            *p = r->next;
            return;
        }
    }
}

static void maybe_free(struct agent_rank *r)
{
    if (r->open_handles == 0 && r->released) {
        list_remove(r);
        rank_log_close(&r->log);
        free(r);
    }
}

static void on_handle_closed(uv_handle_t *h)
{
    struct agent_rank *r = h->data;
    r->open_handles--;
    maybe_free(r);
}

static void close_handle(struct agent_rank *r, uv_handle_t *h)
{
    if (!uv_is_closing(h)) {
        h->data = r;
        uv_close(h, on_handle_closed);
    }
}

/* ---- output capture ---------------------------------------------------- */

/* Appends line + newline to the tail, dropping the oldest lines past RANK_TAIL_MAX. */
static void keep_line(struct rank_output *o, const char *line, size_t len)
{
    if (len > RANK_TAIL_MAX - 1) {
        line += len - (RANK_TAIL_MAX - 1);
        len = RANK_TAIL_MAX - 1;
    }
    size_t need = len + 1;
    if (o->tail_len + need > RANK_TAIL_MAX) {
        size_t drop = o->tail_len + need - RANK_TAIL_MAX;
        char *nl = memchr(o->tail + drop - 1, '\n', o->tail_len - (drop - 1));
        drop = nl ? (size_t)(nl - o->tail) + 1 : o->tail_len;
        memmove(o->tail, o->tail + drop, o->tail_len - drop);
        o->tail_len -= drop;
    }
    for (size_t i = 0; i < len; i++) /* a NUL would end the kept text early */
        o->tail[o->tail_len + i] = line[i] ? line[i] : ' ';
    o->tail_len += len;
    o->tail[o->tail_len++] = '\n';
    o->tail[o->tail_len] = '\0';
}

/* newline: the rank ended the line (not split for length, not cut by EOF). */
static void emit_line(struct rank_output *o, bool newline)
{
    char buf[RANK_LINE_MAX + 32];
    rank_log_append(&o->r->log, o->line, o->len, newline);
    if (o->keep_tail)
        keep_line(o, o->line, o->len);
    int n = o->r->spare ? snprintf(buf, sizeof(buf), "spare (pid %d): %.*s\n", o->r->pid, (int)o->len, o->line)
                        : snprintf(buf, sizeof(buf), "rank %u: %.*s\n", o->r->rank, (int)o->len, o->line);
    if (n > (int)sizeof(buf))
        n = (int)sizeof(buf);
    fwrite(buf, 1, (size_t)n, stderr);
    o->len = 0;
}

static void output_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf)
{
    struct rank_output *o = h->data;
    (void)suggested;
    if (o->len == RANK_LINE_MAX)
        emit_line(o, false); /* a line longer than the buffer: split it */
    *buf = uv_buf_init(o->line + o->len, (unsigned)(RANK_LINE_MAX - o->len));
}

static void report_exit(struct agent_rank *r);

static void output_close(struct rank_output *o)
{
    if (!o->open)
        return;
    o->open = false;
    o->pipe.data = o->r;
    close_handle(o->r, (uv_handle_t *)&o->pipe);
    if (!o->r->out.open && !o->r->err.open)
        rank_log_close(&o->r->log);
    if (o->keep_tail && o->r->reaped)
        report_exit(o->r);
}

static void output_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf)
{
    struct rank_output *o = s->data;
    (void)buf;
    if (nread < 0) {
        if (o->len > 0)
            emit_line(o, false);
        output_close(o);
        return;
    }
    size_t start = o->len;
    o->len += (size_t)nread;
    /* Emit every complete line; keep the tail. */
    for (;;) {
        char *nl = memchr(o->line + start, '\n', o->len - start);
        if (!nl)
            break;
        size_t full = o->len, linelen = (size_t)(nl - o->line);
        o->len = linelen;
        emit_line(o, true);
        size_t rest = full - linelen - 1;
        memmove(o->line, nl + 1, rest);
        o->len = rest;
        start = 0;
    }
}

/* ---- control connection ------------------------------------------------ */

static void ctl_msg(struct fconn *c, struct proto_msg *msg)
{
    struct agent_rank *r = c->data;
    const uint64_t now = uv_now(r->proc.loop);
    r->spoke = true;
    if (r->heard_ms && now - r->heard_ms > r->frame_gap_ms)
        r->frame_gap_ms = now - r->heard_ms;
    r->heard_ms = now;
    r->cb.on_msg(r, msg);
}

/* A few bad frames are logged; a rank that keeps sending them loses its socket
 * (it runs on, silent), so that it cannot flood the agent's log. */
#define BAD_FRAMES_LOGGED 3
#define BAD_FRAMES_MAX 100

static void ctl_bad(struct fconn *c, int err)
{
    struct agent_rank *r = c->data;
    r->bad_frames++;
    if (r->bad_frames <= BAD_FRAMES_LOGGED)
        log_warn("rank %u: ignoring a bad frame on its control socket: %s%s", r->rank, proto_strerror(err),
                 r->bad_frames == BAD_FRAMES_LOGGED ? " (further ones are counted, not logged)" : "");
    if (r->bad_frames == BAD_FRAMES_MAX && r->ctl) {
        log_warn("rank %u: %d bad frames on its control socket; closing it (the rank keeps running)", r->rank,
                 BAD_FRAMES_MAX);
        fconn_close(r->ctl);
        r->ctl = NULL;
    }
}

static void ctl_fail(struct fconn *c, int err, const char *why)
{
    struct agent_rank *r = c->data;
    /* A rank that exits closes its end first; its exit status follows. A rank
     * that never reads its socket (any program) may be gone before a write. */
    if (err == UV_EOF || err == UV_ECONNRESET || err == UV_EPIPE)
        log_debug("rank %u: control socket closed", r->rank);
    else
        log_warn("rank %u: control socket: %s", r->rank, why);
    fconn_close(c);
    r->ctl = NULL;
}

static void ctl_closed(struct fconn *c)
{
    struct agent_rank *r = c->data;
    r->open_handles--;
    maybe_free(r);
}

/* ---- process ----------------------------------------------------------- */

/* Once: the process has ended and its stderr is read (or the drain timed out). */
static void report_exit(struct agent_rank *r)
{
    if (!r->running)
        return;
    r->running = false;
    uv_timer_stop(&r->kill_timer);
    close_handle(r, (uv_handle_t *)&r->kill_timer);
    r->cb.on_exit(r, r->exit_code, r->exit_signal);
}

static void on_drain_timer(uv_timer_t *t)
{
    struct agent_rank *r = t->data;
    log_debug("rank %u: stderr still open %d ms after exit; reporting the exit", r->rank, RANK_DRAIN_MS);
    report_exit(r);
}

static void on_proc_exit(uv_process_t *p, int64_t exit_status, int term_signal)
{
    struct agent_rank *r = p->data;
    r->reaped = true;
    /* The rank is gone; what it started goes with it (its group, see signal_rank). */
    kill(-r->pid, SIGKILL);
    uv_timer_stop(&r->kill_timer);
    close_handle(r, (uv_handle_t *)&r->proc);
    if (r->ctl) {
        fconn_close(r->ctl);
        r->ctl = NULL;
    }
    r->beat.state = PROTO_RANK_EXITED;
    r->exit_code = term_signal ? -1 : (int)exit_status;
    r->exit_signal = term_signal;
    /* Its last words (a traceback) may still sit in the stderr pipe. */
    if (!r->err.open)
        report_exit(r);
    else
        uv_timer_start(&r->kill_timer, on_drain_timer, RANK_DRAIN_MS, 0);
}

/*
 * A rank runs in a process group of its own (UV_PROCESS_DETACHED makes it a
 * session leader), so stopping it reaches whatever it started too: no
 * grandchild outlives its rank holding the output pipes.
 */
static void signal_rank(struct agent_rank *r, int sig)
{
    if (kill(-r->pid, sig) != 0)
        uv_process_kill(&r->proc, sig);
}

static void on_kill_timer(uv_timer_t *t)
{
    struct agent_rank *r = t->data;
    if (r->reaped)
        return;
    log_warn("rank %u (pid %d) did not stop within its grace period; sending SIGKILL", r->rank, r->pid);
    signal_rank(r, SIGKILL);
}

static void take_identity(struct agent_rank *r, const struct rank_identity *id, const struct rank_callbacks *cb)
{
    r->cb = *cb;
    r->generation = id->generation;
    r->rank = id->rank;
    r->local_rank = id->local_rank;
    r->beat.rank = id->rank;
    r->beat.state = PROTO_RANK_STARTING;
}

static void list_push(struct agent_rank *r, struct agent_rank **list)
{
    r->list = list;
    r->next = *list;
    *list = r;
}

/* handoff_fd >= 0: a spare's, given to it as its fd 4. */
static struct agent_rank *spawn(uv_loop_t *loop, struct agent_rank **list, char **argv, char **env,
                                const struct rank_identity *id, const struct rank_callbacks *cb, int handoff_fd,
                                int *err)
{
    struct agent_rank *r = calloc(1, sizeof(*r));
    if (!r) {
        *err = UV_ENOMEM;
        return NULL;
    }
    rank_log_init(&r->log);
    take_identity(r, id, cb);
    r->spare = handoff_fd >= 0;
    list_push(r, list);

    int sp[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sp) != 0) {
        *err = -errno;
        r->released = true;
        maybe_free(r);
        return NULL;
    }
    r->out.r = r->err.r = r;
    uv_pipe_init(loop, &r->out.pipe, 0);
    uv_pipe_init(loop, &r->err.pipe, 0);
    uv_timer_init(loop, &r->kill_timer);
    r->out.pipe.data = &r->out;
    r->err.pipe.data = &r->err;
    r->kill_timer.data = r;
    r->proc.data = r;
    r->open_handles = 4; /* out, err, kill timer, process */
    r->out.open = r->err.open = true;
    r->err.keep_tail = true;
    r->spawned_ms = uv_now(loop);

    uv_stdio_container_t stdio[5];
    stdio[0].flags = UV_IGNORE;
    stdio[1].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[1].data.stream = (uv_stream_t *)&r->out.pipe;
    stdio[2].flags = UV_CREATE_PIPE | UV_WRITABLE_PIPE;
    stdio[2].data.stream = (uv_stream_t *)&r->err.pipe;
    stdio[3].flags = UV_INHERIT_FD;
    stdio[3].data.fd = sp[1];
    stdio[4].flags = UV_INHERIT_FD;
    stdio[4].data.fd = handoff_fd;

    uv_process_options_t opts;
    memset(&opts, 0, sizeof(opts));
    opts.exit_cb = on_proc_exit;
    opts.file = argv[0];
    opts.args = argv;
    opts.env = env;
    opts.stdio_count = handoff_fd >= 0 ? 5 : 4;
    opts.stdio = stdio;
    opts.flags = UV_PROCESS_DETACHED; /* its own process group: see signal_rank() */

    int rc = uv_spawn(loop, &r->proc, &opts);
    close(sp[1]);
    if (rc != 0) {
        close(sp[0]);
        *err = rc;
        r->released = true;
        output_close(&r->out);
        output_close(&r->err);
        close_handle(r, (uv_handle_t *)&r->kill_timer);
        close_handle(r, (uv_handle_t *)&r->proc);
        return NULL;
    }
    r->pid = r->proc.pid;
    r->running = true;
    uv_read_start((uv_stream_t *)&r->out.pipe, output_alloc, output_read);
    uv_read_start((uv_stream_t *)&r->err.pipe, output_alloc, output_read);

    r->ctl = fconn_new_pipe(loop, sp[0], r);
    if (!r->ctl) {
        close(sp[0]);
        log_error("rank %u: cannot open its control socket; stopping it", r->rank);
        uv_process_kill(&r->proc, SIGKILL);
        return r;
    }
    r->open_handles++;
    r->ctl->on_msg = ctl_msg;
    r->ctl->on_bad = ctl_bad;
    r->ctl->on_fail = ctl_fail;
    r->ctl->on_closed = ctl_closed;
    if (fconn_start(r->ctl) != 0) {
        fconn_close(r->ctl);
        r->ctl = NULL;
    }
    return r;
}

struct agent_rank *rank_spawn(uv_loop_t *loop, struct agent_rank **list, char **argv, char **env,
                              const struct rank_identity *id, const struct rank_callbacks *cb, int *err)
{
    return spawn(loop, list, argv, env, id, cb, -1, err);
}

struct agent_rank *rank_spawn_spare(uv_loop_t *loop, struct agent_rank **list, char **argv, char **env,
                                    int handoff_fd, const struct rank_callbacks *cb, int *err)
{
    const struct rank_identity none = {0};
    return spawn(loop, list, argv, env, &none, cb, handoff_fd, err);
}

void rank_take_up(struct agent_rank *r, struct agent_rank **list, const struct rank_identity *id,
                  const struct rank_callbacks *cb)
{
    list_remove(r);
    list_push(r, list);
    take_identity(r, id, cb);
    r->spare = false;
    r->spawned_ms = uv_now(r->proc.loop);
    r->err.tail_len = 0; /* what the spare said while it waited explains no failure of the rank */
    r->err.tail[0] = '\0';
}

void rank_send(struct agent_rank *r, const struct proto_msg *msg)
{
    if (!r->ctl)
        return;
    int rc = fconn_send(r->ctl, msg);
    if (rc == 0)
        return;
    if (rc == UV_ENOBUFS) {
        log_warn("rank %u is not reading its control socket (write queue full); closing it", r->rank);
        fconn_close(r->ctl);
        r->ctl = NULL;
        return;
    }
    log_warn("rank %u: cannot send %s: %s", r->rank, proto_type_name(msg->type),
             rc == UV_EPROTO ? proto_strerror(r->ctl->encode_err) : uv_strerror(rc));
}

void rank_stop(struct agent_rank *r, uint64_t generation, uint64_t grace_ms)
{
    if (!r->running || r->reaped || r->stopping)
        return;
    r->stopping = true;
    r->beat.state = PROTO_RANK_STOPPING;
    struct proto_msg m;
    memset(&m, 0, sizeof(m));
    m.type = PROTO_COMMAND;
    m.u.command.generation = generation;
    m.u.command.action = PROTO_CMD_STOP;
    rank_send(r, &m);
    signal_rank(r, SIGTERM);
    uv_timer_start(&r->kill_timer, on_kill_timer, grace_ms, 0);
}

void rank_kill(struct agent_rank *r)
{
    if (r->running && !r->reaped)
        signal_rank(r, SIGKILL);
}

void rank_release(struct agent_rank *r)
{
    r->released = true;
    maybe_free(r);
}

void rank_close(struct agent_rank *r)
{
    output_close(&r->out);
    output_close(&r->err);
    close_handle(r, (uv_handle_t *)&r->kill_timer);
    close_handle(r, (uv_handle_t *)&r->proc);
    if (r->ctl) {
        fconn_close(r->ctl);
        r->ctl = NULL;
    }
}
