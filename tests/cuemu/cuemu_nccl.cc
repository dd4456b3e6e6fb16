/*
 * cuemu_nccl: NCCL collectives between ranks that are threads of one
 * process (see include/nccl.h and tests/cuemu/README.md).
 *
 * A world is found by its unique id. Collective number c of a rank meets
 * collective number c of every other rank: the last to arrive checks that
 * all agree and moves the data for everyone (reductions in rank order, in
 * the element type, bf16 through fp32), then all go on. A rank that waits
 * longer than CUEMU_NCCL_TIMEOUT_S (default 60) seconds is reported with
 * what every rank was doing, and the process stops: real NCCL would hang.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuda_bf16.h"
#include "cuemu_internal.h"
#include "nccl.h"

namespace {

enum coll_op { ALL_GATHER, REDUCE_SCATTER, ALL_REDUCE, BROADCAST };
const char *op_name[] = {"ncclAllGather", "ncclReduceScatter", "ncclAllReduce", "ncclBroadcast"};

struct part {
    coll_op op;
    size_t count; /* sendcount, recvcount or count, as the call takes it */
    ncclDataType_t type;
    ncclRedOp_t red;
    int root;
    const void *send;
    void *recv;
};

struct world {
    std::mutex mu;
    std::condition_variable cv;
    int n = 0, joined = 0;
    bool aborted = false;
    unsigned long long round = 0; /* the collective being gathered */
    int arrived = 0;
    std::vector<part> parts;
    std::vector<bool> present;
    std::vector<unsigned long long> at; /* each rank's next collective */
    std::vector<cuemu_comm *> comms;     /* not destroyed yet */
};

/* Worlds live as long as the process: an aborted rank may still be inside
 * a collective of one (kept reachable, never freed: a few hundred bytes). */
std::mutex worlds_mu;
std::map<std::string, world *> &worlds = *new std::map<std::string, world *>();

}

struct cuemu_comm {
    world *w;
    int rank;
    unsigned long long next;
    bool aborted;
};

