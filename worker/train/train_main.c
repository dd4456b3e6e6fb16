/*
 * muster-train: one training rank. Two modes:
 *   rank mode (started by muster-worker, MUSTER_CTL_FD set): the job spec,
 *     rank, world size and generation come from the agent's ASSIGN; rank 0
 *     creates the communicator's unique id (ring on the CPU, NCCL on the
 *     GPU) and sends it up; the ranks restore their state (peers' memory,
 *     else the job's last committed checkpoint, else the seed), train their
 *     share with ZeRO-3 and heartbeat their progress. A rank of a world > 1
 *     outlives a broken generation and rejoins the next one in place
 *     (run_rank). Stopped by the agent (or by its death) it aborts the
 *     communicator and exits 1; done, it exits 0.
 *   --standalone: one process, driven by --job and flags that override the
 *     job's training keys.
 * See docs/training.md.
 */
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "common/jobspec.h"
#include "common/log.h"
#include "worker/train/blas_core.h"
#include "worker/train/ckpt.h"
#include "worker/train/layers.h"
#include "worker/train/rank.h"
#include "worker/train/replica.h"
#include "worker/train/comm/comm.h"
#include "worker/train/train.h"
#include "worker/train/gpu/gpu_module.h"

#define EXIT_USAGE 2

/* Raised by SIGTERM/SIGINT and, in rank mode, by the control channel (COMMAND stop,
 * the agent's death): one static flag, so that the handler touches nothing that is freed. */
static volatile sig_atomic_t stop_flag;

/* The phases of the last heal of this rank (CLOCK_REALTIME seconds, so that
 * a benchmark can set them against the moment it killed a rank): rank 0
 * logs them with its first step after the heal. */
static struct {
    int pending;
    double seen, generation, ring, restored;
} heal;

static double wall_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* The control channel's flag: a newer generation (or a stop) makes a ring
 * that is still forming moot (rank mode; set by run_rank). */
static const atomic_int *superseded;

/* Raised by one for each COMMAND checkpoint the control channel receives;
 * the training loop answers each at the next step boundary (train.h). */
static volatile sig_atomic_t checkpoint_requests;
static long checkpoints_answered; /* by the training loop, over every generation this process runs in */
static volatile sig_atomic_t yield_flag; /* COMMAND yield of the generation the rank works in */

static void on_signal(int sig)
{
    (void)sig;
    stop_flag = 1;
}

static void usage(FILE *out)
{
    fprintf(out,
            "usage: muster-train --standalone [--job FILE] [OPTION]...\n"
            "   or: muster-train [OPTION]...   (as a rank, started by muster-worker)\n"
            "Trains a GPT model on the CPU. Standalone, it is one process (the reference\n"
            "the distributed ranks are checked against); as a rank it gets the job spec,\n"
            "rank and world size from its agent and trains its ZeRO-3 share. Flags\n"
            "override the job spec's keys in both modes.\n"
            "\n"
            "  --standalone            run alone, without muster-worker\n"
            "  --device cpu|gpu        where to train (default: cpu standalone; as a rank, gpu\n"
            "                          when the agent gave it a GPU); docs/gpu.md\n"
            "  --job FILE              job spec JSON (docs/jobspec.md, docs/training.md)\n"
            "  --model NAME            model preset: tiny, small, gpt2-124m\n"
            "  --data FILE             text file (bytes) or llm.c token file\n"
            "  --steps N               optimizer steps\n"
            "  --batch N               sequences per optimizer step\n"
            "  --micro-batch N         sequences per micro-step (gradient accumulation)\n"
            "  --seq-len N             tokens per sequence (0 = model's T)\n"
            "  --lr X, --lr-min X      peak learning rate, floor of the cosine decay\n"
            "  --warmup N              linear warm-up steps\n"
            "  --weight-decay X        AdamW decoupled weight decay\n"
            "  --grad-clip X           global gradient-norm clip (0 = off)\n"
            "  --val-fraction X        tail of the data held out for validation\n"
            "  --eval-every N          validation every N steps (0 = off)\n"
            "  --eval-batches N        micro-batches per validation\n"
            "  --seed N                seed of initialisation and data order\n"
            "  --checkpoint-dir DIR    write checkpoints there\n"
            "  --checkpoint-every N    steps between checkpoints (0 = only at the end)\n"
            "  --resume PATH           load a checkpoint (step dir, or a checkpoint dir's latest)\n"
            "  --stop-after N          stop after N steps of this run (then checkpoint)\n"
            "  --sample N              print N generated tokens after training\n"
            "  --threads N             compute threads (default: online CPUs, shared among\n"
            "                          the node's ranks in rank mode)\n"
            "  --metrics FILE          append one JSON line per step and validation\n"
            "  --log-level LEVEL       error, warn, info, debug\n"
            "  --help, --version\n"
            "\n"
            "Exit status: 0 success, 1 runtime failure, 2 usage error.\n");
}

enum {
    OPT_STANDALONE = 256, OPT_JOB, OPT_MODEL, OPT_DATA, OPT_STEPS, OPT_BATCH, OPT_MICRO,
    OPT_SEQ, OPT_LR, OPT_LR_MIN, OPT_WARMUP, OPT_WD, OPT_CLIP, OPT_VALFRAC, OPT_EVAL_EVERY,
    OPT_EVAL_BATCHES, OPT_SEED, OPT_CKDIR, OPT_CKEVERY, OPT_RESUME, OPT_STOP_AFTER, OPT_SAMPLE,
    OPT_THREADS, OPT_METRICS, OPT_LOGLEVEL, OPT_HELP, OPT_VERSION, OPT_DEVICE,
};

/* Flags that set a job key: the option, the key, and how to read the value. */
static const struct {
    int opt;
    const char *key;
    char kind; /* 'i' integer, 'd' number, 's' string */
} key_flags[] = {
    {OPT_MODEL, "model", 's'},          {OPT_DATA, "data", 's'},
    {OPT_STEPS, "steps", 'i'},          {OPT_BATCH, "batch", 'i'},
    {OPT_MICRO, "micro_batch", 'i'},    {OPT_SEQ, "seq_len", 'i'},
    {OPT_LR, "lr", 'd'},                {OPT_LR_MIN, "lr_min", 'd'},
    {OPT_WARMUP, "warmup_steps", 'i'},  {OPT_WD, "weight_decay", 'd'},
    {OPT_CLIP, "grad_clip", 'd'},       {OPT_VALFRAC, "val_fraction", 'd'},
    {OPT_EVAL_EVERY, "eval_every", 'i'}, {OPT_EVAL_BATCHES, "eval_batches", 'i'},
    {OPT_SEED, "seed", 'i'},            {OPT_CKDIR, "checkpoint_dir", 's'},
    {OPT_CKEVERY, "checkpoint_every", 'i'},
};

static int parse_long(const char *s, long long *out)
{
    char *end;
    errno = 0;
    *out = strtoll(s, &end, 10);
    return errno || end == s || *end ? -EINVAL : 0;
}

static int parse_double(const char *s, double *out)
{
    char *end;
    errno = 0;
    *out = strtod(s, &end);
    return errno || end == s || *end ? -EINVAL : 0;
}

struct run_state {
    FILE *metrics;
    double t0; /* CLOCK_MONOTONIC at the start of training */
    int tty;
    int quiet;              /* not rank 0: no step lines */
    long steps;
    struct rank_ctl *ctl;   /* rank mode: heartbeats go here */
    const long *ckpt_step;  /* the trainer's last committed checkpoint (-1: none) */
    const struct zero *zero; /* the CPU path's shards: its ring is zero->comm (NULL: world 1);
                              * NULL on the GPU path */
    uint64_t rss_base;      /* the CPU path: the process's RSS before the trainer was built */
    const struct comm *counted; /* the ring whose bytes sent were last read */
    uint64_t sent;          /* its bytes sent then */
};

/* The process's resident memory (VmRSS) or its peak (VmHWM), bytes; 0 when unknown. */
static uint64_t rss(const char *which)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[128], fmt[32];
    unsigned long long kb = 0;
    snprintf(fmt, sizeof(fmt), "%s: %%llu kB", which);
    while (f && fgets(line, sizeof(line), f))
        if (sscanf(line, fmt, &kb) == 1)
            break;
    if (f)
        fclose(f);
    return (uint64_t)kb * 1024;
}

/* Bytes moved and peak memory beside the plan's (docs/plan.md): the ring's
 * bytes sent since the last step report (the step and the vote before it). */
