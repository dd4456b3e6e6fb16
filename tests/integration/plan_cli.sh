#!/bin/sh
# musterctl plan and doctor, and GET /v1/plan of a running job: two agents x
# one muster-train rank (tiny model, ring on loopback). The bytes each rank
# reports sending per step must equal the plan's prediction exactly; bad
# input to plan (unknown preset, zero nodes, absurd bandwidth, a bad query)
# gets a clear error and exit status 2 (400 over REST).
# The plan of a program users bring: the guides' case (DDP, ~50M parameters,
# 2 nodes x 1 GPU over 1 Gbit/s, fp16, accumulation 8) comes out at ~201 MB
# moved per sync and ~20 % of a 4 s step; the etc/ presets fit or not by
# GPU memory; a rank_cmd job whose spec describes its program is planned
# against the step time its ranks measure. doctor checks --server's host
# and ports, and its --help names every flag.
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
    echo "$out" | grep -q -- "$pat" || fail "plan $what: message does not say '$pat': $out"
    echo "plan $what: $(echo "$out" | head -n 1)"
}
expect_usage "unknown preset" "not a model preset (expected a job spec file or one of tiny, small, gpt2-124m)" gpt5
expect_usage "zero nodes" "nodes: expected 1 to 4096, got '0'" tiny --nodes 0
expect_usage "absurd bandwidth" "network: expected Gbit/s" tiny --network 1e9
expect_usage "negative memory" "device-memory" tiny --device-memory -1
# memory that rounds to 0 bytes would be planned as unknown: refused
expect_usage "memory below a byte" "--device-memory: expected GiB from 0.001" tiny --device-memory 1e-10
expect_usage "a program's memory below a byte" "--device-memory: expected GiB from 0.001" \
    --parallelism ddp --params 50M --device-memory 1e-10
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

# the guides' case: 50.3M fp16 gradients = 100.6 MB; a ring all-reduce over N = 2 sends
# 2(N-1)/N x 100.6 MB and receives as much: 201.2 MB per GPU per sync, once per step;
# 100.6 MB at 1 Gbit/s = 0.80 s, 20 % of a 4 s step
GUIDE="--parallelism ddp --params 50.3M --nodes 2 --gpus-per-node 1 --network 1g --precision fp16 --accum 8 --micro-batch 4"
# shellcheck disable=SC2086
"$CTLBIN" plan $GUIDE --step-time 4 > "$ITEST_DIR/guide.out" || { cat "$ITEST_DIR/guide.out"; fail "plan of the guides' case"; }
grep -q "sent + received = 201.2 MB moved per GPU" "$ITEST_DIR/guide.out" \
    && grep -q "gradient syncs per optimizer step  *1  once per optimizer step" "$ITEST_DIR/guide.out" \
    && grep -q "communication fraction  *20.1 %" "$ITEST_DIR/guide.out" \
    || { cat "$ITEST_DIR/guide.out"; fail "the guides' case: expected 201.2 MB per sync, once per step, 20.1 %"; }
# shellcheck disable=SC2086
"$CTLBIN" plan $GUIDE --step-time 4 --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
c = p["comm"]
assert p["kind"] == "program" and p["world"] == 2 and p["accum"] == 8, p
assert 200e6 <= 2 * c["sync_sent"] <= 202e6 and c["syncs_per_step"] == 1, c
assert 0.19 <= c["comm_frac"] <= 0.21, c
print("plan, the guides case: %.1f MB moved per GPU per sync, %.3f s = %.1f %% of a 4 s step"
      % (2 * c["sync_sent"] / 1e6, c["comm_s"], 100 * c["comm_frac"]))' || fail "plan --json of the guides' case"
# ZeRO-3 gathers per micro-step: 8 micro-steps of 2 gathers and a reduce-scatter of 50.3 MB each
# shellcheck disable=SC2086
"$CTLBIN" plan $GUIDE --parallelism zero3 --step-time 4 --json | python3 -c '
import json, sys
c = json.load(sys.stdin)["comm"]
assert c["syncs_per_step"] == 8 and c["sent_per_step"] == 8 * 3 * 25150000 * 2, c' || fail "plan of the guides case as zero3"
# the presets by GPU memory: on a 16 GiB GPU as DDP in fp16, conservative fits, aggressive does not
for preset in conservative balanced aggressive; do
    set +e
    "$CTLBIN" plan "etc/$preset.json" --parallelism ddp --precision fp16 --device-memory 16 > "$ITEST_DIR/$preset.out"; rc=$?
    set -e
    echo "plan etc/$preset.json on 16 GiB: $(grep -E "predicted peak" "$ITEST_DIR/$preset.out" | awk '{print $3, $4}'), exit $rc"
    eval "rc_$preset=$rc"
done
# shellcheck disable=SC2154
[ "$rc_conservative" = 0 ] && grep -q "fits" "$ITEST_DIR/conservative.out" && [ "$rc_aggressive" = 1 ] \
    && grep -q "DOES NOT FIT" "$ITEST_DIR/aggressive.out" || fail "presets on 16 GiB: conservative must fit, aggressive not"
