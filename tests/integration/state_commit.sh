#!/bin/sh
# The state file under group commit (daemon/persist.h):
#  - 256 simulated agents joining at once cost a handful of state writes
#    (musterd logs each one at debug level; each is 2 fsyncs), not 2 per join;
#  - a daemon SIGKILLed the moment an agent receives ASSIGN comes back with
#    that generation: 4 rounds of (restart, the agent rejoins with its ranks,
#    its rank exits, ASSIGN of the next generation arrives, SIGKILL at once),
#    each checked against the state file on disk.
# itest: solo
set -eu
. tests/itest-lib.sh
make_token "$ITEST_DIR/token"

# ---- writes while 256 agents join
cat > "$ITEST_DIR/many.json" <<'JSON'
{"name": "commit-many", "nodes": 256, "heartbeat_interval_ms": 1000, "batch": 256}
JSON
# the simulated agents share one address: no per-address limit of unauthenticated connections
start_daemon "$ITEST_DIR/many.json" --token-file "$ITEST_DIR/token" --log-level debug --preauth-per-address 100000
timeout 60 "$BUILD/tests/sim-agents" --daemon "127.0.0.1:$CTL" --http "$HTTP" --token-file "$ITEST_DIR/token" \
    --agents 256 --ranks 1 --steady-s 3 --timeout-s 30 > "$ITEST_DIR/sim.out" 2>&1 &
SIM=$!
ITEST_PIDS="$ITEST_PIDS $SIM"
wait_for 30 'd["state"] == "running" and d["generation"] == 1' || fail "256 agents did not form generation 1"
sleep 0.5 # the running generation's write lands
writes=$(grep -c 'state file written' "$ITEST_DIR/musterd.log" || true)
echo "256 agents joined, generation 1 running: $writes state writes"
[ "$writes" -ge 2 ] || fail "expected the formed and the running generation written, got $writes writes"
[ "$writes" -le 8 ] || fail "256 joins cost $writes state writes (expected at most 8)"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(d["generation"] != 1 or d["state"] != "running" or len(d["members"]) != 256)' \
    "$ITEST_DIR/state/musterd.state.json" || fail "state file does not hold the running generation 1 with 256 members"
wait "$SIM" || fail "sim-agents: $(tail -n 3 "$ITEST_DIR/sim.out")"
kill -TERM "$DAEMON_PID"; wait "$DAEMON_PID" || fail "musterd exited non-zero"

# ---- SIGKILL right after ASSIGN
cat > "$ITEST_DIR/peer.py" <<'PY'
import os, signal, sys
sys.path.insert(0, os.path.abspath("tests"))
import muster_wire as w

port, token_path, daemon_pid, gen = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
token = open(token_path, "rb").read().rstrip(b"\n")

link, _ = w.join(port, token, "n", generation=gen, free_port=29999)
link.sock.settimeout(10)
send = lambda s, t, obj: link.send(t, obj)
recv = lambda s: link.recv()
s = None
def run_then_fail():
    send(s, "HEARTBEAT", {"generation": gen, "seq": 1, "free_port": 29999, "ranks": [
        {"rank": 0, "state": "running", "step": 1, "loss": 2.0, "tokens_per_s": 1.0, "comm_frac": 0.0}]})
    send(s, "RANK_EXIT", {"generation": gen, "rank": 0, "exit_code": 1, "signal": 0})

# Back with its rank running in generation gen: a daemon restored from a running
# job resumes it; one restored during recovery assigns gen again first.
if gen:
    run_then_fail()
while True:
    t, m = recv(s)
    if t == "ASSIGN" and m["generation"] > gen:
        os.kill(daemon_pid, signal.SIGKILL)
        print(m["generation"])
        break
    if t == "ASSIGN":
        run_then_fail()
PY

state_gen() {
    python3 -c 'import json,sys; print(json.load(open(sys.argv[1]))["generation"])' "$ITEST_DIR/state/musterd.state.json"
}

echo '{"name": "commit-kill", "nodes": 1, "max_restarts": 10, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000}' \
    > "$ITEST_DIR/kill.json"
rm -rf "$ITEST_DIR/state"
gen=0
round=0
while [ $round -lt 4 ]; do
    start_daemon "$ITEST_DIR/kill.json" --token-file "$ITEST_DIR/token"
    got=$(timeout 20 python3 "$ITEST_DIR/peer.py" "$CTL" "$ITEST_DIR/token" "$DAEMON_PID" "$gen") ||
        fail "round $round: the peer got no ASSIGN"
    wait "$DAEMON_PID" 2>/dev/null || true
    [ "$got" -eq $((gen + 1)) ] || fail "round $round: ASSIGN of generation $got, expected $((gen + 1))"
    on_disk=$(state_gen)
    [ "$on_disk" -eq "$got" ] || fail "round $round: killed after ASSIGN of generation $got, state file holds $on_disk"
    echo "round $round: SIGKILL right after ASSIGN of generation $got; the state file holds generation $on_disk"
    gen=$got
    round=$((round + 1))
done
# The last restart comes back in the generation the agent was told about.
start_daemon "$ITEST_DIR/kill.json" --token-file "$ITEST_DIR/token"
check "d['generation'] == $gen" || fail "restarted musterd is not in generation $gen"
echo "state commit: ok"
