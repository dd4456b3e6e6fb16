/*
 * agent_internal.h: what the files of the node agent (worker/agent/agent*.c
 * below) share, and nothing else includes. Three tiers of names, as rdv's:
 * agent_ in agent.h for agent_main.c, agent__ here across the agent's files,
 * static within one. Each function is described where it is defined.
 *
 *   agent.c             the agent's life: agent_run, the watchdog tick, shutdown
 *   agent_link.c        the link to the daemon: connect, HELLO, heartbeats, stalls
 *   agent_daemon_msg.c  frames from the daemon: handshake, WELCOME / REJECT, fencing, dispatch
 *   agent_gen.c         generations: ASSIGN and UNIQUE_ID
 *   agent_ranks.c       the running ranks: their messages and exits
 *   agent_spawn.c       starting the ranks: directories, command, devices, warm spare, MASTER_PORT
 *   agent_command.c     COMMANDs (stacks, flight, RAS, shutdown, ...) and log requests
 *   agent_fit.c         the pre-flight glue (agent_preflight.h runs the checks)
 */
#ifndef MUSTER_WORKER_AGENT_INTERNAL_H
#define MUSTER_WORKER_AGENT_INTERNAL_H

#include <limits.h>
#include <netdb.h>
#include <signal.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <uv.h>

#include "common/jobspec.h"
#include "common/ratelimit.h"
#include "worker/agent/agent.h"
#include "worker/agent/agent_preflight.h"
#include "worker/agent/agent_rank.h"
#include "worker/agent/exit_queue.h"
#include "worker/agent/frame_conn.h"
#include "worker/agent/memckpt.h"
#include "worker/agent/memdrain.h"
#include "worker/agent/memrep.h"
#include "worker/agent/nccl_ras.h"
#include "worker/agent/rank_flight.h"
#include "worker/agent/rank_stacks.h"
#include "worker/agent/spare.h"

/* A connect or handshake step that takes longer than this is abandoned. */
#define HANDSHAKE_TIMEOUT_MS 5000
/*
 * Link stalls. The agent asks the daemon to answer a heartbeat once every
 * proto_ack_every_ms (the other heartbeats say "ack": false and cost the
 * daemon no write), and on every heartbeat while a rank's exit waits to be
 * confirmed (exit_queue.h). A heartbeat that asked and that the daemon has
 * not answered within proto_stall_ms (a quarter of heartbeat_timeout_ms, at
 * least 200 ms) means the stream is stalled,
 * typically behind TCP's retransmission backoff after a brief cut. The agent
 * then reconnects at once and resumes its session (HELLO.session) while the
 * daemon still counts the node as joined: until heartbeat_timeout_ms after
 * the last frame heard, connection attempts are RESUME_RETRY_MS apart and
 * each is given RESUME_CONNECT_MS (a lost SYN is retried by TCP only after
 * a second). The stalled connection is kept open, unread, until the new one
 * is welcomed, so that the daemon never sees it close first.
 */
#define RESUME_RETRY_MS 50
/* A standby that names no leader (an election is under way) is asked again after this long. */
#define FOLLOW_RETRY_MS 250
/* Several daemons: a connection attempt that takes longer moves to the next. */
#define FOLLOW_CONNECT_MS 1000
#define RESUME_CONNECT_MS 50
/* Period of the lease / handshake watchdog. */
#define TICK_MS 100
/* A rank that has not spoken on its control socket this long after its start is
 * running by its process alone ("silent": step unknown, no hang detection). */
#define RANK_SILENT_GRACE_MS 1000
/* A log answer is refused ("busy") while this much waits to go to the daemon:
 * log pieces (up to ~130 KiB each) must never crowd out heartbeats or fill
 * the connection's write queue (FCONN_WRITE_QUEUE_MAX), which would drop it. */
#define LOG_SEND_QUEUE_MAX (1u << 20)
/* Generations whose rank directories are kept (error files, logs). */
#define KEEP_GENERATIONS 5

/* The signal on which a Python rank's start-up hook dumps its stacks (MUSTER_STACKS_SIGNAL):
 * a real-time one, which no library uses by default. */
#define STACKS_SIGNAL (SIGRTMIN + 5)

/* The link to the daemon. */
enum link_state {
    LINK_IDLE,       /* no connection; the retry timer runs */
    LINK_RESOLVING,  /* uv_getaddrinfo in flight */
    LINK_CONNECTING, /* uv_tcp_connect in flight (one address after another) */
    LINK_HELLO,      /* HELLO sent; waiting for CHALLENGE: the peer has proven nothing yet */
    LINK_AUTH,       /* the daemon proved the token, RESPONSE sent; waiting for WELCOME or
                      * REJECT; every frame either way sealed from here on */
    LINK_JOINED,     /* welcomed: heartbeats flow, assignments come */
    LINK_CLOSED,     /* shutting down: no more attempts */
};

