/*
 * cuemu_nccl: NCCL collectives between ranks that are processes or threads
 * (see include/nccl.h and tests/cuemu/README.md), as strict as NCCL's
 * documented semantics where healing depends on them.
 *
 * ncclGetUniqueId creates a world: a POSIX shared-memory segment, named in
 * the id, holding a process-shared robust mutex (waiters poll it), the
 * state of the collective being gathered and one staging area per rank.
 * A collective is an operation on its stream that finishes only when every
 * rank has arrived at the same collective number: each copies what it sends
 * into its staging area, the last to arrive checks that the calls agree
 * (operation, count, type, reduction, root), each rank computes its own
 * result (reductions in rank order, in the element type, bf16 through fp32)
 * and the last to leave moves the world on. A peer that died or aborted
 * never arrives, so the collective never finishes: a stream query says not
 * ready, a host wait waits (reported as a hang after CUEMU_NCCL_TIMEOUT_S).
 * Only this rank's own ncclCommAbort ends it, leaving NaN (0xff bytes) in
 * its receive buffer.
 *
 * The handle is checked as NCCL's contract says: after ncclCommAbort or
 * ncclCommDestroy every use is reported (the handle is freed there); two
 * threads inside calls on one communicator at once are reported (abort
 * frees what the other call uses). ncclCommInitRank waits for every rank
 * for ever; with config.blocking = 0 init, finalize and collectives return
 * ncclInProgress and ncclCommGetAsyncError says when they are done (calling
 * anything else before is reported). ncclCommFinalize completes once every
 * rank has finalized (never with a peer gone); ncclCommDestroy of a
 * communicator that was not finalized finalizes it first, so with a peer
 * gone it blocks. ncclCommGetAsyncError answers ncclRemoteError for a dead
 * or aborted peer only with CUEMU_NCCL_REMOTE_ERROR=1 (NCCL over sockets
 * notices a closed peer; over NVLink or shared memory it does not).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "cuemu_internal.h"
#include "nccl.h"

namespace {

enum coll_op { ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, BROADCAST };
const char *op_name[] = {"ncclAllGather", "ncclReduceScatter", "ncclAllReduce", "ncclBroadcast"};

enum { MAX_RANKS = 16 };
const uint32_t WORLD_MAGIC = 0x6375656d;
const char SHM_PREFIX[] = "cuemu-nccl-";

struct part {
    coll_op op;
    size_t count; /* sendcount, recvcount or count, as the call takes it */
    ncclDataType_t type;
    ncclRedOp_t red;
    int root;
    const void *send; /* in the caller's address space */
    void *recv;
};

/* The segment's header; the staging areas follow it, page-aligned. */
struct world {
    uint32_t magic;
    pthread_mutex_t mu;
    int n, joined;
    unsigned long long round; /* the collective being gathered */
    int reading;              /* all have arrived: the staging areas are read */
    int arrived, left;
    part parts[MAX_RANKS];
    int present[MAX_RANKS];
    pid_t pid[MAX_RANKS];     /* each rank's process */
    int gone[MAX_RANKS];      /* aborted its communicator */
    int finalized[MAX_RANKS];
    unsigned long long at[MAX_RANKS]; /* each rank's next collective */
    size_t stage_bytes;       /* per rank */
};

size_t header_bytes() { return (sizeof(world) + 4095) / 4096 * 4096; }
char *stage_of(world *w, int rank) { return (char *)w + header_bytes() + (size_t)rank * w->stage_bytes; }

}

enum comm_state { LIVE, ABORTED, DESTROYED };
/* A call of a non-blocking communicator not yet done (ncclInProgress). */
enum comm_pending { NONE, INIT, FINALIZE, ENQUEUE };

struct cuemu_comm {
    world *w;
    size_t map_bytes;
    int rank;
    unsigned long long next;
    bool blocking;
    bool finalized;                  /* a finalize completed */
    std::atomic<int> state;          /* comm_state */
    std::atomic<int> in_call;        /* threads inside an NCCL call on it */
    std::atomic<const char *> in_what;
    std::atomic<int> pending;        /* comm_pending */
};

