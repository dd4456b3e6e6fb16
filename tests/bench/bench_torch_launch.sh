#!/bin/sh
# torchrun vs muster running one PyTorch DDP script (tests/torch/ddp_train.py:
# gloo, env://, its own checkpoints), same model and world shape: 2 nodes x 2
# ranks on loopback. Per run, one after the other (the order rotates run by
# run), each system:
#   (a) launch: the launchers started -> every rank has finished its first step
#   (b) recovery: SIGKILL of rank 3 (local rank 1 of the second node) once it
#       has finished step KILL_AFTER -> every rank has finished its next step
#       (a step in a process started after the kill, or a step beyond the
#       last one rank 3 finished: no survivor can finish that one alone); the
#       steps finished before the kill and done again are reported.
# The systems (SYSTEMS, default all five):
#   torchrun  two `python3 -m torch.distributed.run` (c10d rendezvous,
#             --max_restarts 3): TorchElastic restarts the worker group, the
#             script resumes from the checkpoint it writes every CKPT_EVERY steps;
#   muster    musterd + two muster-worker agents, a job spec with 200 ms
#             heartbeats, the same script: muster restarts it whole, likewise;
#   heal      the same under muster with --elastic: muster_rank.Elastic heals
#             in place (survivors keep process and state; the replacement, a
#             new process, gets the state from a peer);
#   spare     heal with the job key warm_spares: the replacement is the
#             node's warm spare (imports done); the kill waits until node b's
#             spare waits for its hand-off;
#   torchft   TorchFT (bench_torch_ft.py) when TORCHFT_PYTHON imports torchft
#             and its lighthouse runs; else the reason is printed.
# Then the per-step cost of the Elastic API: the same job under muster with
# no step sleep, OVERHEAD_STEPS steps, plain loop vs --elastic (median step
# time of steps 20.. on every rank, over the same RUNS).
# The times come from the script itself (--timing-file: one line per rank
# start and per step, wall clock, with the time the process was created),
# so both systems are read the same way. For heal and spare, the phases of
# the heal come from muster_rank's own trace (MUSTER_RANK_TRACE): when the
# last survivor left the broken generation, when the new process group was
# formed on every rank, when every rank had the state and its DDP wrapper. Medians over RUNS (default 10).
# Knobs: RUNS, SYSTEMS, STEP_SLEEP (s per step, default 0.2), KILL_AFTER (default 8),
# CKPT_EVERY (default 5), TORCHRUN_MONITOR_INTERVAL (default 0.2 s, the
# counterpart of muster's 200 ms heartbeats; torchrun's own default is 5 s),
# WAIT_S (bound of every wait, default 90), OVERHEAD_STEPS (default 200; 0 =
# no overhead runs), BENCH_KEEP=1 (keep the logs).
set -eu
BUILD=${BUILD:-build}
RUNS=${RUNS:-10}
STEP_SLEEP=${STEP_SLEEP:-0.2}
KILL_AFTER=${KILL_AFTER:-8}
CKPT_EVERY=${CKPT_EVERY:-5}
MONITOR=${TORCHRUN_MONITOR_INTERVAL:-0.2}
WAIT_S=${WAIT_S:-90}
SYSTEMS=${SYSTEMS:-torchrun muster heal spare torchft}
OVERHEAD_STEPS=${OVERHEAD_STEPS:-200}
# The build's PyTorch 2.x environment (mk/deps.sh; the Makefile exports MUSTER_TORCH_PY).
PY=${BENCH_PYTHON:-${MUSTER_TORCH_PY:-$PWD/.venv/bin/python}}
SCRIPT=tests/torch/ddp_train.py
# Never reached: the job is torn down once recovery is measured.
STEPS=100000

if ! "$PY" -c 'import torch' 2> /dev/null; then
    echo "== torch_launch: $PY cannot import torch (run: sh mk/deps.sh venv): skipped"
    exit 0
fi

T=$(mktemp -d "${TMPDIR:-/tmp}/muster-bench-torch.XXXXXX")
RUN=""        # directory of the current measurement
ROOTS=""      # launcher PIDs of the current system (children of this shell)
JOB='{"name": "bench-torch", "nodes": 2, "batch": 4, "max_restarts": 3, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 2000, "lease_ms": 4000}'

