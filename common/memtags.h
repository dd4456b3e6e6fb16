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

/*
 * The buddy map: which member holds node i's replicas. Members are given in
 * name order, 0..n-1; domains[i] names node i's failure domain (rack,
 * switch), NULL for a node that is a domain of its own (unlabelled in a
 * job where others are), or domains is NULL when the operator labels none.
 * Without labels
 * (or all alike) node i's buddy is node i+1 mod n. With them the nodes are
 * dealt round-robin from each domain in turn (domains in the order their
 * first node comes, each domain's nodes in name order) and each node's
 * buddy is the next one dealt: consecutive nodes come from different
 * domains while more than one domain has nodes left. Either way the map is
 * a rotation, so every node holds exactly one other's copy. Returns the
 * buddy's index, or n when there is none (n < 2, or i >= n).
 */
size_t memtags_buddy(const char *const *domains, size_t n, size_t i);

#endif
