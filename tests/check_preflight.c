/*
 * The node checks of common/preflight.h on files made here: token files
 * (good, wrong magic, a count that disagrees with the size, a token beyond
 * the vocabulary), text, too little data, each verdict the same as the
 * trainer's own reader (dataset_open); checkpoint directories (created,
 * not creatable, too little free space through the statvfs hook); the clock;
 * a program's needs (require_*): paths readable, directories writable with
 * free space, the latest checkpoint by file or glob, the interpreter a rank
 * program runs (by name, #! line, env), its imports with the environment
 * given, bounded in time.
 */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/wait.h>
#include <sys/stat.h>
#include <time.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/cmdline.h"
#include "common/jobspec.h"
#include "common/preflight.h"
#include "worker/agent/agent_preflight.h"
#include "worker/train/data.h"

static char dir[] = "/tmp/check-preflight-XXXXXX";

static void setup(void) { ck_assert_ptr_nonnull(mkdtemp(dir)); }

static void teardown(void)
{
    char cmd[sizeof(dir) + 16];
    snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
    ck_assert_int_eq(system(cmd), 0);
    strcpy(dir, "/tmp/check-preflight-XXXXXX");
    unsetenv(PREFLIGHT_FREE_HOOK_ENV);
}

/* An llm.c token file of n tokens 0, 1, 2, ... (mod top), header count given. */
static void token_file(const char *path, int32_t magic, int32_t count, int n, int top)
{
    int32_t h[256] = {magic, 1, count};
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    ck_assert_uint_eq(fwrite(h, sizeof(h), 1, f), 1);
    for (int i = 0; i < n; i++) {
        uint16_t t = (uint16_t)(i % top);
        ck_assert_uint_eq(fwrite(&t, 2, 1, f), 1);
    }
    fclose(f);
}

/* preflight_data_check's answer, which must be the trainer's too. */
static int check_data(const char *path, int vocab, int seq_len, double val, struct preflight_data *d, char *why,
                      size_t len)
{
    struct dataset ds;
    char err[512];
    int rc = preflight_data_check(path, vocab, seq_len, val, d, why, len);
    int trainer = dataset_open(&ds, path, vocab, val, seq_len, err, sizeof(err));
    if (trainer == 0)
        dataset_close(&ds);
    ck_assert_msg((rc == 0) == (trainer == 0), "%s: pre-flight says %d (%s), the trainer %d (%s)", path, rc,
                  rc ? why : "ok", trainer, trainer ? err : "ok");
    return rc;
}

START_TEST(data_files_are_checked_like_the_trainer_reads_them)
{
    char path[128], why[PREFLIGHT_WHY_MAX];
    struct preflight_data d;
    snprintf(path, sizeof(path), "%s/tok.bin", dir);
    token_file(path, 20240520, 1000000, 1000000, 50000);
    ck_assert_int_eq(check_data(path, 50257, 1024, 0.1, &d, why, sizeof(why)), 0);
    ck_assert_int_eq(d.tokens_file, 1);
    ck_assert_uint_eq(d.tokens, 1000000);
    ck_assert_int_eq(d.max_token, 49999);
    ck_assert_int_eq(preflight_data_tokens(path, &d), 0);
    ck_assert_uint_eq(d.tokens, 1000000);

    ck_assert_int_eq(check_data(path, 256, 64, 0.1, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "token 49999 is outside the model's vocabulary of 256"));

    token_file(path, 20240520, 1001, 1000, 100);
    ck_assert_int_eq(check_data(path, 256, 8, 0, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "header says 1001 tokens"));

    token_file(path, 12345, 10, 10, 10);
    ck_assert_int_eq(check_data(path, 256, 8, 0, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "neither text nor an llm.c token file: header holds magic 12345"));

    snprintf(path, sizeof(path), "%s/text.txt", dir);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs("to be or not to be\n", f);
    fclose(f);
    ck_assert_int_eq(check_data(path, 256, 4, 0, &d, why, sizeof(why)), 0);
    ck_assert_int_eq(d.tokens_file, 0);
    ck_assert_uint_eq(d.tokens, 19);
    ck_assert_int_eq(check_data(path, 256, 32, 0, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "19 tokens are too few"));

    snprintf(path, sizeof(path), "%s/missing.bin", dir);
    ck_assert_int_eq(check_data(path, 256, 4, 0, &d, why, sizeof(why)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, "missing.bin: No such file or directory: copy the data file"));
    ck_assert_int_eq(check_data(dir, 256, 4, 0, &d, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "not a regular file"));
}
END_TEST