alive() { # PID: exists and is not a zombie
    [ -r "/proc/$1/stat" ] && ! awk '{ sub(/.*\) /, ""); exit ($1 == "Z") ? 0 : 1 }' "/proc/$1/stat" 2> /dev/null
}

# tree_of PID...: the PIDs and all their descendants.
tree_of() {
    ps -eo pid=,ppid= | awk -v roots="$*" '
        BEGIN { n = split(roots, r, " "); for (i = 1; i <= n; i++) keep[r[i]] = 1 }
        { parent[$1] = $2 }
        END {
            do { grown = 0
                 for (p in parent) if (!(p in keep) && (parent[p] in keep)) { keep[p] = 1; grown = 1 }
            } while (grown)
            for (p in keep) print p
        }'
}

# ours PID: a process of this measurement (its command line names $RUN), not
# one that took a dead rank's PID.
ours() { [ -r "/proc/$1/cmdline" ] && tr '\0' ' ' < "/proc/$1/cmdline" | grep -qF -- "$RUN/"; }

# stop_system: SIGKILL the launchers, their descendants, and any rank that
# wrote a start line and is still ours (an orphan), then wait (bounded) until
# all are gone. The launchers are stopped first so that none spawns a rank
# between the listing and the kill.
stop_system() {
    [ -n "$ROOTS" ] || return 0
    for p in $ROOTS; do kill -STOP "$p" 2> /dev/null || true; done
    # shellcheck disable=SC2086 # one argument per PID
    pids=$(tree_of $ROOTS)
    for p in $(awk '$1 == "start" { print $4 }' "$RUN/timing" 2> /dev/null || true); do
        if ours "$p"; then pids="$pids $p"; fi
    done
    for p in $pids; do kill -9 "$p" 2> /dev/null || true; done
    for p in $ROOTS; do wait "$p" 2> /dev/null || true; done
    i=0
    for p in $pids; do
        while alive "$p" && [ $i -lt 250 ]; do sleep 0.02; i=$((i + 1)); done
    done
    ROOTS=""
}

cleanup() {
    stop_system
    if [ "${BENCH_KEEP:-0}" = 1 ]; then echo "kept $T"; else rm -rf "$T"; fi
}
trap cleanup EXIT
trap 'exit 1' HUP INT PIPE TERM

