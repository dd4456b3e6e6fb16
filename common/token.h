/*
 * token: reading the cluster and admin token files. One reader for musterd
 * and muster-worker: the file must be a regular file that only its owner can
 * read or write (group and other bits clear, as `musterctl token new` makes
 * it), at most TOKEN_MAX bytes, not empty; trailing newlines are stripped.
 */
#ifndef MUSTER_TOKEN_H
#define MUSTER_TOKEN_H

#include <stddef.h>
#include <stdint.h>

#define TOKEN_MAX 4096

/*
 * Reads path into buf (cap bytes) and sets *len. Returns 0, or a negative
 * errno with the reason in err, which names the file:
 *   -EPERM   group/other may read or write it ("... mode 0644 ...; chmod 600 FILE")
 *   -EFBIG   larger than cap
 *   -ENODATA empty
 *   other    from open/fstat/read, or -EINVAL when not a regular file
 */
int token_read(const char *path, uint8_t *buf, size_t cap, size_t *len, char *err, size_t errlen);

/*
 * A credential file that is not a token (the etcd client's private key,
 * which an etcd client group may share): 0 when only its owner may read
 * it; 1 when its group may (err holds a warning with the chmod); -EPERM
 * when anyone may, or anyone but its owner may write it; -errno when it
 * cannot be examined. err names the file.
 */
int token_check_private(const char *path, char *err, size_t errlen);

/* "$CONFIGURATION_DIRECTORY/token", or "/etc/muster/token" outside systemd. */
void token_default_path(char *out, size_t cap);

#endif
