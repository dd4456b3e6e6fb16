#!/bin/sh
# Link flaps without network namespaces: node a's agent reaches musterd
# through tests/flap-relay.py, a loopback relay that cuts the link on
# SIGUSR1 and restores it on SIGUSR2, after which the connections that lived
# through the cut stay silent 3 s more, as TCP's retransmission backoff keeps
# them after a real cut. A connection's own recovery therefore comes too
# late for heartbeat_timeout_ms (2 s); only a new one can be in time.
#  - 3 cuts of 1.2 s: no restart, generation 1 throughout, the node's session
#    resumed each time;
#  - 2 cuts of 1.2 s in which a rank of node a crashes (SIGUSR1 makes
#    fake-rank exit 3 with its own message), 0.2 s into the cut (the agent
#    still takes the link for up: the RANK_EXIT goes into the stalled
#    connection) and 0.9 s into it (the agent has set the link aside: the
#    exit waits): each time the resumed session carries the exit, and the
#    next generation names the rank and its own reason, not "came back
#    without its ranks";
#  - a cut of 3 s, longer than the timeout: node a is lost, generation 4
#    opens and runs once the link is back.
# Runs anywhere (python3 on loopback); link_flap.sh does the same through
# a real router namespace where namespaces are permitted.
# itest: solo
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "flap-relay", "nodes": 2, "max_restarts": 5, "heartbeat_interval_ms": 200,
 "heartbeat_timeout_ms": 2000, "lease_ms": 10000, "stop_grace_ms": 1000}
JSON
make_token "$ITEST_DIR/token"
RANK_CMD="$BUILD/tests/fake-rank --step-ms 50"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_relay tests/flap-relay.py --stall-s 3 --life-s 120

real_ctl=$CTL
CTL=$RELAY start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
CTL=$real_ctl
start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
wait_for 20 'd["state"] == "running" and d["generation"] == 1 and running == 4' || fail "generation 1 not running"
echo "generation 1 running: node a through the relay"

cut() { # SECONDS
    kill -USR1 "$RELAY_PID"
    sleep "$1"
    kill -USR2 "$RELAY_PID"
}

n=0
while [ $n -lt 3 ]; do
    n=$((n + 1))
    cut 1.2
    # a status built since the cut ended (the one before may be older than the cut)
    wait_fresh 5 'node["a"]["state"] == "joined" and node["a"]["heartbeat_age_ms"] < 1000 and running == 4' ||
        { show_status; fail "flap $n: node a not back and running within 5 s"; }
    check 'd["generation"] == 1 and d["restarts"] == 0 and d["state"] == "running"' ||
        { show_status; fail "flap $n (1.2 s, the old connection silent 3 s more) cost a restart"; }
    echo "flap $n: link cut 1.2 s, generation 1 kept, no restart"
    sleep 1
done
resumed=$(event_matching '"node a resumed its session" in e["message"]' || true)
echo "$resumed" | sed 's/^/  /'
[ "$(echo "$resumed" | grep -c .)" -eq 3 ] || fail "expected 3 resumed sessions"

crash_in_cut() { # GENERATION SECONDS_INTO_THE_CUT SECONDS_AFTER_IT
    pid=$(cat "$ITEST_DIR/pids-a/rank-1.pid")
    pid_alive "$pid" || fail "rank 1 of node a (pid $pid) is not running"
    kill -USR1 "$RELAY_PID"
    sleep "$2"
    kill -USR1 "$pid"
    sleep "$3"
    kill -USR2 "$RELAY_PID"
    next=$(($1 + 1))
    wait_for 10 "d['generation'] == $next" || { show_status; fail "rank 1's crash in a cut did not open generation $next"; }
    check "((d['last_failure'] or {}).get('rank') == 1 and d['last_failure']['node'] == 'a' and
           d['last_failure']['generation'] == $1 and d['last_failure']['how'] == 'exited with status 3' and
           'as asked (SIGUSR1)' in (d['last_failure']['reason'] or ''))" ||
        { status; echo; fail "generation $next: the failure is not rank 1's own exit (lost in the cut?)"; }
    if event_matching '"came back without its ranks" in e["message"]' > /dev/null; then
        fail "generation $1 failed as 'came back without its ranks': rank 1's exit was lost"
    fi
    wait_for 15 "d['state'] == 'running' and d['generation'] == $next and running == 4" ||
        { show_status; fail "generation $next not running after rank 1's crash"; }
    echo "crash ${2} s into a 1.2 s cut: generation $next opened for rank 1's own exit ($(status |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["last_failure"]["reason"])'))"
}
crash_in_cut 1 0.2 1.0
sleep 1
crash_in_cut 2 0.9 0.3
sleep 1

cut 3
wait_for 10 'd["generation"] == 4 and d["restarts"] == 3' || { show_status; fail "a 3 s outage did not open generation 4"; }
wait_for 15 'd["state"] == "running" and d["generation"] == 4 and running == 4 and node["a"]["state"] == "joined"' ||
    { show_status; fail "the job did not run again after the 3 s outage"; }
echo "outage 3 s (over the timeout): node a lost, generation 4 running after the link came back"
echo "link flaps through the relay: ok"
