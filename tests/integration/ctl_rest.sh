#!/bin/sh
# The REST API and musterctl against a real musterd with two agents on
# loopback: status, nodes, ranks and events tables, /metrics, the admin
# token (missing, wrong, right), drain of an unknown node, stop, `watch`
# ending with the job, and a second musterd on the same REST port.
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "ctltest", "nodes": 2, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 1500,
 "lease_ms": 3000, "stop_grace_ms": 1000}
JSON
M="$BUILD/musterctl"
"$M" token new "$ITEST_DIR/admin" || fail "musterctl token new"
make_token "$ITEST_DIR/wrong"
make_token "$ITEST_DIR/cluster"
start_daemon "$ITEST_DIR/job.json" --admin-token-file "$ITEST_DIR/admin" --token-file "$ITEST_DIR/cluster"
S="--server http://127.0.0.1:$HTTP"

"$M" $S status > "$ITEST_DIR/out" || fail "status of a waiting job"
grep -q "job ctltest: waiting" "$ITEST_DIR/out" || fail "status: $(cat "$ITEST_DIR/out")"

start_agent a 1 --token-file "$ITEST_DIR/cluster" --rank-cmd "$BUILD/tests/fake-rank --step-ms 50"
start_agent b 1 --token-file "$ITEST_DIR/cluster" --rank-cmd "$BUILD/tests/fake-rank --step-ms 50"
wait_for 20 'd["state"] == "running" and running == 2' || fail "job not running"

"$M" $S status > "$ITEST_DIR/out" || fail "status"
grep -q "job ctltest: running" "$ITEST_DIR/out" || fail "status: $(cat "$ITEST_DIR/out")"
grep -Eq "^NODE +STATE +HEALTH +ADDRESS" "$ITEST_DIR/out" || fail "no nodes table: $(cat "$ITEST_DIR/out")"
grep -Eq "^ +1 +b +0 +0 +running" "$ITEST_DIR/out" || fail "no rank 1 row: $(cat "$ITEST_DIR/out")"
"$M" $S nodes | grep -Eq "^a +joined" || fail "nodes table lacks node a"
"$M" $S ranks --json | python3 -c 'import json,sys; d=json.load(sys.stdin); assert len(d["ranks"]) == 2' \
    || fail "ranks --json"
"$M" $S events | grep -q "daemon_started" || fail "events lack daemon_started"

curl -sf "http://127.0.0.1:$HTTP/metrics?ranks=1" > "$ITEST_DIR/metrics" || fail "GET /metrics?ranks=1"
grep -qx 'muster_job_state{state="running"} 1' "$ITEST_DIR/metrics" || fail "metrics: job state"
grep -q '^muster_rank_step{rank="1",node="b"} ' "$ITEST_DIR/metrics" || fail "metrics: rank 1"
curl -sf "http://127.0.0.1:$HTTP/metrics" > "$ITEST_DIR/metrics" || fail "GET /metrics"
grep -qx 'muster_node_up{node="b"} 1' "$ITEST_DIR/metrics" || fail "metrics: node b up"
if grep -q '^muster_rank_' "$ITEST_DIR/metrics"; then fail "per-rank series without ?ranks=1"; fi

# Lists: filters and pages through musterctl; a bad filter names itself.
"$M" $S ranks --state running --limit 1 --offset 1 > "$ITEST_DIR/out" || fail "ranks --state --limit"
grep -Eq "^ +1 +b +0 +0 +running" "$ITEST_DIR/out" && grep -q "(1 of 2 ranks shown" "$ITEST_DIR/out" \
    || fail "ranks page: $(cat "$ITEST_DIR/out")"
"$M" $S nodes --health ok --order health --json | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert [n["name"] for n in d["nodes"]] == ["a", "b"] and d["matched"] == 2, d' || fail "nodes --health ok --json"
rc=0; "$M" $S ranks --state sleeping 2> "$ITEST_DIR/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "invalid query: state: expected" "$ITEST_DIR/err" || fail "bad state: rc $rc, $(cat "$ITEST_DIR/err")"
rc=0; "$M" $S status --limit 3 2> "$ITEST_DIR/err" || rc=$?
[ "$rc" -eq 2 ] || fail "status --limit: rc $rc"
# The run's history fills in while the ranks step (one sample a second).
i=0; while [ $i -lt 50 ]; do
    curl -sf "http://127.0.0.1:$HTTP/v1/history" | python3 -c '
import json, sys
h = json.load(sys.stdin)
sys.exit(0 if len(h["step"]) >= 2 and h["step"] == sorted(h["step"]) and len(h["loss"]) == len(h["step"]) else 1)' && break
    sleep 0.1; i=$((i + 1))
done
[ $i -lt 50 ] || fail "/v1/history: $(curl -s "http://127.0.0.1:$HTTP/v1/history")"
curl -s "http://127.0.0.1:$HTTP/" | grep -q "<svg id=\"chart\"" || fail "dashboard"

# Admin: no token is a usage error, a wrong one is refused, the job goes on.
if env -u MUSTER_ADMIN_TOKEN "$M" $S stop 2> "$ITEST_DIR/err"; then fail "stop without a token"; fi
rc=0; "$M" $S --admin-token-file "$ITEST_DIR/wrong" stop 2> "$ITEST_DIR/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "unauthorized" "$ITEST_DIR/err" || fail "wrong token: rc $rc, $(cat "$ITEST_DIR/err")"
rc=0; "$M" $S --admin-token-file "$ITEST_DIR/admin" drain nosuch 2> "$ITEST_DIR/err" || rc=$?
[ "$rc" -eq 1 ] && grep -q "no such node" "$ITEST_DIR/err" || fail "drain nosuch: rc $rc, $(cat "$ITEST_DIR/err")"
check 'd["state"] == "running"' || fail "refused admin requests disturbed the job"

# Second musterd on the same REST port: refused, with the port named.
rc=0
"$BUILD/musterd" --job "$ITEST_DIR/job.json" --listen "127.0.0.1:$(free_port)" \
    --http "127.0.0.1:$HTTP" --state-dir "$ITEST_DIR/state2" --token-file "$ITEST_DIR/cluster" \
    > "$ITEST_DIR/second.out" 2>&1 || rc=$?
[ "$rc" -ne 0 ] && grep -q "127.0.0.1:$HTTP is already in use" "$ITEST_DIR/second.out" \
    || fail "second musterd: rc $rc, $(cat "$ITEST_DIR/second.out")"

# watch into a file prints lines and ends (exit 0) when the job is stopped.
timeout 20 "$M" $S watch > "$ITEST_DIR/watch.out" 2>&1 &
WATCH=$!
sleep 1
MUSTER_ADMIN_TOKEN=$(cat "$ITEST_DIR/admin") "$M" $S stop | grep -q "accepted: stop" || fail "stop"
wait_for 10 'd["state"] == "stopped"' || fail "job not stopped"
rc=0; wait "$WATCH" || rc=$?
[ "$rc" -eq 0 ] || fail "watch exited $rc: $(cat "$ITEST_DIR/watch.out")"
grep -q "state=running" "$ITEST_DIR/watch.out" && grep -q "state=stopped" "$ITEST_DIR/watch.out" \
    || fail "watch output: $(cat "$ITEST_DIR/watch.out")"
echo "ctl_rest: ok"
