/*
 * failslow: the rule by which musterd names a rank slow (fail-slow: the rank
 * that makes a synchronous job run at its pace while nothing fails).
 *
 * Every rank's start-up hook (or muster-train, from its own timers) reports
 * how its main thread spent its latest window of wall time: computing, in a
 * collective, waiting on the GPU, loading data (a rank entry's time split,
 * proto.h). In synchronous data parallelism every rank steps at the same
 * pace, so its throughput says nothing; what differs is the compute: the
 * slow rank computes longer and its peers wait for it in the collective.
 *
 * Each figure is a rank's compute seconds per step over its window (or its
 * compute share of the window when some rank does not know its steps). A
 * rank stands out when its figure is above the median of all by both
 * FAILSLOW_MARGIN of the median and FAILSLOW_SIGMAS robust standard
 * deviations (1.4826 times the median absolute deviation): the margin keeps
 * alike ranks with little spread from being named for noise, the spread
 * keeps a noisy job from naming its noisiest rank. Robust: one slow rank (up
 * to nearly half of them) moves neither the median nor the spread. Fewer
 * than FAILSLOW_MIN_RANKS figures name nobody (two ranks are each other's
 * only peer). A rank is named after FAILSLOW_WINDOWS new windows in a row
 * that stood out, and no longer after as many in a row that did not: with
 * both conditions a window of alike ranks seldom stands out (once in about
 * 120 rank-windows seen in tests/integration/torch_failslow.sh's runs, at
 * 100 looks a second), two in a row were not seen.
 */
#ifndef MUSTER_DAEMON_FAILSLOW_H
#define MUSTER_DAEMON_FAILSLOW_H

#include <stddef.h>
#include <stdint.h>

#define FAILSLOW_MARGIN 0.10   /* above the median by at least this share of it... */
#define FAILSLOW_SIGMAS 3.0    /* ...and by this many robust standard deviations */
#define FAILSLOW_MIN_RANKS 3   /* fewer figures than this name nobody */
#define FAILSLOW_WINDOWS 2     /* windows in a row that start (or end) a rank's being slow */
#define FAILSLOW_EVAL_MS 250u  /* musterd applies the rule at most this often, once a window came */

/* The median of x[0..n) (n >= 1), sorting x in place. */
double failslow_median_sort(double *x, size_t n);

/* The rule over one set of figures x[0..n): out[i] = 1 where x[i] stands out.
 * *median and *spread (the robust standard deviation) are the set's.
 * Returns how many stand out (0 when n < FAILSLOW_MIN_RANKS), or -ENOMEM. */
int failslow_outliers(const double *x, size_t n, uint8_t *out, double *median, double *spread);

/* The median of x[0..n) without x[i] (n >= 2): the evidence's "its peers". -1 on ENOMEM. */
double failslow_peers(const double *x, size_t n, size_t i);

/* One rank's standing under the rule. */
struct failslow_state {
    int slow;        /* named slow */
    uint32_t run;    /* new windows in a row that disagree with slow */
    uint64_t since;  /* the step (or ms, for shares) where the current run of standing out began */
};

enum failslow_change { FAILSLOW_SAME, FAILSLOW_STARTS, FAILSLOW_ENDS };

/* A new window's verdict (stood out or not) for s; at, the rank's step (or
 * ms) at the start of that window. Says when s starts or ends being slow. */
enum failslow_change failslow_note(struct failslow_state *s, int stood_out, uint64_t at);

#endif
