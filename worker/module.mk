# muster-worker (the node agent) and muster-train (one rank).
AGENT_SRCS := worker/agent/agent.c worker/agent/agent_link.c worker/agent/agent_daemon_msg.c worker/agent/agent_gen.c worker/agent/agent_ranks.c worker/agent/agent_spawn.c worker/agent/agent_command.c worker/agent/agent_fit.c worker/agent/agent_config.c worker/agent/launch.c worker/agent/local.c worker/agent/cloud.c worker/agent/agent_join.c worker/agent/exit_queue.c worker/agent/agent_rank.c worker/agent/devices.c worker/agent/frame_conn.c worker/agent/rank_env.c worker/agent/rank_failure.c worker/agent/rank_log.c worker/agent/rank_stacks.c worker/agent/spare.c worker/agent/agent_preflight.c worker/agent/nccl_ras.c worker/agent/rank_user.c worker/agent/rank_flight.c worker/agent/memckpt.c worker/agent/memrep.c worker/agent/memdrain.c
AGENT_MAIN := worker/agent/agent_main.c
TRAIN_SRCS := worker/train/layers.c worker/train/model.c worker/train/optim.c \
	worker/train/data.c worker/train/ckpt.c worker/train/train.c worker/train/zero.c worker/train/rank.c \
	worker/train/blas_core.c worker/train/replica.c worker/train/comm/comm.c worker/train/comm/comm_ring.c
TRAIN_MAIN := worker/train/train_main.c
# comm.h's NCCL backend: linked into the test programs as it is; muster-train
# has it in its GPU module and reaches it through TRAIN_LOAD_SRCS.
COMM_NCCL_SRC := worker/train/comm/comm_nccl.c
# muster-train's side of the GPU module: finding it, and COMM_NCCL through it.
TRAIN_LOAD_SRCS := worker/train/gpu/gpu_load.c worker/train/comm/comm_nccl_load.c
# The GPU path of muster-train (worker/train/gpu/): CUDA sources, the C loop
# over them and the module's entry table; built only when nvcc is found
# (HAVE_CUDA in the Makefile), into muster-train-gpu.so with COMM_NCCL_SRC.
GPU_CU_SRCS := worker/train/gpu/gpu_kernels.cu worker/train/gpu/gpu_zero.cu
GPU_SRCS := worker/train/gpu/gpu_train.c worker/train/gpu/gpu_module.c
