# muster-worker (the node agent) and muster-train (one rank).
AGENT_SRCS :=
AGENT_MAIN := worker/agent_main.c
TRAIN_SRCS :=
TRAIN_MAIN := worker/train_main.c
