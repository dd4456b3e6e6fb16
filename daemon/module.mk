# musterd: rendezvous state machine, control server, REST, state file.
# DAEMON_SRCS are linked into the unit-test runner too; mains are not.
DAEMON_SRCS := daemon/snapshot.c
DAEMON_MAIN := daemon/musterd.c
CTL_SRCS := daemon/musterctl.c
