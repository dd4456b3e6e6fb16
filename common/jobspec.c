#include "common/jobspec.h"
#include "common/conf.h"
#include "common/jsonkind.h"
#include "common/plan_names.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* INT_AUTO: or "auto" (-1); LIST: an array of non-empty strings, packed as KEY_CMD is */
enum key_type { KEY_INT, KEY_INT_AUTO, KEY_I64, KEY_DOUBLE, KEY_STRING, KEY_CMD, KEY_LIST };

struct key_def {
    const char *name;
    enum key_type type;
    size_t offset;
    size_t size;      /* KEY_STRING: buffer size */
    double min, max;  /* numeric bounds, inclusive */
    double def;       /* numeric default */
    const char *sdef; /* string default */
    const char *doc;
};

#define F(field) offsetof(struct job_spec, field), sizeof(((struct job_spec *)0)->field)

/* The one table of job keys. Keep docs/jobspec.md in step (make docs). */
static const struct key_def keys[] = {
    {"name", KEY_STRING, F(name), 0, 0, 0, "job", "job name shown in status and events"},
    {"nodes", KEY_INT, F(nodes), 1, 4096, 1, NULL, "agents (nodes) needed to form a generation"},
    {"max_restarts", KEY_INT, F(max_restarts), 0, 100000, 3, NULL,
     "restarts (new generations after a failure) before the job is failed"},
    {"heartbeat_interval_ms", KEY_INT, F(heartbeat_interval_ms), 50, 60000, 1000, NULL,
     "period of agent heartbeats to the daemon"},
    {"heartbeat_timeout_ms", KEY_INT, F(heartbeat_timeout_ms), 100, 600000, 5000, NULL,
     "a node silent this long is lost; must exceed heartbeat_interval_ms"},
    {"lease_ms", KEY_INT, F(lease_ms), 100, 3600000, 10000, NULL,
     "an agent that cannot reach the daemon this long stops its ranks"},
    {"stop_grace_ms", KEY_INT, F(stop_grace_ms), 0, 600000, 5000, NULL,
     "time between SIGTERM and SIGKILL when ranks are stopped"},
    {"progress_timeout_ms", KEY_INT_AUTO, F(progress_timeout_ms), 0, 86400000, -1, NULL,
     "a running rank whose step does not advance this long is hung and its generation restarted; 0 = off; "
     "\"auto\" (or absent): 300 s until a generation has run 5 steps past its first reported one (or 3 x its longest "
     "first step), then the "
     "largest of 30 s, 20 x the median step time and 3 x the longest step seen after the first ones "
     "(docs/troubleshooting.md)"},
    {"start_timeout_ms", KEY_INT, F(start_timeout_ms), 0, 86400000, 600000, NULL,
     "assigned ranks that do not all heartbeat running within this are a failure; 0 = off"},
    {"rejoin_timeout_ms", KEY_INT, F(rejoin_timeout_ms), 1000, 86400000, 300000, NULL,
     "a lost member gets this long to rejoin; then the job shrinks to min_nodes or fails"},
    {"min_nodes", KEY_INT, F(min_nodes), 0, 4096, 0, NULL,
     "fewest nodes the job may shrink to when members do not rejoin (ZeRO-3 shards are re-sliced); 0 = nodes (never shrink)"},
    {"spare_nodes", KEY_INT, F(spare_nodes), 0, 4096, 0, NULL,
     "hot spare nodes: this many agents beyond nodes join as spares, authenticated and pre-flighted but given no "
     "ranks; a member lost (its connection closed or its heartbeats missed) or found unfit is replaced by a ready "
     "spare in the next generation at once, the spare taking its node rank and rank block (same world size, no "
     "rejoin_timeout_ms wait, no shrink), one from the lost node's domain (the agents' `domain` label) when one is "
     "free there; a replaced node that comes back is a spare (docs/spares.md); 0 = none"},
    {"slow_policy", KEY_STRING, F(slow_policy), 0, 0, 0, "off",
     "what musterd does with a node whose rank is named slow (docs/pytorch.md, slow ranks): \"off\", only say so; "
     "\"swap\", once it was slow for slow_swap_after_s, a ready spare node (spare_nodes) takes its place at a step "
     "boundary (the ranks leave their generation there, as for a grow) and the slow node becomes a spare"},
    {"slow_swap_after_s", KEY_INT, F(slow_swap_after_s), 1, 86400, 60, NULL,
     "slow_policy swap: how long a rank is named slow before its node is swapped for a spare"},
    {"restart_backoff_ms", KEY_INT, F(restart_backoff_ms), 0, 600000, 1000, NULL,
     "failures in a row back off: the first restart is immediate, the next waits this long, doubling each time "
     "up to restart_backoff_max_ms (a generation that runs restart_backoff_max_ms ends the streak); 0 = never wait"},
    {"restart_backoff_max_ms", KEY_INT, F(restart_backoff_max_ms), 0, 3600000, 60000, NULL,
     "longest wait between restarts; a rank that failed on a full disk or out of memory waits this long at once"},
    {"restart_window_s", KEY_INT, F(restart_window_s), 0, 31536000, 0, NULL,
     "only restarts of the last restart_window_s seconds count toward max_restarts; 0 = every restart counts"},
    {"rank_cmd", KEY_CMD, F(rank_cmd), 0, 0, 0, "",
     "program of every rank: a string split on whitespace (no shell) or an array of strings; absent = the "
     "agent's (worker.json's rank_cmd, else muster-train). The agent's command line (--rank-cmd or -- CMD) wins"},
    {"python_hook", KEY_INT, F(python_hook), 0, 1, 1, NULL,
     "1: a rank_cmd's Python processes start with muster's start-up hook (on PYTHONPATH): it reports torch "
     "optimizer steps, keepalives and where the program is, and dumps stacks on request, with no change to "
     "the program; 0: off"},
    {"flight_recorder", KEY_INT, F(flight_recorder), 0, 1000000, 2000, NULL,
     "entries torch's flight recorder keeps per process of a Python rank with python_hook on "
     "(TORCH_FR_BUFFER_SIZE, unless the agent's environment sets it); on a suspected hang the hook reads it and "
     "musterd names the rank behind at which collective, e.g. \"rank 2 never entered all_reduce #37 (its #37 is "
     "barrier); ranks 0-1, 3 wait in it\" (docs/troubleshooting.md); it costs about 3 us of the calling "
     "thread's CPU per collective (tests/bench/bench_flight.py); 0: off"},
    {"visible_devices", KEY_STRING, F(visible_devices), 0, 0, 0, "node",
     "the GPUs a rank_cmd rank sees: \"node\" (torchrun's: CUDA_VISIBLE_DEVICES lists the node's job GPUs in "
     "LOCAL_RANK order, so cuda:LOCAL_RANK, as torch.cuda.set_device(LOCAL_RANK), DeepSpeed and accelerate "
     "choose it, is the rank's own, and NCCL reaches the node's other GPUs over CUDA IPC/NVLink) or \"own\" "
     "(only its own GPU, as cuda:0: a program that selects cuda:LOCAL_RANK then fails with \"invalid device "
     "ordinal\" on every local rank but 0, docs/rank-env.md); muster-train always sees its own alone"},
    {"require_readable", KEY_LIST, F(require_readable), 0, 0, 0, "",
     "paths (files or directories, e.g. the data) every node must be able to read before its ranks start; a "
     "node that cannot is unfit, with the path and the error, and spends no restart (docs/troubleshooting.md); a "
     "relative path is the agent's working directory's, where ranks start"},
    {"require_writable", KEY_LIST, F(require_writable), 0, 0, 0, "",
     "directories (e.g. where the program writes checkpoints) that must exist and be writable on every node, "
     "with require_free_mb free; else the node is unfit"},
    {"require_free_mb", KEY_INT, F(require_free_mb), 0, 1073741824, 0, NULL,
     "MiB each require_writable directory must have free"},
    {"require_python", KEY_STRING, F(require_python), 0, 0, 0, "",
     "the Python interpreter of require_python_modules: a path or a name looked up on the agent's PATH; empty "
     "= the rank program's (rank_cmd's first word when it is python*, else its #! interpreter)"},
    {"require_python_modules", KEY_LIST, F(require_python_modules), 0, 0, 0, "",
     "modules the program imports (e.g. [\"torch\", \"deepspeed\"]): each node runs `INTERPRETER -c 'import "
     "...'` with a rank's environment before its ranks start and is unfit, with the import's last line, when it "
     "fails; a success is remembered per interpreter, environment and modules"},
    {"require_python_timeout_s", KEY_INT, F(require_python_timeout_s), 1, 3600, 120, NULL,
     "the import check is killed, and the node unfit, after this long"},
    {"checkpoint_latest", KEY_STRING, F(checkpoint_latest), 0, 0, 0, "",
     "how a node reads its latest checkpoint in checkpoint_dir: \"file:NAME\" (the first line of that file, as "
     "DeepSpeed's `latest`) or \"glob:PATTERN\" (the matching name that sorts last, global_step9 before "
     "global_step10); every node reports it and a generation whose nodes differ does not start "
     "(docs/troubleshooting.md); empty = not compared"},
    {"checkpoint_diverged_ok", KEY_INT, F(checkpoint_diverged_ok), 0, 1, 0, NULL,
     "1: start even when the nodes' latest checkpoints differ (the difference is still reported); 0: wait"},
    {"memory_checkpoint_mb", KEY_INT, F(memory_checkpoint_mb), 0, 1073741824, 0, NULL,
     "MiB of memory for a checkpoint directory on every node, given to each rank as MUSTER_CHECKPOINT_DIR: "
     "memory_checkpoint_root/muster-JOB (JOB the job's name, bytes other than letters, digits, . _ - as _), the "
     "same path on every node, a tmpfs of this size mounted by the agent when it runs as root (a save past it "
     "fails with ENOSPC), else a plain directory there (pre-flight checks the figure, nothing bounds it); kept "
     "across the ranks' restarts, removed when the job ends (the node's ranks finish, or musterd shuts the agent "
     "down; an agent stopped by a signal leaves it to the next one). Before ranks start, every node "
     "keeps only the newest checkpoint complete on all nodes, and names it in `latest` (docs/pytorch.md); 0 = off"},
    {"memory_checkpoint_root", KEY_STRING, F(memory_checkpoint_root), 0, 0, 0, "/dev/shm",
     "absolute path of the memory file system the memory checkpoint directory is made in"},
    {"memory_checkpoint_latest", KEY_STRING, F(memory_checkpoint_latest), 0, 0, 0, "glob:*",
     "which entries of the memory checkpoint directory are checkpoints: \"glob:PATTERN\" (the directories "
     "matching it, as DeepSpeed's tag directories) or \"file:NAME\" (the directory that file's first line names: only for a program whose ranks write that "
     "file on every node, which DeepSpeed's `latest` is not: its rank 0 alone writes it); one is complete on a node once every rank there took an optimizer step after it appeared (a rank that "
     "reports no steps: once it appeared), and only complete ones are restored. \"committed:PATTERN\": the directories "
     "matching it, each complete on a node once every rank there that ran when it appeared called the client's "
     "checkpoint_committed(S) with S at least the step its name ends in (step10: 10), or exited with status 0: for "
     "saves that return before their files are written (DCP's async_save; docs/pytorch.md)"},
    {"memory_checkpoint_keep", KEY_INT, F(memory_checkpoint_keep), 2, 1000, 2, NULL,
     "complete memory checkpoints each node keeps (older ones, and unfinished ones older than the newest "
     "complete, are removed); at least 2, so that nodes one save apart still share one"},
    {"memory_checkpoint_replica_mbps", KEY_INT, F(memory_checkpoint_replica_mbps), 0, 100000, 0, NULL,
     "MiB/s at most that each agent sends of its node's new complete memory checkpoints to its buddy node "
     "(the next member in name order, or one of another failure domain when agents carry a `domain` label), "
     "which holds the newest memory_checkpoint_keep of them in memory beside its own and gives them back to a "
     "node that lost its own (docs/pytorch.md; the copies pass through musterd); 0 = no replicas"},
    {"memory_checkpoint_drain_steps", KEY_INT, F(memory_checkpoint_drain_steps), 0, 100000000, 0, NULL,
     "drain memory checkpoints to durable storage: the agent copies a node's newest complete memory checkpoint, "
     "in a thread off the training path, to checkpoint_dir/muster-memory/JOB/NODE/TAG (written beside as "
     ".muster-drain-TAG and renamed once every file is synced, so a copy cut short is never used) when its step "
     "enters a new window of this many steps (global_step50 with 50: the first checkpoint at or past each "
     "multiple; the rule reads only the step in the name, so every node drains the same ones); a restart "
     "whose nodes lost both their memory copy and its buddy's resumes from the newest drained checkpoint every "
     "node has (docs/pytorch.md); 0 = none"},
    {"memory_checkpoint_drain_keep", KEY_INT, F(memory_checkpoint_drain_keep), 1, 1000, 2, NULL,
     "drained memory checkpoints each node keeps in checkpoint_dir/muster-memory/JOB/NODE (older ones are removed "
     "after each drain)"},
    {"warm_spares", KEY_INT, F(warm_spares), 0, 1, 0, NULL,
     "1: each agent keeps one warm Python process that has started the interpreter and imported torch, "
     "torch.distributed and warm_imports, and that becomes the next rank the agent must start (no interpreter "
     "start, no import on the recovery path; it costs one idle interpreter's memory per node, docs/pytorch.md); "
     "only for a rank_cmd `PYTHON script.py ...` or `PYTHON -m module ...` with python_hook on; 0: off"},
    {"warm_imports", KEY_STRING, F(warm_imports), 0, 0, 0, "",
     "warm_spares: more modules the spare imports ahead, comma-separated dotted names (e.g. "
     "\"deepspeed,transformers\"); they must not touch a GPU on import (one that loads the CUDA driver is found "
     "and left out of the next spare, docs/spares.md)"},
    {"model", KEY_STRING, F(model), 0, 0, 0, "small",
     "model preset, a named set of the dimensions below: tiny (2 layers, 2 heads, 16 channels, context 32, "
     "vocab 256), small (4, 4, 128, 128, 256), gpt2-124m (12, 12, 768, 1024, 50257)"},
    {"n_layer", KEY_INT, F(n_layer), 0, GPT_MAX_LAYERS, 0, NULL, "transformer blocks; 0 = the preset's"},
    {"n_head", KEY_INT, F(n_head), 0, 1024, 0, NULL, "attention heads (n_embd must be a multiple); 0 = the preset's"},
    {"n_embd", KEY_INT, F(n_embd), 0, 65536, 0, NULL, "channels (the model width); 0 = the preset's"},
    {"context", KEY_INT, F(context), 0, GPT_MAX_CONTEXT, 0, NULL,
     "positions the model has (the longest seq_len); 0 = the preset's"},
    {"vocab", KEY_INT, F(vocab), 0, GPT_MAX_VOCAB, 0, NULL,
     "vocabulary size; every token of the data must be below it (checked when the data is read); 0 = the preset's"},
    {"data", KEY_STRING, F(data), 0, 0, 0, "", "training data: a text file (bytes) or an llm.c token file"},
    {"steps", KEY_INT, F(steps), 1, 100000000, 2000, NULL, "optimizer steps to run"},
    {"batch", KEY_INT, F(batch), 1, 1048576, 16, NULL, "global batch: sequences per optimizer step"},
    {"micro_batch", KEY_INT, F(micro_batch), 0, 65536, 0, NULL,
     "sequences per micro-step per rank; 0 = batch / world size (no accumulation)"},
    {"seq_len", KEY_INT, F(seq_len), 0, 1048576, 0, NULL, "tokens per sequence; 0 = the model's context T"},
    {"lr", KEY_DOUBLE, F(lr), 0, 10, 2e-3, NULL, "peak learning rate"},
    {"lr_min", KEY_DOUBLE, F(lr_min), 0, 10, 2e-4, NULL, "floor of the cosine decay"},
    {"warmup_steps", KEY_INT, F(warmup_steps), 0, 100000000, 100, NULL, "linear warm-up steps"},
    {"weight_decay", KEY_DOUBLE, F(weight_decay), 0, 10, 0.1, NULL,
     "AdamW decoupled weight decay (not applied to biases and norm gains)"},
    {"grad_clip", KEY_DOUBLE, F(grad_clip), 0, 1e6, 1.0, NULL, "global gradient-norm clip; 0 = off"},
    {"val_fraction", KEY_DOUBLE, F(val_fraction), 0, 0.5, 0.1, NULL,
     "fraction at the end of the data held out for validation"},
    {"eval_every", KEY_INT, F(eval_every), 0, 100000000, 100, NULL, "validation every N steps; 0 = off"},
    {"eval_batches", KEY_INT, F(eval_batches), 1, 100000, 8, NULL, "validation set size in global batches: eval_batches x batch sequences, fixed by the seed, the same at any world size"},
    {"seed", KEY_I64, F(seed), 0, 9007199254740991.0, 1337, NULL, "seed of initialisation and data order"},
    {"checkpoint_dir", KEY_STRING, F(checkpoint_dir), 0, 0, 0, "", "checkpoint directory: shared or on each node's own disk (docs/training.md); empty = none"},
    {"checkpoint_every", KEY_INT, F(checkpoint_every), 0, 100000000, 0, NULL,
     "steps between checkpoints; 0 = only at the end"},
    {"checkpoint_keep", KEY_INT, F(checkpoint_keep), 0, 100000000, 3, NULL,
     "committed checkpoints kept: older ones are pruned after each commit (the one `latest` names never); 0 = keep all"},
    {"replicate_every", KEY_INT, F(replicate_every), 0, 100000000, 1, NULL,
     "muster-train: mirror each rank's shard (weights, both moments) into a peer's memory, on another node where "
     "the layout allows, every N steps, so that a replaced rank resumes from it; 0 = off (docs/training.md)"},
    {"parallelism", KEY_STRING, F(parallelism), 0, 0, 0, "muster-train",
     "how the ranks share the model, for the plan (docs/plan.md): muster-train (its own ZeRO-3), or what a "
     "rank_cmd program does: ddp, zero1, zero2, zero3 (DeepSpeed ZeRO stages), fsdp (FULL_SHARD), fsdp-grad-op "
     "(SHARD_GRAD_OP); a program's plan takes params (or the model keys), precision, batch, micro_batch and "
     "seq_len from this spec"},
    {"precision", KEY_STRING, F(precision), 0, 0, 0, "bf16",
     "a rank_cmd program's precision, for the plan: fp32, bf16 or fp16 (both mixed, fp32 master weights)"},
    {"params", KEY_I64, F(params), 0, 1e15, 0, NULL,
     "a rank_cmd program's parameter count, for the plan (with parallelism other than muster-train); 0 = from "
     "the model keys"},
    {"activation_checkpointing", KEY_INT, F(activation_checkpointing), 0, 1, 0, NULL,
     "1: the rank_cmd program recomputes activations (the plan's activation memory and compute say so; with "
     "parallelism other than muster-train)"},
};