static void report_measured(struct run_state *rs)
{
    uint64_t step_bytes = 0;
    const struct comm *c = rs->zero ? rs->zero->comm : NULL;
    if (c) { /* read through the trainer: a new generation's communicator counts from 0 */
        struct comm_stats st;
        comm_get_stats(c, &st);
        step_bytes = c == rs->counted && st.bytes_sent >= rs->sent ? st.bytes_sent - rs->sent : 0;
        rs->counted = c;
        rs->sent = st.bytes_sent;
    }
    uint64_t peak = rs->zero ? rss("VmHWM") : 0; /* the CPU path's memory is the process's */
    rank_ctl_measured(rs->ctl, step_bytes, peak > rs->rss_base ? peak - rs->rss_base : 0);
}

static double elapsed(const struct run_state *rs)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9 - rs->t0;
}

static void clear_bar(const struct run_state *rs)
{
    if (rs->tty)
        fputs("\r\033[K", stdout);
}

/* A heartbeat's checkpoint_step: 0 when there is none. */
static uint64_t beat_ckpt(long last_checkpoint_step)
{
    return (uint64_t)(last_checkpoint_step > 0 ? last_checkpoint_step : 0);
}

static void on_step(const struct train_step_info *in, void *user)
{
    struct run_state *rs = user;
    if (heal.pending && !rs->quiet) {
        double now = wall_s();
        log_info("healed: step %ld done %.0f ms after the generation broke (next generation %.0f ms, training ring "
                 "%.0f ms, state restored %.0f ms, first step %.0f ms); broke at %.6f, step at %.6f", in->step,
                 1e3 * (now - heal.seen), 1e3 * (heal.generation - heal.seen), 1e3 * (heal.ring - heal.generation),
                 1e3 * (heal.restored - heal.ring), 1e3 * (now - heal.restored), heal.seen, now);
    }
    heal.pending = 0;
    if (rs->ctl) {
        report_measured(rs);
        rank_ctl_beat(rs->ctl, (uint64_t)in->step, in->loss, in->tokens_per_s, in->comm_frac,
                      beat_ckpt(*rs->ckpt_step));
    }
    if (rs->quiet)
        return;
    clear_bar(rs);
    printf("step %ld/%ld loss %.6f lr %.4e norm %.4f tok/s %.0f ms %.1f\n", in->step, in->steps,
           in->loss, in->lr, in->grad_norm, in->tokens_per_s, in->ms);
    if (rs->tty) {
        int width = 30, done = (int)(width * in->step / in->steps);
        double eta = (double)(in->steps - in->step) * in->ms / 1e3;
        printf("[%.*s%*s] %3d%% eta %.0fs", done, "==============================", width - done,
               "", (int)(100 * in->step / in->steps), eta);
    }
    fflush(stdout);
    if (rs->metrics) {
        fprintf(rs->metrics,
                "{\"step\": %ld, \"loss\": %.17g, \"lr\": %.17g, \"grad_norm\": %.17g, "
                "\"tokens_per_s\": %.1f, \"ms\": %.3f, \"comm_frac\": %.4f}\n",
                in->step, in->loss, in->lr, in->grad_norm, in->tokens_per_s, in->ms, in->comm_frac);
        fflush(rs->metrics);
    }
}

static void on_eval(long step, double val, void *user)
{
    struct run_state *rs = user;
    if (rs->quiet)
        return;
    clear_bar(rs);
    printf("val step %ld loss %.6f elapsed %.1fs\n", step, val, elapsed(rs));
    fflush(stdout);
    if (rs->metrics) {
        fprintf(rs->metrics, "{\"step\": %ld, \"val_loss\": %.17g, \"elapsed_s\": %.3f}\n", step,
                val, elapsed(rs));
        fflush(rs->metrics);
    }
}

static void on_checkpoint(long step, const char *path, void *user)
{
    struct run_state *rs = user;
    if (rs->quiet)
        return;
    clear_bar(rs);
    log_info("step %ld: checkpoint %s committed", step, path);
}

/* Prints n sampled tokens: bytes as text (escaped when not printable) for the
 * byte vocabulary, token ids otherwise. */
static void print_sample(const int *out, long long n, int V, long step)
{
    printf("sample at step %ld:\n", step);
    for (long long i = 0; i < n; i++) {
        if (V == 256 && (out[i] == '\n' || (out[i] >= 32 && out[i] < 127)))
            putchar(out[i]);
        else if (V == 256)
            printf("\\x%02x", out[i]);
        else
            printf("%d ", out[i]);
    }
    printf("\n");
}

/* The prompt a sample starts from: a newline for bytes, the data's first token otherwise. */
static int sample_prompt(const struct dataset *d, int V) { return V == 256 ? '\n' : d->tokens[0]; }

/* A run's exit status from the loop's result: 0 done, 1 failed; stopped, 0
 * standalone and 1 as a rank (a rank stopped before the end has not completed). */
static int end_status(int rc, int standalone, long step, const char *err)
{
    if (rc && !stop_flag) {
        log_error("%s", err);
        return 1;
    }
    if (stop_flag) {
        log_info("stopped at step %ld", step);
        return standalone ? 0 : 1;
    }
    return 0;
}

/* ---- a rank's trainer, CPU or GPU, behind one table ---- */

/* The GPU module's table, once loaded (run_trainer, run_rank). */
static const struct gpu_module *gpu;

/* A generation's communicators: the training one (the CPU's ring, or the
 * NCCL communicator inside the GPU trainer, formed from id) and the replica
 * ring. */
struct gen_comms {
    struct comm *train, *replica;
    struct gpu_zero *gpu;          /* GPU: its NCCL communicator is aborted with the rings */
    uint8_t id[GPU_ID_BYTES];      /* GPU: this generation's NCCL unique id */
};

static void abort_comms(void *arg)
{
    struct gen_comms *g = arg;
    comm_abort(g->train);
    comm_abort(g->replica);
    if (g->gpu)
        gpu->zero_abort(g->gpu);
}

struct rank_ops;

/* A trainer as this file drives it: what both trainers have, by pointer. */
struct rank_trainer {
    const struct rank_ops *ops;
    void *tr;                      /* struct trainer, or struct gpu_trainer; NULL: none yet */
    struct replica *rep;           /* its peer replicas, or NULL */
    struct job_spec *spec;         /* resolved; spec->seed orders the data */
    long *step, *last_checkpoint;
    int rank, world;
    size_t floats;                 /* per shard buffer, which the replica offers compare (the GPU
                                    * trainer without replicas: its state's bytes, as telling) */
    const struct zero *zero;       /* the CPU path's shards (report_measured); NULL on the GPU */
    int on_host;                   /* its state was copied to the host and its device freed (to_host):
                                    * a re-slice's source only */
};

/* The state each rank brings into a generation: the trainer (and replicas)
 * of the generation before, when it survived it. */
struct held_state {
    struct rank_trainer rt;        /* rt.tr NULL: a new process */
    int valid;                     /* whole at its step (not half received) */
};

/*
 * What run_rank and run_alone need of a trainer. The CPU one (train.h) and
 * the GPU one (gpu_train.h, through the module's table) differ in their
 * training communicator (a ring the process forms, or NCCL inside the GPU
 * trainer) and in where the state lives; the generations, the replicas and
 * the restore are the same code for both.
 */
