/*
 * proto/fastbeat: HEARTBEAT without a JSON tree, for the daemon's hot path
 * (4096 agents heartbeat once a second each; jansson's tree, its mallocs and
 * the generic field lookups were most of musterd's steady-state CPU).
 * Internal to proto/: proto_decode and proto_encode call it; nothing else
 * needs to.
 *
 * The wire does not change. The encoder writes the bytes the JSON encoder
 * writes (jansson, JSON_COMPACT: fields in table order, reals as "%.17g"
 * with ".0" added to integral values and the exponent's '+' and leading
 * zeros dropped). The decoder reads a subset of the valid payloads: compact
 * JSON (no whitespace) whose keys and enumerations are plain lowercase
 * ASCII and whose free text (`where`, `waiting`) holds no escape,
 * integers of at most 16 digits, every field of the right type in any
 * order, each key once; reals are read by proto_read_real (realnum.h), to
 * the double strtod gives, six times faster. It never answers an error:
 * anything outside that subset (whitespace, an escape, an unknown or
 * repeated key, a wrong type, a bound broken) is left to the JSON decoder,
 * which says exactly what is wrong. So for every payload it takes, the message is the one the JSON
 * decoder would give (tests/check_proto.c compares the two on valid,
 * mutated and random payloads).
 */
#ifndef MUSTER_PROTO_FASTBEAT_H
#define MUSTER_PROTO_FASTBEAT_H

#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

/* A HEARTBEAT payload (no header) into m (type set), checked by proto_check.
 * Writes the heartbeat's head and the rank entries it reads, each whole.
 * Returns 0 when it was read, 1 when it is left to the JSON decoder (what it
 * wrote is zeroed again then: a heartbeat zeroed before is zeroed after). */
int fastbeat_decode(const uint8_t *p, size_t n, struct proto_msg *m);

/* h (already proto_check'ed) as its payload into out. Returns the length,
 * or PROTO_E_NOSPACE when cap is too small. */
int fastbeat_encode(const struct proto_heartbeat *h, uint8_t *out, size_t cap);

/* The JSON codec alone, for any type (codec.c): the reference the tests
 * hold the fast path to. The decoder takes a payload (m->type set) and
 * answers as proto_decode; the encoder takes a checked message and answers
 * the payload's length (the length it needs when out is NULL) or an error. */
int proto_decode_payload_json(const uint8_t *p, size_t n, struct proto_msg *m);
int proto_encode_payload_json(const struct proto_msg *m, uint8_t *out, size_t cap);

#endif
