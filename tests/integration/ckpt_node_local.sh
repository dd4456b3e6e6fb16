#!/bin/sh
# Node-local checkpoints (docs/training.md, "Node-local checkpoints"): every
# agent runs in a mount namespace of its own in which the job's
# checkpoint_dir is a bind mount of that node's own disk (a directory
# disk-NODE here), so no rank sees another node's files, as on machines
# without a shared file system. Under musterd, tiny model:
#   1. 2 agents x 2 ranks, 24 steps, checkpoint_every 4: each disk holds
#      the committed steps with its own ranks' shard files only, a manifest
#      and `latest`, and no temporary directory;
#   2. the same disks, 3 agents x 1 rank (a third node with an empty disk):
#      the job resumes at step 24 from files that are on other nodes (each
#      read once and shipped), trains to 32 and checkpoints on all three;
#   3. the same two jobs with one shared directory: step 2's final loss is
#      bit-identical to the node-local run's.
# Needs root and mount namespaces (unshare -m); skipped with a message where
# they are not permitted.
set -eu
. tests/itest-lib.sh

skip() {
    echo "SKIP: ckpt_node_local: $*"
    exit 0
}
command -v unshare > /dev/null || skip "no unshare(1)"
unshare -m --propagation private sh -c "mount -t tmpfs none '$ITEST_DIR' && umount '$ITEST_DIR'" 2> /dev/null \
    || skip "mount namespaces are not permitted here (unshare -m and mount failed; needs root / CAP_SYS_ADMIN)"

need_data
make_token "$ITEST_DIR/token"
CK=$ITEST_DIR/ckpt # the path every rank is told; what is behind it depends on the node

job() { # NAME NODES RANKS-PER-NODE STEPS
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": $2, "max_restarts": 0, "model": "tiny", "data": "$DATA",
 "steps": $4, "batch": 12, "lr": 0.003, "warmup_steps": 5, "eval_every": 0, "seed": 7,
 "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000,
 "checkpoint_dir": "$CK", "checkpoint_every": 4, "checkpoint_keep": 2}
JSON
}

# local_agent NAME NDEV DISK METRICS: an agent whose view of $CK is DISK
# (empty DISK: the real $CK, shared by all)
local_agent() {
    mkdir -p "$ITEST_DIR/pids-$1"
    if [ -n "$3" ]; then
        mkdir -p "$3"
        FAKE_RANK_PIDDIR="$ITEST_DIR/pids-$1" unshare -m --propagation private \
            sh -c 'mount --bind "$1" "$2" && shift 2 && exec "$@"' sh "$3" "$CK" \
            "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node "$1" --devices "cpu:$2" \
            --state-dir "$ITEST_DIR/agent-state" --token-file "$ITEST_DIR/token" \
            --rank-cmd "$BUILD/muster-train --threads 1 --metrics $4" >> "$ITEST_DIR/agent-$1.log" 2>&1 &
        ITEST_PIDS="$ITEST_PIDS $!"
    else
        start_agent "$1" "$2" --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/muster-train --threads 1 --metrics $4"
    fi
}

run() { # NAME NODES RANKS STEPS DISKS(y/n): runs the job to its end
    rm -rf "$ITEST_DIR/state"
    job "$1" "$2" "$3" "$4"
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token" --exit-on-end
    for n in $(echo a b c | cut -d' ' -f1-"$2"); do
        local_agent "$n" "$3" "$([ "$5" = y ] && echo "$ITEST_DIR/disk-$n")" "$ITEST_DIR/$1.metrics"
    done
    wait_exit "$DAEMON_PID" 120 || fail "$1 did not finish in 120 s"
    wait "$DAEMON_PID" || fail "$1 did not complete (musterd's exit status)"
    pkill -f "$ITEST_DIR/agent-state" 2> /dev/null || true
    sleep 0.5
    for f in "$ITEST_DIR"/agent-?.log; do mv "$f" "$ITEST_DIR/$1-$(basename "$f")"; done
}

final_loss() { # METRICS STEP
    grep "\"step\": $2, \"loss\"" "$1" | tail -n 1 |
        python3 -c 'import json,sys; print(repr(json.loads(sys.stdin.read())["loss"]))'
}

files() { (cd "$1" && ls | tr '\n' ' '); }

mkdir -p "$CK"

# ---- 1. 2 x 2 on node-local disks
run first 2 2 24 y
for n in a b; do
    d=$ITEST_DIR/disk-$n
    [ "$(cat "$d/latest")" = step-00000024 ] || fail "disk $n: latest is '$(cat "$d/latest" 2>&1)'"
    ! ls -a "$d" | grep -q '^\.tmp-\|^\.old-' || fail "disk $n: debris left: $(ls -a "$d")"
done
[ -z "$(ls "$CK")" ] || fail "the real $CK got files: $(ls "$CK")"
fa=$(files "$ITEST_DIR/disk-a/step-00000024"); fb=$(files "$ITEST_DIR/disk-b/step-00000024")
echo "node a: $fa"
echo "node b: $fb"
# each disk: the manifest and two shard files, none on both
[ "$(echo "$fa" | wc -w)" = 3 ] && [ "$(echo "$fb" | wc -w)" = 3 ] || fail "expected a manifest and 2 shards per node"
for f in rank-00000.bin rank-00001.bin rank-00002.bin rank-00003.bin; do
    [ "$(echo "$fa $fb" | tr ' ' '\n' | grep -c "^$f\$")" = 1 ] || fail "$f is not on exactly one node"
done
cmp -s "$ITEST_DIR/disk-a/step-00000024/manifest.json" "$ITEST_DIR/disk-b/step-00000024/manifest.json" \
    || fail "the nodes' manifests of step 24 differ"

# ---- 2. 3 x 1, one node new, on the same disks
run second 3 1 32 y
[ "$(cat "$ITEST_DIR"/second-agent-*.log | grep -c "resumed from .* at step 24")" = 3 ] \
    || fail "the 3 ranks did not all resume at step 24"
grep -hq "each file is read once and shipped" "$ITEST_DIR"/second-agent-*.log || fail "no rank said the files were shipped"
for n in a b c; do
    [ "$(cat "$ITEST_DIR/disk-$n/latest")" = step-00000032 ] || fail "disk $n: latest is not step 32"
done
[ "$(files "$ITEST_DIR/disk-c/step-00000032" | wc -w)" = 2 ] || fail "node c holds $(files "$ITEST_DIR/disk-c/step-00000032")"
local_loss=$(final_loss "$ITEST_DIR/second.metrics" 32)
[ -n "$local_loss" ] || fail "no step-32 loss in the node-local run"
echo "node-local: 2x2 to step 24, then 3x1 resumed at 24 from shipped files; loss at 32: $local_loss"

# ---- 3. the same on one shared directory
run first-shared 2 2 24 n
run second-shared 3 1 32 n
shared_loss=$(final_loss "$ITEST_DIR/second-shared.metrics" 32)
echo "shared directory: loss at 32: $shared_loss"
[ "$(cat "$ITEST_DIR"/second-shared-agent-*.log | grep -c "resumed from .* at step 24")" = 3 ] \
    || fail "shared: the 3 ranks did not all resume at step 24"
! grep -hq "each file is read once and shipped" "$ITEST_DIR"/second-shared-agent-*.log \
    || fail "shared: every rank sees every file, yet files were shipped"
[ "$local_loss" = "$shared_loss" ] || fail "node-local run's loss $local_loss differs from the shared run's $shared_loss"
echo "ckpt_node_local: ok"
