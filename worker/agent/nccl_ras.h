/*
 * nccl_ras: what NCCL's RAS service says about the job's communicators,
 * asked by the agent when musterd suspects a hang (COMMAND stacks).
 *
 * NCCL 2.24 and later run a RAS thread in every process; the threads of a
 * job gossip among themselves, and any one of them answers a client on
 * localhost:28028 (NCCL_RAS_ADDR) with the state of every communicator of
 * the job: per rank its host, PID, GPU and how many collectives of each
 * kind it has issued, and the ranks missing from the answer (unresponsive,
 * or considered dead). The agent speaks the text protocol itself rather than
 * run the `ncclras` binary: no binary to find or fork on a node whose loop
 * must keep beating, and the answer read in JSON (NCCL 2.28.7 and later;
 * older ones answer only text, and then nothing is concluded):
 *
 *     -> CLIENT PROTOCOL 2        <- SERVER PROTOCOL n
 *     -> TIMEOUT s                <- OK     (how long RAS waits for its peers)
 *     -> SET FORMAT json          <- OK
 *     -> STATUS                   <- the JSON document, then EOF
 *
 * The exchange is a state machine fed bytes (ras_on_bytes: testable without
 * a socket) over one non-blocking socket that the agent polls from its
 * stacks timer, as rank_stacks does: no loop here, and every step bounded by
 * the query's deadline and RAS_ANSWER_MAX bytes.
 *
 * ras_findings reads the document: for each communicator and each kind of
 * collective, the count most ranks have issued; a rank below it is behind
 * (it never issued the collective its peers wait in), one above it ahead
 * (it issued one its peers did not); a missing rank is named as NCCL says
 * (dead or unresponsive); a rank with an asynchronous NCCL error, with it.
 * A document that is not what NCCL writes is refused with the reason: RAS
 * runs inside the user's processes and is not trusted further than that.
 */
#ifndef MUSTER_WORKER_NCCL_RAS_H
#define MUSTER_WORKER_NCCL_RAS_H

#include <stddef.h>
#include <stdint.h>

#define RAS_DEFAULT_ADDR "127.0.0.1:28028"
#define RAS_ANSWER_MAX (4u << 20)     /* bytes of one answer read at most */
#define RAS_MAX_FINDINGS 64
#define RAS_PEER_TIMEOUT_S 1          /* TIMEOUT sent: RAS's wait for its peers */
#define RAS_DEADLINE_MS 1500          /* the whole query, connect to EOF: inside musterd's wait for stacks (2 s) */

enum ras_phase {
    RAS_CONNECTING, /* non-blocking connect under way */
    RAS_HELLO,      /* CLIENT PROTOCOL sent, waiting for SERVER PROTOCOL */
    RAS_TIMEOUT,    /* TIMEOUT sent, waiting for OK */
    RAS_FORMAT,     /* SET FORMAT json sent, waiting for OK */
    RAS_STATUS,     /* STATUS sent, reading the document to EOF */
    RAS_DONE,       /* answer in `in`, or error says why there is none */
};

struct ras_query {
    int fd;
    enum ras_phase phase;
    uint64_t deadline_ms;
    char out[64];         /* the command being written */
    size_t outlen, outoff;
    char *in;             /* bytes read in the current phase, NUL-terminated */
    size_t inlen, incap;
    int server_protocol;
    char error[160];      /* why no answer; "" = the JSON document is in `in` */
};

enum ras_kind {
    RAS_BEHIND,       /* issued fewer of op than most ranks of its communicator */
    RAS_AHEAD,        /* issued more */
    RAS_DEAD,         /* missing from the answer; NCCL considers it dead */
    RAS_UNRESPONSIVE, /* missing from the answer; its RAS thread did not answer */
    RAS_ASYNC_ERROR,  /* the communicator has an asynchronous NCCL error on this rank */
};

struct ras_finding {
    enum ras_kind kind;
    char comm[24];        /* the communicator's hash as NCCL prints it */
    int32_t comm_size;
    int32_t rank;         /* the rank in that communicator */
    int32_t pid;          /* -1: unknown */
    int32_t cuda_dev;
    char host[64];
    char op[24];          /* RAS_BEHIND, RAS_AHEAD: the collective ("AllReduce") */
    uint64_t count;       /* what this rank issued; RAS_ASYNC_ERROR: the error code */
    uint64_t peers_count; /* what most ranks issued */
    uint32_t npeers;      /* how many ranks issued peers_count */
};

/*
 * Starts a query to addr ("HOST:PORT", numeric IPv4 or IPv6 in brackets; NULL
 * or "" = RAS_DEFAULT_ADDR) that must be done by now_ms + deadline. Returns 0
 * with the query under way, or a negative errno with q->phase RAS_DONE and
 * q->error saying why (nothing listening is the common case: not an NCCL job).
 */
int ras_begin(struct ras_query *q, const char *addr, uint64_t now_ms, uint32_t deadline_ms);

/* Advances the query without blocking; 1 once it is RAS_DONE (answer or error), else 0. */
int ras_poll(struct ras_query *q, uint64_t now_ms);

/* Frees what the query holds and closes its socket, leaving it RAS_DONE with
 * nothing to say (the state to start from, too); idempotent. */
void ras_end(struct ras_query *q);

/*
 * The protocol on bytes read (no socket): advances q->phase and puts the
 * next command in q->out. n == 0 means EOF. Returns 0, or -EPROTO with
 * q->error set (and RAS_DONE) when the server said something else.
 */
int ras_on_bytes(struct ras_query *q, const char *buf, size_t n);

/*
 * What the JSON document says is wrong, at most cap findings in out (more are
 * counted in *n but not stored). Returns 0, or -EINVAL with why set when the
 * document is not RAS's.
 */
int ras_findings(const char *json, size_t len, struct ras_finding *out, size_t cap, size_t *n, char *why,
                 size_t whylen);

/* One line for a finding: "NCCL RAS: rank 2 of communicator 0x.. (4 ranks) ... ". Returns its length. */
int ras_finding_text(const struct ras_finding *f, char *buf, size_t cap);

/*
 * The lines of the findings (out[0..n)) about the process rank_pid leads:
 * the finding's PID is rank_pid or in its process group, and its host is an
 * address of this machine (RAS answers for the whole job: another node's
 * process may have the same PID). At most RAS_RANK_TEXT_MAX bytes; malloc'd,
 * or NULL when none is about it.
 */
#define RAS_RANK_TEXT_MAX 2048
char *ras_rank_text(const struct ras_finding *out, size_t n, int rank_pid);

#endif
