#include "common/conf.h"
#include "common/cmdline.h"
#include "common/jsonkind.h"
#include "common/hostport.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

void conf_defaults(const struct conf_key *keys, size_t nkeys, void *base)
{
    for (size_t i = 0; i < nkeys; i++)
        snprintf((char *)base + keys[i].offset, keys[i].size, "%s", keys[i].def);
}

const struct conf_key *conf_find(const struct conf_key *keys, size_t nkeys, const char *name)
{
    for (size_t i = 0; i < nkeys; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

int conf_check(const struct conf_key *k, const char *origin, const char *value, char *err, size_t errlen)
{
    if (value[0] == '\0' || strlen(value) >= k->size || (k->valid && k->valid(value) != 0)) {
        snprintf(err, errlen, "%s: %s: expected %s, got \"%.200s\"", origin, k->name, k->expect, value);
        return -EINVAL;
    }
    return 0;
}

/* dir of path + "/" + rel into out; rel as is when absolute or dir is ".". */
static int resolve(const char *path, const char *rel, char *out, size_t cap)
{
    const char *slash = strrchr(path, '/');
    int n;
    if (rel[0] == '/' || !slash)
        n = snprintf(out, cap, "%s", rel);
    else
        n = snprintf(out, cap, "%.*s/%s", (int)(slash - path), path, rel);
    return n < 0 || (size_t)n >= cap ? -ENAMETOOLONG : 0;
}

int conf_load(const char *path, const struct conf_key *keys, size_t nkeys, void *base, char *err,
              size_t errlen)
{
    json_error_t jerr;
    json_t *obj = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    const char *name;
    json_t *v;
    int rc = 0;

    if (!obj) {
        FILE *f = fopen(path, "r");
        if (!f) {
            int e = errno;
            snprintf(err, errlen, "%s: cannot read the configuration file: %s", path, strerror(e));
            return e == ENOENT ? -ENOENT : -EINVAL;
        }
        fclose(f);
        snprintf(err, errlen, "%s:%d:%d: not valid JSON: %s", path, jerr.line, jerr.column, jerr.text);
        return -EINVAL;
    }
    if (!json_is_object(obj)) {
        snprintf(err, errlen, "%s: expected a JSON object at the top level, got %s", path, json_kind_name(obj));
        json_decref(obj);
        return -EINVAL;
    }
    json_object_foreach(obj, name, v) {
        const struct conf_key *k = conf_find(keys, nkeys, name);
        char value[PATH_MAX];
        if (!k) {
            snprintf(err, errlen, "%s: %s: unknown key (see docs/config.md for the keys)", path, name);
            rc = -EINVAL;
            break;
        }
        if (k->type == CONF_CMD) {
            char why[200];
            rc = cmdline_from_json(v, (char *)base + k->offset, k->size, why, sizeof(why));
            if (rc) {
                snprintf(err, errlen, "%s: %s: %s", path, name, why);
                break;
            }
            continue;
        }
        if (!json_is_string(v)) {
            snprintf(err, errlen, "%s: %s: expected %s as a string, got %s", path, name, k->expect, json_kind_name(v));
            rc = -EINVAL;
            break;
        }
        const char *s = json_string_value(v);
        if (memchr(s, '\0', json_string_length(v))) {
            snprintf(err, errlen, "%s: %s: expected %s, got a string with a NUL byte", path, name, k->expect);
            rc = -EINVAL;
            break;
        }
        if (k->type == CONF_PATH && s[0] && resolve(path, s, value, sizeof(value)) != 0) {
            snprintf(err, errlen, "%s: %s: expected %s, got a path that is too long", path, name, k->expect);
            rc = -EINVAL;
            break;
        }
        if (k->type != CONF_PATH || !s[0])
            snprintf(value, sizeof(value), "%s", s);
        rc = conf_check(k, path, value, err, errlen);
        if (rc)
            break;
        memcpy((char *)base + k->offset, value, strlen(value) + 1);
    }
    json_decref(obj);
    return rc;
}

int conf_valid_hostport(const char *s)
{
    char host[HOSTPORT_HOST_MAX], err[320];
    uint16_t port;
    return hostport_parse_flags(s, HOSTPORT_PORT_ZERO, host, &port, err, sizeof(err));
}

int conf_valid_hostport_connect(const char *s)
{
    char host[HOSTPORT_HOST_MAX], err[320];
    uint16_t port;
    return hostport_parse(s, host, &port, err, sizeof(err));
}

int conf_valid_log_level(const char *s)
{
    static const char *const levels[] = {"error", "warn", "info", "debug"};
    for (size_t i = 0; i < sizeof(levels) / sizeof(levels[0]); i++)
        if (strcmp(s, levels[i]) == 0)
            return 0;
    return -EINVAL;
}