/* The state names, for logs (agent_link.c). */
extern const char *const agent__link_names[];

struct agent {
    const struct agent_config *cfg;
    uv_loop_t *loop;

    /* the daemon joined or tried now (one of daemons) */
    struct daemon_list daemons;
    char daemon[DAEMON_ADDR_MAX];
    char host[HOSTPORT_HOST_MAX];
    uint16_t port;
    unsigned tried;  /* daemons tried since the last join (a round through the list) */
    bool followed;   /* a standby's REJECT named the leader since the last join */

    /* link to the daemon */
    enum link_state link;
    uint64_t link_since; /* uv_now when the state was entered */
    struct fconn *conn;
    uv_getaddrinfo_t gai;
    bool gai_busy;
    struct addrinfo *ai_list, *ai_next;
    int last_connect_err;
    uv_connect_t connect_req;
    uv_timer_t retry_timer, beat_timer, tick_timer;
    uv_timer_t connect_timer; /* while resuming: the deadline of one connection attempt */
    uv_signal_t sigterm, sigint;
    struct backoff backoff;
    uint64_t rng;
    uint64_t last_rx; /* uv_now of the last frame from the daemon */
    uint32_t heartbeat_interval_ms, heartbeat_timeout_ms, lease_ms;
    uint64_t beat_seq;
    uint64_t unanswered_since; /* first heartbeat that asked for an answer since the daemon's last frame; 0 = none */
    uint32_t ack_every_ms;     /* ask for an answer this often (proto_ack_every_ms) */
    uint64_t beats_since_answer; /* heartbeats sent since the daemon's last answer or WELCOME */
    uint64_t last_beat_at;     /* uv_now of the last heartbeat sent */
    uint64_t session;          /* WELCOME's, named in the next HELLO to resume it; 0 = none */
    struct fconn *stalled;     /* the stalled connection, kept until the session is resumed */
    uint64_t stalled_at;
    uint64_t resume_until;     /* quick reconnects until then (the daemon's deadline); 0 = not resuming */
    struct exitq exits;        /* RANK_EXITs the daemon may not have read (exit_queue.h) */
    struct proto_bind bind;    /* this connection's handshake (HELLO on) */
    uint64_t unproven;         /* peers refused: no proof of the token, or a frame before it */
    char local_addr[PROTO_NAME_MAX];

    /* generations and ranks */
    uint64_t cur_gen; /* newest generation heard of; older messages are ignored */
    bool have_assign;
    struct proto_assign assign; /* holds a reference to assign.job */
    struct job_spec spec;       /* the held job, parsed (defaults before any) */
    bool spawn_pending;         /* spawn the held assignment once no rank runs */
    struct agent_rank *ranks[PROTO_MAX_LOCAL_RANKS]; /* by slot of the held assignment */
    uint32_t nranks;
    struct agent_rank *all; /* every rank object not yet freed */
    struct spare_pool spare; /* the warm spare (job key warm_spares) */
    char spare_said[256];    /* why warm_spares is off, as last logged ("" = nothing said) */
    bool have_uid;
    struct proto_unique_id uid;
    /* The unique id rank 0 of this node created, as it was sent up: sent
     * again to a daemon that restarted before handing it out. */
    bool have_made_uid;
    struct proto_unique_id made_uid;
    uint64_t repeated_uids;  /* rank 0's unique ids of a generation after its first: not sent up */
    struct ratelimit daemon_ignored_log; /* lines about the daemon's ignored frames */

    bool told_ready; /* READY=1 sent to systemd (first join) */

    /* device facts (NVML, read once at start) and the pre-flight of the job */
    uint32_t ngpus;
    struct proto_gpu gpus[PROTO_MAX_LOCAL_RANKS];
    bool preflight_promised; /* the last HELLO said a PREFLIGHT would follow */
    int64_t hello_wall_ms;   /* wall clock when it was sent */
    bool trainer;            /* the held job's ranks are muster-train */
    char preflight_said[PROTO_REASON_MAX]; /* the verdict last logged ("" = fit) */
    bool preflight_logged;   /* since this join: repeats of the same verdict are not logged */
    char preflight_ckpt[PROTO_CKPT_NAME_MAX]; /* the latest checkpoint last reported; with */
    bool preflight_had_ckpt; /* whether one was: a fit node's same report again is not sent */
    struct agent_preflight pf;

    char state_dir[PATH_MAX]; /* "" = none usable: ranks get no error file */
    uint32_t free_port;       /* latest port found free for MASTER_PORT; 0 = none */
    bool port_warned;         /* "no free port" is in the log */

