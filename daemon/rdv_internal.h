/*
 * rdv_internal.h: what the files of rdv (daemon/rdv*.c) share, and nothing
 * outside them includes but rdv's unit tests. Three tiers of names: rdv_ in
 * rdv.h for musterd, rdv__ here across rdv's files, static within one.
 * Each function is described where it is defined.
 */
#ifndef MUSTER_RDV_INTERNAL_H
#define MUSTER_RDV_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "daemon/failure.h"
#include "daemon/rdv.h"

/* rdv.c: the job state, events, sending, lookups */
/* Every change of r->state goes through here: a transition of the job state
 * machine (rdv.h) is made and logged at debug; any other is refused, logged
 * as an error, and r->state kept. Returns 0 or -EINVAL. */
int rdv__set_state(struct rdv *r, enum rdv_job_state to);
void rdv__stacks_summary(const struct rdv *r, char *out, size_t cap);

#endif
