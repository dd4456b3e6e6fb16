#!/bin/sh
# A hung NCCL job named by NCCL's RAS service (issue 32, item 4), end to end
# through the agents, against a stand-in that speaks RAS's client protocol
# (tests/fake-ras.py) with a recorded answer's shape: musterd + 2 agents x 2
# ranks (fake-rank) that all stop at step 40 at once, as NCCL ranks do when
# one of them never issues a collective (every process alive, no rank in a
# collective musterd can see). The answer, written once the ranks' PIDs are
# known, says rank 2 issued 99 AllReduce where the other three issued 100.
#  (a) the hang is named after rank 2, with RAS's words, host, PID and GPU;
#      /v1/stacks has rank 2's finding and no other rank's; the agents asked
#      RAS with CLIENT PROTOCOL, TIMEOUT, SET FORMAT json and STATUS;
#  (b) RAS of an NCCL before 2.28.7 (no JSON): nothing concluded from it, the
#      agent's log says why, the hang named as without RAS;
#  (c) nothing listening at the RAS address (a CPU job): not a word of RAS.
set -eu
. tests/itest-lib.sh

make_token "$ITEST_DIR/token"
RAS_PORT=$(free_port)
DOC="$ITEST_DIR/ras.json"
echo '{"communicators": []}' > "$DOC"

start_ras() { # start_ras [--text-only]
    python3 tests/fake-ras.py "$RAS_PORT" "$DOC" "$@" 2>> "$ITEST_DIR/ras.log" &
    RAS_PID=$!
    ITEST_PIDS="$ITEST_PIDS $RAS_PID"
    _i=0
    until python3 -c "import socket; socket.create_connection(('127.0.0.1', $RAS_PORT), timeout=1).close()" 2>/dev/null ||
        [ $_i -ge 50 ]; do sleep 0.1; _i=$((_i + 1)); done
}

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "ras", "nodes": 2, "max_restarts": 0, "heartbeat_interval_ms": 200, "progress_timeout_ms": 3000,
 "stop_grace_ms": 500, "rank_cmd": ["$BUILD/tests/fake-rank", "--step-ms", "50", "--hang-at-step", "40", "--hang-all"]}
JSON

# run_case: the job to its hang; MSG = the rank_hung event's message.
run_case() {
    rm -rf "$ITEST_DIR"/pids-*
    export NCCL_RAS_ADDR="127.0.0.1:$RAS_PORT"
    start_pair_job "$ITEST_DIR/job.json"
    unset NCCL_RAS_ADDR
    _i=0
    while [ "$(ls "$ITEST_DIR"/pids-a "$ITEST_DIR"/pids-b 2>/dev/null | grep -c 'rank-.*pid')" -lt 4 ] && [ $_i -lt 300 ]; do
        sleep 0.1; _i=$((_i + 1))
    done
    [ $_i -lt 300 ] || fail "the 4 ranks did not start within 30 s"
    P0=$(cat "$ITEST_DIR/pids-a/rank-0.pid"); P1=$(cat "$ITEST_DIR/pids-a/rank-1.pid")
    P2=$(cat "$ITEST_DIR/pids-b/rank-2.pid"); P3=$(cat "$ITEST_DIR/pids-b/rank-3.pid")
    # RAS's answer for the job: one communicator of 4, rank 2 one AllReduce behind
    python3 - "$DOC" "$P0" "$P1" "$P2" "$P3" <<'PY'
import json, sys
pids = [int(p) for p in sys.argv[2:]]
ranks = [{"rank": i, "host": "127.0.0.1", "pid": p, "cuda_dev": i % 2, "nvml_dev": i % 2,
          "status": {"init_state": 0, "async_error": 0, "finalize_called": False, "destroy_flag": False,
                     "abort_flag": False},
          "collective_counts": {"Broadcast": 2, "Reduce": 0, "AllGather": 1, "ReduceScatter": 0,
                                "AllReduce": 99 if i == 2 else 100}} for i, p in enumerate(pids)]
doc = {"nccl_version": "2.28.9+cuda13.0", "cuda_runtime_version": 13000, "cuda_driver_version": 13000,
       "timestamp": "2026-12-02 00:00:00", "communicators_count": 1,
       "communicators": [{"hash": "0x7e57c0ffee", "secondary_hash": "0x1:0x2", "size": 4, "ranks_count": 4,
                          "missing_ranks_count": 0, "ranks": ranks, "missing_ranks": []}],
       "ras": {"collection_time_sec": 0.004, "timeouts_count": 0}}
open(sys.argv[1], "w").write(json.dumps(doc, indent=2) + "\n")
PY
    wait_event_matching 40 'e["kind"] == "rank_hung" and e["generation"] == 1' || fail "no hang named within 40 s"
    MSG=$(event_matching 'e["kind"] == "rank_hung" and e["generation"] == 1' | python3 -c 'import json, sys; print(json.loads(sys.stdin.readline())["message"])')
    curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/stacks" > "$ITEST_DIR/stacks.json" || fail "GET /v1/stacks"
    end_pair_job
}

