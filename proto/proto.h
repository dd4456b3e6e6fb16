/*
 * proto: the wire protocol spoken between musterd, muster-worker and
 * muster-train (see proto/PROTOCOL.md for the byte-level specification).
 *
 * A frame is an 8-byte header followed by a JSON object:
 *
 *   offset 0  u32  payload length in bytes, big-endian (<= PROTO_MAX_PAYLOAD)
 *   offset 4  u16  protocol version, big-endian (== PROTO_VERSION)
 *   offset 6  u16  message type, big-endian (enum proto_type)
 *   offset 8  ...  payload: one JSON object, UTF-8, no trailing bytes
 *
 * This module is pure: it owns no socket and no event loop. The decoder
 * takes bytes and answers a message, PROTO_NEED_MORE, or a distinct
 * negative error code; proto_strerror() turns a code into words.
 *
 * Decoded messages are plain C structs (no JSON left in them) except four
 * fields owned by the message: the job spec carried by ASSIGN and by WELCOME
 * (a jansson object), the log bytes carried by LOG_DATA and the stack text
 * carried by STACKS (malloc'd strings); proto_msg_clear() releases them. Encoders write a complete frame into a
 * caller-supplied buffer.
 */
#ifndef MUSTER_PROTO_H
#define MUSTER_PROTO_H

#include <stddef.h>
#include <stdint.h>

#include <jansson.h>

#define PROTO_VERSION 2
#define PROTO_HEADER_LEN 8
#define PROTO_MAX_PAYLOAD (256u * 1024u)
#define PROTO_MAX_FRAME (PROTO_HEADER_LEN + PROTO_MAX_PAYLOAD)
/* A sealed frame (daemon <-> agent after the handshake, proto_seal): the
 * header's length counts the payload and the MAC that follows it. */
#define PROTO_MAC_LEN 32
#define PROTO_MAX_SEALED (PROTO_MAX_FRAME + PROTO_MAC_LEN)

#define PROTO_NAME_MAX 64        /* node names, addresses: bytes incl. NUL */
#define PROTO_REASON_MAX 512     /* reject / error / diagnosis text */
#define PROTO_CKPT_NAME_MAX 201  /* a latest checkpoint's name in PREFLIGHT */
#define PROTO_MEMCKPT_MAX 8      /* complete memory checkpoints one HEARTBEAT names */
#define PROTO_MEMPATH_MAX 256    /* a file's path inside a memory checkpoint, bytes incl. NUL */
#define PROTO_MEMDATA_MAX 98304  /* bytes of a file one MEM_FILE carries (sent as base64) */
#define PROTO_DETAIL_MAX 4096    /* RANK_EXIT detail: the tail of a traceback or stderr */
#define PROTO_NONCE_LEN 32       /* challenge nonce, raw bytes */
#define PROTO_HMAC_LEN 32        /* HMAC-SHA256 output, raw bytes */
#define PROTO_UID_LEN 128        /* communicator unique id, opaque bytes */
#define PROTO_MAX_LOCAL_RANKS 64 /* ranks (devices) per node */
#define PROTO_U64_MAX ((UINT64_C(1) << 53) - 1) /* largest uint64 on the wire */
/* LOG_DATA: most bytes of a rank's log in one answer. JSON escaping at most
 * doubles them (data holds no control characters but newline and tab), so
 * an answer always fits PROTO_MAX_PAYLOAD. */
#define PROTO_LOG_MAX 65536
#define PROTO_WHERE_MAX 256   /* HEARTBEAT rank entry `where`: bytes incl. NUL */
#define PROTO_WAITING_MAX 128 /* HEARTBEAT rank entry `waiting`: bytes incl. NUL */
#define PROTO_SPLIT_S_MAX 3600.0 /* HEARTBEAT rank entry `split_s`: the longest window, s */
/* STACKS: most bytes of one rank's dumped stacks (escaped at most twice over,
 * they fit PROTO_MAX_PAYLOAD). */
#define PROTO_STACKS_MAX 61440
#define PROTO_FR_MAX 2048 /* a STACKS's flight recorder summary (common/flight.h: FLIGHT_TEXT_MAX) */
#define PROTO_RAS_MAX 2048 /* a STACKS's NCCL RAS findings (worker/agent/nccl_ras.h: RAS_RANK_TEXT_MAX) */

/* Machine-readable REJECT codes (daemon -> agent, then close). */
#define PROTO_REJECT_AUTH "auth"               /* wrong HMAC response */
#define PROTO_REJECT_VERSION "version"         /* unsupported protocol version */
#define PROTO_REJECT_DUPLICATE "duplicate"     /* a node of that name is connected */
#define PROTO_REJECT_FULL "full"               /* job has its nodes; not a member */
#define PROTO_REJECT_BAD_REQUEST "bad_request" /* undecodable or out-of-order frame */
#define PROTO_REJECT_FINISHED "finished"       /* the job has ended */
/* A standby musterd (of several for one job): the reason starts with the
 * leader's control address, "HOST:PORT leads; ...", or "no leader; ...". */
