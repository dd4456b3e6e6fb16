/*
 * proto/auth.c: the join handshake's cryptography. The daemon sends a random
 * nonce; the agent proves it knows the cluster token by answering
 * HMAC-SHA256(token, nonce). The token itself never crosses the wire, and
 * the daemon compares answers in constant time.
 */
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>

#include "proto/proto.h"

int proto_nonce(uint8_t nonce[PROTO_NONCE_LEN])
{
    return RAND_bytes(nonce, PROTO_NONCE_LEN) == 1 ? PROTO_OK : PROTO_E_CRYPTO;
}

int proto_hmac_raw(const uint8_t *key, size_t key_len, const uint8_t *data,
                   size_t data_len, uint8_t out[PROTO_HMAC_LEN])
{
    /* OpenSSL reads a NULL key as "reuse the previous one"; give it bytes. */
    static const uint8_t empty[1];
    unsigned int out_len = 0;

    if (key_len > INT32_MAX)
        return PROTO_E_CRYPTO;
    if (HMAC(EVP_sha256(), key_len ? key : empty, (int)key_len,
             data_len ? data : empty, data_len, out, &out_len) == NULL ||
        out_len != PROTO_HMAC_LEN)
        return PROTO_E_CRYPTO;
    return PROTO_OK;
}

int proto_hmac(const uint8_t *token, size_t token_len,
               const uint8_t nonce[PROTO_NONCE_LEN],
               uint8_t out[PROTO_HMAC_LEN])
{
    if (token_len == 0)
        return PROTO_E_RANGE;
    return proto_hmac_raw(token, token_len, nonce, PROTO_NONCE_LEN, out);
}

int proto_hmac_verify(const uint8_t *token, size_t token_len,
                      const uint8_t nonce[PROTO_NONCE_LEN],
                      const uint8_t hmac[PROTO_HMAC_LEN])
{
    uint8_t expected[PROTO_HMAC_LEN];
    int ok = proto_hmac(token, token_len, nonce, expected) == PROTO_OK &&
             CRYPTO_memcmp(expected, hmac, PROTO_HMAC_LEN) == 0;

    OPENSSL_cleanse(expected, sizeof(expected));
    return ok;
}
