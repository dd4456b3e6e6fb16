#include "common/ratelimit.h"

#include <stdio.h>

int ratelimit_pass(struct ratelimit *rl, uint64_t now_ms, uint64_t interval_ms, unsigned long *held)
{
    if (rl->used && now_ms - rl->last_ms < interval_ms) {
        rl->held++;
        return 0;
    }
    *held = rl->held;
    rl->held = 0;
    rl->last_ms = now_ms;
    rl->used = 1;
    return 1;
}

const char *ratelimit_note(unsigned long held, char *buf, size_t cap)
{
    if (held == 0)
        return "";
    snprintf(buf, cap, " (%lu more like it held back)", held);
    return buf;
}
