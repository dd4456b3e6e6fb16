/*
 * cuemu_kernel.h: the CUDA kernel language on the CPU (C++ only; included
 * by cuemu's cuda_runtime.h). See tests/cuemu/README.md.
 */
#ifndef CUEMU_KERNEL_H
#define CUEMU_KERNEL_H

#include <stdint.h>
#include <string.h>

#include <functional>
#include <tuple>
#include <utility>

struct uint3 {
    unsigned x, y, z;
};

struct dim3 {
    unsigned x, y, z;
    dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};

#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
/* Static shared memory: one section that cuemu refills with 0xff bytes
 * before every block (on a GPU it starts undefined), so a value one block
 * left behind is never mistaken for this block's. Blocks run one at a time
 * in the whole process, ranks that are threads included. */
#define __shared__ static __attribute__((section("cuemu_shared")))

namespace cuemu {

const uint3 &thread_idx();
const uint3 &block_idx();
const dim3 &block_dim();
const dim3 &grid_dim();
void syncthreads();
/* The 8 bytes lane (this lane ^ lane_mask) passed; every live lane of the
 * warp takes part. */
uint64_t shfl_xor(uint64_t bits, int lane_mask, unsigned mask);
void *dyn_smem();

/* Queues body (one CUDA thread) over grid x block on stream s; a bad
 * configuration sets the error cudaGetLastError() returns. key tells the
 * kernels apart. */
void launch(const void *key, const char *name, dim3 grid, dim3 block, size_t smem, cudaStream_t s,
            std::function<void()> body);

template <class... P> struct Launcher {
    void (*kernel)(P...);
    const char *name;
    dim3 grid, block;
    size_t smem;
    cudaStream_t stream;

    template <class... A> void operator()(A &&...a) const
    {
        std::tuple<P...> args(std::forward<A>(a)...); /* by value, as a launch copies them */
        auto k = kernel;
        launch(reinterpret_cast<const void *>(k), name, grid, block, smem, stream,
               [k, args]() { std::apply(k, args); });
    }
};

template <class... P>
Launcher<P...> launcher(void (*k)(P...), const char *name, dim3 grid, dim3 block, size_t smem,
                        cudaStream_t s)
{
    return Launcher<P...>{k, name, grid, block, smem, s};
}

} /* namespace cuemu */

#define threadIdx (cuemu::thread_idx())
#define blockIdx (cuemu::block_idx())
#define blockDim (cuemu::block_dim())
#define gridDim (cuemu::grid_dim())
#define __syncthreads() cuemu::syncthreads()

/* What worker/train/gpu/gpu_kernels.h would otherwise define for nvcc. */
#define LAUNCH(kernel, grid, block, smem, stream)                                              \
    cuemu::launcher(kernel, #kernel, grid, block, smem, stream)
#define DYN_SHARED(type, name) type *name = static_cast<type *>(cuemu::dyn_smem())

template <class T> inline T __shfl_xor_sync(unsigned mask, T v, int lane_mask)
{
    static_assert(sizeof(T) <= 8, "cuemu: shuffles move at most 8 bytes");
    uint64_t bits = 0;
    memcpy(&bits, &v, sizeof(T));
    bits = cuemu::shfl_xor(bits, lane_mask, mask);
    T r;
    memcpy(&r, &bits, sizeof(T));
    return r;
}

/* Threads of a block never run at the same time: a plain add is atomic. */
template <class T> inline T atomicAdd(T *p, T v)
{
    T old = *p;
    *p = old + v;
    return old;
}

inline float __expf(float x) { return expf(x); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }

#endif