namespace {

/* A rank that died holding the lock never arrives again: nothing else
 * needs doing (its collective cannot finish). */
void lock(world *w)
{
    int e = pthread_mutex_lock(&w->mu);
    if (e == EOWNERDEAD) {
        pthread_mutex_consistent(&w->mu);
    } else if (e) {
        cuemu::fatal("NCCL world: pthread_mutex_lock: %s", strerror(e));
    }
}

void unlock(world *w) { pthread_mutex_unlock(&w->mu); }

void nap()
{
    const struct timespec ts = {0, 200 * 1000};
    nanosleep(&ts, NULL);
}

/* Rank r left the world: it aborted, or its process is gone. Caller holds the lock. */
bool rank_lost(const world *w, int r)
{
    return w->gone[r] || (w->pid[r] > 0 && kill(w->pid[r], 0) != 0 && errno == ESRCH);
}

bool peer_lost(const world *w, int me)
{
    for (int r = 0; r < w->n; r++)
        if (r != me && rank_lost(w, r))
            return true;
    return false;
}

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8: case ncclUint8: return 1;
    case ncclFloat16: case ncclBfloat16: return 2;
    case ncclInt32: case ncclUint32: case ncclFloat32: return 4;
    case ncclInt64: case ncclUint64: case ncclFloat64: return 8;
    }
    return 0;
}

double load(const void *p, ncclDataType_t t, size_t i)
{
    switch (t) {
    case ncclInt8: return ((const int8_t *)p)[i];
    case ncclUint8: return ((const uint8_t *)p)[i];
    case ncclInt32: return ((const int32_t *)p)[i];
    case ncclUint32: return ((const uint32_t *)p)[i];
    case ncclInt64: return (double)((const int64_t *)p)[i];
    case ncclUint64: return (double)((const uint64_t *)p)[i];
    case ncclFloat32: return ((const float *)p)[i];
    case ncclFloat64: return ((const double *)p)[i];
    case ncclBfloat16: return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    case ncclFloat16: break;
    }
    cuemu::fatal("NCCL reduction over type %d is not emulated", (int)t);
}

void store(void *p, ncclDataType_t t, size_t i, double v)
{
    switch (t) {
    case ncclInt8: ((int8_t *)p)[i] = (int8_t)v; return;
    case ncclUint8: ((uint8_t *)p)[i] = (uint8_t)v; return;
    case ncclInt32: ((int32_t *)p)[i] = (int32_t)v; return;
    case ncclUint32: ((uint32_t *)p)[i] = (uint32_t)v; return;
    case ncclInt64: ((int64_t *)p)[i] = (int64_t)v; return;
    case ncclUint64: ((uint64_t *)p)[i] = (uint64_t)v; return;
    case ncclFloat32: ((float *)p)[i] = (float)v; return;
    case ncclFloat64: ((double *)p)[i] = v; return;
    case ncclBfloat16: ((__nv_bfloat16 *)p)[i] = __float2bfloat16((float)v); return;
    case ncclFloat16: break;
    }
    cuemu::fatal("NCCL reduction over type %d is not emulated", (int)t);
}

/* The reduction of the ranks' element si, in rank order, in the type's
 * own arithmetic (fp32 for float and bf16, as NCCL's kernels). */
void reduce_into(void *dst, size_t di, const std::vector<const char *> &src, size_t si,
                 ncclDataType_t t, ncclRedOp_t red)
{
    const int n = (int)src.size();
    if (t == ncclFloat32 || t == ncclBfloat16) {
        float acc = (float)load(src[0], t, si);
        for (int q = 1; q < n; q++) {
            float x = (float)load(src[q], t, si);
            acc = red == ncclMax ? (x > acc ? x : acc) : red == ncclMin ? (x < acc ? x : acc)
                  : red == ncclProd ? acc * x : acc + x;
        }
        store(dst, t, di, red == ncclAvg ? acc / (float)n : acc);
        return;
    }
    double acc = load(src[0], t, si);
    for (int q = 1; q < n; q++) {
        double x = load(src[q], t, si);
        acc = red == ncclMax ? (x > acc ? x : acc) : red == ncclMin ? (x < acc ? x : acc)
              : red == ncclProd ? acc * x : acc + x;
    }
    store(dst, t, di, red == ncclAvg ? acc / n : acc);
}

