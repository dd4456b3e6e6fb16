/* common/sbuf.c: growable text (see sbuf.h). */
#include "common/sbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int sb_reserve(struct sbuf *b, size_t more)
{
    if (b->failed)
        return -1;
    if (b->len + more + 1 <= b->cap)
        return 0;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1)
        cap *= 2;
    char *p = realloc(b->p, cap);
    if (!p) {
        b->failed = 1;
        return -1;
    }
    b->p = p;
    b->cap = cap;
    return 0;
}

void sb_put(struct sbuf *b, const char *s, size_t n)
{
    if (sb_reserve(b, n) != 0)
        return;
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = '\0';
}

void sb_printf(struct sbuf *b, const char *fmt, ...)
{
    va_list ap;
    for (int pass = 0; pass < 2; pass++) {
        if (sb_reserve(b, pass ? 0 : 128) != 0)
            return;
        size_t room = b->cap - b->len;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, room, fmt, ap);
        va_end(ap);
        if (n < 0) {
            b->failed = 1;
            return;
        }
        if ((size_t)n < room) {
            b->len += (size_t)n;
            return;
        }
        if (sb_reserve(b, (size_t)n) != 0)
            return;
    }
}

void sb_json_str(struct sbuf *b, const char *s)
{
    sb_put(b, "\"", 1);
    const char *run = s;
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch >= 0x20 && ch != '"' && ch != '\\')
            continue;
        sb_put(b, run, (size_t)(s - run));
        if (ch == '"' || ch == '\\') {
            char esc[2] = {'\\', (char)ch};
            sb_put(b, esc, 2);
        } else {
            sb_printf(b, "\\u%04x", ch);
        }
        run = s + 1;
    }
    sb_put(b, run, (size_t)(s - run));
    sb_put(b, "\"", 1);
}

char *sb_finish(struct sbuf *b, size_t *len)
{
    if (b->failed || sb_reserve(b, 0) != 0) {
        free(b->p);
        memset(b, 0, sizeof(*b));
        return NULL;
    }
    char *p = b->p;
    if (len)
        *len = b->len;
    memset(b, 0, sizeof(*b));
    return p;
}
