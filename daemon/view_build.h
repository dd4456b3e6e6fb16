/*
 * view_build: the loop's side of the REST snapshot. Copies what REST shows
 * of the rendezvous state into a struct snap_view: the job's figures, one
 * flat record per node and per rank, and what the summary of /v1/status
 * needs (counts by state, each node's rollup and health, the failing and
 * the slowest ranks). O(nodes + ranks) with small constants and no JSON
 * per rank: the documents themselves are rendered by the REST threads,
 * once per view (daemon/restdoc.h).
 */
#ifndef MUSTER_VIEW_BUILD_H
#define MUSTER_VIEW_BUILD_H

#include <stdint.h>

#include "daemon/rdv.h"
#include "daemon/snapshot.h"

/*
 * A new view of r at now_ms (one reference), carrying events and history
 * (JSON text, malloc'd; taken over, freed on failure too). NULL on ENOMEM.
 */
struct snap_view *view_build(const struct rdv *r, uint64_t now_ms, char *events, char *history);

/*
 * Fills what view_build derives from the node and rank records already in
 * v: node rollups and health, node_order, counts, failing and slowest
 * ranks. view_build calls it; tests that write records by hand call it too.
 */
void view_derive(struct snap_view *v);

#endif
