#!/bin/sh
# Pre-flight for a program's own needs (job keys require_*, checkpoint_latest):
# two agents a, b of a rank_cmd job; each time node b lacks what the program
# needs, and the job waits with b unfit (the reason in /v1/nodes, /v1/status
# and /v1/events), spending no restart and starting no rank:
# 1. its data path is missing: b runs in its own mount namespace with an
#    empty tmpfs over the data directory (skipped where mounting is not
#    permitted); copying the file in (nsenter) makes b fit and the job runs;
# 2. the python3 its PATH finds has no torch (a venv without it): unfit with
#    Python's ModuleNotFoundError, while node a's interpreter imports it;
# 3. its checkpoint_dir's latest checkpoint differs from a's (node-local
#    dirs): the generation is not started, an event names each node and
#    what it has; copying the checkpoint lets the generation start;
# 4. the same before a restart: b's checkpoint is deleted while the job
#    runs, a rank is killed, and generation 2 waits until they agree;
# 5. b's `latest` is a FIFO: unfit at once (not a check that waits for a
#    writer forever); a's names its checkpoint with terminal escapes, which
#    reach no /v1 document.
set -eu
. tests/itest-lib.sh

make_token "$ITEST_DIR/token"
abs=$(pwd)
FAKE="$abs/$BUILD/tests/fake-rank --step-ms 50"

# job NAME EXTRA_KEYS (JSON members, leading comma)
job() {
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 3, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000,
 "stop_grace_ms": 500 $2}
JSON
    rm -rf "$ITEST_DIR/state"
    start_daemon "$ITEST_DIR/$1.json" --token-file "$ITEST_DIR/token"
}

