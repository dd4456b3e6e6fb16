#include "common/cmdline.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/jsonkind.h"

/* Appends one argument; -EINVAL when it does not fit (the final NUL included). */
static int pack_arg(char *packed, size_t cap, size_t *used, const char *arg, size_t len)
{
    if (*used + len + 2 > cap)
        return -EINVAL;
    memcpy(packed + *used, arg, len);
    packed[*used + len] = '\0';
    *used += len + 1;
    packed[*used] = '\0';
    return 0;
}

int cmdline_from_string(const char *s, char *packed, size_t cap)
{
    size_t used = 0, n = 0;
    packed[0] = '\0';
    for (const char *p = s;;) {
        p += strspn(p, " \t");
        if (*p == '\0')
            break;
        size_t len = strcspn(p, " \t");
        if (++n > CMDLINE_ARGS || pack_arg(packed, cap, &used, p, len) != 0)
            return -EINVAL;
        p += len;
    }
    return n ? 0 : -EINVAL;
}

int cmdline_from_argv(int argc, char *const *argv, char *packed, size_t cap)
{
    size_t used = 0;
    packed[0] = '\0';
    if (argc < 1 || argc > CMDLINE_ARGS || argv[0][0] == '\0')
        return -EINVAL;
    for (int i = 0; i < argc; i++)
        if (pack_arg(packed, cap, &used, argv[i], strlen(argv[i])) != 0)
            return -EINVAL;
    return 0;
}

int cmdline_from_json(const json_t *v, char *packed, size_t cap, char *why, size_t whylen)
{
    packed[0] = '\0';
    if (json_is_string(v)) {
        const char *str = json_string_value(v);
        size_t len = json_string_length(v), words = 0;
        for (const char *p = str + strspn(str, " \t"); *p; p += strspn(p, " \t")) {
            words++;
            p += strcspn(p, " \t");
        }
        const char *got = memchr(str, '\0', len) ? "a string with a NUL byte"
                          : words == 0             ? "no word"
                          : words > CMDLINE_ARGS   ? "too many words"
                                                   : "too many bytes";
        if (memchr(str, '\0', len) || cmdline_from_string(str, packed, cap) != 0) {
            snprintf(why, whylen, "expected a command of 1..%d words and at most %zu bytes, got %s (%zu words, "
                     "%zu bytes)", CMDLINE_ARGS, cap - 2, got, words, len);
            packed[0] = '\0';
            return -EINVAL;
        }
        return 0;
    }
    if (!json_is_array(v)) {
        snprintf(why, whylen, "expected a command string or an array of strings, got %s", json_kind_name(v));
        return -EINVAL;
    }
    size_t n = json_array_size(v), used = 0;
    if (n == 0 || n > CMDLINE_ARGS) {
        snprintf(why, whylen, "expected an array of 1..%d strings, got %zu", CMDLINE_ARGS, n);
        return -EINVAL;
    }
    for (size_t i = 0; i < n; i++) {
        const json_t *a = json_array_get(v, i);
        if (!json_is_string(a)) {
            snprintf(why, whylen, "expected an array of strings, got %s at index %zu", json_kind_name(a), i);
            return -EINVAL;
        }
        const char *s = json_string_value(a);
        size_t len = json_string_length(a);
        if (memchr(s, '\0', len) || len == 0) {
            snprintf(why, whylen, "expected a non-empty string without NUL at index %zu", i);
            return -EINVAL;
        }
        if (pack_arg(packed, cap, &used, s, len) != 0) {
            snprintf(why, whylen, "expected at most %zu bytes of arguments, got more", cap - 2);
            packed[0] = '\0';
            return -EINVAL;
        }
    }
    return 0;
}

int cmdline_set(const char *packed)
{
    return packed[0] != '\0';
}

char **cmdline_argv(const char *packed)
{
    size_t n = 0;
    for (const char *p = packed; *p; p += strlen(p) + 1)
        n++;
    if (n == 0)
        return NULL;
    char **argv = calloc(n + 1, sizeof(char *));
    if (!argv)
        return NULL;
    size_t i = 0;
    for (const char *p = packed; *p; p += strlen(p) + 1) {
        if (!(argv[i++] = strdup(p))) {
            cmdline_free(argv);
            return NULL;
        }
    }
    return argv;
}

void cmdline_free(char **argv)
{
    if (!argv)
        return;
    for (size_t i = 0; argv[i]; i++)
        free(argv[i]);
    free(argv);
}

void cmdline_describe(const char *packed, char *out, size_t cap)
{
    size_t used = 0;
    out[0] = '\0';
    for (const char *p = packed; *p && used < cap; p += strlen(p) + 1) {
        int quote = p[strcspn(p, " \t")] != '\0';
        used += (size_t)snprintf(out + used, cap - used, "%s%s%s%s", used ? " " : "", quote ? "'" : "", p,
                                 quote ? "'" : "");
    }
}