namespace {

std::chrono::seconds timeout()
{
    const char *s = getenv("CUEMU_NCCL_TIMEOUT_S");
    long v = s ? strtol(s, NULL, 10) : 60;
    return std::chrono::seconds(v > 0 ? v : 60);
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

/* The reduction of the ranks' element i, in rank order, in the type's own
 * arithmetic (fp32 for float and bf16, as NCCL's kernels). */
void reduce_into(void *dst, size_t di, const std::vector<std::string> &src, size_t si,
                 ncclDataType_t t, ncclRedOp_t red)
{
    const int n = (int)src.size();
    if (t == ncclFloat32 || t == ncclBfloat16) {
        float acc = (float)load(src[0].data(), t, si);
        for (int q = 1; q < n; q++) {
            float x = (float)load(src[q].data(), t, si);
            acc = red == ncclMax ? (x > acc ? x : acc) : red == ncclMin ? (x < acc ? x : acc)
                  : red == ncclProd ? acc * x : acc + x;
        }
        store(dst, t, di, red == ncclAvg ? acc / (float)n : acc);
        return;
    }
    double acc = load(src[0].data(), t, si);
    for (int q = 1; q < n; q++) {
        double x = load(src[q].data(), t, si);
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

/* All ranks are in; caller holds w->mu. */
void perform(world *w, unsigned long long seq)
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
    const size_t es = type_size(p0.type), c = p0.count;
    const int n = w->n;
    size_t send_elems = p0.op == REDUCE_SCATTER ? c * n : c;
    std::vector<std::string> in((size_t)n);
    for (int r = 0; r < n; r++)
        in[r].assign((const char *)w->parts[r].send, send_elems * es);
    for (int r = 0; r < n; r++) {
        void *out = w->parts[r].recv;
        switch (p0.op) {
        case ALL_GATHER:
            for (int q = 0; q < n; q++)
                memcpy((char *)out + (size_t)q * c * es, in[q].data(), c * es);
            break;
        case BROADCAST:
            memcpy(out, in[p0.root].data(), c * es);
            break;
        case ALL_REDUCE:
            for (size_t i = 0; i < c; i++)
                reduce_into(out, i, in, i, p0.type, p0.red);
            break;
        case REDUCE_SCATTER:
            for (size_t i = 0; i < c; i++)
                reduce_into(out, i, in, (size_t)r * c + i, p0.type, p0.red);
            break;
        }
    }
}

[[noreturn]] void stuck(world *w, const cuemu_comm *me, unsigned long long seq, const part &p)
{
    std::string who;
    for (int r = 0; r < w->n; r++) {
        char b[200];
        snprintf(b, sizeof(b), "; rank %d %s", r,
                 w->present[r] ? ("waits in " + describe(w->parts[r])).c_str()
                               : (w->at[r] > seq ? "is past it" : "has not reached it"));
        who += b;
    }
    cuemu::fatal("rank %d waited %lld s in NCCL collective #%llu, %s%s", me->rank,
                 (long long)timeout().count(), seq + 1, describe(p).c_str(), who.c_str());
}

void collective(cuemu_comm *c, const part &p)
{
    world *w = c->w;
    std::unique_lock<std::mutex> lk(w->mu);
    const unsigned long long seq = c->next++;
    w->at[c->rank] = c->next;
    const auto limit = std::chrono::steady_clock::now() + timeout();
    while (w->round != seq && !w->aborted)
        if (w->cv.wait_until(lk, limit) == std::cv_status::timeout)
            stuck(w, c, seq, p);
    if (w->aborted)
        return;
    w->parts[c->rank] = p;
    w->present[c->rank] = true;
    if (++w->arrived == w->n) {
        perform(w, seq);
        w->arrived = 0;
        for (int r = 0; r < w->n; r++)
            w->present[r] = false;
        w->round++;
        w->cv.notify_all();
        return;
    }
    while (w->round == seq && !w->aborted)
        if (w->cv.wait_until(lk, limit) == std::cv_status::timeout)
            stuck(w, c, seq, p);
}

ncclResult_t queue(cuemu_comm *c, const part &p, cudaStream_t s)
{
    if (!c || c->aborted)
        return ncclInvalidUsage;
    const size_t es = type_size(p.type);
    const int n = c->w->n;
    size_t sb = es * (p.op == REDUCE_SCATTER ? p.count * n : p.count);
    size_t rb = es * (p.op == ALL_GATHER ? p.count * n : p.count);
    if (!es || !cuemu::is_device(p.send, sb) || !cuemu::is_device(p.recv, rb))
        return ncclInvalidArgument;
    cuemu::enqueue(s, op_name[p.op], [c, p]() { collective(c, p); });
    return ncclSuccess;
}

}

extern "C" {

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    memset(id, 0, sizeof(*id));
    memcpy(id->internal, "cuemu", 5);
    if (getrandom(id->internal + 8, 32, 0) != 32)
        return ncclSystemError;
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    *comm = NULL;
    if (nranks < 1 || rank < 0 || rank >= nranks || memcmp(id.internal, "cuemu", 5) != 0)
        return ncclInvalidArgument;
    std::string key(id.internal, sizeof(id.internal));
    world *w;
    {
        std::lock_guard<std::mutex> g(worlds_mu);
        auto it = worlds.find(key);
        if (it == worlds.end()) {
            w = new world();
            w->n = nranks;
            w->parts.resize((size_t)nranks);
            w->present.assign((size_t)nranks, false);
            w->at.assign((size_t)nranks, 0);
            worlds[key] = w;
        } else {
            w = it->second;
        }
    }
    std::unique_lock<std::mutex> lk(w->mu);
    if (w->n != nranks)
        return ncclInvalidUsage;
    w->joined++;
    w->cv.notify_all();
    const auto limit = std::chrono::steady_clock::now() + timeout();
    while (w->joined < w->n && !w->aborted)
        if (w->cv.wait_until(lk, limit) == std::cv_status::timeout) {
            fprintf(stderr, "cuemu: ncclCommInitRank: rank %d of %d waited for the others\n",
                    rank, nranks);
            return ncclSystemError;
        }
    cuemu_comm *c = new cuemu_comm();
    c->w = w;
    c->rank = rank;
    w->comms.push_back(c);
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
    world *w = comm->w;
    std::lock_guard<std::mutex> g(w->mu);
    for (size_t i = 0; i < w->comms.size(); i++)
        if (w->comms[i] == comm) {
            w->comms.erase(w->comms.begin() + (long)i);
            break;
        }
    delete comm;
    return ncclSuccess;
}

/* Wakes every rank waiting in a collective of this world. The handle is
 * not freed: another thread may still be inside a collective with it (the
 * world keeps it). */
ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    std::lock_guard<std::mutex> g(comm->w->mu);
    comm->aborted = true;
    comm->w->aborted = true;
    comm->w->cv.notify_all();
    return ncclSuccess;
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *err)
{
    if (!comm)
        return ncclInvalidArgument;
    std::lock_guard<std::mutex> g(comm->w->mu);
    *err = comm->w->aborted ? ncclRemoteError : ncclSuccess;
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
