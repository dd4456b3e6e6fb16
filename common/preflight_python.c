/*
 * The Python part of the pre-flight (common/preflight.h): which interpreter
 * a rank's program runs, and whether it imports the modules the job needs,
 * run as the rank would be (same environment), in a child killed at the
 * deadline.
 */
#include "common/preflight.h"
#include "common/jobspec.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define OUTPUT_KEPT 4096
#define AFTER_EXIT_MS 500 /* output read after the check has ended */

static int executable(const char *path)
{
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode) && access(path, X_OK) == 0;
}

/* name as execvp finds it: as given when it has a '/', else the first executable on path_var. */
static int lookup(const char *name, const char *path_var, char *out, size_t cap)
{
    if (strchr(name, '/')) { /* kept, not resolved: a venv's bin/python is a symlink whose place matters */
        struct stat st;
        if (!executable(name)) /* a directory, a file without x, a path through a symlink loop ... */
            return stat(name, &st) != 0 ? -errno : S_ISDIR(st.st_mode) ? -EISDIR : -EACCES;
        char cwd[PATH_MAX] = "";
        if (name[0] != '/' && !getcwd(cwd, sizeof(cwd)))
            return -errno;
        if ((size_t)snprintf(out, cap, "%s%s%s", cwd, cwd[0] ? "/" : "", name) >= cap)
            return -ENAMETOOLONG;
        return 0;
    }
    const char *p = path_var && *path_var ? path_var : "/usr/local/bin:/usr/bin:/bin";
    while (*p) {
        size_t n = strcspn(p, ":");
        char cand[PATH_MAX];
        if (n > 0 && n + strlen(name) + 2 <= sizeof(cand)) {
            snprintf(cand, sizeof(cand), "%.*s/%s", (int)n, p, name);
            if (executable(cand)) {
                if (strlen(cand) >= cap)
                    return -ENAMETOOLONG;
                snprintf(out, cap, "%s", cand);
                return 0;
            }
        }
        p += n + (p[n] == ':');
    }
    return -ENOENT;
}

static int pythonish(const char *path)
{
    const char *base = strrchr(path, '/');
    return strncmp(base ? base + 1 : path, "python", 6) == 0;
}

/* The interpreter a "#!" line names, looked up (through env); "" when the file has none. */
static int shebang(const char *file, const char *path_var, char *out, size_t cap)
{
    out[0] = '\0';
    FILE *f = fopen(file, "re");
    if (!f)
        return 0;
    char line[512];
    int got = fgets(line, sizeof(line), f) != NULL;
    fclose(f);
    if (!got || strncmp(line, "#!", 2) != 0)
        return 0;
    char *save = NULL, *interp = strtok_r(line + 2, " \t\r\n", &save);
    if (!interp)
        return 0;
    const char *base = strrchr(interp, '/');
    if (strcmp(base ? base + 1 : interp, "env") == 0) {
        char *arg = strtok_r(NULL, " \t\r\n", &save);
        while (arg && arg[0] == '-') /* env -S, env -i ... */
            arg = strtok_r(NULL, " \t\r\n", &save);
        return arg ? lookup(arg, path_var, out, cap) : 0;
    }
    return lookup(interp, path_var, out, cap);
}

int preflight_interpreter(const char *prog, const char *explicit_interp, const char *path_var, char *out,
                          size_t cap, char *why, size_t len)
{
    int rc;
    if (explicit_interp && explicit_interp[0]) {
        if ((rc = lookup(explicit_interp, path_var, out, cap)) != 0)
            return preflight_why(why, len, rc, "require_python %s: %s on this node (PATH %s)", explicit_interp,
                        strerror(-rc), path_var ? path_var : "unset");
        return 0;
    }
    char file[PATH_MAX];
    if ((rc = lookup(prog, path_var, file, sizeof(file))) != 0)
        return preflight_why(why, len, rc, "the rank program %s: %s on this node (PATH %s)", prog, strerror(-rc),
                    path_var ? path_var : "unset");
    if (pythonish(file)) {
        if (strlen(file) >= cap)
            return preflight_why(why, len, -ENAMETOOLONG, "the rank program %s: path too long", file);
        snprintf(out, cap, "%s", file);
        return 0;
    }
    rc = shebang(file, path_var, out, cap);
    if (rc == 0 && out[0] && pythonish(out))
        return 0;
    if (rc)
        return preflight_why(why, len, rc, "the rank program %s: its #! interpreter: %s", file, strerror(-rc));
    return preflight_why(why, len, -ENOEXEC, "the rank program %s is not a Python interpreter or script: name the "
                "interpreter in require_python", file);
}

