#!/bin/sh
# musterctl --server and a standby's 307 to the leader (docs/rest.md): the
# token goes only to servers named in --server, never to a host that only a
# redirect names (the leader key in etcd says where the leader is: whoever
# can write it must not collect tokens); without a token the redirect is
# followed; a redirect that redirects again (two standbys naming each
# other) is an error that says so; an empty entry in the list is refused.
# Fake REST servers on loopback (tests/fake-rest.py).
set -eu
. tests/itest-lib.sh

LOG=$ITEST_DIR/requests.log
S=$(free_port); L=$(free_port); A=$(free_port); B=$(free_port)
fake() { python3 tests/fake-rest.py "$@" & ITEST_PIDS="$ITEST_PIDS $!"; }
fake "$S" "$LOG" redirect "http://127.0.0.1:$L"   # a standby naming the leader at L
fake "$L" "$LOG" serve                             # the leader
fake "$A" "$LOG" redirect "http://127.0.0.1:$B"   # two standbys naming each other
fake "$B" "$LOG" redirect "http://127.0.0.1:$A"
for p in $S $L $A $B; do
    i=0; until curl -s -o /dev/null "http://127.0.0.1:$p/"; do
        i=$((i + 1)); [ $i -lt 100 ] || fail "fake REST server on port $p did not start"; sleep 0.1; done
done
: > "$LOG"
M=$BUILD/musterctl

# 1. A token, the leader not in --server: not sent there, and said why.
if MUSTER_READ_TOKEN=sekrit "$M" --server "http://127.0.0.1:$S" --json status > "$ITEST_DIR/out1" 2>&1; then
    fail "musterctl followed a redirect to a server not in --server with its token: $(cat "$ITEST_DIR/out1")"
fi
grep -q "names the leader at http://127.0.0.1:$L, which is not in --server" "$ITEST_DIR/out1" \
    || fail "musterctl did not say why it did not follow: $(cat "$ITEST_DIR/out1")"
! grep -q "^$L .*sekrit" "$LOG" || fail "the token reached a host named only by a redirect"
# 2. The leader in --server: followed, with the token.
MUSTER_READ_TOKEN=sekrit "$M" --server "http://127.0.0.1:$S,http://127.0.0.1:$L" --json status | grep -q '"leader"' \
    || fail "musterctl did not follow the redirect to a listed server"
grep -q "^$L /v1/status auth=Bearer sekrit" "$LOG" || fail "the token was not sent to the listed leader"
# 3. No token: followed.
"$M" --server "http://127.0.0.1:$S" --json status | grep -q '"leader"' \
    || fail "musterctl did not follow the redirect without a token"
# 4. Two standbys naming each other: one redirect followed, then an error.
if "$M" --server "http://127.0.0.1:$A,http://127.0.0.1:$B" status > "$ITEST_DIR/out4" 2>&1; then
    fail "a redirect loop was taken for an answer: $(cat "$ITEST_DIR/out4")"
fi
grep -q "sent on to" "$ITEST_DIR/out4" || fail "a redirect loop was not named: $(cat "$ITEST_DIR/out4")"
[ "$(grep -cE "^($A|$B) " "$LOG")" -le 2 ] || fail "musterctl followed more than one redirect: $(cat "$LOG")"
# 5. An empty entry.
if "$M" --server "http://127.0.0.1:$S,,http://127.0.0.1:$L" status > "$ITEST_DIR/out5" 2>&1; then
    fail "musterctl took --server with an empty entry"
fi
echo "ctl_redirect_token: ok"
