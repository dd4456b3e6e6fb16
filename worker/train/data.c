#include "worker/train/data.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "worker/train/rng.h"

static int read_file(const char *path, uint8_t **buf, size_t *len, char *err, size_t errlen)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, strerror(e));
        return -e;
    }
    struct stat st;
    if (fstat(fileno(f), &st) != 0 || !S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "%s: not a regular file", path);
        fclose(f);
        return -EINVAL;
    }
    *len = (size_t)st.st_size;
    *buf = malloc(*len ? *len : 1);
    if (!*buf) {
        fclose(f);
        return -ENOMEM;
    }
    if (fread(*buf, 1, *len, f) != *len) {
        snprintf(err, errlen, "%s: read error", path);
        free(*buf);
        fclose(f);
        return -EIO;
    }
    fclose(f);
    return 0;
}

static int parse_tokens(struct dataset *d, const uint8_t *buf, size_t len, const char *path,
                        char *err, size_t errlen)
{
    int32_t h[DATA_HEADER_INTS];
    const size_t hbytes = sizeof(h);
    if (len < hbytes) {
        snprintf(err, errlen, "%s: truncated token file: %zu bytes, less than the %zu-byte header",
                 path, len, hbytes);
        return -EINVAL;
    }
    memcpy(h, buf, hbytes);
    if (h[1] != DATA_VERSION) {
        snprintf(err, errlen, "%s: token file version %d, expected %d", path, h[1], DATA_VERSION);
        return -EINVAL;
    }
    if (h[2] < 0) {
        snprintf(err, errlen, "%s: token file header gives a negative token count (%d)", path,
                 h[2]);
        return -EINVAL;
    }
    size_t count = (size_t)h[2], have = (len - hbytes) / 2;
    if (have < count || (len - hbytes) % 2) {
        snprintf(err, errlen, "%s: truncated token file: header says %zu tokens, file holds %zu",
                 path, count, have);
        return -EINVAL;
    }
    if (have > count) {
        snprintf(err, errlen, "%s: token file holds %zu tokens but its header says %zu", path,
                 have, count);
        return -EINVAL;
    }
    d->format = DATA_TOKENS;
    d->ntokens = count;
    d->tokens = malloc(sizeof(uint16_t) * (count ? count : 1));
    if (!d->tokens)
        return -ENOMEM;
    memcpy(d->tokens, buf + hbytes, sizeof(uint16_t) * count);
    return 0;
}

int dataset_open(struct dataset *d, const char *path, int vocab, double val_fraction,
                 int seq_len, char *err, size_t errlen)
{
    uint8_t *buf = NULL;
    size_t len = 0;
    memset(d, 0, sizeof(*d));
    int rc = read_file(path, &buf, &len, err, errlen);
    if (rc)
        return rc;
    int32_t first = 0;
    if (len >= 4)
        memcpy(&first, buf, 4);
    if (first == DATA_MAGIC) {
        rc = parse_tokens(d, buf, len, path, err, errlen);
    } else if (memchr(buf, 0, len < 4096 ? len : 4096)) {
        /* binary, but not ours: say what the header held */
        int32_t h[3] = {0, 0, 0};
        memcpy(h, buf, len < sizeof(h) ? len : sizeof(h));
        snprintf(err, errlen,
                 "%s: neither text nor an llm.c token file: header holds magic %d, version %d, "
                 "count %d (expected magic %d, version %d)",
                 path, h[0], h[1], h[2], DATA_MAGIC, DATA_VERSION);
        rc = -EINVAL;
    } else {
        d->format = DATA_TEXT;
        d->ntokens = len;
        d->tokens = malloc(sizeof(uint16_t) * (len ? len : 1));
        if (!d->tokens)
            rc = -ENOMEM;
        for (size_t i = 0; !rc && i < len; i++)
            d->tokens[i] = buf[i];
    }
    free(buf);
    if (rc) {
        dataset_close(d);
        return rc;
    }
    for (size_t i = 0; i < d->ntokens; i++)
        if (d->tokens[i] > d->max_token)
            d->max_token = d->tokens[i];
    if (d->max_token >= vocab) {
        snprintf(err, errlen, "%s: token %d is outside the model's vocabulary of %d", path,
                 d->max_token, vocab);
        dataset_close(d);
        return -EINVAL;
    }
    size_t nval = (size_t)((double)d->ntokens * val_fraction);
    d->ntrain = d->ntokens - nval;
    size_t need = (size_t)seq_len + 2;
    if (d->ntrain < need || (val_fraction > 0 && nval < need)) {
        snprintf(err, errlen,
                 "%s: %zu tokens are too few: each split needs more than %d (seq_len + 1) "
                 "(train %zu, validation %zu)",
                 path, d->ntokens, seq_len + 1, d->ntrain, nval);
        dataset_close(d);
        return -EINVAL;
    }
    return 0;
}

void dataset_close(struct dataset *d)
{
    free(d->tokens);
    memset(d, 0, sizeof(*d));
}

/* Copies T+1 tokens starting at start into one row of inputs and targets. */
static void fill_row(const struct dataset *d, int *inp, int *tgt, size_t start, int T)
{
    for (int t = 0; t < T; t++) {
        inp[t] = d->tokens[start + t];
        tgt[t] = d->tokens[start + t + 1];
    }
}

void dataset_train_batch(const struct dataset *d, int *inputs, int *targets, int B, int T,
                         uint64_t seed, long step, int micro_step, int rank, int world)
{
    size_t span = d->ntrain - (size_t)T; /* starts 0..span-1 keep T+1 tokens inside */
    for (int j = 0; j < B; j++) {
        uint64_t g = ((uint64_t)micro_step * world + rank) * (uint64_t)B + j;
        size_t start = rng_hash(seed, 0x54524149, (uint64_t)step, g, 0) % span;
        fill_row(d, inputs + (size_t)j * T, targets + (size_t)j * T, start, T);
    }
}

void dataset_val_batch(const struct dataset *d, int *inputs, int *targets, int B, int T,
                       uint64_t seed, long first)
{
    size_t nval = d->ntokens - d->ntrain;
    size_t span = nval - (size_t)T;
    for (int j = 0; j < B; j++) {
        size_t start = d->ntrain + rng_hash(seed, 0x56414c, (uint64_t)(first + j), 0, 0) % span;
        fill_row(d, inputs + (size_t)j * T, targets + (size_t)j * T, start, T);
    }
}
