/*
 * daemon/rdv_flight.c: the flight recorder's verdict on a set of stacks.
 *
 * Each Python rank's STACKS may carry its flight recorder summary (`fr`,
 * common/flight.h), which the agent checked and musterd checks again when
 * it keeps it (a rank's words, relayed). Once every running rank of the
 * generation answered with one, flight_blame compares them: the rank that
 * never entered the collective its peers wait in, with the collective's
 * number and op. Without every rank's summary there is no verdict: a rank
 * left out may be the one behind.
 */
#include "daemon/rdv_internal.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "common/flight.h"

int rdv__flight_verdict(const struct rdv *r, char *out, size_t cap, uint32_t *culprit)
{
    const struct rdv_stacks *k = &r->stacks;
    out[0] = '\0';
    if (!k->generation || k->generation != r->generation || k->nranks != r->world_size || !r->world_size)
        return 0;
    for (uint32_t i = 0; i < r->world_size; i++)
        if (r->ranks[i].state == RDV_RANK_RUNNING && !k->ranks[i].fr)
            return 0;
    struct flight_rank *parsed = calloc(r->world_size, sizeof(*parsed));
    const struct flight_rank **ranks = calloc(r->world_size, sizeof(*ranks));
    int rc = -ENOMEM;
    if (!parsed || !ranks)
        goto out;
    for (uint32_t i = 0; i < r->world_size; i++) {
        const char *fr = k->ranks[i].fr;
        if (r->ranks[i].state != RDV_RANK_RUNNING || !fr)
            continue;
        if (flight_parse(fr, strlen(fr), &parsed[i], NULL) != 0)
            continue; /* refused when it came: cannot happen */
        ranks[i] = &parsed[i];
    }
    rc = flight_blame(ranks, r->world_size, out, cap, culprit);
out:
    free(parsed);
    free(ranks);
    return rc;
}