std::string describe(const part &p)
{
    char b[160];
    snprintf(b, sizeof(b), "%s(count %zu, type %d, op %d, root %d)", op_name[p.op], p.count,
             (int)p.type, (int)p.red, p.root);
    return b;
}

size_t send_bytes(const part &p, int n)
{
    return type_size(p.type) * (p.op == REDUCE_SCATTER ? p.count * (size_t)n : p.count);
}

size_t recv_bytes(const part &p, int n)
{
    return type_size(p.type) * (p.op == ALL_GATHER ? p.count * (size_t)n : p.count);
}

/* The last rank in: do the calls agree? Caller holds the lock. */
void check_agreement(world *w, unsigned long long seq)
{
    const part &p0 = w->parts[0];
    for (int r = 1; r < w->n; r++) {
        const part &p = w->parts[r];
        if (p.op != p0.op || p.count != p0.count || p.type != p0.type ||
            (p.op != ALL_GATHER && p.op != BROADCAST && p.red != p0.red) ||
            (p.op == BROADCAST && p.root != p0.root))
            cuemu::fatal("NCCL collective #%llu: rank 0 called %s but rank %d called %s; on "
                         "GPUs this hangs or corrupts data", seq + 1, describe(p0).c_str(), r,
                         describe(p).c_str());
    }
}

/* This rank's result, from every rank's staging area. */
void compute(world *w, int rank, const part &p)
{
    const size_t es = type_size(p.type), c = p.count;
    const int n = w->n;
    std::vector<const char *> in((size_t)n);
    for (int q = 0; q < n; q++)
        in[q] = stage_of(w, q);
    switch (p.op) {
    case ALL_GATHER:
        for (int q = 0; q < n; q++)
            memcpy((char *)p.recv + (size_t)q * c * es, in[q], c * es);
        break;
    case BROADCAST:
        memcpy(p.recv, in[p.root], c * es);
        break;
    case ALL_REDUCE:
        for (size_t i = 0; i < c; i++)
            reduce_into(p.recv, i, in, i, p.type, p.red);
        break;
    case REDUCE_SCATTER:
        for (size_t i = 0; i < c; i++)
            reduce_into(p.recv, i, in, (size_t)rank * c + i, p.type, p.red);
        break;
    }
}

/* What every rank is doing, for the report of a collective that cannot finish. */
std::string why_stuck(const world *w, const cuemu_comm *me, unsigned long long seq, const part &p)
{
    std::string who = "rank " + std::to_string(me->rank) + " is in NCCL collective #" +
                      std::to_string(seq + 1) + ", " + describe(p);
    for (int r = 0; r < w->n; r++) {
        if (r == me->rank)
            continue;
        std::string what = rank_lost(w, r) ? "is gone (aborted or dead): real NCCL waits for it "
                                             "until this rank aborts"
                           : w->present[r] ? "waits in " + describe(w->parts[r])
                           : w->at[r] > seq ? "is past it" : "has not reached it";
        who += "; rank " + std::to_string(r) + " " + what;
    }
    return who;
}

/* What a collective that this rank's abort cut short leaves: garbage
 * (0xff bytes: NaN), never a plausible result. */
void aborted_result(const part &p, int n)
{
    memset(p.recv, 0xff, recv_bytes(p, n));
}

/* Collective number seq of this rank, as far as it can go now; true once
 * it is done (phase: 0 not arrived, 1 arrived). */
