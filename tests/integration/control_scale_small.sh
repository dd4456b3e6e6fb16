#!/bin/sh
# The load generator of `make bench` (tests/sim-agents.c), run small: 64
# simulated agents x 8 ranks join with the real handshake, generation 1
# runs, 2 s of 1 Hz heartbeats, one rank's exit -> generation 2 runs. The
# figures are printed; the bounds are loose (a loaded CI machine), the point
# is that the whole path works.
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<'JSON'
{"name": "scale-small", "nodes": 64, "max_restarts": 2, "heartbeat_interval_ms": 1000, "batch": 512}
JSON
make_token "$ITEST_DIR/token"
# the simulated agents share one address: no per-address limit of unauthenticated connections
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token" --preauth-per-address 100000
out=$(timeout 60 "$BUILD/tests/sim-agents" --daemon "127.0.0.1:$CTL" --http "$HTTP" --token-file "$ITEST_DIR/token" \
    --agents 64 --ranks 8 --pid "$DAEMON_PID" --steady-s 2 --rank-exit --timeout-s 20) ||
    fail "sim-agents: $out"
echo "$out"
form=$(echo "$out" | sed -n 's/^form_ms=//p')
rec=$(echo "$out" | sed -n 's/^recovery_ms=//p')
[ "$form" -lt 10000 ] || fail "64 x 8 formed in $form ms"
[ "$rec" -lt 5000 ] || fail "recovery took $rec ms"
# The agents are gone now (their nodes lost); the events keep what happened.
wait_event 5 "generation 2 running: 512 ranks on 64 nodes" || fail "no event says generation 2 ran with 512 ranks"
echo "control_scale_small: ok"