# bad input names the flag
expect_usage "unknown parallelism" "--parallelism: expected muster-train, ddp" --parallelism zero4 --params 1M
expect_usage "fp16 with muster-train" "--precision describes a program's plan" tiny --precision fp16
expect_usage "negative params" "--params: expected a parameter count" --parallelism ddp --params -50M
expect_usage "zero step time" "--step-time: expected seconds" --parallelism ddp --params 50M --step-time 0
expect_usage "unknown network" "--network: expected Gbit/s" --parallelism ddp --params 50M --network 3g
expect_usage "no parameter count" "params: give the parameter count" --parallelism zero2
# products of the flags past a job's batch are refused by name, not wrapped (1e6 x 65536 x 4096 > 2^31)
expect_usage "accumulation past a job's batch" "accum 1000000 x micro_batch 65536 x 4096 ranks = 268435456000000 sequences" \
    tiny --accum 1000000 --micro-batch 65536 --nodes 4096
expect_usage "a program's accumulation past a job's batch" "x 262144 ranks = 17179869184000000 sequences" \
    tiny --parallelism ddp --accum 1000000 --micro-batch 65536 --nodes 4096 --gpus-per-node 64
# --batch and --accum together must agree; the micro-batch is what they imply
expect_usage "batch against accum" "--batch 64 disagrees with --accum 3 x micro_batch 2 x 2 ranks = 12" \
    tiny --batch 64 --accum 3 --nodes 2 --micro-batch 2
expect_usage "a program's batch against accum" "--batch 64 does not split into 3 micro-steps over 2 ranks" \
    --parallelism ddp --params 50M --batch 64 --accum 3 --nodes 2
"$CTLBIN" plan --parallelism ddp --params 50M --batch 48 --accum 3 --nodes 2 --json | python3 -c '
import json, sys
p = json.load(sys.stdin)
assert p["micro_batch"] == 8 and p["accum"] == 3, p' || fail "--batch 48 --accum 3 on 2 ranks: expected micro_batch 8"
# a ZeRO-3 step of 10^15 parameters over 10^6 micro-steps cannot be counted in 64 bits: refused, never negative
expect_usage "traffic past 2^62 bytes" "move more than 2^62 bytes per step" \
    --parallelism zero3 --params 1e15 --nodes 2 --accum 1000000
# --params beside a shape that counts otherwise: the plan says which figure counts what
"$CTLBIN" plan --parallelism ddp --params 50M --layers 12 --d-model 768 --heads 12 --vocab 50257 \
    | grep -q "(params 50.00 M count the memory and traffic; the shape, 12 layers x d_model 768 x vocab 50257 = 124.44 M, the activations)" \
    || fail "plan with --params and a shape that disagree does not say so"
"$CTLBIN" plan --help | grep -q -- "--parallelism P" || fail "plan --help does not name --parallelism"
# doctor refuses a --server it cannot check, naming what is wrong (exit 2), as musterctl's own --server does
expect_doctor_usage() { # WHAT PATTERN ARGS...
    what=$1; pat=$2; shift 2
    set +e
    out=$("$CTLBIN" doctor --token-file "$ITEST_DIR/token" "$@" 2>&1); rc=$?
    set -e
    [ $rc -eq 2 ] || fail "doctor $what: exit status $rc, expected 2 ($out)"
    echo "$out" | grep -q -- "$pat" || fail "doctor $what: message does not say '$pat': $out"
    echo "doctor $what: $(echo "$out" | head -n 1)"
}
expect_doctor_usage "ftp server" "--server 'ftp://127.0.0.1' is not an http:// or https:// URL" --server ftp://127.0.0.1
expect_doctor_usage "port 0" "port 0: expected 1 to 65535" --server http://127.0.0.1:0
expect_doctor_usage "port 99999" "Port number was not a decimal number" --server http://127.0.0.1:99999
expect_doctor_usage "a 300-byte host" "expected at most 255 bytes" \
    --server "http://$(python3 -c 'print("a" * 300)'):80"
expect_doctor_usage "devices per node 3x" "--devices-per-node: expected 1 to 64, got '3x'" --devices-per-node 3x
for flag in --job --token-file --devices-per-node --server --control-port --json; do
    "$CTLBIN" doctor --help | grep -q -- "$flag" || fail "doctor --help does not name $flag"
done
# doctor --job of a program's spec (rank_cmd, parallelism ddp) plans that program, not muster-train's
# default model (which failed it: "seq_len: expected 1 to the model's context 128, got 1024")
mkdir -p "$ITEST_DIR/pck"
cat > "$ITEST_DIR/pdoc.json" <<JSON
{"name": "pdoc", "nodes": 2, "rank_cmd": "python3 train.py", "parallelism": "ddp", "params": 50300000,
 "precision": "fp16", "batch": 16, "micro_batch": 1, "seq_len": 1024, "checkpoint_dir": "$ITEST_DIR/pck"}
JSON
set +e
"$CTLBIN" doctor --job "$ITEST_DIR/pdoc.json" --token-file "$ITEST_DIR/token" --server http://127.0.0.1:1 --json \
    2>/dev/null > "$ITEST_DIR/pdoc.out"
