#!/bin/sh
# A leader cut from etcd by a network partition steps down, and the job goes
# on under the standby. musterd 1 runs in network namespace P, joined to the
# root namespace by two veth pairs: one that agents reach it over, one that
# it reaches the three etcd members (loopback ports, also served at the root
# side's address) over. musterd 2 (root namespace) stands by; 2 agents x 2
# fake ranks run the job under musterd 1. Then the etcd link goes down (its
# root side: both ends lose carrier), the agents' link stays up:
#  - musterd 1 stops acting and steps down (exits) before musterd 2 leads;
#  - musterd 2 leads, the agents re-join it, and the job goes on in
#    generation 1 (training never stops), reached through musterd 2's REST.
# Needs root, network namespaces and etcd; skipped with a message otherwise.
# itest: solo
set -eu
. tests/itest-lib.sh
. tests/etcd-cluster.sh

NSP=muster-part-$$
VC=mpc$$  # root side of the agents' link
VCP=mpcp$$
VE=mpe$$  # root side of the etcd link
VEP=mpep$$
O3=$(( 100 + $$ % 50 )); O4=$(( ($$ / 50) % 250 ))
CROOT=10.$O3.$O4.1; CLEAD=10.$O3.$O4.2
EROOT=10.$O3.$O4.5; ELEAD=10.$O3.$O4.6

netns_cleanup() {
    ip link del "$VC" 2>/dev/null || true
    ip link del "$VE" 2>/dev/null || true
    ip netns del "$NSP" 2>/dev/null || true
}
trap 'netns_cleanup; cleanup' EXIT INT TERM
skip() {
    cannot_run failover_partition "$*"
    exit 0
}
etcd_need failover_partition
command -v ip > /dev/null || skip "no ip(8)"
ip netns add "$NSP" 2>/dev/null || skip "network namespaces are not permitted here (ip netns add failed; needs root / CAP_SYS_ADMIN)"
ip link add "$VC" type veth peer name "$VCP" netns "$NSP" 2>/dev/null || skip "cannot create a veth pair (needs CAP_NET_ADMIN)"
ip link add "$VE" type veth peer name "$VEP" netns "$NSP"
ip addr add "$CROOT/30" dev "$VC"; ip link set "$VC" up
ip addr add "$EROOT/30" dev "$VE"; ip link set "$VE" up
ip netns exec "$NSP" sh -e -c "ip link set lo up; ip addr add $CLEAD/30 dev $VCP; ip link set $VCP up;
    ip addr add $ELEAD/30 dev $VEP; ip link set $VEP up"

ETCD_EXTRA_HOST=$EROOT
etcd_start
echo "etcd: three members at $ETCD_ENDPOINTS (and at $EROOT, for namespace $NSP)"
make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/part.json" <<JSON
{"name": "part", "nodes": 2, "max_restarts": 2, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 3000, "lease_ms": 15000, "stop_grace_ms": 1000}
JSON

CTL1=$(free_port); HTTP1=$(free_port); CTL2=$(free_port); HTTP2=$(free_port)
ip netns exec "$NSP" "$BUILD/musterd" --job "$ITEST_DIR/part.json" --listen "$CLEAD:$CTL1" --http "$CLEAD:$HTTP1" \
    --state-dir "$ITEST_DIR/state1" --token-file "$ITEST_DIR/token" \
    --store "etcd://$(echo "$ETCD_ENDPOINTS" | sed "s/127\.0\.0\.1/$EROOT/g")" >> "$ITEST_DIR/musterd1.log" 2>&1 &
D1=$!; ITEST_PIDS="$ITEST_PIDS $D1"
wait_log 20 "$ITEST_DIR/musterd1.log" "leading job part" || fail "musterd 1 (namespace $NSP) did not lead within 20 s"
"$BUILD/musterd" --job "$ITEST_DIR/part.json" --listen "127.0.0.1:$CTL2" --http "127.0.0.1:$HTTP2" \
    --state-dir "$ITEST_DIR/state2" --token-file "$ITEST_DIR/token" --store "etcd://$ETCD_ENDPOINTS" \
    >> "$ITEST_DIR/musterd2.log" 2>&1 &
