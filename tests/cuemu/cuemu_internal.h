/* cuemu's internals shared by its files (tests/cuemu/README.md). */
#ifndef CUEMU_INTERNAL_H
#define CUEMU_INTERNAL_H

#include <functional>

#include "cuda_runtime.h"

namespace cuemu {

/* A misuse that real CUDA/NCCL would answer with a hang or garbage:
 * printed with "cuemu:" and the process aborts. */
[[noreturn]] void fatal(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Queues fn on stream s (NULL: the legacy stream, run now); it runs when
 * the host waits for s, or at once if s is eager (CUEMU_EAGER). */
void enqueue(cudaStream_t s, const char *what, std::function<void()> fn);
/* Runs everything queued on s. */
void drain_stream(cudaStream_t s);
/* The error cudaGetLastError() returns next. */
void set_error(cudaError_t e);
/* [p, p + n) lies inside one cudaMalloc allocation. */
bool is_device(const void *p, size_t n);

} /* namespace cuemu */

#endif
