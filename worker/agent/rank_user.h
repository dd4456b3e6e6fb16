/*
 * rank_user: the user and group every process the agent starts for a job
 * runs as (ranks, the warm spare, the pre-flight's program check), so that
 * user code cannot read the cluster token or act with the agent's rights.
 *
 * Names are resolved once, at start-up (rank_user_resolve). uv_spawn and
 * posix_spawn cannot run code between fork and exec, so a process is started
 * through this same program: rank_user_argv() puts
 * `muster-worker --rank-exec UID GID GROUPS --` in front of its command, and
 * rank_user_exec() (run by main() before anything else) sets the
 * supplementary groups, the group, then the user, drops every capability,
 * checks that it cannot become root again and execs the command. Nothing is
 * left of the agent in the process but its environment and descriptors,
 * which the agent chose.
 */
#ifndef MUSTER_WORKER_RANK_USER_H
#define MUSTER_WORKER_RANK_USER_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#define RANK_USER_EXEC_FLAG "--rank-exec"
#define RANK_USER_MAX_GROUPS 64

struct rank_user {
    bool set;               /* false: ranks run as the agent (no rank_user) */
    uid_t uid;
    gid_t gid;              /* rank_group, else the user's primary group */
    int ngroups;            /* supplementary groups: the user's (initgroups' list), or gid alone */
    gid_t groups[RANK_USER_MAX_GROUPS];
    char name[64];          /* for messages */
    char exe[PATH_MAX];     /* this program, which drops to the user and execs */
};

/*
 * Resolves user (a name or a numeric uid; NULL or "" = none: ru->set false)
 * and group (a name or gid; NULL or "" = the user's primary group; only
 * with a user). Checks that this process can switch to them: root, or
 * CAP_SETUID and CAP_SETGID in its effective set; when the user and group
 * (and no other group) are this process's own already, ru->set stays
 * false. 0, or -EINVAL / -EPERM with err saying "KEY: what" (the caller
 * puts the file or flag in front).
 */
int rank_user_resolve(const char *user, const char *group, struct rank_user *ru, char *err, size_t cap);

/*
 * argv to run as ru: a malloc'd copy (free with cmdline_free), prefixed with
 * the drop when ru is set. NULL when out of memory.
 */
char **rank_user_argv(const struct rank_user *ru, char *const *argv);

/*
 * Gives the rank user a directory the agent made for it: dir (under base,
 * both the agent's) becomes group ru->gid, mode 0770, and every directory
 * from base down to dir's parent group ru->gid, mode 0710 (the rank may
 * pass, not list). The agent stays the owner, so it still writes the rank's
 * log there and reads what the rank wrote. Opened without following links.
 * 0 or -errno; nothing is done when ru is not set.
 */
int rank_user_grant_dir(const struct rank_user *ru, const char *base, const char *dir);

/*
 * main() of `muster-worker --rank-exec UID GID G1,G2,... -- PROGRAM ARG...`:
 * drops to the ids and execs PROGRAM (searched on $PATH). Returns only on
 * failure (said on stderr, which is the rank's): 126 when the drop failed,
 * 127 when PROGRAM could not be run, 2 on malformed arguments.
 */
int rank_user_exec(int argc, char **argv);

/* Parses "UID GID GROUPS" as rank_user_exec takes them; 0 or -EINVAL. Exposed for the tests. */
int rank_user_parse_ids(const char *uid, const char *gid, const char *groups, struct rank_user *ru);

#endif