bool collective_step(cuemu_comm *c, const part &p, unsigned long long seq, int *phase)
{
    world *w = c->w;
    if (c->state.load() != LIVE) {
        aborted_result(p, w->n);
        return true;
    }
    lock(w);
    if (c->state.load() != LIVE) { /* ncclCommAbort sets it under the lock */
        unlock(w);
        aborted_result(p, w->n);
        return true;
    }
    if (*phase == 0) {
        if (w->round != seq || w->reading) {
            cuemu::note_stuck(why_stuck(w, c, seq, p));
            unlock(w);
            return false;
        }
        const size_t sb = send_bytes(p, w->n);
        if (sb > w->stage_bytes)
            cuemu::fatal("%s of %zu bytes: more than cuemu's staging area of %zu bytes per rank "
                         "(CUEMU_NCCL_STAGING_MB)", op_name[p.op], sb, w->stage_bytes);
        memcpy(stage_of(w, c->rank), p.send, sb);
        w->parts[c->rank] = p;
        w->present[c->rank] = 1;
        if (++w->arrived == w->n) {
            check_agreement(w, seq);
            w->reading = 1;
        }
        *phase = 1;
    }
    if (!w->reading) {
        cuemu::note_stuck(why_stuck(w, c, seq, p));
        unlock(w);
        return false;
    }
    unlock(w);
    compute(w, c->rank, p); /* nobody writes the staging areas while reading */
    lock(w);
    if (++w->left == w->n) {
        w->arrived = w->left = w->reading = 0;
        for (int r = 0; r < w->n; r++)
            w->present[r] = 0;
        w->round++;
    }
    unlock(w);
    return true;
}

/* Every NCCL call on a communicator goes through enter/leave: a handle
 * that was aborted or destroyed is freed memory in NCCL, and two threads
 * in calls on one communicator at once is what NCCL forbids. */
void enter(cuemu_comm *c, const char *what, bool check_pending = true)
{
    if (c->in_call.fetch_add(1) != 0)
        cuemu::fatal("%s while another thread is inside %s on the same communicator: NCCL "
                     "communicators are not thread-safe", what, c->in_what.load());
    c->in_what.store(what);
    if (c->state.load() != LIVE)
        cuemu::fatal("%s on a communicator after %s: NCCL freed it there (use after free)", what,
                     c->state.load() == ABORTED ? "ncclCommAbort" : "ncclCommDestroy");
    if (check_pending && c->pending.load() != NONE)
        cuemu::fatal("%s while the communicator's last call is still ncclInProgress: poll "
                     "ncclCommGetAsyncError until it is not", what);
    /* a real call takes microseconds: a racing thread has time to meet it */
    const struct timespec ts = {0, 20 * 1000};
    nanosleep(&ts, NULL);
}

void leave(cuemu_comm *c) { c->in_call.fetch_sub(1); }

ncclResult_t queue(cuemu_comm *c, const char *what, const part &p, cudaStream_t s)
{
    if (!c)
        return ncclInvalidArgument;
    enter(c, what);
    const int n = c->w->n;
    if (!type_size(p.type) || !cuemu::is_device(p.send, send_bytes(p, n)) ||
        !cuemu::is_device(p.recv, recv_bytes(p, n)) || (p.op == BROADCAST && (p.root < 0 || p.root >= n))) {
        leave(c);
        return ncclInvalidArgument;
    }
    const unsigned long long seq = c->next++;
    lock(c->w);
    c->w->at[c->rank] = c->next;
    unlock(c->w);
    int *phase = new int(0);
    cuemu::enqueue_poll(s, op_name[p.op], [c, p, seq, phase]() {
        if (!collective_step(c, p, seq, phase))
            return false;
        delete phase;
        return true;
    });
    ncclResult_t r = ncclSuccess;
    if (!c->blocking) { /* a non-blocking communicator may answer "in progress" */
        c->pending.store(ENQUEUE);
        r = ncclInProgress;
    }
    leave(c);
    return r;
}

bool all_finalized(const world *w)
{
    for (int r = 0; r < w->n; r++)
        if (!w->finalized[r])
            return false;
    return true;
}

/* A blocking NCCL call waiting on the other ranks: on a GPU it would wait
 * for ever; reported once that is clear. */
void wait_all(cuemu_comm *c, const char *what, bool (*done)(const world *))
{
    world *w = c->w;
    const time_t t0 = time(NULL);
    lock(w);
    while (!done(w)) {
        if (time(NULL) - t0 > cuemu::hang_timeout_s()) {
            std::string who;
            for (int r = 0; r < w->n; r++)
                if (rank_lost(w, r))
                    who += " " + std::to_string(r);
            cuemu::fatal("%s: rank %d waited %ld s for the others (gone:%s); real NCCL waits for "
                         "ever (use a non-blocking communicator and abort it)", what, c->rank,
                         cuemu::hang_timeout_s(), who.empty() ? " none, they never called it" : who.c_str());
        }
        unlock(w);
        nap();
        lock(w);
    }
    unlock(w);
}

