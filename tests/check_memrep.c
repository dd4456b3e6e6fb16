/* Memory checkpoint replicas: the buddy map (common/memtags.h), and a node's
 * side of the copies (worker/agent/memrep.h) on a temporary directory with a
 * recording link: what goes out, what is taken in, what is refused. No mount. */
#include <check.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/memtags.h"
#include "tests/check_tmpdir.h"
#include "worker/agent/memrep.h"

static char root[] = "/tmp/check-memrep.XXXXXX";

static void setup(void) { tmpdir_make(root); }
static void teardown(void) { tmpdir_remove(root); }

START_TEST(buddy_is_the_next_member_or_the_next_domain)
{
    for (size_t i = 0; i < 4; i++)
        ck_assert_uint_eq(memtags_buddy(NULL, 4, i), (i + 1) % 4);
    ck_assert_uint_eq(memtags_buddy(NULL, 1, 0), 1); /* alone: none */
    ck_assert_uint_eq(memtags_buddy(NULL, 3, 3), 3);
    /* two racks of two: dealt r1 r2 r1 r2, every copy in the other rack */
    const char *const two[] = {"r1", "r1", "r2", "r2"};
    size_t seen[4] = {0};
    for (size_t i = 0; i < 4; i++) {
        size_t b = memtags_buddy(two, 4, i);
        ck_assert_uint_lt(b, 4);
        ck_assert_str_ne(two[b], two[i]);
        seen[b]++;
    }
    for (size_t i = 0; i < 4; i++)
        ck_assert_uint_eq(seen[i], 1); /* a rotation: each holds one other's */
    /* three in one rack, one in another: the lone one's rack gets one copy, one node's copy must stay */
    const char *const lop[] = {"r1", "r1", "r1", "r2"};
    ck_assert_uint_eq(memtags_buddy(lop, 4, 0), 3);
    ck_assert_uint_eq(memtags_buddy(lop, 4, 3), 1);
    const char *const same[] = {"x", "x", "x"};
    for (size_t i = 0; i < 3; i++) /* labels all alike: the plain rule */
        ck_assert_uint_eq(memtags_buddy(same, 3, i), (i + 1) % 3);
    /* unlabelled among labelled: each a domain of its own, dealt 0 1 3 2 */
    const char *const some[] = {"r1", NULL, "r1", NULL};
    const size_t some_buddy[] = {1, 3, 0, 2};
    for (size_t i = 0; i < 4; i++)
        ck_assert_uint_eq(memtags_buddy(some, 4, i), some_buddy[i]);
}
END_TEST

/* The deal as the map's comment tells it, dealt out: one round takes the next node of each domain in turn. */
static size_t dealt_buddy(const char *const *domains, size_t n, size_t i)
{
    size_t dealt[16], k = 0;
    int taken[16] = {0};
    while (k < n)
        for (size_t d = 0; d < n; d++) {
            int first = 1; /* d is its domain's first node */
            for (size_t j = 0; j < d; j++)
                first &= strcmp(domains[j], domains[d]) != 0;
            for (size_t j = 0; first && j < n; j++)
                if (!taken[j] && strcmp(domains[j], domains[d]) == 0) {
                    taken[j] = 1;
                    dealt[k++] = j;
                    break;
                }
        }
    for (k = 0; k < n; k++)
        if (dealt[k] == i)
            return dealt[(k + 1) % n];
    return n;
}