#define PROTO_REJECT_NOT_LEADER "not_leader"
/* ERROR codes (informational, never fatal by themselves). */
#define PROTO_ERROR_STALE_GENERATION "stale_generation" /* older than mine */
#define PROTO_ERROR_BAD_REQUEST "bad_request" /* frame did not decode; skipped */
#define PROTO_ERROR_UNEXPECTED "unexpected"   /* valid, but not in this state */

/* Results of the decoder and of the other proto_ calls. */
enum proto_err {
    PROTO_OK = 0,
    PROTO_NEED_MORE = 1,     /* not an error: feed more bytes */
    PROTO_E_OVERSIZE = -1,   /* length prefix above PROTO_MAX_PAYLOAD */
    PROTO_E_VERSION = -2,    /* protocol version is not PROTO_VERSION */
    PROTO_E_TYPE = -3,       /* unknown message type */
    PROTO_E_JSON = -4,       /* payload is not one well-formed JSON object */
    PROTO_E_MISSING = -5,    /* a required field is absent */
    PROTO_E_FIELD_TYPE = -6, /* a field has the wrong JSON type */
    PROTO_E_RANGE = -7,      /* a field's value is out of bounds or malformed */
    PROTO_E_TRUNCATED = -8,  /* stream ended inside a frame */
    PROTO_E_UNKNOWN_FIELD = -9, /* a field this version does not define */
    PROTO_E_NOSPACE = -10,   /* encoder: output buffer too small */
    PROTO_E_CRYPTO = -11,    /* the crypto library failed */
    PROTO_E_NOMEM = -12,     /* out of memory (jansson could not allocate) */
    PROTO_E_MAC = -13,       /* a sealed frame's MAC does not verify: forged, altered,
                              * replayed, reordered or one left out */
};

enum proto_type {
    PROTO_HELLO = 1,     /* agent -> daemon: who I am, what I have, my nonce */
    PROTO_CHALLENGE = 2, /* daemon -> agent: its nonce and its proof of the token */
    PROTO_RESPONSE = 3,  /* agent -> daemon: the agent's proof of the token */
    PROTO_WELCOME = 4,   /* daemon -> agent: joined; timing parameters */
    PROTO_REJECT = 5,    /* daemon -> agent: refused, with reason; then close */
    PROTO_ASSIGN = 6,    /* daemon -> agent, agent -> rank: generation layout */
    PROTO_UNIQUE_ID = 7, /* rank 0 -> agent -> daemon -> agents -> ranks */
    PROTO_HEARTBEAT = 8, /* rank -> agent (one rank), agent -> daemon (all) */
    PROTO_RANK_EXIT = 9, /* agent -> daemon: a rank process ended */
    PROTO_COMMAND = 10,  /* daemon -> agent, agent -> rank: do something */
    PROTO_ERROR = 11,    /* either way: the peer sent something wrong */
    PROTO_LOG_REQUEST = 12, /* daemon -> agent: read a rank's output log */
    PROTO_LOG_DATA = 13, /* agent -> daemon: the bytes asked for, or why not */
    PROTO_PREFLIGHT = 14, /* agent -> daemon: whether the node can run the job, and why not */
    PROTO_STACKS = 15,   /* agent -> daemon: one rank's dumped stacks, or why there are none */
    PROTO_MEM_FILE = 16, /* agent -> daemon -> agent: a piece of a memory checkpoint's file */
    PROTO_MEM_FETCH = 17, /* daemon -> agent: send a node's replicated checkpoint back to it */
    PROTO_TYPE_MAX = 17,
};

/* Lifecycle of one rank process as reported in heartbeats. */
enum proto_rank_state {
    PROTO_RANK_STARTING = 0, /* spawned, not yet heartbeating */
    PROTO_RANK_RUNNING = 1,  /* heartbeating, training */
    PROTO_RANK_STOPPING = 2, /* told to stop, not yet exited */
    PROTO_RANK_EXITED = 3,   /* process has ended */
    PROTO_RANK_STATE_MAX = 3,
};

