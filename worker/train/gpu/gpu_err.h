/*
 * gpu_err: checks for CUDA, cuBLAS and NCCL calls inside the worker/train/gpu CUDA files.
 * A failed call is reported with the call as written, the code's name and
 * words, and where it was (file:line); the function returns a gpu.h code.
 * Out-of-memory diagnoses are added where the size is known (gpu_alloc in
 * gpu_zero.cu). Used inside functions that have a `struct gpu_zero *z`
 * whose `err` buffer receives the message.
 */
#ifndef MUSTER_GPU_ERR_H
#define MUSTER_GPU_ERR_H

#include <errno.h>
#include <stdio.h>

#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef MUSTER_HAVE_NCCL
#include <nccl.h>
#endif

#include "worker/train/gpu/gpu.h"

static inline int gpu_report_cuda(char *err, size_t len, const char *call, cudaError_t e,
                                  const char *file, int line)
{
    snprintf(err, len, "%s:%d: %s: %s (%s)", file, line, call, cudaGetErrorName(e),
             cudaGetErrorString(e));
    return e == cudaErrorMemoryAllocation ? -ENOMEM : GPU_E_CUDA;
}

static inline int gpu_report_cublas(char *err, size_t len, const char *call, cublasStatus_t s,
                                    const char *file, int line)
{
    snprintf(err, len, "%s:%d: %s: %s (%s)%s", file, line, call, cublasGetStatusName(s),
             cublasGetStatusString(s),
             s == CUBLAS_STATUS_NOT_SUPPORTED ? "; this GEMM's shapes/types are not supported "
                                                "on this GPU (bf16 needs sm_80 or newer)" : "");
    return s == CUBLAS_STATUS_ALLOC_FAILED ? -ENOMEM : GPU_E_CUBLAS;
}

#ifdef MUSTER_HAVE_NCCL
static inline int gpu_report_nccl(char *err, size_t len, const char *call, ncclResult_t r,
                                  const char *file, int line)
{
    const char *hint = "";
    if (r == ncclSystemError || r == ncclRemoteError)
        hint = "; a peer died or the network failed (NCCL_DEBUG=WARN says which)";
    else if (r == ncclUnhandledCudaError)
        hint = "; a CUDA call inside NCCL failed (out of memory, or a bad device)";
    snprintf(err, len, "%s:%d: %s: NCCL error %d (%s)%s", file, line, call, (int)r,
             ncclGetErrorString(r), hint);
    return GPU_E_NCCL;
}
#endif

/* In a function of gpu_zero.cu with z in scope: return a gpu.h code on failure. */
#define CUDA_CK(call)                                                                        \
    do {                                                                                     \
        cudaError_t e_ = (call);                                                             \
        if (e_ != cudaSuccess)                                                               \
            return gpu_report_cuda(z->err, sizeof(z->err), #call, e_, __FILE__, __LINE__);    \
    } while (0)

#define CUBLAS_CK(call)                                                                      \
    do {                                                                                     \
        cublasStatus_t s_ = (call);                                                          \
        if (s_ != CUBLAS_STATUS_SUCCESS)                                                     \
            return gpu_report_cublas(z->err, sizeof(z->err), #call, s_, __FILE__, __LINE__);  \
    } while (0)

#define NCCL_CK(call)                                                                        \
    do {                                                                                     \
        ncclResult_t r_ = (call);                                                            \
        if (r_ != ncclSuccess) {                                                             \
            z->nccl_failed = 1;                                                              \
            return gpu_report_nccl(z->err, sizeof(z->err), #call, r_, __FILE__, __LINE__);    \
        }                                                                                    \
    } while (0)

/* An int-returning step: pass its code on. */
#define TRY(x)                                                                               \
    do {                                                                                     \
        int rc_ = (x);                                                                       \
        if (rc_)                                                                             \
            return rc_;                                                                      \
    } while (0)

#endif
