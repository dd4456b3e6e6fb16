#!/bin/sh
# Two musterd for one job, its state in etcd (three members on loopback):
# 2 agents x 2 muster-train ranks train the small model (ZeRO-3 over the
# ring) while
#  1. the leader is SIGKILLed: the standby is elected, loads the state and
#     the agents (given both daemons) re-join it; training goes on in
#     generation 1 (0 steps lost);
#     musterctl given both musterd reaches the leader, and a standby's REST
#     redirects to the leader's; a rank SIGKILLed then heals in place in
#     generation 2 under the new leader;
#  2. one etcd member of three is killed: nothing happens;
#  3. a second etcd member is killed (no quorum): the leader holds the
#     running generation past its lease's TTL and goes on when the member
#     is back;
#  4. the new leader is SIGSTOPped past its lease, then SIGCONTed: the
#     other musterd (restarted as a standby, as systemd would) leads, the
#     stopped one steps down when it runs again, and no frame of its is
#     taken: every agent follows leaders of increasing terms and sees
#     generations 1 and 2 only, in that order.
# Ten steps after the last fault the job is stopped, and the loss of that
# step must equal an uninterrupted run's bit for bit (the reference runs
# after, as far as that step only: same job, same schedule).
# Skipped with a message where etcd is not installed.
# itest: solo
set -eu
. tests/itest-lib.sh
. tests/etcd-cluster.sh

etcd_need failover_etcd
need_data
make_token "$ITEST_DIR/token"
make_token "$ITEST_DIR/admin"
# Enough steps that the job still runs when the last fault is over, on a quiet
# machine too (about 12 steps a second there: the faults take some 35 s).
STEPS=${FAILOVER_STEPS:-500}

