# muster-worker (the node agent) and muster-train (one rank).
AGENT_SRCS := worker/agent/agent.c worker/agent/agent_config.c worker/agent/launch.c worker/agent/local.c worker/agent/cloud.c worker/agent/agent_join.c worker/agent/agent_rank.c worker/agent/devices.c worker/agent/frame_conn.c worker/agent/rank_env.c worker/agent/rank_failure.c worker/agent/rank_log.c
AGENT_MAIN := worker/agent/agent_main.c
TRAIN_SRCS := worker/train/layers.c worker/train/model.c worker/train/optim.c \
	worker/train/data.c worker/train/ckpt.c worker/train/train.c worker/train/zero.c worker/train/rank.c \
	worker/train/comm/comm.c worker/train/comm/comm_ring.c worker/train/comm/comm_nccl.c
TRAIN_MAIN := worker/train/train_main.c
# The GPU path of muster-train (worker/train/gpu/): CUDA sources and the C loop
# over them; built only when nvcc is found (HAVE_CUDA in the Makefile).
GPU_CU_SRCS := worker/train/gpu/gpu_kernels.cu worker/train/gpu/gpu_zero.cu
GPU_SRCS := worker/train/gpu/gpu_train.c
