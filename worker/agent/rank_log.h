/*
 * rank_log: each rank's output kept in a file per generation, bounded, and
 * the reads that answer LOG_REQUEST (proto/PROTOCOL.md, "Rank logs").
 *
 * Writing: <rank dir>/output.log receives every output line of the rank,
 * stdout and stderr in the order they arrive, as the rank wrote them. A
 * line that would take the file past the cap goes to a new file: the old
 * one becomes output.log.1 (replacing an older one) and output.log.offset
 * records where the new file starts, so offsets count every byte the rank
 * wrote in the generation. A rank therefore keeps at most 2 x cap bytes
 * (plus one line) per generation. One write per line, O_APPEND, no
 * buffering: a reader sees a line as soon as it is written.
 *
 * Reading is plain file I/O on the same thread as the writing, so a read
 * never meets a half-done rotation. It reads at most PROTO_LOG_MAX bytes
 * (one pread) and does not block for long.
 */
#ifndef MUSTER_WORKER_RANK_LOG_H
#define MUSTER_WORKER_RANK_LOG_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "proto/proto.h"

#define RANK_LOG_FILE "output.log"
#define RANK_LOG_OLD "output.log.1"
#define RANK_LOG_OFFSET "output.log.offset"

struct rank_log {
    int fd;             /* output.log; -1 = none (no rank directory, logs off, or it failed) */
    char dir[PATH_MAX]; /* the rank directory */
    uint32_t rank;      /* for messages */
    uint64_t cap;       /* bytes per file */
    uint64_t base;      /* offset of output.log's first byte */
    uint64_t size;      /* bytes in output.log */
};

/* No file yet: fd -1. */
/* The layout of a node's state directory: <state_dir>/gen-G/rank-R. */
int rank_log_dir(char *out, size_t cap, const char *state_dir, uint64_t gen, uint32_t rank);
/* 1 with *gen when name is a generation directory's ("gen-G"), else 0. */
int rank_log_generation(const char *name, uint64_t *gen);

void rank_log_init(struct rank_log *l);

/*
 * Opens (or goes on with) dir/output.log. No file and 0 when dir is "" or
 * cap is 0 (logs off); otherwise 0 or a negative errno (logged once).
 */
int rank_log_open(struct rank_log *l, const char *dir, uint32_t rank, uint64_t cap);

/*
 * Appends bytes[0..len), and a newline when the rank ended the line with
 * one (a line split for length, or cut by the end of the stream, has none).
 * A write that fails closes the log with one warning.
 */
void rank_log_append(struct rank_log *l, const char *bytes, size_t len, bool newline);

void rank_log_close(struct rank_log *l);

/* Whether add more bytes go to a new file: the file has some, and would pass cap. */
bool rank_log_must_rotate(uint64_t size, uint64_t add, uint64_t cap);

/* The newest generation under state_dir with a log of rank; 0 = none. */
uint64_t rank_log_newest(const char *state_dir, uint32_t rank);

/*
 * Answers q from the logs under state_dir: fills *d (its data malloc'd; the
 * caller releases it with proto_msg_clear) with the bytes or with an error
 * and its reason. node names this node in reasons; logs_off says the node
 * writes no logs (log_max_mb 0), for the reason when none is found.
 */
void rank_log_serve(const char *state_dir, const char *node, bool logs_off,
                    const struct proto_log_request *q, struct proto_log_data *d);

#endif