bool all_joined(const world *w) { return w->joined == w->n; }

/* /dev/shm/cuemu-nccl-PID-* of processes that are gone. */
void remove_stale_worlds()
{
    DIR *d = opendir("/dev/shm");
    if (!d)
        return;
    struct dirent *de;
    while ((de = readdir(d)) != NULL) {
        if (strncmp(de->d_name, SHM_PREFIX, sizeof(SHM_PREFIX) - 1) != 0)
            continue;
        long pid = strtol(de->d_name + sizeof(SHM_PREFIX) - 1, NULL, 10);
        if (pid > 0 && kill((pid_t)pid, 0) != 0 && errno == ESRCH)
            shm_unlink((std::string("/") + de->d_name).c_str());
    }
    closedir(d);
}

size_t world_bytes(size_t stage) { return header_bytes() + (size_t)MAX_RANKS * stage; }

size_t stage_bytes_wanted()
{
    const char *s = getenv("CUEMU_NCCL_STAGING_MB");
    long mb = s ? strtol(s, NULL, 10) : 64;
    return (size_t)(mb > 0 ? mb : 64) << 20;
}

}

extern "C" {

/* The id holds "cuemu", the segment's name and its staging size. */
ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    remove_stale_worlds();
    unsigned char rnd[8];
    if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
        return ncclSystemError;
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, "cuemu", 5);
    char *name = id->internal + 8;
    snprintf(name, 64, "/%s%ld-%02x%02x%02x%02x%02x%02x%02x%02x", SHM_PREFIX, (long)getpid(),
             rnd[0], rnd[1], rnd[2], rnd[3], rnd[4], rnd[5], rnd[6], rnd[7]);
    const size_t stage = stage_bytes_wanted();
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0)
        return ncclSystemError;
    const size_t bytes = world_bytes(stage);
    void *m = ftruncate(fd, (off_t)bytes) == 0
                  ? mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0) : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED) {
        shm_unlink(name);
        return ncclSystemError;
    }
    world *w = (world *)m;
    pthread_mutexattr_t ma;
    pthread_mutexattr_init(&ma);
    pthread_mutexattr_setpshared(&ma, PTHREAD_PROCESS_SHARED);
    pthread_mutexattr_setrobust(&ma, PTHREAD_MUTEX_ROBUST);
    pthread_mutex_init(&w->mu, &ma);
    w->stage_bytes = stage;
    __atomic_store_n(&w->magic, WORLD_MAGIC, __ATOMIC_RELEASE);
    munmap(m, bytes);
    return ncclSuccess;
}

/* Joins the world; blocking: waits for every rank. */
static ncclResult_t init_rank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank, bool blocking)
{
    *comm = NULL;
    if (nranks < 1 || nranks > MAX_RANKS || rank < 0 || rank >= nranks ||
        memcmp(id.internal, "cuemu", 5) != 0)
        return ncclInvalidArgument;
    char name[72];
    memcpy(name, id.internal + 8, sizeof(name) - 1);
    name[sizeof(name) - 1] = '\0';
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) {
        fprintf(stderr, "cuemu: ncclCommInitRank: world %s: %s (every rank must join before "
                "the world is complete)\n", name, strerror(errno));
        return ncclSystemError;
    }
    struct stat st;
    void *m = fstat(fd, &st) == 0 && (size_t)st.st_size > header_bytes()
                  ? mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0)
                  : MAP_FAILED;
    close(fd);
    if (m == MAP_FAILED)
        return ncclSystemError;
    world *w = (world *)m;
    if (__atomic_load_n(&w->magic, __ATOMIC_ACQUIRE) != WORLD_MAGIC) {
        munmap(m, (size_t)st.st_size);
        return ncclInvalidArgument;
    }
    lock(w);
    if (w->n == 0)
        w->n = nranks;
    if (w->n != nranks) {
        unlock(w);
        munmap(m, (size_t)st.st_size);
        return ncclInvalidUsage;
    }
    w->pid[rank] = getpid();
    if (++w->joined == w->n)
        shm_unlink(name); /* everyone has it mapped */
    unlock(w);
    cuemu_comm *c = new cuemu_comm();
    c->w = w;
    c->map_bytes = (size_t)st.st_size;
    c->rank = rank;
    c->blocking = blocking;
    if (blocking) {
        wait_all(c, "ncclCommInitRank", all_joined);
        *comm = c;
        return ncclSuccess;
    }
    c->pending.store(INIT);
    *comm = c;
    return ncclInProgress;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    return init_rank(comm, nranks, id, rank, true);
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    return init_rank(comm, nranks, id, rank, !config || config->blocking);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    enter(comm, "ncclCommFinalize");
    lock(comm->w);
    comm->w->finalized[comm->rank] = 1;
    unlock(comm->w);
    ncclResult_t r = ncclSuccess;
    if (comm->blocking) {
        wait_all(comm, "ncclCommFinalize", all_finalized);
        comm->finalized = true;
    } else {
        comm->pending.store(FINALIZE);
        r = ncclInProgress;
    }
    leave(comm);
    return r;
}

