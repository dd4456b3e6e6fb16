/*
 * proto/auth.c: the join handshake's cryptography (PROTOCOL.md "Join").
 * Each side sends a fresh random nonce; each proves it knows the cluster
 * token by an HMAC-SHA256 of both nonces, the HELLO, the node, the session
 * and its own side's label, so that a proof is good for one direction of
 * one connection only. The token itself never crosses the wire, and proofs
 * are compared in constant time. HMAC, SHA-256, HKDF and the random bytes
 * are OpenSSL's.
 */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/rand.h>

#include "proto/auth_bind.h"
#include "proto/proto.h"

int proto_nonce(uint8_t nonce[PROTO_NONCE_LEN])
{
    return RAND_bytes(nonce, PROTO_NONCE_LEN) == 1 ? PROTO_OK : PROTO_E_CRYPTO;
}

/* OpenSSL 3 looks an algorithm up in its providers on every fetch (HMAC()
 * and EVP_Q_mac fetch each call: ~15 us, most of a handshake): HMAC and
 * HKDF are fetched once per process. */
static pthread_once_t fetched = PTHREAD_ONCE_INIT;
static EVP_MAC *hmac_alg;
static EVP_KDF *hkdf_alg;

static void fetch_algorithms(void)
{
    hmac_alg = EVP_MAC_fetch(NULL, "HMAC", NULL);
    hkdf_alg = EVP_KDF_fetch(NULL, "HKDF", NULL);
}

EVP_MAC *proto__hmac_alg(void)
{
    pthread_once(&fetched, fetch_algorithms);
    return hmac_alg;
}

int proto_hmac_raw(const uint8_t *key, size_t key_len, const uint8_t *data,
                   size_t data_len, uint8_t out[PROTO_HMAC_LEN])
{
    /* OpenSSL reads a NULL key as "reuse the previous one"; give it bytes. */
    static const uint8_t empty[1];
    EVP_MAC *alg = proto__hmac_alg();
    EVP_MAC_CTX *ctx = alg ? EVP_MAC_CTX_new(alg) : NULL;
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    size_t out_len = 0;
    int ok = ctx && EVP_MAC_init(ctx, key_len ? key : empty, key_len, params) == 1 &&
             EVP_MAC_update(ctx, data_len ? data : empty, data_len) == 1 &&
             EVP_MAC_final(ctx, out, &out_len, PROTO_HMAC_LEN) == 1 && out_len == PROTO_HMAC_LEN;
    EVP_MAC_CTX_free(ctx);
    return ok ? PROTO_OK : PROTO_E_CRYPTO;
}

int proto_hkdf(const uint8_t *ikm, size_t ikm_len, const uint8_t *salt, size_t salt_len,
               const uint8_t *info, size_t info_len, uint8_t *out, size_t out_len)
{
    static uint8_t empty[1];
    pthread_once(&fetched, fetch_algorithms);
    EVP_KDF_CTX *k = hkdf_alg ? EVP_KDF_CTX_new(hkdf_alg) : NULL;
    int ok;

    if (out_len == 0 || out_len > 255 * PROTO_HMAC_LEN) {
        EVP_KDF_CTX_free(k);
        return PROTO_E_RANGE;
    }
    /* OSSL_PARAM takes non-const pointers; HKDF only reads them. */
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, ikm_len ? (void *)ikm : empty, ikm_len),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, salt_len ? (void *)salt : empty, salt_len),
        OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, info_len ? (void *)info : empty, info_len),
        OSSL_PARAM_construct_end(),
    };
    ok = k && EVP_KDF_derive(k, out, out_len, params) == 1;
    EVP_KDF_CTX_free(k);
    return ok ? PROTO_OK : PROTO_E_CRYPTO;
}

int proto_bind_hello(struct proto_bind *b, const uint8_t *frame, size_t len, const struct proto_hello *h)
{
    unsigned int n = 0;

    memset(b, 0, sizeof(*b));
    memcpy(b->agent_nonce, h->nonce, PROTO_NONCE_LEN);
    snprintf(b->node, sizeof(b->node), "%s", h->node);
    b->session = h->session;
    return EVP_Digest(frame, len, b->hello_digest, &n, EVP_sha256(), NULL) == 1 && n == PROTO_HMAC_LEN
               ? PROTO_OK
               : PROTO_E_CRYPTO;
}

size_t proto__bind_bytes(const struct proto_bind *b, const char *label, uint8_t out[PROTO__BIND_MAX])
{
    size_t label_len = strlen(label) + 1; /* the NUL ends the label */
    size_t node_len = strnlen(b->node, PROTO_NAME_MAX - 1);
    uint8_t *p = out;

    memcpy(p, label, label_len);
    p += label_len;
    memcpy(p, b->agent_nonce, PROTO_NONCE_LEN);
    p += PROTO_NONCE_LEN;
    memcpy(p, b->daemon_nonce, PROTO_NONCE_LEN);
    p += PROTO_NONCE_LEN;
    memcpy(p, b->hello_digest, PROTO_HMAC_LEN);
    p += PROTO_HMAC_LEN;
    for (int i = 7; i >= 0; i--)
        *p++ = (uint8_t)(b->session >> (8 * i));
    *p++ = (uint8_t)node_len;
    memcpy(p, b->node, node_len);
    p += node_len;
    return (size_t)(p - out);
}

static const char *proof_label(enum proto_side side)
{
    return side == PROTO_SIDE_DAEMON ? "muster/2 daemon proof" : "muster/2 agent proof";
}

int proto_proof(const uint8_t *token, size_t token_len, const struct proto_bind *b, enum proto_side side,
                uint8_t out[PROTO_HMAC_LEN])
{
    uint8_t data[PROTO__BIND_MAX];

    if (token_len == 0)
        return PROTO_E_RANGE;
    size_t n = proto__bind_bytes(b, proof_label(side), data);
    return proto_hmac_raw(token, token_len, data, n, out);
}

int proto_proof_verify(const uint8_t *token, size_t token_len, const struct proto_bind *b,
                       enum proto_side side, const uint8_t mac[PROTO_HMAC_LEN])
{
    uint8_t expected[PROTO_HMAC_LEN];
    int ok = proto_proof(token, token_len, b, side, expected) == PROTO_OK &&
             CRYPTO_memcmp(expected, mac, PROTO_HMAC_LEN) == 0;

    OPENSSL_cleanse(expected, sizeof(expected));
    return ok;
}