/* Random label sets of 2..16 nodes, some unlabelled (NULL: for the deal, a label of its own). */
START_TEST(buddy_map_agrees_with_dealing_every_label_set)
{
    static const char *const labels[] = {"r1", "r2", "r3", NULL};
    static const char *const own[] = {"u0", "u1", "u2", "u3", "u4", "u5", "u6", "u7",
                                      "u8", "u9", "u10", "u11", "u12", "u13", "u14", "u15"};
    const char *domains[16], *named[16];
    unsigned seed = 35;
    for (int t = 0; t < 2000; t++) {
        size_t n = 2 + (size_t)(rand_r(&seed) % 15), nlabels = 1 + (size_t)(rand_r(&seed) % 4);
        for (size_t i = 0; i < n; i++) {
            domains[i] = labels[rand_r(&seed) % nlabels];
            named[i] = domains[i] ? domains[i] : own[i];
        }
        unsigned seen[16] = {0};
        for (size_t i = 0; i < n; i++) {
            size_t b = memtags_buddy(domains, n, i);
            ck_assert_uint_eq(b, dealt_buddy(named, n, i));
            ck_assert_uint_ne(b, i);
            seen[b]++;
        }
        for (size_t i = 0; i < n; i++)
            ck_assert_uint_eq(seen[i], 1); /* a rotation */
    }
}
END_TEST

static void write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    ck_assert_ptr_nonnull(f);
    fputs(text, f);
    fclose(f);
}

START_TEST(paths_are_opened_without_following_links)
{
    char p[PATH_MAX];
    int dfd = open(root, O_RDONLY | O_DIRECTORY);
    ck_assert_int_ge(dfd, 0);
    int fd = memrep_open_under(dfd, "a/b/c.bin", true, 0600);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(memrep_open_under(dfd, "a/b/c.bin", true, 0600), -EEXIST); /* a file sent twice */
    fd = memrep_open_under(dfd, "a/b/c.bin", false, 0);
    ck_assert_int_ge(fd, 0);
    close(fd);
    ck_assert_int_eq(memrep_open_under(dfd, "../x", true, 0600), -EINVAL);
    ck_assert_int_eq(memrep_open_under(dfd, "/etc/passwd", false, 0), -EINVAL);
    snprintf(p, sizeof(p), "%s/out", root); /* a link planted on the way, to a directory and to a file */
    ck_assert_int_eq(symlink("/tmp", p), 0);
    ck_assert_int_lt(memrep_open_under(dfd, "out/x", true, 0600), 0);
    snprintf(p, sizeof(p), "%s/pw", root);
    ck_assert_int_eq(symlink("/etc/passwd", p), 0);
    ck_assert_int_eq(memrep_open_under(dfd, "pw", false, 0), -ELOOP);
    snprintf(p, sizeof(p), "%s/fifo", root);
    ck_assert_int_eq(mkfifo(p, 0600), 0);
    ck_assert_int_eq(memrep_open_under(dfd, "fifo", false, 0), -ELOOP); /* and it does not block */
    close(dfd);
}
END_TEST

START_TEST(listing_takes_regular_files_only_within_bounds)
{
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/tag", root);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/tag/z", root);
    write_file(p, "zz");
    snprintf(p, sizeof(p), "%s/tag/meta", root);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/tag/meta/a.json", root);
    write_file(p, "{}\n");
    snprintf(p, sizeof(p), "%s/tag", root);
    int dfd = open(p, O_RDONLY | O_DIRECTORY);
    static char paths[8][PROTO_MEMPATH_MAX];
    uint64_t sizes[8];
    ck_assert_int_eq(memrep_list(dfd, paths, sizes, 8, 1000), 2);
    ck_assert_str_eq(paths[0], "meta/a.json"); /* depth first, name order */
    ck_assert_uint_eq(sizes[0], 3);
    ck_assert_str_eq(paths[1], "z");
    ck_assert_int_eq(memrep_list(dfd, paths, sizes, 8, 4), -EFBIG);
    ck_assert_int_eq(memrep_list(dfd, paths, sizes, 1, 1000), -E2BIG);
    snprintf(p, sizeof(p), "%s/tag/meta/link", root);
    ck_assert_int_eq(symlink("/etc/passwd", p), 0);
    ck_assert_int_eq(memrep_list(dfd, paths, sizes, 8, 1000), -ELOOP); /* never sent */
    close(dfd);
}
END_TEST

/* ---- the copies, through a recording link ---- */

