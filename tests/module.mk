# Check suites (one runner) and test tools (small programs used by scripts).
CHECK_SRCS := tests/check_main.c tests/check_jobspec.c tests/check_rdv.c tests/check_notify.c tests/check_rank.c tests/check_http.c tests/check_logfetch.c tests/check_proto.c tests/check_agent.c tests/check_model.c tests/check_train.c tests/check_comm.c tests/check_conf.c tests/check_token.c tests/check_batch.c tests/check_zero.c tests/check_ckpt.c tests/check_rank_client.c tests/check_plan.c tests/check_preflight.c
TEST_TOOLS := jobspec-doc fake-rank comm-bench zero-bench rank-client-peer sim-agents
