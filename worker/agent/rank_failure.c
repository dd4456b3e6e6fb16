#include "worker/agent/rank_failure.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <jansson.h>

#include "proto/proto.h"

/* Copies the last cap-1 bytes of s (a tail keeps the end, where the error is). */
static void copy_tail(char *out, size_t cap, const char *s)
{
    size_t n = strlen(s);
    const char *from = n >= cap ? s + n - (cap - 1) : s;
    /* Start on a line when the cut fell inside one. */
    if (from != s) {
        const char *nl = strchr(from, '\n');
        if (nl && nl[1])
            from = nl + 1;
    }
    snprintf(out, cap, "%s", from);
    proto_text_sanitize(out);
}

/* Library frames: a location there says less than the user's own frame that called it. */
static int library_path(const char *path, size_t len)
{
    static const char *const marks[] = {"/site-packages/", "/dist-packages/", "/lib/python", "<frozen"};
    for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++) {
        size_t m = strlen(marks[i]);
        for (size_t k = 0; k + m <= len; k++)
            if (memcmp(path + k, marks[i], m) == 0)
                return 1;
    }
    return 0;
}

/*
 * The innermost 'File "x/y.py", line N' of a Python traceback that is not in
 * a library (else the innermost of all) as "y.py:N"; "" when none.
 */
static void traceback_location(const char *tb, char *out, size_t cap)
{
    const char *pick = NULL, *path = NULL, *end = NULL;
    int pick_is_user = 0;
    out[0] = '\0';
    for (const char *p = tb; (p = strstr(p, "File \"")) != NULL; p += 6) {
        const char *q = p + 6, *e = strchr(q, '"');
        if (!e || strncmp(e, "\", line ", 8) != 0)
            continue;
        int user = !library_path(q, (size_t)(e - q));
        if (user || !pick_is_user) {
            pick = p, path = q, end = e;
            pick_is_user = user;
        }
    }
    if (!pick)
        return;
    const char *base = path;
    for (const char *q = path; q < end; q++)
        if (*q == '/')
            base = q + 1;
    unsigned long line = strtoul(end + 8, NULL, 10);
    snprintf(out, cap, "%.*s:%lu", (int)(end - base), base, line);
}

/* The last line of text that is not blank, without its newline. */
static void last_line(const char *text, char *out, size_t cap)
{
    const char *end = text + strlen(text);
    out[0] = '\0';
    while (end > text) {
        while (end > text && (end[-1] == '\n' || end[-1] == ' ' || end[-1] == '\t' || end[-1] == '\r'))
            end--;
        const char *start = end;
        while (start > text && start[-1] != '\n')
            start--;
        if (end > start) {
            snprintf(out, cap, "%.*s", (int)(end - start), start);
            return;
        }
        end = start;
    }
}

/* reason = message, plus " (file:line)" when the traceback names one. */
static void compose(char *reason, size_t cap, const char *message, const char *traceback)
{
    char where[160];
    traceback_location(traceback ? traceback : "", where, sizeof(where));
    char line[1024];
    last_line(message, line, sizeof(line)); /* one line, even from a multi-line message */
    if (where[0])
        snprintf(reason, cap, "%s (%s)", line, where);
    else
        snprintf(reason, cap, "%s", line);
    proto_text_sanitize(reason);
}

/*
 * The error file's bytes, at most RANK_ERROR_FILE_MAX, into a malloc'd buffer.
 * The rank (or anything it started) controls the path: it is opened without
 * following a symbolic link and without blocking, and only a regular file
 * of one name outside procfs and sysfs is read, so that a FIFO, a device or
 * /proc/kmsg can never stall the agent's event loop, nor a hard link make
 * it read a file that is not the rank's. -ENOENT when there is none.
 */
