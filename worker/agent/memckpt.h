/*
 * memckpt: the job's checkpoint directory in memory on this node (job key
 * memory_checkpoint_mb), given to every rank as MUSTER_CHECKPOINT_DIR, so
 * that a program saving with its own call (engine.save_checkpoint,
 * torch.save, DCP) loses, on a restart, only the steps since its last save
 * there.
 *
 *   where     memory_checkpoint_root/muster-JOB, the same path on every node.
 *             As root the agent mounts a tmpfs of memory_checkpoint_mb there
 *             (a save past it fails in the program with ENOSPC); otherwise it
 *             is a plain directory on the root's file system, which
 *             pre-flight checked but nothing bounds. Kept across the ranks'
 *             restarts; removed when the job ends or the agent exits.
 *   complete  a checkpoint is a directory the rule memory_checkpoint_latest
 *             names (a glob of tag directories, or a file naming one). It
 *             counts as complete on this node once every local rank that
 *             reports steps has taken an optimizer step after the agent
 *             first saw it (the program's save call had returned in every
 *             process), or has since exited with status 0. A rank that
 *             reports no steps adds no condition. With the rule
 *             committed:PATTERN the program says it instead: a tag
 *             counts once every local rank that ran when it appeared has
 *             reported checkpoint_committed(S) (HEARTBEAT checkpoint_step)
 *             with S >= the step the tag's name ends in (memtags_step:
 *             global_step120 -> 120), or has exited with status 0; for a
 *             save that returns before its files are written (DCP's
 *             async_save). Either way a save interrupted half way (its
 *             process killed) is never complete: a writer replaced by
 *             another process never vouches for it.
 *   restore   before fresh ranks start, musterd names the newest checkpoint
 *             complete on every node (ASSIGN memory_checkpoint); the node
 *             removes the checkpoints newer than it and writes its name to
 *             the `latest` file (file:NAME's NAME), DeepSpeed's convention,
 *             so that every rank loads the same step.
 *
 * The scan is cheap: one directory listing and a stat per candidate, run on
 * every heartbeat and on every rank exit, on the loop thread. Functions
 * return 0 or a negative errno with one sentence in why.
 */
#ifndef MUSTER_WORKER_MEMCKPT_H
#define MUSTER_WORKER_MEMCKPT_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "proto/proto.h"

#define MEMCKPT_ENV "MUSTER_CHECKPOINT_DIR"
#define MEMCKPT_TAGS_MAX 32 /* checkpoints followed at once; the oldest drops out of a full table */

/* One local rank as a scan sees it. */
struct memckpt_rank {
    int pid;        /* 0 = no process in this slot */
    bool steps;     /* it reports optimizer steps (a client, or the start-up hook) */
    uint64_t step;  /* its latest step */
    uint64_t committed; /* the last checkpoint step it reported committed; 0 = none */
    bool finished;  /* it exited with status 0 */
};

struct memckpt_tag {
    char name[PROTO_CKPT_NAME_MAX];
    bool complete;
    bool orphan;    /* found while no rank ran: its writers are unknown */
    uint32_t nranks;
    struct memckpt_rank seen[PROTO_MAX_LOCAL_RANKS]; /* the ranks when it appeared */
};

struct memckpt {
    bool on;               /* a directory is held for the job */
    bool mounted;          /* it is a tmpfs of its own (bounded) */
    char dir[PATH_MAX];
    char rule[256];        /* memory_checkpoint_latest: glob:, file: or committed: */
    int keep;
    uint64_t size_mb;
    uint32_t ntags;
    struct memckpt_tag tags[MEMCKPT_TAGS_MAX];
    uint64_t restored_gen; /* the generation whose fresh ranks it was made ready for */
    bool expected;         /* no directory yet, but the job names one: heartbeats report none */
    char pinned[PROTO_CKPT_NAME_MAX]; /* being drained to checkpoint_dir (memdrain.h): not pruned meanwhile */
};

/* The job's name as one path component: bytes other than letters, digits, . _ - as _ ("_" for "", ".", ".."). */
void memckpt_job_part(const char *job, char out[JOB_NAME_MAX]);

