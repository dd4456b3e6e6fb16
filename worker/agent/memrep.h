/*
 * memrep: the node's memory checkpoints (memckpt.h) copied to its buddy
 * node, and given back to a node that lost its own (job key
 * memory_checkpoint_replica_mbps; docs/pytorch.md, "Memory checkpoints").
 *
 *   transport  MEM_FILE frames on the agent's own link to musterd, which
 *              passes each to the sender's buddy over that node's link
 *              (daemon/rdv_memrep.c). Both links are authenticated and
 *              sealed already; no agent listens for another, so there is no
 *              new connection to authenticate, and the buddy map lives in
 *              one place. The price is that every byte crosses musterd: at
 *              the pace the job allows (below), for checkpoints of a few
 *              GiB per node.
 *   send       after each heartbeat's scan, the newest complete checkpoint
 *              not yet sent whole goes out, file by file in pieces of
 *              PROTO_MEMDATA_MAX, from a timer: at most the job's MiB/s and
 *              only while less than MEMREP_QUEUE_MAX waits on the link, so
 *              heartbeats never queue behind it and the loop never blocks
 *              for more than one piece. Only complete checkpoints are sent
 *              (a half-written one never is); a file that is not regular
 *              (a link), a path the protocol refuses or a checkpoint over
 *              memory_checkpoint_mb stops the copy with a warning.
 *   hold       a buddy writes an incoming checkpoint under
 *              memory_checkpoint_root/muster-JOB.replicas/.muster-in-TAG
 *              (beside its ranks' directory, never in it), each path opened
 *              part by part without following links, each piece checked
 *              against the last (same file, next offset, within its size,
 *              within memory_checkpoint_mb in all); any gap or excess drops
 *              the whole checkpoint. The end frame renames it to TAG; the
 *              newest memory_checkpoint_keep are held, of one owner at a
 *              time, and reported in HEARTBEAT.
 *   give back  on MEM_FETCH the buddy sends the owner's copy back (restore),
 *              ahead of its own sends; the owner, whose ASSIGN named the
 *              buddy (memory_checkpoint_from), writes it into its ranks'
 *              directory the same way and holds its ranks until it is whole
 *              or MEMREP_FETCH_WAIT_MS has passed.
 *
 * Functions return 0 or a negative errno; failures are logged here.
 */
#ifndef MUSTER_WORKER_MEMREP_H
#define MUSTER_WORKER_MEMREP_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <uv.h>

#include "common/jobspec.h"
#include "common/ratelimit.h"
#include "proto/proto.h"
#include "worker/agent/memckpt.h"

#define MEMREP_QUEUE_MAX (1u << 20)   /* bytes waiting on the link before a piece waits too */
#define MEMREP_FILES_MAX 4096         /* files in one checkpoint */
#define MEMREP_FETCH_WAIT_MS 60000    /* how long ranks wait for their files from the buddy */
#define MEMREP_TICK_MS 10

/* One checkpoint on its way out. */
struct memrep_out {
    bool on;
    bool restore;                 /* back to its owner (else a replica to our buddy) */
    char owner[PROTO_NAME_MAX];
    char tag[PROTO_CKPT_NAME_MAX];
    int dirfd;                    /* the tag's directory */
    uint32_t nfiles, at;          /* files listed; the one being sent */
    bool begun;                   /* its first frame went */
    char (*paths)[PROTO_MEMPATH_MAX];
    uint64_t *sizes;
    int fd;                       /* files[at], open; -1 before */
    uint64_t offset;
    uint64_t bytes, started_ms;
};

/* One checkpoint coming in. */
struct memrep_in {
    bool on;
    char owner[PROTO_NAME_MAX];
    char tag[PROTO_CKPT_NAME_MAX];
    char root[PATH_MAX];          /* where it goes once whole */
    int stagefd;                  /* root/.muster-in-TAG */
    char path[PROTO_MEMPATH_MAX]; /* the file being written */
    int fd;
    mode_t mode;                  /* of its files */
    uint64_t offset, size, total;
};

