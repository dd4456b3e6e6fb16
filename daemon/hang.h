/*
 * hang: what musterd needs to call a job hung: the progress timeout, and
 * the ranks it names as ranges (daemon/rdv_hang.c finds and names them).
 *
 * The progress timeout that fits the job (progress_timeout_ms absent or
 * "auto"): until the generation has run HANG_JUDGE_STEPS steps past the
 * step its ranks first reported (steps, not heartbeats: one beat may bring
 * many), a start
 * allowance of HANG_START_MS (or three times the longest of those first
 * steps, when longer: first steps compile and load); afterwards the largest
 * of HANG_FLOOR_MS, 20 times the median of the recent step times and three
 * times the longest step seen after the first ones, in any generation. Step
 * times are what the ranks measured (`step_s`), or else the time between
 * two of a rank's step changes.
 */
#ifndef MUSTER_DAEMON_HANG_H
#define MUSTER_DAEMON_HANG_H

#include <stddef.h>
#include <stdint.h>

#define HANG_SAMPLES 64         /* recent step times kept for the median */
#define HANG_JUDGE_STEPS 5      /* steps of a generation before the timeout follows them */
#define HANG_START_MS 300000u   /* the start allowance */
#define HANG_FLOOR_MS 30000u    /* the least a derived timeout is */
#define HANG_MEDIAN_TIMES 20    /* the derived timeout: this many median steps... */
#define HANG_LONGEST_TIMES 3    /* ...or this many of the longest, whichever is more */
#define HANG_STACKS_WAIT_MS 2000u /* a hung generation waits this long for its ranks' stacks */
#define HANG_STOPPED_MS 5000u   /* a rank seen stopped this long, its peers stalled as long, is hung */

struct hang_steps {
    double recent[HANG_SAMPLES]; /* ring of step times after the first steps, seconds */
    double sorted[HANG_SAMPLES]; /* the same nrecent times, ascending: the median without a sort
                                  * (a note comes for every rank's every step) */
    uint32_t nrecent, next;
    double longest_s;        /* longest after the first steps of its generation, any generation */
    double first_longest_s;  /* longest of this generation's first steps */
    uint32_t seen;           /* steps this generation ran past the first one its ranks reported */
    uint64_t top_step;       /* the highest step it reached; 0 = none yet */
};

/* A generation began: its first steps are counted again. */
void hang_steps_new_generation(struct hang_steps *h);

/* A rank reached step from prev (the step it was last seen at in this
 * generation), having taken step_s seconds over its last one. */
void hang_steps_note(struct hang_steps *h, uint64_t prev, uint64_t step, double step_s);

/* The progress timeout in force, ms: spec_ms itself when >= 0 (0 = off),
 * the derived one (above) when spec_ms < 0 (auto). */
uint64_t hang_timeout_ms(const struct hang_steps *h, int spec_ms);

/* The median of the recent step times, seconds; 0 when none. */
double hang_median_step_s(const struct hang_steps *h);

/* "rank 3" or "ranks 0-2, 5" for ranks[0..n) (ascending) into out; a list
 * too long for out ends in ", ...". Returns strlen(out). */
size_t hang_ranges(char *out, size_t cap, const uint32_t *ranks, uint32_t n);

#endif
