/*
 * cuemu_kernel: kernel launches on the CPU (tests/cuemu/README.md).
 *
 * A launch runs its blocks one after the other. Within a block each CUDA
 * thread is a fiber (ucontext) that runs until it finishes or reaches a
 * barrier: __syncthreads() (every live thread of the block) or a warp
 * shuffle (every live lane of its warp; two barriers, one after writing
 * the value and one after reading the partner's). The scheduler releases a
 * barrier once all the threads it concerns are there; threads that exited
 * do not count, as on the device. Threads stuck at different barriers
 * (a __syncthreads inside divergent code, say) are reported and stop the
 * process: on a GPU they would hang it or give undefined results.
 *
 * A kernel that reached no barrier in its first launch runs its threads as
 * plain calls afterwards (no fibers: much faster); reaching a barrier in
 * that mode is reported.
 *
 * Blocks run one at a time in the whole process (a lock), so that static
 * __shared__ variables, one linker section, can be refilled with 0xff bytes
 * before each block, as dynamic shared memory is. CUEMU_ORDER=reverse runs
 * blocks and threads in descending order: a thread that reads another's
 * shared or global write without a barrier gets a different answer.
 *
 * Fibers start on their own stack with makecontext/setcontext and switch
 * with _setjmp/_longjmp, which unlike swapcontext make no system call (the
 * signal mask is not touched): a block switches tens of times per thread.
 * Fortified longjmp refuses to jump between stacks, hence the #undef.
 */
#undef _FORTIFY_SOURCE
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>

#include <mutex>

#include <unordered_map>
#include <vector>

#include "cuemu_internal.h"