# agent NAME DIR [PREFIX...]: an agent started in DIR, through PREFIX (a namespace, env).
agent() {
    n=$1; d=$2; shift 2
    mkdir -p "$d"
    (cd "$d" && exec "$@" "$abs/$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node "$n" --devices cpu:1 \
        --state-dir "$ITEST_DIR/agent-state-$n" --token-file "$ITEST_DIR/token" >> "$ITEST_DIR/agent-$n.log" 2>&1) &
    ITEST_PIDS="$ITEST_PIDS $!"
    AGENT_PID=$!
}

# b_unfit CASE PATTERN: node b unfit with PATTERN in its reason, a fit, the job waiting, nothing spent.
b_unfit() {
    wait_for "${3:-20}" 'node.get("b", {}).get("fit") == "unfit"' || fail "$1: node b was not shown unfit"
    reason=$(curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/nodes?node=b" \
        | python3 -c 'import json,sys; print(json.load(sys.stdin)["nodes"][0]["unfit_reason"])')
    echo "$1: node b unfit: $reason"
    echo "$reason" | grep -qF "$2" || fail "$1: reason does not say '$2'"
    wait_event 5 "node b is unfit" || fail "$1: no node_unfit event"
    check 'any(n["name"] == "b" and n["health"] == "unfit" for n in d["unhealthy_nodes"])' \
        || fail "$1: /v1/status does not list node b as unfit"
    sleep 2.5 # b checks again (every 2 s): still unfit, still nothing started
    check 'd["state"] == "waiting" and d["restarts"] == 0 and d["generation"] == 0 and "unfit" in (d["reason"] or "")' \
        || fail "$1: expected the job waiting on b, no restart spent, no generation"
}

# 1. data path missing on node b (mount namespace)
mkdir -p "$ITEST_DIR/data"
printf 'to be or not to be\n' > "$ITEST_DIR/data/train.txt"
cp "$ITEST_DIR/data/train.txt" "$ITEST_DIR/train.txt.src"
if unshare -m sh -c "mount -t tmpfs -o size=1m tmpfs '$ITEST_DIR/data' && test ! -e '$ITEST_DIR/data/train.txt'" \
    2>/dev/null; then
    job data ", \"rank_cmd\": \"$FAKE\", \"require_readable\": [\"$ITEST_DIR/data/train.txt\"],
      \"require_writable\": [\"$ITEST_DIR\"], \"require_free_mb\": 1"
    agent a "$ITEST_DIR/a"
    agent b "$ITEST_DIR/b" unshare -m sh -c "mount -t tmpfs -o size=1m tmpfs '$ITEST_DIR/data' && exec \"\$@\"" sh
    B_PID=$AGENT_PID
    b_unfit "missing data" "require_readable $ITEST_DIR/data/train.txt: No such file or directory"
    check 'node["a"]["fit"] == "fit"' || fail "missing data: node a (which has the file) is not fit"
    [ -z "$(pgrep -f "$BUILD/tests/fake-rank" -P "$B_PID" || true)" ] || fail "missing data: b started a rank"
    if nsenter -t "$B_PID" -m cp "$ITEST_DIR/train.txt.src" "$ITEST_DIR/data/train.txt"; then
        wait_for 30 'running == 2 and d["restarts"] == 0' || fail "missing data: no run after the file came"
        echo "missing data: fixed in b's namespace: job running, restarts 0"
    else
        cannot_run "missing data" "the fix through nsenter (nsenter not permitted)"
    fi
    stop_all
else
    cannot_run "missing data" "no permission for a mount namespace (unshare -m)"
fi

# 2. the python3 node b's PATH finds lacks torch
if python3 -m venv --without-pip "$ITEST_DIR/venv"; then
    TORCH_PY=${MUSTER_TORCH_PY:-$abs/.venv/bin/python}
    "$ITEST_DIR/venv/bin/python3" -c 'import torch' 2>/dev/null && fail "the venv made without packages imports torch"
    printf 'import time\ntime.sleep(600)\n' > "$ITEST_DIR/train.py"
    job python ", \"rank_cmd\": [\"python3\", \"$ITEST_DIR/train.py\"], \"require_python_modules\": [\"torch\"]"
    # node a: the build's PyTorch environment first on PATH when there is one
    A_PATH=$PATH
    "$TORCH_PY" -c 'import torch' 2>/dev/null && A_PATH="$(dirname "$TORCH_PY"):$PATH"
    have_torch=0
    PATH=$A_PATH python3 -c 'import torch' 2>/dev/null && have_torch=1
    [ $have_torch = 1 ] || cannot_run "no torch" "no python3 with torch here: node a's side (fit with torch)"
    agent a "$ITEST_DIR/a" env PATH="$A_PATH"
    agent b "$ITEST_DIR/b" env PATH="$ITEST_DIR/venv/bin:$PATH"
    if [ $have_torch = 1 ]; then # importing torch takes seconds: a is checking until then
        wait_for 90 'node["a"]["fit"] == "fit"' || fail "no torch: node a, whose python3 has torch, is not fit"
        echo "no torch: node a (python3 with torch) fit"
    fi
    b_unfit "no torch" "require_python: $ITEST_DIR/venv/bin/python3 cannot import torch: ModuleNotFoundError: No module named 'torch'"
    check 'd["restarts"] == 0 and d["generation"] == 0' || fail "no torch: a restart was spent"
    stop_all
else
    cannot_run "no torch" "python3 -m venv cannot make a virtual environment here"
fi

# 3. node-local checkpoint dirs whose latest checkpoints differ
mkdir -p "$ITEST_DIR/a/ckpt/global_step40" "$ITEST_DIR/b/ckpt"
echo global_step40 > "$ITEST_DIR/a/ckpt/latest"
job ckpt ", \"rank_cmd\": \"$FAKE\", \"checkpoint_dir\": \"ckpt\", \"checkpoint_latest\": \"file:latest\""
agent a "$ITEST_DIR/a"
agent b "$ITEST_DIR/b"
wait_event 20 "checkpoint_dir differs between nodes: node . has [a-z_0-9]*, node . has" \
    || fail "diverged: no checkpoint_diverged event"
curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | grep "checkpoint_dir differs" | grep "node a has global_step40" \
    | grep -q "node b has none" || fail "diverged: the event does not name what each node has"
check '"node a has global_step40" in d["reason"] and "node b has none" in d["reason"] and d["restarts"] == 0' \
    || fail "diverged: /v1/status's reason does not name what each node has"
sleep 1
check 'running == 0 and d["restarts"] == 0' || fail "diverged: ranks started with diverging checkpoints"
echo "diverged: reported, generation held: $(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["reason"])')"
cp -r "$ITEST_DIR/a/ckpt/global_step40" "$ITEST_DIR/a/ckpt/latest" "$ITEST_DIR/b/ckpt/"
wait_for 20 'running == 2 and d["restarts"] == 0' || fail "diverged: the generation did not start once they agree"
echo "diverged: fixed (checkpoint copied): generation running, restarts 0"
# 4. the same at a restart: b's checkpoint is lost while the job runs, then a rank dies
rm -rf "$ITEST_DIR/b/ckpt/"*
rank=$(pgrep -f "$BUILD/tests/fake-rank" -P "$AGENT_PID" | head -n 1)
[ -n "$rank" ] || fail "restart: no rank of node b to kill"
kill -9 "$rank"
wait_event 20 "checkpoint_dir differs between nodes: node . has [a-z_0-9]*, node . has [a-z_0-9]*; generation not started" \
    || fail "restart: no checkpoint_diverged event before generation 2"
# (the event is out at once, the status document at musterd's next tick)
wait_for 5 'd["generation"] == 2 and d["restarts"] == 1 and "node b has none" in (d["reason"] or "")' \
    || fail "restart: generation 2 not held for the diverging checkpoints (or more than one restart spent)"
sleep 1
check 'd["generation"] == 2 and running == 0 and d["restarts"] == 1 and "node b has none" in d["reason"]' \
    || fail "restart: generation 2 started with diverging checkpoints (or more than one restart spent)"
echo "restart: held before generation 2: $(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["reason"])')"
cp -r "$ITEST_DIR/a/ckpt/global_step40" "$ITEST_DIR/a/ckpt/latest" "$ITEST_DIR/b/ckpt/"
wait_for 20 'd["generation"] == 2 and running == 2 and d["restarts"] == 1' \
    || fail "restart: generation 2 did not start once the checkpoints agree"
echo "restart: fixed: generation 2 running, 1 restart (the rank's)"
stop_all

# 5. hostile checkpoint dirs: b's `latest` is a FIFO (reading it would wait for a
#    writer forever), a's names its checkpoint with terminal escapes
rm -rf "$ITEST_DIR/a/ckpt" "$ITEST_DIR/b/ckpt" "$ITEST_DIR/agent-state-"*
mkdir -p "$ITEST_DIR/a/ckpt" "$ITEST_DIR/b/ckpt"
printf 'global_step7\033]0;owned\007\033[2J\n' > "$ITEST_DIR/a/ckpt/latest"
mkfifo "$ITEST_DIR/b/ckpt/latest"
job hostile ", \"rank_cmd\": \"$FAKE\", \"checkpoint_dir\": \"ckpt\", \"checkpoint_latest\": \"file:latest\""
agent a "$ITEST_DIR/a"
agent b "$ITEST_DIR/b"
b_unfit "fifo" "checkpoint_dir ckpt: latest is not a regular file"
# b's latest a file naming another checkpoint: the nodes differ, and a's
# name (escapes and all) is shown in the event and the status's reason.
rm "$ITEST_DIR/b/ckpt/latest"
echo global_step5 > "$ITEST_DIR/b/ckpt/latest"
wait_event_matching 20 'e["kind"] == "checkpoint_diverged" and "node b has global_step5" in e["message"]' \
    || fail "hostile: no checkpoint_diverged event naming b's global_step5: $(event_matching 'e["kind"] == "checkpoint_diverged"')"
shown=$(event_matching 'e["kind"] == "checkpoint_diverged" and "node b has global_step5" in e["message"]' | tail -n 1)
echo "$shown" | grep -q "node a has global_step7" || fail "hostile: the event does not name a's checkpoint: $shown"
check '"global_step7" in (d["reason"] or "")' || fail "hostile: /v1/status's reason does not name a's checkpoint"
no_controls() { # WHEN: no control character (raw or escaped in JSON) in the documents that show the name
    for doc in events status nodes; do
        curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/$doc" > "$ITEST_DIR/$doc.json" || fail "hostile: no /v1/$doc"
        ! grep -qiE "$(printf '\033')|$(printf '\007')|u001b|u0007" "$ITEST_DIR/$doc.json" \
            || fail "hostile ($1): a control character in /v1/$doc: $(head -c 600 "$ITEST_DIR/$doc.json")"
    done
}
no_controls "diverged"
echo "hostile: a's name shown sanitized: $(echo "$shown" | python3 -c 'import json,sys; print(json.load(sys.stdin)["message"])')"
cp "$ITEST_DIR/a/ckpt/latest" "$ITEST_DIR/b/ckpt/latest"
wait_for 20 'running == 2 and d["restarts"] == 0' || fail "fifo: no run once b's latest is a's"
no_controls "running"
echo "fifo: b unfit until its latest was a file; escapes in a's latest reached no document"
stop_all
echo "preflight_program: ok"
