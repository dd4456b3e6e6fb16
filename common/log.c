#include "common/log.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

enum log_level log_threshold = LOG_INFO;
static const char *log_prog = "muster";

static const char *const level_names[] = {"error", "warn", "info", "debug"};

void log_set_prog(const char *prog) { log_prog = prog; }

int log_set_level_name(const char *name)
{
    for (int i = 0; i <= LOG_DEBUG; i++) {
        if (strcmp(name, level_names[i]) == 0) {
            log_threshold = (enum log_level)i;
            return 0;
        }
    }
    return -EINVAL;
}

void log_write(enum log_level level, const char *fmt, ...)
{
    char line[2048];
    va_list ap;
    int n = snprintf(line, sizeof(line), "%s %s: ", log_prog, level_names[level]);
    va_start(ap, fmt);
    vsnprintf(line + n, sizeof(line) - (size_t)n, fmt, ap);
    va_end(ap);
    /* One write per line so lines of concurrent processes do not interleave. */
    size_t len = strlen(line);
    if (len < sizeof(line) - 1) {
        line[len++] = '\n';
        line[len] = '\0';
    }
    fputs(line, stderr);
}

static pthread_mutex_t limit_lock = PTHREAD_MUTEX_INITIALIZER;
static struct log_limit *limits; /* call sites that have held a line back */

static unsigned long long mono_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (unsigned long long)ts.tv_sec * 1000 + (unsigned long long)ts.tv_nsec / 1000000;
}

/* Under limit_lock: the held-back count goes out and the window starts again. */
static void report(struct log_limit *lim, unsigned long long now)
{
    if (lim->suppressed)
        log_write(lim->level, "%lu similar lines suppressed (\"%s\")", lim->suppressed, lim->fmt);
    lim->window_start_ms = now;
    lim->passed = 0;
    lim->suppressed = 0;
}

int log_limit_pass(struct log_limit *lim, enum log_level level, const char *fmt)
{
    const unsigned long long now = mono_ms();
    int pass = 1;
    pthread_mutex_lock(&limit_lock);
    if (lim->passed == 0 || now - lim->window_start_ms >= LOG_LIMIT_WINDOW_MS)
        report(lim, now);
    if (lim->passed >= LOG_LIMIT_BURST) {
        lim->suppressed++;
        lim->level = level;
        lim->fmt = fmt;
        if (!lim->listed) {
            lim->listed = 1;
            lim->next = limits;
            limits = lim;
        }
        pass = 0;
    } else {
        lim->passed++;
    }
    pthread_mutex_unlock(&limit_lock);
    return pass;
}

void log_limit_flush(int all)
{
    const unsigned long long now = mono_ms();
    pthread_mutex_lock(&limit_lock);
    for (struct log_limit *lim = limits; lim; lim = lim->next)
        if (lim->suppressed && (all || now - lim->window_start_ms >= LOG_LIMIT_WINDOW_MS))
            report(lim, now);
    pthread_mutex_unlock(&limit_lock);
}
