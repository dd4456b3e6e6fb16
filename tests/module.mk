# Check suites (one runner) and test tools (small programs used by scripts).
CHECK_SRCS := tests/check_main.c tests/check_jobspec.c
TEST_TOOLS := jobspec-doc
