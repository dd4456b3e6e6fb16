/*
 * cuemu_runtime: memory, streams, events and copies of the CUDA runtime on
 * the CPU (tests/cuemu/README.md).
 *
 * Device memory is host memory mapped for it, filled with 0xff bytes (NaN
 * as float and bf16, -1 as int) so that reading what was never written
 * shows up in the results, and ending at an inaccessible page so that a
 * kernel running off its end (past the 256-byte rounding) faults. It is counted against a device of
 * CUEMU_DEVICE_MB (default 4096) MiB, so out-of-memory paths can be tested.
 *
 * Streams are queues. Work runs when the host waits for it (stream or event
 * synchronisation, a copy to pageable host memory, cudaFree), in queue order
 * per stream; the legacy default stream (NULL) is one more such queue per
 * thread, so cudaMemset and a host-to-device cudaMemcpy are not ordered
 * before work on the non-blocking streams, as on a device (CUDA's "API
 * synchronization behavior": they may return before the device is done); cudaStreamWaitEvent makes a stream run the other stream up to
 * the event first. So by default every stream runs as late as CUDA allows,
 * and a missing event shows up as a wrong result. CUEMU_EAGER lists streams
 * (numbered per OS thread in creation order, or "all") that run each
 * operation as soon as it is queued: running the same test with the
 * communication stream eager and then lazy exercises both orders.
 *
 * An operation may be unable to finish (an NCCL collective whose peer is
 * gone, or has not called it): a query (cudaStreamQuery, cudaEventQuery)
 * then answers cudaErrorNotReady, and a host wait (stream or event
 * synchronisation, cudaFree, a copy into pageable memory) waits, as on a
 * device, forever: after CUEMU_NCCL_TIMEOUT_S seconds it is reported as the
 * hang it is and the process stops.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <time.h>

#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "cuemu_internal.h"

struct cuemu_stream {
    int number;                  /* 1, 2, ... per OS thread */
    bool eager;
    bool draining;
    std::deque<std::function<bool()>> queue; /* true: done */
    std::deque<std::string> what; /* for messages */
    unsigned long long issued, done;
    pthread_t owner;
};

struct cuemu_event {
    cuemu_stream *stream;        /* NULL: never recorded */
    unsigned long long seq;      /* complete when stream->done >= seq */
    double t_ms;                 /* host time when the record ran */
    unsigned flags;              /* cudaEventDisableTiming: no elapsed time */
};

namespace cuemu {

static thread_local cudaError_t last_error = cudaSuccess;
static thread_local int streams_made;
static thread_local std::vector<cuemu_stream *> my_streams;
static thread_local cuemu_stream *legacy_stream;
static bool eager_number(int n);

/* This thread's legacy default stream (number 0). */
static cuemu_stream *legacy()
{
    if (!legacy_stream) {
        legacy_stream = new cuemu_stream();
        legacy_stream->number = 0;
        legacy_stream->eager = eager_number(0);
        legacy_stream->owner = pthread_self();
    }
    return legacy_stream;
}
static unsigned long long ops_run; /* under mem_mu */

struct alloc_info {
    size_t bytes;
    bool pinned;
    char *map;                   /* the mapping: data, then a guard page */
    size_t map_bytes;
};
static std::mutex mem_mu;
static std::map<const char *, alloc_info> allocs; /* by start address */
static size_t device_used;

void fatal(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "cuemu: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    abort();
}

void set_error(cudaError_t e)
{
    if (last_error == cudaSuccess)
        last_error = e;
}

static double now_ms()
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec * 1e3 + ts.tv_nsec * 1e-6;
}

static size_t device_bytes()
{
    const char *s = getenv("CUEMU_DEVICE_MB");
    long mb = s ? strtol(s, NULL, 10) : 4096;
    return (size_t)(mb > 0 ? mb : 4096) << 20;
}