static int read_error_file(const char *path, char **out, size_t *len, char *why_not, size_t why_cap)
{
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY);
    if (fd < 0) {
        if (errno == ENOENT)
            return -ENOENT;
        snprintf(why_not, why_cap, "error file %s: %s", path,
                 errno == ELOOP ? "a symbolic link (not followed)" : strerror(errno));
        return -EINVAL;
    }
    struct stat st;
    struct statfs fs;
    int rc = 0;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || fstatfs(fd, &fs) != 0 ||
        fs.f_type == PROC_SUPER_MAGIC || fs.f_type == SYSFS_MAGIC) {
        snprintf(why_not, why_cap, "error file %s is not a regular file", path);
        rc = -EINVAL;
    } else if (st.st_nlink != 1) { /* a hard link to a file not the rank's: the agent may be root */
        snprintf(why_not, why_cap, "error file %s has another name (a hard link): not read", path);
        rc = -EINVAL;
    } else if (st.st_size > RANK_ERROR_FILE_MAX) {
        snprintf(why_not, why_cap, "error file %s holds %lld bytes, more than the %d read", path,
                 (long long)st.st_size, RANK_ERROR_FILE_MAX);
        rc = -EFBIG;
    }
    char *buf = rc ? NULL : malloc(RANK_ERROR_FILE_MAX + 1);
    size_t n = 0;
    while (buf && n <= RANK_ERROR_FILE_MAX) {
        ssize_t k = read(fd, buf + n, RANK_ERROR_FILE_MAX + 1 - n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k <= 0)
            break;
        n += (size_t)k;
    }
    close(fd);
    if (rc == 0 && !buf) {
        snprintf(why_not, why_cap, "error file %s: out of memory", path);
        return -ENOMEM;
    }
    if (rc == 0 && n > RANK_ERROR_FILE_MAX) { /* it grew while being read */
        snprintf(why_not, why_cap, "error file %s holds more than the %d bytes read", path, RANK_ERROR_FILE_MAX);
        rc = -EFBIG;
    }
    if (rc) {
        free(buf);
        return rc;
    }
    *out = buf;
    *len = n;
    return 0;
}

/* 0 when the error file gave a message; else why not (in why_not), or -ENOENT when absent. */
static int from_error_file(const char *path, char *reason, size_t reason_cap, char *detail, size_t detail_cap,
                           char *why_not, size_t why_cap)
{
    if (!path || !path[0])
        return -ENOENT;
    char *bytes;
    size_t len;
    int rc = read_error_file(path, &bytes, &len, why_not, why_cap);
    if (rc)
        return rc;
    json_error_t jerr;
    json_t *root = json_loadb(bytes, len, JSON_REJECT_DUPLICATES, &jerr);
    free(bytes);
    if (!root) {
        snprintf(why_not, why_cap, "error file %s is not JSON: %s (line %d)", path, jerr.text, jerr.line);
        return -EINVAL;
    }
    /* {"message": {"message": M, "extraInfo": {"py_callstack": T}}}, or {"message": M}. */
    const json_t *msg = json_object_get(root, "message"), *text = msg, *tb = NULL;
    if (json_is_object(msg)) {
        text = json_object_get(msg, "message");
        tb = json_object_get(json_object_get(msg, "extraInfo"), "py_callstack");
    }
    rc = 0;
    if (!json_is_string(text) || json_string_length(text) == 0) {
        snprintf(why_not, why_cap, "error file %s has no \"message\" string", path);
        rc = -EINVAL;
    } else {
        const char *traceback = json_is_string(tb) ? json_string_value(tb) : "";
        compose(reason, reason_cap, json_string_value(text), traceback);
        copy_tail(detail, detail_cap, traceback);
    }
    json_decref(root);
    return rc;
}

void rank_failure_explain(const char *error_file, const char *stderr_tail, char *reason, size_t reason_cap,
                          char *detail, size_t detail_cap, char *why_not, size_t why_cap)
{
    reason[0] = detail[0] = why_not[0] = '\0';
    if (from_error_file(error_file, reason, reason_cap, detail, detail_cap, why_not, why_cap) == 0)
        return;
    if (!stderr_tail || !stderr_tail[0])
        return;
    compose(reason, reason_cap, stderr_tail, stderr_tail);
    copy_tail(detail, detail_cap, stderr_tail);
}
