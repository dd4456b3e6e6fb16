/*
 * sbuf: growable text, what the daemon's renderers (daemon/restdoc.c,
 * daemon/metrics.c) write documents into. A zeroed struct sbuf is empty;
 * an allocation that fails marks it failed, later writes do nothing, and
 * sb_finish answers NULL.
 */
#ifndef MUSTER_SBUF_H
#define MUSTER_SBUF_H

#include <stddef.h>

struct sbuf {
    char *p;
    size_t len, cap;
    int failed; /* an allocation failed: the text is incomplete */
};
void sb_printf(struct sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_put(struct sbuf *b, const char *s, size_t n);
/* s as a JSON string literal (quotes, backslash and control characters escaped). */
void sb_json_str(struct sbuf *b, const char *s);
/* The text (caller frees), or NULL when an allocation failed. */
char *sb_finish(struct sbuf *b, size_t *len);

#endif