/* The allocation holding [p, p + n), or allocs.end(). Caller holds mem_mu. */
static std::map<const char *, alloc_info>::iterator find_alloc(const void *p, size_t n)
{
    const char *c = (const char *)p;
    auto it = allocs.upper_bound(c);
    if (it == allocs.begin())
        return allocs.end();
    --it;
    if (c >= it->first && c + n <= it->first + it->second.bytes)
        return it;
    return allocs.end();
}

static bool in_kind(const void *p, size_t n, bool pinned)
{
    std::lock_guard<std::mutex> g(mem_mu);
    auto it = find_alloc(p, n);
    return it != allocs.end() && it->second.pinned == pinned;
}

bool is_device(const void *p, size_t n) { return in_kind(p, n, false); }
static bool is_pinned(const void *p, size_t n) { return in_kind(p, n, true); }

static void count_op()
{
    std::lock_guard<std::mutex> g(mem_mu);
    ops_run++;
}

static thread_local std::string stuck_why;

void note_stuck(const std::string &why) { stuck_why = why; }

long hang_timeout_s()
{
    const char *s = getenv("CUEMU_NCCL_TIMEOUT_S");
    long v = s ? strtol(s, NULL, 10) : 60;
    return v > 0 ? v : 60;
}

/* Runs s's queue while its operations finish, up to target; true once
 * s->done >= target. Never waits. */
static bool try_drain(cuemu_stream *s, unsigned long long target)
{
    if (!s)
        return true;
    if (s->draining && s->done < target)
        fatal("stream %d must run further (to operation %llu) while it waits at operation %llu "
              "(\"%s\"): a cycle of cudaStreamWaitEvent, which would hang the device",
              s->number, target, s->done + 1, s->what.empty() ? "?" : s->what.front().c_str());
    if (!pthread_equal(s->owner, pthread_self()))
        fatal("stream %d is used from a thread other than the one that created it (cuemu runs "
              "streams on their own thread)", s->number);
    s->draining = true;
    while (s->done < target) {
        if (!s->queue.front()())
            break;
        s->queue.pop_front();
        s->what.pop_front();
        s->done++;
        count_op();
    }
    s->draining = false;
    return s->done >= target;
}

/* A host wait: until s->done >= target, however long that takes on a
 * device; reported once it is clearly never. */
static void drain_to(cuemu_stream *s, unsigned long long target)
{
    if (try_drain(s, target))
        return;
    const double t0 = now_ms();
    const struct timespec nap = {0, 200 * 1000};
    while (!try_drain(s, target)) {
        if (now_ms() - t0 > hang_timeout_s() * 1e3)
            fatal("a host wait for stream %d has not returned for %ld s: its operation \"%s\" "
                  "cannot finish (%s); on a GPU this wait never returns: poll "
                  "(cudaStreamQuery/cudaEventQuery) and abort the communicator instead",
                  s->number, hang_timeout_s(), s->what.front().c_str(),
                  stuck_why.empty() ? "it waits for another stream" : stuck_why.c_str());
        nanosleep(&nap, NULL);
    }
}

void drain_stream(cudaStream_t s)
{
    if (!s)
        s = legacy();
    drain_to(s, s->issued);
}

void enqueue_poll(cudaStream_t s, const char *what, std::function<bool()> fn)
{
    if (!s)
        s = legacy();
    s->queue.push_back(std::move(fn));
    s->what.push_back(what);
    s->issued++;
    if (s->eager && !s->draining)
        try_drain(s, s->issued);
}

void enqueue(cudaStream_t s, const char *what, std::function<void()> fn)
{
    enqueue_poll(s, what, [fn]() {
        fn();
        return true;
    });
}

