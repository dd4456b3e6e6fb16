/*
 * cuemu_nccl: NCCL collectives between ranks that are processes or threads
 * (see include/nccl.h and tests/cuemu/README.md).
 *
 * ncclGetUniqueId creates a world: a POSIX shared-memory segment, named in
 * the id, holding a process-shared robust mutex (waiters poll it), the
 * state of the collective being gathered and one staging area per rank. For collective
 * number c every rank waits until the world is at c, copies what it sends
 * into its staging area and records the call; the last to arrive checks
 * that the calls agree (operation, count, type, reduction, root) and opens
 * the reading phase; each rank computes its own result from the staging
 * areas (reductions in rank order, in the element type, bf16 through fp32)
 * and leaves; the last to leave moves the world on to c + 1. A rank that
 * waits longer than CUEMU_NCCL_TIMEOUT_S (default 60) seconds is reported
 * with what every rank was doing, and the process stops: real NCCL would
 * hang. ncclCommAbort marks the world aborted, and so does a rank that
 * died holding the lock; collectives of an aborted world leave NaN in
 * their receive buffers. The segment is unlinked once every rank has
 * joined; segments left by processes that died before that are removed by
 * the next ncclGetUniqueId.
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
    int n, joined, aborted;
    unsigned long long round; /* the collective being gathered */
    int reading;              /* all have arrived: the staging areas are read */
    int arrived, left;
    part parts[MAX_RANKS];
    int present[MAX_RANKS];
    unsigned long long at[MAX_RANKS]; /* each rank's next collective */
    size_t stage_bytes;       /* per rank */
};

size_t header_bytes() { return (sizeof(world) + 4095) / 4096 * 4096; }
char *stage_of(world *w, int rank) { return (char *)w + header_bytes() + (size_t)rank * w->stage_bytes; }

}

struct cuemu_comm {
    world *w;
    size_t map_bytes;
    int rank;
    unsigned long long next;
    bool aborted;
};

