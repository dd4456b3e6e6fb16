/*
 * muster-train: one training rank. Two modes:
 *   rank mode (started by muster-worker, MUSTER_CTL_FD set): the job spec,
 *     rank, world size and generation come from the agent's ASSIGN; rank 0
 *     creates the ring communicator's unique id and sends it up; every rank
 *     resumes from the job's last committed checkpoint, trains its share
 *     with ZeRO-3, and heartbeats its progress. Stopped by the agent (or by
 *     its death) it aborts the communicator and exits 1; done, it exits 0.
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

/* A generation's communicators: the training ring and the replica ring. */
struct gen_comms {
    struct comm *train, *replica;
};

static void abort_comms(void *arg)
{
    struct gen_comms *g = arg;
    comm_abort(g->train);
    comm_abort(g->replica);
}

/*
 * The ring communicator of this generation: rank 0 creates the unique id and
 * sends it up through the agent; every rank gets the id back from the daemon.
 */
static int open_comm(struct rank_ctl *ctl, int rank, int world, struct comm **out, char *err, size_t errlen)
{
    uint8_t mine[COMM_ID_BYTES], id[COMM_ID_BYTES];
    int rc;
    if (rank == 0 && (rc = comm_unique_id(COMM_RING, mine)) != 0) {
        snprintf(err, errlen, "cannot create the communicator's unique id: %s", comm_strerror(rc));
        return rc;
    }
    rc = rank_ctl_unique_id(ctl, rank == 0 ? mine : NULL, id, 300000);
    if (rc != 0) {
        snprintf(err, errlen, "no unique id for this generation from the daemon: %s",
                 rc == -ECANCELED ? "stopped while waiting" : rc == -EAGAIN ? "a newer generation came" : strerror(-rc));
        return rc;
    }
    /* A newer generation (or a stop) gives up a formation that waits for peers who are gone. */
    rc = comm_init_cancelable(out, COMM_RING, rank, world, id, 120000, rank_ctl_superseded(ctl));
    if (rc != 0) {
        snprintf(err, errlen, "ring communicator (rank %d of %d) did not form: %s", rank, world, comm_strerror(rc));
        return rc;
    }
    return 0;
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

/* The GPU module's table, once run_gpu has loaded it. */
static const struct gpu_module *gpu;

static void abort_gpu(void *arg) { gpu->zero_abort(arg); }

/* The GPU path (worker/train/gpu/, in the GPU module): the same loop, hooks,
 * checkpoints and exit statuses as the CPU path; ranks of a world > 1 form an
 * NCCL communicator whose unique id rank 0 sends up through the agent.
 * resume: a checkpoint to load first (NULL: none). */
static int run_gpu(const struct job_spec *spec, int standalone, struct rank_ctl *ctl, int rank,
                   int world, const char *resume, long long sample, long long stop_after,
                   const char *metrics_path)
{
    char err[2048];
    if (!(gpu = gpu_module_load(err, sizeof(err)))) {
        log_error("--device gpu: %s", err);
        return 1;
    }
    if (sample > 0 && world > 1) {
        log_error("--sample with --device gpu gathers the weights of one rank: world 1 only (this "
                  "job has %d ranks); sample from its checkpoint with --standalone --resume DIR",
                  world);
        return standalone ? EXIT_USAGE : 1;
    }
    uint8_t mine[GPU_ID_BYTES], id[GPU_ID_BYTES];
    if (world > 1) {
        int rc = rank == 0 ? gpu->unique_id(mine) : 0;
        if (rc) {
            log_error("cannot create the NCCL unique id: %s", gpu->strerror(rc));
            return 1;
        }
        rc = rank_ctl_unique_id(ctl, rank == 0 ? mine : NULL, id, 300000);
        if (rc) {
            log_error("no unique id for this generation from the daemon: %s",
                      rc == -ECANCELED ? "stopped while waiting" : strerror(-rc));
            return 1;
        }
    }
    struct gpu_trainer tr;
    if (gpu->trainer_init(&tr, spec, rank, world, world > 1 ? id : NULL, err, sizeof(err))) {
        log_error("%s", err);
        return 1;
    }
    if (ctl)
        rank_ctl_on_abort(ctl, abort_gpu, tr.z);
    if (resume) { /* -ENOENT (no rank finds a checkpoint there): the same on every rank, a fresh start */
        int lrc = gpu->trainer_load(&tr, resume, err, sizeof(err));
        if (lrc && (lrc != -ENOENT || standalone)) {
            log_error("%s", err);
            gpu->trainer_free(&tr);
            return 1;
        }
        if (lrc == 0)
            log_info("resumed from %s at step %ld", resume, tr.step);
    }
    char name[128];
    gpu->device_name(name, sizeof(name));
    if (rank == 0)
        log_info("model %s on %s: L=%d NH=%d C=%d T=%d V=%d; batch %d = %d ranks x %d x %d micro-steps, "
                 "seq_len %d; bf16 compute, fp32 master weights; %.3f GiB of model state per rank",
                 spec->model, name, tr.cfg.L, tr.cfg.NH, tr.cfg.C, tr.cfg.T, tr.cfg.V, spec->batch, world,
                 tr.spec.micro_batch, tr.accum, tr.spec.seq_len, gpu->zero_state_bytes(tr.z) / 1073741824.0);
    struct run_state rs = {.tty = rank == 0 && isatty(STDOUT_FILENO), .steps = spec->steps, .ctl = ctl,
                           .quiet = rank != 0, .ckpt_step = &tr.last_checkpoint_step};
    if (metrics_path && rank == 0 && !(rs.metrics = fopen(metrics_path, "a"))) {
        log_error("--metrics: %s: %s", metrics_path, strerror(errno));
        gpu->trainer_free(&tr);
        return 1;
    }
    if (ctl) {
        rank_ctl_beat(ctl, (uint64_t)tr.step, NAN, 0, 0, beat_ckpt(tr.last_checkpoint_step));
    }
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    rs.t0 = elapsed(&(struct run_state){.t0 = 0});
    struct train_hooks hooks = {on_step, on_eval, on_checkpoint, &rs, &checkpoint_requests, &checkpoints_answered,
                                NULL};
    int rc = gpu->train_run(&tr, (long)stop_after, &hooks, &stop_flag, err, sizeof(err));
    clear_bar(&rs);
    fflush(stdout);
    if (rs.metrics)
        fclose(rs.metrics);
    int status = end_status(rc, standalone, tr.step, err);
    if (status == 0 && sample > 0) {
        int *out = malloc(sizeof(int) * (size_t)sample);
        if (!out || gpu->trainer_sample(&tr, sample_prompt(&tr.data, tr.cfg.V), out, (int)sample,
                                       err, sizeof(err))) {
            log_error("--sample: %s", out ? err : "out of memory");
            status = 1;
        } else {
            print_sample(out, sample, tr.cfg.V, tr.step);
        }
        free(out);
    }
    gpu->trainer_free(&tr);
    return status;
}

/* ---- the CPU path ---- */

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

/* Trains from tr's current step with this process's hooks (only rank 0
 * prints progress; every rank heartbeats it). train_run's result, err set. */
static int run_loop(struct trainer *tr, struct rank_ctl *ctl, long long stop_after, const char *metrics_path,
                    char *err, size_t errlen)
{
    struct run_state rs = {.tty = tr->rank == 0 && isatty(STDOUT_FILENO), .steps = tr->spec.steps, .ctl = ctl,
                           .quiet = tr->rank != 0, .ckpt_step = &tr->last_checkpoint_step, .zero = &tr->zero,
                           .counted = tr->zero.comm, .rss_base = rss_base};
    if (metrics_path && tr->rank == 0 && !(rs.metrics = fopen(metrics_path, "a"))) {
        snprintf(err, errlen, "--metrics: %s: %s", metrics_path, strerror(errno));
        return -EINVAL;
    }
    if (ctl)
        rank_ctl_beat(ctl, (uint64_t)tr->step, NAN, 0, 0, beat_ckpt(tr->last_checkpoint_step));
    struct sigaction sa = {.sa_handler = on_signal};
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    rs.t0 = elapsed(&(struct run_state){.t0 = 0});
    struct train_hooks hooks = {on_step, on_eval, on_checkpoint, &rs, &checkpoint_requests, &checkpoints_answered,
                                &yield_flag};
    int rc = train_run(tr, (long)stop_after, &hooks, &stop_flag, err, errlen);
    clear_bar(&rs);
    fflush(stdout);
    if (rs.metrics)
        fclose(rs.metrics);
    return rc;
}

static void maybe_sample(struct trainer *tr, long long sample)
{
    if (sample <= 0)
        return;
    int *out = malloc(sizeof(int) * (size_t)sample);
    if (out) {
        trainer_sample(tr, sample_prompt(&tr->data, tr->model.cfg.V), out, (int)sample);
        print_sample(out, sample, tr->model.cfg.V, tr->step);
        free(out);
    }
}

/* One process: --standalone, or a rank of a world of 1. */
static int run_single(const struct job_spec *spec, int standalone, struct rank_ctl *ctl, const char *resume,
                      long long sample, long long stop_after, const char *metrics_path, long threads)
{
    char err[2048];
    struct trainer tr;
    rss_base = rss("VmRSS");
    if (trainer_init(&tr, spec, 0, 1, NULL, err, sizeof(err))) {
        log_error("%s", err);
        return 1;
    }
    inject_faults(&tr);
    if (resume) { /* a rank's -ENOENT: no checkpoint yet, a fresh start */
        int lrc = trainer_load(&tr, resume, err, sizeof(err));
        if (lrc && (lrc != -ENOENT || standalone)) {
            log_error("%s", err);
            trainer_free(&tr);
            return 1;
        }
        if (lrc == 0)
            log_info("resumed from %s at step %ld", resume, tr.step);
    }
    log_model(&tr, threads, standalone);
    int rc = run_loop(&tr, ctl, stop_after, metrics_path, err, sizeof(err));
    int status = end_status(rc, standalone, tr.step, err);
    if (status == 0)
        maybe_sample(&tr, sample);
    trainer_free(&tr);
    return status;
}

/*
 * The replica ring of this generation (replica.h): rank 0 makes its id, the
 * training ring carries it to every rank, each joins at its position.
 */
static int open_replica_ring(struct trainer *tr, int pos, struct comm **out, char *err, size_t errlen)
{
    enum { WORDS = COMM_ID_BYTES / 8 };
    uint64_t id[WORDS] = {0};
    uint64_t *all = malloc(sizeof(id) * (size_t)tr->world);
    if (!all) {
        snprintf(err, errlen, "out of memory for the replica ring's id");
        return -ENOMEM;
    }
    int rc = tr->rank == 0 ? comm_unique_id(COMM_RING, (uint8_t *)id) : 0;
    if (rc)
        log_error("cannot create the replica ring's unique id: %s", comm_strerror(rc));
    int grc = zero_gather_u64(&tr->zero, id, WORDS, all); /* every rank takes part, even so */
    if (grc == 0 && rc == 0)
        rc = comm_init_cancelable(out, COMM_RING, pos, tr->world, (const uint8_t *)all, 60000, superseded);
    if (grc)
        rc = grc;
    if (rc)
        snprintf(err, errlen, "replica ring (position %d of %d) did not form: %s", pos, tr->world,
                 comm_strerror(rc));
    free(all);
    return rc;
}

/* Where this generation's state came from, for the log. */
static const char *const restore_words[] = {"", "peers' memory", "the last committed checkpoint", "the seed"};

/* The state each rank brings into a generation: the trainer (and replicas)
 * of the generation before, when it survived it. */
struct held_state {
    struct trainer *tr;   /* NULL: a new process */
    struct replica *rep;  /* its replicas, or NULL */
    int valid;            /* whole at tr->step (not half received) */
};

/* Memory, the same ranks: survivors keep or go back, holders ship replicas back along the ring. */
static int restore_in_place(struct trainer *tr, struct replica *rep, const struct replica_plan *plan,
                            const struct replica_src *src, const int *pos, char *err, size_t errlen)
{
    int rc = rep ? replica_restore(rep, plan, src, pos, tr->world) : 0;
    if (rc)
        snprintf(err, errlen, "restoring from the peers' replicas: %s", comm_strerror(rc));
    return rc;
}

/* Memory, another world or other ranks: every old rank's block, from the rank
 * that has it, re-sliced into tr's shards by one gather per unit. */
static int restore_resliced(struct trainer *tr, const struct held_state *held, const struct replica_plan *plan,
                            const struct replica_src *src, char *err, size_t errlen)
{
    const int w0 = plan->old_world, world = tr->world, me = tr->rank;
    int *count = calloc((size_t)world, sizeof(int)), *from_rank = malloc(sizeof(int) * (size_t)w0);
    int *from_index = malloc(sizeof(int) * (size_t)w0);
    const float **mine = calloc((size_t)w0, sizeof(*mine));
    int rc = count && from_rank && from_index && mine ? 0 : -ENOMEM, ncontrib = 0, nmine = 0;
    if (rc == 0 && held->tr && held->rep && src[held->tr->rank].rank == me && src[held->tr->rank].kind == SRC_SNAP)
        zero_revert(&held->tr->zero); /* its own state of plan->step is the snapshot */
    for (int o = 0; rc == 0 && o < w0; o++) {
        from_rank[o] = src[o].rank;
        from_index[o] = count[src[o].rank]++;
        ncontrib = count[src[o].rank] > ncontrib ? count[src[o].rank] : ncontrib;
        if (src[o].rank == me)
            mine[nmine++] = src[o].kind == SRC_HOLDER ? held->rep->slot[src[o].slot] : held->tr->zero.params;
    }
    if (rc == 0)
        rc = zero_reslice(&tr->zero, w0, ncontrib, mine, nmine, from_rank, from_index);
    if (rc)
        snprintf(err, errlen, "re-slicing the state of %d ranks for %d: %s", w0, world, comm_strerror(rc));
    free(count);
    free(from_rank);
    free(from_index);
    free(mine);
    return rc;
}

/*
 * Collective, at the start of every generation of a world > 1 (replica.h):
 * the ranks' offers gathered, the replica ring formed, then the state of
 * the latest step every rank of the generation before has in memory (kept
 * in place, or re-sliced when the world or the ranks changed), else the last
 * committed checkpoint, else the seed, into tr. held: what this rank
 * brings (held->tr may be tr itself). *valid: tr's state is whole at
 * tr->step (not while a replica or checkpoint is half received); *broke:
 * the failure was the generation's (a collective failed). 0 or an error
 * with err set.
 */
static int restore_state(struct trainer *tr, struct replica *rep, const struct held_state *held,
                         struct gen_comms *gc, const struct rank_assign *as, enum proto_restore *from, int *valid,
                         int *broke, char *err, size_t errlen)
{
    const int world = tr->world;
    const struct trainer *ht = held->tr && held->valid ? held->tr : NULL;
    uint64_t mine[REPLICA_OFFER];
    replica_offer(ht ? held->rep : NULL, ht != NULL, ht ? ht->rank : 0, ht ? ht->world : 0,
                  ht ? ht->zero.plan.total : 0, ht ? ht->step : 0, as->node_rank, as->local_rank,
                  (uint64_t)(ht ? ht->spec.seed : tr->spec.seed), ht ? ht->last_checkpoint_step : -1, mine);
    uint64_t *all = malloc(sizeof(mine) * (size_t)world);
    int *pos = malloc(sizeof(int) * (size_t)world);
    struct replica_src *src = NULL; /* one per rank of the survivors' generation */
    struct replica_plan plan;
    int rc = all && pos ? 0 : -ENOMEM;
    if (rc == 0 && (rc = zero_gather_u64(&tr->zero, mine, REPLICA_OFFER, all)) != 0) {
        snprintf(err, errlen, "gathering what each rank holds: %s", comm_strerror(rc));
        *broke = 1;
        goto out;
    }
    if (rc == 0) {
        uint64_t w0 = (uint64_t)world; /* replica_plan refuses more than REPLICA_MAX_WORLD */
        for (int r = 0; r < world; r++)
            if (all[(size_t)r * REPLICA_OFFER + OFFER_OLD_WORLD] > w0)
                w0 = all[(size_t)r * REPLICA_OFFER + OFFER_OLD_WORLD];
        if (!(src = malloc(sizeof(*src) * (w0 < REPLICA_MAX_WORLD ? w0 : REPLICA_MAX_WORLD))))
            rc = -ENOMEM;
    }
    if (rc == 0 && tr->rank == 0 && LOG_DEBUG <= log_threshold)
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
        if (tr->rank == 0)
            log_warn("the survivors' states disagree (another model or world size): not restored from memory");
        memset(&plan, 0, sizeof(plan));
        plan.step = -1;
        plan.last_checkpoint = -1;
        rc = 0;
    }
    if (rc == 0 && rep) {
        rc = open_replica_ring(tr, pos[tr->rank], &gc->replica, err, errlen);
        if (rc == 0)
            replica_attach(rep, gc->replica);
        *broke = rc != 0;
    }
    if (rc == -ENOMEM)
        snprintf(err, errlen, "out of memory while choosing the state of this generation");
    if (rc)
        goto out;
    if (plan.step >= 0) {
        const int in_place = plan.in_place; /* the same on every rank: a function of the offers */
        *valid = in_place && (src[tr->rank].rank == tr->rank && src[tr->rank].kind != SRC_HOLDER);
        rc = in_place ? restore_in_place(tr, rep, &plan, src, pos, err, errlen)
                      : restore_resliced(tr, held, &plan, src, err, errlen);
        if (rc) {
            *broke = 1;
            goto out;
        }
        tr->step = plan.step;
        tr->spec.seed = (int64_t)plan.seed;
        tr->last_checkpoint_step = plan.last_checkpoint;
        if (rep && !in_place)
            replica_forget(rep, -1);
        *valid = 1;
        *from = PROTO_RESTORE_MEMORY;
        if (tr->rank == 0) {
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
    if (plan.survivors > 0 && tr->rank == 0)
    {
        char why[96];
        if (rep)
            snprintf(why, sizeof(why), "rank %d and the rank holding its replica were lost", plan.lost);
        else
            snprintf(why, sizeof(why), "replicate_every is 0");
        log_warn("no step is held in memory for every rank (%s): every rank falls back to %s", why,
                 tr->spec.checkpoint_dir[0] ? "the last committed checkpoint" : "the seed");
    }
    /* Every rank asks, whatever its own view of checkpoint_dir holds: the
     * answer is collective (a node-local directory may be empty on a new node). */
    *valid = 0;
    rc = tr->spec.checkpoint_dir[0] ? trainer_load(tr, tr->spec.checkpoint_dir, err, errlen) : -ENOENT;
    if (rc == 0) {
        *from = PROTO_RESTORE_DISK;
        log_info("resumed from %s at step %ld", tr->spec.checkpoint_dir, tr->step); /* each rank: its own shard */
    } else if (rc != -ENOENT) {
        *broke = zero_failed(&tr->zero);
        goto out;
    } else {
        rc = 0;
        if (plan.survivors > 0) { /* back to the start: the seed's weights, no moments */
            zero_init_weights(&tr->zero, (uint64_t)tr->spec.seed);
            memset(tr->zero.m, 0, sizeof(float) * tr->zero.plan.total);
            memset(tr->zero.v, 0, sizeof(float) * tr->zero.plan.total);
            tr->step = 0;
            tr->last_checkpoint_step = -1;
        }
        *from = PROTO_RESTORE_SEED;
    }
    *valid = 1;
    if (rep) /* what the replicas held belongs to the abandoned run */
        replica_forget(rep, -1);
out:
    free(all);
    free(pos);
    free(src);
    return rc;
}

/* Whether the generation broke (a collective of either ring failed), as
 * opposed to this rank failing on its own. */
static int broken(struct trainer *tr, struct replica *rep)
{
    return zero_failed(&tr->zero) || (rep && replica_failed(rep));
}

/* A trainer (and its replicas) for this rank's place in a generation. */
static int new_trainer(const struct job_spec *spec, const struct rank_assign *at, struct comm *comm, long threads,
                       struct trainer **tr_out, struct replica **rep_out)
{
    char err[1024];
    struct trainer *tr = calloc(1, sizeof(*tr));
    struct replica *rep = NULL;
    rss_base = rss("VmRSS");
    if (!tr || trainer_init(tr, spec, at->rank, at->world, comm, err, sizeof(err)) != 0) {
        log_error("%s", tr ? err : "out of memory");
        free(tr);
        return -1;
    }
    inject_faults(tr);
    if (spec->replicate_every > 0) {
        rep = calloc(1, sizeof(*rep));
        if (!rep || replica_init(rep, &tr->zero, spec->replicate_every, at->rank) != 0) {
            log_error("out of memory for peer replicas (3 more copies of this rank's shard, %.1f MiB): set "
                      "replicate_every to 0", 3.0 * 12 * tr->zero.plan.total / 1048576.0);
            free(rep);
            trainer_free(tr);
            free(tr);
            return -1;
        }
        tr->replica = rep;
    }
    log_model(tr, threads, 0);
    *tr_out = tr;
    *rep_out = rep;
    return 0;
}

static void free_trainer(struct trainer *tr, struct replica *rep)
{
    if (rep) {
        replica_free(rep);
        free(rep);
    }
    if (tr) {
        trainer_free(tr);
        free(tr);
    }
}

/*
 * A rank of a world > 1 (docs/training.md, "Healing in place"): the process
 * lives across generations. When a generation breaks (a peer died, the
 * agent parked it, a newer ASSIGN came), the rank aborts both rings, keeps
 * its trainer (model state, data, threads), waits for the next generation
 * of its slot, forms the rings anew and restores (restore_state); when its
 * rank or the world size changed it builds the trainer of its new place and
 * re-slices the state into it. It exits when the job is done, when stopped,
 * and when it fails on its own.
 */
static int run_rank(const struct job_spec *spec, struct rank_ctl *ctl, const struct rank_assign *as,
                    long long sample, long long stop_after, const char *metrics_path, long threads)
{
    struct gen_comms gc = {0};
    struct trainer *tr = NULL;
    struct replica *rep = NULL;
    int valid = 0, status = 1;
    struct rank_assign at = *as;
    char err[2048];
    at.job = NULL;
    superseded = rank_ctl_superseded(ctl);
    rank_ctl_set_rejoin(ctl);
    for (;;) {
        int broke = 1; /* a ring that does not form: the generation broke */
        int rc = open_comm(ctl, at.rank, at.world, &gc.train, err, sizeof(err));
        heal.ring = wall_s();
        if (rc == -ETIMEDOUT) { /* no id or no peers for minutes: no generation is coming; the daemon decides */
            log_error("%s", err);
            break;
        }
        if (rc == 0) {
            rank_ctl_on_abort(ctl, abort_comms, &gc);
            struct held_state held = {tr, rep, valid};
            struct trainer *ntr = tr;
            struct replica *nrep = rep;
            if (!tr || tr->rank != at.rank || tr->world != at.world) {
                if (new_trainer(spec, &at, gc.train, threads, &ntr, &nrep) != 0)
                    break;
            } else {
                zero_set_comm(&tr->zero, gc.train);
            }
            enum proto_restore from = PROTO_RESTORE_NONE;
            broke = 0;
            rc = restore_state(ntr, nrep, &held, &gc, &at, &from, &valid, &broke, err, sizeof(err));
            if (ntr != tr) { /* the new place's trainer takes over, whatever came of it */
                free_trainer(tr, rep);
                tr = ntr;
                rep = nrep;
            }
            heal.restored = wall_s();
            if (rc == 0 && tr->fingerprint)
                trainer_log_fingerprint(tr, "restored at");
            if (rc == 0) {
                if (at.rank == 0)
                    log_info("generation %llu: training from step %ld (state from %s)",
                             (unsigned long long)at.generation, tr->step, restore_words[from]);
                rank_ctl_restored(ctl, from, (uint64_t)tr->step);
                rc = run_loop(tr, ctl, stop_after, metrics_path, err, sizeof(err));
                if (rc == 0 && !stop_flag) {
                    status = 0;
                    break;
                }
                broke = rc == TRAIN_YIELDED || (rc && broken(tr, rep));
            }
            if (!stop_flag && !broke) {
                log_error("%s", err);
                break;
            }
        }
        if (stop_flag) {
            if (tr)
                log_info("stopped at step %ld", tr->step);
            break;
        }
        /* The generation is over (it broke, or the ranks left it together for
         * a grow): keep the state, drop the rings, wait for the next one. */
        heal.seen = wall_s();
        if (rc == TRAIN_YIELDED) {
            log_info("generation %llu: left at the boundary of step %ld with the other ranks (the job grows); "
                     "waiting for the next generation", (unsigned long long)at.generation, tr->step);
            rank_ctl_yielded(ctl);
        } else {
            log_warn("generation %llu broke at step %ld: %s; waiting for the next generation",
                     (unsigned long long)at.generation, tr ? tr->step : 0L, err);
        }
        rank_ctl_on_abort(ctl, NULL, NULL);
        comm_abort(gc.train);
        comm_abort(gc.replica);
        if (rep)
            replica_detach(rep);
        if (tr)
            zero_set_comm(&tr->zero, NULL);
        comm_destroy(gc.train);
        comm_destroy(gc.replica);
        gc = (struct gen_comms){0};
        valid = tr && valid;
        if (rank_ctl_next_generation(ctl, &at) != 0)
            break; /* stopped while waiting */
        heal.generation = wall_s();
        heal.pending = 1;
        log_info("generation %llu: rejoining in place as rank %d of %d%s", (unsigned long long)at.generation, at.rank,
                 at.world, valid ? "" : " (this rank's state was not whole: it is restored like a new rank's)");
    }
    rank_ctl_on_abort(ctl, NULL, NULL);
    if (status == 0)
        maybe_sample(tr, sample);
    free_trainer(tr, rep);
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
    const int rank = standalone ? 0 : assign.rank, world = standalone ? 1 : assign.world;

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
    if (rc == 0 && trainer_check_spec(&spec, world, err, sizeof(err)))
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
    if (strcmp(device, "gpu") == 0) {
        rc = run_gpu(&spec, standalone, ctl, rank, world, resume, sample, stop_after, metrics_path);
        rank_ctl_close(ctl);
        json_decref(assign.job);
        return rc;
    }

    if (world > 1)
        rc = run_rank(&spec, ctl, &assign, sample, stop_after, metrics_path, (long)threads);
    else
        rc = run_single(&spec, standalone, ctl, resume, sample, stop_after, metrics_path, (long)threads);
    rank_ctl_close(ctl);
    json_decref(assign.job);
    return rc;

usage_error:
    json_decref(over);
    return EXIT_USAGE;
}
