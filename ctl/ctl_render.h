/*
 * ctl_render: how musterctl shows the documents of the REST API to people:
 * a status summary, aligned tables of nodes and ranks, event lines, and the
 * one-line forms used by `watch` when stdout is not a terminal.
 */
#ifndef MUSTER_CTL_RENDER_H
#define MUSTER_CTL_RENDER_H

#include <stdio.h>

#include <jansson.h>

/* The job summary of a SNAP_STATUS object (a few lines). */
void render_summary(FILE *f, const json_t *status);
/* Aligned tables of a "nodes" or "ranks" array (with a header row). */
void render_nodes(FILE *f, const json_t *nodes);
void render_ranks(FILE *f, const json_t *ranks);
/* One event of /v1/events as one line. */
void render_event(FILE *f, const json_t *event);
/*
 * The progress line of `watch`: step (of "steps" when the status has it,
 * with a bar), loss, throughput, and steps_per_s when >= 0.
 */
void render_progress(FILE *f, const json_t *status, double steps_per_s);
/* A set of GET /v1/stacks: a head line, where the ranks are (ranks in the
 * same place on one line), and with full each rank's stack text. */
void render_stacks(FILE *f, const json_t *stacks, int full);
/* key=value line of a status, for `watch` into a pipe or file. */
void render_status_line(FILE *f, const json_t *status);

#endif