/* "import a, b.c" from the packed list, and "a,b.c" for messages. */
static int import_line(const char *modules, char *out, size_t cap, char *list, size_t lcap)
{
    /* -c puts the working directory (the agent's) first on sys.path: a module planted there would be
     * what imports. The rank finds its script's directory there instead; neither is the check's. (-P
     * does this only from Python 3.11 on.) */
    size_t n = (size_t)snprintf(out, cap, "import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; import ");
    list[0] = '\0';
    for (const char *m = modules; *m; m += strlen(m) + 1) {
        if (!job_spec_module_valid(m))
            return -EINVAL;
        int w = snprintf(out + n, cap - n, "%s%s", m == modules ? "" : ", ", m);
        if (w < 0 || (size_t)w >= cap - n)
            return -E2BIG;
        n += (size_t)w;
        size_t l = strlen(list);
        snprintf(list + l, lcap - l, "%s%s", l ? "," : "", m);
    }
    return list[0] ? 0 : -EINVAL;
}

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* The last non-empty line of buf[0..n). */
static void last_line(char *buf, size_t n, char *out, size_t cap)
{
    while (n > 0 && (buf[n - 1] == '\n' || buf[n - 1] == '\r' || buf[n - 1] == ' '))
        n--;
    size_t start = n;
    while (start > 0 && buf[start - 1] != '\n')
        start--;
    snprintf(out, cap, "%.*s", (int)(n - start), buf + start);
    for (char *c = out; *c; c++)
        if ((unsigned char)*c < 0x20 || (unsigned char)*c > 0x7e)
            *c = '?';
}

/* The import check running now (0: none), for preflight_python_abort; its pid is not
 * reaped while it is here, so that the group it names is still the check's. */
static pthread_mutex_t running_lock = PTHREAD_MUTEX_INITIALIZER;
static pid_t running;
static int aborted;

static void set_running(pid_t pid)
{
    pthread_mutex_lock(&running_lock);
    running = pid;
    if (pid && aborted)
        kill(-pid, SIGKILL);
    pthread_mutex_unlock(&running_lock);
}

void preflight_python_abort(void)
{
    pthread_mutex_lock(&running_lock);
    aborted = 1;
    if (running)
        kill(-running, SIGKILL);
    pthread_mutex_unlock(&running_lock);
}

/* The child has ended (not reaped: its pid, and so its process group, stays ours to signal). */
static int ended(pid_t pid)
{
    siginfo_t si;
    memset(&si, 0, sizeof(si));
    return waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG | WNOWAIT) == 0 && si.si_pid == pid;
}

/*
 * Reads the child's output, keeping the tail, until the output closes, or
 * the child has ended and nothing more is waiting (something it started may
 * hold the pipe open), or the deadline. 1 = the deadline came first.
 */
