/*
 * snapshot: how the REST threads see daemon state without touching loop
 * objects. The loop builds an immutable struct snap_view (daemon/view_build.h:
 * the job's figures, a flat table of nodes and one of ranks, the events and
 * the history as JSON text) and publishes it here; REST threads take a
 * reference, serve from it, and drop the reference. A view is freed when
 * the last reference goes, so a response may be sent straight from a view's
 * memory while the loop has published newer ones.
 *
 * Each REST document of a view (daemon/restdoc.h) is rendered at most once,
 * by the first request that wants it, into the view's doc slot; later
 * requests for the same version serve that text. Nothing is re-parsed.
 *
 * Admin requests travel the other way through http_admin_fn, which the
 * daemon implements with a locked queue and uv_async_send.
 */
#ifndef MUSTER_SNAPSHOT_H
#define MUSTER_SNAPSHOT_H

#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#include "proto/proto.h"

/* How a node is doing, worst first: the order of GET /v1/nodes?order=health. */
enum snap_health {
    SNAP_HEALTH_LOST,    /* its agent's connection is gone */
    SNAP_HEALTH_FAILED,  /* one of its ranks exited abnormally */
    SNAP_HEALTH_UNFIT,   /* joined, but cannot run the job: its pre-flight failed or the
                          * plan does not fit its memory (unfit_reason says which) */
    SNAP_HEALTH_STALE,   /* joined, but a heartbeat is overdue (over half the timeout) */
    SNAP_HEALTH_WAITING, /* some of its ranks are not running (pending, starting, stopping),
                          * or its pre-flight checks are under way */
    SNAP_HEALTH_OK,      /* its ranks run (or completed), heartbeats fresh; or a spare */
    SNAP_HEALTH_LEFT,    /* drained by an administrator */
};
#define SNAP_NHEALTH (SNAP_HEALTH_LEFT + 1)
const char *snap_health_name(enum snap_health h);
/* 0 and *out, or -EINVAL for a name that is not a health. */
int snap_health_parse(const char *name, size_t len, enum snap_health *out);

/* Whether a node can run the job (daemon/fitness.h). */
enum snap_fit {
    SNAP_FIT_OK,       /* "fit": its pre-flight passed (or none was promised), the plan fits */
    SNAP_FIT_CHECKING, /* "checking": its pre-flight has not reported yet */
    SNAP_FIT_UNFIT,    /* "unfit": unfit_reason says why */
};
const char *snap_fit_name(enum snap_fit f);

#define SNAP_RANK_NSTATES 6 /* = RDV_RANK_NSTATES */
#define SNAP_NODE_NSTATES 3 /* joined, lost, left */

/* One rank (states: enum rdv_rank_state). */
struct snap_rank {
    uint32_t rank;
    uint32_t node; /* index into view->nodes */
    uint32_t local_rank;
    uint32_t device;
    uint8_t state;
    uint8_t silent; /* never spoke on its control socket: step unknown */
    uint8_t failed; /* the rank of last_failure: its error is view->failure_reason */
    uint8_t stale;  /* live, but its heartbeat is overdue */
    uint64_t step;
    double loss; /* NaN = none */
    double tokens_per_s;
    double comm_frac;
    int64_t heartbeat_age_ms; /* -1 = never */
    int64_t step_age_ms;      /* since its step last changed (or it began running); -1 = silent or never ran */
    uint64_t step_bytes; /* bytes it sent in its last step; 0 = not reported */
    uint64_t peak_mem;   /* its peak memory, bytes; 0 = not reported */
    uint8_t stopped;     /* its agent sees its process stopped (SIGSTOP, a debugger) */
    uint8_t hung;        /* the rank a hang was found in, this generation or the failed one */
    double step_s;       /* its last step's duration, s; 0 = not reported */
    uint64_t total_steps; /* the steps it says it will run; 0 = not said */
    const char *where;   /* its innermost frame as last sampled; NULL = unknown; in view->rank_strings */
    const char *waiting; /* the collective it waits in; NULL = none; in view->rank_strings */
    /* its latest time split (proto_rank_beat) and the fail-slow rule's word on it */
    double split_s;      /* the window's seconds; 0 = none */
    uint64_t split_steps; /* steps in it; 0 = not known */
    double split[PROTO_SPLIT_NKINDS];
    uint8_t slow;        /* named slow (rdv_slow.c) */
};

/* One node (states: enum rdv_node_state), with a rollup of its ranks. */
/* What a node is to the job (hot spares: job key spare_nodes). */
enum snap_role {
    SNAP_ROLE_MEMBER, /* holds a rank block */
    SNAP_ROLE_SPARE,  /* a joined hot spare: no ranks, takes a lost member's place */
    SNAP_ROLE_IDLE,   /* neither: not joined, or joined with no use for it */
};
const char *snap_role_name(enum snap_role r);

