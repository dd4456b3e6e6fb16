#!/bin/sh
# The Python rank client (clients/python/muster_rank/) as a user's script
# runs it. First against rank-client-peer, which plays the agent's end of the
# control socket and decodes every frame with the real decoder: fields, the
# rate limit (the latest beat still arrives), commands, the unique id, a
# flood of ASSIGNs the client must keep reading, an agent that goes away,
# and no muster at all. Then under a real musterd and muster-worker: the
# step and loss reach /v1/status, and a script that stops stepping is found
# hung by progress_timeout_ms.
set -eu
. tests/itest-lib.sh

PY=${PYTHON:-python3}
CLIENT=clients/python
PEER="$BUILD/tests/rank-client-peer"
export PYTHONPATH="$PWD/$CLIENT"

# The package is meant for Python 3.9 and later; ast checks the grammar of 3.9.
$PY -c '
import ast, sys
for f in sys.argv[1:]:
    ast.parse(open(f).read(), f, feature_version=(3, 9))' "$CLIENT"/muster_rank/*.py "$CLIENT"/muster_rank/sharded/*.py \
    || fail "muster_rank is not Python 3.9 grammar"

cat > "$ITEST_DIR/rank.py" <<'PY'
import math, os, sys, time
import muster_rank

def say(what):  # stdout is the peer's
    print(what, file=sys.stderr)

def wait_until(cond, seconds=10):
    end = time.monotonic() + seconds
    while not cond() and time.monotonic() < end:
        time.sleep(0.01)
    return cond()

scenario = sys.argv[1]
rank = muster_rank.connect()
assert rank is muster_rank.connect()
assert "MUSTER_CTL_FD" not in os.environ

if scenario == "progress":
    assert rank.active and rank.rank == 0 and rank.generation == 7
    rank.beat(0, loss=float("nan"), tokens_per_s=float("inf"))
    time.sleep(0.3)
    rank.checkpoint_committed(1)
    rank.beat(1, loss=2.5, tokens_per_s=1234.5, comm_frac=0.25)
    time.sleep(0.3)
    start = time.monotonic()
    for step in range(2, 20001):  # 200 beats 5 ms apart, then as fast as can be
        rank.beat(step, loss=1.0 / step, tokens_per_s=100.0)
        if step < 202:
            time.sleep(0.005)
    say("beat_seconds=%.3f" % (time.monotonic() - start))
    assert wait_until(lambda: rank.stop_requested), "no stop"
    assert rank.checkpoint_requested() and not rank.checkpoint_requested()
    assert len(rank.assignment["job"]["pad"]) == 200000
    uid = bytes(range(128))
    assert rank.unique_id(uid, timeout=5) == uid
    rank.close()
    say("progress: ok")
elif scenario == "gone":
    for step in range(1, 101):
        rank.beat(step, loss=1.0, tokens_per_s=1.0)
        rank.checkpoint_committed(step)
        time.sleep(0.01)
    assert wait_until(lambda: rank.stop_requested), "agent gone but no stop"
    assert not rank.active and rank.unique_id(bytes(128), timeout=5) is None
    rank.beat(101)
    rank.close()
    say("gone: ok")
elif scenario == "alone":
    assert not rank.active and not rank.stop_requested
    for step in range(1000):
        rank.beat(step, loss=0.5)
    rank.checkpoint_committed(5)
    assert rank.unique_id(bytes(128), timeout=5) is None and not rank.checkpoint_requested()
    rank.close()
    say("alone: ok")
elif scenario == "train_then_hang":
    for step in range(1, 31):
        rank.beat(step, loss=1.0 / step, tokens_per_s=1000.0 * (rank.rank + 1))
        time.sleep(0.02)
    time.sleep(600)  # stuck: the daemon must notice and stop us
PY

# 1. Every field, the rate limit, commands, the unique id, an ASSIGN flood.
timeout 60 "$PEER" --generation 7 --stop-at-step 20000 --flood-mib 16 --timeout-ms 30000 \
    -- $PY "$ITEST_DIR/rank.py" progress > "$ITEST_DIR/progress.out" 2> "$ITEST_DIR/progress.log" \
    || fail "rank-client-peer failed: $(tail -n 3 "$ITEST_DIR/progress.out")"
