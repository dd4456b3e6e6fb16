# muster-worker (the node agent) and muster-train (one rank).
AGENT_SRCS := worker/agent.c worker/agent_config.c worker/launch.c worker/local.c worker/cloud.c worker/agent_join.c worker/agent_rank.c worker/devices.c worker/frame_conn.c worker/rank_env.c
AGENT_MAIN := worker/agent_main.c
TRAIN_SRCS := worker/train/layers.c worker/train/model.c worker/train/optim.c \
	worker/train/data.c worker/train/ckpt.c worker/train/train.c worker/train/zero.c worker/train/rank.c \
	worker/comm.c worker/comm_ring.c worker/comm_nccl.c
TRAIN_MAIN := worker/train_main.c
# The GPU path of muster-train (worker/gpu/): CUDA sources and the C loop
# over them; built only when nvcc is found (HAVE_CUDA in the Makefile).
GPU_CU_SRCS := worker/gpu/gpu_kernels.cu worker/gpu/gpu_zero.cu
GPU_SRCS := worker/gpu/gpu_train.c
