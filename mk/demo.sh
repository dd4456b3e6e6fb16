#!/bin/sh
# make demo: musterd + 2 agents x 2 CPU ranks on this machine train the
# `small` GPT on a text (default ../shared/data/tinyshakespeare.txt, or
# DATA=path), with ZeRO-3 over the TCP ring. Shows the job's status and the
# loss falling, then a sample of text from the trained model.
#
#   DATA=file   the text to train on
#   STEPS=n     optimizer steps (default 800: under two minutes of training on 2 cores)
#   KEEP=1      keep demo-run/ (state, logs, checkpoints) afterwards
set -eu
BUILD=${BUILD:-build}
DATA=${DATA:-../shared/data/tinyshakespeare.txt}
STEPS=${STEPS:-800}
DIR=demo-run

if [ ! -r "$DATA" ]; then
    echo "demo: cannot read the training text '$DATA'; give one with DATA=path/to/text.txt" >&2
    exit 1
fi
DATA=$(cd "$(dirname "$DATA")" && pwd)/$(basename "$DATA")
rm -rf "$DIR"
mkdir -p "$DIR"
PIDS=""
cleanup() {
    for p in $PIDS; do kill "$p" 2>/dev/null || true; done
    sleep 0.5
    for p in $PIDS; do kill -9 "$p" 2>/dev/null || true; done
    [ "${KEEP:-0}" = 1 ] || rm -rf "$DIR"
}
trap cleanup EXIT INT TERM

pick_port() {
    python3 -c 'import socket,sys
s=socket.socket()
try:
    s.bind(("127.0.0.1",int(sys.argv[1])))
except OSError:
    s.bind(("127.0.0.1",0))
print(s.getsockname()[1])' "$1"
}
CTL=$(pick_port 29470)
HTTP=$(pick_port 29471)
SERVER="http://127.0.0.1:$HTTP"

"$BUILD/musterctl" token new "$DIR/token" > /dev/null
cat > "$DIR/job.json" <<EOF
{"name": "demo", "nodes": 2, "max_restarts": 3, "model": "small", "data": "$DATA",
 "steps": $STEPS, "batch": 16, "lr": 0.002, "lr_min": 0.0002, "warmup_steps": 30,
 "eval_every": 200, "eval_batches": 8,
 "checkpoint_dir": "$(pwd)/$DIR/checkpoints", "checkpoint_every": 100}
EOF

echo "== musterd: control 127.0.0.1:$CTL, REST $SERVER (dashboard: open it in a browser)"
"$BUILD/musterd" --job "$DIR/job.json" --listen "127.0.0.1:$CTL" --http "127.0.0.1:$HTTP" \
    --state-dir "$DIR/state" --token-file "$DIR/token" --exit-on-end > "$DIR/musterd.log" 2>&1 &
DAEMON=$!
PIDS="$DAEMON"
for node in node-a node-b; do
    "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" --node "$node" --devices cpu:2 \
        --token-file "$DIR/token" > "$DIR/$node.log" 2>&1 &
    PIDS="$PIDS $!"
done
echo "== 2 agents (node-a, node-b) x 2 CPU ranks joined; training $STEPS steps of 'small' on $(basename "$DATA")"

# Status every 15 s until the job ends (bounded by 30 minutes).
i=0
while kill -0 "$DAEMON" 2>/dev/null && [ $i -lt 1800 ]; do
    if [ $((i % 15)) -eq 0 ]; then
        echo
        "$BUILD/musterctl" --server "$SERVER" status 2>/dev/null || true
    fi
    sleep 1
    i=$((i + 1))
done
set +e
wait "$DAEMON"
rc=$?
set -e
echo
echo "== loss as rank 0 reported it"
# Every 50th step line and every validation line.
grep -h 'rank 0: step\|rank 0: val' "$DIR"/node-*.log | awk '/val/ { print "  " $0; next }
    { split($4, s, "/"); if (s[1] == 1 || s[1] % 50 == 0) print "  " $0 }'
if [ "$rc" -ne 0 ]; then
    echo "demo: the job did not complete (musterd exit $rc); see $DIR/*.log (kept)" >&2
    KEEP=1
    exit 1
fi
echo
echo "== a sample from the trained model"
"$BUILD/muster-train" --standalone --job "$DIR/job.json" --resume "$DIR/checkpoints" --sample 400 \
    --eval-every 0 2> /dev/null | sed -n '/^sample/,$p'
echo
echo "demo: done (job completed; KEEP=1 keeps $DIR/)"