set -e
python3 -c '
import json, sys
rows = {r["check"]: r for r in json.load(open(sys.argv[1]))["checks"]}
plan, ck = rows["plan"], rows["checkpoint_dir"]
assert plan["result"] != "FAIL" and plan["detail"].startswith("ddp program: 0.75 GiB per GPU predicted"), plan
assert ck["result"] == "ok" and "data" not in rows, rows
print("doctor --job of a ddp program: plan %s (%s)" % (plan["result"], plan["detail"]))' "$ITEST_DIR/pdoc.out" \
    || fail "doctor --job of a program's spec: $(cat "$ITEST_DIR/pdoc.out")"

# the running job
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
RANK_CMD="$BUILD/muster-train --threads 1"
start_agent a 1 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
AGENT_A=$AGENT_PID
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
# doctor checks the REST port --server names (not 29471) and the control port it is given
"$CTLBIN" doctor --server "http://127.0.0.1:$HTTP" --control-port "$CTL" --token-file "$ITEST_DIR/token" \
    > "$ITEST_DIR/doctor3.out" || { cat "$ITEST_DIR/doctor3.out"; fail "doctor with musterd's ports"; }
grep -q "^REST port  *ok  *127.0.0.1:$HTTP is held by musterd" "$ITEST_DIR/doctor3.out" \
    && grep -q "^control port  *ok  *127.0.0.1:$CTL is held by musterd" "$ITEST_DIR/doctor3.out" \
    || { cat "$ITEST_DIR/doctor3.out"; fail "doctor did not check --server's REST port and the control port"; }
# a musterd elsewhere (a TEST-NET address no one answers): the control port is tried there
set +e
"$CTLBIN" doctor --server "http://192.0.2.1:$HTTP" --token-file "$ITEST_DIR/token" > "$ITEST_DIR/doctor4.out"; rc=$?
set -e
[ $rc -eq 1 ] && grep -q "^control port  *FAIL  *192.0.2.1:29470" "$ITEST_DIR/doctor4.out" \
    && ! grep -q "^REST port" "$ITEST_DIR/doctor4.out" \
    || { cat "$ITEST_DIR/doctor4.out"; fail "doctor with a remote --server must try its control port, not this node's"; }
echo "doctor: checks --server's ports ($HTTP, $CTL), and a remote one's control port"

# a rank_cmd program the spec describes: planned against the step time its ranks measure
kill "$AGENT_A" "$AGENT_PID" "$DAEMON_PID" 2>/dev/null || true
wait_exit "$AGENT_A" 10 || true
wait_exit "$AGENT_PID" 10 || true
wait_exit "$DAEMON_PID" 10 || true
cat > "$ITEST_DIR/prog.json" <<JSON
{"name": "prog", "nodes": 2, "rank_cmd": "$BUILD/tests/fake-rank --step-ms 200", "parallelism": "ddp",
 "params": 50300000, "precision": "fp16", "batch": 16, "micro_batch": 1, "seq_len": 1024,
 "heartbeat_interval_ms": 200}
JSON
start_daemon "$ITEST_DIR/prog.json" --token-file "$ITEST_DIR/token" --state-dir "$ITEST_DIR/state2"
start_agent pa 1 --token-file "$ITEST_DIR/token" --state-dir "$ITEST_DIR/agent-state2"
start_agent pb 1 --token-file "$ITEST_DIR/token" --state-dir "$ITEST_DIR/agent-state2"
wait_for 60 'running == 2 and d["plan"] is not None and d["plan"].get("step_time_measured")' \
    || { show_status; fail "the program's plan did not take the measured step time within 60 s"; }
curl -sf "http://127.0.0.1:$HTTP/v1/plan" | python3 -c '
import json, sys
p = json.load(sys.stdin)["plan"]
c = p["comm"]
assert p["kind"] == "program" and p["parallelism"] == "ddp" and p["world"] == 2 and p["accum"] == 8, p
assert c["sync_sent"] == 100600000 and 0.1 < c["step_time"] < 2, c
assert abs(c["comm_frac"] - min(1, c["comm_s"] / c["step_time"])) < 1e-9, c
print("GET /v1/plan of a rank_cmd ddp job: %.3f s communication against the measured %.3f s step" % (c["comm_s"], c["step_time"]))
' || fail "GET /v1/plan of a rank_cmd job: the program plan against the measured step"
"$CTLBIN" --server "http://127.0.0.1:$HTTP" status | grep -q "plan (ddp, fp16): 100.6 MB sent per step per GPU" \
    || fail "status shows no program plan"
"$CTLBIN" --server "http://127.0.0.1:$HTTP" plan --parallelism ddp --params 50.3M --nodes 2 --network 1g --json \
    | python3 -c '
import json, sys
p = json.load(sys.stdin)
assert p["step_time_measured"] is True and p["comm"]["step_time"] > 0, p' \
    || fail "musterctl plan --server did not take the running job's step time"
echo "plan_cli: ok"