/* Where a rank that can rejoin took its model state from in this generation. */
enum proto_restore {
    PROTO_RESTORE_NONE = 0,   /* not reported (yet) */
    PROTO_RESTORE_MEMORY = 1, /* survivors' own state and peers' in-memory replicas */
    PROTO_RESTORE_DISK = 2,   /* the last committed checkpoint */
    PROTO_RESTORE_SEED = 3,   /* nothing to restore: initialised from the seed */
    PROTO_RESTORE_MAX = 3,
};
enum proto_command {
    PROTO_CMD_STOP = 1,       /* stop ranks (generation given is the new one) */
    PROTO_CMD_START = 2,      /* start ranks of the held assignment */
    PROTO_CMD_SHUTDOWN = 3,   /* agent: stop ranks and exit */
    PROTO_CMD_CHECKPOINT = 4, /* rank: write a checkpoint now */
    PROTO_CMD_PARK = 5,       /* generation over by a failure: rejoining ranks wait, others stop */
    PROTO_CMD_YIELD = 6,      /* rank: leave this generation at the next step boundary and wait */
    PROTO_CMD_STACKS = 7,     /* agent: dump the stacks of the generation's ranks, answer STACKS */
    PROTO_CMD_MAX = 7,
};

/* Why a LOG_DATA carries no bytes. */
enum proto_log_error {
    PROTO_LOG_OK = 0,         /* "": data holds the bytes */
    PROTO_LOG_NO_LOG = 1,     /* no log of that rank (and generation) on the node */
    PROTO_LOG_BEYOND_END = 2, /* offset is past the end of the log */
    PROTO_LOG_UNREADABLE = 3, /* the log exists but could not be read */
    PROTO_LOG_BUSY = 4,       /* the node's link to the daemon is backed up: ask again */
    PROTO_LOG_ERROR_MAX = 4,
};

enum proto_device_kind {
    PROTO_DEV_CPU = 0,
    PROTO_DEV_GPU = 1,
};

/* One GPU as NVML describes it (HELLO). */
struct proto_gpu {
    char name[PROTO_NAME_MAX];   /* "NVIDIA H100 80GB HBM3"; printable ASCII */
    uint64_t total_mb;
    uint64_t free_mb;
};

struct proto_hello {
    char node[PROTO_NAME_MAX];   /* unique node name: [A-Za-z0-9._-], 1..63 */
    char addr[PROTO_NAME_MAX];   /* address ranks of this node are reached at */
    enum proto_device_kind kind;
    uint32_t ndevices;           /* 1..PROTO_MAX_LOCAL_RANKS */
    uint32_t devices[PROTO_MAX_LOCAL_RANKS]; /* device indices (gpu ordinal) */
    uint64_t device_mem_mb;      /* per device; 0 when unknown */
    uint64_t generation;         /* generation its ranks run now, 0 if none */
    uint32_t free_port;          /* a port free on this node for MASTER_PORT; 0 = none */
    char agent_version[32];
    uint8_t nonce[PROTO_NONCE_LEN]; /* the agent's challenge: fresh random bytes */
    /* Optional (absent: 0 / none / false): */
    uint64_t session;            /* the session WELCOME gave this agent, to resume it on a new
                                  * connection; 0 = none */
    uint32_t ngpus;              /* <= ndevices: gpus[i] describes devices[i] */
    struct proto_gpu gpus[PROTO_MAX_LOCAL_RANKS];
    uint64_t host_mem_mb;        /* the node's memory (CPU ranks share it) */
    int preflight;               /* a PREFLIGHT follows: do not count the node before it */
    char domain[PROTO_NAME_MAX]; /* the operator's placement label (a rack, an NVLink domain):
                                  * a spare replaces a lost node of its own domain first; "" = none */
};

struct proto_challenge {
    uint8_t nonce[PROTO_NONCE_LEN]; /* the daemon's challenge: fresh random bytes */
    uint8_t hmac[PROTO_HMAC_LEN];   /* the daemon's proof (proto_proof, PROTO_SIDE_DAEMON) */
};

struct proto_response {
    uint8_t hmac[PROTO_HMAC_LEN]; /* the agent's proof (proto_proof, PROTO_SIDE_AGENT) */
};

struct proto_welcome {
    uint32_t heartbeat_interval_ms;
    uint32_t heartbeat_timeout_ms;
    uint32_t lease_ms;
    /* Optional: */
    uint64_t session;  /* this join's session (HELLO.session resumes it); 0 = none */
    uint64_t time_ms;  /* musterd's wall clock (ms since 1970) when sent; 0 = absent */
    json_t *job;       /* the job spec, for the agent's pre-flight; owned by the
                        * message; NULL = absent */
    uint64_t term;     /* the leading musterd's term (PROTOCOL.md "Terms"); 0 = absent */
};

/* PREFLIGHT: the agent's checks of the job on its node (common/preflight.h). */
struct proto_preflight {
    int fit;                       /* every check passed */
    char reason[PROTO_REASON_MAX]; /* the first failure; "" exactly when fit */
    int trainer;                   /* the node's ranks are muster-train (the plan applies) */
    /* Optional (the job names checkpoint_latest): */
    int has_checkpoint;            /* the node read its checkpoint_dir */
    char checkpoint[PROTO_CKPT_NAME_MAX]; /* its latest checkpoint; "" = none there */
};

