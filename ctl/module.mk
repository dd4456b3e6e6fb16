# musterctl: the REST client (argument parsing, HTTP, rendering, plan, doctor).
# It talks to musterd only over the REST API; nothing here links into musterd.
CTL_SRCS := ctl/musterctl.c ctl/ctl_http.c ctl/ctl_render.c ctl/ctl_args.c ctl/ctl_plan.c ctl/ctl_plan_prog.c ctl/ctl_doctor.c
