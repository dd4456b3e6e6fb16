/*
 * cmdline: a rank command as users write it, in a job spec, worker.json or
 * on the command line: a string split on spaces and tabs (no shell, no
 * quoting), or a JSON array of strings (one argument each, for arguments
 * with spaces). Either form is kept packed in a fixed buffer: the arguments
 * one after another, each ending in NUL, and an empty string after the
 * last; an unset command is one empty string.
 */
#ifndef MUSTER_CMDLINE_H
#define MUSTER_CMDLINE_H

#include <stddef.h>

#include <jansson.h>

#define CMDLINE_MAX 4096 /* packed bytes */
#define CMDLINE_ARGS 256 /* arguments */

/*
 * Packs v (a string, or an array of 1..CMDLINE_ARGS strings whose first is
 * not empty) into packed[cap]. Returns 0, or -EINVAL with what was expected
 * in why ("a command string or an array of strings, got ...").
 */
int cmdline_from_json(const json_t *v, char *packed, size_t cap, char *why, size_t whylen);

/* Packs a whitespace-split string; -EINVAL when it has no word or is too long. */
int cmdline_from_string(const char *s, char *packed, size_t cap);

/* Packs argv[0..argc); -EINVAL when empty, too many or too long. */
int cmdline_from_argv(int argc, char *const *argv, char *packed, size_t cap);

/* 1 when packed holds a command. */
int cmdline_set(const char *packed);

/* A malloc'd NULL-terminated copy of the arguments (free with cmdline_free);
 * NULL when unset or out of memory. */
char **cmdline_argv(const char *packed);
/* Frees a NULL-terminated vector of malloc'd strings (NULL is fine). */
void cmdline_free(char **argv);

/* The command as one line for messages, arguments with spaces quoted. */
void cmdline_describe(const char *packed, char *out, size_t cap);

#endif
