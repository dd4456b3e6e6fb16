/*
 * notify: the systemd service notification protocol, spoken directly: one
 * datagram per message to the AF_UNIX socket named by $NOTIFY_SOCKET (a
 * leading '@' means the abstract namespace). Implemented here rather than
 * through libsystemd so that the daemon and agent need no extra library on
 * nodes and the behaviour is testable with a socket of the test's own; the
 * protocol is a few lines of stable, documented wire format (sd_notify(3)).
 */
#ifndef MUSTER_NOTIFY_H
#define MUSTER_NOTIFY_H

#include <stdint.h>

/* Sends text (e.g. "READY=1\nSTATUS=running"). 0 when sent or when there is
 * no $NOTIFY_SOCKET (not under systemd); a negative errno otherwise. */
int notify_send(const char *text);

/* printf-style convenience. */
int notify_sendf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The watchdog period in microseconds from $WATCHDOG_USEC (honouring
 * $WATCHDOG_PID), or 0 when systemd expects no keep-alive. */
uint64_t notify_watchdog_usec(void);

#endif