    /* COMMAND stacks being answered: one dump per rank of the generation (rank_stacks.h) */
    uv_timer_t stacks_timer;
    struct stacks_dump *stacks; /* malloc'd while a request is answered; NULL = none */
    struct flight_ask *flights; /* the same ranks' flight recorder summaries (rank_flight.h) */
    struct ras_query ras;       /* NCCL's RAS service asked about the job (nccl_ras.h) */
    uint32_t nstacks;
    uint64_t stacks_since;      /* uv_now when it began */

    /* the job's memory checkpoint directory (memckpt.h) */
    struct memckpt mem;
    struct memrep rep;         /* its copies at the buddy node and the buddy's here (memrep.h) */
    struct memdrain drain;     /* its copies in checkpoint_dir (memdrain.h) */
    bool mem_drop;             /* the job is over (COMMAND shutdown): removed once the ranks are gone */

    /* shutdown */
    bool exiting;
    bool closed;
    int exit_code;
};

/* agent.c: the agent's life */
void agent__msg_init(struct proto_msg *m, enum proto_type type);
void agent__maybe_finish(struct agent *a);
void agent__agent_exit(struct agent *a, int code);

/* agent_ranks.c: the running ranks */
bool agent__any_running(const struct agent *a);
bool agent__quiet(const struct agent_rank *r, uint64_t now);
bool agent__responsive(const struct agent *a, const struct agent_rank *r);
bool agent__any_outgoing(const struct agent *a);
bool agent__any_unstopped(const struct agent *a);
bool agent__ranks_live(const struct agent *a);
void agent__stop_all(struct agent *a, uint64_t generation);
void agent__send_rank_exit(struct agent *a, uint64_t generation, uint32_t rank, int code, int sig,
                           const char *reason, const char *detail, bool stopped);
void agent__send_unread_exits(struct agent *a);
void agent__rank_on_msg(struct agent_rank *r, struct proto_msg *msg);
void agent__rank_on_exit(struct agent_rank *r, int code, int sig);

/* agent_spawn.c: starting the ranks */
int agent__make_dirs(const char *path, mode_t mode);
void agent__rank_dir(const struct agent *a, uint64_t gen, uint32_t rank, char *out, size_t cap);
void agent__python_hook_path(const struct agent *a, const struct job_spec *spec, bool trainer, char *out,
                             size_t cap);
char **agent__rank_command(const struct agent *a, const struct job_spec *spec, bool *from_job);
void agent__keep_spare_unassigned(struct agent *a);
void agent__release_ranks(struct agent *a);
bool agent__kept(const struct agent *a, uint32_t i);
void agent__hand_assignment(struct agent *a, struct agent_rank *r, const struct proto_msg *assign_msg);
void agent__spawn_all(struct agent *a);
void agent__refresh_free_port(struct agent *a);

/* agent_link.c: the link to the daemon */
uint32_t agent__rng_next(struct agent *a);
void agent__link_set_state(struct agent *a, enum link_state s);
void agent__use_daemon(struct agent *a);
void agent__link_close(struct agent *a);
void agent__notify_joined(struct agent *a);
void agent__link_lost(struct agent *a, const char *why);
void agent__drop_stalled(struct agent *a);
uint64_t agent__stall_ms(const struct agent *a);
void agent__link_stalled(struct agent *a, uint64_t now);
int agent__send_to_daemon(struct agent *a, const struct proto_msg *m);
void agent__schedule_retry(struct agent *a, const char *why);
void agent__on_retry_timer(uv_timer_t *t);
int64_t agent__wall_ms(void);
void agent__probe_gpus(struct agent *a);
void agent__try_next_addr(struct agent *a);
void agent__on_beat_timer(uv_timer_t *t);

/* agent_gen.c: generations */
bool agent__stale(struct agent *a, const char *what, uint64_t gen);
void agent__send_error(struct agent *a, const char *code, const char *reason);
void agent__on_assign(struct agent *a, struct proto_assign *as);
void agent__on_unique_id(struct agent *a, const struct proto_unique_id *u);

/* agent_command.c: commands and log requests */
void agent__on_log_request(struct agent *a, const struct proto_log_request *q);
void agent__on_command(struct agent *a, const struct proto_command_msg *c);

/* agent_daemon_msg.c: frames from the daemon */
void agent__daemon_msg(struct fconn *c, struct proto_msg *msg);
void agent__daemon_bad(struct fconn *c, int err);

/* agent_fit.c: the pre-flight glue */
void agent__on_preflight_done(struct agent_preflight *p, bool fit, const char *reason);
bool agent__runs_trainer(const struct agent *a, const struct job_spec *spec);
void agent__start_preflight(struct agent *a, const struct proto_welcome *w);
void agent__recheck_checkpoint(struct agent *a);

#endif