job() { # NAME
    cat > "$ITEST_DIR/$1.json" <<JSON
{"name": "$1", "nodes": 2, "max_restarts": 2, "model": "small", "data": "$DATA",
 "steps": $STEPS, "batch": 8, "lr": 0.003, "warmup_steps": 5, "eval_every": 0, "seed": 7,
 "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 3000, "lease_ms": 15000, "restart_backoff_ms": 0}
JSON
}

# ranks_step: the last step the ranks logged (rank 0's metrics, written
# after each step): the step now, not a status snapshot's (up to 5 s old).
ranks_step() { sed -n 's/^{"step": \([0-9]*\), "loss".*/\1/p' "$ITEST_DIR/ha.metrics" | tail -n 1; }

loss_at() { # METRICS STEP: the loss of that step, full precision
    grep "\"step\": $2, \"loss\"" "$1" | tail -n 1 | python3 -c 'import json,sys; print(repr(json.loads(sys.stdin.read())["loss"]))'
}
# steps_to METRICS STEP SECONDS: METRICS (rank 0's) has reached STEP within SECONDS.
steps_to() {
    i=0
    while [ $i -lt $(( $3 * 20 )) ]; do
        [ "$(sed -n 's/^{"step": \([0-9]*\), "loss".*/\1/p' "$1" 2>/dev/null | tail -n 1)" -ge "$2" ] 2>/dev/null && return 0
        sleep 0.05; i=$((i + 1))
    done
    return 1
}

# musterd_ha N JOB: musterd number N (1 or 2) with the store; sets CTLn, HTTPn, Dn.
musterd_ha() {
    eval "ctl=\${CTL$1:-}; http=\${HTTP$1:-}"
    [ -n "$ctl" ] || ctl=$(free_port)
    [ -n "$http" ] || http=$(free_port)
    "$BUILD/musterd" --job "$2" --listen "127.0.0.1:$ctl" --http "127.0.0.1:$http" --state-dir "$ITEST_DIR/state$1" \
        --token-file "$ITEST_DIR/token" --admin-token-file "$ITEST_DIR/admin" --store "etcd://$ETCD_ENDPOINTS" --exit-on-end \
        >> "$ITEST_DIR/musterd$1.log" 2>&1 &
    eval "CTL$1=$ctl; HTTP$1=$http; D$1=$!"
    ITEST_PIDS="$ITEST_PIDS $!"
}

# leads N SECONDS: musterd N says it leads within SECONDS.
leads() {
    i=0
    while [ $i -lt $(( $2 * 20 )) ]; do
        n=$(grep -c 'leading job' "$ITEST_DIR/musterd$1.log" 2>/dev/null || true)
        [ "${n:-0}" -ge "${3:-1}" ] && return 0
        sleep 0.05; i=$((i + 1))
    done
    return 1
}

# joined N AGENT COUNT: agent's log says it joined musterd N (COUNT times in all).
joined() {
    eval "ctl=\$CTL$1"
    [ "$(grep -c "joined daemon at 127.0.0.1:$ctl " "$ITEST_DIR/agent-$2.log")" -ge "$3" ]
}

etcd_start
echo "etcd: three members at $ETCD_ENDPOINTS"

job ha
musterd_ha 1 "$ITEST_DIR/ha.json"
leads 1 20 || fail "musterd 1 did not lead within 20 s"
musterd_ha 2 "$ITEST_DIR/ha.json"
i=0; until grep -q "standing by: 127.0.0.1:$CTL1 leads" "$ITEST_DIR/musterd2.log"; do
    i=$((i + 1)); [ $i -lt 200 ] || fail "musterd 2 did not stand by within 10 s"; sleep 0.05; done
RANK_CMD="$BUILD/muster-train --threads 1 --metrics $ITEST_DIR/ha.metrics"
# Agent b is given the standby first: it follows the REJECT to the leader.
CTL=$CTL1 # start_agent's --daemon, which the agents' own --daemon overrides
start_agent a 2 --daemon "127.0.0.1:$CTL1,127.0.0.1:$CTL2" --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"; A=$AGENT_PID
start_agent b 2 --daemon "127.0.0.1:$CTL2,127.0.0.1:$CTL1" --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"; B=$AGENT_PID
HTTP=$HTTP1
wait_for 120 'd["state"] == "running" and d["step"] is not None and d["step"] >= 10' \
    || fail "the job did not run to step 10 under musterd 1 within 120 s"
grep -q "stands by (127.0.0.1:$CTL1 leads" "$ITEST_DIR/agent-b.log" || fail "agent b did not follow the standby's REJECT"

# 1. The leader is SIGKILLed.
step=$(status | python3 -c 'import json,sys; print(json.load(sys.stdin)["step"])')
kill -9 "$D1"; t_kill=$(now_ms)
echo "SIGKILLed the leader (musterd 1) at step $step"
leads 2 15 || fail "musterd 2 did not lead within 15 s of the leader's SIGKILL"
# It leads the job as it stood (a fresh job would also be in generation 1).
grep -q "leading job ha (term [0-9]*): state loaded from etcd" "$ITEST_DIR/musterd2.log" \
    || fail "musterd 2 did not load the job's state from etcd: $(grep 'leading job' "$ITEST_DIR/musterd2.log")"
i=0; until joined 2 a 1 && joined 2 b 1; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the agents did not re-join musterd 2 within 15 s"; sleep 0.05; done
echo "failover: agents re-joined musterd 2 $(( $(now_ms) - t_kill )) ms after the SIGKILL"
HTTP=$HTTP2
wait_for 30 'd["state"] == "running" and d["generation"] == 1 and d["step"] > '"$step" \
    || { show_status >&2 || true; fail "training did not go on in generation 1 under musterd 2"; }
# musterctl given both: the first (killed) is not reached, the second answers.
BOTH="http://127.0.0.1:$HTTP1,http://127.0.0.1:$HTTP2"
"$BUILD/musterctl" --server "$BOTH" --json status | grep -q '"role": *"leader"' \
    || fail "musterctl --server $BOTH did not reach the leader past the killed musterd"
# What systemd's Restart= does: musterd 1 comes back, as a standby.
musterd_ha 1 "$ITEST_DIR/ha.json"
i=0; until grep -q "standing by: 127.0.0.1:$CTL2 leads" "$ITEST_DIR/musterd1.log"; do
    i=$((i + 1)); [ $i -lt 200 ] || fail "restarted musterd 1 did not stand by within 10 s"; sleep 0.05; done
# The standby's REST sends clients to the leader's, path and query kept;
# musterctl follows it; its own health check it answers itself.
i=0; until curl -s -o /dev/null -w '%{http_code} %{redirect_url}\n' "http://127.0.0.1:$HTTP1/v1/ranks?state=running" \
        | grep -qx "307 http://127.0.0.1:$HTTP2/v1/ranks?state=running"; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "the standby's REST did not redirect to the leader's"; sleep 0.1; done
"$BUILD/musterctl" --server "http://127.0.0.1:$HTTP1" --json status | grep -q '"role": *"leader"' \
    || fail "musterctl did not follow the standby's redirect to the leader"
curl -sf --max-time 2 "http://127.0.0.1:$HTTP1/healthz" > /dev/null || fail "the standby did not answer its /healthz"

# A rank SIGKILLed under the new leader heals in place: generation 2, the
# other ranks keep their processes and state.
victim=$(rank_pid ha.metrics 3)
[ -n "$victim" ] || fail "no process of rank 3"
kill -9 "$victim"
echo "SIGKILLed rank 3 (pid $victim) under musterd 2"
wait_for 60 'd["state"] == "running" and d["generation"] == 2' \
    || { show_status >&2 || true; fail "the rank did not heal in generation 2 under musterd 2 within 60 s"; }
grep -q "generation 2: .*every one rejoining in place" "$ITEST_DIR/agent-a.log" "$ITEST_DIR/agent-b.log" \
    || fail "the surviving ranks did not rejoin generation 2 in place"

# 2. One etcd member of three is lost: no effect.
kill -9 "$(etcd_member_pid 1)"
echo "killed etcd member m1"
sleep 3
check 'd["state"] == "running" and d["generation"] == 2' || fail "losing one etcd member of three changed the job"
grep -q "stepping down" "$ITEST_DIR/musterd2.log" && fail "the leader stepped down when one etcd member of three went"

# 3. Quorum lost: a second member goes (m1 is gone). Nobody can be elected
# and no lease can end: the leader holds the running generation past its
# lease's TTL, says so, and goes on when the member is back.
kill -9 "$(etcd_member_pid 2)"; t_q=$(now_ms)
echo "killed etcd member m2: no quorum"
wait_for 10 'd["store"]["quorum"] is False' || fail "the leader did not notice the quorum loss within 10 s"
# Past the leader's lease TTL (store_lease_s, 3 s) since the loss, the ranks
# must still step: two reads of their own log 1.5 s apart, the quorum still
# lost between them.
sleep 4
step=$(ranks_step)
sleep 1.5
check 'd["store"]["quorum"] is False' || fail "the quorum came back by itself (m1 and m2 are down)"
after=$(ranks_step)
[ "$after" -gt "$step" ] || fail "the ranks did not step past the lease's TTL without quorum (step $step, 1.5 s later $after)"
echo "no quorum: the ranks stepped from $step to $after, 4 to 5.5 s after the loss"
check 'd["state"] == "running" and d["generation"] == 2 and d["store"]["role"] == "leader"' \
    || { show_status >&2 || true; fail "the leader did not hold the running generation through the quorum loss"; }
grep -q "stepping down" "$ITEST_DIR/musterd2.log" && fail "the leader stepped down when etcd lost its quorum"
event_matching '"no quorum" in e["message"]' > /dev/null || fail "no event says etcd lost its quorum"
etcd_restart 2
wait_for 15 'd["store"]["quorum"] is True' || fail "the leader did not see the quorum back within 15 s"
echo "quorum lost for $(( $(now_ms) - t_q )) ms: the leader held generation 2 and goes on"
step=$(ranks_step)

# 4. The leader is stopped past its lease (3 s), then runs again.
kill -STOP "$D2"; t_stop=$(now_ms)
echo "SIGSTOPped the leader (musterd 2) at step $step"
leads 1 15 2 || fail "musterd 1 did not lead within 15 s of musterd 2's SIGSTOP"
grep "leading job ha (term [0-9]*)" "$ITEST_DIR/musterd1.log" | tail -n 1 | grep -q ": state loaded from etcd" \
    || fail "musterd 1 did not load the job's state from etcd when it led again: $(grep 'leading job' "$ITEST_DIR/musterd1.log")"
i=0; until joined 1 a 2 && joined 1 b 2; do
    i=$((i + 1)); [ $i -lt 300 ] || fail "the agents did not re-join musterd 1 within 15 s"; sleep 0.05; done
echo "failover: agents re-joined musterd 1 $(( $(now_ms) - t_stop )) ms after the SIGSTOP"
kill -CONT "$D2"
wait_exit "$D2" 10 || fail "the deposed musterd 2 did not step down within 10 s of SIGCONT"
grep -q "no longer leading job ha" "$ITEST_DIR/musterd2.log" || fail "musterd 2 did not say why it stepped down"
HTTP=$HTTP1

# Ten steps on, the job is stopped: that step's loss is what the
# uninterrupted run must reach.
END=$(( $(ranks_step) + 10 ))
steps_to "$ITEST_DIR/ha.metrics" $END 60 || fail "the ranks did not reach step $END within 60 s of the last failover"
"$BUILD/musterctl" --server "http://127.0.0.1:$HTTP1" --admin-token-file "$ITEST_DIR/admin" stop > /dev/null \
    || fail "musterctl stop"
wait_exit "$D1" 30 || fail "the job did not stop within 30 s"
wait "$D1" || true
grep -q "stopped, generation 2" "$ITEST_DIR/musterd1.log" || fail "expected the stop in generation 2: $(tail -3 "$ITEST_DIR/musterd1.log")"
wait_exit "$A" 10 || true; wait_exit "$B" 10 || true
# No agent took a frame of another generation (the deposed leader's
# included): the generations its ASSIGNs and COMMANDs named were 1 then 2,
# never back, nothing else.
for a in a b; do
    gens=$(sed -n -e 's/.*info: generation \([0-9]*\): [0-9]* rank(s) of world size.*/\1/p' \
        -e 's/.*daemon: generation over, park (generation \([0-9]*\) is next).*/\1/p' \
        -e 's/.*daemon: stop (generation \([0-9]*\)).*/\1/p' "$ITEST_DIR/agent-$a.log" | uniq | tr '\n' ' ')
    [ "$gens" = "1 2 " ] || fail "agent $a was told generations $gens, expected 1 then 2"
done
# Terms: every agent joined three leaders (musterd 1, 2, then 1 again), each
# in a higher term than the last, and never the deposed musterd 2 again.
for a in a b; do
    terms=$(sed -n "s/.*joined daemon at .*leader's term \([0-9]*\)).*/\1/p" "$ITEST_DIR/agent-$a.log" | tr '\n' ' ')
    echo "agent $a joined leaders of terms: $terms"
    echo "$terms" | awk '{ if (NF < 3) exit 1; for (i = 2; i <= NF; i++) if ($i <= $(i - 1)) exit 1 }' \
        || fail "agent $a: the leaders' terms are not increasing: $terms"
    [ "$(grep -c "joined daemon at 127.0.0.1:$CTL2 " "$ITEST_DIR/agent-$a.log")" -eq 1 ] \
        || fail "agent $a joined the deposed musterd 2 again"
done
got=$(loss_at "$ITEST_DIR/ha.metrics" $END)
[ -n "$got" ] || fail "no step-$END loss in the run with the faults"

# The reference: one musterd with the state file, no fault, the same job,
# as far as step END.
mv "$ITEST_DIR/agent-a.log" "$ITEST_DIR/ha-agent-a.log"; mv "$ITEST_DIR/agent-b.log" "$ITEST_DIR/ha-agent-b.log"
job straight
start_daemon "$ITEST_DIR/straight.json" --token-file "$ITEST_DIR/token" --exit-on-end
RANK_CMD="$BUILD/muster-train --threads 1 --metrics $ITEST_DIR/straight.metrics"
start_agent a 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
start_agent b 2 --token-file "$ITEST_DIR/token" --rank-cmd "$RANK_CMD"
t0=$(now_ms)
steps_to "$ITEST_DIR/straight.metrics" $END 300 || fail "the uninterrupted run did not reach step $END in 300 s"
ref=$(loss_at "$ITEST_DIR/straight.metrics" $END)
echo "uninterrupted: step-$END loss $ref ($(( ($(now_ms) - t0) / 1000 )) s)"
echo "two failovers: step-$END loss $got"
[ "$got" = "$ref" ] || fail "step-$END loss $got differs from the uninterrupted run's $ref"
echo "failover with etcd: ok"