/* memory_checkpoint_root/muster-JOB for spec; -ENAMETOOLONG when it does not fit. */
int memckpt_path(const struct job_spec *spec, char *out, size_t cap);

/*
 * Makes (or takes up again) the directory of spec; nothing when it is held
 * already. As root, mounts a tmpfs of spec's size there unless one is;
 * *note gets a sentence when the size could not be made a bound ("" else).
 */
int memckpt_open(struct memckpt *m, const struct job_spec *spec, char *note, size_t note_len, char *why,
                 size_t len);

/* dir is a mount of its own: its device differs from its parent's. */
bool memckpt_own_mount(const char *dir);

/* The job is over: unmounts and removes the directory. Safe when none is held. */
void memckpt_close(struct memckpt *m);

/*
 * Looks at the directory now with the node's ranks (slot order). Returns 1
 * when the set of complete checkpoints changed, else 0. Complete ones
 * beyond memory_checkpoint_keep, and unfinished ones older than the newest
 * complete, are removed from the directory.
 */
int memckpt_scan(struct memckpt *m, const struct memckpt_rank *ranks, uint32_t n);

/* tag is a directory here (complete or not). */
bool memckpt_has(const struct memckpt *m, const char *tag);

/* tag came whole from elsewhere (the buddy): it counts as complete here. */
void memckpt_adopt(struct memckpt *m, const char *tag);

/* The complete checkpoints, oldest first, the newest max of them; returns how many. */
uint32_t memckpt_complete(const struct memckpt *m, char (*names)[PROTO_CKPT_NAME_MAX], uint32_t max);

/*
 * Before fresh ranks start: every checkpoint newer than tag is removed and
 * the latest file names tag ("" = none: every checkpoint and the latest
 * file are removed, the ranks start afresh). -ENOENT when tag is not here.
 */
int memckpt_restore(struct memckpt *m, const char *tag, char *why, size_t len);

/* ---- the agent's side: its ranks (agent_rank.h), its frames, its log ---- */

struct agent_rank;

/*
 * WELCOME named spec: the directory an earlier agent left is taken up (its
 * checkpoints reported from the first heartbeat), or, when there is none,
 * heartbeats say "none here" until ASSIGN makes it (memckpt_job). Nothing
 * is made or mounted for a job this node may yet be unfit for.
 */
void memckpt_welcome(struct memckpt *m, const struct job_spec *spec);

/* The held job is spec: its directory is made (and another job's removed), or none when it names none. */
void memckpt_job(struct memckpt *m, const struct job_spec *spec);

/*
 * Ranks that run as another user (the agent's rank_user) write the
 * directory through its group: group gid, mode 02770 (the agent owns it and
 * prunes it). 0 or -errno; nothing to do when there is no directory.
 */
int memckpt_share(struct memckpt *m, gid_t gid);

/* A scan with the node's ranks (slot order; NULL = an empty slot), logging newly complete checkpoints. */
void memckpt_look(struct memckpt *m, struct agent_rank *const *ranks, uint32_t n);

/* A heartbeat's memory_checkpoints: a scan, then the complete ones (nothing when no directory is held). */
void memckpt_heartbeat(struct memckpt *m, struct agent_rank *const *ranks, uint32_t n, struct proto_heartbeat *hb);

/* A rank exited: a scan; when every rank finished with status 0, the job is over here and the directory goes. */
void memckpt_rank_exit(struct memckpt *m, struct agent_rank *const *ranks, uint32_t n);

/*
 * Before the fresh ranks of as start (once per generation; nothing when
 * some rank stays in place, kept): memckpt_restore of ASSIGN's choice, logged
 * as "resumed from memory checkpoint step N".
 */
void memckpt_ready(struct memckpt *m, const struct proto_assign *as, struct agent_rank *const *ranks, uint32_t n,
                   bool kept);

/*
 * env (NULL-terminated, malloc'd as rank_env_build makes it) with
 * MUSTER_CHECKPOINT_DIR=dir in place of any entry of that name. Returns the
 * new array (env is freed), or NULL without memory (env is freed too).
 */
char **memckpt_env(char **env, const char *dir);

#endif
