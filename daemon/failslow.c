/* daemon/failslow.c: the fail-slow rule (see failslow.h). Pure: no rdv, no I/O. */
#include "daemon/failslow.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

static int cmp_double(const void *a, const void *b)
{
    const double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

double failslow_median_sort(double *x, size_t n)
{
    qsort(x, n, sizeof(*x), cmp_double);
    return n % 2 ? x[n / 2] : (x[n / 2 - 1] + x[n / 2]) / 2;
}

int failslow_outliers(const double *x, size_t n, uint8_t *out, double *median, double *spread)
{
    memset(out, 0, n);
    *median = *spread = 0;
    if (n < FAILSLOW_MIN_RANKS)
        return 0;
    double *tmp = malloc(n * sizeof(*tmp));
    if (!tmp)
        return -ENOMEM;
    memcpy(tmp, x, n * sizeof(*tmp));
    const double med = failslow_median_sort(tmp, n);
    for (size_t i = 0; i < n; i++)
        tmp[i] = fabs(x[i] - med);
    const double sigma = 1.4826 * failslow_median_sort(tmp, n);
    free(tmp);
    int flagged = 0;
    for (size_t i = 0; i < n; i++) {
        out[i] = x[i] > med * (1 + FAILSLOW_MARGIN) && x[i] > med + FAILSLOW_SIGMAS * sigma;
        flagged += out[i];
    }
    *median = med;
    *spread = sigma;
    return flagged;
}

double failslow_peers(const double *x, size_t n, size_t i)
{
    double *tmp = malloc((n - 1) * sizeof(*tmp));
    if (!tmp)
        return -1;
    memcpy(tmp, x, i * sizeof(*tmp));
    memcpy(tmp + i, x + i + 1, (n - 1 - i) * sizeof(*tmp));
    const double med = failslow_median_sort(tmp, n - 1);
    free(tmp);
    return med;
}

enum failslow_change failslow_note(struct failslow_state *s, int stood_out, uint64_t at)
{
    if (!!stood_out == s->slow) {
        s->run = 0;
        return FAILSLOW_SAME;
    }
    if (s->run++ == 0 && stood_out)
        s->since = at; /* the first window of a run that may start it */
    if (s->run < FAILSLOW_WINDOWS)
        return FAILSLOW_SAME;
    s->slow = !s->slow;
    s->run = 0;
    return s->slow ? FAILSLOW_STARTS : FAILSLOW_ENDS;
}