START_TEST(checkpoint_dir_writable_with_room_for_two)
{
    char path[128], hook[128], why[PREFLIGHT_WHY_MAX];
    uint64_t fr;
    snprintf(path, sizeof(path), "%s/ck/deeper", dir);
    ck_assert_int_eq(preflight_ckpt_dir(path, 4096, &fr, why, sizeof(why)), 0);
    ck_assert_int_eq(access(path, W_OK), 0);
    ck_assert_uint_gt(fr, 4096);

    snprintf(hook, sizeof(hook), "%s/free", dir);
    FILE *f = fopen(hook, "w");
    ck_assert_ptr_nonnull(f);
    fputs("1048576\n", f);
    fclose(f);
    setenv(PREFLIGHT_FREE_HOOK_ENV, hook, 1);
    ck_assert_int_eq(preflight_ckpt_dir(path, 3u << 20, &fr, why, sizeof(why)), -ENOSPC);
    ck_assert_uint_eq(fr, 1048576);
    ck_assert_ptr_nonnull(strstr(why, "1.00 MiB free, 2 checkpoints of this job need 3.00 MiB"));
    ck_assert_int_eq(preflight_ckpt_dir(path, 1u << 20, &fr, why, sizeof(why)), 0);

    /* a path through a regular file cannot be a directory */
    snprintf(path, sizeof(path), "%s/free/ck", dir);
    ck_assert_int_eq(preflight_ckpt_dir(path, 0, &fr, why, sizeof(why)), -ENOTDIR);
    ck_assert_ptr_nonnull(strstr(why, "cannot create it"));
}
END_TEST

START_TEST(clock_skew_beyond_the_round_trip_fails)
{
    char why[PREFLIGHT_WHY_MAX];
    ck_assert_int_eq(preflight_clock(4000, 10, why, sizeof(why)), 0);
    ck_assert_int_eq(preflight_clock(-5500, 1000, why, sizeof(why)), 0);
    ck_assert_int_eq(preflight_clock(-7000, 10, why, sizeof(why)), -ERANGE);
    ck_assert_ptr_nonnull(strstr(why, "7.0 s behind musterd's"));
    uint64_t total, avail;
    ck_assert_int_eq(preflight_host_memory(&total, &avail), 0);
    ck_assert_uint_gt(total, 0);
    ck_assert_uint_le(avail, total);
}
END_TEST

