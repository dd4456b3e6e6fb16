/*
 * proto/channel.c: the authenticated channel between the daemon and an
 * agent after the handshake (PROTOCOL.md "Sealed frames"). Each direction
 * has its own key, derived from the cluster token and the handshake's
 * binding by HKDF-SHA256, and its own frame counter; every frame carries
 * HMAC-SHA256(key, counter || header || payload) after its payload. The
 * counter is never sent: a receiver that misses, gains or reorders a frame
 * computes another MAC, and the stream ends there.
 *
 * Each direction keeps one keyed EVP_MAC context: re-initialising it with
 * no key reuses the key's inner and outer pads, so a frame costs its SHA-256
 * blocks and no key schedule.
 */
#include <stdlib.h>
#include <string.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/params.h>

#include "proto/auth_bind.h"
#include "proto/internal.h"
#include "proto/proto.h"

struct proto_channel {
    EVP_MAC_CTX *tx, *rx; /* HMAC-SHA256 under this side's key, and under the peer's */
    uint64_t tx_seq, rx_seq; /* frames sealed, frames opened */
};

static EVP_MAC_CTX *keyed_hmac(EVP_MAC *mac, const uint8_t key[PROTO_HMAC_LEN])
{
    EVP_MAC_CTX *ctx = EVP_MAC_CTX_new(mac);
    OSSL_PARAM params[] = {
        OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
        OSSL_PARAM_construct_end(),
    };
    if (ctx && EVP_MAC_init(ctx, key, PROTO_HMAC_LEN, params) == 1)
        return ctx;
    EVP_MAC_CTX_free(ctx);
    return NULL;
}

struct proto_channel *proto_channel_new(const uint8_t *token, size_t token_len, const struct proto_bind *b,
                                        enum proto_side side)
{
    uint8_t info[PROTO__BIND_MAX], salt[2 * PROTO_NONCE_LEN], keys[2 * PROTO_HMAC_LEN];
    struct proto_channel *ch;
    EVP_MAC *mac;

    if (token_len == 0)
        return NULL;
    memcpy(salt, b->agent_nonce, PROTO_NONCE_LEN);
    memcpy(salt + PROTO_NONCE_LEN, b->daemon_nonce, PROTO_NONCE_LEN);
    size_t n = proto__bind_bytes(b, "muster/2 channel keys", info);
    /* keys[0..32): the agent's frames; keys[32..64): the daemon's. */
    if (proto_hkdf(token, token_len, salt, sizeof(salt), info, n, keys, sizeof(keys)) != PROTO_OK)
        return NULL;
    ch = calloc(1, sizeof(*ch));
    mac = proto__hmac_alg();
    if (ch && mac) {
        const uint8_t *mine = side == PROTO_SIDE_AGENT ? keys : keys + PROTO_HMAC_LEN;
        const uint8_t *theirs = side == PROTO_SIDE_AGENT ? keys + PROTO_HMAC_LEN : keys;
        ch->tx = keyed_hmac(mac, mine);
        ch->rx = keyed_hmac(mac, theirs);
    }
    OPENSSL_cleanse(keys, sizeof(keys));
    if (ch && (!ch->tx || !ch->rx)) {
        proto_channel_free(ch);
        return NULL;
    }
    return ch;
}

void proto_channel_free(struct proto_channel *ch)
{
    if (!ch)
        return;
    EVP_MAC_CTX_free(ch->tx);
    EVP_MAC_CTX_free(ch->rx);
    free(ch);
}

/* HMAC(key of ctx, seq || bytes[0..len)) into out. */
static int frame_mac(EVP_MAC_CTX *ctx, uint64_t seq, const uint8_t *bytes, size_t len, uint8_t out[PROTO_MAC_LEN])
{
    uint8_t s[8];
    size_t out_len = 0;

    for (int i = 0; i < 8; i++)
        s[i] = (uint8_t)(seq >> (56 - 8 * i));
    if (EVP_MAC_init(ctx, NULL, 0, NULL) != 1 || EVP_MAC_update(ctx, s, sizeof(s)) != 1 ||
        EVP_MAC_update(ctx, bytes, len) != 1 || EVP_MAC_final(ctx, out, &out_len, PROTO_MAC_LEN) != 1 ||
        out_len != PROTO_MAC_LEN)
        return PROTO_E_CRYPTO;
    return PROTO_OK;
}

int proto_seal(struct proto_channel *ch, uint8_t *frame, size_t len, size_t cap)
{
    if (len < PROTO_HEADER_LEN || len > PROTO_MAX_FRAME)
        return PROTO_E_RANGE;
    uint32_t plen = (uint32_t)frame[0] << 24 | (uint32_t)frame[1] << 16 | (uint32_t)frame[2] << 8 | frame[3];
    if (plen != len - PROTO_HEADER_LEN)
        return PROTO_E_RANGE;
    if (cap < len + PROTO_MAC_LEN)
        return PROTO_E_NOSPACE;
    plen += PROTO_MAC_LEN;
    frame[0] = (uint8_t)(plen >> 24);
    frame[1] = (uint8_t)(plen >> 16);
    frame[2] = (uint8_t)(plen >> 8);
    frame[3] = (uint8_t)plen;
    int rc = frame_mac(ch->tx, ch->tx_seq, frame, len, frame + len);
    if (rc != PROTO_OK)
        return rc;
    ch->tx_seq++;
    return (int)(len + PROTO_MAC_LEN);
}

int proto_open(struct proto_channel *ch, const uint8_t *buf, size_t len, struct proto_msg *msg,
               size_t *consumed)
{
    uint8_t mac[PROTO_MAC_LEN];
    uint32_t slen;
    uint16_t type;

    msg->type = (enum proto_type)0;
    if (consumed)
        *consumed = 0;
    int rc = proto__header(buf, len, PROTO_MAX_PAYLOAD + PROTO_MAC_LEN, &slen, &type);
    if (rc == PROTO_NEED_MORE)
        return rc;
    if (rc == PROTO_OK && slen < PROTO_MAC_LEN)
        rc = PROTO_E_MAC; /* no room for its MAC: not a sealed frame */
    if (rc < 0) {
        memset(msg, 0, sizeof(*msg));
        return rc;
    }
    if (len - PROTO_HEADER_LEN < slen)
        return PROTO_NEED_MORE;
    size_t flen = PROTO_HEADER_LEN + slen - PROTO_MAC_LEN; /* header and payload */
    rc = frame_mac(ch->rx, ch->rx_seq, buf, flen, mac);
#ifdef MUSTER_MUTANT_NO_FRAME_MAC
    /* A broken channel for `make check-mutants` only (tests/mutants.sh): a frame's MAC is not checked. */
    memcpy(mac, buf + flen, PROTO_MAC_LEN);
#endif
    if (rc == PROTO_OK && CRYPTO_memcmp(mac, buf + flen, PROTO_MAC_LEN) != 0)
        rc = PROTO_E_MAC;
    if (rc < 0) {
        memset(msg, 0, sizeof(*msg));
        return rc;
    }
    ch->rx_seq++;
    rc = proto__decode_body(type, buf + PROTO_HEADER_LEN, flen - PROTO_HEADER_LEN, msg);
    if (rc == PROTO_E_NOMEM)
        return rc;
    if (consumed)
        *consumed = PROTO_HEADER_LEN + (size_t)slen;
    return rc;
}
