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
 * unit, S = ceil(numel / N), zero-padded past the unit's end. A checkpoint
 * is written into a temporary directory, synced, and renamed into place;
 * `latest` is replaced by rename after that, so a crash leaves the previous
 * checkpoint intact.
 */
#ifndef MUSTER_TRAIN_CKPT_H
#define MUSTER_TRAIN_CKPT_H

#include <stddef.h>

struct trainer;

/* Writes the trainer's state as step-<step> under dir (created if needed)
 * and points dir/latest at it. Collective: every rank writes its own shard
 * file, and rank 0 commits (manifest, rename, `latest`) only after all of
 * them are durable; the same result on every rank. dir must be one directory
 * that all ranks see. On success tr->last_checkpoint_step = step and path
 * (may be NULL) gets the checkpoint's directory. Returns 0 or a negative
 * errno with the reason in err. */
int ckpt_save(struct trainer *tr, const char *dir, char *path, size_t pathlen, char *err,
              size_t errlen);

/* Loads a checkpoint: path is a step directory (holding manifest.json) or a
 * checkpoint_dir (its `latest` is followed). Refuses a checkpoint of another
 * model, naming the difference, and any file whose size or checksum does
 * not match the manifest. Shards of any world size N are re-sliced into this
 * trainer's world M: each rank reads only the files that hold floats it
 * owns. Collective: every rank returns an error when one could not load. */
int ckpt_load(struct trainer *tr, const char *path, char *err, size_t errlen);

#endif