#define NKEYS (sizeof(keys) / sizeof(keys[0]))

static void fail(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void fail(char *err, size_t errlen, const char *fmt, ...)
{
    va_list ap;
    if (!err || errlen == 0)
        return;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
}

void job_spec_defaults(struct job_spec *spec)
{
    memset(spec, 0, sizeof(*spec));
    for (size_t i = 0; i < NKEYS; i++) {
        const struct key_def *k = &keys[i];
        char *p = (char *)spec + k->offset;
        switch (k->type) {
        case KEY_INT:
        case KEY_INT_AUTO: *(int *)p = (int)k->def; break;
        case KEY_I64: *(int64_t *)p = (int64_t)k->def; break;
        case KEY_DOUBLE: *(double *)p = k->def; break;
        case KEY_STRING: snprintf(p, k->size, "%s", k->sdef); break;
        case KEY_CMD:
        case KEY_LIST: p[0] = p[1] = '\0'; break;
        }
    }
}

static const struct key_def *find_key(const char *name)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strcmp(keys[i].name, name) == 0)
            return &keys[i];
    return NULL;
}

static int set_key(const struct key_def *k, const json_t *v, const char *origin,
                   struct job_spec *spec, char *err, size_t errlen)
{
    char *p = (char *)spec + k->offset;
    if (k->type == KEY_LIST) {
        size_t i;
        json_t *e;
        if (!json_is_array(v) || json_array_size(v) == 0) {
            fail(err, errlen, "%s: %s: expected a non-empty array of strings, got %s", origin, k->name,
                 json_is_array(v) ? "an empty array" : json_kind_name(v));
            return -EINVAL;
        }
        json_array_foreach(v, i, e) {
            if (!json_is_string(e) || json_string_length(e) == 0 || memchr(json_string_value(e), '\0', json_string_length(e))) {
                fail(err, errlen, "%s: %s[%zu]: expected a non-empty string without NUL", origin, k->name, i);
                return -EINVAL;
            }
        }
        if (cmdline_from_json(v, p, k->size, NULL, 0) != 0) {
            fail(err, errlen, "%s: %s: expected at most %d entries of %zu bytes in all", origin, k->name,
                 CMDLINE_ARGS, k->size - 2);
            return -EINVAL;
        }
        return 0;
    }
    if (k->type == KEY_CMD) {
        char why[200];
        if (cmdline_from_json(v, p, k->size, why, sizeof(why)) != 0) {
            fail(err, errlen, "%s: %s: %s", origin, k->name, why);
            return -EINVAL;
        }
        return 0;
    }
    if (k->type == KEY_STRING) {
        if (!json_is_string(v)) {
            fail(err, errlen, "%s: %s: expected a string, got %s", origin, k->name, json_kind_name(v));
            return -EINVAL;
        }
        const char *s = json_string_value(v);
        if (strlen(s) >= k->size || memchr(s, '\0', json_string_length(v))) {
            fail(err, errlen, "%s: %s: expected a string of at most %zu bytes without NUL",
                 origin, k->name, k->size - 1);
            return -EINVAL;
        }
        memcpy(p, s, strlen(s) + 1);
        return 0;
    }
    if (k->type == KEY_INT_AUTO && json_is_string(v) && strcmp(json_string_value(v), "auto") == 0) {
        *(int *)p = -1;
        return 0;
    }
    double d;
    if (k->type == KEY_DOUBLE) {
        if (!json_is_number(v)) {
            fail(err, errlen, "%s: %s: expected a number in [%g, %g], got %s", origin,
                 k->name, k->min, k->max, json_kind_name(v));
            return -EINVAL;
        }
        d = json_number_value(v);
    } else {
        if (!json_is_integer(v)) {
            fail(err, errlen, "%s: %s: expected an integer in [%.0f, %.0f]%s, got %s", origin,
                 k->name, k->min, k->max, k->type == KEY_INT_AUTO ? " or \"auto\"" : "", json_kind_name(v));
            return -EINVAL;
        }
        d = (double)json_integer_value(v);
    }
    if (!isfinite(d) || d < k->min || d > k->max) {
        if (k->type == KEY_DOUBLE)
            fail(err, errlen, "%s: %s: expected a number in [%g, %g], got %g", origin,
                 k->name, k->min, k->max, d);
        else
            fail(err, errlen, "%s: %s: expected an integer in [%.0f, %.0f], got %" JSON_INTEGER_FORMAT,
                 origin, k->name, k->min, k->max, json_integer_value(v));
        return -EINVAL;
    }
    switch (k->type) {
    case KEY_INT:
    case KEY_INT_AUTO: *(int *)p = (int)json_integer_value(v); break;
    case KEY_I64: *(int64_t *)p = (int64_t)json_integer_value(v); break;
    case KEY_DOUBLE: *(double *)p = d; break;
    case KEY_STRING:
    case KEY_CMD:
    case KEY_LIST: break;
    }
    return 0;
}

