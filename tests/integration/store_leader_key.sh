#!/bin/sh
# The leader watches its own key in etcd (three members on loopback): with
# its lease alive,
#  1. the leader key deleted with etcdctl: the leader steps down within
#     about a second of etcdctl's return (2.5 s allowed under load; not at
#     its next refused write, which an idle job may never make), and the
#     standby is elected;
#  2. the new leader's key overwritten with etcdctl put: it steps down too.
# Skipped with a message where etcd or etcdctl is not installed.
set -eu
. tests/itest-lib.sh
. tests/etcd-cluster.sh

etcd_need store_leader_key
command -v etcdctl > /dev/null || {
    [ -n "${CI:-}" ] && fail "store_leader_key: no etcdctl installed; mk/deps.sh build installs it for make check"
    echo "SKIP: store_leader_key: no etcdctl"; exit 0
}
make_token "$ITEST_DIR/token"
echo '{"name": "lk", "nodes": 1, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 1500}' > "$ITEST_DIR/lk.json"
etcd_start
E="http://127.0.0.1:$ETCD_CLIENT1"
KEY=/muster/lk/leader

# musterd_ha N: musterd number N with the store (a lease of 10 s: far longer
# than the step-down asked for), logging to musterdN.log; sets Dn.
musterd_ha() {
    "$BUILD/musterd" --job "$ITEST_DIR/lk.json" --listen "127.0.0.1:$(free_port)" --http "127.0.0.1:$(free_port)" \
        --state-dir "$ITEST_DIR/state$1" --token-file "$ITEST_DIR/token" --store "etcd://$ETCD_ENDPOINTS" \
        --config "$ITEST_DIR/ha.json" >> "$ITEST_DIR/musterd$1.log" 2>&1 &
    eval "D$1=$!"
    ITEST_PIDS="$ITEST_PIDS $!"
}
echo '{"store_lease_s": "10"}' > "$ITEST_DIR/ha.json"

musterd_ha 1
wait_log 20 "$ITEST_DIR/musterd1.log" "leading job lk" || fail "musterd 1 did not lead"
musterd_ha 2
wait_log 20 "$ITEST_DIR/musterd2.log" "standing by" || fail "musterd 2 did not stand by"
sleep 1
grep -q "leading job lk" "$ITEST_DIR/musterd2.log" && fail "two leaders at once"

# 1. deleted: step down at once, the standby leads
etcdctl --endpoints "$E" del "$KEY" > /dev/null || fail "etcdctl del $KEY"
t0=$(now_ms) # the key is gone once etcdctl returns: its own start (a Go program, slow under load) is not counted
wait_log 5 "$ITEST_DIR/musterd1.log" "stepping down" || fail "musterd 1 did not step down when its key was deleted"
dt=$(( $(now_ms) - t0 ))
[ "$dt" -le 2500 ] || fail "musterd 1 stepped down $dt ms after its key was deleted (lease 10 s; want about 1 s)"
grep -q "leader key $KEY was deleted in etcd" "$ITEST_DIR/musterd1.log" || fail "musterd 1 does not say why it stepped down"
echo "key deleted: musterd 1 stepped down after $dt ms"
wait_log 10 "$ITEST_DIR/musterd2.log" "leading job lk" || fail "musterd 2 did not take over"

# 2. overwritten: step down too
etcdctl --endpoints "$E" put "$KEY" "127.0.0.1:1 http://127.0.0.1:1" > /dev/null || fail "etcdctl put $KEY"
t0=$(now_ms)
wait_log 5 "$ITEST_DIR/musterd2.log" "stepping down" || fail "musterd 2 did not step down when its key was overwritten"
dt=$(( $(now_ms) - t0 ))
[ "$dt" -le 2500 ] || fail "musterd 2 stepped down $dt ms after its key was overwritten"
echo "key overwritten: musterd 2 stepped down after $dt ms"
echo "store_leader_key: ok"
