#!/bin/sh
# musterd standing by against a hostile etcd member (tests/fake-etcd.py on
# loopback): the leader key holds a value that is not a musterd's (a CRLF
# and a header after the REST URL), and the watch sends a line that never
# ends. musterd names the value and takes the leader as unknown: its REST
# answers 503, no 307 to what the key says; it ends the watch once the line
# passes 16 MiB (not 64 MiB later) and says so; it keeps standing by.
set -eu
. tests/itest-lib.sh

E=$(free_port); CTL=$(free_port); HTTP=$(free_port)
LOG=$ITEST_DIR/etcd.log
: > "$LOG"
FAKE_LEADER_VALUE='127.0.0.1:1 http://127.0.0.1:2/\r\nSet-Cookie: stolen=1' python3 tests/fake-etcd.py "$E" "$LOG" &
ITEST_PIDS="$ITEST_PIDS $!"
i=0; until curl -s -o /dev/null -X POST -d '{}' "http://127.0.0.1:$E/v3/none"; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "the fake etcd did not start"; sleep 0.1; done
make_token "$ITEST_DIR/token"
cat > "$ITEST_DIR/hostile.json" <<JSON
{"name": "hostile", "nodes": 1, "max_restarts": 1}
JSON
"$BUILD/musterd" --job "$ITEST_DIR/hostile.json" --listen "127.0.0.1:$CTL" --http "127.0.0.1:$HTTP" \
    --state-dir "$ITEST_DIR/state" --token-file "$ITEST_DIR/token" --store "etcd://127.0.0.1:$E" \
    >> "$ITEST_DIR/musterd.log" 2>&1 &
D=$!; ITEST_PIDS="$ITEST_PIDS $D"
wait_log 10 "$ITEST_DIR/musterd.log" "standing by: another musterd leads" \
    || fail "musterd did not stand by (the leader unknown) within 10 s: $(tail -5 "$ITEST_DIR/musterd.log")"
grep -q "holds [0-9]* bytes that are not a musterd's" "$ITEST_DIR/musterd.log" \
    || fail "musterd did not name the leader key's value as not a musterd's"
code=$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$HTTP/v1/status")
[ "$code" = 503 ] || fail "the standby's REST answered $code, not 503, with a hostile leader value"
wait_log 10 "$LOG" "watch sent" || fail "the never-ending watch line was not cut within 10 s"
sent=$(grep -m1 "watch sent" "$LOG" | cut -d' ' -f3)
[ "$sent" -lt $((40 << 20)) ] || fail "musterd took $sent bytes of one watch line"
wait_log 5 "$ITEST_DIR/musterd.log" "a watch line longer than 16 MiB" || fail "musterd did not say why it ended the watch"
pid_alive "$D" || fail "musterd died"
echo "store_hostile_etcd: ok (the watch was cut after $sent bytes)"
