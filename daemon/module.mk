# musterd: rendezvous state machine, control server, REST, state file.
# DAEMON_SRCS are linked into the unit-test runner too; mains are not.
DAEMON_SRCS := daemon/snapshot.c daemon/musterd_config.c daemon/rdv.c daemon/rdv_join.c daemon/rdv_form.c daemon/rdv_beat.c daemon/rdv_fail.c daemon/rdv_grow.c daemon/rdv_hang.c daemon/rdv_resume.c daemon/rdv_status.c daemon/hang.c daemon/state.c daemon/persist.c daemon/server.c daemon/coalesce.c daemon/http.c daemon/http_guard.c daemon/http_host.c daemon/restdoc.c daemon/view_build.c daemon/history.c daemon/metrics.c daemon/dashboard.c daemon/logfetch.c daemon/failure.c daemon/fitness.c daemon/plan_http.c daemon/etcd_codec.c daemon/leader.c daemon/store_etcd.c daemon/rdv_flight.c daemon/rdv_memrep.c
DAEMON_MAIN := daemon/musterd.c
