#include "daemon/failure.h"

#include <signal.h>
#include <string.h>

/* Words in a rank's reason that name a class; the first match wins. */
static const struct {
    enum failure_class cls;
    const char *word;
} marks[] = {
    {FAILURE_CONFIG, "cannot run '"}, /* the agent could not start it */
    {FAILURE_CONFIG, "ModuleNotFoundError"},
    {FAILURE_CONFIG, "ImportError"},
    {FAILURE_CONFIG, "SyntaxError"},
    {FAILURE_DISK_FULL, "No space left on device"},
    {FAILURE_DISK_FULL, "ENOSPC"},
    {FAILURE_DISK_FULL, "Disk quota exceeded"},
    {FAILURE_OOM, "out of memory"},
    {FAILURE_OOM, "Out of memory"},
    {FAILURE_OOM, "OutOfMemoryError"},
    {FAILURE_OOM, "Cannot allocate memory"},
    {FAILURE_COMM, "NCCL"},
    {FAILURE_COMM, "gloo"},
    {FAILURE_COMM, "Connection reset by peer"},
    {FAILURE_COMM, "Connection closed by peer"},
    {FAILURE_COMM, "Broken pipe"},
    {FAILURE_COMM, "Timed out waiting"},                           /* gloo's and torch's store timeouts */
    {FAILURE_COMM, "Watchdog caught collective operation timeout"}, /* torch's NCCL watchdog */
    {FAILURE_COMM, "DistBackendError"},
};

enum failure_class failure_classify(const struct proto_rank_exit *x)
{
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
        if (strstr(x->reason, marks[i].word))
            return marks[i].cls;
    if (x->signal)
        return FAILURE_SIGNAL;
    /* 2: muster's programs (and argparse) refuse their command line. */
    return x->exit_code == 2 && x->reason[0] ? FAILURE_CONFIG : FAILURE_EXIT;
}

const char *failure_class_name(enum failure_class c)
{
    static const char *const names[] = {"exit", "signal", "comm", "disk_full", "oom", "config"};
    return (unsigned)c < sizeof(names) / sizeof(names[0]) ? names[c] : "exit";
}

int failure_fatal(enum failure_class c)
{
    return c == FAILURE_CONFIG;
}

uint64_t failure_backoff_ms(const struct job_spec *spec, uint32_t streak, enum failure_class c)
{
    const uint64_t base = (uint64_t)spec->restart_backoff_ms, cap = (uint64_t)spec->restart_backoff_max_ms;
    if (base == 0)
        return 0;
    if (c == FAILURE_DISK_FULL || c == FAILURE_OOM)
        return cap;
    if (streak <= 1)
        return 0;
    uint64_t d = base;
    for (uint32_t i = 2; i < streak && d < cap; i++)
        d *= 2;
    return d < cap ? d : cap;
}
