#!/bin/sh
# Hot spare nodes, measured: a node lost for good (agent b SIGKILLed with its
# ranks, not started again) -> the next new step of the job, 2 nodes x 2
# muster-train ranks (small model, CPU, loopback), RUNS jobs (default 3) per
# path, side by side:
#   spare    spare_nodes 1 (a third agent waits): the spare takes b's place
#            in the next generation, the world stays 4 ranks;
#   shrink   no spare, min_nodes 1, rejoin_timeout_ms at its least (1000):
#            today's path, which waits rejoin_timeout_ms, then shrinks to 2
#            ranks (with the default rejoin_timeout_ms, 300 s, it waits 300x
#            longer before the shrink).
# "next step" = the first step node a's ranks complete after the heal (their
# log's "healed: ... step at T", wall clock); the world size the job then runs
# at is reported.
set -eu
BUILD=${BUILD:-build}
RUNS=${RUNS:-3}
. tests/itest-lib.sh
need_data
make_token "$ITEST_DIR/token"

job() { # NAME EXTRA-KEYS
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 10, "model": "small", "data": "$DATA",
 "steps": 100000, "batch": 8, "lr": 0.003, "warmup_steps": 5, "eval_every": 0, "seed": 7,
 "heartbeat_interval_ms": 100, "heartbeat_timeout_ms": 3000, "restart_backoff_ms": 0, "min_nodes": 1, $2}
JSON
}

agent() { # NAME METRICS
    start_agent "$1" 2 --token-file "$ITEST_DIR/token" \
        --rank-cmd "$BUILD/muster-train --threads 1 --metrics $2"
    eval "AGENT_$1=\$AGENT_PID"
}

healed() { grep -c 'healed: ' "$ITEST_DIR/agent-a.log" || true; }
wall() { python3 -c 'import time; print("%.6f" % time.time())'; }
world() { status | python3 -c 'import json,sys; print(json.load(sys.stdin)["world_size"])'; }

stop_all() {
    kill "$DAEMON_PID" $AGENTS 2> /dev/null || true
    sleep 0.5
    pkill -9 -f "$ITEST_DIR/.*metrics" 2> /dev/null || true
}

: > "$ITEST_DIR/figures"
for path in spare shrink; do
    run=0
    while [ $run -lt "$RUNS" ]; do
        name=$path$run
        m="$ITEST_DIR/$name.metrics"
        rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state"
        rm -f "$ITEST_DIR"/agent-*.log
        if [ $path = spare ]; then job "$name" '"spare_nodes": 1, "rejoin_timeout_ms": 300000'
        else job "$name" '"rejoin_timeout_ms": 1000'; fi
        start_daemon "$ITEST_DIR/$name.json" --token-file "$ITEST_DIR/token"
        agent a "$m"
        agent b "$m"
        AGENTS="$AGENT_a $AGENT_b"
        wait_for 60 'd["state"] in ("forming", "running")' || fail "$name: no generation 1"
        if [ $path = spare ]; then
            agent s "$m"
            AGENTS="$AGENTS $AGENT_s"
            wait_for 30 'd["spares"]["ready"] == 1' || fail "$name: the spare is not ready"
        fi
        wait_for 120 'd["state"] == "running" and (d["step"] or 0) >= 10' || fail "$name: not at step 10"
        before=$(healed)
        t_kill=$(wall)
        pkill -9 -P "$AGENT_b" -f muster-train 2> /dev/null || true
        kill -9 "$AGENT_b"
        n=0
        while [ "$(healed)" -le "$before" ] && [ $n -lt 3000 ]; do sleep 0.01; n=$((n + 1)); done
        [ $n -lt 3000 ] || fail "$name: no step after a heal within 30 s of the kill"
        t_step=$(grep 'healed: ' "$ITEST_DIR/agent-a.log" | sed -n "$((before + 1))p" | sed 's/.*step at \([0-9.]*\).*/\1/')
        echo "$path $t_kill $t_step $(world)" >> "$ITEST_DIR/figures"
        stop_all
        run=$((run + 1))
    done
done

python3 - "$ITEST_DIR/figures" <<'PY'
import statistics, sys
rows = {}
for line in open(sys.argv[1]):
    path, t0, t1, world = line.split()
    rows.setdefault(path, []).append(((float(t1) - float(t0)) * 1e3, int(world)))
print("== spares: node lost for good (agent b SIGKILLed with its 2 ranks) -> next step, 2 nodes x 2 muster-train "
      "ranks (small, CPU, loopback)")
med = {}
for path, what in (("spare", "with a spare (spare_nodes 1)"),
                   ("shrink", "without: rejoin_timeout_ms 1000 (its least), then shrink")):
    v = [ms for ms, _ in rows[path]]
    med[path] = statistics.median(v)
    worlds = sorted({w for _, w in rows[path]})
    print(f"  {what:<58} median {med[path]:8.1f} ms ({min(v):.1f}-{max(v):.1f}, {len(v)} runs), then world size "
          f"{'/'.join(map(str, worlds))}")
print(f"  spare vs shrink: {med['shrink'] / med['spare']:.1f}x sooner, at the full world size; with the default "
      f"rejoin_timeout_ms (300 s) the shrink path would wait about {(med['shrink'] - 1000 + 300000) / med['spare']:.0f}x longer")
PY
