/* cuemu's internals shared by its files (tests/cuemu/README.md). */
#ifndef CUEMU_INTERNAL_H
#define CUEMU_INTERNAL_H

#include <functional>
#include <string>

#include "cuda_runtime.h"

namespace cuemu {

/* A misuse that real CUDA/NCCL would answer with a hang or garbage:
 * printed with "cuemu:" and the process aborts. */
[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Queues fn on stream s (NULL: the legacy stream, run now); it runs when
 * the host waits for s, or at once if s is eager (CUEMU_EAGER). */
void enqueue(cudaStream_t s, const char *what, std::function<void()> fn);
/* Queues an operation that may not be able to finish yet (an NCCL
 * collective whose peers have not arrived): fn is called again, from the
 * stream's waits and queries, until it returns true. */
void enqueue_poll(cudaStream_t s, const char *what, std::function<bool()> fn);
/* Runs everything queued on s, waiting for operations that cannot finish
 * yet; one that stays unfinished for CUEMU_NCCL_TIMEOUT_S is reported as
 * the hang it would be on a GPU. */
void drain_stream(cudaStream_t s);
/* Why the operation polled last on this thread cannot finish (for that report). */
void note_stuck(const std::string &why);
/* Seconds after which a wait that can never end is reported (CUEMU_NCCL_TIMEOUT_S, default 60). */
long hang_timeout_s();
/* The error cudaGetLastError() returns next. */
void set_error(cudaError_t e);
/* [p, p + n) lies inside one cudaMalloc allocation. */
bool is_device(const void *p, size_t n);

} /* namespace cuemu */

#endif