static int drain(int fd, pid_t pid, int64_t end, char *buf, size_t *n)
{
    int gone = 0;
    for (;;) {
        if (!gone && (gone = ended(pid)) && end > now_ms() + AFTER_EXIT_MS)
            end = now_ms() + AFTER_EXIT_MS; /* what it left may write on and on: not waited for long */
        int64_t left = end - now_ms();
        if (left <= 0)
            return !gone;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, gone ? 0 : (int)(left < 50 ? left : 50));
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0 || (r == 0 && gone))
            return 0;
        if (r == 0)
            continue;
        char chunk[1024];
        ssize_t got = read(fd, chunk, sizeof(chunk));
        if (got < 0 && errno == EINTR)
            continue;
        if (got <= 0)
            return 0;
        if (*n + (size_t)got > OUTPUT_KEPT) { /* keep the tail: the error is at the end */
            size_t drop = *n + (size_t)got - OUTPUT_KEPT;
            drop = drop > *n ? *n : drop;
            memmove(buf, buf + drop, *n - drop);
            *n -= drop;
        }
        size_t take = (size_t)got > OUTPUT_KEPT ? OUTPUT_KEPT : (size_t)got;
        memcpy(buf + *n, chunk + got - (ssize_t)take, take);
        *n += take;
    }
}

int preflight_python(const char *interp, const char *modules, char *const *env, int timeout_ms, char *why,
                     size_t len)
{
    return preflight_python_as(NULL, interp, modules, env, timeout_ms, why, len);
}

int preflight_python_as(char *const *wrap, const char *interp, const char *modules, char *const *env,
                        int timeout_ms, char *why, size_t len)
{
    char code[4096], list[1024];
    int rc = import_line(modules, code, sizeof(code), list, sizeof(list));
    if (rc)
        return preflight_why(why, len, rc, "require_python_modules: expected module names (a.b), got an empty or "
                    "invalid one");
    int fds[2];
    if (pipe2(fds, O_CLOEXEC) != 0)
        return preflight_why(why, len, -errno, "require_python: pipe: %s", strerror(errno));
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 1);
    posix_spawn_file_actions_adddup2(&fa, fds[1], 2);
    posix_spawnattr_init(&at);
    posix_spawnattr_setflags(&at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(&at, 0); /* its own group: a timeout kills what it started too */
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&at, &none);
    posix_spawnattr_setsigdefault(&at, &all);
    char *argv[PREFLIGHT_WRAP_MAX + 4];
    size_t w = 0;
    for (; wrap && wrap[w] && w < PREFLIGHT_WRAP_MAX; w++)
        argv[w] = wrap[w];
    argv[w] = (char *)interp;
    argv[w + 1] = "-c";
    argv[w + 2] = code;
    argv[w + 3] = NULL;
    pid_t pid;
    int e = posix_spawn(&pid, argv[0], &fa, &at, argv, env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(fds[1]);
    if (e) {
        close(fds[0]);
        return preflight_why(why, len, -e, "require_python: cannot run %s: %s", interp, strerror(e));
    }
    set_running(pid);
    char out[OUTPUT_KEPT];
    size_t n = 0;
    int64_t end = now_ms() + timeout_ms;
    int timed_out = drain(fds[0], pid, end, out, &n);
    close(fds[0]);
    while (!timed_out && !ended(pid)) { /* its output closed: it ends soon */
        timed_out = now_ms() >= end;
        if (!timed_out)
            usleep(10000);
    }
    kill(-pid, SIGKILL); /* all of it at the deadline, else what it left running */
    set_running(0);
    int status = 0;
    while (waitpid(pid, &status, 0) < 0 && errno == EINTR)
        ;
    char tail[300];
    last_line(out, n, tail, sizeof(tail));
    if (timed_out)
        return preflight_why(why, len, -ETIMEDOUT, "require_python: %s -c 'import %s' did not finish within %d s: "
                    "raise require_python_timeout_s or find what the import waits on", interp, list,
                    timeout_ms / 1000);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0)
        return 0;
    if (WIFSIGNALED(status))
        return preflight_why(why, len, -ECHILD, "require_python: %s -c 'import %s' was killed by signal %d%s%s", interp,
                    list, WTERMSIG(status), tail[0] ? ": " : "", tail);
    return preflight_why(why, len, -ENOPKG, "require_python: %s cannot import %s: %s: install them for that interpreter "
                "or point rank_cmd at one that has them", interp, list,
                tail[0] ? tail : "(it printed nothing)");
}
