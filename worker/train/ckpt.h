/*
 * ckpt: checkpoints as a manifest plus one shard file per rank.
 *
 *   <checkpoint_dir>/step-00000010/manifest.json
 *   <checkpoint_dir>/step-00000010/rank-00000.bin   (one per rank)
 *   <checkpoint_dir>/latest                         ("step-00000010\n")
 *
 * The manifest holds the model config, the step, the world size, the unit
 * layout (each unit's tensors, size and per-rank shard size), the data
 * position, the RNG state, the training hyper-parameters and every file with
 * its size and FNV-1a 64 checksum. A shard file is
 *
 *   "MUSTSHRD", uint32 version (1), rank, world, nunits,
 *   uint64 shard_numel[nunits],
 *   then per unit: float32 params[S], adam_m[S], adam_v[S]
 *
 * (little-endian) where rank r of world N holds floats [r*S, (r+1)*S) of each
 * unit, zero-padded past the unit's end, and S is that unit's shard_numel
 * (the same in the manifest and in every file of the checkpoint). The writer
 * chooses S, any S with N*S >= numel: the CPU path writes ceil(numel / N)
 * (for the embedding, ceil(rows / N) whole rows of C floats), the GPU path
 * ceil(numel / N) rounded up to 64 floats; a loader honours the S of the
 * files, so either path loads what the other wrote, at any world size. A
 * checkpoint is written into a temporary directory, synced, and renamed
 * into place; `latest` is replaced by rename after that, so a crash leaves
 * the previous checkpoint intact. After the commit each directory's
 * committer prunes old checkpoints (ckpt_prune below; spec->checkpoint_keep).
 *
 * Node-local or shared: checkpoint_dir may be one directory every rank
 * sees or a directory on each node's own disk; nothing is configured. A
 * save puts each rank's file in its own view of the directory, and every
 * distinct directory gets the manifest (which names all files, wherever
 * they lie) and `latest`. A load agrees on one step, and when a rank does
 * not find a file it needs (the world changed shape, a node is new), the
 * ranks that have each file read it and ship its floats over the
 * collective. What a node-local directory cannot survive is losing a node:
 * its files leave with it (peer replicas, replica.h, cover that).
 *
 * The functions here know nothing of a trainer: a rank describes what it
 * holds in a struct ckpt_rank (host arrays of its shards, the numbers the
 * manifest carries, and an all-gather to agree with the other ranks). The
 * CPU trainer (trainer_save/trainer_load, train.h) and the GPU trainer
 * (gpu_trainer_save/gpu_trainer_load, worker/train/gpu/gpu_train.h) fill one in.
 */
#ifndef MUSTER_TRAIN_CKPT_H
#define MUSTER_TRAIN_CKPT_H

#include <stddef.h>
#include <stdint.h>

#include "common/jobspec.h"
#include "worker/train/data.h"
#include "worker/train/model.h"

/* all[r * n + i] = rank r's mine[i], on every rank; a barrier as well.
 * Returns 0 or a negative code that why() puts in words. */
typedef int (*ckpt_gather_fn)(void *coll, const uint64_t *mine, size_t n, uint64_t *all);

struct ckpt_rank {
    /* what the manifest carries */
    const struct job_spec *spec; /* preset name, hyper-parameters, data path, seed */
    const struct dataset *data;  /* format and token counts */
    struct gpt_config cfg;
    struct gpt_layout lay;
    float beta1, beta2, eps;
    long step;                   /* save: optimizer steps done; load: the checkpoint's */
    int64_t seed;                /* load: the checkpoint's seed (spec->seed if the same) */
    int rank, world;
    /* this rank's shards: unit u's floats [rank*shard[u], (rank+1)*shard[u])
     * start at off[u] of each array, zero past the unit's end */
    size_t shard[GPT_MAX_UNITS];
    size_t off[GPT_MAX_UNITS];
    float *params, *m, *v;
    /* 0, or why this rank could not provide its shards (save) or a place for
     * them (load): it still takes part in the collectives, and the
     * checkpoint fails on every rank */
    int local_rc;
    ckpt_gather_fn gather;
    const char *(*why)(void *coll, int rc);
    void *coll;
    /* most words a rank puts into one all-gather when a load ships files
     * (0: 64 MiB over the world, at least 512 KiB a rank) */
    size_t gather_max;
};

/* The largest world a manifest may name. */
#define CKPT_MAX_WORLD 1048576