D2=$!; ITEST_PIDS="$ITEST_PIDS $D2"
wait_log 10 "$ITEST_DIR/musterd2.log" "standing by: $CLEAD:$CTL1 leads" || fail "musterd 2 did not stand by within 10 s"

RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"
CTL=$CTL2 # start_agent's default daemon; the list given below wins
for n in a b; do
    start_agent "$n" 2 --daemon "$CLEAD:$CTL1,127.0.0.1:$CTL2" --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
done
# Through musterd 2's REST: it redirects to the leader's (urllib follows).
HTTP=$HTTP2
wait_for 60 'd["state"] == "running" and d["step"] is not None and d["step"] >= 10' \
    || fail "the job did not run to step 10 under musterd 1 within 60 s"
step=$(curl -sfL --max-time 2 "http://127.0.0.1:$HTTP2/v1/status" | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')

ms() { echo $(( $(date +%s%N) / 1000000 )); }
ip link set "$VE" down; t_cut=$(ms)
echo "cut musterd 1 from etcd at step $step (the agents' link stays up)"
# Who goes first: musterd 1 must have stopped before musterd 2 leads. Each
# round looks for musterd 2's lead first, then for musterd 1's step-down: a
# lead seen before the step-down is an overlap of two leaders (one longer
# than a round, ~10 ms, cannot pass; both within one round count as equal).
t_down=""; t_lead=""; i=0
while [ -z "$t_lead" ]; do
    grep -q "leading job part" "$ITEST_DIR/musterd2.log" && t_lead=$(ms)
    [ -z "$t_down" ] && grep -q "no longer leading job part" "$ITEST_DIR/musterd1.log" && t_down=${t_lead:-$(ms)}
    [ -n "$t_lead" ] && [ -z "$t_down" ] && fail "musterd 2 led before the partitioned musterd 1 stepped down"
    i=$((i + 1)); [ $i -lt 2000 ] || fail "after 20 s: musterd 1 stepped down at '${t_down:-never}', musterd 2 led at '${t_lead:-never}'"
    sleep 0.01
done
echo "musterd 1 stepped down $((t_down - t_cut)) ms after the cut; musterd 2 led $((t_lead - t_cut)) ms after it"
grep "no longer leading job part" "$ITEST_DIR/musterd1.log" | grep -q "keepalive" \
    || fail "musterd 1 did not say its keepalives went unanswered: $(grep 'no longer leading' "$ITEST_DIR/musterd1.log")"
wait_exit "$D1" 10 || fail "the partitioned musterd 1 did not exit"
grep -q "store: no quorum" "$ITEST_DIR/musterd1.log" && fail "musterd 1 took the partition for a quorum loss"
i=0; until [ "$(grep -c "joined daemon at 127.0.0.1:$CTL2 " "$ITEST_DIR/agent-a.log")" -ge 1 ] &&
           [ "$(grep -c "joined daemon at 127.0.0.1:$CTL2 " "$ITEST_DIR/agent-b.log")" -ge 1 ]; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the agents did not re-join musterd 2 within 15 s"; sleep 0.05; done
echo "agents re-joined musterd 2 $(( $(ms) - t_cut )) ms after the cut"
wait_for 20 'd["state"] == "running" and d["generation"] == 1 and d["store"]["role"] == "leader" and d["step"] > '"$step" \
    || { show_status >&2 || true; fail "training did not go on in generation 1 under musterd 2"; }
! grep -h "generation [2-9]" "$ITEST_DIR/agent-a.log" "$ITEST_DIR/agent-b.log" || fail "an agent saw a generation other than 1"
ip link set "$VE" up
echo "failover_partition: ok"