namespace cuemu {

enum fiber_state { READY, AT_SYNC, AT_WARP, DONE };

struct fiber {
    ucontext_t start;      /* its first entry */
    jmp_buf at;            /* where it stopped */
    bool started;
    uint3 tid;
    fiber_state state;
};

enum { STACK_BYTES = 64 << 10, MAX_THREADS = 1024, MAX_SMEM = 48 << 10 };

/* The block being run on this OS thread. */
struct block_run {
    const char *name;
    dim3 grid, block;
    uint3 bid, tid;
    bool fibers;           /* threads are fibers (else plain calls) */
    bool barrier_seen;
    const std::function<void()> *body;
    std::vector<fiber> th;
    fiber *cur;
    jmp_buf sched;
    uint64_t lanes[MAX_THREADS]; /* shuffle values, by thread */
    std::vector<unsigned char> smem;
};

static thread_local block_run *run;
static std::mutex blocks_mu; /* one block at a time in the process */

extern "C" {
/* The static __shared__ section's bounds, from the linker (absent when no
 * kernel declares one). */
extern char __start_cuemu_shared[] __attribute__((weak));
extern char __stop_cuemu_shared[] __attribute__((weak));
}

static bool reverse_order()
{
    static const bool rev = [] {
        const char *o = getenv("CUEMU_ORDER");
        if (o && strcmp(o, "reverse") != 0 && strcmp(o, "forward") != 0)
            fatal("CUEMU_ORDER: expected forward or reverse, got \"%s\"", o);
        return o && strcmp(o, "reverse") == 0;
    }();
    return rev;
}
static thread_local std::vector<char *> stacks;
static thread_local std::unordered_map<const void *, bool> barrier_free; /* by kernel */

const uint3 &thread_idx() { return run->tid; }
const uint3 &block_idx() { return run->bid; }
const dim3 &block_dim() { return run->block; }
const dim3 &grid_dim() { return run->grid; }
void *dyn_smem() { return run->smem.data(); }

static unsigned linear(const uint3 &t, const dim3 &b) { return t.x + b.x * (t.y + b.y * t.z); }

/* Parks the calling fiber at a barrier; returns once released. */
static void wait_at(fiber_state s)
{
    if (!run->fibers)
        fatal("kernel %s reached a barrier (__syncthreads or a warp shuffle) after launches "
              "that reached none: cuemu runs such kernels without fibers; a barrier that "
              "depends on the data is not supported", run->name);
    run->barrier_seen = true;
    fiber *f = run->cur;
    f->state = s;
    if (!_setjmp(f->at))
        _longjmp(run->sched, 1);
    run->tid = f->tid;
}

void syncthreads() { wait_at(AT_SYNC); }

uint64_t shfl_xor(uint64_t bits, int lane_mask, unsigned mask)
{
    if (mask != 0xffffffffu)
        fatal("kernel %s: a shuffle with a partial mask (0x%x) is not emulated", run->name, mask);
    if (!run->fibers) /* reports it */
        wait_at(AT_WARP);
    const unsigned me = linear(run->tid, run->block);
    const unsigned partner = (me & ~31u) | ((me & 31u) ^ (unsigned)(lane_mask & 31));
    run->lanes[me] = bits;
    wait_at(AT_WARP);
    if (partner >= run->th.size() || run->th[partner].state == DONE)
        fatal("kernel %s, block (%u,%u,%u): thread %u shuffles with lane %u, which has exited "
              "or does not exist: undefined on the device", run->name, run->bid.x, run->bid.y,
              run->bid.z, me, partner);
    const uint64_t r = run->lanes[partner];
    wait_at(AT_WARP);
    return r;
}

static void fiber_main()
{
    (*run->body)();
    run->cur->state = DONE;
    _longjmp(run->sched, 1);
}

static char *stack_for(size_t i)
{
    while (stacks.size() <= i) {
        void *p = mmap(NULL, STACK_BYTES, PROT_READ | PROT_WRITE,
                       MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
        if (p == MAP_FAILED)
            fatal("cannot map a fiber stack");
        stacks.push_back((char *)p);
    }
    return stacks[i];
}

/* Releases what can be released; false when nothing can (a deadlock). */
static bool release_barriers(size_t live)
{
    size_t at_sync = 0;
    bool released = false;
    for (fiber &f : run->th)
        at_sync += f.state == AT_SYNC;
    if (at_sync == live) {
        for (fiber &f : run->th)
            if (f.state == AT_SYNC)
                f.state = READY;
        return true;
    }
    const size_t n = run->th.size();
    for (size_t w = 0; w < n; w += 32) {
        size_t lo = w, hi = w + 32 < n ? w + 32 : n, waiting = 0, alive = 0;
        for (size_t i = lo; i < hi; i++) {
            alive += run->th[i].state != DONE;
            waiting += run->th[i].state == AT_WARP;
        }
        if (alive && waiting == alive) {
            for (size_t i = lo; i < hi; i++)
                if (run->th[i].state == AT_WARP)
                    run->th[i].state = READY;
            released = true;
        }
    }
    return released;
}

/* Out of line: swapcontext returns twice, and the caller's loop variables
 * must not live across it. */
static void __attribute__((noinline)) resume(fiber *f)
{
    run->cur = f;
    run->tid = f->tid;
    if (_setjmp(run->sched))
        return;
    if (f->started) {
        _longjmp(f->at, 1);
    } else {
        f->started = true;
        setcontext(&f->start);
    }
}

static void __attribute__((noinline)) start(fiber *f, char *stack)
{
    getcontext(&f->start);
    f->start.uc_stack.ss_sp = stack;
    f->start.uc_stack.ss_size = STACK_BYTES;
    f->start.uc_link = NULL; /* fiber_main never returns */
    makecontext(&f->start, fiber_main, 0);
    f->started = false;
    f->state = READY;
}

static void run_block_fibers()
{
    const size_t n = run->th.size();
    for (size_t i = 0; i < n; i++)
        start(&run->th[i], stack_for(i));
    size_t live = n;
    const bool rev = reverse_order();
    while (live) {
        for (size_t k = 0; k < n; k++) {
            fiber &f = run->th[rev ? n - 1 - k : k];
            if (f.state != READY)
                continue;
            resume(&f);
            if (f.state == DONE)
                live--;
        }
        if (live && !release_barriers(live)) {
            size_t s = 0, w = 0;
            for (fiber &f : run->th) {
                s += f.state == AT_SYNC;
                w += f.state == AT_WARP;
            }
            fatal("kernel %s, block (%u,%u,%u): threads wait at different barriers "
                  "(%zu at __syncthreads, %zu at a warp shuffle, %zu still running): "
                  "a barrier in divergent code hangs the device",
                  run->name, run->bid.x, run->bid.y, run->bid.z, s, w, live - s - w);
        }
    }
}

static void run_block_plain()
{
    const size_t n = run->th.size();
    const bool rev = reverse_order();
    for (size_t k = 0; k < n; k++) {
        run->tid = run->th[rev ? n - 1 - k : k].tid;
        (*run->body)();
    }
}

static void run_grid(const void *key, block_run *r)
{
    block_run *outer = run;
    run = r;
    auto known = barrier_free.find(key);
    r->fibers = known == barrier_free.end() || !known->second;
    const size_t n = (size_t)r->block.x * r->block.y * r->block.z;
    r->th.resize(n);
    for (unsigned z = 0; z < r->block.z; z++)
        for (unsigned y = 0; y < r->block.y; y++)
            for (unsigned x = 0; x < r->block.x; x++)
                r->th[linear(uint3{x, y, z}, r->block)].tid = uint3{x, y, z};
    std::lock_guard<std::mutex> one_block_at_a_time(blocks_mu);
    const bool rev = reverse_order();
    const size_t shared_bytes =
        __start_cuemu_shared ? (size_t)(__stop_cuemu_shared - __start_cuemu_shared) : 0;
    for (unsigned bz = 0; bz < r->grid.z; bz++)
        for (unsigned by = 0; by < r->grid.y; by++)
            for (unsigned bx = 0; bx < r->grid.x; bx++) {
                r->bid = rev ? uint3{r->grid.x - 1 - bx, r->grid.y - 1 - by, r->grid.z - 1 - bz}
                             : uint3{bx, by, bz};
                if (shared_bytes)
                    memset(__start_cuemu_shared, 0xff, shared_bytes);
                if (!r->smem.empty())
                    memset(r->smem.data(), 0xff, r->smem.size());
                if (r->fibers)
                    run_block_fibers();
                else
                    run_block_plain();
            }
    if (r->fibers)
        barrier_free[key] = !r->barrier_seen;
    run = outer;
}

void launch(const void *key, const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            std::function<void()> body)
{
    const unsigned long long threads = (unsigned long long)block.x * block.y * block.z;
    if (threads == 0 || threads > MAX_THREADS || block.z > 64 || grid.x == 0 || grid.y == 0 ||
        grid.z == 0 || grid.y > 65535 || grid.z > 65535 || grid.x > 0x7fffffffu) {
        set_error(cudaErrorInvalidConfiguration);
        return;
    }
    if (smem > MAX_SMEM) {
        set_error(cudaErrorInvalidValue);
        return;
    }
    enqueue(s, name, [key, name, grid, block, smem, body]() {
        block_run r;
        r.name = name;
        r.grid = grid;
        r.block = block;
        r.barrier_seen = false;
        r.body = &body;
        r.cur = NULL;
        r.smem.resize(smem);
        run_grid(key, &r);
    });
}

} /* namespace cuemu */
