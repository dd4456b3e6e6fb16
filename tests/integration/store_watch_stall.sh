#!/bin/sh
# A standby whose watch of the leader key sits on an etcd member that stops
# answering (SIGSTOP: its sockets stay open, so neither TCP nor the stream
# says anything) still takes over when the leader dies: a watch silent for a
# TTL is checked with a read that needs etcd's quorum, which the stopped
# member cannot give, and the standby moves to the next member. Three etcd
# members on loopback, two musterd without agents; musterd 2 lists the
# member to be stopped first (its watch goes there). Skipped without etcd.
# itest: solo
set -eu
. tests/itest-lib.sh
. tests/etcd-cluster.sh

etcd_need store_watch_stall
etcd_start
make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/stall.json" <<JSON
{"name": "stall", "nodes": 1, "max_restarts": 1}
JSON
STOPPED=0
trap '[ "$STOPPED" = 0 ] || kill -CONT "$(etcd_member_pid 3)" 2>/dev/null; cleanup' EXIT INT TERM

# musterd_store N MEMBERS: musterd number N with the store's members in that order; sets Dn.
musterd_store() {
    "$BUILD/musterd" --job "$ITEST_DIR/stall.json" --listen "127.0.0.1:$(free_port)" --http "127.0.0.1:$(free_port)" \
        --state-dir "$ITEST_DIR/state$1" --token-file "$ITEST_DIR/token" --store "etcd://$2" \
        >> "$ITEST_DIR/musterd$1.log" 2>&1 &
    eval "D$1=$!"
    ITEST_PIDS="$ITEST_PIDS $!"
}
M1=127.0.0.1:$ETCD_CLIENT1; M2=127.0.0.1:$ETCD_CLIENT2; M3=127.0.0.1:$ETCD_CLIENT3
musterd_store 1 "$M1,$M2,$M3"
wait_log 20 "$ITEST_DIR/musterd1.log" "leading job stall" || fail "musterd 1 did not lead within 20 s"
CTL1=$(sed -n 's/.*running for leader as \([^ ]*\) .*/\1/p' "$ITEST_DIR/musterd1.log" | head -n 1)
musterd_store 2 "$M3,$M1,$M2"
wait_log 10 "$ITEST_DIR/musterd2.log" "standing by: $CTL1 leads" || fail "musterd 2 did not stand by within 10 s"
sleep 0.5 # its watch is set up on member 3

kill -STOP "$(etcd_member_pid 3)"; STOPPED=1
kill -9 "$D1"; t_kill=$(now_ms)
echo "stopped etcd member m3 (musterd 2's watch) and SIGKILLed the leader"
# The lease's TTL (3 s), a silent watch's TTL, a read timed out (1 s), the
# other members' raft election if m3 led etcd: 10 s is plenty.
wait_log 15 "$ITEST_DIR/musterd2.log" "leading job stall" \
    || fail "musterd 2 did not lead within 15 s of the leader's death while its watch's etcd member was stopped"
echo "musterd 2 led $(( $(now_ms) - t_kill )) ms after the leader's SIGKILL"
grep -q "etcd member http://127.0.0.1:$ETCD_CLIENT3: " "$ITEST_DIR/musterd2.log" \
    || fail "musterd 2 did not say it left the stopped member"
kill -CONT "$(etcd_member_pid 3)"; STOPPED=0
echo "store_watch_stall: ok"
