#!/bin/sh
# Link flaps between musterd and an agent, through a router: node a's agent
# lives in network namespace A, which reaches musterd (root namespace)
# through namespace R, a router joined to each side by a veth pair. The link
# is cut by blackhole routes in R: every packet either way leaves its host
# and is dropped on the way, as by a switch, so both ends' TCP backs off its
# retransmissions (0.2, 0.6, 1.4, 3 s after the first lost segment) while
# their interfaces and neighbour caches stay as they were. Node b's agent
# is on loopback. Nothing needs sch_netem or a firewall.
#  - 3 cuts of 1.5 s, shorter than heartbeat_timeout_ms (2 s) minus a
#    heartbeat interval and the reconnect: no restart, generation 1
#    throughout, every rank running after each (the agent notices the stall
#    and resumes its session on a new connection, the daemon hands the node
#    over without a loss). Without that, the backoff stretches about half of
#    such cuts past the timeout;
#  - one cut of 4 s, longer than the timeout: node a is lost, generation 2
#    opens, and the job runs again once the link is back.
# Needs root and network namespaces (ip netns); skipped with a message where
# they are not permitted.
# itest: solo
set -eu
. tests/itest-lib.sh

NSA=muster-flapa-$$
NSR=muster-flapr-$$
VD=mfd$$  # daemon side of the daemon-router pair (root namespace)
VA=mfa$$  # agent side of the router-agent pair (in $NSA)
O3=$(( 200 + $$ % 50 )); O4=$(( ($$ / 50) % 250 ))
DADDR=10.$O3.$O4.1 # musterd
RADDR=10.$O3.$O4.2 # the router, daemon side
GADDR=10.$O3.$O4.5 # the router, agent side
AADDR=10.$O3.$O4.6 # the agent

netns_cleanup() {
    ip link del "$VD" 2>/dev/null || true
    ip netns del "$NSA" 2>/dev/null || true
    ip netns del "$NSR" 2>/dev/null || true
}
trap 'netns_cleanup; cleanup' EXIT INT TERM

skip() {
    cannot_run link_flap "$*"
    exit 0
}
command -v ip > /dev/null || skip "no ip(8)"
ip netns add "$NSR" 2>/dev/null || skip "network namespaces are not permitted here (ip netns add failed; needs root / CAP_SYS_ADMIN)"
ip netns add "$NSA" || skip "cannot add a second network namespace"
ip link add "$VD" type veth peer name r1$$ 2>/dev/null || skip "cannot create a veth pair (needs CAP_NET_ADMIN)"
ip link add r2$$ netns "$NSR" type veth peer name "$VA" netns "$NSA"
ip link set r1$$ netns "$NSR"
ip addr add "$DADDR/30" dev "$VD"
ip link set "$VD" up
ip route add "$AADDR/32" via "$RADDR"
ip netns exec "$NSR" sh -e -c "
    ip link set lo up
    ip addr add $RADDR/30 dev r1$$; ip link set r1$$ up
    ip addr add $GADDR/30 dev r2$$; ip link set r2$$ up
    sysctl -q -w net.ipv4.ip_forward=1"
ip netns exec "$NSA" sh -e -c "
    ip link set lo up
    ip addr add $AADDR/30 dev $VA; ip link set $VA up
    ip route add default via $GADDR"

start_flap_job flap "$NSA" "$DADDR"
echo "generation 1 running: node a in namespace $NSA, behind router $NSR"

cut() { # SECONDS: the router drops everything between musterd and node a
    ip netns exec "$NSR" ip route add blackhole "$AADDR/32"
    ip netns exec "$NSR" ip route add blackhole "$DADDR/32"
    sleep "$1"
    ip netns exec "$NSR" ip route del blackhole "$AADDR/32"
    ip netns exec "$NSR" ip route del blackhole "$DADDR/32"
}

CUT_S=${CUT_S:-1.5} # tolerated here: heartbeat_timeout_ms - heartbeat_interval_ms - ~0.1 s = 1.7 s
n=0
while [ $n -lt 3 ]; do
    n=$((n + 1))
    cut "$CUT_S"
    # Back within the timeout: the node is joined again, nothing restarted, in
    # a status built since the cut ended (the one before may be older than the cut).
    wait_fresh 5 'node["a"]["state"] == "joined" and node["a"]["heartbeat_age_ms"] < 1000 and running == 4' ||
        { show_status; fail "flap $n: node a not back and running within 5 s"; }
    check 'd["generation"] == 1 and d["restarts"] == 0 and d["state"] == "running"' ||
        { show_status; fail "flap $n ($CUT_S s, under heartbeat_timeout_ms 2 s) cost a restart"; }
    # each flap bridged by a session resumed on a new connection: one more each time
    resumed=$(event_matching '"node a resumed its session" in e["message"]' | grep -c . || true)
    [ "$resumed" -eq $n ] || fail "flap $n: $resumed resumed sessions in all, expected $n (one per flap)"
    echo "flap $n: link cut $CUT_S s, generation 1 kept, no restart, session resumed"
    sleep 1
done
event_matching '"node a resumed its session" in e["message"]' |
    python3 -c 'import json, sys; [print("  " + json.loads(l)["message"]) for l in sys.stdin]'

cut 4
wait_for 10 'd["generation"] == 2 and d["restarts"] == 1' || { show_status; fail "a 4 s outage did not open generation 2"; }
wait_for 15 'd["state"] == "running" and d["generation"] == 2 and running == 4 and node["a"]["state"] == "joined"' ||
    { show_status; fail "the job did not run again after the 4 s outage"; }
echo "outage 4 s (over the timeout): node a lost, generation 2 running after the link came back"
echo "link flaps: ok ($resumed sessions resumed, one per flap)"
