/*
 * rdv: the rendezvous and health state machine of musterd. Pure logic: it
 * owns no socket and reads no clock. The server feeds it what happened
 * (a node joined, a frame arrived, a connection closed, time passed) with
 * the current CLOCK_MONOTONIC time in milliseconds, and rdv answers through
 * struct rdv_ops (send a frame to a node, close a node's connection, state
 * changed). Unit tests drive it with a fake clock and recording ops.
 *
 * Job states (DESIGN.md): waiting -> forming -> running <-> recovering ->
 * completed | stopped | failed (each is described at enum rdv_job_state).
 * Every change goes through one setter (rdv__set_state, rdv_internal.h),
 * which refuses any transition but these:
 *
 *   waiting     -> forming      generation 1 opens (enough nodes are fit)
 *   waiting     -> failed       formation refused: the batch does not split
 *                               over the world size
 *   waiting     -> stopped      an administrator stops the job
 *   waiting     -> recovering | completed | stopped | failed
 *                               rdv_restore: a fresh rdv takes the state
 *                               file's (a generation that was forming or
 *                               running awaits its members as recovering)
 *   forming     -> running      every rank reports running (or finished)
 *   forming     -> recovering   a failure, or an administrator's restart,
 *                               before generation 1 ran
 *   running     -> recovering   a failure, an administrator's restart, a grow
 *   recovering  -> running      every rank of the new generation runs, or
 *                               every member is back after a daemon restart
 *   recovering  -> forming      every member is back after a daemon restart
 *                               that stopped a generation still forming
 *   recovering  -> recovering   another failure (or restart) opens the next
 *                               generation before this one ran
 *   forming | running | recovering -> completed   every rank exited 0
 *   forming | running | recovering -> stopped     an administrator
 *   forming | running | recovering -> failed      restart budget spent, a
 *                               failure retrying cannot help, too few nodes
 *                               left to shrink to
 *   completed, stopped, failed: none (the job has ended)
 *
 * Membership: the first spec->nodes distinct node names to join become the
 * members when generation 1 forms. Ranks are contiguous per node, nodes in
 * name order, local rank = index into the node's device list. A member that
 * returns keeps its rank block; a name that is not a member is refused.
 *
 * Sessions: every join is given a session (WELCOME.session). An agent whose
 * link stalls reconnects and names it in HELLO; when it is the session of
 * the node's current connection, the node is handed to the new connection
 * (the old one closed) without a loss, and whatever the node missed meanwhile
 * (ASSIGN, the unique id) is sent again. The node's heartbeat deadline counts
 * from the last frame heard, on either connection: a link that comes back
 * within heartbeat_timeout_ms costs nothing.
 *
 * Generations fence everything: each failure opens a new one, and frames
 * carrying an older generation are dropped (UNIQUE_ID is answered with an
 * ERROR "stale_generation").
 */
#ifndef MUSTER_RDV_H
#define MUSTER_RDV_H

#include <stdint.h>

#include <jansson.h>

#include "common/jobspec.h"
#include "common/namemap.h"
#include "common/ratelimit.h"
#include "daemon/failslow.h"
#include "daemon/hang.h"
#include "proto/proto.h"

enum rdv_job_state {
    RDV_WAITING,    /* fewer than spec->nodes fit agents have joined; no generation yet */
    RDV_FORMING,    /* generation 1 opened (assigned once every member is fit and
                     * connected); not every rank reports running yet */
    RDV_RUNNING,    /* every rank of the current generation reports running (or finished) */
    RDV_RECOVERING, /* a failure, restart, grow or shrink opened generation G+1: ranks
                     * are parked or stopped, lost nodes awaited, then G+1 assigned and
                     * started; or musterd restarted and awaits the members of G
                     * (resuming), which then runs on, or forms again if it had not run */
    RDV_COMPLETED,  /* every rank of the current generation exited 0 */
    RDV_STOPPED,    /* an administrator stopped the job */
    RDV_FAILED,     /* the job gave up; reason says why (restart budget spent, a
                     * failure retrying cannot help, too few nodes, formation refused) */
};

