# Three etcd members on loopback for the integration scripts (sourced, POSIX
# sh, after tests/itest-lib.sh). etcd_start sets ETCD_ENDPOINTS
# ("127.0.0.1:P1,127.0.0.1:P2,127.0.0.1:P3"), ETCD_PIDS (one per member,
# in order) and ETCD_CLIENT1..3; the members live in $ITEST_DIR/etcd and
# die with the test's cleanup. With ETCD_EXTRA_HOST set, they serve clients
# at that address too (the same ports). Every wait is bounded.

# etcd_need: skips the calling script (exit 0, with a message) without etcd.
etcd_need() {
    command -v etcd > /dev/null && return 0
    [ -n "${CI:-}" ] && fail "$1: no etcd installed; mk/deps.sh build installs it for make check"
    echo "SKIP: $1: no etcd (Debian: apt-get install etcd-server)"; exit 0
}

etcd_start() {
    ETCD_PIDS=""; ETCD_ENDPOINTS=""; cluster=""
    for i in 1 2 3; do
        c=$(free_port); p=$(free_port)
        eval "ETCD_CLIENT$i=$c; ETCD_PEER$i=$p"
        cluster="${cluster:+$cluster,}m$i=http://127.0.0.1:$p"
        ETCD_ENDPOINTS="${ETCD_ENDPOINTS:+$ETCD_ENDPOINTS,}127.0.0.1:$c"
    done
    ETCD_CLUSTER=$cluster
    for i in 1 2 3; do
        etcd_member "$i"
        ETCD_PIDS="$ETCD_PIDS $ETCD_PID"
    done
    # Healthy = a write through each member commits (so a leader is elected).
    for i in 1 2 3; do
        eval "c=\$ETCD_CLIENT$i"
        n=0
        until curl -sf --max-time 2 -X POST -d '{"key":"bXVzdGVyLXByb2Jl","value":"MQ=="}' \
                "http://127.0.0.1:$c/v3/kv/put" > /dev/null 2>&1; do
            n=$((n + 1))
            [ "$n" -lt 100 ] || fail "etcd member m$i (127.0.0.1:$c) did not serve within 20 s"
            sleep 0.2
        done
    done
}

# etcd_member N: starts member N (1..3) in the background, from its data
# directory when it has one (a restart: it rejoins); sets ETCD_PID.
etcd_member() {
    eval "c=\$ETCD_CLIENT$1; p=\$ETCD_PEER$1"
    mkdir -p "$ITEST_DIR/etcd/m$1"
    # Short heartbeat and election timeouts: a member lost is noticed in a second.
    etcd --name "m$1" --data-dir "$ITEST_DIR/etcd/m$1" \
        --listen-client-urls "http://127.0.0.1:$c${ETCD_EXTRA_HOST:+,http://$ETCD_EXTRA_HOST:$c}" \
        --advertise-client-urls "http://127.0.0.1:$c" \
        --listen-peer-urls "http://127.0.0.1:$p" --initial-advertise-peer-urls "http://127.0.0.1:$p" \
        --initial-cluster "$ETCD_CLUSTER" --initial-cluster-state new --initial-cluster-token "muster-$$" \
        --heartbeat-interval 100 --election-timeout 1000 --log-level error \
        >> "$ITEST_DIR/etcd-m$1.log" 2>&1 &
    ETCD_PID=$!
    ITEST_PIDS="$ITEST_PIDS $!"
}

# etcd_restart N: member N, killed before, runs again; ETCD_PIDS follows.
etcd_restart() {
    old=$(etcd_member_pid "$1")
    etcd_member "$1"
    ETCD_PIDS=$(echo $ETCD_PIDS | sed "s/\b$old\b/$ETCD_PID/")
}

# etcd_member_pid N: the pid of member N (1..3).
etcd_member_pid() { echo $ETCD_PIDS | cut -d' ' -f"$1"; }

# etcd_stop: every member, SIGTERM then (after 5 s) SIGKILL.
etcd_stop() {
    for p in $ETCD_PIDS; do kill "$p" 2>/dev/null || true; done
    for p in $ETCD_PIDS; do
        n=0
        while kill -0 "$p" 2>/dev/null && [ "$n" -lt 50 ]; do sleep 0.1; n=$((n + 1)); done
        kill -9 "$p" 2>/dev/null || true
    done
}
