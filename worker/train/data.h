/*
 * data: the token stream a run trains on, and the batches drawn from it.
 *
 * Two formats are accepted:
 *   - an llm.c token file: int32 header[256] with header[0] = 20240520
 *     (magic), header[1] = 1 (version), header[2] = token count, then that
 *     many uint16 tokens;
 *   - raw text: any file without NUL bytes in its first 4 KiB, one token per
 *     byte (vocabulary 256).
 * Anything else is refused with a message saying what the header held.
 *
 * The last val_fraction of the tokens is the validation split. A training
 * micro-batch is a pure function of (seed, step, micro_step, rank, world):
 * sequence j of it is global sequence g = (micro_step*world + rank)*B + j of
 * the step, and starts at hash(seed, step, g) in the training split, so a
 * resumed run, or a run on another world size with the same global batch,
 * reads the same sequences.
 */
#ifndef MUSTER_TRAIN_DATA_H
#define MUSTER_TRAIN_DATA_H

#include <stddef.h>
#include <stdint.h>

#define DATA_MAGIC 20240520
#define DATA_VERSION 1
#define DATA_HEADER_INTS 256

enum data_format { DATA_TEXT, DATA_TOKENS };

struct dataset {
    enum data_format format;
    uint16_t *tokens;
    size_t ntokens;
    size_t ntrain; /* tokens [0, ntrain) train, [ntrain, ntokens) validation */
    int max_token; /* largest token id in the file */
};

/*
 * Reads path; splits off val_fraction; checks that every token is below
 * vocab and that each split holds more than seq_len + 1 tokens. Returns 0,
 * or -errno / -EINVAL with a message in err naming the file and the problem.
 */
int dataset_open(struct dataset *d, const char *path, int vocab, double val_fraction,
                 int seq_len, char *err, size_t errlen);
void dataset_close(struct dataset *d);

/* Training micro-batch: inputs and targets (B,T), targets shifted by one. */
void dataset_train_batch(const struct dataset *d, int *inputs, int *targets, int B, int T,
                         uint64_t seed, long step, int micro_step, int rank, int world);

/* Validation sequences first .. first+B-1 of the fixed validation set (each
 * one a function of the seed and its index alone, whatever B is). */
void dataset_val_batch(const struct dataset *d, int *inputs, int *targets, int B, int T,
                       uint64_t seed, long first);

#endif