enum rdv_node_state {
    RDV_NODE_JOINED, /* connected and authenticated */
    RDV_NODE_LOST,   /* connection closed or heartbeats missed */
    RDV_NODE_LEFT,   /* drained by an administrator */
};

/* Rank states as musterd reports them (superset of proto_rank_state). */
enum rdv_rank_state {
    RDV_RANK_PENDING,   /* generation opened, not yet started by its agent */
    RDV_RANK_STARTING,
    RDV_RANK_RUNNING,
    RDV_RANK_STOPPING,
    RDV_RANK_EXITED,    /* ended abnormally (or with the job) */
    RDV_RANK_COMPLETED, /* exited 0: finished its work */
};
#define RDV_RANK_NSTATES (RDV_RANK_COMPLETED + 1)

#define RDV_MAX_NODES 4096 /* = the job spec's largest "nodes" */
#define RDV_EVENTS 256
/* A node's warm_spare_unfit events: at most RDV_SPARE_NOTES per RDV_SPARE_NOTE_WINDOW_MS (a real
 * agent's note changes once per warm import it drops, a few times per job). */
#define RDV_SPARE_NOTES 4
#define RDV_SPARE_NOTE_WINDOW_MS 60000

/* A generation waiting for MASTER_PORT (rank 0's node reports a free port in
 * each heartbeat). */
enum rdv_port_wait {
    RDV_PORT_WAIT_NO,        /* not waiting */
    RDV_PORT_WAIT_NEW,       /* for a port other than the last generation's */
    RDV_PORT_WAIT_NONE_FREE, /* every port of its range is in use (told as an event) */
};

/* Whether a node can run the job (daemon/fitness.h). */
enum rdv_fitness {
    RDV_FIT_UNCHECKED, /* its agent promised no pre-flight: counted as fit */
    RDV_FIT_CHECKING,  /* its agent's PREFLIGHT has not come yet: not counted */
    RDV_FIT_OK,        /* its pre-flight passed */
    RDV_FIT_UNFIT,     /* its pre-flight failed (unfit_reason says why): not counted */
};