out="$ITEST_DIR/progress.out"
grep -q '^exit status=0$' "$out" || fail "progress script failed: $(tail -n 5 "$ITEST_DIR/progress.log")"
grep -q '^progress: ok$' "$ITEST_DIR/progress.log" || fail "progress script did not finish"
grep -q '^flood done$' "$out" || fail "the client did not keep up with 16 MiB of ASSIGN"
grep -q "^muster_rank" "$ITEST_DIR/progress.log" && fail "the client complained: $(cat "$ITEST_DIR/progress.log")"
first='heartbeat generation=7 seq=1 rank=0 state=running step=0 loss=null tokens_per_s=0 comm_frac=0 checkpoint_step=0'
head -n 1 "$out" | grep -qx "$first" || fail "first heartbeat: $(head -n 1 "$out")"
second='heartbeat generation=7 seq=2 rank=0 state=running step=1 loss=2.5 tokens_per_s=1234.5 comm_frac=0.25'
grep -qx "$second checkpoint_step=1" "$out" || fail "no heartbeat with step 1 and every field"
grep -q '^heartbeat .* step=20000 loss=5.0000000000000002e-05 .* checkpoint_step=1$' "$out" \
    || fail "the last beat of the burst was not delivered"
# At most one frame per 0.1 s: the two before the loop, one per 0.1 s of it, and a margin.
beats=$(grep -c '^heartbeat ' "$out")
limit=$(sed -n 's/^beat_seconds=//p' "$ITEST_DIR/progress.log" | awk '{ printf "%d", $1 / 0.1 + 5 }')
[ "$beats" -le "$limit" ] || fail "$beats heartbeats for 20001 beats, more than one per 0.1 s (at most $limit)"
grep '^heartbeat ' "$out" | awk '{ split($3, s, "="); if (s[2] != NR) { print "seq " s[2] " at line " NR; exit 1 } }' \
    || fail "heartbeat seq does not count 1, 2, 3, ..."
grep -q '^sent stop$' "$out" || fail "the peer never sent stop"
grep -q "^unique_id generation=7 id=000102030405" "$out" || fail "no unique id from rank 0"
echo "progress: $beats heartbeats for 20001 beats (at most $limit), every field as sent"

# 2. The agent goes away: no exception, one line on stderr, stop_requested.
timeout 60 "$PEER" --generation 3 --rank 2 --close-after-beats 2 --timeout-ms 30000 \
    -- $PY "$ITEST_DIR/rank.py" gone > "$ITEST_DIR/gone.out" 2> "$ITEST_DIR/gone.log" \
    || fail "rank-client-peer failed: $(tail -n 3 "$ITEST_DIR/gone.out")"
grep -q '^exit status=0$' "$ITEST_DIR/gone.out" || fail "gone script failed: $(tail -n 5 "$ITEST_DIR/gone.log")"
n=$(grep -c '^muster_rank: ' "$ITEST_DIR/gone.log" || true)
[ "$n" -eq 1 ] || fail "expected one muster_rank line on stderr, got $n: $(cat "$ITEST_DIR/gone.log")"
grep -q 'heartbeat generation=3 seq=1 rank=2 ' "$ITEST_DIR/gone.out" || fail "rank 2 of generation 3 did not beat"
echo "gone: $(grep '^muster_rank: ' "$ITEST_DIR/gone.log")"

# 3. Not under muster: every call does nothing, silently.
(unset MUSTER_CTL_FD; timeout 30 $PY "$ITEST_DIR/rank.py" alone > "$ITEST_DIR/alone.out" 2> "$ITEST_DIR/alone.log") \
    || fail "script without muster failed: $(cat "$ITEST_DIR/alone.log")"
[ "$(cat "$ITEST_DIR/alone.log")" = "alone: ok" ] || fail "script without muster said more: $(cat "$ITEST_DIR/alone.log")"
echo "alone: ok"

# 4. Under musterd and muster-worker: progress in /v1/status, then a hang found.
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "pyrank", "nodes": 1, "max_restarts": 0, "heartbeat_interval_ms": 100,
 "heartbeat_timeout_ms": 2000, "stop_grace_ms": 500, "progress_timeout_ms": 1500}
JSON
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$PY $ITEST_DIR/rank.py train_then_hang"
wait_for 20 'd["generation"] == 1 and all(r["step"] == 30 for r in d["ranks"])' \
    || { show_status; fail "python ranks did not report step 30"; }
check 'all(r["loss"] == 1 / 30 for r in d["ranks"]) and [r["tokens_per_s"] for r in d["ranks"]] == [1000, 2000]' \
    || { show_status; fail "status does not carry the ranks' loss and throughput"; }
echo "status: both python ranks at step 30 with their loss and throughput"
wait_event 10 'rank_hung' || { show_status; fail "a python rank that stopped stepping was not found hung"; }
wait_for 10 'd["state"] == "failed"' || { show_status; fail "job not failed after the hang (max_restarts 0)"; }
hung=$(curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | grep -o 'rank [0-9]* on node a is hung[^"]*' | head -n 1)
echo "hang: $hung"
echo "rank_client_py: ok"
