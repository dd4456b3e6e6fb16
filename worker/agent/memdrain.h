/*
 * memdrain: the node's memory checkpoints (memckpt.h) drained to durable
 * storage (job key memory_checkpoint_drain_steps), so that a loss of a node
 * together with its buddy, or of the whole cluster, still leaves a
 * checkpoint (docs/pytorch.md, "Drained to durable storage").
 *
 *   where     checkpoint_dir/muster-memory/JOB/NODE/TAG (JOB as in
 *             memckpt_path, so another job sharing checkpoint_dir never
 *             restores these): a directory per node,
 *             not the layout the program writes. checkpoint_dir may be
 *             shared by every node, and each node's tag directory holds only
 *             its own ranks' files under the same names (DeepSpeed's
 *             global_step50 on every node); per node, nothing collides,
 *             what a node drained is what it gets back, and the program's
 *             own checkpoints beside it (checkpoint_latest) are left alone.
 *             muster-memory, JOB and NODE are the agent's alone (0700, opened
 *             without following links: ranks may write checkpoint_dir).
 *   which     the oldest complete memory checkpoint still on the node whose
 *             step enters a new window of memory_checkpoint_drain_steps
 *             steps (step / N above the newest drained one's; none drained
 *             counts as step 0): the first checkpoint at or past each
 *             multiple of N. The rule reads only the step in the tag's name,
 *             not a count of saves, so every node drains the same
 *             checkpoints, a fresh agent too; a node that saw a window's
 *             first one complete only after memory_checkpoint_keep newer
 *             ones pruned it drains a later one, and that window has no
 *             checkpoint drained on every node.
 *   how       in libuv's thread pool, one copy at a time, off the loop and
 *             off the ranks' path: every file copied into
 *             NODE/.muster-drain-TAG and synced, then the directory renamed
 *             to TAG and NODE synced. A copy cut short (the agent killed, a
 *             full disk) leaves only the .muster-drain- directory, which is
 *             never reported and is removed by the next agent's listing. The
 *             memory checkpoint is pinned (memckpt.pinned) while it is read.
 *             Then the newest memory_checkpoint_drain_keep are kept.
 *   report    HEARTBEAT memory_drained: the drained ones, oldest first. The
 *             agent lists NODE once per job before it reports anything
 *             (memory_checkpoints is held back until then), so musterd never
 *             names a checkpoint without knowing the durable ones.
 *   restore   ASSIGN memory_checkpoint_drained: the named checkpoint is in
 *             neither this node's memory nor a buddy's; before the ranks
 *             start, NODE/TAG is copied back into the memory directory the
 *             same way (a .muster-drain- stage, then renamed) and adopted.
 *
 * Failures are logged here, with the path and the error.
 */
#ifndef MUSTER_WORKER_MEMDRAIN_H
#define MUSTER_WORKER_MEMDRAIN_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <uv.h>

#include "common/jobspec.h"
#include "proto/proto.h"
#include "worker/agent/memckpt.h"

#define MEMDRAIN_SUBDIR "muster-memory"
#define MEMDRAIN_STAGE ".muster-drain-"
#define MEMDRAIN_WHY_MAX (2 * PATH_MAX)

enum memdrain_kind {
    MEMDRAIN_SCAN,    /* list NODE: what was drained before, stages cut short removed */
    MEMDRAIN_DRAIN,   /* a memory checkpoint to NODE */
    MEMDRAIN_RESTORE, /* NODE/TAG back into the memory directory */
};

/* One job for the thread pool: inputs, then what it found. The loop thread
 * leaves it alone from the queueing to the after-work callback. */
struct memdrain_task {
    enum memdrain_kind kind;
    char ckpt_dir[PATH_MAX];      /* checkpoint_dir */
    char job[JOB_NAME_MAX];       /* the job's name as a path component (memckpt_job_part) */
    char node[PROTO_NAME_MAX];
    char where[PATH_MAX + JOB_NAME_MAX + PROTO_NAME_MAX + 32]; /* checkpoint_dir/muster-memory/JOB/NODE, for words */
    char mem_dir[PATH_MAX];       /* the ranks' memory directory */
    char tag[PROTO_CKPT_NAME_MAX];
    int keep;
    uint64_t limit;               /* bytes one checkpoint may hold (memory_checkpoint_mb) */
    int rc;                       /* 0 or -errno, with why */
    char why[MEMDRAIN_WHY_MAX];
    uint64_t bytes, ms;
    uint32_t files, cut_short;    /* files copied; stages of cut-short copies removed */
    bool listed;                  /* NODE was listed: n and names are what is there */
    uint32_t n;                   /* NODE's drained ones afterwards, oldest first (the newest n) */
    char names[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
};

struct memdrain {
    uv_loop_t *loop;
    struct memckpt *mem;
    void (*restored)(void *ctx); /* a restore is done (or failed): look at the ranks again */
    void *ctx;
    char node[PROTO_NAME_MAX];
    bool on;                      /* the held job drains */
    char ckpt_dir[PATH_MAX];
    char job[JOB_NAME_MAX];
    uint64_t window;              /* memory_checkpoint_drain_steps */
    int keep;
    uint64_t limit;
    bool scanned;                 /* NODE was listed for this job: heartbeats report */
    bool scan_wanted;
    uint32_t ndrained;
    char drained[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
    char tried[PROTO_CKPT_NAME_MAX]; /* the last one a drain was started for (not again if it failed) */
    bool busy;                    /* task is in the thread pool */
    bool closing;
    uv_work_t work;
    struct memdrain_task task;
    uint64_t wait_gen;            /* the generation whose ranks wait for a restore; 0 = none */
    char wait_tag[PROTO_CKPT_NAME_MAX];
    bool wait_over, restore_wanted;
};

/* ---- the parts the thread pool runs (testable without a loop) ---- */

/* Whether tag, the newest complete one, is due after last ("" = none drained) with window steps. */
bool memdrain_due(const char *tag, const char *last, uint64_t window);

/* Runs t in the calling thread: t->rc and the results set. */
void memdrain_run(struct memdrain_task *t);

/* ---- the agent's calls ---- */

void memdrain_init(struct memdrain *d, uv_loop_t *loop, struct memckpt *mem, const char *node,
                   void (*restored)(void *ctx), void *ctx);

/* The job is spec (WELCOME or ASSIGN): drains on or off; a new one is listed first. */
void memdrain_job(struct memdrain *d, const struct job_spec *spec);

/* A heartbeat, after memckpt_heartbeat: the drained list (memory_checkpoints held back until it is known),
 * and a drain started when one is due. */
void memdrain_heartbeat(struct memdrain *d, struct proto_heartbeat *hb);

/*
 * Before fresh ranks start: true while as's checkpoint must still be copied
 * back from its drained copy (ASSIGN memory_checkpoint_drained; restored()
 * says when to look again); false once it is here or none is needed.
 */
bool memdrain_waits(struct memdrain *d, const struct proto_assign *as);

/* Shutdown: nothing new starts; a copy in the thread pool is cancelled or finishes (the loop runs until it has). */
void memdrain_close(struct memdrain *d);

#endif
