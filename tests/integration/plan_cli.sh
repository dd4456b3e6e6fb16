#!/bin/sh
# musterctl plan and doctor, and GET /v1/plan of a running job: two agents x
# one muster-train rank (tiny model, ring on loopback). The bytes each rank
# reports sending per step must equal the plan's prediction exactly; bad
# input to plan (unknown preset, zero nodes, absurd bandwidth, a bad query)
# gets a clear error and exit status 2 (400 over REST).
set -eu
. tests/itest-lib.sh

make_token "$ITEST_DIR/token"
python3 -c '
import random, sys
random.seed(5)
sys.stdout.write("".join(random.choice("abcdefgh \n") for _ in range(40000)))' > "$ITEST_DIR/data.txt"
cat > "$ITEST_DIR/job.json" <<JSON
{"name": "plan", "nodes": 2, "model": "tiny", "data": "$ITEST_DIR/data.txt", "steps": 100000, "batch": 8,
 "micro_batch": 2, "eval_every": 0, "heartbeat_interval_ms": 200, "checkpoint_dir": "$ITEST_DIR/ck"}
JSON
CTLBIN="$BUILD/musterctl"

# bad input to plan
expect_usage() { # WHAT PATTERN ARGS...
    what=$1; pat=$2; shift 2
    set +e
    out=$("$CTLBIN" plan "$@" 2>&1); rc=$?
    set -e
    [ $rc -eq 2 ] || fail "plan $what: exit status $rc, expected 2 ($out)"
    echo "$out" | grep -q "$pat" || fail "plan $what: message does not say '$pat': $out"
    echo "plan $what: $(echo "$out" | head -n 1)"
}
expect_usage "unknown preset" "not a model preset (expected a job spec file or one of tiny, small, gpt2-124m)" gpt5
expect_usage "zero nodes" "nodes: expected 1 to 4096, got '0'" tiny --nodes 0
expect_usage "absurd bandwidth" "network: expected Gbit/s" tiny --network 1e9
expect_usage "negative memory" "device-memory" tiny --device-memory -1
echo '{"name": "x", "model": "gpt5"}' > "$ITEST_DIR/bad.json"
expect_usage "job with an unknown preset" 'unknown preset "gpt5"' "$ITEST_DIR/bad.json"
expect_usage "batch that does not divide" "batch" tiny --nodes 3 --batch 16

# a plan that does not fit exits 1 and says so; --json is one object
set +e
out=$("$CTLBIN" plan gpt2-124m --device gpu --device-memory 1 2>&1); rc=$?
set -e
[ $rc -eq 1 ] && echo "$out" | grep -q "DOES NOT FIT" || fail "gpt2-124m on 1 GiB: expected DOES NOT FIT and exit 1 ($rc)"
"$CTLBIN" plan gpt2-124m --nodes 2 --devices-per-node 8 --device gpu --device-memory 80 --network 1 --batch 64 --json \
    | python3 -c '
import json, sys
p = json.load(sys.stdin)
assert p["world"] == 16 and p["memory"]["fits"] is True and p["comm"]["sent_per_step"] > 0, p
print("plan gpt2-124m 2x8 H100 at 1 Gbit/s: %.0f MB sent per step per rank, comm %.0f %%" % (p["comm"]["sent_per_step"] / 1e6, 100 * p["comm"]["comm_frac"]))'

# the running job
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
RANK_CMD="$BUILD/muster-train --threads 1"
start_agent a 1 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
start_agent b 1 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 60 'running == 2 and d["measured"]["sent_per_step"] is not None and d["measured"]["peak_mem"] is not None' \
    || fail "ranks did not report bytes per step and peak memory within 60 s"
check 'all(n["fit"] == "fit" and n["host_mem_mb"] > 0 for n in d["nodes"])' || fail "nodes not fit, or no host memory"
curl -sf "http://127.0.0.1:$HTTP/v1/plan" | python3 -c '
import json, sys
d = json.load(sys.stdin)
p, m = d["plan"], d["measured"]
assert p["world"] == 2 and p["device"] == "cpu" and p["memory"]["device_memory"] > 0, p
assert isinstance(d["time_ms"], int), d
print("GET /v1/plan: predicted %d B sent per step, measured %d B" % (p["comm"]["sent_per_step"], m["sent_per_step"]))
assert m["sent_per_step"] == p["comm"]["sent_per_step"], "measured bytes per step differ from the plan"
' || fail "GET /v1/plan: bytes per step measured by the ranks differ from the plan"
curl -sf "http://127.0.0.1:$HTTP/v1/plan?network_gbit=0.001" | python3 -c '
import json, sys
p = json.load(sys.stdin)["plan"]
assert p["comm"]["network_gbit"] == 0.001 and p["comm"]["comm_frac"] > 0.5, p["comm"]' \
    || fail "GET /v1/plan?network_gbit=0.001 did not plan at 1 Mbit/s"
code=$(curl -s -o "$ITEST_DIR/bad.out" -w '%{http_code}' "http://127.0.0.1:$HTTP/v1/plan?network_gbit=fast")
[ "$code" = 400 ] && grep -q "network_gbit: expected" "$ITEST_DIR/bad.out" || fail "bad network_gbit: HTTP $code"
"$CTLBIN" --server "http://127.0.0.1:$HTTP" plan | grep -q "predicted beside measured" || fail "musterctl plan of the running job"
"$CTLBIN" --server "http://127.0.0.1:$HTTP" status | grep -q "plan vs measured" || fail "status shows no plan vs measured"

# doctor: everything passes here, the token file's mode included; a loose mode fails it
"$CTLBIN" doctor --server "http://127.0.0.1:$HTTP" --job "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token" \
    > "$ITEST_DIR/doctor.out" || { cat "$ITEST_DIR/doctor.out"; fail "doctor found a failure on a healthy node"; }
grep -q "^musterd  *ok" "$ITEST_DIR/doctor.out" && grep -q "^data  *ok" "$ITEST_DIR/doctor.out" \
    && grep -q "^checkpoint_dir  *ok" "$ITEST_DIR/doctor.out" || { cat "$ITEST_DIR/doctor.out"; fail "doctor table"; }
cp "$ITEST_DIR/token" "$ITEST_DIR/loose"; chmod 0644 "$ITEST_DIR/loose"
set +e
"$CTLBIN" doctor --server "http://127.0.0.1:$HTTP" --token-file "$ITEST_DIR/loose" > "$ITEST_DIR/doctor2.out"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q "^token file  *FAIL.*chmod 600" "$ITEST_DIR/doctor2.out" \
    || { cat "$ITEST_DIR/doctor2.out"; fail "doctor: a token file of mode 0644 must fail with what to do"; }
echo "plan_cli: ok"