#define MAX_FRAMES 64
static struct proto_msg frames[MAX_FRAMES];
static int nframes, fetched;

static int rec_send(void *ctx, const struct proto_msg *m)
{
    (void)ctx;
    ck_assert_int_lt(nframes, MAX_FRAMES);
    frames[nframes] = *m;
    if (m->u.mem_file.len) { /* the sender's buffer is reused */
        frames[nframes].u.mem_file.data = malloc(m->u.mem_file.len);
        memcpy(frames[nframes].u.mem_file.data, m->u.mem_file.data, m->u.mem_file.len);
    }
    nframes++;
    return 0;
}
static size_t rec_queued(void *ctx) { (void)ctx; return 0; }
static void rec_fetched(void *ctx) { (void)ctx; fetched++; }

static uv_loop_t loop;
static struct memckpt mem;
static struct memrep rep;

/* memrep of node self, its ranks' directory root/mine, the replicas it holds in root/held; no mount. */
static void rep_open(const char *self)
{
    nframes = fetched = 0;
    uv_loop_init(&loop);
    memset(&mem, 0, sizeof(mem));
    mem.on = true;
    mem.keep = 2;
    snprintf(mem.rule, sizeof(mem.rule), "glob:step*");
    snprintf(mem.dir, sizeof(mem.dir), "%s/mine", root);
    ck_assert_int_eq(mkdir(mem.dir, 0700), 0);
    struct memrep_link link = {.send = rec_send, .queued = rec_queued, .fetched = rec_fetched};
    memrep_init(&rep, &loop, &mem, self, &link);
    rep.on = true;
    rep.rate = 1ull << 30;
    rep.limit = 1ull << 20;
    rep.keep = 2;
    snprintf(rep.dir, sizeof(rep.dir), "%s/held", root);
    ck_assert_int_eq(mkdir(rep.dir, 0700), 0);
}

static void rep_close(void)
{
    memrep_close(&rep, false);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(uv_loop_close(&loop), 0);
    for (int i = 0; i < nframes; i++)
        free(frames[i].u.mem_file.data);
}

static struct proto_msg piece(const char *owner, const char *tag, int restore, const char *path, uint64_t offset,
                              uint64_t size, const char *data)
{
    struct proto_msg m = {.type = PROTO_MEM_FILE};
    snprintf(m.u.mem_file.owner, sizeof(m.u.mem_file.owner), "%s", owner);
    snprintf(m.u.mem_file.tag, sizeof(m.u.mem_file.tag), "%s", tag);
    snprintf(m.u.mem_file.path, sizeof(m.u.mem_file.path), "%s", path);
    m.u.mem_file.restore = restore;
    m.u.mem_file.begin = offset == 0 && strcmp(path, "a") == 0;
    m.u.mem_file.end = path[0] == '\0';
    m.u.mem_file.offset = offset;
    m.u.mem_file.size = size;
    m.u.mem_file.len = data ? (uint32_t)strlen(data) : 0;
    m.u.mem_file.data = (uint8_t *)data;
    return m;
}

static void take(struct proto_msg m) { memrep_on_msg(&rep, &m); }

static int exists(const char *rel)
{
    char p[PATH_MAX];
    struct stat st;
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    return lstat(p, &st) == 0;
}

static void assert_text(const char *rel, const char *want)
{
    char p[PATH_MAX], got[64] = "";
    snprintf(p, sizeof(p), "%s/%s", root, rel);
    FILE *f = fopen(p, "r");
    ck_assert_ptr_nonnull(f);
    size_t n = fread(got, 1, sizeof(got) - 1, f);
    got[n] = '\0';
    fclose(f);
    ck_assert_str_eq(got, want);
}

