/*
 * conf: the service configuration files (musterd.json, worker.json). Each
 * program describes its file as one table of string keys: name, where the
 * value goes, a check, what the check expects (for messages), the default
 * and a comment. conf_load() reads a file against such a table; unknown
 * keys, non-strings and values the check refuses stop start-up with
 * "file: key: expected ..., got ...". docs/config.md documents both tables.
 *
 * Every value is a string, except a CONF_CMD's, which may also be an array
 * of strings (a command's arguments). CONF_PATH values that are relative are taken
 * relative to the directory of the file that names them, so that a config
 * directory can be moved as a whole.
 */
#ifndef MUSTER_CONF_H
#define MUSTER_CONF_H

#include <stddef.h>

#include <jansson.h>

enum conf_type {
    CONF_STRING, /* copied as is */
    CONF_PATH,   /* a file or directory; relative = relative to the config file */
    CONF_CMD,    /* a command: a string or an array of strings, packed (common/cmdline.h) */
};

struct conf_key {
    const char *name;
    enum conf_type type;
    size_t offset; /* into the caller's struct */
    size_t size;   /* buffer size there */
    /* NULL = any non-empty string; else 0 when the value is acceptable. */
    int (*valid)(const char *value);
    const char *expect; /* "HOST:PORT", "error, warn, info or debug", ... */
    const char *def;    /* default written into the struct by conf_defaults() */
    const char *doc;
};

/* Writes every key's default into base. */
void conf_defaults(const struct conf_key *keys, size_t nkeys, void *base);

/*
 * Reads path (a JSON object) and sets the keys it holds; keys it does not
 * hold keep their value. Returns 0, -ENOENT when the file does not exist
 * (err says so), or -EINVAL with the reason in err.
 */
int conf_load(const char *path, const struct conf_key *keys, size_t nkeys, void *base, char *err,
              size_t errlen);

/* Checks one value as conf_load would ("origin: key: expected ..."); 0 or -EINVAL. */
int conf_check(const struct conf_key *key, const char *origin, const char *value, char *err, size_t errlen);

const struct conf_key *conf_find(const struct conf_key *keys, size_t nkeys, const char *name);

/* The checks shared by both tables. */
/* common/hostport.h's HOST:PORT: to listen on (port 0..65535), to connect to (1..65535). */
int conf_valid_hostport(const char *s);
int conf_valid_hostport_connect(const char *s);
int conf_valid_log_level(const char *s); /* error, warn, info, debug */


#endif