/* A Python keyword: `import class` is a syntax error, not a missing module. */
static int keyword(const char *word, size_t n)
{
    static const char *const kw[] = {"False", "None", "True", "and", "as", "assert", "async", "await", "break",
                                     "class", "continue", "def", "del", "elif", "else", "except", "finally", "for",
                                     "from", "global", "if", "import", "in", "is", "lambda", "nonlocal", "not", "or",
                                     "pass", "raise", "return", "try", "while", "with", "yield", NULL};
    for (const char *const *k = kw; *k; k++)
        if (strlen(*k) == n && strncmp(*k, word, n) == 0)
            return 1;
    return 0;
}

int job_spec_module_valid(const char *name)
{
    if (!name[0])
        return 0;
    for (const char *part = name; *part; part += strcspn(part, ".") + (part[strcspn(part, ".")] == '.'))
        if (keyword(part, strcspn(part, ".")))
            return 0;
    for (const char *c = name; *c; c++) {
        int start = c == name || c[-1] == '.';
        int ok = (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') || *c == '_' ||
                 (!start && *c >= '0' && *c <= '9') || (!start && *c == '.' && c[1]);
        if (!ok)
            return 0;
    }
    return 1;
}

/* The memory_checkpoint_* keys, together. */
static int check_memory(const struct job_spec *spec, const char *origin, char *err, size_t errlen)
{
    const char *root = spec->memory_checkpoint_root, *rule = spec->memory_checkpoint_latest;
    if (!spec->memory_checkpoint_mb) {
        const char *set = strcmp(root, "/dev/shm") != 0 ? "memory_checkpoint_root"
                          : strcmp(rule, "glob:*") != 0 ? "memory_checkpoint_latest"
                          : spec->memory_checkpoint_keep != 2 ? "memory_checkpoint_keep"
                          : spec->memory_checkpoint_drain_steps ? "memory_checkpoint_drain_steps"
                          : spec->memory_checkpoint_drain_keep != 2 ? "memory_checkpoint_drain_keep" : NULL;
        if (set) {
            fail(err, errlen, "%s: %s: expected memory_checkpoint_mb too (the size of the directory it applies to)",
                 origin, set);
            return -EINVAL;
        }
        return 0;
    }
    if (root[0] != '/' || strstr(root, "/../") || (strlen(root) >= 3 && strcmp(root + strlen(root) - 3, "/..") == 0)) {
        fail(err, errlen, "%s: memory_checkpoint_root: expected an absolute path without .. (a tmpfs such as "
             "/dev/shm), got \"%s\"", origin, root);
        return -EINVAL;
    }
    size_t kind = 0; /* the length of the rule's prefix */
    if (strncmp(rule, "file:", 5) == 0 || strncmp(rule, "glob:", 5) == 0)
        kind = 5;
    else if (strncmp(rule, "committed:", 10) == 0)
        kind = 10;
    if (!kind || !rule[kind] || strchr(rule + kind, '/')) {
        fail(err, errlen, "%s: memory_checkpoint_latest: expected \"file:NAME\" (a file name in the directory), "
             "\"glob:PATTERN\" or \"committed:PATTERN\" (of names in it), got \"%s\"", origin, rule);
        return -EINVAL;
    }
    if (spec->memory_checkpoint_drain_keep != 2 && !spec->memory_checkpoint_drain_steps) {
        fail(err, errlen, "%s: memory_checkpoint_drain_keep: expected memory_checkpoint_drain_steps too (the "
             "drains it keeps)", origin);
        return -EINVAL;
    }
    if (spec->memory_checkpoint_drain_steps && !spec->checkpoint_dir[0]) {
        fail(err, errlen, "%s: memory_checkpoint_drain_steps: expected checkpoint_dir too (the durable directory "
             "memory checkpoints are drained to)", origin);
        return -EINVAL;
    }
    return 0;
}

/* The require_* and checkpoint_latest keys, together. */
static int check_needs(const struct job_spec *spec, const char *origin, char *err, size_t errlen)
{
    for (const char *m = spec->require_python_modules; *m; m += strlen(m) + 1)
        if (!job_spec_module_valid(m)) {
            char shown[64]; /* the name as one short line: it may hold anything */
            snprintf(shown, sizeof(shown), "%s", m);
            for (char *c = shown; *c; c++)
                if ((unsigned char)*c < 0x20 || *c == 0x7f)
                    *c = '?';
            fail(err, errlen, "%s: require_python_modules: expected module names (letters, digits, _ and dots, "
                 "no Python keyword, as in torch.distributed), got \"%s\"%s", origin, shown,
                 strlen(m) >= sizeof(shown) ? "..." : "");
            return -EINVAL;
        }
    if (spec->require_python[0] && !spec->require_python_modules[0]) {
        fail(err, errlen, "%s: require_python: expected require_python_modules too (the modules to import)", origin);
        return -EINVAL;
    }
    if (spec->require_free_mb && !spec->require_writable[0]) {
        fail(err, errlen, "%s: require_free_mb: expected require_writable too (the directories it applies to)",
             origin);
        return -EINVAL;
    }
    const char *rule = spec->checkpoint_latest;
    if (!rule[0])
        return 0;
    if (!spec->checkpoint_dir[0]) {
        fail(err, errlen, "%s: checkpoint_latest: expected checkpoint_dir too (the directory it reads)", origin);
        return -EINVAL;
    }
    int file = strncmp(rule, "file:", 5) == 0, glob = strncmp(rule, "glob:", 5) == 0;
    if ((!file && !glob) || !rule[5] || strchr(rule + 5, '/')) {
        fail(err, errlen, "%s: checkpoint_latest: expected \"file:NAME\" (a file name in checkpoint_dir) or "
             "\"glob:PATTERN\" (of names in it), got \"%s\"", origin, rule);
        return -EINVAL;
    }
    return 0;
}

int job_spec_from_json(const json_t *obj, const char *origin, struct job_spec *spec,
                       char *err, size_t errlen)
{
    const char *name;
    json_t *v;

    job_spec_defaults(spec);
    if (!json_is_object(obj)) {
        fail(err, errlen, "%s: expected a JSON object at the top level", origin);
        return -EINVAL;
    }
    json_object_foreach((json_t *)obj, name, v) {
        const struct key_def *k = find_key(name);
        if (!k) {
            fail(err, errlen, "%s: %s: unknown key (see docs/jobspec.md for the keys)", origin, name);
            return -EINVAL;
        }
        int rc = set_key(k, v, origin, spec, err, errlen);
        if (rc)
            return rc;
        if (strcmp(name, "model") == 0 || strncmp(name, "n_", 2) == 0 || strcmp(name, "context") == 0 ||
            strcmp(name, "vocab") == 0)
            spec->shape_given = 1;
    }
    enum plan_par par;
    enum plan_prec prec;
    const int program = strcmp(spec->parallelism, "muster-train") != 0;
    if (program && plan_par_parse(spec->parallelism, &par)) {
        fail(err, errlen, "%s: parallelism: expected muster-train or one of %s, got \"%s\"", origin, plan_par_list(),
             spec->parallelism);
        return -EINVAL;
    }
    if (strcmp(spec->visible_devices, "node") != 0 && strcmp(spec->visible_devices, "own") != 0) {
        fail(err, errlen, "%s: visible_devices: expected \"node\" or \"own\", got \"%s\"", origin,
             spec->visible_devices);
        return -EINVAL;
    }
    if (plan_prec_parse(spec->precision, &prec)) {
        fail(err, errlen, "%s: precision: expected fp32, bf16 or fp16, got \"%s\"", origin, spec->precision);
        return -EINVAL;
    }
    if (!program && prec == PLAN_FP16) {
        fail(err, errlen, "%s: precision: muster-train computes in bf16 on GPUs and fp32 on CPUs; fp16 describes a "
             "rank_cmd program (set parallelism)", origin);
        return -EINVAL;
    }
    if (!program && (spec->params || spec->activation_checkpointing)) {
        fail(err, errlen, "%s: %s: describes a rank_cmd program (set parallelism); muster-train counts its "
             "parameters from the model keys and keeps its activations", origin,
             spec->params ? "params" : "activation_checkpointing");
        return -EINVAL;
    }
    if (program && !spec->params && !spec->shape_given) {
        fail(err, errlen, "%s: params: the plan of a %s program needs its parameter count (params) or its shape "
             "(model, n_layer, n_embd, vocab)", origin, spec->parallelism);
        return -EINVAL;
    }
    if (spec->heartbeat_timeout_ms <= spec->heartbeat_interval_ms) {
        fail(err, errlen, "%s: heartbeat_timeout_ms: expected more than heartbeat_interval_ms (%d), got %d",
             origin, spec->heartbeat_interval_ms, spec->heartbeat_timeout_ms);
        return -EINVAL;
    }
    struct gpt_config model;
    char why[300];
    if (job_spec_model(spec, &model, why, sizeof(why)) != 0) {
        fail(err, errlen, "%s: %s", origin, why);
        return -EINVAL;
    }
    if (spec->seq_len > model.T && (!program || spec->shape_given)) {
        fail(err, errlen, "%s: seq_len: expected at most the model's context (%d), got %d", origin, model.T,
             spec->seq_len);
        return -EINVAL;
    }
    if (spec->restart_backoff_max_ms < spec->restart_backoff_ms) {
        fail(err, errlen, "%s: restart_backoff_max_ms: expected at least restart_backoff_ms (%d), got %d", origin,
             spec->restart_backoff_ms, spec->restart_backoff_max_ms);
        return -EINVAL;
    }
    /* each name checked as require_python_modules' are; empty entries are skipped, as the spare does */
    for (const char *w = spec->warm_imports; *w; w += strcspn(w, ",") + (w[strcspn(w, ",")] == ',')) {
        char mod[sizeof(spec->warm_imports)];
        size_t n = strcspn(w, ",");
        snprintf(mod, sizeof(mod), "%.*s", (int)n, w);
        if (n && !job_spec_module_valid(mod)) {
            fail(err, errlen, "%s: warm_imports: expected comma-separated module names (letters, digits, _ and .), "
                 "got '%s'", origin, spec->warm_imports);
            return -EINVAL;
        }
    }
    if (strcmp(spec->slow_policy, "off") != 0 && strcmp(spec->slow_policy, "swap") != 0) {
        fail(err, errlen, "%s: slow_policy: expected \"off\" or \"swap\", got \"%s\"", origin, spec->slow_policy);
        return -EINVAL;
    }
    if (strcmp(spec->slow_policy, "swap") == 0 && spec->spare_nodes < 1) {
        fail(err, errlen, "%s: slow_policy: \"swap\" needs a spare to swap in: expected spare_nodes at least 1, got 0",
             origin);
        return -EINVAL;
    }
    if (spec->nodes + spec->spare_nodes > 4096) {
        fail(err, errlen, "%s: spare_nodes: expected nodes + spare_nodes at most 4096, got %d + %d", origin,
             spec->nodes, spec->spare_nodes);
        return -EINVAL;
    }
    if (spec->min_nodes > spec->nodes) {
        fail(err, errlen, "%s: min_nodes: expected at most nodes (%d), got %d", origin, spec->nodes, spec->min_nodes);
        return -EINVAL;
    }
    /* The agent hears from the daemon once per heartbeat; a shorter lease fences healthy nodes. */
    if (spec->lease_ms < 2 * spec->heartbeat_interval_ms) {
        fail(err, errlen, "%s: lease_ms: expected at least twice heartbeat_interval_ms (%d), got %d", origin,
             2 * spec->heartbeat_interval_ms, spec->lease_ms);
        return -EINVAL;
    }
    if (spec->lr_min > spec->lr) {
        fail(err, errlen, "%s: lr_min: expected at most lr (%g), got %g", origin, spec->lr, spec->lr_min);
        return -EINVAL;
    }
    if (check_needs(spec, origin, err, errlen) != 0 || check_memory(spec, origin, err, errlen) != 0)
        return -EINVAL;
    if (spec->name[0] == '\0') {
        fail(err, errlen, "%s: name: expected a non-empty string", origin);
        return -EINVAL;
    }
    return 0;
}

int job_spec_load(const char *path, struct job_spec *spec, json_t **raw, char *err,
                  size_t errlen)
{
    json_error_t jerr;
    json_t *obj = json_load_file(path, JSON_REJECT_DUPLICATES, &jerr);
    if (!obj) {
        if (jerr.line <= 0)
            fail(err, errlen, "%s: %s", path, jerr.text);
        else
            fail(err, errlen, "%s:%d:%d: not valid JSON: %s", path, jerr.line, jerr.column, jerr.text);
        return -EINVAL;
    }
    int rc = job_spec_from_json(obj, path, spec, err, errlen);
    if (rc || !raw)
        json_decref(obj);
    else
        *raw = obj;
    return rc;
}

void job_spec_print_doc(FILE *out)
{
    fprintf(out, "| key | type | default | bounds | meaning |\n|---|---|---|---|---|\n");
    for (size_t i = 0; i < NKEYS; i++) {
        const struct key_def *k = &keys[i];
        switch (k->type) {
        case KEY_STRING:
            fprintf(out, "| `%s` | string | `\"%s\"` | at most %zu bytes | %s |\n", k->name, k->sdef,
                    k->size - 1, k->doc);
            break;
        case KEY_DOUBLE:
            fprintf(out, "| `%s` | number | %g | %g to %g | %s |\n", k->name, k->def, k->min, k->max,
                    k->doc);
            break;
        case KEY_INT_AUTO:
            fprintf(out, "| `%s` | integer or `\"auto\"` | `\"auto\"` | %.0f to %.0f | %s |\n", k->name, k->min, k->max,
                    k->doc);
            break;
        case KEY_LIST:
            fprintf(out, "| `%s` | array of strings | unset | at most %zu bytes | %s |\n", k->name, k->size - 2,
                    k->doc);
            break;
        case KEY_CMD:
            fprintf(out, "| `%s` | string or array of strings | unset | at most %d arguments, %d bytes | %s |\n",
                    k->name, CMDLINE_ARGS, CMDLINE_MAX - 2, k->doc);
            break;
        default:
            fprintf(out, "| `%s` | integer | %.0f | %.0f to %.0f | %s |\n", k->name, k->def, k->min,
                    k->max, k->doc);
            break;
        }
    }
}

int job_spec_model(const struct job_spec *spec, struct gpt_config *cfg, char *err, size_t errlen)
{
    return gpt_config_resolve(spec->model, spec->n_layer, spec->n_head, spec->n_embd, spec->context, spec->vocab,
                              cfg, err, errlen);
}
