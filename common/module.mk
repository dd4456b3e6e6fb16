# Shared by all programs: logging, the job spec table, systemd notify, token
# files, batch splitting, the service config table, a name-to-value hash,
# growable text.
COMMON_SRCS := common/cmdline.c common/gptcfg.c common/gptlayout.c common/zeroshard.c common/plan.c common/plan_prog.c common/plan_names.c common/preflight.c common/preflight_python.c common/mkdirs.c common/log.c common/ratelimit.c common/namemap.c common/sbuf.c common/hostport.c common/jobspec.c common/notify.c common/token.c common/batch.c common/conf.c common/jsonkind.c common/flight.c common/memtags.c