struct snap_node {
    char name[PROTO_NAME_MAX];
    char addr[PROTO_NAME_MAX];
    uint8_t state;
    uint8_t gpu;    /* kind: 1 gpu, 0 cpu */
    uint8_t health; /* enum snap_health */
    uint32_t ndevices;
    uint32_t first_rank, nranks; /* its rank block; nranks 0 for a spare */
    uint8_t role;                /* enum snap_role */
    char domain[PROTO_NAME_MAX]; /* its placement label; "" = none */
    int64_t heartbeat_age_ms;    /* -1 = not joined */
    /* fitness and device facts (HELLO, PREFLIGHT, the plan) */
    uint8_t fit;                 /* enum snap_fit */
    const char *unfit_reason;    /* NULL unless unfit; in view->strings */
    char gpu_name[PROTO_NAME_MAX]; /* its smallest GPU's; "" = no GPU facts */
    uint64_t device_mem_mb;      /* that GPU's total, else what HELLO said per device */
    int64_t device_free_mb;      /* that GPU's free memory; -1 = no GPU facts */
    uint64_t host_mem_mb;        /* 0 = unknown */
    /* rollup over its ranks */
    uint32_t ranks_in[SNAP_RANK_NSTATES]; /* by rank state */
    int steps_known;             /* some rank reports a step */
    uint64_t step_min, step_max;
    double loss;                 /* mean of the reported losses; NaN = none */
    double tokens_per_s;         /* sum over running ranks */
    double comm_frac;            /* mean over running ranks */
    int64_t rank_heartbeat_age_max; /* -1 = no rank beat yet */
};

/* Ranks listed in /v1/status: the failing and the slowest, at most this many each. */
#define SNAP_TOP_RANKS 16
/* Nodes listed in /v1/status, unhealthy first. */
#define SNAP_TOP_NODES 16

enum snap_doc {
    SNAP_DOC_STATUS,        /* GET /v1/status */
    SNAP_DOC_RANKS,         /* GET /v1/ranks without a query */
    SNAP_DOC_NODES,         /* GET /v1/nodes without a query */
    SNAP_DOC_METRICS,       /* GET /metrics: job and node series */
    SNAP_DOC_METRICS_RANKS, /* GET /metrics?ranks=1: and per-rank series */
    SNAP_NDOCS,
};

/* JSON text the loop rendered once and that several views share (GET
 * /v1/stacks: up to RDV_STACKS_TOTAL_MAX, not copied into every view). */
struct snap_shared {
    atomic_int refs;
    size_t len;
    char text[];
};
/* A shared copy of text (one reference); NULL on ENOMEM. */
struct snap_shared *snap_shared_new(const char *text);
void snap_shared_ref(struct snap_shared *s);
/* Drops a reference (NULL is fine); the last one frees it. Any thread. */
void snap_shared_unref(struct snap_shared *s);

struct snap_text {
    pthread_mutex_t lock; /* held while the first request renders it */
    char *text;           /* NULL until rendered */
    size_t len;
};

#define SNAP_URL_MAX 320

struct snap_view {
    atomic_int refs;
    unsigned long version; /* set by snapshot_publish, from 1 */

    pthread_mutex_t head_lock; /* jansson objects are not for two threads at once */
    json_t *head;          /* the job's figures (rdv_summary_json), under head_lock */
    char failure_reason[PROTO_REASON_MAX]; /* error of the rank with failed set */
    int64_t stale_after_ms; /* heartbeat age that makes a live rank or node stale */
    int job_ended;          /* completed, stopped or failed: exited ranks ended with it */
    char state[16];         /* the job's state name ("running") */

    struct snap_node *nodes;   /* in the daemon's order */
    char *strings;             /* the nodes' unfit reasons, one allocation (NULL: none) */
    uint32_t nnodes;
    uint32_t *node_order;      /* node indices by health, then name */
    struct snap_rank *ranks;   /* by rank */
    uint32_t nranks;
    char *rank_strings;        /* the ranks' where and waiting, one allocation (NULL: none) */

    uint32_t ranks_in[SNAP_RANK_NSTATES];  /* ranks by state */
    uint32_t nodes_in[SNAP_NODE_NSTATES];  /* nodes by state */
    uint32_t nodes_health[SNAP_NHEALTH]; /* nodes by health */
    uint32_t failing[SNAP_TOP_RANKS];   /* failed, stale, then waited for: worst first */
    uint32_t nfailing, failing_total;
    uint32_t slowest[SNAP_TOP_RANKS];   /* running ranks with the lowest step, then throughput */
    uint32_t nslowest;

    char *events;  /* GET /v1/events, rendered by the loop */
    size_t events_len;
    char *history; /* GET /v1/history, rendered by the loop */
    size_t history_len;
    struct snap_shared *stacks; /* GET /v1/stacks, rendered by the loop when its set changes */

    struct snap_text doc[SNAP_NDOCS];

    /* With a store, a standby's view: REST sends clients to the leader
     * (307 to leader_rest; "" while none is known: 503). */
    int standby;
    char leader_rest[SNAP_URL_MAX];
};

/* A view with room for nnodes and nranks (zeroed), one reference; NULL on ENOMEM. */
struct snap_view *snap_view_new(uint32_t nnodes, uint32_t nranks);
void snap_view_ref(struct snap_view *v);
/* Drops a reference; the last one frees the view. Any thread. */
void snap_view_unref(struct snap_view *v);

struct snapshot {
    pthread_mutex_t lock;
    struct snap_view *view; /* NULL before the first publish */
    unsigned long version;  /* of the last publish */
    int read;               /* the current view was acquired since it was published */
};

void snapshot_init(struct snapshot *s);
void snapshot_destroy(struct snapshot *s);
/* Loop thread: the new current view (its reference is taken over). */
void snapshot_publish(struct snapshot *s, struct snap_view *v);
/* Any thread: a reference to the current view, or NULL before the first publish. */
struct snap_view *snapshot_acquire(struct snapshot *s);
/* Loop thread: 1 when someone read the current view since it was published,
 * so that a refresh that changes only figures can wait for a reader. */
int snapshot_was_read(struct snapshot *s);

#endif