struct rank_ops {
    /* This generation's training communicator: rank 0 makes the unique id
     * and sends it up, every rank gets it back (CPU: the ring formed in
     * gc->train; GPU: the id in gc->id). err set on failure. */
    int (*connect)(struct rank_ctl *ctl, int rank, int world, struct gen_comms *gc, char *err, size_t errlen);
    /* A trainer for (rank, world) on gc (world 1: none needed), with peer
     * replicas when the job has them and world > 1. 0 or an error, logged. */
    int (*create)(const struct job_spec *spec, int rank, int world, struct gen_comms *gc, long threads,
                  struct rank_trainer *rt);
    /* A survivor's trainer (same rank and world) onto gc. */
    int (*attach)(struct rank_trainer *rt, struct gen_comms *gc, char *err, size_t errlen);
    /* The generation broke and its communicators were aborted: let go of them. */
    void (*detach)(struct rank_trainer *rt);
    /* The ranks left the generation together (a yield): let go of the
     * communicator without aborting it, whose last collective a peer may
     * still be finishing (NULL: detach). */
    void (*leave)(struct rank_trainer *rt);
    void (*destroy)(struct rank_trainer *rt);
    int (*gather_u64)(struct rank_trainer *rt, const uint64_t *mine, size_t n, uint64_t *all);
    /* a collective of either communicator failed: the generation's failure, not the rank's */
    int (*broken)(struct rank_trainer *rt);
    int (*load)(struct rank_trainer *rt, const char *path, char *err, size_t errlen);
    /* the seed's weights, no moments, step 0 */
    int (*reset)(struct rank_trainer *rt, char *err, size_t errlen);
    int (*train)(struct rank_trainer *rt, long stop_after, const struct train_hooks *hooks, char *err,
                 size_t errlen);
    int (*sample)(struct rank_trainer *rt, int prompt, int *out, int n, char *err, size_t errlen);
    /* Another world or other ranks: every old rank's state, from memory,
     * re-sliced into rt (collective; held->rt is still alive beside rt). */
    /* Another world or other ranks (reslice_from_memory): where this
     * rank's own state of the plan's step is as a host block (weights, m,
     * v), in the old trainer (snapshot: its kept snapshot); *owned is what
     * the caller frees afterwards (NULL: nothing). 0 or an error. */
    int (*own_block)(const struct rank_trainer *old, int snapshot, const float **block, float **owned);
    /* The old world's blocks re-sliced into rt (collective; my_rc as
     * trainer_reslice's). */
    int (*reslice)(struct rank_trainer *rt, int my_rc, int old_world, int ncontrib, const float *const *mine,
                   int nmine, const int *from_rank, const int *from_index, char *err, size_t errlen);
    /* after a restore (a test hook; may be NULL) */
    void (*restored)(struct rank_trainer *rt);
    /* Before the trainer of another place is built: the state (and the
     * kept snapshot) copied to host memory and the device's memory freed,
     * so that two trainers are never on one device; own_block and the
     * replicas still work (NULL: nothing to free first). 0 or an error,
     * err set, rt unchanged. */
    int (*to_host)(struct rank_trainer *rt, char *err, size_t errlen);
};

/*
 * The unique id of this generation: rank 0 makes one with make() and sends
 * it up through the agent; every rank gets the daemon's back in id.
 */
static int generation_id(struct rank_ctl *ctl, int rank, int (*make)(uint8_t *id), const char *what, uint8_t *id,
                         char *err, size_t errlen)
{
    uint8_t mine[PROTO_UID_LEN];
    int rc;
    if (rank == 0 && (rc = make(mine)) != 0) {
        snprintf(err, errlen, "cannot create the %s's unique id (error %d)", what, rc);
        return rc < 0 ? rc : -EIO;
    }
    rc = rank_ctl_unique_id(ctl, rank == 0 ? mine : NULL, id, 300000);
    if (rc != 0)
        snprintf(err, errlen, "no unique id for this generation from the daemon: %s",
                 rc == -ECANCELED ? "stopped while waiting" : rc == -EAGAIN ? "a newer generation came" : strerror(-rc));
    return rc;
}

/* ---- the CPU trainer ---- */

/* --standalone (for the model line's wording). */
static int standalone_mode;

static void log_model(const struct trainer *tr, long threads, int standalone)
{
    const struct gpt_config *g = &tr->model.cfg;
    const struct job_spec *spec = &tr->spec;
    if (tr->rank != 0)
        return;
    log_info("model %s: L=%d NH=%d C=%d T=%d V=%d, %.3fM parameters; data %s (%s, %zu tokens, "
             "%zu for validation); batch %d = %d ranks x %d x %d micro-steps, seq_len %d; %ld threads%s",
             spec->model, g->L, g->NH, g->C, g->T, g->V, tr->model.layout.total / 1e6, spec->data,
             tr->data.format == DATA_TEXT ? "text" : "tokens", tr->data.ntokens,
             tr->data.ntokens - tr->data.ntrain, spec->batch, tr->world, spec->micro_batch, tr->accum,
             spec->seq_len, threads, standalone ? "" : " per rank");
}

/* The process's RSS before its trainer was built: what the trainer adds is
 * what the plan predicts (report_measured). */
static uint64_t rss_base;

/* Fault injection for tests: the loss of step N (1-based) becomes NaN. */
static void inject_faults(struct trainer *tr)
{
    const char *fault = getenv("MUSTER_FAULT_NAN_STEP");
    if (fault && atol(fault) > 0)
        tr->fault_nan_step = atol(fault) - 1;
    /* Test hook: rank 0 logs the state's fingerprint after every step and restore. */
    tr->fingerprint = getenv("MUSTER_FINGERPRINT") != NULL;
}

static int ring_id(uint8_t *id) { return comm_unique_id(COMM_RING, id); }

static int cpu_connect(struct rank_ctl *ctl, int rank, int world, struct gen_comms *gc, char *err, size_t errlen)
{
    uint8_t id[COMM_ID_BYTES];
    if (world == 1) /* nobody to talk to: no id, no ring */
        return 0;
    int rc = generation_id(ctl, rank, ring_id, "ring communicator", id, err, errlen);
    if (rc)
        return rc;
    /* A newer generation (or a stop) gives up a formation that waits for peers who are gone. */
    rc = comm_init_cancelable(&gc->train, COMM_RING, rank, world, id, 120000, rank_ctl_superseded(ctl));
    if (rc != 0)
        snprintf(err, errlen, "ring communicator (rank %d of %d) did not form: %s", rank, world, comm_strerror(rc));
    return rc;
}

static struct trainer *cpu(const struct rank_trainer *rt) { return rt->tr; }

static void cpu_destroy(struct rank_trainer *rt)
{
    if (rt->rep) {
        replica_free(rt->rep);
        free(rt->rep);
    }
    if (rt->tr) {
        trainer_free(rt->tr);
        free(rt->tr);
    }
    rt->tr = NULL;
    rt->rep = NULL;
}

static const struct rank_ops cpu_ops;

static int cpu_create(const struct job_spec *spec, int rank, int world, struct gen_comms *gc, long threads,
                      struct rank_trainer *rt)
{
    char err[1024];
    struct trainer *tr = calloc(1, sizeof(*tr));
    rss_base = rss("VmRSS");
    if (!tr || trainer_init(tr, spec, rank, world, gc->train, err, sizeof(err)) != 0) {
        log_error("%s", tr ? err : "out of memory");
        free(tr);
        return -1;
    }
    inject_faults(tr);
    *rt = (struct rank_trainer){&cpu_ops, tr, NULL, &tr->spec, &tr->step, &tr->last_checkpoint_step, rank, world,
                                tr->zero.plan.total, &tr->zero, 0};
    if (world > 1 && spec->replicate_every > 0) {
        rt->rep = calloc(1, sizeof(*rt->rep));
        if (!rt->rep || replica_init(rt->rep, &tr->zero, spec->replicate_every, rank) != 0) {
            log_error("out of memory for peer replicas (3 more copies of this rank's shard, %.1f MiB): set "
                      "replicate_every to 0", 3.0 * 12 * tr->zero.plan.total / 1048576.0);
            free(rt->rep);
            rt->rep = NULL;
            cpu_destroy(rt);
            return -1;
        }
        tr->replica = rt->rep;
    }
    log_model(tr, threads, standalone_mode);
    return 0;
}

static int cpu_attach(struct rank_trainer *rt, struct gen_comms *gc, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    zero_set_comm(&cpu(rt)->zero, gc->train);
    return 0;
}

static void cpu_detach(struct rank_trainer *rt) { zero_set_comm(&cpu(rt)->zero, NULL); }

static int cpu_gather_u64(struct rank_trainer *rt, const uint64_t *mine, size_t n, uint64_t *all)
{
    return zero_gather_u64(&cpu(rt)->zero, mine, n, all);
}

static int cpu_broken(struct rank_trainer *rt)
{
    return zero_failed(&cpu(rt)->zero) || (rt->rep && replica_failed(rt->rep));
}

static int cpu_load(struct rank_trainer *rt, const char *path, char *err, size_t errlen)
{
    return trainer_load(rt->tr, path, err, errlen);
}

static int cpu_reset(struct rank_trainer *rt, char *err, size_t errlen)
{
    struct trainer *tr = rt->tr;
    (void)err;
    (void)errlen;
    zero_init_weights(&tr->zero, (uint64_t)tr->spec.seed);
    memset(tr->zero.m, 0, sizeof(float) * tr->zero.plan.total);
    memset(tr->zero.v, 0, sizeof(float) * tr->zero.plan.total);
    tr->step = 0;
    tr->last_checkpoint_step = -1;
    return 0;
}

