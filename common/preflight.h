/*
 * preflight: the checks a node passes before its ranks start, shared by the
 * agent (which reports the result to musterd: a node that fails is shown
 * "unfit" and spends no restart) and by `musterctl doctor` (which runs them
 * on the spot and says what to do).
 *
 *   data        the job's data file: present, a regular file, readable, an
 *               llm.c token file (header magic, version, count matching the
 *               size) or text (no NUL in the first 4 KiB), every token below
 *               the model's vocabulary, each split longer than seq_len + 1
 *   checkpoint  checkpoint_dir: created if missing, writable (a file is made
 *               and removed), free space >= 2 checkpoints of the plan
 *   memory      host memory (/proc/meminfo) and GPU facts (NVML, loaded at
 *               run time: nodes without the driver work, they report none)
 *   clock       the node's wall clock against musterd's
 *   needs       what a program of the user's needs (job keys require_*):
 *               paths readable, directories writable with free space, a
 *               Python interpreter that imports the modules (run with the
 *               rank's environment, bounded in time), and the name of the
 *               latest checkpoint in checkpoint_dir (checkpoint_latest)
 *
 * Every function returns 0, or a negative errno with one sentence in why
 * that names the file, the figure and what to do.
 */
#ifndef MUSTER_PREFLIGHT_H
#define MUSTER_PREFLIGHT_H

#include <stddef.h>
#include <stdint.h>

#define PREFLIGHT_WHY_MAX 512
#define PREFLIGHT_MAX_GPUS 64
/* Largest clock difference to musterd a node may have. */
#define PREFLIGHT_MAX_SKEW_MS 5000
/* Test hook: when set, the file it names holds the free bytes (a decimal
 * number) that the checkpoint check sees instead of statvfs's answer. */
#define PREFLIGHT_FREE_HOOK_ENV "MUSTER_TEST_FREE_BYTES_FILE"

/* Writes the sentence to why and returns rc (the checks' way of failing). */
int preflight_why(char *why, size_t len, int rc, const char *fmt, ...) __attribute__((format(printf, 4, 5)));

struct preflight_data {
    int tokens_file;  /* 1: llm.c token file; 0: text */
    uint64_t tokens;
    int max_token;    /* filled by preflight_data_check */
};

/* Format and token count from the header and size alone (cheap). */
int preflight_data_tokens(const char *path, struct preflight_data *d);

/* The whole data check (reads the file once, in chunks). */
int preflight_data_check(const char *path, int vocab, int seq_len, double val_fraction,
                         struct preflight_data *d, char *why, size_t len);

/* checkpoint_dir writable with at least need bytes free; *free_bytes gets
 * what was found. */
int preflight_ckpt_dir(const char *dir, uint64_t need, uint64_t *free_bytes, char *why, size_t len);

/* path (file or directory) exists and can be read (a byte, or an entry listed). */
int preflight_readable(const char *path, char *why, size_t len);

/* dir exists, is a directory, a file can be made in it, and at least need bytes are free. */
int preflight_writable(const char *dir, uint64_t need, char *why, size_t len);

/*
 * The memory checkpoint directory (job key memory_checkpoint_mb): root is a
 * directory, and need_mb fits in the memory available (MemAvailable, plus
 * what dir, the job's directory, holds already) and, for a directory that
 * is no mount of its own, in root's free space.
 */
int preflight_memory_ckpt(const char *root, const char *dir, uint64_t need_mb, char *why, size_t len);

/* Longest name of a latest checkpoint, as reported to musterd. */
#define PREFLIGHT_CKPT_MAX 200

/*
 * The latest checkpoint in dir by rule: "file:NAME" is the first line of
 * dir/NAME (DeepSpeed's `latest`), "glob:PATTERN" the name matching PATTERN
 * that sorts last in version order (global_step9 < global_step10). out gets
 * "" when there is none (no such file, no match, no such directory).
 */
int preflight_latest_ckpt(const char *dir, const char *rule, char *out, size_t cap, char *why, size_t len);

/*
 * The Python interpreter of a rank: explicit when set (a path, or a name
 * looked up on path_var), else the rank program prog itself when its name
 * starts with "python", else the interpreter of its "#!" line (through
 * /usr/bin/env too). out gets an absolute path.
 */
int preflight_interpreter(const char *prog, const char *explicit_interp, const char *path_var, char *out,
                          size_t cap, char *why, size_t len);

/*
 * Runs `interp -c 'import m1, m2'` for the packed module list (common/cmdline.h
 * packing) with env, killed after timeout_ms. 0 when it exits 0; else why
 * names the interpreter, the modules and the last line the import printed.
 */
int preflight_python(const char *interp, const char *modules, char *const *env, int timeout_ms, char *why,
                     size_t len);
/*
 * preflight_python, the interpreter run through wrap: the words that go
 * before it (wrap[0] an absolute path; at most PREFLIGHT_WRAP_MAX of them;
 * NULL = none), as the agent's rank_user drop (worker/agent/rank_user.h).
 */
#define PREFLIGHT_WRAP_MAX 8
int preflight_python_as(char *const *wrap, const char *interp, const char *modules, char *const *env,
                        int timeout_ms, char *why, size_t len);
/* Kills the import check running now, and any started after (the process is
 * stopping: it must not wait out require_python_timeout_s); safe from any thread. */
void preflight_python_abort(void);

/* Host memory from /proc/meminfo, bytes. */
int preflight_host_memory(uint64_t *total, uint64_t *available);

struct gpu_fact {
    char name[64];
    uint64_t total, free; /* bytes */
};

/* GPUs NVML sees (index order), at most max; returns how many, or a
 * negative errno with why (no driver: -ENOENT). */
int preflight_gpus(struct gpu_fact *out, int max, char *why, size_t len);

/* |skew| above PREFLIGHT_MAX_SKEW_MS fails. skew_ms: node minus musterd,
 * rtt_ms: the round trip the comparison could be off by. */
int preflight_clock(int64_t skew_ms, int64_t rtt_ms, char *why, size_t len);

#endif
