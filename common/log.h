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

/*
 * A line that can repeat without bound (one per refused connection, say):
 * each call site lets LOG_LIMIT_BURST lines through per LOG_LIMIT_WINDOW_MS
 * and counts the rest; the first line through after a window with losses
 * is preceded by "N similar lines suppressed (FORMAT)". A call site that
 * falls quiet has its count written by log_limit_flush (a program with a
 * loop calls it every tick, and once more, with all = 1, before it exits).
 * Any thread may log through it (one lock, taken only by limited lines).
 */
#define LOG_LIMIT_BURST 5
#define LOG_LIMIT_WINDOW_MS 1000

struct log_limit {
    unsigned long long window_start_ms;
    unsigned passed;
    unsigned long suppressed;
    /* once it has held a line back: listed for log_limit_flush */
    enum log_level level;
    const char *fmt;
    struct log_limit *next;
    int listed;
};

/* 1 when this line may be written (after reporting what was held back). */
int log_limit_pass(struct log_limit *lim, enum log_level level, const char *fmt);

/* Writes the count of every call site whose window has ended with lines
 * held back (all: every count, ended or not, as at exit). */
void log_limit_flush(int all);

#define LOG_LIMITED(level, fmt, ...)                                           \
    do {                                                                       \
        static struct log_limit log_limit_;                                    \
        if ((level) <= log_threshold && log_limit_pass(&log_limit_, (level), fmt)) \
            log_write((level), fmt, ##__VA_ARGS__);                            \
    } while (0)

#define log_error(...) LOG(LOG_ERROR, __VA_ARGS__)
#define log_warn(...) LOG(LOG_WARN, __VA_ARGS__)
#define log_info(...) LOG(LOG_INFO, __VA_ARGS__)
#define log_debug(...) LOG(LOG_DEBUG, __VA_ARGS__)
#define log_warn_limited(...) LOG_LIMITED(LOG_WARN, __VA_ARGS__)
#define log_info_limited(...) LOG_LIMITED(LOG_INFO, __VA_ARGS__)

#endif