static bool eager_number(int n)
{
    const char *e = getenv("CUEMU_EAGER");
    if (!e || !*e)
        return false;
    if (strcmp(e, "all") == 0)
        return true;
    if (n == 0)
        return false; /* the legacy stream is eager only with "all" */
    for (const char *p = e; *p;) {
        char *end;
        long v = strtol(p, &end, 10);
        if (end == p)
            fatal("CUEMU_EAGER: expected \"all\" or stream numbers separated by commas, got \"%s\"",
                  e);
        if (v == n)
            return true;
        p = *end == ',' ? end + 1 : end;
    }
    return false;
}

} /* namespace cuemu */

using namespace cuemu;

extern "C" {

unsigned long long cuemu_ops_executed(void)
{
    std::lock_guard<std::mutex> g(mem_mu);
    return ops_run;
}

cudaError_t cudaGetDeviceCount(int *n)
{
    *n = 1;
    return cudaSuccess;
}

cudaError_t cudaSetDevice(int dev) { return dev == 0 ? cudaSuccess : cudaErrorInvalidValue; }

cudaError_t cudaGetDevice(int *dev)
{
    *dev = 0;
    return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp *prop, int dev)
{
    if (dev != 0)
        return cudaErrorInvalidValue;
    memset(prop, 0, sizeof(*prop));
    snprintf(prop->name, sizeof(prop->name), "cuemu (CUDA emulated on the CPU)");
    prop->totalGlobalMem = device_bytes();
    prop->major = 9;
    prop->minor = 0;
    prop->multiProcessorCount = 1;
    prop->clockRate = 1000000;
    prop->sharedMemPerBlock = 48 << 10;
    prop->maxThreadsPerBlock = 1024;
    return cudaSuccess;
}

cudaError_t cudaGetLastError(void)
{
    cudaError_t e = last_error;
    last_error = cudaSuccess;
    return e;
}

cudaError_t cudaPeekAtLastError(void) { return last_error; }

const char *cudaGetErrorName(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevicePointer: return "cudaErrorInvalidDevicePointer";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    case cudaErrorLaunchOutOfResources: return "cudaErrorLaunchOutOfResources";
    case cudaErrorNoDevice: return "cudaErrorNoDevice";
    }
    return "cudaErrorUnknown";
}

const char *cudaGetErrorString(cudaError_t e)
{
    switch (e) {
    case cudaSuccess: return "no error";
    case cudaErrorInvalidValue: return "invalid argument";
    case cudaErrorMemoryAllocation: return "out of memory";
    case cudaErrorInvalidConfiguration: return "invalid configuration argument";
    case cudaErrorInvalidDevicePointer: return "invalid device pointer";
    case cudaErrorInvalidMemcpyDirection: return "invalid copy direction for memcpy";
    case cudaErrorInvalidResourceHandle: return "invalid resource handle";
    case cudaErrorNotReady: return "device not ready";
    case cudaErrorLaunchOutOfResources: return "too many resources requested for launch";
    case cudaErrorNoDevice: return "no CUDA-capable device is detected";
    }
    return "unknown error";
}

