/*
 * memtags: decisions over the names of memory checkpoints (job key
 * memory_checkpoint_mb), pure functions shared by musterd, which picks the
 * checkpoint every node restores, and the agent, which orders its own.
 *
 * A checkpoint's name is its tag: a directory name as the program chose it
 * (DeepSpeed's global_step120, step10). Newer means later in version order
 * (strverscmp: step9 < step10), the order DeepSpeed's own tags and most
 * step-numbered names take.
 */
#ifndef MUSTER_MEMTAGS_H
#define MUSTER_MEMTAGS_H

#include <stddef.h>
#include <stdint.h>

/* < 0, 0, > 0 as a is older than, the same as, newer than b. */
int memtags_cmp(const char *a, const char *b);

/*
 * The newest name that every one of the n lists holds: lists[i] points at
 * counts[i] names of stride bytes each (any order). out gets "" when the
 * lists share none or n is 0. Returns 1 when one was found, else 0.
 */
int memtags_common(const char *const *lists, const uint32_t *counts, size_t n, size_t stride, char *out,
                   size_t cap);

/* The step a name ends in ("global_step120" -> 120); 0 when it ends in no digit. */
uint64_t memtags_step(const char *name);

#endif
