/*
 * cuemu_blas: cublasGemmStridedBatchedEx on the CPU, with the argument
 * checks cuBLAS documents (tests/cuemu/README.md). bf16 inputs are widened
 * to fp32 and the products summed in fp32, as CUBLAS_COMPUTE_32F does
 * (the order of the sums differs from the tensor cores').
 */
#include <stdlib.h>

#include "cublas_v2.h"
#include "cuda_bf16.h"
#include "cuemu_internal.h"

struct cuemu_blas {
    cudaStream_t stream;
    void *workspace;
    size_t workspace_bytes;
};

extern "C" {

cublasStatus_t cublasCreate(cublasHandle_t *h)
{
    *h = new cuemu_blas();
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy(cublasHandle_t h)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    /* cuBLAS may still use its workspace until the handle is destroyed */
    if (h->workspace_bytes && !cuemu::is_device(h->workspace, h->workspace_bytes))
        cuemu::fatal("cublasDestroy: the workspace given to cublasSetWorkspace was freed before "
                     "the handle was destroyed");
    delete h;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream(cublasHandle_t h, cudaStream_t s)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    h->stream = s;
    return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace(cublasHandle_t h, void *ws, size_t bytes)
{
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (bytes && !cuemu::is_device(ws, bytes))
        return CUBLAS_STATUS_INVALID_VALUE;
    h->workspace = ws;
    h->workspace_bytes = bytes;
    return CUBLAS_STATUS_SUCCESS;
}

const char *cublasGetStatusName(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    }
    return "CUBLAS_STATUS_UNKNOWN";
}

const char *cublasGetStatusString(cublasStatus_t s)
{
    switch (s) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    }
    return "unknown";
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t h, cublasOperation_t ta,
                                          cublasOperation_t tb, int m, int n, int k,
                                          const void *alpha, const void *A, cudaDataType at,
                                          int lda, long long sA, const void *B, cudaDataType bt,
                                          int ldb, long long sB, const void *beta, void *C,
                                          cudaDataType ct, int ldc, long long sC, int batch,
                                          cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    (void)algo;
    if (!h)
        return CUBLAS_STATUS_NOT_INITIALIZED;
    if (at != CUDA_R_16BF || bt != CUDA_R_16BF || ct != CUDA_R_32F ||
        compute != CUBLAS_COMPUTE_32F)
        return CUBLAS_STATUS_NOT_SUPPORTED; /* the only combination cuemu runs */
    const int arows = ta == CUBLAS_OP_N ? m : k, brows = tb == CUBLAS_OP_N ? k : n;
    if (m < 0 || n < 0 || k < 0 || batch < 0 || (ta != CUBLAS_OP_N && ta != CUBLAS_OP_T) ||
        (tb != CUBLAS_OP_N && tb != CUBLAS_OP_T) || lda < (arows > 1 ? arows : 1) ||
        ldb < (brows > 1 ? brows : 1) || ldc < (m > 1 ? m : 1))
        return CUBLAS_STATUS_INVALID_VALUE;
    /* every element the call touches must lie in one device allocation:
     * cuBLAS would read or write past the end without a word */
    if (m && n && batch) {
        const size_t ea = (size_t)(batch - 1) * (size_t)sA + (size_t)((ta == CUBLAS_OP_N ? k : m) - 1) * lda +
                          (size_t)arows;
        const size_t eb = (size_t)(batch - 1) * (size_t)sB + (size_t)((tb == CUBLAS_OP_N ? n : k) - 1) * ldb +
                          (size_t)brows;
        const size_t ec = (size_t)(batch - 1) * (size_t)sC + (size_t)(n - 1) * ldc + (size_t)m;
        if ((k && (!cuemu::is_device(A, ea * 2) || !cuemu::is_device(B, eb * 2))) ||
            !cuemu::is_device(C, ec * 4))
            cuemu::fatal("cublasGemmStridedBatchedEx(m %d, n %d, k %d, lda %d, ldb %d, ldc %d, "
                         "batch %d, strides %lld %lld %lld) reaches past the end of an operand's "
                         "device allocation", m, n, k, lda, ldb, ldc, batch, sA, sB, sC);
    }
    /* alpha and beta are host scalars (the default pointer mode) */
    const float al = *(const float *)alpha, be = *(const float *)beta;
    const __nv_bfloat16 *a0 = (const __nv_bfloat16 *)A, *b0 = (const __nv_bfloat16 *)B;
    float *c0 = (float *)C;
    cuemu::enqueue(h->stream, "cublasGemmStridedBatchedEx", [=]() {
        for (int b = 0; b < batch; b++) {
            const __nv_bfloat16 *a = a0 + b * sA, *bm = b0 + b * sB;
            float *c = c0 + b * sC;
            for (int j = 0; j < n; j++)
                for (int i = 0; i < m; i++) {
                    float sum = 0;
                    for (int p = 0; p < k; p++) {
                        float x = __bfloat162float(ta == CUBLAS_OP_N ? a[i + (size_t)p * lda]
                                                                     : a[p + (size_t)i * lda]);
                        float y = __bfloat162float(tb == CUBLAS_OP_N ? bm[p + (size_t)j * ldb]
                                                                     : bm[j + (size_t)p * ldb]);
                        sum += x * y;
                    }
                    float *out = c + i + (size_t)j * ldc;
                    /* beta 0: C is not read (it may hold NaN) */
                    *out = be == 0.0f ? al * sum : al * sum + be * *out;
                }
        }
    });
    return CUBLAS_STATUS_SUCCESS;
}

} /* extern "C" */