static int cpu_train(struct rank_trainer *rt, long stop_after, const struct train_hooks *hooks, char *err,
                     size_t errlen)
{
    return train_run(rt->tr, stop_after, hooks, &stop_flag, err, errlen);
}

static int cpu_sample(struct rank_trainer *rt, int prompt, int *out, int n, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    trainer_sample(rt->tr, prompt, out, n);
    return 0;
}

/* Who brings which old rank's block to a re-slice: old rank o is block
 * from_index[o] of rank src[o].rank (the same tables on every rank). 0 or
 * -ENOMEM; *ncontrib the most blocks any rank brings. */
static int reslice_tables(const struct replica_plan *plan, const struct replica_src *src, int world, int **from_rank,
                          int **from_index, int *ncontrib)
{
    const int w0 = plan->old_world;
    int *count = calloc((size_t)world, sizeof(int));
    *from_rank = malloc(sizeof(int) * (size_t)w0);
    *from_index = malloc(sizeof(int) * (size_t)w0);
    *ncontrib = 0;
    int rc = count && *from_rank && *from_index ? 0 : -ENOMEM;
    for (int o = 0; rc == 0 && o < w0; o++) {
        (*from_rank)[o] = src[o].rank;
        (*from_index)[o] = count[src[o].rank]++;
        *ncontrib = count[src[o].rank] > *ncontrib ? count[src[o].rank] : *ncontrib;
    }
    free(count);
    return rc;
}

/* Memory, another world or other ranks: every old rank's block, from the
 * rank that has it (the replicas a holder keeps, a survivor's own state),
 * re-sliced into rt's shards. A rank that cannot bring its blocks still
 * takes part, and all fail alike. */
static int reslice_from_memory(struct rank_trainer *rt, const struct held_state *held,
                               const struct replica_plan *plan, const struct replica_src *src, char *err,
                               size_t errlen)
{
    const int w0 = plan->old_world, me = rt->rank;
    int *from_rank, *from_index, ncontrib, nmine = 0;
    const float **mine = calloc((size_t)w0, sizeof(*mine));
    float *owned = NULL;
    int rc = reslice_tables(plan, src, rt->world, &from_rank, &from_index, &ncontrib);
    rc = rc ? rc : mine ? 0 : -ENOMEM;
    for (int o = 0; rc == 0 && o < w0; o++) {
        if (src[o].rank != me)
            continue;
        if (src[o].kind == SRC_HOLDER)
            mine[nmine++] = held->rt.rep->slot[src[o].slot];
        else if ((rc = rt->ops->own_block(&held->rt, src[o].kind == SRC_SNAP, &mine[nmine], &owned)) == 0)
            nmine++;
    }
    if (rc)
        snprintf(err, errlen, "re-slicing the state of %d ranks for %d: %s", w0, rt->world,
                 rc == -ENOMEM ? "out of host memory" : "copying this rank's state from its device failed");
    int brc = rt->ops->reslice(rt, rc, w0, ncontrib, mine, nmine, from_rank, from_index, err, errlen);
    free(from_rank);
    free(from_index);
    free(mine);
    free(owned);
    return rc ? rc : brc;
}

static int cpu_own_block(const struct rank_trainer *old, int snapshot, const float **block, float **owned)
{
    struct trainer *tr = old->tr;
    if (snapshot)
        zero_revert(&tr->zero); /* its own state of the plan's step is the snapshot */
    *block = tr->zero.params; /* weights, m and v back to back */
    *owned = NULL;
    return 0;
}

static int cpu_reslice(struct rank_trainer *rt, int my_rc, int old_world, int ncontrib, const float *const *mine,
                       int nmine, const int *from_rank, const int *from_index, char *err, size_t errlen)
{
    return trainer_reslice(rt->tr, my_rc, old_world, ncontrib, mine, nmine, from_rank, from_index, err, errlen);
}

static void cpu_restored(struct rank_trainer *rt)
{
    if (cpu(rt)->fingerprint)
        trainer_log_fingerprint(rt->tr, "restored at");
}

static const struct rank_ops cpu_ops = {
    cpu_connect, cpu_create, cpu_attach, cpu_detach, NULL, cpu_destroy, cpu_gather_u64, cpu_broken,
    cpu_load, cpu_reset, cpu_train, cpu_sample, cpu_own_block, cpu_reslice, cpu_restored, NULL,
};

/* ---- the GPU trainer (worker/train/gpu/, in the GPU module) ---- */

static struct gpu_trainer *gpt(const struct rank_trainer *rt) { return rt->tr; }

static int nccl_id(uint8_t *id) { return gpu->unique_id(id); }

static int gpu_connect(struct rank_ctl *ctl, int rank, int world, struct gen_comms *gc, char *err, size_t errlen)
{
    (void)world;
    return generation_id(ctl, rank, nccl_id, "NCCL communicator", gc->id, err, errlen);
}

static void gpu_destroy(struct rank_trainer *rt)
{
    if (rt->tr) { /* the trainer frees its replicas */
        gpu->trainer_free(rt->tr);
        free(rt->tr);
    }
    rt->tr = NULL;
    rt->rep = NULL;
}

static const struct rank_ops gpu_ops;

static int gpu_create(const struct job_spec *spec, int rank, int world, struct gen_comms *gc, long threads,
                      struct rank_trainer *rt)
{
    char err[2048];
    struct gpu_trainer *tr = calloc(1, sizeof(*tr));
    (void)threads;
    /* the NCCL communicator forms inside: a newer generation cancels it */
    int rc = tr ? gpu->trainer_init(tr, spec, rank, world, world > 1 ? gc->id : NULL, (const int *)superseded, err,
                                    sizeof(err))
                : -ENOMEM;
    if (rc != 0) {
        if (rc == -ECANCELED)
            log_warn("%s", err);
        else
            log_error("%s", tr ? err : "out of memory");
        free(tr);
        return rc;
    }
    *rt = (struct rank_trainer){&gpu_ops, tr, NULL, &tr->spec, &tr->step, &tr->last_checkpoint_step, rank, world,
                                gpu->zero_state_bytes(tr->z), NULL, 0};
    if (world > 1 && spec->replicate_every > 0) {
        if (gpu->trainer_replicas(tr, spec->replicate_every, err, sizeof(err)) != 0) {
            log_error("%s", err);
            gpu_destroy(rt);
            return -1;
        }
        rt->rep = tr->replica;
        rt->floats = rt->rep->floats;
    }
    gc->gpu = tr->z;
    char name[128];
    gpu->device_name(name, sizeof(name));
    if (rank == 0)
        log_info("model %s on %s: L=%d NH=%d C=%d T=%d V=%d; batch %d = %d ranks x %d x %d micro-steps, "
                 "seq_len %d; bf16 compute, fp32 master weights; %.3f GiB of model state per rank",
                 spec->model, name, tr->cfg.L, tr->cfg.NH, tr->cfg.C, tr->cfg.T, tr->cfg.V, spec->batch, world,
                 tr->spec.micro_batch, tr->accum, tr->spec.seq_len, gpu->zero_state_bytes(tr->z) / 1073741824.0);
    return 0;
}

static int gpu_attach(struct rank_trainer *rt, struct gen_comms *gc, char *err, size_t errlen)
{
    int rc = gpu->trainer_set_comm(rt->tr, gc->id, (const int *)superseded, err, errlen);
    gc->gpu = gpt(rt)->z;
    return rc;
}

/* The training thread owns the communicator: it aborts it here (the
 * control thread's abort only raised the flag). */
static void gpu_detach(struct rank_trainer *rt)
{
    gpu->zero_abort(gpt(rt)->z);
    gpu->zero_release(gpt(rt)->z);
}

static void gpu_leave(struct rank_trainer *rt) { gpu->zero_release(gpt(rt)->z); }

static int gpu_gather_u64(struct rank_trainer *rt, const uint64_t *mine, size_t n, uint64_t *all)
{
    return gpu->zero_gather_u64(gpt(rt)->z, mine, n, all);
}

static int gpu_broken(struct rank_trainer *rt) { return gpu->trainer_failed(rt->tr); }

static int gpu_load(struct rank_trainer *rt, const char *path, char *err, size_t errlen)
{
    return gpu->trainer_load(rt->tr, path, err, errlen);
}

static int gpu_reset(struct rank_trainer *rt, char *err, size_t errlen) { return gpu->trainer_reset(rt->tr, err, errlen); }