/* Writes the rank's shards as step-<step> under dir (created if needed) and
 * points dir/latest at it. Collective: every rank writes its own shard file
 * into its view of dir, and each distinct directory's committer (the rank
 * that created its temporary directory) commits (manifest, rename,
 * `latest`) only after all shards are durable and every manifest is
 * written; the same result on every rank. path (may be NULL) gets the
 * checkpoint's directory. Returns 0 or a negative errno with the reason in
 * err. */
int ckpt_save(const struct ckpt_rank *c, const char *dir, char *path, size_t pathlen, char *err,
              size_t errlen);

/* Loads a checkpoint into c's arrays: path is a step directory (holding
 * manifest.json) or a checkpoint_dir (of the steps the ranks' `latest`
 * files name, the newest whose manifest and files some rank finds). Refuses a checkpoint of another model,
 * naming the difference, and any file whose size or checksum does not
 * match the manifest. Shards of any world size N and any shard size S are
 * re-sliced into c's world and shard sizes: a rank reads only the files
 * that hold floats it owns, or, when some rank does not find one in its
 * view of path, each file is read by one rank that has it and shipped;
 * each rank writes only the real (non-padding) floats it owns. Sets
 * c->step and c->seed. Collective, the same result on every rank:
 * -ENOENT when no rank finds any checkpoint at path (a fresh start),
 * -ENODATA when a file or manifest of the step is on no rank, another
 * error when one could not load. */
int ckpt_load(struct ckpt_rank *c, const char *path, char *err, size_t errlen);

/*
 * Re-slicing state that is in memory rather than in files (collective, the
 * same result on every rank): the state of a world of w0 ranks cut into
 * shards of S[u] floats per unit, each old rank o's shard held whole by
 * rank from_rank[o] as its from_index[o]-th block of `mine` (nmine blocks
 * here; ncontrib the most any rank holds), goes into c's arrays as c's world
 * and shard sizes cut it. A block is 3 arrays of sum(S) floats (weights, m,
 * v), unit u at the sum of S before it. Every unit goes round in all-gathers
 * of at most c->gather_max words a rank (0: 64 MiB over the world); each
 * rank copies the real floats it owns; a rank with c->local_rc set fails
 * with the others before anything is shipped. The spread load of ckpt_load, the CPU
 * trainer's and the GPU trainer's re-slice from peers' memory are this.
 * 0 or an error with err set.
 */
int ckpt_reslice(struct ckpt_rank *c, int w0, const size_t *S, int ncontrib, const float *const *mine, int nmine,
                 const int *from_rank, const int *from_index, char *err, size_t errlen);

/*
 * Pruning: after step `committed` is committed, rank 0 of the save calls
 * ckpt_prune (ckpt_save does it). The rule, as a pure function over the
 * directories found:
 *   - nothing at or past `committed` is touched (this checkpoint, or one a
 *     racing process writes or wrote), nor the step `latest` names (what a
 *     resume loads);
 *   - a committed checkpoint is removed when `keep` (> 0; 0 = keep all)
 *     committed ones newer than it, up to `committed`, exist;
 *   - debris of a crash is removed: a step directory without a manifest, a
 *     temporary directory whose writer is gone (its lock is free), a
 *     directory moved aside while replacing one of the same step;
 *   - a temporary directory whose writer still holds its lock never is.
 */
enum ckpt_entry_kind {
    CKPT_COMMITTED,   /* step-N holding manifest.json */
    CKPT_UNCOMMITTED, /* step-N without one */
    CKPT_WRITING,     /* .tmp-step-N-PID, its writer alive */
    CKPT_ABANDONED,   /* .tmp-step-N-PID, its writer gone */
    CKPT_ASIDE,       /* .old-step-N-PID */
};

struct ckpt_entry {
    long step;
    enum ckpt_entry_kind kind;
    int remove; /* out */
};

/* Sets each entry's `remove` by the rule above (latest: the step `latest`
 * names, -1 for none) and returns how many are to go. */
int ckpt_prune_plan(struct ckpt_entry *e, size_t n, long committed, long latest, int keep);

/* Applies the rule to dir under its lock (<dir>/.lock, which the commit
 * also holds while it renames, so a prune never sees half a commit): the
 * number of directories removed, or a negative errno with the reason in err. */
int ckpt_prune(const char *dir, long committed, int keep, char *err, size_t errlen);

#endif
