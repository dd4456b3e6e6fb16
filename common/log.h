/*
 * log: one macro for every program. Lines go to stderr (journald keeps
 * them) as "<prog> <level>: message". The level is checked before the
 * arguments are formatted.
 */
#ifndef MUSTER_LOG_H
#define MUSTER_LOG_H

enum log_level { LOG_ERROR = 0, LOG_WARN = 1, LOG_INFO = 2, LOG_DEBUG = 3 };

extern enum log_level log_threshold;

/* Program name shown in front of each line; defaults to "muster". */
void log_set_prog(const char *prog);
/* Parses "error", "warn", "info", "debug"; returns 0 or -EINVAL. */
int log_set_level_name(const char *name);

void log_write(enum log_level level, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#define LOG(level, ...)                                                        \
    do {                                                                       \
        if ((level) <= log_threshold)                                          \
            log_write((level), __VA_ARGS__);                                   \
    } while (0)

#define log_error(...) LOG(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) LOG(LOG_WARN, __VA_ARGS__)
#define log_info(...) LOG(LOG_INFO, __VA_ARGS__)
#define log_debug(...) LOG(LOG_DEBUG, __VA_ARGS__)

#endif