static int gpu_train(struct rank_trainer *rt, long stop_after, const struct train_hooks *hooks, char *err,
                     size_t errlen)
{
    return gpu->train_run(rt->tr, stop_after, hooks, &stop_flag, err, errlen);
}

static int gpu_sample(struct rank_trainer *rt, int prompt, int *out, int n, char *err, size_t errlen)
{
    return gpu->trainer_sample(rt->tr, prompt, out, n, err, errlen);
}

/* Its own state, copied down from the old trainer (whose aborted
 * communicator is let go first) or from its kept snapshot. */
static int gpu_own_block(const struct rank_trainer *old, int snapshot, const float **block, float **owned)
{
    float *b = malloc(3 * sizeof(float) * old->floats);
    int rc = b ? gpu->trainer_read_state(old->tr, snapshot, b) : -ENOMEM;
    if (rc)
        free(b);
    *block = rc ? NULL : b;
    *owned = rc ? NULL : b;
    return rc;
}

static int gpu_reslice(struct rank_trainer *rt, int my_rc, int old_world, int ncontrib, const float *const *mine,
                       int nmine, const int *from_rank, const int *from_index, char *err, size_t errlen)
{
    return gpu->trainer_reslice(rt->tr, my_rc, old_world, ncontrib, mine, nmine, from_rank, from_index, err,
                                errlen);
}

static int gpu_to_host(struct rank_trainer *rt, char *err, size_t errlen)
{
    int rc = gpu->trainer_to_host(rt->tr, err, errlen);
    rt->on_host = rc == 0;
    return rc;
}

static const struct rank_ops gpu_ops = {
    gpu_connect, gpu_create, gpu_attach, gpu_detach, gpu_leave, gpu_destroy, gpu_gather_u64, gpu_broken,
    gpu_load, gpu_reset, gpu_train, gpu_sample, gpu_own_block, gpu_reslice, NULL, gpu_to_host,
};

/* The trainer table for a device ("cpu" or "gpu"); NULL, logged, when the GPU module cannot be loaded. */
static const struct rank_ops *ops_for(const char *device)
{
    char err[2048];
    if (strcmp(device, "gpu") != 0)
        return &cpu_ops;
    if (!(gpu = gpu_module_load(err, sizeof(err)))) {
        log_error("--device gpu: %s", err);
        return NULL;
    }
    return &gpu_ops;
}

/* ---- the run ---- */

/* Trains from rt's current step with this process's hooks (only rank 0
 * prints progress; every rank heartbeats it). The loop's result, err set. */
static int run_loop(struct rank_trainer *rt, struct rank_ctl *ctl, long long stop_after, const char *metrics_path,
                    char *err, size_t errlen)
{
    struct run_state rs = {.tty = rt->rank == 0 && isatty(STDOUT_FILENO), .steps = rt->spec->steps, .ctl = ctl,
                           .quiet = rt->rank != 0, .ckpt_step = rt->last_checkpoint, .zero = rt->zero,
                           .counted = rt->zero ? rt->zero->comm : NULL, .rss_base = rss_base};
    if (metrics_path && rt->rank == 0 && !(rs.metrics = fopen(metrics_path, "a"))) {
        snprintf(err, errlen, "--metrics: %s: %s", metrics_path, strerror(errno));
        return -EINVAL;
    }
    if (ctl)
        rank_ctl_beat(ctl, (uint64_t)*rt->step, NAN, 0, 0, beat_ckpt(*rt->last_checkpoint));
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    rs.t0 = elapsed(&(struct run_state){.t0 = 0});
    struct train_hooks hooks = {on_step, on_eval, on_checkpoint, &rs, &checkpoint_requests, &checkpoints_answered,
                                &yield_flag};
    int rc = rt->ops->train(rt, (long)stop_after, &hooks, err, errlen);
    clear_bar(&rs);
    fflush(stdout);
    if (rs.metrics)
        fclose(rs.metrics);
    return rc;
}

/* n sampled tokens printed, after a completed run. 0, or 1 when sampling failed. */
static int maybe_sample(struct rank_trainer *rt, long long sample)
{
    char err[1024];
    if (sample <= 0)
        return 0;
    const struct dataset *d = rt->ops == &cpu_ops ? &cpu(rt)->data : &gpt(rt)->data;
    const int V = rt->ops == &cpu_ops ? cpu(rt)->model.cfg.V : gpt(rt)->cfg.V;
    int *out = malloc(sizeof(int) * (size_t)sample);
    if (!out || rt->ops->sample(rt, sample_prompt(d, V), out, (int)sample, err, sizeof(err))) {
        log_error("--sample: %s", out ? err : "out of memory");
        free(out);
        return 1;
    }
    print_sample(out, sample, V, *rt->step);
    free(out);
    return 0;
}

/* One process: --standalone, or a rank of a world of 1, on either device. */
static int run_alone(const struct rank_ops *ops, const struct job_spec *spec, int standalone, struct rank_ctl *ctl,
                     const char *resume, long long sample, long long stop_after, const char *metrics_path,
                     long threads)
{
    char err[2048];
    struct gen_comms gc = {0};
    struct rank_trainer rt;
    if (ops->create(spec, 0, 1, &gc, threads, &rt) != 0)
        return 1;
    if (ctl)
        rank_ctl_on_abort(ctl, abort_comms, &gc);
    if (resume) { /* a rank's -ENOENT (no rank finds a checkpoint there): a fresh start */
        int lrc = ops->load(&rt, resume, err, sizeof(err));
        if (lrc && (lrc != -ENOENT || standalone)) {
            log_error("%s", err);
            if (ctl)
                rank_ctl_on_abort(ctl, NULL, NULL);
            ops->destroy(&rt);
            return 1;
        }
        if (lrc == 0)
            log_info("resumed from %s at step %ld", resume, *rt.step);
    }
    int rc = run_loop(&rt, ctl, stop_after, metrics_path, err, sizeof(err));
    int status = end_status(rc, standalone, *rt.step, err);
    if (status == 0)
        status = maybe_sample(&rt, sample);
    if (ctl)
        rank_ctl_on_abort(ctl, NULL, NULL);
    ops->destroy(&rt);
    return status;
}

/*
 * The replica ring of this generation (replica.h): rank 0 makes its id, the
 * training communicator carries it to every rank, each joins at its position.
 */
static int open_replica_ring(struct rank_trainer *rt, int pos, struct comm **out, char *err, size_t errlen)
{
    enum { WORDS = COMM_ID_BYTES / 8 };
    uint64_t id[WORDS] = {0};
    uint64_t *all = malloc(sizeof(id) * (size_t)rt->world);
    if (!all) {
        snprintf(err, errlen, "out of memory for the replica ring's id");
        return -ENOMEM;
    }
    int rc = rt->rank == 0 ? comm_unique_id(COMM_RING, (uint8_t *)id) : 0;
    if (rc)
        log_error("cannot create the replica ring's unique id: %s", comm_strerror(rc));
    int grc = rt->ops->gather_u64(rt, id, WORDS, all); /* every rank takes part, even so */
    if (grc == 0 && rc == 0)
        rc = comm_init_cancelable(out, COMM_RING, pos, rt->world, (const uint8_t *)all, 60000, superseded);
    if (grc)
        rc = grc;
    if (rc)
        snprintf(err, errlen, "replica ring (position %d of %d) did not form: %s", pos, rt->world,
                 comm_strerror(rc));
    free(all);
    return rc;
}

/* Where this generation's state came from, for the log. */
static const char *const restore_words[] = {"", "peers' memory", "the last committed checkpoint", "the seed"};

/* Memory, the same ranks: survivors keep or go back, holders ship replicas back along the ring. */
static int restore_in_place(struct rank_trainer *rt, const struct replica_plan *plan, const struct replica_src *src,
                            const int *pos, char *err, size_t errlen)
{
    int rc = rt->rep ? replica_restore(rt->rep, plan, src, pos, rt->world) : 0;
    if (rc)
        snprintf(err, errlen, "restoring from the peers' replicas: %s", comm_strerror(rc));
    return rc;
}

/* Whether every rank of the generation runs a step alike (all: the
 * gathered offers): as many micro-steps of as many sequences, hence the same
 * collectives in the same order. Ranks that differ would not meet in their
 * next collective (on GPUs a hang until NCCL's timeout); every rank sees
 * the same offers and fails alike, with err naming the difference. */
