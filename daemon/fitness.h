/*
 * fitness: which nodes can run the job. A node counts toward a generation
 * only when its agent's pre-flight passed (PREFLIGHT; agents that promise
 * none count at once) and the job's plan (common/plan.h) fits the memory
 * its HELLO reported: GPU nodes their smallest GPU, CPU nodes their host
 * memory, shared by their ranks. A node that does not is "unfit", with the
 * reason, in status and events; the job waits for it (or forms without it
 * as min_nodes allows) and spends no restart.
 *
 * Jobs that run their own rank program (rank_cmd), and nodes whose agent
 * says its ranks are not muster-train, are not planned: their memory is the
 * program's.
 */
#ifndef MUSTER_FITNESS_H
#define MUSTER_FITNESS_H

#include <jansson.h>

#include "common/plan.h"
#include "daemon/rdv.h"

/* The node may be counted: joined, its pre-flight passed, the plan fits it. */
int fitness_ready(const struct rdv_node *nd);

/* "fit", "unfit" or "checking". */
const char *fitness_name(const struct rdv_node *nd);

/* Why the node is unfit ("" when it is not). */
const char *fitness_reason(const struct rdv_node *nd);

/*
 * The plan of a generation of the nodes picked: the members (candidates 0)
 * or the joined nodes whose pre-flight passed (candidates 1). Returns 0,
 * -ENOTSUP for a job that runs its own rank program, -ENOENT when no node is
 * picked, or -EINVAL with why.
 */
int fitness_plan(const struct rdv *r, int candidates, struct plan *p, char *why, size_t len);

/*
 * Sets plan_unfit on every picked node whose memory the plan exceeds (and
 * clears it on the others), naming the device and the numbers. Returns how
 * many nodes it found unfit.
 */
int fitness_check(struct rdv *r, int candidates);

/* {"plan": plan|null, "plan_note": why there is none|null, "measured": {"comm_frac",
 * "sent_per_step", "peak_mem": the largest over the running ranks, or null}},
 * merged into the status document (and so into GET /v1/plan). */
json_t *fitness_plan_json(const struct rdv *r);

#endif
