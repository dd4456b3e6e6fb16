#!/bin/sh
# Where the ranks are, over REST and musterctl, against a real musterd and
# an agent that speaks the raw protocol (below): its four ranks report
# where and waiting (rank 0 computes, ranks 1-2 wait in a collective, rank
# 3's process is stopped) and it answers COMMAND stacks with one STACKS per
# rank. Checks /v1/ranks and /v1/status (where, waiting, stopped, step_s,
# total_steps), POST /v1/stacks (no token, a job not running, accepted),
# GET /v1/stacks, and `musterctl stacks` with and without --full.
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "stackstest", "nodes": 1, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000,
 "progress_timeout_ms": 0}
JSON
M="$BUILD/musterctl"
make_token "$ITEST_DIR/admin"
make_token "$ITEST_DIR/cluster"
start_daemon "$ITEST_DIR/job.json" --admin-token-file "$ITEST_DIR/admin" --token-file "$ITEST_DIR/cluster"
S="--server http://127.0.0.1:$HTTP"
A="--admin-token-file $ITEST_DIR/admin"
URL="http://127.0.0.1:$HTTP/v1/stacks"

# ---- before any generation: nothing asked for, and nothing to ask
curl -sf "$URL" > "$ITEST_DIR/out" || fail "GET /v1/stacks of a waiting job"
python3 -c 'import json,sys; d=json.load(open(sys.argv[1])); sys.exit(not (d["set"] == 0 and d["generation"] is None and d["ranks"] == []))' \
    "$ITEST_DIR/out" || fail "GET /v1/stacks before any set: $(cat "$ITEST_DIR/out")"
code=$(curl -s -o "$ITEST_DIR/out" -w '%{http_code}' -X POST -H 'Content-Type: application/json' -H "Authorization: Bearer $(cat "$ITEST_DIR/admin")" "$URL")
[ "$code" = 409 ] && grep -q '"not running"' "$ITEST_DIR/out" || fail "POST /v1/stacks while waiting: $code $(cat "$ITEST_DIR/out")"
if "$M" $S $A stacks > "$ITEST_DIR/out" 2>&1; then fail "musterctl stacks of a waiting job succeeded"; fi
grep -q "not running" "$ITEST_DIR/out" || fail "musterctl stacks of a waiting job: $(cat "$ITEST_DIR/out")"

# ---- an agent of four ranks that says where they are and dumps their stacks
cat > "$ITEST_DIR/agent.py" <<'PY'
import os, select, sys, time
sys.path.insert(0, os.path.abspath("tests"))
import muster_wire as w

port, token_path = int(sys.argv[1]), sys.argv[2]
token = open(token_path, "rb").read().rstrip(b"\n")
WAIT = "all_reduce (distributed_c10d.py)"
PLACES = [("train.py:88 in compute_loss", None, False), ("distributed_c10d.py:2050 in all_reduce", WAIT, False),
          ("distributed_c10d.py:2050 in all_reduce", WAIT, False), ("distributed_c10d.py:2050 in all_reduce", WAIT, True)]
PID = 40000

link, _ = w.join(port, token, "n", devices=[0, 1, 2, 3], free_port=29999)
link.sock.settimeout(10)
s = link.sock
send = lambda s, t, obj: link.send(t, obj)
gen, seq, step, asked = 0, 0, 0, 0
next_beat = time.monotonic()
while True:
    if select.select([s], [], [], max(0.0, next_beat - time.monotonic()))[0]:
        try:
            got = link.poll()
        except EOFError:
            sys.exit("musterd closed the connection")
        for t, m in got:
            if t == "ASSIGN":
                gen = m["generation"]
            elif t == "COMMAND" and m["action"] == "stacks" and m["generation"] == gen:
                asked += 1
                print("stacks asked %d" % asked, flush=True)
                for r, (where, waiting, stopped) in enumerate(PLACES):
                    if stopped:
                        send(s, "STACKS", {"generation": gen, "rank": r, "pid": 0, "stopped": True, "text": "",
                                           "error": "its process is stopped (SIGSTOP or a debugger): it dumps when it continues"})
                    else:
                        send(s, "STACKS", {"generation": gen, "rank": r, "pid": PID + r,
                                           "text": "process %d:\nThread 0x1 (most recent call first):\n  File \"%s\", line %s in %s\n"
                                                   % (PID + r, where.split(":")[0], where.split(":")[1].split()[0], where.split()[-1])})
    if time.monotonic() >= next_beat:
        next_beat += 0.2
        seq += 1
        step += gen > 0
        ranks = []
        for r, (where, waiting, stopped) in enumerate(PLACES):
            e = {"rank": r, "state": "running", "step": step, "loss": 2.0, "tokens_per_s": 10.0, "comm_frac": 0.1,
                 "step_s": 0.5, "step_age_ms": 20, "total_steps": 1000, "where": where}
            if waiting:
                e["waiting"] = waiting
            if stopped:
                e["stopped"] = True
            ranks.append(e)
        send(s, "HEARTBEAT", {"generation": gen, "seq": seq, "free_port": 29999, "ranks": ranks if gen else []})
PY
timeout 60 python3 "$ITEST_DIR/agent.py" "$CTL" "$ITEST_DIR/cluster" > "$ITEST_DIR/agent-n.log" 2>&1 &
ITEST_PIDS="$ITEST_PIDS $!"
wait_for 20 'd["state"] == "running" and d["ranks"][1]["waiting"] == "all_reduce (distributed_c10d.py)"' ||
    fail "the job did not run with its ranks saying where they are"

