#!/bin/sh
# REST against a browser's attacks on a real musterd: a request by a name
# that is not musterd's (DNS rebinding) is refused with 421 naming the Host,
# one from another site's page (Origin) with 403, /healthz answers any name,
# a rest_hosts name is served; admin POSTs refuse Basic (the right token
# included) and any content type but JSON (a cross-site form's), musterctl's
# are served; a bad rest_hosts stops start-up naming the key.
set -eu
. tests/itest-lib.sh

cat > "$ITEST_DIR/job.json" <<JSON
{"name": "guardtest", "nodes": 1, "heartbeat_interval_ms": 200, "heartbeat_timeout_ms": 1500}
JSON
M="$BUILD/musterctl"
make_token "$ITEST_DIR/cluster"
make_token "$ITEST_DIR/admin"
echo '{"rest_hosts": "muster-alias.example, proxy.example:8443"}' > "$ITEST_DIR/musterd.json"
start_daemon "$ITEST_DIR/job.json" --config "$ITEST_DIR/musterd.json" --token-file "$ITEST_DIR/cluster" \
    --admin-token-file "$ITEST_DIR/admin"
U="http://127.0.0.1:$HTTP"
ADMIN=$(cat "$ITEST_DIR/admin")

# code METHOD PATH [curl args]: the status, the body in $ITEST_DIR/out
code() {
    _m=$1; _p=$2; shift 2
    curl -s --max-time 5 -o "$ITEST_DIR/out" -w '%{http_code}' -X "$_m" "$@" "$U$_p"
}

# ---- Host
c=$(code GET /v1/status)
[ "$c" = 200 ] || fail "GET /v1/status by its address: $c $(cat "$ITEST_DIR/out")"
c=$(code GET /v1/status -H "Host: localhost:$HTTP")
[ "$c" = 200 ] || fail "GET /v1/status as localhost (bound to loopback): $c $(cat "$ITEST_DIR/out")"
for p in /v1/status /v1/events /v1/stacks /v1/ranks/0/log /; do
    c=$(code GET "$p" -H "Host: rebound.evil.example:$HTTP")
    [ "$c" = 421 ] && grep -q '"misdirected request"' "$ITEST_DIR/out" && grep -q 'rebound.evil.example' "$ITEST_DIR/out" \
        || fail "GET $p by a rebound name: $c $(cat "$ITEST_DIR/out")"
done
c=$(code GET /v1/status -H "Host: 127.0.0.1:$((HTTP + 1))")
[ "$c" = 421 ] || fail "GET /v1/status for another port: $c $(cat "$ITEST_DIR/out")"
c=$(code GET /v1/status -H "Host: 127.0.0.1")
[ "$c" = 421 ] || fail "GET /v1/status for port 80: $c $(cat "$ITEST_DIR/out")"
c=$(code GET /healthz -H "Host: rebound.evil.example:$HTTP")
[ "$c" = 200 ] || fail "GET /healthz by any name: $c"
c=$(code GET /v1/status -H "Host: MUSTER-ALIAS.example:$HTTP")
[ "$c" = 200 ] || fail "GET /v1/status by a rest_hosts name: $c $(cat "$ITEST_DIR/out")"
c=$(code GET /v1/status -H "Host: proxy.example:8443")
[ "$c" = 200 ] || fail "GET /v1/status by a rest_hosts name with its port: $c $(cat "$ITEST_DIR/out")"
grep -q "refused /v1/status from 127.0.0.1: Host rebound.evil.example:$HTTP is not an allowed name" "$ITEST_DIR/musterd.log" \
    || fail "no log line names the refused Host"

# ---- Origin
c=$(code GET /v1/events -H "Origin: http://evil.example")
[ "$c" = 403 ] && grep -q '"cross-origin request"' "$ITEST_DIR/out" || fail "GET from another site's page: $c $(cat "$ITEST_DIR/out")"
c=$(code GET /v1/events -H "Origin: null")
[ "$c" = 403 ] || fail "GET with Origin null: $c"
c=$(code GET /v1/events -H "Origin: http://127.0.0.1:$HTTP")
[ "$c" = 200 ] || fail "GET from the dashboard's own origin: $c $(cat "$ITEST_DIR/out")"

# ---- admin POSTs: Bearer and JSON only
basic=$(printf 'op:%s' "$ADMIN" | base64 -w0)
c=$(code POST /v1/job/stop -H "Authorization: Basic $basic" -H 'Content-Type: application/json')
[ "$c" = 401 ] && grep -q 'not as Basic' "$ITEST_DIR/out" || fail "POST with the admin token as Basic: $c $(cat "$ITEST_DIR/out")"
c=$(code POST /v1/job/stop -H "Authorization: Bearer $ADMIN" -d 'x=1')
[ "$c" = 415 ] && grep -q 'application/x-www-form-urlencoded' "$ITEST_DIR/out" \
    || fail "POST with a form's content type: $c $(cat "$ITEST_DIR/out")"
c=$(code POST /v1/job/stop -H "Authorization: Bearer $ADMIN" -H 'Content-Type: text/plain' -d '{}')
[ "$c" = 415 ] || fail "POST as text/plain: $c $(cat "$ITEST_DIR/out")"
c=$(code POST /v1/job/stop -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
    -H 'Origin: http://evil.example')
[ "$c" = 403 ] || fail "POST from another site's page: $c $(cat "$ITEST_DIR/out")"
c=$(code POST /v1/job/stop -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json' \
    -H "Host: rebound.evil.example:$HTTP")
[ "$c" = 421 ] || fail "POST by a rebound name: $c $(cat "$ITEST_DIR/out")"
status | python3 -c 'import json,sys; d=json.load(sys.stdin); sys.exit(d["state"] != "waiting")' \
    || fail "a refused POST stopped the job: $(status)"
c=$(code POST /v1/job/checkpoint -H "Authorization: Bearer $ADMIN" -H 'Content-Type: application/json; charset=utf-8')
[ "$c" = 409 ] || fail "POST /v1/job/checkpoint with JSON (no checkpoint_dir: 409): $c $(cat "$ITEST_DIR/out")"
MUSTER_ADMIN_TOKEN=$ADMIN "$M" --server "$U" stop > "$ITEST_DIR/ctl.out" 2>&1 || fail "musterctl stop: $(cat "$ITEST_DIR/ctl.out")"
grep -q "accepted: stop" "$ITEST_DIR/ctl.out" || fail "musterctl stop: $(cat "$ITEST_DIR/ctl.out")"
kill "$DAEMON_PID" 2>/dev/null || true

# ---- a bad rest_hosts stops start-up, naming the key
echo '{"rest_hosts": "ok.example, not a name"}' > "$ITEST_DIR/bad.json"
rc=0
"$BUILD/musterd" --config "$ITEST_DIR/bad.json" --job "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/cluster" \
    --state-dir "$ITEST_DIR/state2" --listen 127.0.0.1:0 --http 127.0.0.1:0 > "$ITEST_DIR/bad.log" 2>&1 || rc=$?
[ "$rc" != 0 ] && grep -q "rest_hosts" "$ITEST_DIR/bad.log" || fail "a bad rest_hosts: rc $rc $(cat "$ITEST_DIR/bad.log")"
echo "rest_guard: ok"