static cudaError_t alloc(void **ptr, size_t bytes, bool pinned)
{
    *ptr = NULL;
    std::lock_guard<std::mutex> g(mem_mu);
    if (!pinned && device_used + bytes > device_bytes())
        return cudaErrorMemoryAllocation;
    const size_t page = 4096, data = (bytes + page - 1) / page * page + page;
    char *map = (char *)mmap(NULL, data + page, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (map == MAP_FAILED)
        return cudaErrorMemoryAllocation;
    mprotect(map + data, page, PROT_NONE);
    char *p = map + data - (bytes + 255) / 256 * 256; /* 256-aligned, ends near the guard */
    if (p == map + data)
        p -= 256;
    memset(p, pinned ? 0 : 0xff, bytes);
    allocs[(const char *)p] = alloc_info{bytes, pinned, map, data + page};
    if (!pinned)
        device_used += bytes;
    *ptr = p;
    return cudaSuccess;
}

static cudaError_t release(void *ptr, bool pinned)
{
    if (!ptr)
        return cudaSuccess;
    std::lock_guard<std::mutex> g(mem_mu);
    auto it = allocs.find((const char *)ptr);
    if (it == allocs.end() || it->second.pinned != pinned)
        return pinned ? cudaErrorInvalidValue : cudaErrorInvalidDevicePointer;
    if (!pinned)
        device_used -= it->second.bytes;
    munmap(it->second.map, it->second.map_bytes);
    allocs.erase(it);
    return cudaSuccess;
}

cudaError_t cudaMalloc(void **ptr, size_t bytes) { return alloc(ptr, bytes, false); }
cudaError_t cudaMallocHost(void **ptr, size_t bytes) { return alloc(ptr, bytes, true); }
cudaError_t cudaFreeHost(void *ptr) { return release(ptr, true); }

/* cudaFree waits for the device, as CUDA's does: this thread's streams run
 * first. */
cudaError_t cudaFree(void *ptr)
{
    cudaDeviceSynchronize();
    return release(ptr, false);
}

cudaError_t cudaMemGetInfo(size_t *free_bytes, size_t *total_bytes)
{
    std::lock_guard<std::mutex> g(mem_mu);
    *total_bytes = device_bytes();
    *free_bytes = *total_bytes - device_used;
    return cudaSuccess;
}

/* The kind must match where the pointers are, as with separate memories. */
static cudaError_t check_copy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    bool dd = is_device(dst, bytes), sd = is_device(src, bytes);
    switch (kind) {
    case cudaMemcpyHostToDevice: return dd && !sd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToHost: return sd && !dd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDeviceToDevice: return sd && dd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyHostToHost: return !sd && !dd ? cudaSuccess : cudaErrorInvalidValue;
    case cudaMemcpyDefault: return cudaSuccess;
    }
    return cudaErrorInvalidMemcpyDirection;
}

/* Queues a copy of host memory taken now (CUDA stages it before returning). */
static void enqueue_staged(cudaStream_t s, const char *what, void *dst, const void *src,
                           size_t bytes)
{
    std::string staged((const char *)src, bytes);
    enqueue(s, what, [dst, staged]() { memcpy(dst, staged.data(), staged.size()); });
}

/* On the legacy stream: into the device it may return before the copy is
 * done (a pageable source is staged first); into host memory it returns
 * once the copy and all legacy work before it are done. */
cudaError_t cudaMemcpy(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind)
{
    cudaError_t e = check_copy(dst, src, bytes, kind);
    if (e != cudaSuccess)
        return e;
    if (!is_device(dst, bytes)) {
        drain_stream(NULL);
        memmove(dst, src, bytes);
        count_op();
        return cudaSuccess;
    }
    if (!is_device(src, bytes))
        enqueue_staged(NULL, "cudaMemcpy", dst, src, bytes);
    else
        enqueue(NULL, "cudaMemcpy", [dst, src, bytes]() { memmove(dst, src, bytes); });
    return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t bytes, cudaMemcpyKind kind,
                            cudaStream_t s)
{
    cudaError_t e = check_copy(dst, src, bytes, kind);
    if (e != cudaSuccess)
        return e;
    const bool host_src = !is_device(src, bytes), host_dst = !is_device(dst, bytes);
    if (host_src && !is_pinned(src, bytes)) {
        enqueue_staged(s, "cudaMemcpyAsync (from pageable memory)", dst, src, bytes);
        return cudaSuccess;
    }
    enqueue(s, "cudaMemcpyAsync", [dst, src, bytes]() { memmove(dst, src, bytes); });
    if (host_dst && !is_pinned(dst, bytes))
        drain_stream(s); /* pageable destination: returns once copied */
    return cudaSuccess;
}