static int same_step_shape(const struct rank_trainer *rt, const uint64_t *all, char *err, size_t errlen)
{
    const struct job_spec *s = rt->spec;
    for (int r = 0; r < rt->world; r++) {
        const uint64_t theirs = all[(size_t)r * REPLICA_OFFER + OFFER_MICRO];
        if (theirs != (uint64_t)s->micro_batch) {
            snprintf(err, errlen, "the ranks of this generation disagree on the shape of a step (batch %d over "
                     "%d ranks): rank %d runs micro-batches of %llu sequences, this rank (%d) of %d",
                     s->batch, rt->world, r, (unsigned long long)theirs, rt->rank, s->micro_batch);
            return -EPROTO;
        }
    }
    return 0;
}

/* The facts the ranks of a generation must agree on, logged by each: a
 * later collective mismatch names its cause here. Rank 0's line also says
 * where the generation's state came from. */
static void log_generation(const struct rank_trainer *rt, uint64_t generation, enum proto_restore from)
{
    const struct job_spec *s = rt->spec;
    const int accum = s->batch / (s->micro_batch * rt->world);
    if (rt->rank == 0)
        log_info("generation %llu: training from step %ld (state from %s); rank 0 of %d, %d micro-step(s) of %d "
                 "sequence(s) per step", (unsigned long long)generation, *rt->step, restore_words[from], rt->world,
                 accum, s->micro_batch);
    else
        log_info("generation %llu: rank %d of %d at step %ld, %d micro-step(s) of %d sequence(s) per step, state "
                 "from %s", (unsigned long long)generation, rt->rank, rt->world, *rt->step, accum, s->micro_batch,
                 restore_words[from]);
}

/*
 * Collective, at the start of every generation of a world > 1 (replica.h):
 * the ranks' offers gathered, the replica ring formed, then the state of
 * the latest step every rank of the generation before has in memory (kept
 * in place, or re-sliced when the world or the ranks changed and the
 * trainer can), else the last committed checkpoint, else the seed, into
 * rt. held: what this rank brings (held->rt.tr may be rt->tr itself).
 * *valid: rt's state is whole at its step (not while a replica or
 * checkpoint is half received); *broke: the failure was the generation's
 * (a collective failed). 0 or an error with err set.
 */
static int restore_state(struct rank_trainer *rt, const struct held_state *held, struct gen_comms *gc,
                         const struct rank_assign *as, enum proto_restore *from, int *valid, int *broke, char *err,
                         size_t errlen)
{
    const int world = rt->world;
    const struct rank_trainer *ht = held->rt.tr && held->valid ? &held->rt : NULL;
    uint64_t mine[REPLICA_OFFER];
    replica_offer(ht ? ht->rep : NULL, ht != NULL, ht ? ht->rank : 0, ht ? ht->world : 0, ht ? ht->floats : 0,
                  ht ? *ht->step : 0, as->node_rank, as->local_rank, (uint64_t)(ht ? ht->spec->seed : rt->spec->seed),
                  ht ? *ht->last_checkpoint : -1, mine);
    mine[OFFER_MICRO] = (uint64_t)rt->spec->micro_batch;
    uint64_t *all = malloc(sizeof(mine) * (size_t)world);
    int *pos = malloc(sizeof(int) * (size_t)world);
    struct replica_src *src = NULL; /* one per rank of the survivors' generation */
    struct replica_plan plan;
    int rc = all && pos ? 0 : -ENOMEM;
    if (rc == 0 && (rc = rt->ops->gather_u64(rt, mine, REPLICA_OFFER, all)) != 0) {
        snprintf(err, errlen, "gathering what each rank holds: %s", comm_strerror(rc));
        *broke = 1;
        goto out;
    }
    if (rc == 0)
        rc = same_step_shape(rt, all, err, errlen);
    if (rc == 0) {
        uint64_t w0 = (uint64_t)world; /* replica_plan refuses more than REPLICA_MAX_WORLD */
        for (int r = 0; r < world; r++)
            if (all[(size_t)r * REPLICA_OFFER + OFFER_OLD_WORLD] > w0)
                w0 = all[(size_t)r * REPLICA_OFFER + OFFER_OLD_WORLD];
        if (!(src = malloc(sizeof(*src) * (w0 < REPLICA_MAX_WORLD ? w0 : REPLICA_MAX_WORLD))))
            rc = -ENOMEM;
    }
    if (rc == 0 && rt->rank == 0 && LOG_DEBUG <= log_threshold)
        for (int r = 0; r < world; r++) {
            const uint64_t *o = all + (size_t)r * REPLICA_OFFER;
            log_debug("offer of rank %d: state %llu (rank %lld of %llu) step %llu snapshot %lld, holds rank %lld's "
                      "replicas of steps %lld and %lld", r, (unsigned long long)o[OFFER_HAS_STATE],
                      (long long)o[OFFER_OLD_RANK] - 1, (unsigned long long)o[OFFER_OLD_WORLD],
                      (unsigned long long)o[OFFER_STEP], (long long)o[OFFER_SNAP] - 1, (long long)o[OFFER_PARTNER] - 1,
                      (long long)o[OFFER_SLOT0] - 1, (long long)o[OFFER_SLOT1] - 1);
        }
    if (rc == 0)
        rc = replica_positions(all, world, pos);
    if (rc == 0 && (rc = replica_plan(all, world, pos, &plan, src)) == -EINVAL) {
        if (rt->rank == 0)
            log_warn("the survivors' states disagree (another model or world size): not restored from memory");
        memset(&plan, 0, sizeof(plan));
        plan.step = -1;
        plan.last_checkpoint = -1;
        rc = 0;
    }
    if (rc == 0 && rt->rep) {
        rc = open_replica_ring(rt, pos[rt->rank], &gc->replica, err, errlen);
        if (rc == 0)
            replica_attach(rt->rep, gc->replica);
        *broke = rc != 0;
    }
    if (rc == -ENOMEM)
        snprintf(err, errlen, "out of memory while choosing the state of this generation");
    if (rc)
        goto out;
    if (plan.step >= 0) {
        const int in_place = plan.in_place; /* the same on every rank: a function of the offers */
        *valid = in_place && (src[rt->rank].rank == rt->rank && src[rt->rank].kind != SRC_HOLDER);
        rc = in_place ? restore_in_place(rt, &plan, src, pos, err, errlen)
                      : reslice_from_memory(rt, held, &plan, src, err, errlen);
        if (rc) {
            *broke = 1;
            goto out;
        }
        *rt->step = plan.step;
        rt->spec->seed = (int64_t)plan.seed;
        *rt->last_checkpoint = plan.last_checkpoint;
        if (rt->rep && !in_place)
            replica_forget(rt->rep, -1);
        *valid = 1;
        *from = PROTO_RESTORE_MEMORY;
        if (rt->rank == 0) {
            int back = 0, shipped = 0;
            for (int o = 0; o < plan.old_world; o++) {
                back += src[o].kind == SRC_SNAP;
                shipped += src[o].kind == SRC_HOLDER;
            }
            log_info("state of step %ld from peers' memory%s: %d rank(s) kept theirs (%d went back to their "
                     "snapshot), %d restored from their holders' replicas%s", plan.step,
                     in_place ? "" : ", re-sliced", plan.survivors, back, shipped,
                     in_place ? "" : (plan.old_world == world ? " (ranks renumbered)" : " for another world size"));
        }
        goto out;
    }
    if (plan.survivors > 0 && rt->rank == 0) {
        char why[96];
        if (rt->rep)
            snprintf(why, sizeof(why), "rank %d and the rank holding its replica were lost", plan.lost);
        else
            snprintf(why, sizeof(why), "replicate_every is 0");
        log_warn("no step is held in memory for every rank (%s): every rank falls back to %s", why,
                 rt->spec->checkpoint_dir[0] ? "the last committed checkpoint" : "the seed");
    }
    /* Every rank asks, whatever its own view of checkpoint_dir holds: the
     * answer is collective (a node-local directory may be empty on a new node). */
    *valid = 0;
    rc = rt->spec->checkpoint_dir[0] ? rt->ops->load(rt, rt->spec->checkpoint_dir, err, errlen) : -ENOENT;
    if (rc == 0) {
        *from = PROTO_RESTORE_DISK;
        log_info("resumed from %s at step %ld", rt->spec->checkpoint_dir, *rt->step); /* each rank: its own shard */
    } else if (rc != -ENOENT) {
        *broke = rt->ops->broken(rt);
        goto out;
    } else {
        rc = 0;
        /* back to the start: the seed's weights, no moments (a new trainer starts there) */
        if (plan.survivors > 0 && (rc = rt->ops->reset(rt, err, errlen)) != 0)
            goto out;
        *from = PROTO_RESTORE_SEED;
    }
    *valid = 1;
    if (rt->rep) /* what the replicas held belongs to the abandoned run */
        replica_forget(rt->rep, -1);
out:
    free(all);
    free(pos);
    free(src);
    return rc;
}

