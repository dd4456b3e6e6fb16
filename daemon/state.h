/*
 * state: the daemon's state file, <state dir>/musterd.state.json, holding
 * what musterd must not forget across restarts (struct rdv_saved: job name,
 * state, generation, restarts, membership). Written as temp file, fsync,
 * rename, fsync of the directory, so a crash leaves the old or the new file,
 * never a torn one.
 */
#ifndef MUSTER_STATE_H
#define MUSTER_STATE_H

#include <stddef.h>

#include "daemon/rdv.h"

#define STATE_FILE_NAME "musterd.state.json"

/* Returns 0 or a negative errno; err says what failed and where. */
int state_write(const char *dir, const struct rdv_saved *s, char *err, size_t errlen);

/*
 * Returns 0 (loaded), -ENOENT (no state file: a fresh start) or another
 * negative errno with err naming the file and what was wrong in it.
 */
int state_read(const char *dir, struct rdv_saved *s, char *err, size_t errlen);

/* The state file's JSON text (malloc'd; NULL = out of memory): what a
 * store other than the file (daemon/store_etcd.h) keeps. */
char *state_to_text(const struct rdv_saved *s);
/* Reads that text; origin names where it came from in err. */
int state_from_text(const char *text, const char *origin, struct rdv_saved *s, char *err, size_t errlen);

#endif