/* Writes text to dir/name with mode. */
static void put_file(const char *name, const char *text, mode_t mode, char *path, size_t cap)
{
    snprintf(path, cap, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
    ck_assert_int_eq(chmod(path, mode), 0);
}

START_TEST(required_paths_readable_and_directories_writable)
{
    char path[256], why[PREFLIGHT_WHY_MAX];
    put_file("data.txt", "to be\n", 0644, path, sizeof(path));
    ck_assert_int_eq(preflight_readable(path, why, sizeof(why)), 0);
    ck_assert_int_eq(preflight_readable(dir, why, sizeof(why)), 0);
    snprintf(path, sizeof(path), "%s/gone/data.txt", dir);
    ck_assert_int_eq(preflight_readable(path, why, sizeof(why)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, "require_readable "));
    ck_assert_ptr_nonnull(strstr(why, "gone/data.txt: No such file or directory: copy it"));

    ck_assert_int_eq(preflight_writable(dir, 4096, why, sizeof(why)), 0);
    snprintf(path, sizeof(path), "%s/ckpt", dir);
    ck_assert_int_eq(preflight_writable(path, 0, why, sizeof(why)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, "ckpt: No such file or directory: create it"));
    ck_assert_int_eq(access(path, F_OK), -1); /* not made: a missing directory is the node's fault to show */
    snprintf(path, sizeof(path), "%s/data.txt", dir);
    ck_assert_int_eq(preflight_writable(path, 0, why, sizeof(why)), -ENOTDIR);

    char hook[256];
    put_file("free", "2097152\n", 0644, hook, sizeof(hook));
    setenv(PREFLIGHT_FREE_HOOK_ENV, hook, 1);
    ck_assert_int_eq(preflight_writable(dir, 2u << 20, why, sizeof(why)), 0);
    ck_assert_int_eq(preflight_writable(dir, 3u << 20, why, sizeof(why)), -ENOSPC);
    ck_assert_ptr_nonnull(strstr(why, "2.00 MiB free, require_free_mb asks for 3.00 MiB"));
}
END_TEST

START_TEST(latest_checkpoint_by_file_or_by_glob)
{
    char path[256], out[PREFLIGHT_CKPT_MAX + 1], why[PREFLIGHT_WHY_MAX];
    snprintf(path, sizeof(path), "%s/ck", dir);
    /* no directory, no file, no match: none */
    ck_assert_int_eq(preflight_latest_ckpt(path, "file:latest", out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_str_eq(out, "");
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(preflight_latest_ckpt(path, "glob:global_step*", out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_str_eq(out, "");

    const char *steps[] = {"ck/global_step9", "ck/global_step40", "ck/global_step10", "ck/other"};
    for (size_t i = 0; i < sizeof(steps) / sizeof(steps[0]); i++) {
        char p[256];
        snprintf(p, sizeof(p), "%s/%s", dir, steps[i]);
        ck_assert_int_eq(mkdir(p, 0755), 0);
    }
    ck_assert_int_eq(preflight_latest_ckpt(path, "glob:global_step*", out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_str_eq(out, "global_step40"); /* version order: 9 < 10 < 40 */

    char f[256];
    put_file("ck/latest", "global_step10\n", 0644, f, sizeof(f));
    ck_assert_int_eq(preflight_latest_ckpt(path, "file:latest", out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_str_eq(out, "global_step10"); /* what the file says, not what is newest */
    ck_assert_int_eq(preflight_latest_ckpt(path, "newest", out, sizeof(out), why, sizeof(why)), -EINVAL);

    /* A rank writes the directory, the agent reading it may be root: a link
     * to a secret is not followed, as the file or on the way to it. */
    char secret[256], link[256], sub_dir[256];
    put_file("secret", "ADMIN-TOKEN\n", 0600, secret, sizeof(secret));
    snprintf(link, sizeof(link), "%s/ck/latest", dir);
    ck_assert_int_eq(unlink(link), 0);
    ck_assert_int_eq(symlink(secret, link), 0);
    ck_assert_int_eq(preflight_latest_ckpt(path, "file:latest", out, sizeof(out), why, sizeof(why)), -ELOOP);
    ck_assert_ptr_null(strstr(why, "ADMIN-TOKEN"));
    ck_assert_ptr_nonnull(strstr(why, "latest is or goes through a symbolic link: not read"));
    ck_assert_str_eq(out, "");
    snprintf(sub_dir, sizeof(sub_dir), "%s/ck/meta", dir);
    ck_assert_int_eq(symlink(dir, sub_dir), 0); /* meta -> the directory that holds "secret" */
    ck_assert_int_eq(preflight_latest_ckpt(path, "file:meta/secret", out, sizeof(out), why, sizeof(why)), -ENOTDIR);
    ck_assert_str_eq(out, "");
}
END_TEST

/* No byte outside printable ASCII. */
static void assert_printable(const char *s)
{
    for (const char *c = s; *c; c++)
        ck_assert_msg((unsigned char)*c >= 0x20 && (unsigned char)*c <= 0x7e, "byte 0x%02x in \"%s\"",
                      (unsigned char)*c, s);
}

START_TEST(hostile_checkpoint_dirs_neither_block_nor_leak_control_characters)
{
    char path[256], p[256], out[PREFLIGHT_CKPT_MAX + 1], why[PREFLIGHT_WHY_MAX];
    snprintf(path, sizeof(path), "%s/ck", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    /* a FIFO for `latest` (no writer: opening it for reading would wait forever) */
    snprintf(p, sizeof(p), "%s/latest", path);
    ck_assert_int_eq(mkfifo(p, 0644), 0);
    ck_assert_int_eq(preflight_latest_ckpt(path, "file:latest", out, sizeof(out), why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "latest is not a regular file"));
    ck_assert_int_eq(unlink(p), 0);
    /* a symlink to /dev/zero (not followed), and the directory itself */
    ck_assert_int_eq(symlink("/dev/zero", p), 0);
    ck_assert_int_eq(preflight_latest_ckpt(path, "file:latest", out, sizeof(out), why, sizeof(why)), -ELOOP);
    ck_assert_int_eq(preflight_latest_ckpt(path, "file:.", out, sizeof(out), why, sizeof(why)), -EINVAL);
    ck_assert_int_eq(unlink(p), 0);
    /* a symlink loop */
    ck_assert_int_eq(symlink("latest", p), 0);
    ck_assert_int_eq(preflight_latest_ckpt(path, "file:latest", out, sizeof(out), why, sizeof(why)), -ELOOP);
    ck_assert_int_eq(unlink(p), 0);
    /* binary with escapes, one long line: the first PREFLIGHT_CKPT_MAX bytes, printable */
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fputs("step\x1b[31m\xff\xfe", f);
    for (int i = 0; i < 100000; i++)
        fputc('x', f);
    fclose(f);
    ck_assert_int_eq(preflight_latest_ckpt(path, "file:latest", out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_uint_eq(strlen(out), PREFLIGHT_CKPT_MAX);
    ck_assert_int_eq(strncmp(out, "step?[31m??xxx", 14), 0);

    /* names a glob matches: control characters, a newline, bytes that are not UTF-8 */
    const char *names[] = {"global_step1\x1b]0;owned\x07", "global_step2\n<b>", "global_step3\xff", NULL};
    for (int i = 0; names[i]; i++) {
        snprintf(p, sizeof(p), "%s/%s", path, names[i]);
        ck_assert_int_eq(mkdir(p, 0755), 0);
    }
    ck_assert_int_eq(preflight_latest_ckpt(path, "glob:global_step*", out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_str_eq(out, "global_step3?");
    snprintf(p, sizeof(p), "%s/global_step3\xff", path);
    ck_assert_int_eq(rmdir(p), 0);
    ck_assert_int_eq(preflight_latest_ckpt(path, "glob:global_step*", out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_str_eq(out, "global_step2?<b>");
    assert_printable(out);
    /* a malformed pattern matches nothing, and says so by "none" */
    ck_assert_int_eq(preflight_latest_ckpt(path, "glob:[global", out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_str_eq(out, "");
}
END_TEST

/* In a new session (no controlling terminal, as a service): whether checking path made a terminal ours. */
static int takes_a_terminal(const char *path)
{
    pid_t pid = fork();
    ck_assert_int_ge(pid, 0);
    if (pid == 0) {
        char why[PREFLIGHT_WHY_MAX];
        if (setsid() < 0)
            _exit(2);
        preflight_readable(path, why, sizeof(why));
        _exit(open("/dev/tty", O_RDONLY | O_NOCTTY) >= 0 ? 1 : 0);
    }
    int st = 0;
    ck_assert_int_eq(waitpid(pid, &st, 0), pid);
    ck_assert(WIFEXITED(st) && WEXITSTATUS(st) != 2);
    return WEXITSTATUS(st);
}

START_TEST(a_terminal_named_in_require_readable_does_not_become_the_agents)
{
    int m = posix_openpt(O_RDWR | O_NOCTTY);
    if (m < 0 || grantpt(m) != 0 || unlockpt(m) != 0 || !ptsname(m)) {
        fprintf(stderr, "a_terminal_named_in_require_readable: skipped (no pseudo-terminal here)\n");
        return;
    }
    char pts[256];
    snprintf(pts, sizeof(pts), "%s", ptsname(m));
    ck_assert_int_eq(takes_a_terminal(pts), 0);
    close(m);
}
END_TEST

START_TEST(hostile_required_paths_answer_at_once)
{
    char p[256], why[PREFLIGHT_WHY_MAX];
    /* a FIFO without a writer is readable (opening it does not wait); a symlink loop is not */
    snprintf(p, sizeof(p), "%s/fifo", dir);
    ck_assert_int_eq(mkfifo(p, 0644), 0);
    ck_assert_int_eq(preflight_readable(p, why, sizeof(why)), 0);
    snprintf(p, sizeof(p), "%s/loop", dir);
    ck_assert_int_eq(symlink("loop", p), 0);
    ck_assert_int_eq(preflight_readable(p, why, sizeof(why)), -ELOOP);
    ck_assert_int_eq(preflight_writable(p, 0, why, sizeof(why)), -ELOOP);
    ck_assert_int_eq(preflight_readable("/proc/self/status", why, sizeof(why)), 0);
    snprintf(p, sizeof(p), "%s/../%s/.", dir, strrchr(dir, '/') + 1);
    ck_assert_int_eq(preflight_readable(p, why, sizeof(why)), 0);
    /* a probe left behind under the name this process would use does not make the directory unwritable */
    snprintf(p, sizeof(p), "%s/.muster-preflight-%ld", dir, (long)getpid());
    FILE *f = fopen(p, "w");
    ck_assert_ptr_nonnull(f);
    fclose(f);
    ck_assert_int_eq(chmod(p, 0), 0);
    ck_assert_msg(preflight_writable(dir, 0, why, sizeof(why)) == 0, "%s", why);
    /* the largest require_free_mb asks for 2^50 bytes: no overflow into a small number */
    char hook[256];
    put_file("free", "1099511627775\n", 0644, hook, sizeof(hook));
    setenv(PREFLIGHT_FREE_HOOK_ENV, hook, 1);
    ck_assert_int_eq(preflight_writable(dir, (uint64_t)1073741824 << 20, why, sizeof(why)), -ENOSPC);
    /* only the probe left before is there: the check's own is gone */
    char cmd[512];
    snprintf(cmd, sizeof(cmd), "test $(ls -A %s | grep -c muster-preflight) = 1", dir);
    ck_assert_int_eq(system(cmd), 0);
}
END_TEST

START_TEST(the_interpreter_a_rank_program_runs)
{
    char bin[256], path[256], out[4096], why[PREFLIGHT_WHY_MAX];
    snprintf(bin, sizeof(bin), "%s/bin", dir);
    ck_assert_int_eq(mkdir(bin, 0755), 0);
    put_file("bin/python3.99", "#!/bin/sh\nexit 0\n", 0755, path, sizeof(path));
    put_file("bin/train.py", "#!/usr/bin/env -S python3.99 -u\nprint(1)\n", 0755, path, sizeof(path));
    put_file("bin/train2.py", "#!/bin/python3.99\n", 0755, path, sizeof(path));
    put_file("bin/run.sh", "#!/bin/sh\nexec python3.99 \"$@\"\n", 0755, path, sizeof(path));

    /* by name on PATH, kept as found (a venv's python is a symlink whose name matters) */
    ck_assert_int_eq(preflight_interpreter("python3.99", "", bin, out, sizeof(out), why, sizeof(why)), 0);
    snprintf(path, sizeof(path), "%s/python3.99", bin);
    ck_assert_str_eq(out, path);
    /* a script's #! line, through env -S */
    ck_assert_int_eq(preflight_interpreter("train.py", "", bin, out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_str_eq(out, path);
    /* a #! interpreter that is not on this node */
    ck_assert_int_eq(preflight_interpreter("train2.py", "", bin, out, sizeof(out), why, sizeof(why)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, "its #! interpreter"));
    /* a shell wrapper says nothing of its Python: the job must name it */
    ck_assert_int_eq(preflight_interpreter("run.sh", "", bin, out, sizeof(out), why, sizeof(why)), -ENOEXEC);
    ck_assert_ptr_nonnull(strstr(why, "name the interpreter in require_python"));
    ck_assert_int_eq(preflight_interpreter("run.sh", "python3.99", bin, out, sizeof(out), why, sizeof(why)), 0);
    ck_assert_str_eq(out, path);
    ck_assert_int_eq(preflight_interpreter("python3.99", "", "/nonexistent", out, sizeof(out), why, sizeof(why)),
                     -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, "the rank program python3.99: No such file or directory on this node"));
    /* require_python at a directory, a file that is not executable, a symlink loop */
    ck_assert_int_eq(preflight_interpreter("train.py", bin, bin, out, sizeof(out), why, sizeof(why)), -EISDIR);
    ck_assert_ptr_nonnull(strstr(why, "Is a directory"));
    put_file("bin/python-noexec", "#!/bin/sh\n", 0644, path, sizeof(path));
    ck_assert_int_eq(preflight_interpreter("train.py", path, bin, out, sizeof(out), why, sizeof(why)), -EACCES);
    snprintf(path, sizeof(path), "%s/python-loop", bin);
    ck_assert_int_eq(symlink("python-loop", path), 0);
    ck_assert_int_eq(preflight_interpreter("train.py", path, bin, out, sizeof(out), why, sizeof(why)), -ELOOP);
}
END_TEST

/* Packs names as common/cmdline.h does. */
static void pack(char *out, const char *const *names)
{
    for (; *names; names++) {
        strcpy(out, *names);
        out += strlen(out) + 1;
    }
    *out = '\0';
}

START_TEST(imports_run_with_the_environment_given_and_bounded)
{
    char path[256], why[PREFLIGHT_WHY_MAX], mods[256];
    /* an "interpreter" that says what it was asked and what its environment holds */
    put_file("python-echo", "#!/bin/sh\necho \"ModuleNotFoundError: asked [$2] with MARK=$MARK\"\nexit 1\n", 0755,
             path, sizeof(path));
    char *env[] = {"MARK=from-the-rank-env", "PATH=/usr/bin:/bin", NULL};
    pack(mods, (const char *const[]){"torch", "deepspeed.ops", NULL});
    ck_assert_int_eq(preflight_python(path, mods, env, 5000, why, sizeof(why)), -ENOPKG);
    ck_assert_msg(strstr(why, "cannot import torch,deepspeed.ops: ModuleNotFoundError: asked [import sys; "
                              "sys.path[:1] = [p for p in sys.path[:1] if p]; import torch, deepspeed.ops] with "
                              "MARK=from-the-rank-env"), "%s", why);

    put_file("python-ok", "#!/bin/sh\nexit 0\n", 0755, path, sizeof(path));
    ck_assert_int_eq(preflight_python(path, mods, env, 5000, why, sizeof(why)), 0);

    /* one that hangs is killed at the deadline, with what it started */
    put_file("python-hang", "#!/bin/sh\nsleep 30 &\nsleep 30\n", 0755, path, sizeof(path));
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ck_assert_int_eq(preflight_python(path, mods, env, 300, why, sizeof(why)), -ETIMEDOUT);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double took = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    ck_assert_msg(took < 3.0, "the check took %.1f s past a 0.3 s deadline", took);
    ck_assert_ptr_nonnull(strstr(why, "did not finish within 0 s"));

    pack(mods, (const char *const[]){"torch; import os", NULL});
    ck_assert_int_eq(preflight_python(path, mods, env, 300, why, sizeof(why)), -EINVAL);
    ck_assert_int_eq(job_spec_module_valid("torch.distributed"), 1);
    ck_assert_int_eq(job_spec_module_valid("torch..x"), 0);
    ck_assert_int_eq(job_spec_module_valid("9lives"), 0);
    ck_assert_int_eq(job_spec_module_valid("a."), 0);
    /* what a hostile or careless job may name: none reaches the interpreter */
    const char *bad[] = {"os; import shutil", "__import__('os').system('id')", "torch\nimport os", "", " torch",
                         "torch ", "t\xc3\xb6rch", "class", "torch.import", "None", "a.if.b", "..", "os,sys", NULL};
    for (int i = 0; bad[i]; i++)
        ck_assert_msg(!job_spec_module_valid(bad[i]), "\"%s\" taken for a module name", bad[i]);
    ck_assert_int_eq(job_spec_module_valid("classy.imports.match"), 1); /* keywords only as whole words */

    /* a real interpreter, when the machine has one: a module it lacks gives Python's own line */
    if (access("/usr/bin/python3", X_OK) == 0) {
        pack(mods, (const char *const[]){"json", "no_such_module_muster", NULL});
        ck_assert_int_eq(preflight_python("/usr/bin/python3", mods, env, 20000, why, sizeof(why)), -ENOPKG);
        ck_assert_ptr_nonnull(strstr(why, "ModuleNotFoundError: No module named 'no_such_module_muster'"));
        /* A module planted in the working directory (the agent's) is not what the check imports. */
        char planted[256];
        put_file("planted_muster.py", "pass\n", 0644, planted, sizeof(planted));
        ck_assert_int_eq(chdir(dir), 0);
        pack(mods, (const char *const[]){"planted_muster", NULL});
        ck_assert_int_eq(preflight_python("/usr/bin/python3", mods, env, 20000, why, sizeof(why)), -ENOPKG);
        ck_assert_ptr_nonnull(strstr(why, "No module named 'planted_muster'"));
        ck_assert_int_eq(chdir("/"), 0);
        unlink(planted);
    }
}
END_TEST

/* A process of the given pid (not a zombie) exists. */
static int alive(pid_t pid)
{
    char p[64], st = 0;
    snprintf(p, sizeof(p), "/proc/%ld/stat", (long)pid);
    FILE *f = fopen(p, "r");
    if (!f)
        return 0;
    int ok = fscanf(f, "%*d (%*[^)]) %c", &st) == 1;
    fclose(f);
    return ok && st != 'Z';
}

START_TEST(an_import_check_whose_leftovers_hold_its_output)
{
    char path[256], why[PREFLIGHT_WHY_MAX], mods[64], pidfile[256];
    char *env[] = {"PATH=/usr/bin:/bin", NULL};
    pack(mods, (const char *const[]){"torch", NULL});
    /* the import passes and exits, leaving a process that holds stdout and stderr open */
    snprintf(pidfile, sizeof(pidfile), "%s/left.pid", dir);
    char script[512];
    snprintf(script, sizeof(script), "#!/bin/sh\nsleep 60 &\necho $! > %s\nexit 0\n", pidfile);
    put_file("python-daemon", script, 0755, path, sizeof(path));
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ck_assert_msg(preflight_python(path, mods, env, 8000, why, sizeof(why)) == 0, "%s", why);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double took = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    ck_assert_msg(took < 4.0, "a passed import waited %.1f s on what it left running", took);
    FILE *f = fopen(pidfile, "r");
    long left = 0;
    ck_assert_ptr_nonnull(f);
    ck_assert_int_eq(fscanf(f, "%ld", &left), 1);
    fclose(f);
    for (int i = 0; i < 200 && alive((pid_t)left); i++) /* killed with the check's process group */
        usleep(10000);
    ck_assert_msg(!alive((pid_t)left), "process %ld the check started still runs", left);

    /* what it leaves writes on and on: the check ends soon after the import */
    put_file("python-chatty", "#!/bin/sh\nyes chatter &\nexit 0\n", 0755, path, sizeof(path));
    clock_gettime(CLOCK_MONOTONIC, &a);
    ck_assert_msg(preflight_python(path, mods, env, 8000, why, sizeof(why)) == 0, "%s", why);
    clock_gettime(CLOCK_MONOTONIC, &b);
    took = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    ck_assert_msg(took < 4.0, "a passed import waited %.1f s on the output of what it left running", took);

    /* megabytes on stderr: the tail is kept, the last line reported */
    put_file("python-loud", "#!/bin/sh\nhead -c 2000000 /dev/zero | tr '\\0' x >&2\n"
             "echo >&2\necho 'ModuleNotFoundError: the last line' >&2\nexit 1\n", 0755, path, sizeof(path));
    ck_assert_int_eq(preflight_python(path, mods, env, 20000, why, sizeof(why)), -ENOPKG);
    ck_assert_ptr_nonnull(strstr(why, "cannot import torch: ModuleNotFoundError: the last line"));
}
END_TEST

static int answers;

static void count_answer(struct agent_preflight *p, bool fit, const char *reason)
{
    (void)p, (void)fit, (void)reason;
    answers++;
}

static void close_pf(uv_timer_t *t)
{
    agent_preflight_close(t->data);
    uv_close((uv_handle_t *)t, NULL);
}

START_TEST(an_agent_that_stops_does_not_wait_for_an_import)
{
    char path[256];
    put_file("python3", "#!/bin/sh\nsleep 30\n", 0755, path, sizeof(path));
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    struct agent_preflight pf;
    agent_preflight_init(&pf, &loop, count_answer, NULL);
    struct preflight_inputs in = {.kind = PROTO_DEV_CPU, .ndevices = 1};
    job_spec_defaults(&in.spec);
    pack(in.spec.require_python_modules, (const char *const[]){"torch", NULL});
    snprintf(in.spec.require_python, sizeof(in.spec.require_python), "%s", path);
    in.spec.require_python_timeout_s = 15;
    ck_assert_int_eq(cmdline_from_string("python3 train.py", in.cmd, sizeof(in.cmd)), 0);
    agent_preflight_start(&pf, &in);
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    t.data = &pf;
    uv_timer_start(&t, close_pf, 300, 0); /* the agent stops while the import runs */
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    clock_gettime(CLOCK_MONOTONIC, &b);
    double took = (double)(b.tv_sec - a.tv_sec) + (double)(b.tv_nsec - a.tv_nsec) / 1e9;
    ck_assert_msg(took < 5.0, "the loop ended %.1f s after the stop", took);
    ck_assert_int_eq(answers, 0); /* a stopped pre-flight says nothing */
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

static void settle_pf(uv_timer_t *t)
{
    agent_preflight_settle(t->data);
    uv_close((uv_handle_t *)t, NULL);
}

/* The ASSIGN comes while the check a HELLO promised runs: that check still
 * answers (musterd waits for it), once, and no other follows. */
START_TEST(an_assignment_lets_the_check_under_way_answer)
{
    char path[256];
    put_file("python3", "#!/bin/sh\nsleep 0.5\n", 0755, path, sizeof(path));
    uv_loop_t loop;
    ck_assert_int_eq(uv_loop_init(&loop), 0);
    struct agent_preflight pf;
    answers = 0;
    agent_preflight_init(&pf, &loop, count_answer, NULL);
    struct preflight_inputs in = {.kind = PROTO_DEV_CPU, .ndevices = 1};
    job_spec_defaults(&in.spec);
    pack(in.spec.require_python_modules, (const char *const[]){"torch", NULL});
    snprintf(in.spec.require_python, sizeof(in.spec.require_python), "%s", path);
    in.spec.require_python_timeout_s = 15;
    ck_assert_int_eq(cmdline_from_string("python3 train.py", in.cmd, sizeof(in.cmd)), 0);
    agent_preflight_start(&pf, &in);
    uv_timer_t t;
    uv_timer_init(&loop, &t);
    t.data = &pf;
    uv_timer_start(&t, settle_pf, 100, 0); /* assigned while the import runs */
    uv_timer_t end;
    uv_timer_init(&loop, &end);
    end.data = &pf;
    uv_timer_start(&end, close_pf, 3000, 0); /* past the retry a failed check would start (PREFLIGHT_RETRY_MS) */
    ck_assert_int_eq(uv_run(&loop, UV_RUN_DEFAULT), 0);
    ck_assert_int_eq(answers, 1);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
}
END_TEST

/* Lines in a file (0 when it is missing). */
static int lines_in(const char *path)
{
    FILE *f = fopen(path, "r");
    int n = 0, c;
    while (f && (c = fgetc(f)) != EOF)
        n += c == '\n';
    if (f)
        fclose(f);
    return n;
}

START_TEST(agent_checks_a_programs_needs_once_per_interpreter)
{
    char bin[256], path[256], count[256], why[PREFLIGHT_WHY_MAX], text[512];
    snprintf(bin, sizeof(bin), "%s/bin", dir);
    ck_assert_int_eq(mkdir(bin, 0755), 0);
    snprintf(count, sizeof(count), "%s/runs", dir);
    /* a python that counts its runs and imports only when the command's env set OK=1 */
    snprintf(text, sizeof(text), "#!/bin/sh\necho run >> %s\n[ \"$OK\" = 1 ] && exit 0\n"
             "echo \"ModuleNotFoundError: No module named 'torch' (PYTHONPATH=$PYTHONPATH)\"\nexit 1\n", count);
    put_file("bin/python3", text, 0755, path, sizeof(path));
    char *old_path = getenv("PATH") ? strdup(getenv("PATH")) : NULL;
    setenv("PATH", bin, 1);

    struct preflight_inputs in = {.kind = PROTO_DEV_CPU, .ndevices = 1};
    struct preflight_result res = {0};
    job_spec_defaults(&in.spec);
    snprintf(in.spec.name, sizeof(in.spec.name), "t");
    const char *mods[] = {"torch", NULL};
    pack(in.spec.require_python_modules, mods);
    snprintf(in.python_path, sizeof(in.python_path), "/opt/muster/startup");
    ck_assert_int_eq(cmdline_from_string("python3 train.py", in.cmd, sizeof(in.cmd)), 0);
    ck_assert_int_eq(agent_preflight_check(&in, &res, why, sizeof(why)), -ENOPKG);
    ck_assert_ptr_nonnull(strstr(why, "python3 cannot import torch: ModuleNotFoundError: No module named 'torch' "
                                      "(PYTHONPATH=/opt/muster/startup)")); /* the rank's environment */
    ck_assert_uint_eq(res.python_ok, 0);

    /* `env OK=1 python3 ...`: the program is python3, run with OK=1; a success is remembered */
    ck_assert_int_eq(cmdline_from_string("env OK=1 python3 train.py", in.cmd, sizeof(in.cmd)), 0);
    ck_assert_int_eq(agent_preflight_check(&in, &res, why, sizeof(why)), 0);
    ck_assert_uint_ne(res.python_ok, 0);
    ck_assert_int_eq(lines_in(count), 2);
    ck_assert_int_eq(agent_preflight_check(&in, &res, why, sizeof(why)), 0);
    ck_assert_int_eq(lines_in(count), 2); /* not imported again */
    /* env's options with an argument are not the program */
    ck_assert_int_eq(cmdline_from_string("env -u NOPE --chdir /tmp OK=1 python3 train.py", in.cmd, sizeof(in.cmd)), 0);
    ck_assert_msg(agent_preflight_check(&in, &res, why, sizeof(why)) == 0, "%s", why);
    ck_assert_int_eq(lines_in(count), 2);
    ck_assert_int_eq(cmdline_from_string("env -S python3 train.py", in.cmd, sizeof(in.cmd)), 0);
    ck_assert_int_eq(agent_preflight_check(&in, &res, why, sizeof(why)), -EINVAL);
    ck_assert_ptr_nonnull(strstr(why, "env -S"));
    ck_assert_int_eq(cmdline_from_string("env OK=1 python3 train.py", in.cmd, sizeof(in.cmd)), 0);
    in.spec.require_python_timeout_s = 7; /* not part of what an import depends on */
    ck_assert_int_eq(agent_preflight_check(&in, &res, why, sizeof(why)), 0);
    ck_assert_int_eq(lines_in(count), 2);
    const char *more[] = {"torch", "deepspeed", NULL};
    pack(in.spec.require_python_modules, more); /* other modules: checked again */
    ck_assert_int_eq(agent_preflight_check(&in, &res, why, sizeof(why)), 0);
    ck_assert_int_eq(lines_in(count), 3);

    /* the paths, then the latest checkpoint it reports */
    snprintf(in.spec.require_readable, sizeof(in.spec.require_readable), "%s/nowhere", dir);
    in.spec.require_readable[strlen(in.spec.require_readable) + 1] = '\0';
    ck_assert_int_eq(agent_preflight_check(&in, &res, why, sizeof(why)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, "require_readable "));
    ck_assert(!res.has_checkpoint);
    in.spec.require_readable[0] = in.spec.require_readable[1] = '\0';
    snprintf(in.spec.checkpoint_dir, sizeof(in.spec.checkpoint_dir), "%s/ck", dir);
    snprintf(in.spec.checkpoint_latest, sizeof(in.spec.checkpoint_latest), "glob:step_*");
    snprintf(path, sizeof(path), "%s/ck", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    snprintf(path, sizeof(path), "%s/ck/step_12", dir);
    ck_assert_int_eq(mkdir(path, 0755), 0);
    ck_assert_int_eq(agent_preflight_check(&in, &res, why, sizeof(why)), 0);
    ck_assert(res.has_checkpoint);
    ck_assert_str_eq(res.checkpoint, "step_12");
    if (old_path) {
        setenv("PATH", old_path, 1);
        free(old_path);
    }
}
END_TEST

/* memory_checkpoint_mb against the node's memory: the figures named, what the job's directory holds counted as its own. */
START_TEST(memory_checkpoint_size_fits_memory)
{
    char why[PREFLIGHT_WHY_MAX], job[sizeof(dir) + 32], missing[sizeof(dir) + 16], file[sizeof(dir) + 16];
    snprintf(job, sizeof(job), "%s/muster-j", dir);
    ck_assert_int_eq(preflight_memory_ckpt(dir, job, 1, why, sizeof(why)), 0);
    ck_assert_int_eq(preflight_memory_ckpt(dir, job, 1ull << 40, why, sizeof(why)), -ENOMEM);
    ck_assert_ptr_nonnull(strstr(why, "memory_checkpoint_mb: 1099511627776 MiB asked for "));
    ck_assert_ptr_nonnull(strstr(why, "MiB of memory available (MemAvailable "));
    ck_assert_ptr_nonnull(strstr(why, "lower memory_checkpoint_mb or free memory"));
    /* 8 MiB already in the job's directory count toward what it may use */
    ck_assert_int_eq(mkdir(job, 0700), 0);
    char big[sizeof(job) + 8];
    snprintf(big, sizeof(big), "%s/blob", job);
    FILE *f = fopen(big, "w");
    ck_assert_ptr_nonnull(f);
    static char chunk[1 << 20];
    memset(chunk, 1, sizeof(chunk));
    for (int i = 0; i < 8; i++)
        ck_assert_uint_eq(fwrite(chunk, 1, sizeof(chunk), f), sizeof(chunk));
    fclose(f);
    ck_assert_int_eq(preflight_memory_ckpt(dir, job, 1ull << 40, why, sizeof(why)), -ENOMEM);
    ck_assert_ptr_nonnull(strstr(why, "and 8 MiB in the directory already"));
    snprintf(missing, sizeof(missing), "%s/none", dir);
    ck_assert_int_eq(preflight_memory_ckpt(missing, job, 1, why, sizeof(why)), -ENOENT);
    ck_assert_ptr_nonnull(strstr(why, "memory_checkpoint_root "));
    ck_assert_ptr_nonnull(strstr(why, "/none: No such file or directory"));
    snprintf(file, sizeof(file), "%s/file", dir);
    fclose(fopen(file, "w"));
    ck_assert_int_eq(preflight_memory_ckpt(file, job, 1, why, sizeof(why)), -ENOTDIR);
}
END_TEST

Suite *make_preflight_suite(void)
{
    Suite *s = suite_create("preflight");
    TCase *tc = tcase_create("preflight");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 20); /* processes are started: room for a loaded machine */
    tcase_add_test(tc, data_files_are_checked_like_the_trainer_reads_them);
    tcase_add_test(tc, checkpoint_dir_writable_with_room_for_two);
    tcase_add_test(tc, memory_checkpoint_size_fits_memory);
    tcase_add_test(tc, clock_skew_beyond_the_round_trip_fails);
    tcase_add_test(tc, required_paths_readable_and_directories_writable);
    tcase_add_test(tc, latest_checkpoint_by_file_or_by_glob);
    tcase_add_test(tc, hostile_checkpoint_dirs_neither_block_nor_leak_control_characters);
    tcase_add_test(tc, hostile_required_paths_answer_at_once);
    tcase_add_test(tc, a_terminal_named_in_require_readable_does_not_become_the_agents);
    tcase_add_test(tc, the_interpreter_a_rank_program_runs);
    tcase_add_test(tc, imports_run_with_the_environment_given_and_bounded);
    tcase_add_test(tc, an_import_check_whose_leftovers_hold_its_output);
    tcase_add_test(tc, agent_checks_a_programs_needs_once_per_interpreter);
    tcase_add_test(tc, an_agent_that_stops_does_not_wait_for_an_import);
    tcase_add_test(tc, an_assignment_lets_the_check_under_way_answer);
    suite_add_tcase(s, tc);
    return s;
}