/*
 * A rank of a world > 1 (docs/training.md, "Healing in place"), on either
 * device: the process lives across generations. When a generation breaks
 * (a peer died, the agent parked it, a newer ASSIGN came), the rank aborts
 * its communicators, keeps its trainer (model state, data, threads; on the
 * GPU the CUDA context and the device state), waits for the next generation
 * of its slot, forms the communicators anew and restores (restore_state);
 * when its rank or the world size changed it builds the trainer of its new
 * place and re-slices the state into it (the GPU trainer first moves its
 * state to the host and leaves the device: one trainer on a GPU at a time).
 * It exits when the job is done, when stopped, and when it fails on its own.
 */
static int run_rank(const struct rank_ops *ops, const struct job_spec *spec, struct rank_ctl *ctl,
                    const struct rank_assign *as, long long sample, long long stop_after, const char *metrics_path,
                    long threads)
{
    struct gen_comms gc = {0};
    struct rank_trainer rt = {.ops = ops};
    int valid = 0, status = 1;
    struct rank_assign at = *as;
    char err[2048];
    at.job = NULL;
    superseded = rank_ctl_superseded(ctl);
    rank_ctl_set_rejoin(ctl);
    for (;;) {
        int broke = 1; /* a communicator that does not form: the generation broke */
        int rc = ops->connect(ctl, at.rank, at.world, &gc, err, sizeof(err));
        if (rc == -ETIMEDOUT) { /* no id or no peers for minutes: no generation is coming; the daemon decides */
            log_error("%s", err);
            break;
        }
        if (rc == 0 && rt.on_host && rt.rank == at.rank && rt.world == at.world && valid) {
            /* its place came back after a cancelled formation, but its state is on the host now:
             * a new trainer takes it, and the generation restores it as a new rank's */
            log_warn("generation %llu: this rank's state was copied off its GPU for a re-slice that did not "
                     "happen: it is restored like a new rank's", (unsigned long long)at.generation);
            valid = 0;
        }
        if (rc == 0 && rt.tr && !rt.on_host && ops->to_host && (rt.rank != at.rank || rt.world != at.world)) {
            /* a re-slice: the old trainer leaves the device before the new one is built */
            char why[1024];
            if (ops->to_host(&rt, why, sizeof(why)) != 0)
                log_warn("%s: the old trainer stays on the device while the new one is built", why);
            else
                log_info("generation %llu: the state of rank %d of %d is in host memory and its trainer left the "
                         "device before the one of rank %d of %d is built", (unsigned long long)at.generation,
                         rt.rank, rt.world, at.rank, at.world);
        }
        struct held_state held = {rt, valid};
        struct rank_trainer nrt = rt;
        if (rc == 0 && (!rt.tr || rt.on_host || rt.rank != at.rank || rt.world != at.world)) {
            /* a GPU trainer's communicator forms here: cancelled by a newer generation, it waits for that one */
            if ((rc = ops->create(spec, at.rank, at.world, &gc, threads, &nrt)) == -ECANCELED)
                snprintf(err, sizeof(err), "the NCCL communicator's formation was cancelled: a newer generation came");
            else if (rc != 0)
                break;
        } else if (rc == 0) {
            rc = ops->attach(&rt, &gc, err, sizeof(err));
        }
        heal.ring = wall_s(); /* the training communicator formed (NCCL: in the trainer) */
        if (rc == 0) {
            rank_ctl_on_abort(ctl, abort_comms, &gc);
            enum proto_restore from = PROTO_RESTORE_NONE;
            broke = 0;
            rc = restore_state(&nrt, &held, &gc, &at, &from, &valid, &broke, err, sizeof(err));
            if (nrt.tr != rt.tr) { /* the new place's trainer takes over, whatever came of it */
                if (rt.tr)
                    ops->destroy(&rt);
                rt = nrt;
            }
            heal.restored = wall_s();
            if (rc == 0 && ops->restored)
                ops->restored(&rt);
            if (rc == 0) {
                log_generation(&rt, at.generation, from);
                rank_ctl_restored(ctl, from, (uint64_t)*rt.step);
                rc = run_loop(&rt, ctl, stop_after, metrics_path, err, sizeof(err));
                if (rc == 0 && !stop_flag) {
                    status = 0;
                    break;
                }
                broke = rc == TRAIN_YIELDED || (rc && ops->broken(&rt));
            }
            if (!stop_flag && !broke) {
                log_error("%s", err);
                break;
            }
        }
        if (stop_flag) {
            if (rt.tr)
                log_info("stopped at step %ld", *rt.step);
            break;
        }
        /* The generation is over (it broke, or the ranks left it together for
         * a grow): keep the state, drop the communicators, wait for the next one. */
        heal.seen = wall_s();
        if (rc == TRAIN_YIELDED) {
            log_info("generation %llu: left at the boundary of step %ld with the other ranks (the job grows); "
                     "waiting for the next generation", (unsigned long long)at.generation, *rt.step);
            rank_ctl_yielded(ctl);
        } else {
            log_warn("generation %llu broke at step %ld: %s; waiting for the next generation",
                     (unsigned long long)at.generation, rt.tr ? *rt.step : 0L, err);
        }
        rank_ctl_on_abort(ctl, NULL, NULL);
        comm_abort(gc.train);
        comm_abort(gc.replica);
        if (rt.rep)
            replica_detach(rt.rep);
        if (rt.tr && rc == TRAIN_YIELDED && ops->leave)
            ops->leave(&rt);
        else if (rt.tr)
            ops->detach(&rt);
        comm_destroy(gc.train);
        comm_destroy(gc.replica);
        gc = (struct gen_comms){0};
        valid = rt.tr && valid;
        if (rank_ctl_next_generation(ctl, &at) != 0)
            break; /* stopped while waiting */
        heal.generation = wall_s();
        heal.pending = 1;
        log_info("generation %llu: rejoining in place as rank %d of %d%s", (unsigned long long)at.generation, at.rank,
                 at.world, valid ? "" : " (this rank's state was not whole: it is restored like a new rank's)");
    }
    rank_ctl_on_abort(ctl, NULL, NULL);
    if (status == 0)
        status = maybe_sample(&rt, sample);
    if (rt.tr)
        ops->destroy(&rt);
    comm_destroy(gc.train);
    comm_destroy(gc.replica);
    return status;
}