struct proto_reject {
    char code[32];                 /* machine-readable: auth, duplicate, ... */
    char reason[PROTO_REASON_MAX]; /* human-readable */
};

struct proto_rank_slot {
    uint32_t rank;       /* global rank */
    uint32_t local_rank; /* index among this node's ranks */
    uint32_t device;     /* device index the rank is given */
};

struct proto_assign {
    uint64_t generation;
    uint32_t world_size;
    uint32_t nranks; /* this node's ranks (to a rank: all of its node's) */
    struct proto_rank_slot ranks[PROTO_MAX_LOCAL_RANKS];
    uint32_t node_rank;      /* this node's index among the members, name order */
    uint32_t nnodes;         /* members of the generation */
    uint32_t restart_count;  /* restarts spent before this generation */
    char master_addr[PROTO_NAME_MAX]; /* address of rank 0's node */
    uint32_t master_port;    /* port free on rank 0's node for this generation */
    json_t *job;     /* job spec object; owned by the message */
    const char *job_text; /* encoder only, optional: job as json_dumps(job, JSON_COMPACT) gives it,
                           * written as it is instead of rendering job again (a daemon sends one job
                           * to every node); NULL = render job. Not owned; the decoder sets NULL */
    uint64_t term;   /* optional: the leading musterd's term; 0 = absent (no store) */
    /* Optional, daemon -> agent (the job names memory_checkpoint_mb): the newest
     * memory checkpoint complete on every member, which the ranks must load;
     * "" = none. An agent does not pass it on to its ranks. */
    int has_memckpt;
    char memckpt[PROTO_CKPT_NAME_MAX];
    /* Optional, with memckpt: the node that holds this node's copy of memckpt
     * (its buddy) when this node reported none; the agent waits for its files
     * (MEM_FILE restore) before its ranks start. "" = absent. */
    char memckpt_from[PROTO_NAME_MAX];
    /* Optional, with memckpt: neither this node nor a buddy holds memckpt in
     * memory; the agent copies it back from its drained copy in
     * checkpoint_dir (job key memory_checkpoint_drain_steps) before its
     * ranks start. 0 = absent. */
    int memckpt_drained;
};

struct proto_unique_id {
    uint64_t generation;
    uint8_t id[PROTO_UID_LEN];
    uint64_t term; /* optional, daemon -> agent: the leading musterd's term; 0 = absent */
};

/* What a rank's main thread does with its wall time (a rank entry's split). */
enum proto_split_kind {
    PROTO_SPLIT_COMPUTE,    /* its own work: forward, optimizer, the program's code */
    PROTO_SPLIT_COLLECTIVE, /* in a collective or a backward pass that reduces gradients */
    PROTO_SPLIT_GPU,        /* waiting on the device (a sync: .item(), synchronize) */
    PROTO_SPLIT_DATA,       /* in data loading (a DataLoader's __next__) */
    PROTO_SPLIT_NKINDS
};
/* The wire names of the shares: "compute_frac", "collective_frac", "gpu_frac", "data_frac". */
extern const char *const proto_split_json[PROTO_SPLIT_NKINDS];

struct proto_rank_beat {
    uint32_t rank;
    enum proto_rank_state state;
    uint64_t step;
    double loss;          /* NaN allowed on the C side, sent as null */
    double tokens_per_s;
    double comm_frac;     /* fraction of step time waiting on communication */
    uint64_t checkpoint_step; /* last committed checkpoint this rank knows; 0 = none
                               * (optional on the wire: omitted when 0) */
    int silent;           /* alive by its process alone: it never sent a frame, so
                           * step and loss are unknown (optional: omitted when 0) */
    uint64_t step_bytes;  /* bytes the rank sent between its last two step reports
                           * (optional: omitted when 0) */
    uint64_t peak_mem;    /* the rank's peak memory, bytes (optional: omitted when 0) */
    int rejoin;           /* the rank joins the next generation in place (parks on
                           * COMMAND park, takes a new ASSIGN of its slot) (optional) */
    enum proto_restore restore_from; /* where this generation's state came from
                                      * (optional: omitted when PROTO_RESTORE_NONE) */
    uint64_t restore_step; /* the step it resumed at (with restore_from) */
    int yielded;          /* on COMMAND yield it finished its step, left the generation
                           * with the others at that step boundary and waits (optional) */
    /* Optional, what a rank says of its progress and where it is (absent: 0 / ""): */
    double step_s;        /* duration of its last completed step, seconds, as it measured
                           * it; finite, >= 0; 0 = unknown */
    int has_step_age;     /* step_age_ms is given */
    uint64_t step_age_ms; /* ms from when its step last changed (or it began running) to
                           * the sending of this entry; a relaying agent adds the time it
                           * held the entry. 0 when !has_step_age */
    uint64_t total_steps; /* the steps the program says it will run; 0 = unknown */
    int stopped;          /* agent -> daemon: the rank's process is stopped (state T or t):
                           * the entry is its last one, not news from it */
    char where[PROTO_WHERE_MAX];     /* its innermost frame as last sampled ("train.py:88 in
                                      * compute_loss"); "" = unknown. Label text: UTF-8, no
                                      * control characters */
    char waiting[PROTO_WAITING_MAX]; /* the communication call its main thread is inside
                                      * ("all_reduce (distributed_c10d.py)"); "" = none */
    /* Optional, how its main thread spent the wall time of its latest
     * window (the time split; split_s > 0 marks it, and the four shares come
     * with it): for musterd's fail-slow rule (daemon/failslow.h). */
    double split_s;       /* the window's wall seconds, 0 < split_s <= PROTO_SPLIT_S_MAX; 0 = none */
    uint64_t split_steps; /* optimizer steps completed in the window; 0 = not known (optional) */
    double split[PROTO_SPLIT_NKINDS]; /* the window's shares, each 0..1, together <= 1 */
};

