#!/bin/sh
# Checkpoint housekeeping and checkpoints on request, under musterd with
# 2 agents x 1 muster-train rank (tiny model, CPU ring):
#  1. checkpoint_every 2, checkpoint_keep 2 over 40 steps: only the 2 newest
#     committed step directories remain (no temporary ones), each with both
#     ranks' shards; a second job on the same directory resumes from the
#     newest and prunes on as it goes;
#  2. checkpoint_every 0: `musterctl checkpoint` mid-run makes both ranks
#     checkpoint at one step boundary (both shards and a manifest of that
#     step), and /v1/status's last_checkpoint_step names it;
#  3. the request is refused with a 409 that says why on a job that is not
#     running and on a job without checkpoint_dir.
set -eu
. tests/itest-lib.sh

need_data
make_token "$ITEST_DIR/token"
make_token "$ITEST_DIR/admin"
CTLBIN=$BUILD/musterctl

job() { # NAME STEPS EXTRA-KEYS
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 0, "model": "tiny", "data": "$DATA",
 "steps": $2, "batch": 8, "lr": 0.003, "warmup_steps": 5, "eval_every": 0, "seed": 7,
 "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000$3}
JSON
}

run() { # NAME: musterd + agents a and b, one rank each
    rm -rf "$ITEST_DIR/state"
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token" \
        --admin-token-file "$ITEST_DIR/admin" --exit-on-end
    for n in a b; do
        start_agent $n 1 --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/muster-train --threads 1"
    done
}

ctl() { "$CTLBIN" --server "http://127.0.0.1:$HTTP" --admin-token-file "$ITEST_DIR/admin" "$@"; }

# committed step directories under $1, one per line
committed() { for d in "$1"/step-*; do [ -f "$d/manifest.json" ] && basename "$d"; done; true; }

whole() { # DIR STEP: both shards and a manifest of that step
    for f in manifest.json rank-00000.bin rank-00001.bin; do
        [ -f "$1/$f" ] || fail "$1 lacks $f"
    done
    python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); sys.exit(not (m["step"] == int(sys.argv[2]) and m["world_size"] == 2))' \
        "$1/manifest.json" "$2" || fail "$1/manifest.json is not of step $2 at world size 2"
}

# ---- 1. checkpoint_keep 2 ----
CK=$ITEST_DIR/ck-keep
job keep 40 ", \"checkpoint_dir\": \"$CK\", \"checkpoint_every\": 2, \"checkpoint_keep\": 2"
run keep
wait_exit "$DAEMON_PID" 60 || fail "the keep job did not finish in 60 s"
wait "$DAEMON_PID" || fail "the keep job did not complete"
got=$(committed "$CK" | tr '\n' ' ')
[ "$got" = "step-00000038 step-00000040 " ] || fail "after 40 steps at every 2, keep 2: found '$got'"
[ "$(cat "$CK/latest")" = step-00000040 ] || fail "latest is $(cat "$CK/latest")"
whole "$CK/step-00000040" 40
whole "$CK/step-00000038" 38
! ls -a "$CK" | grep -q '^\.tmp-\|^\.old-' || fail "debris left in $CK: $(ls -a "$CK")"
echo "keep 2: $got remain of 20 checkpoints"
sleep 0.5

job keep2 50 ", \"checkpoint_dir\": \"$CK\", \"checkpoint_every\": 2, \"checkpoint_keep\": 2"
run keep2
wait_exit "$DAEMON_PID" 60 || fail "the resumed keep job did not finish in 60 s"
wait "$DAEMON_PID" || fail "the resumed keep job did not complete"
for n in a b; do
    grep -q "resumed from .* at step 40" "$ITEST_DIR/agent-$n.log" || fail "agent $n's rank did not resume from step 40"
done
got=$(committed "$CK" | tr '\n' ' ')
[ "$got" = "step-00000048 step-00000050 " ] || fail "after resuming to 50: found '$got'"
echo "resumed at step 40 and pruned on: $got"
sleep 0.5

