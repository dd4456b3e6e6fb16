# Shared by all programs: logging, the job spec table.
COMMON_SRCS := common/log.c common/jobspec.c common/notify.c