START_TEST(a_buddy_takes_whole_copies_only)
{
    rep_open("a");
    take(piece("b", "step5", 0, "a", 0, 6, "abc"));
    take(piece("b", "step5", 0, "a", 3, 6, "def"));
    take(piece("b", "step5", 0, "d/e", 0, 2, "xy"));
    ck_assert(!exists("held/step5")); /* not before its end */
    take(piece("b", "step5", 0, "", 0, 0, NULL));
    assert_text("held/step5/a", "abcdef");
    assert_text("held/step5/d/e", "xy");
    ck_assert_uint_eq(rep.nheld, 1);
    ck_assert_str_eq(rep.replica_of, "b");
    static struct proto_msg hb;
    proto_heartbeat_start(&hb);
    memrep_heartbeat(&rep, &hb.u.heartbeat);
    ck_assert_str_eq(hb.u.heartbeat.replica_of, "b");
    ck_assert_uint_eq(hb.u.heartbeat.nreplica, 1);
    ck_assert_str_eq(hb.u.heartbeat.replica[0], "step5");

    /* a gap: the whole copy goes, what follows of it is not taken */
    take(piece("b", "step10", 0, "a", 0, 6, "ab"));
    take(piece("b", "step10", 0, "a", 1, 6, "cdef")); /* as many bytes as the file has, but not in order */
    take(piece("b", "step10", 0, "", 0, 0, NULL));
    ck_assert(!exists("held/step10"));
    ck_assert(!exists("held/.muster-in-step10"));
    /* a file ending short at the end; a file sent twice; past memory_checkpoint_mb */
    take(piece("b", "step15", 0, "a", 0, 6, "abc"));
    take(piece("b", "step15", 0, "", 0, 0, NULL));
    ck_assert(!exists("held/step15"));
    take(piece("b", "step20", 0, "a", 0, 1, "a"));
    struct proto_msg again = piece("b", "step20", 0, "a", 0, 1, "a");
    again.u.mem_file.begin = 0; /* the same file within the one copy */
    take(again);
    take(piece("b", "step20", 0, "", 0, 0, NULL));
    ck_assert(!exists("held/step20"));
    rep.limit = 4;
    take(piece("b", "step25", 0, "a", 0, 6, "abc"));
    take(piece("b", "step25", 0, "a", 3, 6, "def"));
    take(piece("b", "step25", 0, "", 0, 0, NULL));
    ck_assert(!exists("held/step25"));
    rep.limit = 1 << 20;
    /* keep 2: the oldest goes */
    take(piece("b", "step30", 0, "a", 0, 1, "3"));
    take(piece("b", "step30", 0, "", 0, 0, NULL));
    take(piece("b", "step35", 0, "a", 0, 1, "4"));
    take(piece("b", "step35", 0, "", 0, 0, NULL));
    ck_assert(!exists("held/step5"));
    ck_assert_uint_eq(rep.nheld, 2);
    ck_assert_str_eq(rep.held[1], "step35");
    /* another owner: the old one's copies go */
    take(piece("c", "step1", 0, "a", 0, 1, "c"));
    take(piece("c", "step1", 0, "", 0, 0, NULL));
    ck_assert(!exists("held/step35"));
    ck_assert_str_eq(rep.replica_of, "c");
    ck_assert_uint_eq(rep.nheld, 1);
    /* not its to take: its own files as a replica, another node's as given back */
    take(piece("a", "step9", 0, "a", 0, 1, "x"));
    take(piece("a", "step9", 0, "", 0, 0, NULL));
    take(piece("b", "step9", 1, "a", 0, 1, "x"));
    take(piece("b", "step9", 1, "", 0, 0, NULL));
    ck_assert(!exists("held/step9"));
    ck_assert(!exists("mine/step9"));
    ck_assert_int_eq(nframes, 0);
    rep_close();
}
END_TEST

