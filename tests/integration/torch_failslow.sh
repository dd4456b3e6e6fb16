#!/bin/sh
# Fail-slow named without code changes (issue 36): an unmodified PyTorch DDP
# program (tests/torch/ddp_train.py, gloo, no muster client) as 2 agents x 2
# ranks, seen through muster's start-up hook, whose time split sampler
# (clients/python/muster_rank/split.py) reports how each rank's main thread
# spends its time. Every rank sleeps 50 ms a step in its own code; rank 3
# sleeps 40 % more from step 80 to step 160 (--slow-rank), and its peers wait
# for it in the backward pass's all-reduce.
#  (a) steps 1-80, all ranks alike: every rank reports a split, none is named;
#  (b) rank 3 slow: named (a rank_slow event, /v1/ranks, /v1/status's
#      slow_ranks, /metrics, musterctl status) within 60 steps of step 80,
#      with its evidence (its compute per step against its peers', the ratio
#      at least 1.2), and no other rank;
#  (c) alike again from step 160: a rank_slow_ended event for rank 3 within
#      60 steps, and still no other rank named.
set -eu
. tests/itest-lib.sh

need_torch torch_failslow torch.distributed
PY=$TORCH_PY
SCRIPT="$(pwd)/tests/torch/ddp_train.py"
make_token "$ITEST_DIR/token"

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "torch-failslow", "nodes": 2, "max_restarts": 0, "batch": 4, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 4000, "lease_ms": 8000, "stop_grace_ms": 500,
 "rank_cmd": ["$PY", "$SCRIPT", "--steps", "400", "--width", "16", "--batch", "8", "--step-sleep", "0.05",
              "--slow-rank", "3", "--slow-frac", "0.4", "--slow-from", "80", "--slow-to", "160",
              "--ckpt-dir", "$ITEST_DIR/ckpt", "--ckpt-every", "1000000"]}
JSON
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_agent a 2 --token-file "$ITEST_DIR/token"
start_agent b 2 --token-file "$ITEST_DIR/token"

# One poller for the three parts: /v1/ranks and /v1/events every 100 ms,
# until rank 3 is named and unnamed again (at most 150 s), noting the step
# of the slowest rank when each happened.
python3 - "$HTTP" "$BUILD/musterctl" > "$ITEST_DIR/verdict" 2>&1 <<'PY' || fail "$(cat "$ITEST_DIR/verdict")"
import json, subprocess, sys, time, urllib.request
base = "http://127.0.0.1:%s" % sys.argv[1]
get = lambda p: json.load(urllib.request.urlopen(base + p, timeout=2))
def events(kind):
    return [e for e in get("/v1/events")["events"] if e["kind"] == kind]
named = ended = None
split_seen = False
deadline = time.monotonic() + 150
for _ in range(1500):
    if time.monotonic() > deadline:
        break
    try:
        ranks = get("/v1/ranks")["ranks"]
        slow, over = events("rank_slow"), events("rank_slow_ended")
    except Exception:
        time.sleep(0.1)
        continue
    steps = [r["step"] for r in ranks if r["step"] is not None]
    step = min(steps) if len(steps) == 4 else 0
    if len(steps) == 4 and all(r["split"] for r in ranks):
        split_seen = True
    others = [e for e in slow if e["rank"] != 3]
    if others:
        sys.exit("a rank other than 3 was named slow: %s" % others[0]["message"])
    if slow and step < 80 and named is None:
        sys.exit("(a) named at step %d, before rank 3 was slow (step 80): %s" % (step, slow[0]["message"]))
    if slow and named is None:
        named = (step, slow[0]["message"], ranks)
        st = get("/v1/status")
        metrics = urllib.request.urlopen(base + "/metrics?ranks=1", timeout=2).read().decode()
        ctl = subprocess.run([sys.argv[2], "--server", base, "status"], capture_output=True, text=True, timeout=10).stdout
    if over and ended is None:
        ended = (step, over[0]["message"])
        break
    time.sleep(0.1)
if not split_seen:
    sys.exit("(a) the ranks never all reported a time split in /v1/ranks")
print("(a) steps 1-80 alike: every rank reported its split, none named: ok")
if named is None:
    sys.exit("(b) rank 3 was never named slow")
step, msg, ranks = named
if not msg.startswith("rank 3 on node b is slow: computes ") or " per step where its peers compute " not in msg:
    sys.exit("(b) the event does not name rank 3 with per-step evidence: %s" % msg)
ratio = float(msg.split("(")[1].split("x)")[0])
if not 1.2 <= ratio <= 2.0:
    sys.exit("(b) the evidence's ratio is %.2f, not near rank 3's 1.4: %s" % (ratio, msg))
if step - 80 > 60:
    sys.exit("(b) named at step %d, %d steps after rank 3 became slow (more than 60): %s" % (step, step - 80, msg))
by = {r["rank"]: r for r in ranks}
if not by[3]["slow"] or any(by[k]["slow"] for k in (0, 1, 2)):
    sys.exit("(b) /v1/ranks does not mark rank 3 alone slow: %s" % [(r["rank"], r["slow"]) for r in ranks])
if [x["rank"] for x in st["slow_ranks"]] != [3]:
    sys.exit("(b) /v1/status slow_ranks: %s" % st["slow_ranks"])
if "muster_slow_ranks 1" not in metrics or 'muster_rank_slow{rank="3",node="b"} 1' not in metrics:
    sys.exit("(b) /metrics does not say rank 3 is slow")
if "slow: rank 3 on node b is slow" not in ctl:
    sys.exit("(b) musterctl status does not say rank 3 is slow:\n%s" % ctl)
print("(b) rank 3 named at step %d (%d steps after it became slow): %s" % (step, step - 80, msg))
if ended is None:
    sys.exit("(c) rank 3 was never said to be no longer slow")
if not ended[1].startswith("rank 3 on node b is no longer slow") or ended[0] - 160 > 60:
    sys.exit("(c) the end came at step %d (rank 3 alike from 160): %s" % ended)
print("(c) rank 3 no longer slow at step %d: %s" % ended)
PY
cat "$ITEST_DIR/verdict"
stop_all
echo "torch_failslow: ok"