struct memrep_link {
    void *ctx;
    int (*send)(void *ctx, const struct proto_msg *m); /* 0, or the link is gone */
    size_t (*queued)(void *ctx);                       /* bytes waiting on the link */
    void (*fetched)(void *ctx);                        /* the awaited files came, or the wait ended */
};

struct memrep {
    uv_loop_t *loop;
    uv_timer_t timer;
    bool timer_init;
    struct memckpt *mem;
    struct memrep_link link;
    char node[PROTO_NAME_MAX];
    bool on;                    /* replicas are sent and held for the held job */
    bool mounted;               /* dir is a tmpfs of its own */
    uint64_t rate;              /* bytes/s */
    uint64_t limit;             /* bytes of one checkpoint at most */
    int keep;
    uint64_t budget, last_ms;   /* bytes the pace allows now */
    char dir[PATH_MAX];         /* the replicas held here (memckpt's dir + ".replicas") */
    char replica_of[PROTO_NAME_MAX];
    uint32_t nheld;
    char held[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX]; /* oldest first */
    char sent[PROTO_CKPT_NAME_MAX];  /* our newest the buddy was sent whole */
    char fetch_owner[PROTO_NAME_MAX], fetch_tag[PROTO_CKPT_NAME_MAX]; /* a MEM_FETCH waiting for out */
    struct memrep_out out;
    struct memrep_in in[2];     /* [0] a replica for another node, [1] our own coming back */
    uint64_t wait_gen;          /* the generation whose ranks wait for their files; 0 = none */
    char wait_tag[PROTO_CKPT_NAME_MAX];
    uint64_t wait_until_ms;
    bool wait_over;
    bool full_said;             /* the ranks' tmpfs was reported full; again once it has room */
    struct ratelimit refused_log; /* frames not ours to take (common/ratelimit.h) */
};

void memrep_init(struct memrep *p, uv_loop_t *loop, struct memckpt *mem, const char *node,
                 const struct memrep_link *link);

/* The held job is spec, of nnodes members: replicas on or off, the directory held for them made or removed. */
void memrep_job(struct memrep *p, const struct job_spec *spec, uint32_t nnodes);

/* A heartbeat (after memckpt_heartbeat's scan): the replicas held go in it, a new checkpoint starts out, and a
 * full tmpfs is reported once (ERROR memory_checkpoint_full: a save there fails with ENOSPC). */
void memrep_heartbeat(struct memrep *p, struct proto_heartbeat *hb);

/* MEM_FILE or MEM_FETCH from musterd. */
void memrep_on_msg(struct memrep *p, const struct proto_msg *m);

/*
 * Before fresh ranks start: true while as's checkpoint must still come from
 * the buddy ASSIGN names (the ranks wait; link.fetched says when to look
 * again); false once it is here, when none is needed, or the wait is over.
 */
bool memrep_waits(struct memrep *p, const struct proto_assign *as);

/* The link to musterd is gone: transfers in flight are dropped (they are started again). */
void memrep_link_lost(struct memrep *p);

/* Stops everything; remove: the replicas held go too. The timer is closed (the loop must run once). */
void memrep_close(struct memrep *p, bool remove);

/* ---- pure parts, for the tests ---- */

/*
 * Opens rel (a proto_valid_mem_path) under dirfd part by part, never
 * following a link: with create, the directories on the way are made (0700,
 * or as mode says for the file) and the file must not exist; without, it
 * must be a regular file. The descriptor, or -errno.
 */
int memrep_open_under(int dirfd, const char *rel, bool create, mode_t mode);

/*
 * Lists the regular files under dirfd (depth first, name order within a
 * directory) into paths/sizes (room for max). Returns how many, or -ELOOP
 * for a link or another kind of file, -ENAMETOOLONG for a path the protocol
 * refuses, -EFBIG when they pass limit bytes, -E2BIG past max files.
 */
int memrep_list(int dirfd, char (*paths)[PROTO_MEMPATH_MAX], uint64_t *sizes, uint32_t max, uint64_t limit);

#endif
