/*
 * ctl_doctor: musterctl's `doctor` command: the node checks of the agent's
 * pre-flight (common/preflight.h) run on the spot, plus musterd
 * reachability, the token file's mode and the ports, as a table saying what
 * to do about each failure (docs/plan.md).
 */
#ifndef MUSTER_CTL_DOCTOR_H
#define MUSTER_CTL_DOCTOR_H

#include "ctl/ctl_plan.h"

/* argv holds the whole command line; returns 0 when every check passed, 1
 * when one failed, 2 on a usage error. */
int ctl_doctor_main(int argc, char **argv, const char *server, ctl_get_fn get, void *get_ctx);

/* Every flag doctor takes, for --help and usage errors. */
void ctl_doctor_usage(FILE *f);

#endif