struct rdv_node {
    char name[PROTO_NAME_MAX];
    char addr[PROTO_NAME_MAX];
    enum proto_device_kind kind;
    uint32_t ndevices;
    uint32_t devices[PROTO_MAX_LOCAL_RANKS];
    enum rdv_node_state state;
    int member;            /* holds a rank block */
    uint32_t first_rank;   /* valid when member */
    uint64_t last_seen_ms; /* last frame from it (monotonic) */
    uint64_t joined_ms;
    uint64_t reported_generation; /* generation its ranks ran when it joined */
    uint32_t free_port;    /* latest port it reported free for MASTER_PORT; 0 = none */
    uint64_t free_port_gen; /* the generation its agent had when it reported free_port */
    uint64_t assign_sent_gen; /* the newest generation whose ASSIGN went to it in this session; 0 = none
                               * (a join that does not resume starts a session on which nothing was sent) */
    uint64_t session;      /* given in WELCOME at its last join; HELLO.session resumes it */
    /* device facts (HELLO) and fitness (PREFLIGHT, and musterd's plan) */
    char gpu_name[PROTO_NAME_MAX]; /* "" = no GPU facts */
    uint64_t gpu_total_mb, gpu_free_mb; /* the smallest of its GPUs' */
    uint64_t device_mem_mb; /* as HELLO's device_mem_mb */
    uint64_t host_mem_mb;
    enum rdv_fitness fitness;
    int trainer;           /* its ranks are muster-train (PREFLIGHT) */
    char unfit_reason[PROTO_REASON_MAX]; /* the pre-flight's */
    char plan_unfit[PROTO_REASON_MAX];   /* "": the plan fits its memory */
    uint64_t unfit_since_ms; /* when it last became unfit or checking */
    int has_checkpoint;    /* a PREFLIGHT since its join (or since the last generation ended) named its
                            * latest checkpoint (checkpoint_latest); cleared when a generation is assigned */
    char checkpoint[PROTO_CKPT_NAME_MAX]; /* that checkpoint; "" = none */
    int reports_checkpoint; /* it has named one: it names it again when a generation ends */
    int checkpoint_wanted; /* its ranks start afresh in the generation being opened: it waits for its report */
    struct ratelimit ignored_log; /* lines about its ignored frames (common/ratelimit.h) */
    /* memory checkpoints complete on it (HEARTBEAT memory_checkpoints, job key memory_checkpoint_mb),
     * oldest first; none until its agent reports them */
    int reports_memckpt; /* a heartbeat since its join carried the list */
    uint32_t nmemckpt;
    char memckpt[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
    char domain[PROTO_NAME_MAX]; /* HELLO.domain: the operator's placement label; "" = none */
    int swap_out;          /* slow_policy swap: a spare takes its rank block in the generation being opened */
    /* the node whose replicas it holds, and those held whole, oldest first
     * (HEARTBEAT memory_replica_of, memory_replicas; daemon/rdv_memrep.c) */
    char replica_of[PROTO_NAME_MAX];
    /* HEARTBEAT spare_note: what its agent last found wrong with its warm spare
     * process (an event when it changes); "" = nothing */
    char spare_note[PROTO_REASON_MAX];
    /* its warm_spare_unfit events in the window begun at spare_note_window_ms (at most
     * RDV_SPARE_NOTES: an agent that changes its note in every heartbeat must not wash the
     * event ring), and the new notes held back in it, told in the next event */
    uint32_t spare_note_events, spare_note_held;
    uint64_t spare_note_window_ms;
    /* a spare that took a member's rank block (rdv_spare.c): that member's
     * name, whose copies at its buddy are this node's now; "" = none */
    char heir_of[PROTO_NAME_MAX];
    uint32_t nreplica;
    char replica[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
    /* its memory checkpoints drained whole to checkpoint_dir, oldest first
     * (HEARTBEAT memory_drained, job key memory_checkpoint_drain_steps) */
    int reports_drained; /* a heartbeat since its join carried that list */
    uint32_t ndrained;
    char drained[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
    int restored; /* a member from the state file, not back since musterd started: absent, not yet lost */
};

/* A member replaced by a hot spare (daemon/rdv_spare.c). */
struct rdv_replacement {
    uint64_t generation;   /* the generation the spare joined; 0 = none yet */
    int64_t wall_ms;       /* CLOCK_REALTIME */
    char lost[PROTO_NAME_MAX];
    char spare[PROTO_NAME_MAX];
    char why[16];          /* "lost", "unfit" or "slow" */
    uint32_t node_rank, first_rank, nranks;
    int same_domain;       /* the spare came from the lost node's domain */
};

struct rdv_rank {
    uint32_t node;         /* index into rdv.nodes */
    uint32_t local_rank;
    uint32_t device;
    enum rdv_rank_state state;
    uint64_t step;
    double loss;           /* NaN until reported */
    double tokens_per_s;
    double comm_frac;
    uint64_t last_beat_ms; /* 0 = never */
    uint64_t progress_ms;  /* when step last advanced (or the rank began running) */
    int silent;            /* alive by its process alone: step unknown, no hang detection */
    uint64_t step_bytes;   /* bytes sent in its last step (0 = not reported) */
    uint64_t peak_mem;     /* its peak memory, bytes (0 = not reported) */
    int rejoin;            /* it said it joins the next generation in place */
    int yielded;           /* it left the generation at a step boundary (COMMAND yield) */
    /* What it says of its progress and where it is (proto_rank_beat). */
    double step_s;         /* its last step's duration, s (0 = not reported) */
    uint64_t total_steps;  /* the steps it says it will run (0 = not said) */
    int timed;             /* its entries carry step_age_ms: it is judged by its own clock */
    int stepped;           /* its step changed in this generation (the interval since is a step) */
    uint64_t entry_ms;     /* when its last entry came, stopped ones included (0 = never) */
    int stopped;           /* its agent sees its process stopped */
    uint64_t stopped_since_ms; /* when that was first said (0 = not stopped) */
    char where[PROTO_WHERE_MAX];     /* "" = unknown */
    char waiting[PROTO_WAITING_MAX]; /* "" = not in a collective */
    /* Its latest time split (proto_rank_beat) and its standing under the
     * fail-slow rule (failslow.h, rdv_slow.c); a generation starts it over. */
    double split_s;        /* the window's seconds; 0 = no split yet */
    uint64_t split_steps;  /* steps in it; 0 = not known */
    double split[PROTO_SPLIT_NKINDS];
    uint64_t split_ms;     /* when it came; 0 = never */
    uint32_t split_seq;    /* windows taken (an entry whose split changed brings a new one) */
    uint32_t split_judged; /* the split_seq the rule last judged */
    struct failslow_state slow;
    double slow_x, slow_peers; /* its figure and its peers' median when last judged */
    int slow_per_step;     /* those were compute seconds per step (else compute shares) */
    uint64_t slow_named_ms; /* when the rule last named it slow; 0 = it is not (slow_policy swap counts from here) */
};

/*
 * What a set of stacks may hold. A rank's dump is up to PROTO_STACKS_MAX
 * (60 KiB): at 32k ranks a whole set would be near 2 GiB, over musterd's
 * MemoryMax. So each dump keeps its first RDV_STACKS_RANK_MAX bytes, and a
 * set RDV_STACKS_TOTAL_MAX in all (as JSON text, which is what is held);
 * what is cut is said at the end of the text and in "cut". A dump's head
 * (the innermost frames come last in Python's faulthandler, first in gdb's)
 * says where the rank is; the summary comes from the heartbeats' "where".
 */
#define RDV_STACKS_RANK_MAX (16 * 1024)
#define RDV_STACKS_TOTAL_MAX (64u << 20)

/* One rank's answer to COMMAND stacks. */
struct rdv_stack {
    int answered;
    uint32_t pid;          /* 0 = none dumped */
    int stopped;
    uint32_t cut;          /* bytes of its dump not kept (the limits above) */
    char error[PROTO_REASON_MAX];
    char *text;            /* the dump as kept, as a JSON string literal (rendered once, when it
                            * came); malloc'd; NULL = none */
    size_t len;            /* strlen(text) */
    char *fr;              /* its flight recorder summary (common/flight.h), malloc'd; NULL = none */
    char *ras;             /* what NCCL's RAS said of its process ("NCCL RAS: ..." lines), malloc'd; NULL = none */
};

/* The latest set of stacks asked for (a hang, or POST /v1/stacks). */
struct rdv_stacks {
    uint64_t generation;   /* 0 = none asked for yet */
    int64_t wall_ms;       /* when it was asked for (CLOCK_REALTIME) */
    uint32_t nranks;       /* the world size then: entries of ranks */
    uint32_t nanswered;
    struct rdv_stack *ranks;
    uint64_t version;      /* counts changes, for musterd's rendering */
    size_t rank_max;       /* RDV_STACKS_RANK_MAX (rdv_init; tests set less) */
    size_t total_max;      /* RDV_STACKS_TOTAL_MAX */
    size_t bytes;          /* of the texts kept: at most total_max */
    uint64_t cut;          /* bytes cut from this set's dumps, in all */
    uint64_t asked;        /* sets asked for so far: this one's number ("set" in GET /v1/stacks) */
};

/* The latest rank failure, with what the rank itself said (error file, stderr). */
struct rdv_failure {
    uint64_t generation;   /* 0 = none yet */
    uint32_t rank;
    char node[PROTO_NAME_MAX];
    char how[96];          /* "exited with status 1", "was killed by signal 9 (SIGKILL)" */
    int cls;               /* enum failure_class (daemon/failure.h) */
    char reason[PROTO_REASON_MAX]; /* "" = the rank said nothing */
    char detail[PROTO_DETAIL_MAX];
};

struct rdv_event {
    uint64_t seq;
    int64_t wall_ms;       /* CLOCK_REALTIME, for people */
    uint64_t generation;
    char kind[24];
    char node[PROTO_NAME_MAX]; /* "" when about no node */
    int rank;              /* rank or -1 */
    char message[PROTO_REASON_MAX];
};

struct rdv_ops {
    void *ctx;
    /* Queue msg to the connected node; failures are the server's to handle. */
    void (*send)(void *ctx, const char *node, const struct proto_msg *msg);
    /* Close the node's connection (after sending whatever was queued). */
    void (*disconnect)(void *ctx, const char *node, const char *why);
    /* Something changed; persist != 0 when what the state file keeps
     * (struct rdv_saved) may have changed. rdv calls it before sending any
     * frame that names a new generation, and every frame rdv sends after it
     * must reach no agent before the state file holding that change is
     * durable (musterd: daemon/persist.h, server_hold), so a crashed daemon
     * never comes back with a generation older than one its agents have seen. */
    void (*changed)(void *ctx, int persist);
    /* Optional (NULL = 0): bytes queued to the node, so that frames passed
     * on between agents (MEM_FILE) never fill its write queue. */
    size_t (*queued)(void *ctx, const char *node);
};

/* What the state file keeps (daemon/state.c writes and reads it). */
struct rdv_saved_member {
    char name[PROTO_NAME_MAX];
    uint32_t first_rank;
    uint32_t ndevices;
};

struct rdv_saved {
    char job[JOB_NAME_MAX];
    enum rdv_job_state state;
    char reason[PROTO_REASON_MAX];
    uint64_t generation;
    uint32_t restarts;
    uint32_t world_size;
    int64_t last_checkpoint_step; /* -1 = none */
    uint32_t replacements;        /* members replaced by hot spares so far */
    struct rdv_replacement last_replacement; /* generation 0 = none */
    uint32_t nmembers;
    struct rdv_saved_member members[RDV_MAX_NODES];
};

struct rdv {
    const struct job_spec *spec;
    json_t *job;            /* spec as JSON, sent in ASSIGN (a reference) */
    char *job_text;         /* job rendered once, for the ASSIGN of every node */
    struct rdv_ops ops;
    /* With a store: the term this musterd leads in (etcd's create revision
     * of the leader key), sent with WELCOME, ASSIGN, UNIQUE_ID and COMMAND
     * so that agents refuse a deposed leader's frames; 0 without a store. */
    uint64_t term;

    enum rdv_job_state state;
    char reason[PROTO_REASON_MAX];
    uint64_t generation;
    uint32_t restarts;
    int64_t last_checkpoint_step;
    uint64_t started_ms;
    uint64_t gen_opened_ms; /* when the current generation was opened */
    uint64_t slow_judged_ms; /* when the fail-slow rule last ran (rdv_slow.c) */
    int split_news;          /* a rank's new time split window came since */
    uint64_t assigned_ms;   /* when it was assigned (ASSIGN sent); 0 = not yet */
    uint32_t master_port;   /* MASTER_PORT of the current generation's ASSIGN */
    uint64_t master_port_gen; /* the generation that was given master_port */
    int32_t master_port_node; /* the node that held rank 0 then (-1: none known, as after a restart) */
    struct proto_unique_id uid; /* rank 0's unique id; valid when uid.generation == generation */

    struct rdv_node nodes[RDV_MAX_NODES];
    uint32_t nnodes;
    struct namemap byname;  /* node name -> index into nodes */

    struct rdv_rank *ranks; /* world_size entries */
    uint32_t world_size;
    /* Ranks in each state, kept as states change (one helper in rdv.c), so
     * that no message and no figure scans every rank to learn them. */
    uint32_t nranks_in[RDV_RANK_NSTATES];
    int figures_changed;    /* a heartbeat moved a rank's figures since musterd
                             * last published them; musterd clears it */
    /* rdv_tick scans every node (heartbeat timeout) and every rank (hang)
     * only once one can be due: at the earliest deadline its last scan saw.
     * Deadlines only move later between scans: a node's last frame and a
     * rank's progress only move forward, and a node that joins, a rank that
     * starts to run or to report, and a generation that starts running all
     * start their clocks at now. */
    uint64_t lost_due_ms, hang_due_ms;

    int resuming;           /* restored from the state file, members not all back; 0 once the job ends */
    /* The state the restored generation was in before the restart, which it
     * goes back to once every member is back (check_resumed): running, or
     * forming (not every rank had reported running: they are waited for
     * again, start_timeout_ms counted from then). */
    enum rdv_job_state resume_to;
    enum rdv_port_wait port_wait; /* whether the generation waits for rank 0's node to report a port */
    char diverged_said[PROTO_REASON_MAX]; /* the checkpoint divergence last in the events; "" = none */
    uint64_t checkpoint_wait_ms; /* since when the generation waits for members' checkpoint reports; 0 = not */
    uint64_t memckpt_wait_ms;    /* since when a generation waits for members' memory checkpoint reports; 0 = not */
    int restore_noted;      /* rank 0 said where this generation's state came from */
    /* A grow waiting for the ranks to leave the generation at a step
     * boundary (COMMAND yield): the node to take, and until when to wait. */
    int yielding;
    uint32_t grow_node;
    int swapping;          /* the yield is for slow_policy swap of swap_node, not for a grow */
    uint32_t swap_node;
    uint64_t yield_since_ms;
    enum proto_restore restore_from;
    uint64_t restore_step;
    /* restart policy (daemon/failure.h) */
    uint32_t streak;        /* failures in a row, without a healthy run between */
    uint64_t running_since_ms; /* when the current generation began running; 0 = not running */
    uint64_t restart_at_ms; /* the next generation waits until then; 0 = no wait */
    uint64_t *restart_times; /* when restarts were spent, a ring of max_restarts + 1 (restart_window_s) */
    uint32_t nrestart_times;
    struct rdv_failure last_failure;
    /* hot spares (daemon/rdv_spare.c) */
    uint32_t replacements;  /* members replaced by a spare so far */
    struct rdv_replacement last_replacement;
    /* Hang detection (daemon/hang.h): step times, the timeout last in force,
     * and a hang found, waiting up to HANG_STACKS_WAIT_MS for its stacks. */
    struct hang_steps steps;
    uint64_t progress_limit_ms;
    int hang_pending;
    uint64_t hang_fail_at_ms;
    uint64_t hang_generation;
    int hang_node, hang_rank;
    char hang_what[PROTO_REASON_MAX];
    struct rdv_stacks stacks;

    struct rdv_event events[RDV_EVENTS]; /* ring */
    uint64_t nevents;                    /* total ever recorded */
    uint64_t stale_frames;               /* frames dropped for an old generation */
    uint64_t repeated_unique_ids;        /* UNIQUE_IDs ignored: the generation had its id already */
    /* The heartbeat answer, reused: a message has room for 64 rank entries
     * (tens of KiB) that an answer never fills, so it is not zeroed each time. */
    struct proto_msg ack;
};

/* job: the spec as JSON (a reference is taken). Returns 0 or -ENOMEM. */
int rdv_init(struct rdv *r, const struct job_spec *spec, json_t *job,
             const struct rdv_ops *ops, uint64_t now_ms);
void rdv_free(struct rdv *r);

/* Resume from a state file's content (after rdv_init). */
int rdv_restore(struct rdv *r, const struct rdv_saved *saved, uint64_t now_ms);
void rdv_save(const struct rdv *r, struct rdv_saved *out);

/*
 * An authenticated agent says HELLO. Returns 0 (rdv has sent WELCOME and,
 * if a generation is open or now opens, ASSIGN) or -1 with a reject code
 * and reason filled in; the server then sends REJECT and closes. A HELLO
 * that resumes the session of a connected node has rdv disconnect the
 * node's old connection (rdv_ops.disconnect) before it answers.
 */
int rdv_join(struct rdv *r, const struct proto_hello *hello, uint64_t now_ms,
             char code[32], char reason[PROTO_REASON_MAX]);

/* A frame from a joined node (HEARTBEAT, UNIQUE_ID, RANK_EXIT, ERROR). */
void rdv_message(struct rdv *r, const char *node, const struct proto_msg *msg,
                 uint64_t now_ms);

/* A joined node's connection closed. */
void rdv_disconnected(struct rdv *r, const char *node, const char *why,
                      uint64_t now_ms);

/* Time passed: heartbeat deadlines. Call every ~100 ms. */
void rdv_tick(struct rdv *r, uint64_t now_ms);

/* musterd itself did not run for ms (stopped, a VM paused, swapped out):
 * the nodes' frames of that time wait unread in its sockets, so that time
 * does not count toward any node's heartbeat_timeout_ms. Call before
 * rdv_tick, which would otherwise declare every node lost. A node heard
 * during that time (its frames read while the tick was late) is never
 * moved past now_ms. */
void rdv_paused(struct rdv *r, uint64_t ms, uint64_t now_ms);

enum rdv_admin { RDV_ADMIN_STOP, RDV_ADMIN_RESTART, RDV_ADMIN_DRAIN, RDV_ADMIN_CHECKPOINT, RDV_ADMIN_STACKS };
/* Returns 0, or -ENOENT (no such node) / -EINVAL (not possible now) /
 * -ENOTSUP (checkpoint: the job has no checkpoint_dir). CHECKPOINT sends
 * COMMAND checkpoint of the current generation to every member node, whose
 * agent forwards it to its ranks; the checkpoint is then reported as any
 * other (last_checkpoint_step, event checkpoint_committed). STACKS asks
 * every member node for its ranks' stacks (COMMAND stacks); the answers
 * fill r->stacks (-EINVAL when no generation runs). */
int rdv_admin(struct rdv *r, enum rdv_admin action, const char *node, uint64_t now_ms);

int rdv_terminal(const struct rdv *r);

/* The job's step: the slowest running rank's; when none runs (recovering,
 * ended), the lowest step any rank reported, so an ended job keeps its last step. */
uint64_t rdv_job_step(const struct rdv *r);

/* Records an event seen outside rdv (e.g. a failed authentication). */
void rdv_note(struct rdv *r, const char *kind, const char *message);

/* The job's figures, as /v1/status and the history report them. */
struct rdv_figures {
    int step_known;      /* some rank reports its step (not every rank is silent) */
    uint64_t step;       /* rdv_job_step */
    double loss;         /* mean over the ranks that count (rdv_job_step's); NaN = none */
    double tokens_per_s; /* sum over running ranks */
    double comm_frac;    /* mean over running ranks; 0 when none runs */
    uint32_t nrunning;
};
/* O(world size): for a snapshot or a history sample, not for every message. */
void rdv_figures(const struct rdv *r, struct rdv_figures *out);

/* The job-level fields of GET /v1/status (docs/rest.md), without its node and
 * rank tables (daemon/view_build.h adds those); new references. */
json_t *rdv_summary_json(const struct rdv *r, uint64_t now_ms);

/* The newest memory checkpoint complete on every member (their heartbeats' lists) into out; returns 1
 * when there is one, else 0 with out "", and -1 (out "") while a member has sent no list since it
 * joined (a restarted musterd, a new agent): then nobody knows, and ASSIGN names none. */
int rdv_memckpt_common(const struct rdv *r, char *out, size_t cap);
json_t *rdv_events_json(const struct rdv *r);
/* Node idx is a hot spare: a joined non-member of a job with spare_nodes. */
int rdv_is_spare(const struct rdv *r, uint32_t idx);
/* The "spares" object of GET /v1/status (docs/rest.md): wanted, joined, ready,
 * replacements, last_replacement (null = none); a new reference. */
json_t *rdv_spares_json(const struct rdv *r);
/* The ranks named slow (rdv_slow.c): [{rank, node, compute, peers, ratio,
 * per_step, steps (or ms: how long), message}], for GET /v1/status's slow_ranks. */
json_t *rdv_slow_json(const struct rdv *r, uint64_t now_ms);
/* GET /v1/stacks (docs/rest.md): the latest set of stacks as JSON text
 * (malloc'd; NULL when out of memory). The dumps are spliced in as they
 * were rendered when they came: no JSON tree of the whole set is built. */
char *rdv_stacks_text(const struct rdv *r);

const char *rdv_job_state_name(enum rdv_job_state s);
int rdv_job_state_parse(const char *name, enum rdv_job_state *out);
const char *rdv_node_state_name(enum rdv_node_state s);
const char *rdv_rank_state_name(enum rdv_rank_state s);

#endif
