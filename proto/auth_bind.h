/*
 * proto/auth_bind.h: the bytes of a handshake's binding (struct
 * proto_bind), shared by the proofs (auth.c) and the channel's key
 * derivation (channel.c), and the HMAC algorithm both use. Internal to
 * proto/.
 */
#ifndef MUSTER_PROTO_AUTH_BIND_H
#define MUSTER_PROTO_AUTH_BIND_H

#include <stddef.h>
#include <stdint.h>

#include <openssl/evp.h>

#include "proto/proto.h"

/* A label of at most 31 bytes, its NUL, the nonces, the digest, the
 * session, the node's length and the node. */
#define PROTO__BIND_MAX (32 + 2 * PROTO_NONCE_LEN + PROTO_HMAC_LEN + 8 + 1 + PROTO_NAME_MAX)

/* label NUL || agent nonce || daemon nonce || HELLO digest || session (u64
 * big-endian) || node length (u8) || node: the length written. */
size_t proto__bind_bytes(const struct proto_bind *b, const char *label, uint8_t out[PROTO__BIND_MAX]);

/* OpenSSL's HMAC, fetched once per process (NULL: the library failed). */
EVP_MAC *proto__hmac_alg(void);

#endif