fail() {
    echo "FAIL: $*" >&2
    for f in "$RUN"/*.log; do
        [ -e "$f" ] || continue
        echo "---- tail of $f" >&2
        tail -n 20 "$f" >&2
    done
    exit 1
}

free_port() {
    "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# free_range N: "LO-HI", N consecutive ports that are free now, below the
# ephemeral range (where gloo's own listeners come from).
free_range() {
    "$PY" -c '
import random, socket, sys
n = int(sys.argv[1])
for _ in range(1000):
    lo = random.randrange(20000, 32768 - n)
    try:
        for p in range(lo, lo + n):
            s = socket.socket(); s.bind(("127.0.0.1", p)); s.close()
    except OSError:
        continue
    print(f"{lo}-{lo + n - 1}")
    break
else:
    sys.exit("no free port range")' "$1"
}

now() { date +%s.%N; }

# wait_timing SECONDS AWKPROG: polls the timing file every 20 ms until the awk
# program (run over it with tk = the kill time) exits 0.
wait_timing() {
    limit=$(($1 * 50)); prog=$2; i=0
    while [ $i -lt $limit ]; do
        [ -f "$RUN/timing" ] && awk -v tk="${tk:-0}" -v K="$KILL_AFTER" -v S="${S:-0}" "$prog" "$RUN/timing" && return 0
        sleep 0.02; i=$((i + 1))
    done
    return 1
}
# Every rank has finished a step (when tk > 0: in a process started after tk,
# or past S, the last step rank 3 finished before tk).
# shellcheck disable=SC2016 # awk programs
ALL_STEPPED='$1 == "start" && $6 > tk { new[$4] = 1 }
    $1 == "step" && ($4 in new || (tk > 0 && $6 > tk && $5 > S)) && !($2 in done) { done[$2] = 1; n++ }
    END { exit (n == 4) ? 0 : 1 }'
# shellcheck disable=SC2016
KILL_POINT='$1 == "step" && $2 == 3 && $5 >= K { found = 1 } END { exit found ? 0 : 1 }'

# ---- the two systems -----------------------------------------------------
# prepare_SYSTEM picks ports and writes files; start_SYSTEM only starts
# processes, so that the launch interval holds nothing else. Each launcher
# gets a session of its own (setsid): a Ctrl-C reaches only this script, whose
# trap tears everything down. OMP_NUM_THREADS=1 is what torchrun and
# muster-worker both give ranks by default (torchrun with a warning); set here
# for the launchers' own processes as well.
train_args() {
    echo "$SCRIPT --steps $STEPS --step-sleep $STEP_SLEEP --ckpt-dir $RUN/ckpt --ckpt-every $CKPT_EVERY --timing-file $RUN/timing"
}

# torchrun, torch 2.x: TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, each round's
# workers on a store of their own, as in 1.13. With the rendezvous store
# shared (2.x's default), the workers' keys are prefixed by the restart
# count, which only the agent whose worker failed increments: after the
# kill, node 0's new ranks (still restart 0) found the first round's gloo
# addresses and every round failed to connect, until max_restarts.
# torchrun, torch 1.13: --rdzv_backend c10d with --node_rank is accepted but
# the c10d rendezvous assigns group ranks by arrival, so "the second node" is
# the agent that holds ranks 2..3. Both agents name 127.0.0.1 as the endpoint,
# so both would think they host the TCP store: is_host says which one does.
# --redirects 1 --tee 1: Debian's torch 1.13 on Python 3.11 cannot parse the
# default "0" (Std.from_str returns None for it: IntFlag no longer iterates
# the zero member) and fails before starting a worker; stdout to a log file
# and teed to the console works and changes nothing else.
torchrun_cmd() { # NODE_RANK PORT
    echo "$PY -m torch.distributed.run --nnodes 2 --nproc_per_node 2 --rdzv_backend c10d" \
        "--rdzv_endpoint 127.0.0.1:$2 --rdzv_id bench-$run --rdzv_conf is_host=$((1 - $1)) --node_rank $1" \
        "--max_restarts 3 --monitor_interval $MONITOR --redirects 1 --tee 1 --log_dir $RUN/torchrun-logs-$1" \
        "$(train_args)"
}
prepare_torchrun() {
    port=$(free_port)
    TORCHRUN_0=$(torchrun_cmd 0 "$port")
    TORCHRUN_1=$(torchrun_cmd 1 "$port")
}
start_torchrun() {
    # shellcheck disable=SC2086 # word splitting of the command is intended
    OMP_NUM_THREADS=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 setsid $TORCHRUN_0 > "$RUN/torchrun-0.log" 2>&1 &
    ROOTS="$ROOTS $!"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 setsid $TORCHRUN_1 > "$RUN/torchrun-1.log" 2>&1 &
    ROOTS="$ROOTS $!"
}

# musterd and both agents start together, as the two torchruns do; an agent
# that finds no daemon yet retries after 100 ms, and that counts.
# --master-port-range: a range of this run's own, as torchrun picks a free
# port of its own. With the default 29500-29999 every muster agent on the
# machine offers the lowest free port, and a second muster job started at the
# same time (another test) gets the same MASTER_PORT: one rank 0 fails to bind
# it, or the ranks of one job join the other's store.
agent_cmd() { # NODE CONTROL_PORT PORT_RANGE [SCRIPT ARGS...]
    node=$1 port=$2 ports=$3
    shift 3
    echo "$BUILD/muster-worker --daemon 127.0.0.1:$port --node $node --devices cpu:2 --token-file $RUN/token" \
        "--state-dir $RUN/agent-$node --master-port-range $ports -- $PY $(train_args) $*"
}
prepare_muster() { # [JOB KEYS] [SCRIPT ARGS...]
    keys=${1:-}
    [ $# -eq 0 ] || shift
    ctl=$(free_port); http=$(free_port); range=$(free_range 4)
    (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$RUN/token")
    echo "${JOB%\}}$keys}" > "$RUN/job.json"
    MUSTERD="$BUILD/musterd --job $RUN/job.json --listen 127.0.0.1:$ctl --http 127.0.0.1:$http"
    MUSTERD="$MUSTERD --state-dir $RUN/state --token-file $RUN/token"
    AGENT_a=$(agent_cmd a "$ctl" "$range" "$@")
    AGENT_b=$(agent_cmd b "$ctl" "$range" "$@")
}
start_muster() {
    # shellcheck disable=SC2086
    setsid $MUSTERD > "$RUN/musterd.log" 2>&1 &
    ROOTS="$ROOTS $!"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 MUSTER_RANK_TRACE=$RUN/trace setsid $AGENT_a > "$RUN/agent-a.log" 2>&1 &
    ROOTS="$ROOTS $!"
    # shellcheck disable=SC2086
    OMP_NUM_THREADS=1 MUSTER_RANK_TRACE=$RUN/trace setsid $AGENT_b > "$RUN/agent-b.log" 2>&1 &
    ROOTS="$ROOTS $!"
}

# heal: the same job, the script healing in place through muster_rank.Elastic.
prepare_heal() { prepare_muster "" --elastic; }
start_heal() { start_muster; }
# spare: heal with a warm spare on each node.
prepare_spare() { prepare_muster ', "warm_spares": 1' --elastic; }
start_spare() { start_muster; }
# Before the kill: node b's spare has done its imports (it waits on its
# hand-off socket, its main thread in a unix socket read).
ready_spare() {
    i=0
    while [ $i -lt $((WAIT_S * 10)) ]; do
        for p in $(pgrep -f "muster_spare .*$RUN/" || true); do
            if tr '\0' '\n' < "/proc/$p/environ" 2> /dev/null | grep -qx "MUSTER_NODE=b" &&
                [ "$(cat "/proc/$p/wchan" 2> /dev/null)" = unix_stream_read_generic ]; then
                return 0
            fi
        done
        sleep 0.1; i=$((i + 1))
    done
    return 1
}

# torchft: the lighthouse and four torchruns of one replica group each (one
# rank: tests/bench/bench_torch_ft.py), each torchrun restarting its rank
# (--max_restarts 3). TorchFT comes from PyPI, into an environment of its own
# that sees the build's torch (TORCHFT_PYTHON, docs/pytorch.md says how).
# The lighthouse declares a replica dead after 2 s without heartbeat, as the
# muster job's heartbeat_timeout_ms does, and waits as long for stragglers.
TORCHFT_PY=${TORCHFT_PYTHON:-$PY}
torchft_missing() {
    if ! why=$("$TORCHFT_PY" -c 'import torchft' 2>&1); then
        echo "$TORCHFT_PY cannot import torchft ($(printf '%s\n' "$why" | tail -n 1)); set TORCHFT_PYTHON (docs/pytorch.md)"
        return 1
    fi
    [ -x "$(dirname "$TORCHFT_PY")/torchft_lighthouse" ] ||
        { echo "no torchft_lighthouse beside $TORCHFT_PY"; return 1; }
}
prepare_torchft() {
    lport=$(free_port)
    LIGHTHOUSE="$(dirname "$TORCHFT_PY")/torchft_lighthouse --bind 127.0.0.1:$lport --min_replicas 1"
    LIGHTHOUSE="$LIGHTHOUSE --quorum_tick_ms 100 --heartbeat_timeout_ms 2000 --join_timeout_ms 2000"
    FT=""
    for g in 0 1 2 3; do
        FT="$FT $(free_port)"
    done
}
start_torchft() {
    # shellcheck disable=SC2086
    RUST_LOG=warn setsid $LIGHTHOUSE > "$RUN/lighthouse.log" 2>&1 &
    ROOTS="$ROOTS $!"
    g=0
    for port in $FT; do
        # shellcheck disable=SC2086
        OMP_NUM_THREADS=1 REPLICA_GROUP_ID=$g TORCHFT_LIGHTHOUSE=http://127.0.0.1:$lport setsid \
            "$TORCHFT_PY" -m torch.distributed.run --nnodes 1 --nproc_per_node 1 --rdzv_backend c10d \
            --rdzv_endpoint "127.0.0.1:$port" --max_restarts 3 --monitor_interval "$MONITOR" \
            tests/bench/bench_torch_ft.py --steps "$STEPS" --step-sleep "$STEP_SLEEP" --timing-file "$RUN/timing" \
            > "$RUN/torchft-$g.log" 2>&1 &
        ROOTS="$ROOTS $!"
        g=$((g + 1))
    done
}

# ---- one measurement -----------------------------------------------------

# measure SYSTEM: appends "SYSTEM a a_started b b_restarted redone
# restart_counts new_processes" (times in seconds) to $T/results and prints
# the run's line.
measure() {
    sys=$1
    RUN=$T/$sys-$run
    mkdir -p "$RUN"
    tk=0; S=0
    "prepare_$sys"
    t0=$(now)
    "start_$sys"
    wait_timing "$WAIT_S" "$ALL_STEPPED" || fail "$sys run $run: not every rank finished a first step within $WAIT_S s"
    if command -v "ready_$sys" > /dev/null; then "ready_$sys" || fail "$sys run $run: not ready for the kill"; fi
    wait_timing "$WAIT_S" "$KILL_POINT" || fail "$sys run $run: rank 3 did not reach step $KILL_AFTER"
    victim=$(awk '$1 == "start" && $2 == 3 { p = $4 } END { print p }' "$RUN/timing")
    kill -STOP "$victim" 2> /dev/null || true # its last step is S; then it dies
    S=$(awk '$1 == "step" && $2 == 3 && $5 > s { s = $5 } END { print s + 0 }' "$RUN/timing")
    tk=$(now)
    kill -9 "$victim" || fail "$sys run $run: rank 3 (pid $victim) was gone before the kill"
    wait_timing "$WAIT_S" "$ALL_STEPPED" || fail "$sys run $run: no step on every rank within $WAIT_S s of killing rank 3 (pid $victim)"
    stop_system
    # New processes: a start line after tk (a warm spare's: when it took the
    # rank up; "restarted" is then that moment, else when it was created).
    awk -v sys="$sys" -v t0="$t0" -v tk="$tk" -v S="$S" '
        $1 == "start" { born[$4] = $6; created[$4] = ($8 > 0) ? $8 : $6
                        if ($6 < tk) { if (created[$4] > spawn0) spawn0 = created[$4] }
                        else { c = (created[$4] > tk) ? created[$4] : $6; if (c > spawn1) spawn1 = c
                               restarts[$3] = 1; fresh++ } }
        $1 == "step" && born[$4] < tk && (!($2 in first0) || $6 < first0[$2]) { first0[$2] = $6 }
        $1 == "step" && $6 <= tk && $5 > before { before = $5 }
        $1 == "step" && $6 > tk && (born[$4] > tk || $5 > S) && (!($2 in first1) || $6 < first1[$2]) {
            first1[$2] = $6; from[$2] = $5 - 1 }
        END {
            for (r in first0) if (first0[r] > a) a = first0[r]
            for (r in first1) { if (first1[r] > b) b = first1[r]; if (resumed == "" || from[r] < resumed) resumed = from[r]
                                if (r != 3 && first1[r] > bs) bs = first1[r] }
            rc = ""; for (c = 0; c <= 100; c++) if (c in restarts) rc = rc (rc == "" ? "" : ",") c
            printf "%s %.3f %.3f %.3f %.3f %d %s %d %.3f\n", sys, a - t0, spawn0 - t0, b - tk, (fresh ? spawn1 - tk : 0),
                (before > resumed) ? before - resumed : 0, (rc == "") ? "-" : rc, fresh, bs - tk
        }' "$RUN/timing" >> "$T/results"
    tail -n 1 "$T/results" | awk -v run="$run" '{
        printf "run %d %-8s launch %6.2f s (ranks started %5.2f s)  recovery %6.2f s (ranks restarted %5.2f s, survivors stepped %5.2f s)  redone %d steps  TORCHELASTIC_RESTART_COUNT %s  new processes %d\n",
            run, $1, $2, $3, $4, $5, $9, $6, $7, $8 }'
    # Healing in place: the phases muster_rank.Elastic traced (MUSTER_RANK_TRACE,
    # "TIME PID PHASE"), each the moment the last rank got there after the kill.
    if [ -s "$RUN/trace" ]; then
        awk -v sys="$sys" -v tk="$tk" '
            $1 > tk && ($3 == "leave" || $3 == "group" || $3 == "wrapped") && !(($2, $3) in seen) {
                seen[$2, $3] = 1; if ($1 > last[$3]) last[$3] = $1 }
            END { if (last["wrapped"] > 0) printf "%s %.3f %.3f %.3f\n", sys, last["leave"] - tk, last["group"] - tk, last["wrapped"] - tk }
        ' "$RUN/trace" >> "$T/phases"
        tail -n 1 "$T/phases" | awk -v sys="$sys" '$1 == sys {
            printf "      phases after the kill: survivors out of the generation %.3f s, process group formed %.3f s, state in place %.3f s\n", $2, $3, $4 }'
    fi
    [ "${BENCH_KEEP:-0}" = 1 ] || rm -rf "$RUN"
}

# torchft: available when TORCHFT_PYTHON imports torchft (see bench_torch_ft.py); else left out, with why.
if echo " $SYSTEMS " | grep -q " torchft "; then
    if ! why=$(torchft_missing); then
        SYSTEMS=$(echo " $SYSTEMS " | sed 's/ torchft / /')
        echo "== torch_launch: torchft left out: $why"
    fi
fi
echo "== torch_launch: $SYSTEMS; $SCRIPT, 2 nodes x 2 ranks on loopback, $RUNS runs," \
    "kill rank 3 after step $KILL_AFTER, checkpoint every $CKPT_EVERY, step sleep $STEP_SLEEP s, torchrun monitor_interval $MONITOR s"
: > "$T/results"
: > "$T/phases"
run=1
while [ $run -le "$RUNS" ]; do
    # The order rotates run by run: none always runs first, or right after another.
    # shellcheck disable=SC2086 # one word per system
    set -- $SYSTEMS
    i=1
    while [ $i -lt "$run" ] && [ $# -gt 1 ]; do x=$1; shift; set -- "$@" "$x"; i=$((i + 1)); done
    for sys in "$@"; do measure "$sys"; done
    run=$((run + 1))
done

# ---- the per-step cost of the Elastic API ------------------------------------

# step_times SYSTEM: the job under muster with no step sleep and no checkpoint,
# OVERHEAD_STEPS steps; appends "SYSTEM median_step_s mean_step_s" (over every
# rank's steps from 20 on) to $T/steps: the median hides the few steps that
# carry the periodic grow vote, the mean counts them.
step_times() {
    sys=$1
    RUN=$T/steps-$sys-$run
    mkdir -p "$RUN"
    args="--ckpt-dir $RUN/ckpt --ckpt-every 1000000"
    [ "$sys" = elastic ] && args="$args --elastic"
    saved=$STEP_SLEEP; STEP_SLEEP=0; steps=$STEPS; STEPS=$OVERHEAD_STEPS
    # shellcheck disable=SC2086
    prepare_muster "" $args
    STEP_SLEEP=$saved; STEPS=$steps
    start_muster
    wait_timing "$WAIT_S" '$1 == "step" && $5 == '"$OVERHEAD_STEPS"' { n++ } END { exit (n == 4) ? 0 : 1 }' ||
        fail "$sys steps run $run: not every rank finished $OVERHEAD_STEPS steps within $WAIT_S s"
    stop_system
    awk -v sys="$sys" '$1 == "step" { if ($2 in last && $5 == prev[$2] + 1 && $5 > 20) print $6 - last[$2]
                                      last[$2] = $6; prev[$2] = $5 }' "$RUN/timing" | sort -g |
        awk -v sys="$sys" '{ v[NR] = $1; s += $1 } END { printf "%s %.6f %.6f\n", sys, v[int((NR + 1) / 2)], s / NR }' >> "$T/steps"
    [ "${BENCH_KEEP:-0}" = 1 ] || rm -rf "$RUN"
}
: > "$T/steps"
if [ "$OVERHEAD_STEPS" -gt 20 ]; then
    run=1
    while [ $run -le "$RUNS" ]; do
        if [ $((run % 2)) -eq 1 ]; then step_times plain; step_times elastic
        else step_times elastic; step_times plain; fi
        run=$((run + 1))
    done
fi

# ---- the table -----------------------------------------------------------

# summary SYSTEM FIELD [FILE]: "median min max" of one column of the results.
summary() {
    awk -v s="$1" -v f="$2" '$1 == s { print $f }' "${3:-$T/results}" | sort -g |
        awk '{ v[NR] = $1 } END { m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2; print m, v[1], v[NR] }'
}
row() { # LABEL FIELD FORMAT
    line=$(printf '%-44s' "$1")
    for sys in $SYSTEMS; do
        line="$line $(summary "$sys" "$2" | awk -v fmt="$3" '{ printf "%-21s", sprintf(fmt " (" fmt "-" fmt ")", $1, $2, $3) }')"
    done
    echo "$line"
}
echo
line=$(printf '%-44s' "medians over $RUNS runs (min-max)")
for sys in $SYSTEMS; do line="$line $(printf '%-21s' "$sys")"; done
echo "$line"
row "(a) launch -> first step on every rank [s]" 2 "%.2f"
row "(b) kill -> next step on every rank [s]" 4 "%.3f"
row "    kill -> next step on ranks 0-2 [s]" 9 "%.3f"
row "    kill -> replacement started [s]" 5 "%.2f"
row "(b) completed steps redone" 6 "%.1f"
if [ -s "$T/phases" ]; then
    phase() { # LABEL FIELD: a row of the heal phases (systems that heal in place)
        line=$(printf '%-44s' "$1")
        for sys in $SYSTEMS; do
            if grep -q "^$sys " "$T/phases"; then
                line="$line $(summary "$sys" "$2" "$T/phases" | awk '{ printf "%-21s", sprintf("%.3f (%.3f-%.3f)", $1, $2, $3) }')"
            else
                line="$line $(printf '%-21s' -)"
            fi
        done
        echo "$line"
    }
    phase "    kill -> survivors out of the generation" 2
    phase "    kill -> new process group formed" 3
    phase "    kill -> state in place on every rank" 4
fi
if echo " $SYSTEMS " | grep -q " torchrun "; then
    t=$(summary torchrun 4 | cut -d' ' -f1)
    line=$(printf '%-44s' "(b) torchrun / system (medians)")
    for sys in $SYSTEMS; do
        line="$line $(summary "$sys" 4 | awk -v t="$t" '{ printf "%-21s", ($1 > 0) ? sprintf("%.1fx", t / $1) : "-" }')"
    done
    echo "$line"
fi
if [ -s "$T/steps" ]; then
    for f in 2 3; do # each run's median step, then each run's mean step (the grow votes' steps counted)
        p=$(summary plain $f "$T/steps"); e=$(summary elastic $f "$T/steps")
        echo "$p $e" | awk -v n="$RUNS" -v s="$OVERHEAD_STEPS" -v what="$([ $f = 2 ] && echo median || echo mean)" '{
            printf "step time (%s step of a run), no sleep, %d steps, median of %d runs (min-max): plain loop %.2f ms " \
                   "(%.2f-%.2f), Elastic %.2f ms (%.2f-%.2f): %+.1f %%\n", what, s, n, $1 * 1e3, $2 * 1e3, $3 * 1e3,
                   $4 * 1e3, $5 * 1e3, $6 * 1e3, ($4 / $1 - 1) * 100 }'
    done
fi
echo
echo "command lines (last run; ports, run id and directories change per run):"
[ -z "${TORCHRUN_0:-}" ] || printf 'torchrun (node 0 and node 1):\n  OMP_NUM_THREADS=1 %s\n  OMP_NUM_THREADS=1 %s\n' \
    "$TORCHRUN_0" "$TORCHRUN_1"
[ -z "${LIGHTHOUSE:-}" ] || echo "torchft: $LIGHTHOUSE; per replica group G (0-3): REPLICA_GROUP_ID=G" \
    "TORCHFT_LIGHTHOUSE=... $TORCHFT_PY -m torch.distributed.run --nnodes 1 --nproc_per_node 1 --max_restarts 3" \
    "--monitor_interval $MONITOR tests/bench/bench_torch_ft.py --steps $STEPS --step-sleep $STEP_SLEEP"
echo "muster (daemon, agents a and b; job.json: $JOB; heal: + --elastic; spare: + --elastic, \"warm_spares\": 1):"
echo "  ${MUSTERD:-}"
echo "  OMP_NUM_THREADS=1 ${AGENT_a:-}"
echo "  OMP_NUM_THREADS=1 ${AGENT_b:-}"