# ---- /v1/ranks and /v1/status carry what the ranks said
check 'd["ranks"][0]["where"] == "train.py:88 in compute_loss" and d["ranks"][0]["waiting"] is None and not d["ranks"][0]["stopped"]' ||
    fail "rank 0's where: $(curl -s "http://127.0.0.1:$HTTP/v1/ranks")"
check 'd["ranks"][3]["stopped"] and not d["ranks"][1]["stopped"] and all(r["step_s"] == 0.5 and r["total_steps"] == 1000 and not r["hung"] for r in d["ranks"])' ||
    fail "ranks' stopped, step_s, total_steps: $(curl -s "http://127.0.0.1:$HTTP/v1/ranks")"
check 'd["steps"] == 1000 and d["step_s"] == 0.5' || fail "status steps and step_s: $(status)"
"$M" $S status > "$ITEST_DIR/out" || fail "musterctl status"
grep -Eq "^  step [0-9]+ of 1000 \(2 steps/s\)" "$ITEST_DIR/out" || fail "status step line: $(cat "$ITEST_DIR/out")"
grep -Eq "^ +1 +n +.* waiting in all_reduce \(distributed_c10d\.py\)$" "$ITEST_DIR/out" || fail "status: rank 1's where: $(cat "$ITEST_DIR/out")"
grep -Eq "^ +3 +n +.* stopped at distributed_c10d\.py:2050 in all_reduce$" "$ITEST_DIR/out" || fail "status: rank 3 stopped: $(cat "$ITEST_DIR/out")"

# ---- POST /v1/stacks needs the admin token
code=$(curl -s -o "$ITEST_DIR/out" -w '%{http_code}' -X POST "$URL")
[ "$code" = 401 ] || fail "POST /v1/stacks without a token: $code $(cat "$ITEST_DIR/out")"
code=$(curl -s -o /dev/null -w '%{http_code}' -X DELETE "$URL")
[ "$code" = 405 ] || fail "DELETE /v1/stacks: $code"
grep -q "stacks asked" "$ITEST_DIR/agent-n.log" && fail "stacks were asked for without a token"

# ---- musterctl stacks: one line per place
"$M" $S $A stacks > "$ITEST_DIR/out" || fail "musterctl stacks: $(cat "$ITEST_DIR/out")"
cat "$ITEST_DIR/out"
grep -Eq "^stacks of generation 1, asked for at .*: 4 of 4 ranks answered$" "$ITEST_DIR/out" || fail "stacks head line"
grep -qx "rank 0 (node n, pid 40000): train.py:88 in compute_loss" "$ITEST_DIR/out" || fail "stacks: rank 0's line"
grep -qx "ranks 1-2: waiting in all_reduce (distributed_c10d.py)" "$ITEST_DIR/out" || fail "stacks: the waiting ranks' line"
grep -qx "rank 3 (node n, stopped): distributed_c10d.py:2050 in all_reduce; no stack: its process is stopped (SIGSTOP or a debugger): it dumps when it continues" \
    "$ITEST_DIR/out" || fail "stacks: the stopped rank's line"
grep -q "process 40000:" "$ITEST_DIR/out" && fail "stacks without --full printed a stack"
grep -qx "stacks asked 1" "$ITEST_DIR/agent-n.log" || fail "the agent was not asked once: $(cat "$ITEST_DIR/agent-n.log")"

# ---- --full prints each rank's stack, or why there is none
"$M" $S $A stacks --full > "$ITEST_DIR/out" || fail "musterctl stacks --full"
grep -qx -- "--- rank 1 (node n, pid 40001) ---" "$ITEST_DIR/out" || fail "stacks --full: rank 1's head: $(cat "$ITEST_DIR/out")"
grep -qx "process 40001:" "$ITEST_DIR/out" || fail "stacks --full: rank 1's stack"
grep -qx '  File "train.py", line 88 in compute_loss' "$ITEST_DIR/out" || fail "stacks --full: rank 0's frame"
grep -qx -- "--- rank 3 (node n, stopped) ---" "$ITEST_DIR/out" || fail "stacks --full: rank 3's head"
grep -qx "no stack: its process is stopped (SIGSTOP or a debugger): it dumps when it continues" "$ITEST_DIR/out" ||
    fail "stacks --full: rank 3's reason"

# ---- GET /v1/stacks: the latest set, as JSON
curl -sf "$URL" > "$ITEST_DIR/out" || fail "GET /v1/stacks"
python3 - "$ITEST_DIR/out" <<'PY' || fail "GET /v1/stacks: $(cat "$ITEST_DIR/out")"
import json, sys
d = json.load(open(sys.argv[1]))
assert d["set"] == 2 and d["generation"] == 1 and d["answered"] == d["expected"] == 4, d
r = d["ranks"]
assert [x["rank"] for x in r] == [0, 1, 2, 3] and all(x["node"] == "n" and x["answered"] for x in r)
assert r[0]["pid"] == 40000 and r[0]["text"].startswith("process 40000:\n") and r[0]["error"] is None
assert r[1]["waiting"] == "all_reduce (distributed_c10d.py)" and r[0]["waiting"] is None
assert r[3]["stopped"] and r[3]["pid"] is None and r[3]["text"] is None and r[3]["error"].startswith("its process is stopped")
assert d["summary"].splitlines()[1] == "ranks 1-2: waiting in all_reduce (distributed_c10d.py)"
PY
"$M" $S $A --json stacks | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["set"] != 3 or d["answered"] != 4)' ||
    fail "musterctl --json stacks"
"$M" $S events | grep -q "stacks_requested" || fail "no stacks_requested event"
echo "ctl stacks: ok"
