# Shared by the integration scripts (sourced, POSIX sh). Every wait is
# bounded; every process started is killed by cleanup on exit.
BUILD=${BUILD:-build}
ITEST_DIR=$(mktemp -d "${TMPDIR:-/tmp}/muster-itest.XXXXXX")
ITEST_PIDS=""

cleanup() {
    for p in $ITEST_PIDS; do kill -9 "$p" 2>/dev/null || true; done
    # Rank processes are children of agents; make sure none outlive the test.
    pkill -9 -f "$ITEST_DIR" 2>/dev/null || true
    if [ "${ITEST_KEEP:-0}" = 1 ]; then echo "kept $ITEST_DIR"; else rm -rf "$ITEST_DIR"; fi
}
trap cleanup EXIT INT TERM

fail() {
    echo "FAIL: $*" >&2
    # How each generation began, from every log: where its state came from.
    echo "---- generations and restores (all logs, at most 80 lines)" >&2
    grep -h -E "rejoining in place|state of step|training from step|re-slic|from the checkpoint|from the seed|generation [0-9]+ (is over|broke)" \
        "$ITEST_DIR"/*.log 2>/dev/null | head -n 80 >&2 || true
    for f in "$ITEST_DIR"/*.log; do
        [ -e "$f" ] || continue
        echo "---- tail of $f" >&2
        tail -n 25 "$f" >&2
    done
    # What musterd says now, if a daemon of this script still answers.
    if [ -n "${HTTP:-}" ] && curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/status" > "$ITEST_DIR/fail-status.json" 2>/dev/null; then
        echo "---- musterd now (/v1/status, the last 15 of /v1/events)" >&2
        python3 - "$ITEST_DIR/fail-status.json" "$HTTP" <<'PY' >&2 || true
import json, sys, urllib.request
d = json.load(open(sys.argv[1]))
print("state=%s generation=%s restarts=%s reason=%s" % (d.get("state"), d.get("generation"), d.get("restarts"), d.get("reason")))
ranks = json.load(urllib.request.urlopen("http://127.0.0.1:%s/v1/ranks" % sys.argv[2], timeout=2))
for r in ranks.get("ranks") or []:
    print("  rank %s node %s %s step %s" % (r.get("rank"), r.get("node"), r.get("state"), r.get("step")))
ev = json.load(urllib.request.urlopen("http://127.0.0.1:%s/v1/events" % sys.argv[2], timeout=2))
for e in (ev.get("events") or [])[-15:]:
    print("  event %s gen %s %s: %s" % (e.get("seq"), e.get("generation"), e.get("kind"), (e.get("message") or "")[:300]))
PY
    fi
    exit 1
}

# need_data: DATA, the training text as an absolute path (MUSTER_DATA or the shared corpus), or fail.
need_data() {
    DATA=${MUSTER_DATA:-../shared/data/tinyshakespeare.txt}
    [ -r "$DATA" ] || fail "no training text at $DATA (set MUSTER_DATA)"
    DATA=$(cd "$(dirname "$DATA")" && pwd)/$(basename "$DATA")
}

# cannot_run NAME WHY: a scenario (or a part of one) cannot run here: under
# CI (CI set: its machine runs as root, with every tool) a failure, else a
# line that says so; the caller skips the part (or exits 0).
cannot_run() {
    [ -n "${CI:-}" ] && fail "$1: cannot run under CI: $2"
    echo "SKIP: $1: $2"
}

# need_torch NAME MODULE...: TORCH_PY, the interpreter of the build's
# PyTorch 2.x environment (MUSTER_TORCH_PY, else .venv/bin/python, which
# mk/deps.sh makes), checked to import each MODULE. Without them: under CI
# a failure, else a skip (exit 0) that says how to get them. An import of
# deepspeed costs ~7 s of CPU: once it passed, the environment's stamp
# (mk/deps.sh's) is kept in $BUILD, and the next script asking for the
# same modules of the same environment takes it for the check.
need_torch() {
    name=$1; shift
    TORCH_PY=${MUSTER_TORCH_PY:-$PWD/.venv/bin/python}
    _stamp=$(cat "${TORCH_PY%/bin/*}/muster-stamp" 2>/dev/null || true)
    _seen="$BUILD/need-torch.$(echo "$@" | tr ' ' '+')"
    [ -n "$_stamp" ] && [ "$(cat "$_seen" 2>/dev/null)" = "$_stamp" ] && return 0
    if ! why=$("$TORCH_PY" -c "import $(echo "$@" | tr ' ' ',')" 2>&1); then
        why=$(printf '%s\n' "$why" | tail -n 1)
        [ -n "${CI:-}" ] && fail "$name: $TORCH_PY cannot import $* ($why); mk/deps.sh makes it for make check"
        echo "$name: skipped: $TORCH_PY cannot import $* ($why); run: sh mk/deps.sh venv"
        exit 0
    fi
    if [ -n "$_stamp" ]; then
        echo "$_stamp" > "$_seen.$$" && mv -f "$_seen.$$" "$_seen"
    fi
}

# rank_pid PATTERN R: the pid of the process of global rank R (newest
# generation) among those whose command line matches PATTERN (pgrep -f;
# name the test's directory in it, so that only this test's ranks match).
rank_pid() {
    best=""; bestgen=0
    for p in $(pgrep -f "$1" || true); do
        env=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null) || continue
        printf '%s\n' "$env" | grep -qx "RANK=$2" || continue
        g=$(printf '%s\n' "$env" | sed -n 's/^MUSTER_GENERATION=//p')
        [ "${g:-0}" -ge "$bestgen" ] && { best=$p; bestgen=$g; }
    done
    echo "$best"
}

# need_mount_ns NAME: skips the script (exit 0, saying why) unless mount namespaces
# with a tmpfs in them are permitted here (root / CAP_SYS_ADMIN, unshare and nsenter).
need_mount_ns() {
    if ! command -v unshare > /dev/null || ! command -v nsenter > /dev/null; then
        echo "SKIP: $1: no unshare(1) or nsenter(1)"
        exit 0
    fi
    if ! unshare -m --propagation private sh -c "mount -t tmpfs none '$ITEST_DIR' && umount '$ITEST_DIR'" 2> /dev/null; then
        echo "SKIP: $1: mount namespaces are not permitted here (unshare -m and mount failed; needs root / CAP_SYS_ADMIN)"
        exit 0
    fi
}

# wait_log SECONDS FILE PATTERN: a line matching PATTERN in FILE (polls every 50 ms).
wait_log() {
    i=0
    while [ $i -lt $(( $1 * 20 )) ]; do
        grep -q "$3" "$2" 2>/dev/null && return 0
        sleep 0.05; i=$((i + 1))
    done
    return 1
}

# free_port: a port free on loopback now, drawn from 20000-27999: below the
# kernel's ephemeral range (32768-60999 here), which every outgoing
# connection (curl, ranks, gloo) draws from, so that no client takes it
# before the server binds it (seen: "already in use" with port 0's pick),
# and apart from the agent's MASTER_PORT range (29500-29999) and RAS (28028).
free_port() {
    python3 -c '
import random, socket
for _ in range(200):
    port = random.randint(20000, 27999)
    s = socket.socket()
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        continue
    finally:
        s.close()
    print(port)
    break
else:
    raise SystemExit("free_port: no free port in 20000-27999")'
}

now_ms() { python3 -c 'import time; print(int(time.monotonic()*1000))'; }

# make_token FILE: 32 random bytes as hex, mode 0600.
make_token() {
    (umask 077; od -An -N32 -tx1 /dev/urandom | tr -d ' \n' > "$1")
}

# start_daemon JOBFILE [extra args]: sets CTL, HTTP, DAEMON_PID.
start_daemon() {
    job=$1; shift
    CTL=$(free_port); HTTP=$(free_port)
    DAEMON_T0=$(now_ms)
    "$BUILD/musterd" --job "$job" --listen "127.0.0.1:$CTL" --http "127.0.0.1:$HTTP" \
        --state-dir "$ITEST_DIR/state" "$@" > "$ITEST_DIR/musterd.log" 2>&1 &
    DAEMON_PID=$!
    ITEST_PIDS="$ITEST_PIDS $DAEMON_PID"
    wait_for 10 'True' || fail "musterd did not serve /v1/status within 10 s"
}

# start_relay SCRIPT [args]: a loopback relay to musterd's control port
# (python3 SCRIPT PORT $CTL args, logging to $ITEST_DIR/relay.log); sets
# RELAY (its port) and RELAY_PID, and returns once it accepts (5 s at most).
start_relay() {
    RELAY=$(free_port)
    _script=$1
    shift
    python3 "$_script" "$RELAY" "$CTL" "$@" > "$ITEST_DIR/relay.log" 2>&1 &
    RELAY_PID=$!
    ITEST_PIDS="$ITEST_PIDS $RELAY_PID"
    _i=0
    until python3 -c "import socket; socket.create_connection(('127.0.0.1', $RELAY), timeout=1).close()" 2>/dev/null ||
        [ $_i -ge 50 ]; do sleep 0.1; _i=$((_i + 1)); done
}

# start_agent NAME NDEV [extra args]: sets AGENT_PID; ranks write pids to $ITEST_DIR/pids-NAME.
start_agent() {
    name=$1; ndev=$2; shift 2
    mkdir -p "$ITEST_DIR/pids-$name"
    FAKE_RANK_PIDDIR="$ITEST_DIR/pids-$name" "$BUILD/muster-worker" --daemon "127.0.0.1:$CTL" \
        --node "$name" --devices "cpu:$ndev" --state-dir "$ITEST_DIR/agent-state" "$@" >> "$ITEST_DIR/agent-$name.log" 2>&1 &
    AGENT_PID=$!
    ITEST_PIDS="$ITEST_PIDS $AGENT_PID"
}

# start_pair_job SPEC: musterd on the job spec SPEC (token $ITEST_DIR/token)
# and agents a and b with 2 CPU ranks each, from fresh state (their PIDs in
# AGENT_A, AGENT_B); end_pair_job stops the three.
start_pair_job() {
    rm -rf "$ITEST_DIR/state" "$ITEST_DIR/agent-state"
    start_daemon "$1" --token-file "$ITEST_DIR/token"
    start_agent a 2 --token-file "$ITEST_DIR/token"
    AGENT_A=$AGENT_PID
    start_agent b 2 --token-file "$ITEST_DIR/token"
    AGENT_B=$AGENT_PID
}
end_pair_job() {
    kill "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
    wait "$DAEMON_PID" "$AGENT_A" "$AGENT_B" 2>/dev/null || true
}

# kept_pids AGENT_LOG PIDS GENERATION: each of PIDS finished GENERATION
# (never restarted); PIDS may not be empty.
kept_pids() {
    [ -n "$(echo $2)" ] || fail "kept_pids: no rank processes to check in $1"
    for p in $2; do
        grep -q "(pid $p, generation $3) exited with status 0" "$1" \
            || fail "rank process $p did not finish generation $3: it was restarted ($(grep "pid $p" "$1" | tail -n 2))"
    done
}

# rank_pids TAG: "RANK PID" of the live ranks running $SCRIPT with an
# argument under $ITEST_DIR/TAG, by rank (RANK from their environment).
rank_pids() {
    for p in $(pgrep -f "$SCRIPT.*$ITEST_DIR/$1" || true); do
        r=$(tr '\0' '\n' < "/proc/$p/environ" 2>/dev/null | sed -n 's/^RANK=//p') || continue
        [ -n "$r" ] && echo "$r $p"
    done | sort -n
}

# start_flap_job NAME NS DADDR: a 2-node job (heartbeat 200 ms, timeout 2 s)
# whose musterd listens on every address; node a's agent runs in network
# namespace NS and joins DADDR, node b's on loopback; returns once
# generation 1 runs its 4 ranks.
start_flap_job() {
    cat > "$ITEST_DIR/job.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 5, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 10000, "stop_grace_ms": 1000}
JSON
    make_token "$ITEST_DIR/token"
    _rank_cmd="$BUILD/tests/fake-rank --step-ms 50"
    start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token" --listen "0.0.0.0:0"
    # start_daemon chose a port for 127.0.0.1; the daemon listens on every address at the one it reports.
    CTL=$(sed -n 's/.*control 0\.0\.0\.0:\([0-9]*\),.*/\1/p' "$ITEST_DIR/musterd.log" | head -n 1)
    [ -n "$CTL" ] || fail "musterd did not say its control port"
    mkdir -p "$ITEST_DIR/pids-a"
    FAKE_RANK_PIDDIR="$ITEST_DIR/pids-a" ip netns exec "$2" "$BUILD/muster-worker" --daemon "$3:$CTL" --node a \
        --devices cpu:2 --state-dir "$ITEST_DIR/agent-state" --token-file "$ITEST_DIR/token" --rank-cmd "$_rank_cmd" \
        >> "$ITEST_DIR/agent-a.log" 2>&1 &
    ITEST_PIDS="$ITEST_PIDS $!"
    start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$_rank_cmd"
    wait_for 20 'd["state"] == "running" and d["generation"] == 1 and running == 4' || fail "generation 1 not running"
}

status() { curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/status"; }

# need_pids WHAT N PIDS: PIDS (a list of process IDs) holds exactly N, or fail.
need_pids() {
    [ "$(echo $3 | wc -w)" -eq "$2" ] || fail "$1: expected $2 rank processes, found ${3:-none}"
}

# uptime_bound: musterd's uptime now at most (s, counted from the moment
# start_daemon launched it): a status document whose uptime_s reaches it
# was built after this moment (the snapshot's figures are rebuilt at most
# once a second while read, every 5 s when not).
uptime_bound() { echo "$(now_ms) $DAEMON_T0" | awk '{ printf "%.3f\n", ($1 - $2) / 1000 }'; }

# check PYEXPR: true when the Python expression holds for d = /v1/status with
# d["ranks"] and d["nodes"] the lists of /v1/ranks and /v1/nodes (the summary
# leaves them out; they are read after it, and only when PYEXPR uses them:
# "ranks", running, node). With ITEST_FRESH set (an uptime_bound), false
# for a document built before that moment. (tests/itest_poll.py)
ITEST_POLL="python3 $(pwd)/tests/itest_poll.py"
check() { $ITEST_POLL status "$HTTP" "$1" 2>/dev/null; }

# wait_fresh SECONDS PYEXPR: wait_for on documents built after this call
# (of a musterd started by start_daemon).
wait_fresh() {
    _since=$(uptime_bound)
    ITEST_FRESH=$_since wait_for "$1" "$2"
}

# wait_for SECONDS PYEXPR: check, every 50 ms, for SECONDS at most, in one
# Python process (a start per look cost a core on polling).
wait_for() { $ITEST_POLL status "$HTTP" "$2" "$1" 2>/dev/null; }

show_status() { python3 -c '
import json, sys, urllib.request
base = "http://127.0.0.1:%s" % sys.argv[1]
d = json.load(urllib.request.urlopen(base + "/v1/status", timeout=2))
print("state=%s generation=%s world_size=%s restarts=%s reason=%s" % (d["state"], d["generation"], d["world_size"], d["restarts"], d["reason"]))
for r in json.load(urllib.request.urlopen(base + "/v1/ranks", timeout=2))["ranks"]:
    print("  rank %d node %s local %d %s step %s" % (r["rank"], r["node"], r["local_rank"], r["state"], r["step"]))' "$HTTP"
}

pid_alive() { kill -0 "$1" 2>/dev/null; }

# stop_all: every process started (ITEST_PIDS) gets SIGTERM, 5 s to exit, then SIGKILL.
stop_all() {
    for p in $ITEST_PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $ITEST_PIDS; do
        i=0; while pid_alive "$p" && [ $i -lt 100 ]; do sleep 0.05; i=$((i + 1)); done
        kill -9 "$p" 2>/dev/null || true
    done
    ITEST_PIDS=""
}

# wait_exit PID SECONDS: true once PID is gone (polls every 50 ms).
wait_exit() {
    i=0
    while pid_alive "$1" && [ $i -lt $(( $2 * 20 )) ]; do sleep 0.05; i=$((i + 1)); done
    ! pid_alive "$1"
}

# ranks_of AGENT_PID: its muster-train children, PIDs ascending on one line.
ranks_of() { pgrep -P "$1" -f muster-train | sort -n | tr '\n' ' '; }

# wait_event SECONDS PATTERN: polls /v1/events until PATTERN matches (the
# document is one line: a pattern meant for one event's fields belongs in
# event_matching).
wait_event() {
    limit=$(( $1 * 20 )); i=0
    while [ $i -lt $limit ]; do
        curl -sf --max-time 2 "http://127.0.0.1:$HTTP/v1/events" | grep -q "$2" && return 0
        sleep 0.05; i=$((i + 1))
    done
    return 1
}

# event_matching PYEXPR [FILE]: the events of /v1/events (or of FILE, a
# saved copy) for which PYEXPR holds with e one event (e["kind"], e["rank"],
# e["node"], e["generation"], e["message"], e["seq"]), one JSON line each;
# false when none does (the document is one line: parse it, never grep it).
event_matching() {
    if [ -n "${2:-}" ]; then
        $ITEST_POLL events-file "$2" "$1" 2>/dev/null
    else
        $ITEST_POLL events "$HTTP" "$1" 2>/dev/null
    fi
}

# event_message KIND GEN [SECONDS]: the message of generation GEN's newest
# event of KIND (rank_hung, rank_stacks, ...), waiting SECONDS at most for
# one (polled every 50 ms, in one process); "" when none came.
event_message() {
    $ITEST_POLL message "$HTTP" "e.get('kind') == '$1' and e.get('generation') == $2" ${3:+"$3"} 2>/dev/null || true
}

# wait_event_matching SECONDS PYEXPR: event_matching every 100 ms, in one process.
wait_event_matching() { $ITEST_POLL events "$HTTP" "$2" "$1" 0.1 > /dev/null 2>&1; }

# rank_steps LOG RANK: the steps RANK logged ("rank RANK: step N loss L"
# lines of an agent's LOG), as "N L" lines in log order.
rank_steps() { sed -n "s/^rank $2: step \([0-9]*\) loss \([-0-9.e]*\).*/\1 \2/p" "$1"; }

# same_steps STEPS RUN REF: RUN and REF (files of rank_steps lines) each log
# steps 1..STEPS once, in order (no completed step lost and redone, none
# skipped), with losses equal within TOL (1e-5: they are printed to 6 places).
same_steps() {
    python3 - "$@" <<'PY'
import sys
steps, run, ref = int(sys.argv[1]), sys.argv[2], sys.argv[3]
tol = 1e-5
def read(path):
    rows = [l.split() for l in open(path) if l.strip()]
    got = [int(r[0]) for r in rows]
    if got != list(range(1, steps + 1)):
        redone = sorted({s for s in got if got.count(s) > 1})
        missing = sorted(set(range(1, steps + 1)) - set(got))
        sys.exit("%s: %d step lines, not steps 1..%d once each (redone %s, missing %s)"
                 % (path, len(got), steps, redone[:10], missing[:10]))
    return [float(r[1]) for r in rows]
a, b = read(run), read(ref)
bad = [(i + 1, x, y) for i, (x, y) in enumerate(zip(a, b)) if abs(x - y) > tol]
if bad:
    sys.exit("%d steps' losses differ from the reference's by more than %g, first (step, run, ref) %s"
             % (len(bad), tol, bad[:3]))
PY
}
