/*
 * proto/internal.h: what the codec shares with the channel (channel.c), so
 * that a sealed frame is read by the same header and payload rules as a
 * plain one. Internal to proto/.
 */
#ifndef MUSTER_PROTO_INTERNAL_H
#define MUSTER_PROTO_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

/* The header at buf (len bytes): PROTO_NEED_MORE below 8 bytes, else the
 * payload length and type with PROTO_OK, or the header's error (a length
 * above max, another version, an unknown type). */
int proto__header(const uint8_t *buf, size_t len, uint32_t max, uint32_t *plen, uint16_t *type);

/* The payload p[0..n) of a frame of the given type (checked) into msg, as
 * proto_decode fills it; on an error msg is left zeroed and owns nothing. */
int proto__decode_body(uint16_t type, const uint8_t *p, size_t n, struct proto_msg *msg);

#endif
