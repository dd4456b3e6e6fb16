/* The GPU module's entry table (gpu_module.h): the one symbol muster-train looks up. */
#include "worker/train/gpu/gpu_module.h"

#include "worker/train/comm/comm_impl.h"

static const struct gpu_module table = {
    .abi = GPU_MODULE_ABI,
    .version = MUSTER_VERSION,
    .trainer_size = sizeof(struct gpu_trainer),
    .device_name = gpu_device_name,
    .unique_id = gpu_unique_id,
    .strerror = gpu_strerror,
    .zero_abort = gpu_zero_abort,
    .zero_release = gpu_zero_release_comm,
    .zero_state_bytes = gpu_zero_state_bytes,
    .trainer_init = gpu_trainer_init,
    .trainer_free = gpu_trainer_free,
    .trainer_load = gpu_trainer_load,
    .trainer_sample = gpu_trainer_sample,
    .train_run = gpu_train_run,
    .trainer_replicas = gpu_trainer_replicas,
    .trainer_set_comm = gpu_trainer_set_comm,
    .trainer_reset = gpu_trainer_reset,
    .trainer_reslice = gpu_trainer_reslice,
    .trainer_read_state = gpu_trainer_read_state,
    .trainer_to_host = gpu_trainer_to_host,
    .trainer_failed = gpu_trainer_failed,
    .zero_gather_u64 = gpu_zero_gather_u64,
    .comm_nccl_unique_id = comm_nccl_unique_id,
    .comm_nccl_init = comm_nccl_init,
    .comm_nccl_gpu_count = comm_nccl_gpu_count,
};

__attribute__((visibility("default"))) const struct gpu_module *gpu_module_entry(void)
{
    return &table;
}
