/*
 * agent_preflight: the node's pre-flight of the job it was welcomed into
 * (common/preflight.h), run on libuv's thread pool so that reading a large
 * data file never holds up heartbeats. While the node is unfit the checks
 * run again every PREFLIGHT_RETRY_MS, so that fixing the cause (copying
 * the data file, freeing disk space) makes it fit without a restart; when
 * the job names checkpoint_latest they run again while the node waits,
 * so that musterd sees the checkpoint it has now.
 */
#ifndef MUSTER_AGENT_PREFLIGHT_H
#define MUSTER_AGENT_PREFLIGHT_H

#include <limits.h>
#include <stdbool.h>
#include <stdint.h>

#include <uv.h>

#include "common/cmdline.h"
#include "common/jobspec.h"
#include "common/preflight.h"
#include "proto/proto.h"
#include "worker/agent/rank_user.h"

#define PREFLIGHT_RETRY_MS 2000

struct agent_preflight;
/* The result, on the loop thread: fit, or the first failure in reason. */
typedef void (*preflight_done_fn)(struct agent_preflight *p, bool fit, const char *reason);

/* What one run checks. */
struct preflight_inputs {
    struct job_spec spec;
    bool trainer;     /* the ranks are muster-train: data, checkpoint_dir apply */
    enum proto_device_kind kind;
    uint32_t ndevices;
    uint32_t devices[PROTO_MAX_LOCAL_RANKS];
    bool have_clock;
    int64_t skew_ms, rtt_ms; /* this node's clock minus musterd's; how far off that may be */
    char cmd[CMDLINE_MAX];     /* the ranks' command, packed (common/cmdline.h), for require_python */
    char python_path[2 * 4096 + 16]; /* PYTHONPATH's head a rank gets (the hook); "" = none */
    char node[PROTO_NAME_MAX];
    const struct rank_user *user; /* the import check runs as the ranks do; NULL = the agent */
};

/* What a run found beside its verdict. */
struct preflight_result {
    bool has_checkpoint;       /* the job names checkpoint_latest and it was read */
    char checkpoint[PROTO_CKPT_NAME_MAX]; /* the latest checkpoint; "" = none */
    uint64_t python_ok;        /* in and out: the key of the last import check that passed; 0 = none */
};

struct agent_preflight {
    uv_loop_t *loop;
    uv_work_t work;
    uv_timer_t retry;
    bool busy;        /* work queued or running (it reads cur) */
    bool again;       /* new inputs came while busy: run again, do not report */
    bool wanted;      /* runs are wanted (start .. stop) */
    bool last;        /* the run in flight reports, then no more runs (agent_preflight_settle) */
    bool closing;
    preflight_done_fn done;
    void *data;
    struct preflight_inputs cur, next;
    /* the answer (worker thread -> loop) */
    bool fit;
    char reason[PREFLIGHT_WHY_MAX];
    struct preflight_result res; /* its python_ok outlives the runs: a heal does not import again */
};

void agent_preflight_init(struct agent_preflight *p, uv_loop_t *loop, preflight_done_fn done, void *data);

/* Checks in on this node now (and again while unfit). */
void agent_preflight_start(struct agent_preflight *p, const struct preflight_inputs *in);

/* No more runs: the link is gone. */
void agent_preflight_stop(struct agent_preflight *p);

/* No more runs after the one in flight, which still reports: the node was
 * assigned while the check its HELLO promised ran, and musterd, which took
 * the node as "checking" at that HELLO, waits for the answer before any
 * later generation (an ASSIGN that dropped it left the node checking for
 * good: the job's next generation never formed). */
void agent_preflight_settle(struct agent_preflight *p);

/* Closes the timer; the work in flight (if any) ends on its own. */
void agent_preflight_close(struct agent_preflight *p);

/*
 * The checks themselves, synchronously: clock, devices (GPU ordinals NVML
 * sees), the job's require_* keys (paths, directories, the interpreter's
 * imports with a rank's environment; an import check whose key equals
 * res->python_ok is not run again), the latest checkpoint (into res), and
 * for muster-train ranks the data file and checkpoint_dir (free space for
 * two checkpoints at world size nodes x ndevices). Returns 0 or the first
 * failure's code with why.
 */
int agent_preflight_check(const struct preflight_inputs *in, struct preflight_result *res, char *why, size_t len);

#endif