/* Asynchronous with respect to the host, on the legacy stream. */
cudaError_t cudaMemset(void *dst, int value, size_t bytes)
{
    if (!is_device(dst, bytes))
        return cudaErrorInvalidValue;
    enqueue(NULL, "cudaMemset", [dst, value, bytes]() { memset(dst, value, bytes); });
    return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void *dst, int value, size_t bytes, cudaStream_t s)
{
    if (!is_device(dst, bytes))
        return cudaErrorInvalidValue;
    enqueue(s, "cudaMemsetAsync", [dst, value, bytes]() { memset(dst, value, bytes); });
    return cudaSuccess;
}

cudaError_t cudaStreamCreate(cudaStream_t *s) { return cudaStreamCreateWithFlags(s, 0); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t *s, unsigned flags)
{
    (void)flags;
    cuemu_stream *st = new cuemu_stream();
    st->number = ++streams_made;
    st->eager = eager_number(st->number);
    st->owner = pthread_self();
    my_streams.push_back(st);
    *s = st;
    return cudaSuccess;
}

cudaError_t cudaStreamDestroy(cudaStream_t s)
{
    if (!s)
        return cudaErrorInvalidResourceHandle;
    drain_stream(s); /* queued work still completes, as in CUDA */
    for (size_t i = 0; i < my_streams.size(); i++)
        if (my_streams[i] == s)
            my_streams.erase(my_streams.begin() + (long)i);
    delete s;
    return cudaSuccess;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s)
{
    drain_stream(s); /* NULL: the legacy stream */
    return cudaSuccess;
}

/* Polling runs what can run; an operation that cannot finish yet leaves
 * the stream not ready. */
cudaError_t cudaStreamQuery(cudaStream_t s)
{
    if (!s)
        s = legacy();
    return try_drain(s, s->issued) ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaDeviceSynchronize(void)
{
    drain_stream(NULL);
    for (size_t i = 0; i < my_streams.size(); i++)
        drain_stream(my_streams[i]);
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t *e) { return cudaEventCreateWithFlags(e, 0); }

cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned flags)
{
    *e = new cuemu_event();
    (*e)->flags = flags;
    return cudaSuccess;
}

cudaError_t cudaEventDestroy(cudaEvent_t e)
{
    delete e;
    return cudaSuccess;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s)
{
    if (!e)
        return cudaErrorInvalidResourceHandle;
    if (!s)
        s = legacy();
    enqueue(s, "cudaEventRecord", [e]() { e->t_ms = now_ms(); });
    e->stream = s;
    e->seq = s->issued;
    return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e)
{
    if (!e)
        return cudaErrorInvalidResourceHandle;
    if (e->stream)
        drain_to(e->stream, e->seq);
    return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e)
{
    if (!e)
        return cudaErrorInvalidResourceHandle;
    if (!e->stream || e->stream->done >= e->seq)
        return cudaSuccess;
    if (pthread_equal(e->stream->owner, pthread_self())) /* its thread runs it */
        try_drain(e->stream, e->seq);
    return e->stream->done >= e->seq ? cudaSuccess : cudaErrorNotReady;
}

cudaError_t cudaEventElapsedTime(float *ms, cudaEvent_t start, cudaEvent_t end)
{
    if (!start || !end || !start->stream || !end->stream ||
        ((start->flags | end->flags) & cudaEventDisableTiming))
        return cudaErrorInvalidResourceHandle; /* as CUDA: never recorded, or no timing */
    if (cudaEventQuery(start) != cudaSuccess || cudaEventQuery(end) != cudaSuccess)
        return cudaErrorNotReady;
    *ms = (float)(end->t_ms - start->t_ms);
    return cudaSuccess;
}

/* s waits for what the event's stream had queued when it was recorded. */
cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned flags)
{
    (void)flags;
    if (!e)
        return cudaErrorInvalidResourceHandle;
    cuemu_stream *other = e->stream;
    const unsigned long long seq = e->seq;
    if (!other || other == s)
        return cudaSuccess;
    enqueue_poll(s, "cudaStreamWaitEvent", [other, seq]() { return try_drain(other, seq); });
    return cudaSuccess;
}

} /* extern "C" */