namespace {

long timeout_s()
{
    const char *s = getenv("CUEMU_NCCL_TIMEOUT_S");
    long v = s ? strtol(s, NULL, 10) : 60;
    return v > 0 ? v : 60;
}

struct timespec deadline()
{
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += timeout_s();
    return ts;
}

/* A lock holder that died counts as an abort. */
void lock(world *w)
{
    int e = pthread_mutex_lock(&w->mu);
    if (e == EOWNERDEAD) {
        w->aborted = 1;
        pthread_mutex_consistent(&w->mu);
    } else if (e) {
        cuemu::fatal("NCCL world: pthread_mutex_lock: %s", strerror(e));
    }
}

void unlock(world *w) { pthread_mutex_unlock(&w->mu); }

/* Lets the others move, then looks again (caller holds the lock); false at
 * the deadline. Polling, not a process-shared condition variable: glibc's
 * pthread_cond_broadcast can wait for every waiter to let go, and a rank
 * SIGKILLed while waiting never does. */
bool wait_for(world *w, const struct timespec *dl)
{
    unlock(w);
    const struct timespec nap = {0, 200 * 1000};
    nanosleep(&nap, NULL);
    lock(w);
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return now.tv_sec < dl->tv_sec || (now.tv_sec == dl->tv_sec && now.tv_nsec < dl->tv_nsec);
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

[[noreturn]] void stuck(world *w, const cuemu_comm *me, unsigned long long seq, const part &p)
{
    std::string who;
    for (int r = 0; r < w->n; r++) {
        std::string what = w->present[r] ? "waits in " + describe(w->parts[r])
                           : w->at[r] > seq ? "is past it" : "has not reached it";
        who += "; rank " + std::to_string(r) + " " + what;
    }
    cuemu::fatal("rank %d waited %ld s in NCCL collective #%llu, %s%s", me->rank, timeout_s(),
                 seq + 1, describe(p).c_str(), who.c_str());
}

/* What a collective of an aborted world leaves: garbage (0xff bytes: NaN),
 * never a plausible result. */
void aborted_result(const part &p, int n)
{
    memset(p.recv, 0xff, recv_bytes(p, n));
}

void collective(cuemu_comm *c, const part &p)
{
    world *w = c->w;
    const struct timespec dl = deadline();
    lock(w);
    const unsigned long long seq = c->next++;
    w->at[c->rank] = c->next;
    while (!w->aborted && (w->round != seq || w->reading))
        if (!wait_for(w, &dl))
            stuck(w, c, seq, p);
    if (w->aborted) {
        unlock(w);
        aborted_result(p, w->n);
        return;
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
    while (!w->aborted && !w->reading)
        if (!wait_for(w, &dl))
            stuck(w, c, seq, p);
    if (w->aborted) {
        unlock(w);
        aborted_result(p, w->n);
        return;
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
}

ncclResult_t queue(cuemu_comm *c, const part &p, cudaStream_t s)
{
    if (!c || c->aborted)
        return ncclInvalidUsage;
    const int n = c->w->n;
    if (!type_size(p.type) || !cuemu::is_device(p.send, send_bytes(p, n)) ||
        !cuemu::is_device(p.recv, recv_bytes(p, n)))
        return ncclInvalidArgument;
    cuemu::enqueue(s, op_name[p.op], [c, p]() { collective(c, p); });
    return ncclSuccess;
}

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

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
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
    if (++w->joined == w->n)
        shm_unlink(name); /* everyone has it mapped */
    const struct timespec dl = deadline();
    while (w->joined < w->n && !w->aborted)
        if (!wait_for(w, &dl)) {
            unlock(w);
            fprintf(stderr, "cuemu: ncclCommInitRank: rank %d of %d waited %ld s for the others\n",
                    rank, nranks, timeout_s());
            return ncclSystemError;
        }
    unlock(w);
    cuemu_comm *c = new cuemu_comm();
    c->w = w;
    c->map_bytes = (size_t)st.st_size;
    c->rank = rank;
    *comm = c;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    (void)config; /* the communicator is ready on return either way */
    return ncclCommInitRank(comm, nranks, id, rank);
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    munmap(comm->w, comm->map_bytes);
    delete comm;
    return ncclSuccess;
}

/* Wakes every rank waiting in a collective of this world. The handle and
 * its mapping are kept: another thread may still be inside a collective
 * with it (a few hundred bytes, for the life of the process). */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    lock(comm->w);
    comm->aborted = true;
    comm->w->aborted = 1;
    unlock(comm->w);
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    if (!comm)
        return ncclInvalidArgument;
    lock(comm->w);
    *err = comm->w->aborted ? ncclRemoteError : ncclSuccess;
    unlock(comm->w);
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
    return queue(comm, part{ALL_GATHER, sendcount, t, ncclSum, 0, send, recv}, s);
}

ncclResult_t ncclReduceScatter(const void *send, void *recv, size_t recvcount, ncclDataType_t t,
                               ncclRedOp_t op, ncclComm_t comm, cudaStream_t s)
{
    return queue(comm, part{REDUCE_SCATTER, recvcount, t, op, 0, send, recv}, s);
}

ncclResult_t ncclAllReduce(const void *send, void *recv, size_t count, ncclDataType_t t,
                           ncclRedOp_t op, ncclComm_t comm, cudaStream_t s)
{
    return queue(comm, part{ALL_REDUCE, count, t, op, 0, send, recv}, s);
}

ncclResult_t ncclBroadcast(const void *send, void *recv, size_t count, ncclDataType_t t, int root,
                           ncclComm_t comm, cudaStream_t s)
{
    if (!comm || root < 0 || root >= comm->w->n)
        return ncclInvalidArgument;
    return queue(comm, part{BROADCAST, count, t, ncclSum, root, send, recv}, s);
}

} /* extern "C" */