int main(int argc, char **argv)
{
    static const struct option opts[] = {
        {"standalone", no_argument, NULL, OPT_STANDALONE},
        {"job", required_argument, NULL, OPT_JOB},
        {"model", required_argument, NULL, OPT_MODEL},
        {"data", required_argument, NULL, OPT_DATA},
        {"steps", required_argument, NULL, OPT_STEPS},
        {"batch", required_argument, NULL, OPT_BATCH},
        {"micro-batch", required_argument, NULL, OPT_MICRO},
        {"seq-len", required_argument, NULL, OPT_SEQ},
        {"lr", required_argument, NULL, OPT_LR},
        {"lr-min", required_argument, NULL, OPT_LR_MIN},
        {"warmup", required_argument, NULL, OPT_WARMUP},
        {"weight-decay", required_argument, NULL, OPT_WD},
        {"grad-clip", required_argument, NULL, OPT_CLIP},
        {"val-fraction", required_argument, NULL, OPT_VALFRAC},
        {"eval-every", required_argument, NULL, OPT_EVAL_EVERY},
        {"eval-batches", required_argument, NULL, OPT_EVAL_BATCHES},
        {"seed", required_argument, NULL, OPT_SEED},
        {"checkpoint-dir", required_argument, NULL, OPT_CKDIR},
        {"checkpoint-every", required_argument, NULL, OPT_CKEVERY},
        {"resume", required_argument, NULL, OPT_RESUME},
        {"stop-after", required_argument, NULL, OPT_STOP_AFTER},
        {"sample", required_argument, NULL, OPT_SAMPLE},
        {"threads", required_argument, NULL, OPT_THREADS},
        {"metrics", required_argument, NULL, OPT_METRICS},
        {"log-level", required_argument, NULL, OPT_LOGLEVEL},
        {"help", no_argument, NULL, OPT_HELP},
        {"version", no_argument, NULL, OPT_VERSION},
        {"device", required_argument, NULL, OPT_DEVICE},
        {NULL, 0, NULL, 0},
    };
    int standalone = 0;
    const char *device = NULL;
    const char *job = NULL, *resume = NULL, *metrics_path = NULL;
    long long stop_after = 0, sample = 0, threads = 0;
    json_t *over = json_object();
    char err[1024];
    int c;

    log_set_prog("muster-train");
    const char *blas_core = blas_core_fix();
    while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        long long iv;
        double dv;
        switch (c) {
        case OPT_STANDALONE: standalone = 1; continue;
        case OPT_JOB: job = optarg; continue;
        case OPT_RESUME: resume = optarg; continue;
        case OPT_METRICS: metrics_path = optarg; continue;
        case OPT_DEVICE:
            if (strcmp(optarg, "cpu") != 0 && strcmp(optarg, "gpu") != 0) {
                fprintf(stderr, "muster-train: --device: expected cpu or gpu, got \"%s\"\n", optarg);
                goto usage_error;
            }
            device = optarg;
            continue;
        case OPT_HELP:
            usage(stdout);
            json_decref(over);
            return 0;
        case OPT_VERSION:
            printf("muster-train %s\n", MUSTER_VERSION);
            json_decref(over);
            return 0;
        case OPT_LOGLEVEL:
            if (log_set_level_name(optarg)) {
                fprintf(stderr, "muster-train: --log-level: expected error, warn, info or debug\n");
                goto usage_error;
            }
            continue;
        case OPT_STOP_AFTER:
        case OPT_SAMPLE:
        case OPT_THREADS:
            if (parse_long(optarg, &iv) || iv < 0 || iv > 100000000) {
                fprintf(stderr, "muster-train: %s: expected a non-negative integer, got \"%s\"\n",
                        argv[optind - 1], optarg);
                goto usage_error;
            }
            *(c == OPT_STOP_AFTER ? &stop_after : c == OPT_SAMPLE ? &sample : &threads) = iv;
            continue;
        case '?':
            fprintf(stderr, "Try 'muster-train --help'.\n");
            goto usage_error;
        default: break;
        }
        size_t k = 0;
        while (k < sizeof(key_flags) / sizeof(key_flags[0]) && key_flags[k].opt != c)
            k++;
        if (k == sizeof(key_flags) / sizeof(key_flags[0]))
            goto usage_error;
        json_t *v = NULL;
        if (key_flags[k].kind == 's')
            v = json_string(optarg);
        else if (key_flags[k].kind == 'i' && !parse_long(optarg, &iv))
            v = json_integer(iv);
        else if (key_flags[k].kind == 'd' && !parse_double(optarg, &dv))
            v = json_real(dv);
        if (!v) {
            fprintf(stderr, "muster-train: --%s: expected %s, got \"%s\"\n", opts[c - OPT_STANDALONE].name,
                    key_flags[k].kind == 'i' ? "an integer" : "a number", optarg);
            goto usage_error;
        }
        json_object_set_new(over, key_flags[k].key, v);
    }
    if (optind < argc) {
        fprintf(stderr, "muster-train: unexpected argument \"%s\"\n", argv[optind]);
        goto usage_error;
    }
    if (blas_core)
        log_debug("OpenBLAS chose its generic Prescott kernels on a CPU with AVX2: switched to %s "
                  "(set OPENBLAS_CORETYPE to choose yourself)", blas_core);
    if (!standalone && !rank_ctl_present()) {
        fprintf(stderr, "muster-train: not started by muster-worker (no MUSTER_CTL_FD): run it with "
                        "--standalone, or let muster-worker start it\n");
        goto usage_error;
    }
    if (!standalone && (job || resume)) {
        fprintf(stderr, "muster-train: --job and --resume go with --standalone; a rank gets its job from "
                        "its agent and resumes from the job's checkpoint_dir\n");
        goto usage_error;
    }
    struct rank_ctl *ctl = NULL;
    struct rank_assign assign = {0};
    if (!standalone) {
        int orc = rank_ctl_open(&ctl, &assign, &stop_flag, 30000, err, sizeof(err));
        if (orc) {
            log_error("%s", err);
            json_decref(over);
            return 1;
        }
        rank_ctl_on_checkpoint(ctl, &checkpoint_requests);
        rank_ctl_on_yield(ctl, &yield_flag);
        char prog[32];
        snprintf(prog, sizeof(prog), "muster-train[%d]", assign.rank);
        log_set_prog(strdup(prog));
    }
    const int world = standalone ? 1 : assign.world;
    standalone_mode = standalone;

    /* The job file, then the flags on top, validated together by the table. */
    json_t *spec_json = standalone ? json_object() : json_deep_copy(assign.job);
    char origin[JOB_PATH_MAX + 32] = "command line";
    if (!standalone)
        snprintf(origin, sizeof(origin), "the job spec from the agent%s", json_object_size(over) ? " + command line" : "");
    if (job) {
        json_error_t jerr;
        json_decref(spec_json);
        spec_json = json_load_file(job, JSON_REJECT_DUPLICATES, &jerr);
        if (!spec_json) {
            fprintf(stderr, "muster-train: %s: %s\n", job, jerr.text);
            goto usage_error;
        }
        snprintf(origin, sizeof(origin), "%s%s", job,
                 json_object_size(over) ? " + command line" : "");
    }
    if (json_is_object(spec_json))
        json_object_update(spec_json, over);
    json_decref(over);
    struct job_spec spec;
    int rc = job_spec_from_json(spec_json, origin, &spec, err, sizeof(err));
    json_decref(spec_json);
    if (rc == 0 && spec.data[0] == '\0') {
        snprintf(err, sizeof(err), "no data: give --data FILE or \"data\" in the job spec");
        rc = -EINVAL;
    }
    /* Checked on a copy: micro_batch 0 resolves to batch / world for the
     * world of each generation (common/batch.h), and each trainer resolves
     * it for its own. Resolved here, a rank that outlives a resize would
     * keep the first world's micro-batch while a rank started in the new
     * world takes that world's: other micro-steps per step, other
     * collectives, and the ranks of one generation no longer meet. */
    struct job_spec checked = spec;
    if (rc == 0 && trainer_check_spec(&checked, world, err, sizeof(err)))
        rc = -EINVAL;
    if (rc) {
        fprintf(stderr, "muster-train: %s: %s\n", origin, err);
        rank_ctl_close(ctl);
        json_decref(assign.job);
        return standalone ? EXIT_USAGE : 1;
    }

    if (threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN) > 0 ? sysconf(_SC_NPROCESSORS_ONLN) : 1;
        /* The node's ranks share its cores. */
        threads = standalone || assign.local_world <= 1 ? online : online / assign.local_world;
        if (threads < 1)
            threads = 1;
    }
    layers_set_threads((int)threads);
    /* A rank resumes from the job's last committed checkpoint, if any rank
     * finds one: the load decides that collectively (ckpt_load). */
    if (!standalone && spec.checkpoint_dir[0])
        resume = spec.checkpoint_dir;

    /* A rank trains on the GPU its agent gave it (CUDA_VISIBLE_DEVICES set). */
    const char *cvd = getenv("CUDA_VISIBLE_DEVICES");
    if (!device)
        device = !standalone && cvd && cvd[0] && gpu_module_built() ? "gpu" : "cpu";
    const struct rank_ops *ops = ops_for(device);
    if (!ops)
        rc = 1;
    else if (ops == &gpu_ops && sample > 0 && world > 1) {
        log_error("--sample with --device gpu gathers the weights of one rank: world 1 only (this "
                  "job has %d ranks); sample from its checkpoint with --standalone --resume DIR", world);
        rc = 1;
    } else if (world > 1 || (!standalone && ops == &cpu_ops)) /* a CPU rank of 1 rejoins too: the job may grow */
        rc = run_rank(ops, &spec, ctl, &assign, sample, stop_after, metrics_path, (long)threads);
    else
        rc = run_alone(ops, &spec, standalone, ctl, resume, sample, stop_after, metrics_path, (long)threads);
    rank_ctl_close(ctl);
    json_decref(assign.job);
    return rc;

usage_error:
    json_decref(over);
    return EXIT_USAGE;
}
