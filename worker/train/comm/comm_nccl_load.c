/*
 * COMM_NCCL in muster-train: the backend (comm_nccl.c) lives in the GPU
 * module with the rest of what needs CUDA (worker/train/gpu/gpu_module.h),
 * loaded on first use. Without the module, NCCL is not available here:
 * -ENOTSUP, as in a build without NCCL, with the reason logged once.
 */
#include <errno.h>

#include "common/log.h"
#include "worker/train/comm/comm_impl.h"
#include "worker/train/gpu/gpu_module.h"

static const struct gpu_module *module(void)
{
    char err[2048];
    const struct gpu_module *m = gpu_module_load(err, sizeof(err));
    static int said;
    if (!m && !said++)
        log_warn("comm: no NCCL backend: %s", err);
    return m;
}

int comm_nccl_unique_id(uint8_t id[COMM_ID_BYTES])
{
    const struct gpu_module *m = module();
    return m ? m->comm_nccl_unique_id(id) : -ENOTSUP;
}

int comm_nccl_init(struct comm *c, const uint8_t id[COMM_ID_BYTES], int timeout_ms)
{
    const struct gpu_module *m = module();
    return m ? m->comm_nccl_init(c, id, timeout_ms) : -ENOTSUP;
}

int comm_nccl_gpu_count(void)
{
    const struct gpu_module *m = gpu_module_load(NULL, 0);
    return m ? m->comm_nccl_gpu_count() : 0;
}