# ---- (a) RAS answers in JSON
start_ras
run_case
want="rank 2 on node b is hung: NCCL RAS: rank 2 of NCCL communicator 0x7e57c0ffee (4 ranks; host 127.0.0.1, pid $P2, GPU 0) has issued 99 AllReduce where 3 rank(s) have issued 100: it is behind, its peers wait for it"
[ "$MSG" = "$want" ] || fail "(a) the hang's message:
  got:  $MSG
  want: $want"
python3 - "$ITEST_DIR/stacks.json" <<'PY' || fail "(a) GET /v1/stacks: $(cat "$ITEST_DIR/stacks.json")"
import json, sys
d = json.load(open(sys.argv[1]))
ras = {r["rank"]: r["ras"] for r in d["ranks"]}
assert ras[2] and "has issued 99 AllReduce" in ras[2], ras
assert all(ras[i] is None for i in (0, 1, 3)), ras
assert "rank 2 (node b): NCCL RAS: rank 2 of NCCL communicator" in d["summary"], d["summary"]
PY
grep -q "query .*: CLIENT PROTOCOL 2 | TIMEOUT 1 | SET FORMAT json | STATUS" "$ITEST_DIR/ras.log" ||
    fail "(a) the agents did not ask RAS as its protocol says: $(cat "$ITEST_DIR/ras.log")"
grep -q "NCCL RAS: 1 finding(s)" "$ITEST_DIR/agent-b.log" || fail "(a) agent b did not read RAS's finding"
echo "(a) named by RAS: $MSG"
kill "$RAS_PID" 2>/dev/null || true
wait "$RAS_PID" 2>/dev/null || true

# ---- (b) an NCCL without RAS's JSON format
rm -f "$ITEST_DIR"/agent-*.log
start_ras --text-only
run_case
case "$MSG" in
*"NCCL RAS"*) fail "(b) a text-only RAS named the rank: $MSG" ;;
esac
grep -q "NCCL RAS: RAS has no JSON format (NCCL before 2.28.7)" "$ITEST_DIR/agent-a.log" ||
    fail "(b) the agent did not say why RAS was of no use"
echo "(b) text-only RAS: nothing concluded, the agent said why; named: $MSG"
kill "$RAS_PID" 2>/dev/null || true
wait "$RAS_PID" 2>/dev/null || true

# ---- (c) nothing at the RAS address
rm -f "$ITEST_DIR"/agent-*.log
run_case
if grep -q "RAS" "$ITEST_DIR/agent-a.log" "$ITEST_DIR/agent-b.log"; then
    fail "(c) with nothing at the RAS address the agents spoke of RAS: $(grep RAS "$ITEST_DIR"/agent-*.log)"
fi
case "$MSG" in
*"NCCL RAS"*) fail "(c) named by a RAS that is not there: $MSG" ;;
esac
echo "(c) no RAS: not a word of it; named: $MSG"
echo "hang_nccl_ras: ok"
