/*
 * hostport: the one HOST:PORT grammar of muster's addresses (musterd's
 * --listen, --http and --advertise and their musterd.json keys, the agent's
 * --daemon list, a standby's "ADDR leads", NCCL_RAS_ADDR):
 *
 *   address = host ":" port
 *   host    = "[" IPv6 "]" | name-or-IPv4   (1..HOSTPORT_HOST_MAX-1 bytes, no ':')
 *   port    = decimal digits only, 1..65535 (0 too for a listener: any free port)
 *
 * An IPv6 address goes in brackets: "::1:80" is refused, since its last
 * colon may as well be the address's own. The host comes back without the
 * brackets. Names are not resolved here.
 */
#ifndef MUSTER_COMMON_HOSTPORT_H
#define MUSTER_COMMON_HOSTPORT_H

#include <stddef.h>
#include <stdint.h>

#define HOSTPORT_HOST_MAX 256

/* hostport_parse_flags' flags. */
#define HOSTPORT_PORT_ZERO 1u /* port 0 is allowed (an address to listen on: the system picks) */

/*
 * s -> host and *port. Returns 0, or -EINVAL with err saying which part was
 * wrong and quoting it ("expected HOST:PORT, got 'x' (no port)", "port must
 * be 1..65535, got '0'"); the caller adds what s was (a flag, a key).
 */
int hostport_parse_flags(const char *s, unsigned flags, char host[HOSTPORT_HOST_MAX], uint16_t *port, char *err,
                         size_t errlen);

/* hostport_parse_flags without flags: an address to connect to, port 1..65535. */
int hostport_parse(const char *s, char host[HOSTPORT_HOST_MAX], uint16_t *port, char *err, size_t errlen);

#endif
