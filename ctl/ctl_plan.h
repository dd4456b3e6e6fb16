/*
 * ctl_plan: musterctl's `plan` command and the table it prints
 * (docs/plan.md). With a JOB (a job spec file or a preset name) it plans
 * locally from the command line's shape; without one it shows the running
 * job's plan from GET /v1/plan, with what the ranks measured beside it.
 */
#ifndef MUSTER_CTL_PLAN_H
#define MUSTER_CTL_PLAN_H

#include <stdio.h>

#include <jansson.h>

/* GET path from server; a JSON object, or NULL after saying why. */
typedef json_t *(*ctl_get_fn)(void *ctx, const char *server, const char *path);

/* argv holds the whole command line; returns the exit status (0, 1, 2). */
int ctl_plan_main(int argc, char **argv, const char *server, ctl_get_fn get, void *get_ctx);

/* The table of a plan object (common/plan.h's plan_json). */
void render_plan(FILE *f, const json_t *plan);
/* The table of a program's plan (common/plan_prog.h's plan_prog_json). */
void render_plan_prog(FILE *f, const json_t *plan);
/* Every flag plan takes, for --help. */
void ctl_plan_usage(FILE *f);
/* Predicted beside measured, from GET /v1/plan's "measured" part. */
void render_plan_measured(FILE *f, const json_t *doc);

#endif