struct proto_heartbeat {
    uint64_t generation;
    uint64_t seq;         /* sender's sequence number, increasing */
    uint32_t free_port;   /* agent -> daemon: as in HELLO (optional: omitted when 0) */
    int no_ack;           /* agent -> daemon: "ack": false, the daemon need not answer this
                           * one (optional: absent = answer it; proto_ack_every_ms) */
    /* Optional, agent -> daemon (the job names memory_checkpoint_mb): the
     * memory checkpoints complete on the node, oldest first, at most
     * PROTO_MEMCKPT_MAX (the newest ones); each a label (no control character) */
    int has_memckpt;
    uint32_t nmemckpt;
    char memckpt[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
    /* Optional, agent -> daemon: the node whose replicated checkpoints this
     * one holds (its buddy's owner), and those checkpoints, oldest first;
     * "" / 0 = absent */
    char replica_of[PROTO_NAME_MAX];
    uint32_t nreplica;
    char replica[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
    /* Optional, agent -> daemon: what the agent last found wrong with its warm
     * spare process, in words (UTF-8): "importing NAME touched the CUDA driver
     * (...)"; the daemon makes an event of each new one; "" = nothing */
    char spare_note[PROTO_REASON_MAX];
    /* Optional, agent -> daemon (memory_checkpoint_drain_steps): the memory
     * checkpoints drained whole to the node's durable copy in checkpoint_dir,
     * oldest first, at most PROTO_MEMCKPT_MAX (the newest); each a label */
    int has_drained;
    uint32_t ndrained;
    char drained[PROTO_MEMCKPT_MAX][PROTO_CKPT_NAME_MAX];
    uint32_t nranks;
    struct proto_rank_beat ranks[PROTO_MAX_LOCAL_RANKS];
};

struct proto_rank_exit {
    uint64_t generation;
    uint32_t rank;
    int32_t exit_code; /* -1 when killed by a signal */
    int32_t signal;    /* 0 when it exited */
    char reason[PROTO_REASON_MAX]; /* the rank's own words: its exception or last
                                    * stderr line; "" = none (optional) */
    char detail[PROTO_DETAIL_MAX]; /* traceback or stderr tail; "" = none (optional) */
};

struct proto_command_msg {
    uint64_t generation;
    enum proto_command action;
    uint64_t term; /* optional, daemon -> agent: the leading musterd's term; 0 = absent */
};

struct proto_error {
    char code[32];
    char reason[PROTO_REASON_MAX];
};

/*
 * Offsets count the bytes a rank wrote (stdout and stderr, one file) in one
 * generation, from 0, across the agent's rotations of its log file.
 */
struct proto_log_request {
    uint32_t id;         /* chosen by the daemon, echoed in LOG_DATA */
    uint32_t rank;       /* global rank */
    uint64_t generation; /* 0 = the newest this node has a log of for the rank */
    uint64_t offset;     /* first byte wanted; 0 when tail is given */
    uint32_t tail;       /* > 0: the last tail bytes instead, from a line start */
    uint32_t max;        /* 1..PROTO_LOG_MAX bytes at most */
};

struct proto_log_data {
    uint32_t id;          /* the request's */
    uint32_t rank;
    uint64_t generation;  /* the generation served (asked for, when none is) */
    uint64_t newest;      /* newest generation with a log of the rank here; 0 = none */
    uint64_t offset;      /* of data[0]: above the one asked for when those
                           * bytes were rotated away */
    uint64_t next_offset; /* offset + strlen(data): where to ask next */
    uint64_t size;        /* bytes the rank has written in that generation */
    enum proto_log_error error;
    char reason[PROTO_REASON_MAX]; /* words for error; "" when OK */
    char *data; /* malloc'd, owned by the message (NULL reads as ""): at most
                 * PROTO_LOG_MAX bytes of UTF-8 without control characters
                 * but newline and tab (see proto_log_sanitize); one byte per
                 * byte of the log, so offsets stay exact */
};

/* STACKS: what one rank's processes dumped on COMMAND stacks. */
struct proto_stacks {
    uint64_t generation;
    uint32_t rank;
    uint32_t pid;        /* the rank's process, 0..2^31-1; 0 = none dumped */
    int stopped;         /* its process is stopped (optional) */
    char error[PROTO_REASON_MAX]; /* why there is no stack (or only part); "" = none (optional) */
    char *text; /* malloc'd, owned by the message (NULL reads as ""): at most
                 * PROTO_STACKS_MAX bytes of UTF-8 without control characters
                 * but newline and tab (proto_log_sanitize makes it so); each
                 * process's part headed by a line "process PID:" */
    char *fr;   /* malloc'd or NULL (= ""): the rank's flight recorder summary,
                 * at most PROTO_FR_MAX bytes of log text (optional; the
                 * agent checked it with flight_parse) */
    char *ras;  /* malloc'd or NULL (= ""): what NCCL's RAS service said about
                 * this rank's process, one "NCCL RAS: ..." line per finding,
                 * at most PROTO_RAS_MAX bytes of log text (optional) */
};

/*
 * MEM_FILE: one piece of one file of a memory checkpoint, agent -> daemon ->
 * agent. restore = 0: a replica, from its owner to the owner's buddy (the
 * daemon picks the buddy); 1: from the buddy back to the owner. A
 * checkpoint's files go in order, each in pieces from offset 0, the first
 * frame with begin = 1; a last frame with end = 1 and path "" closes it. The daemon passes it on unchanged.
 */
struct proto_mem_file {
    char owner[PROTO_NAME_MAX];     /* the node whose checkpoint it is */
    char tag[PROTO_CKPT_NAME_MAX];  /* the checkpoint (a label) */
    int restore;
    int begin;                      /* the first frame of this copy: anything of it received before is dropped */
    int end;                        /* the checkpoint is whole: no path, no data */
    char path[PROTO_MEMPATH_MAX];   /* inside the tag's directory: a/b, no "." or ".." part */
    uint64_t offset;                /* of data[0] in the file */
    uint64_t size;                  /* the file's whole size; offset + len <= size */
    uint32_t len;                   /* bytes in data, 0..PROTO_MEMDATA_MAX */
    uint8_t *data;                  /* malloc'd, owned by the message (NULL when len is 0) */
};

/* MEM_FETCH: send owner's checkpoint tag, held here as its buddy, back to owner. */
struct proto_mem_fetch {
    char owner[PROTO_NAME_MAX];
    char tag[PROTO_CKPT_NAME_MAX];
};

struct proto_msg {
    enum proto_type type;
    union {
        struct proto_hello hello;
        struct proto_challenge challenge;
        struct proto_response response;
        struct proto_welcome welcome;
        struct proto_reject reject;
        struct proto_assign assign;
        struct proto_unique_id unique_id;
        struct proto_heartbeat heartbeat;
        struct proto_rank_exit rank_exit;
        struct proto_command_msg command;
        struct proto_error error;
        struct proto_log_request log_request;
        struct proto_log_data log_data;
        struct proto_preflight preflight;
        struct proto_stacks stacks;
        struct proto_mem_file mem_file;
        struct proto_mem_fetch mem_fetch;
    } u;
};

/*
 * Decode one frame from the front of buf[0..len).
 * Returns PROTO_OK with *msg filled and *consumed set to the frame's length,
 * PROTO_NEED_MORE when buf holds only part of a frame (nothing consumed), or
 * a negative enum proto_err. Header errors (oversize, version, type) are
 * reported as soon as the 8 header bytes are present. On PROTO_OK the caller
 * must call proto_msg_clear(msg) when done with it.
 *
 * msg is overwritten (clear a previous message first). A HEARTBEAT is
 * written as proto_heartbeat_start leaves it, then its rank entries
 * ranks[0..nranks) whole; the entries past nranks are not written (most of a
 * message's bytes are rank entries: a frame that uses one must not cost a
 * write of all of them). Every other type's message is zeroed, then filled.
 * On PROTO_NEED_MORE only msg->type is written (0: nothing, owns nothing);
 * on an error msg is left zeroed and owns nothing. On an error in the
 * payload of a complete frame (PROTO_E_JSON, _MISSING, _FIELD_TYPE, _RANGE,
 * _UNKNOWN_FIELD) *consumed is the frame's length, so that a receiver may
 * skip the frame and answer ERROR; on every other result it is 0.
 * consumed may be NULL.
 */
int proto_decode(const uint8_t *buf, size_t len, struct proto_msg *msg,
                 size_t *consumed);

/*
 * Like proto_decode, for a stream that has ended: a partial frame is
 * PROTO_E_TRUNCATED instead of PROTO_NEED_MORE. len == 0 is PROTO_NEED_MORE
 * (a clean end between frames).
 */
int proto_decode_eof(const uint8_t *buf, size_t len, struct proto_msg *msg,
                     size_t *consumed);

/*
 * Encode msg as a complete frame into out[0..cap). Returns the frame length
 * (> 0) or a negative enum proto_err (PROTO_E_NOSPACE, PROTO_E_RANGE for a
 * message that would not decode, e.g. an over-long name).
 */
int proto_encode(const struct proto_msg *msg, uint8_t *out, size_t cap);

/* Release what a decoded (or hand-built) message owns; safe to call twice. */
void proto_msg_clear(struct proto_msg *msg);

/* Makes msg an empty HEARTBEAT: the type set, every field before ranks
 * zeroed (nranks 0), the rank entries left as they are, for the sender to
 * fill ranks[0..nranks) whole. msg must own nothing (cleared). For the paths
 * that build a heartbeat per beat: zeroing the whole message writes its 64
 * entries, ~33 KiB. */
void proto_heartbeat_start(struct proto_msg *msg);

const char *proto_strerror(int err);

/*
 * How long a HEARTBEAT that asked may go unanswered before the agent takes
 * its stream for stalled (step 10 of "A generation" in PROTOCOL.md): a
 * quarter of heartbeat_timeout_ms, at least PROTO_STALL_MIN_MS.
 */
#define PROTO_STALL_MIN_MS 200
uint32_t proto_stall_ms(uint32_t timeout_ms);

/*
 * How often an agent asks the daemon to answer its HEARTBEAT (step 6): the
 * longest whole number of intervals, at least one, within half of lease_ms
 * and within three quarters of heartbeat_timeout_ms less proto_stall_ms (at
 * most half the timeout; less below 800 ms, where the stall time stays
 * 200 ms). A stalled stream is then noticed within this plus the stall time
 * of the last answer, within three quarters of the timeout, with a quarter
 * left to resume; where not even one interval fits, every heartbeat asks.
 */
uint32_t proto_ack_every_ms(uint32_t interval_ms, uint32_t timeout_ms, uint32_t lease_ms);

/* Whether a heartbeat asks for an answer: the beats-th heartbeat sent since
 * the daemon last answered one (or welcomed the agent), this one included,
 * asks once that many intervals make ack_every_ms, and every later one until
 * an answer comes. Counted in heartbeats, not by the clock, so that an answer
 * that comes late (at any time before the next heartbeat) does not put the
 * next question off by an interval: the answers stay about ack_every_ms
 * apart. An agent also asks while it holds an unconfirmed rank exit. */
int proto_ack_due(uint64_t beats, uint32_t interval_ms, uint32_t ack_every_ms);

const char *proto_type_name(enum proto_type type);
const char *proto_rank_state_name(enum proto_rank_state state);
const char *proto_command_name(enum proto_command cmd);
const char *proto_log_error_name(enum proto_log_error err);
const char *proto_restore_name(enum proto_restore from); /* "" for none */

/*
 * Authentication (OpenSSL; PROTOCOL.md "Join"): both sides challenge, both
 * prove the cluster token by an HMAC-SHA256 over what binds the proof to
 * this connection (struct proto_bind), and the keys of the channel that
 * follows are derived from the token and the same binding by HKDF-SHA256.
 * Every call returns 0 (or its answer) or PROTO_E_CRYPTO when the crypto
 * library fails; an empty token is refused with PROTO_E_RANGE (it would
 * prove nothing).
 */
int proto_nonce(uint8_t nonce[PROTO_NONCE_LEN]);

/* HMAC-SHA256(key, data) for any lengths (key may be empty). */
int proto_hmac_raw(const uint8_t *key, size_t key_len, const uint8_t *data,
                   size_t data_len, uint8_t out[PROTO_HMAC_LEN]);

/* HKDF-SHA256 (RFC 5869): out_len (1..8160) bytes from ikm, salt and info. */
int proto_hkdf(const uint8_t *ikm, size_t ikm_len, const uint8_t *salt, size_t salt_len,
               const uint8_t *info, size_t info_len, uint8_t *out, size_t out_len);

/* What a proof and the channel's keys are bound to: both challenges, the
 * HELLO frame whole (its node, address, devices, session) and, named
 * again, the node and the session the HELLO resumes. A proof made for
 * another connection (another nonce), another node or session, or a HELLO
 * changed on the way does not verify. */
struct proto_bind {
    uint8_t agent_nonce[PROTO_NONCE_LEN];  /* HELLO.nonce */
    uint8_t daemon_nonce[PROTO_NONCE_LEN]; /* CHALLENGE.nonce */
    uint8_t hello_digest[PROTO_HMAC_LEN];  /* SHA-256 of the HELLO frame, header included, as sent */
    char node[PROTO_NAME_MAX];             /* HELLO.node */
    uint64_t session;                      /* HELLO.session (0: a first join) */
};

/* b's agent side from the HELLO frame[0..len) as sent (or read) and its
 * decoded message; daemon_nonce is left for the CHALLENGE. */
int proto_bind_hello(struct proto_bind *b, const uint8_t *frame, size_t len, const struct proto_hello *h);

/* Which side proves (a proof of one side never verifies as the other's). */
enum proto_side {
    PROTO_SIDE_AGENT = 0,  /* RESPONSE.hmac */
    PROTO_SIDE_DAEMON = 1, /* CHALLENGE.hmac */
};

/* HMAC-SHA256(token, "muster/2 <side> proof" NUL || binding) (PROTOCOL.md). */
int proto_proof(const uint8_t *token, size_t token_len, const struct proto_bind *b, enum proto_side side,
                uint8_t out[PROTO_HMAC_LEN]);
/* 1 when mac is side's proof over b under token (constant time), else 0. */
int proto_proof_verify(const uint8_t *token, size_t token_len, const struct proto_bind *b,
                       enum proto_side side, const uint8_t mac[PROTO_HMAC_LEN]);

/*
 * The authenticated channel after the handshake: each direction has its own
 * key and counts its frames from 0. proto_seal turns an encoded frame into
 * a sealed one (the header's length grows by PROTO_MAC_LEN, and
 * HMAC-SHA256(key, seq as u64 big-endian || header || payload) follows the
 * payload); proto_open verifies the next sealed frame of a stream and
 * decodes it. The sequence number is not sent: a frame replayed, reordered,
 * altered or left out fails the MAC, and the stream cannot be trusted
 * after that (close it). Pure like the codec: bytes in, bytes out.
 */
struct proto_channel;

/* The channel of side `side` (its frames go out under side's key) for the
 * handshake b under token. NULL when out of memory or the library fails. */
struct proto_channel *proto_channel_new(const uint8_t *token, size_t token_len, const struct proto_bind *b,
                                        enum proto_side side);
void proto_channel_free(struct proto_channel *ch); /* NULL: nothing */

/* frame[0..len) as proto_encode wrote it, sealed in place: returns the
 * sealed length (len + PROTO_MAC_LEN), PROTO_E_NOSPACE when cap is short,
 * PROTO_E_RANGE for bytes that are not one whole frame. */
int proto_seal(struct proto_channel *ch, uint8_t *frame, size_t len, size_t cap);

/*
 * As proto_decode, for the next sealed frame at buf[0..len): PROTO_NEED_MORE,
 * a header error, PROTO_E_MAC (nothing consumed: close the stream), or the
 * payload's result with *consumed the sealed frame's length (a payload
 * error of an authentic frame may be skipped as proto_decode's).
 */
int proto_open(struct proto_channel *ch, const uint8_t *buf, size_t len, struct proto_msg *msg,
               size_t *consumed);

/*
 * Makes s well-formed UTF-8 in place (what the encoder accepts for free
 * text): every byte that starts no valid sequence becomes '?', and control
 * characters other than newline and tab become spaces. Each byte stays one
 * byte, so strlen(s) does not change.
 */
void proto_text_sanitize(char *s);

/*
 * Makes the raw bytes buf[0..len) the data of a LOG_DATA: NUL bytes become
 * spaces, then proto_text_sanitize; buf[len] (which must be writable)
 * becomes the terminating NUL. The text keeps its len bytes.
 */
void proto_log_sanitize(char *buf, size_t len);

/* A file's path inside a memory checkpoint (MEM_FILE path): 1..PROTO_MEMPATH_MAX-1
 * bytes, parts split by '/', none empty, "." or "..", no control character;
 * so neither absolute nor leaving the checkpoint's directory. 1 or 0. */
int proto_valid_mem_path(const char *path);

/* Valid label (a rank entry's `where` and `waiting`): 1..cap-1 bytes of
 * UTF-8 without control characters (C0, DEL, C1). */
int proto_valid_label(const char *s, size_t cap);

/* Valid node name: 1..63 bytes of [A-Za-z0-9._-]. */
int proto_valid_name(const char *s);

#endif