# ---- 2. musterctl checkpoint mid-run ----
CK=$ITEST_DIR/ck-asked
job asked 1000000 ", \"checkpoint_dir\": \"$CK\", \"checkpoint_every\": 0"
run asked
wait_for 30 'd["state"] == "running" and d["step"] is not None and d["step"] >= 20' \
    || fail "the asked job is not running past step 20 within 30 s"
[ -z "$(committed "$CK")" ] || fail "a checkpoint before any was asked for"
ctl checkpoint > "$ITEST_DIR/ctl.out" 2>&1 || fail "musterctl checkpoint: $(cat "$ITEST_DIR/ctl.out")"
grep -q "musterd accepted: checkpoint" "$ITEST_DIR/ctl.out" || fail "musterctl said: $(cat "$ITEST_DIR/ctl.out")"
wait_for 20 'd["last_checkpoint_step"] is not None' || fail "no checkpoint reported within 20 s of the request"
S=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["last_checkpoint_step"])')
got=$(committed "$CK" | tr '\n' ' ')
want=$(printf 'step-%08d ' "$S")
[ "$got" = "$want" ] || fail "last_checkpoint_step is $S but the directory holds '$got'"
whole "$CK/$(printf 'step-%08d' "$S")" "$S"
wait_event 5 checkpoint_requested || fail "no checkpoint_requested event"
for n in a b; do
    grep -q "checkpoint requested; taken at the next step boundary" "$ITEST_DIR/agent-$n.log" \
        || fail "agent $n's rank did not see the request"
done
wait_event 5 "checkpoint of step $S committed" || fail "no checkpoint_committed event for step $S"
echo "requested mid-run: both ranks checkpointed at step $S"
ctl stop > /dev/null || fail "musterctl stop"
wait_exit "$DAEMON_PID" 20 || fail "the asked job did not stop in 20 s"

# ---- 3. refusals ----
job stopped 100 ", \"checkpoint_dir\": \"$ITEST_DIR/ck-none\""
rm -rf "$ITEST_DIR/state"
start_daemon "$ITEST_DIR/stopped.json" --token-file "$ITEST_DIR/token" --admin-token-file "$ITEST_DIR/admin"
if ctl checkpoint > "$ITEST_DIR/ctl.out" 2>&1; then fail "a checkpoint of a waiting job was accepted"; fi
grep -q "not running: the job is waiting.*(HTTP 409)" "$ITEST_DIR/ctl.out" \
    || fail "waiting job: musterctl said $(cat "$ITEST_DIR/ctl.out")"
kill "$DAEMON_PID"; wait "$DAEMON_PID" 2>/dev/null || true
job nodir 100 ""
rm -rf "$ITEST_DIR/state"
start_daemon "$ITEST_DIR/nodir.json" --token-file "$ITEST_DIR/token" --admin-token-file "$ITEST_DIR/admin"
code=$(curl -s -o "$ITEST_DIR/body" -w '%{http_code}' -X POST -H 'Content-Type: application/json' \
    -H "Authorization: Bearer $(cat "$ITEST_DIR/admin")" "http://127.0.0.1:$HTTP/v1/job/checkpoint")
[ "$code" = 409 ] || fail "no checkpoint_dir: HTTP $code, expected 409"
grep -q '"error":"no checkpoint_dir"' "$ITEST_DIR/body" || fail "no checkpoint_dir: body $(cat "$ITEST_DIR/body")"
if ctl checkpoint > "$ITEST_DIR/ctl.out" 2>&1; then fail "a checkpoint without checkpoint_dir was accepted"; fi
grep -q "no checkpoint_dir: this job has no checkpoint_dir" "$ITEST_DIR/ctl.out" \
    || fail "no checkpoint_dir: musterctl said $(cat "$ITEST_DIR/ctl.out")"
echo "refused with 409: a waiting job, a job without checkpoint_dir"
echo "checkpoint keep and request: ok"