START_TEST(a_copy_goes_out_and_comes_back_whole)
{
    rep_open("b");
    take(piece("c", "step5", 0, "a", 0, 4, "held"));
    take(piece("c", "step5", 0, "", 0, 0, NULL));
    /* musterd asks for c's step5: it goes back to c, whole, begun and ended */
    struct proto_msg q = {.type = PROTO_MEM_FETCH};
    strcpy(q.u.mem_fetch.owner, "c");
    strcpy(q.u.mem_fetch.tag, "step5");
    memrep_on_msg(&rep, &q);
    uv_run(&loop, UV_RUN_DEFAULT); /* the timer stops once nothing is left to send */
    ck_assert_int_eq(nframes, 2);
    ck_assert_int_eq(frames[0].u.mem_file.restore, 1);
    ck_assert_int_eq(frames[0].u.mem_file.begin, 1);
    ck_assert_str_eq(frames[0].u.mem_file.owner, "c");
    ck_assert_str_eq(frames[0].u.mem_file.path, "a");
    ck_assert_uint_eq(frames[0].u.mem_file.len, 4);
    ck_assert(memcmp(frames[0].u.mem_file.data, "held", 4) == 0);
    ck_assert_int_eq(frames[1].u.mem_file.end, 1);
    strcpy(q.u.mem_fetch.tag, "step10"); /* one it does not hold: nothing */
    memrep_on_msg(&rep, &q);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(nframes, 2);

    /* its own files come back before its ranks start: they wait, then the checkpoint counts as complete */
    struct proto_assign as = {.generation = 4, .has_memckpt = 1};
    strcpy(as.memckpt, "step10");
    strcpy(as.memckpt_from, "a");
    ck_assert(memrep_waits(&rep, &as));
    ck_assert(memrep_waits(&rep, &as));
    take(piece("b", "step10", 1, "a", 0, 3, "own"));
    ck_assert_int_eq(fetched, 0);
    take(piece("b", "step10", 1, "", 0, 0, NULL));
    ck_assert_int_eq(fetched, 1);
    ck_assert(!memrep_waits(&rep, &as));
    assert_text("mine/step10/a", "own");
    char names[2][PROTO_CKPT_NAME_MAX];
    ck_assert_uint_eq(memckpt_complete(&mem, names, 2), 1);
    ck_assert_str_eq(names[0], "step10");
    /* ... and it is not sent to the buddy again: the buddy has it */
    static struct proto_msg hb;
    proto_heartbeat_start(&hb);
    memrep_heartbeat(&rep, &hb.u.heartbeat);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(nframes, 2);
    /* a checkpoint of its own that the buddy lacks goes out, begun and ended */
    char p[PATH_MAX];
    snprintf(p, sizeof(p), "%s/mine/step15", root);
    ck_assert_int_eq(mkdir(p, 0700), 0);
    snprintf(p, sizeof(p), "%s/mine/step15/r0", root);
    write_file(p, "fifteen");
    memckpt_adopt(&mem, "step15");
    memrep_heartbeat(&rep, &hb.u.heartbeat);
    uv_run(&loop, UV_RUN_DEFAULT);
    ck_assert_int_eq(nframes, 4);
    ck_assert_int_eq(frames[2].u.mem_file.restore, 0);
    ck_assert_int_eq(frames[2].u.mem_file.begin, 1);
    ck_assert_str_eq(frames[2].u.mem_file.tag, "step15");
    ck_assert_str_eq(frames[2].u.mem_file.path, "r0");
    ck_assert_int_eq(frames[3].u.mem_file.end, 1);
    rep_close();
}
END_TEST

Suite *make_memrep_suite(void)
{
    Suite *s = suite_create("memrep");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, buddy_is_the_next_member_or_the_next_domain);
    tcase_add_test(tc, buddy_map_agrees_with_dealing_every_label_set);
    tcase_add_test(tc, paths_are_opened_without_following_links);
    tcase_add_test(tc, listing_takes_regular_files_only_within_bounds);
    tcase_add_test(tc, a_buddy_takes_whole_copies_only);
    tcase_add_test(tc, a_copy_goes_out_and_comes_back_whole);
    suite_add_tcase(s, tc);
    return s;
}