/* Without a finalize first, NCCL finalizes here: with a peer gone it blocks. */
ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    enter(comm, "ncclCommDestroy");
    if (!comm->finalized) {
        lock(comm->w);
        comm->w->finalized[comm->rank] = 1;
        unlock(comm->w);
        wait_all(comm, "ncclCommDestroy (not finalized first: it finalizes)", all_finalized);
    }
    comm->state.store(DESTROYED);
    leave(comm);
    return ncclSuccess;
}

/* Ends this rank's collectives (their buffers get garbage) and frees the
 * handle: the peers' collectives do not finish until they abort too. The
 * object is kept as a tombstone, so that later uses are reported. */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    if (comm->state.load() != LIVE)
        cuemu::fatal("ncclCommAbort on a communicator after %s: NCCL freed it there (use after free)",
                     comm->state.load() == ABORTED ? "ncclCommAbort" : "ncclCommDestroy");
    lock(comm->w);
    comm->state.store(ABORTED);
    comm->w->gone[comm->rank] = 1;
    unlock(comm->w);
    if (comm->in_call.load() != 0)
        cuemu::fatal("ncclCommAbort while another thread is inside %s on the same communicator: "
                     "the abort frees what that call uses", comm->in_what.load());
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    if (!comm)
        return ncclInvalidArgument;
    enter(comm, "ncclCommGetAsyncError", false);
    world *w = comm->w;
    lock(w);
    *err = ncclSuccess;
    switch (comm->pending.load()) {
    case INIT:
        *err = all_joined(w) ? ncclSuccess : ncclInProgress;
        break;
    case FINALIZE:
        *err = all_finalized(w) ? ncclSuccess : ncclInProgress;
        comm->finalized = *err == ncclSuccess;
        break;
    default:
        break;
    }
    if (*err == ncclSuccess) {
        comm->pending.store(NONE);
        const char *e = getenv("CUEMU_NCCL_REMOTE_ERROR");
        if (e && strcmp(e, "1") == 0 && peer_lost(w, comm->rank))
            *err = ncclRemoteError;
    }
    unlock(w);
    leave(comm);
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t r)
{
    switch (r) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error";
    case ncclSystemError: return "unhandled system error";
    case ncclInternalError: return "internal error";
    case ncclInvalidArgument: return "invalid argument";
    case ncclInvalidUsage: return "invalid usage";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    }
    return "unknown result code";
}

const char *ncclGetLastError(ncclComm_t comm)
{
    (void)comm;
    return "";
}

ncclResult_t ncclAllGather(const void *send, void *recv, size_t sendcount, ncclDataType_t t,
                           ncclComm_t comm, cudaStream_t s)
{
    return queue(comm, "ncclAllGather", part{ALL_GATHER, sendcount, t, ncclSum, 0, send, recv}, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s)
{
    return queue(comm, "ncclReduceScatter", part{REDUCE_SCATTER, recvcount, t, op, 0, send, recv}, s);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s)
{
    return queue(comm, "ncclAllReduce", part{ALL_REDUCE, count, t, op, 0, send, recv}, s);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t s)
{
    return queue(comm, "ncclBroadcast", part{BROADCAST, count, t, ncclSum, root, send, recv}, s);
}

} /* extern "C" */
