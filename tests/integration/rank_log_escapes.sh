#!/bin/sh
# GET /v1/ranks/R/log serves only what the rank wrote. Things a rank can
# plant in the agent's state directory (generations 91-98 of rank 0 on node
# a): a hard link to the cluster token named output.log, a symbolic link as
# gen-G and as rank-R, a FIFO, and forged output.log.offset values
# (2^64-1, 2^53+1, -5). Each is answered at once with an error that names
# what was wrong (404 or 502), never with the token's bytes and never by
# silence (a request left unanswered would hold one of musterd's log slots
# until its deadline).
set -eu
. tests/itest-lib.sh

echo '{"name": "escapes", "nodes": 1}' > "$ITEST_DIR/job.json"
make_token "$ITEST_DIR/token"
start_daemon "$ITEST_DIR/job.json" --token-file "$ITEST_DIR/token"
start_agent a 1 --token-file "$ITEST_DIR/token" --rank-cmd "$BUILD/tests/fake-rank --step-ms 50 --lines 1"
wait_for 15 'running == 1' || fail "rank 0 did not run within 15 s"
ROOT="$ITEST_DIR/agent-state/a"
[ -d "$ROOT/gen-1/rank-0" ] || fail "no rank directory at $ROOT/gen-1/rank-0"
TOKEN=$(cat "$ITEST_DIR/token")

rankdir() { mkdir -p "$ROOT/gen-$1/rank-0"; echo "$ROOT/gen-$1/rank-0"; }
ln "$ITEST_DIR/token" "$(rankdir 91)/output.log"
mkdir -p "$ITEST_DIR/elsewhere/rank-0"; echo "not this rank's" > "$ITEST_DIR/elsewhere/rank-0/output.log"
ln -s "$ITEST_DIR/elsewhere" "$ROOT/gen-92"
mkdir -p "$ROOT/gen-93"; ln -s "$ITEST_DIR/elsewhere/rank-0" "$ROOT/gen-93/rank-0"
mkfifo "$(rankdir 94)/output.log"
off=95
for forged in 18446744073709551615 9007199254740993 -5; do
    d=$(rankdir $off); echo "a line" > "$d/output.log"; echo "$forged" > "$d/output.log.offset"
    off=$((off + 1))
done
d=$(rankdir 98); echo "a line" > "$d/output.log"; echo 1000 > "$d/output.log.offset" # a valid one still serves

ask() { # GEN: prints "STATUS MS BODY"
    t0=$(now_ms)
    body=$(curl -s --max-time 10 -o - -w ' %{http_code}' "http://127.0.0.1:$HTTP/v1/ranks/0/log?generation=$1" || true)
    echo "${body##* } $(( $(now_ms) - t0 )) ${body% *}"
}
for g in 91 92 93 94 95 96 97; do
    set -- $(ask $g)
    st=$1; ms=$2; shift 2; body="$*"
    echo "generation $g: $st in $ms ms: $body" | cut -c1-220
    case $st in 404 | 502) ;; *) fail "generation $g: expected an error answer, got $st" ;; esac
    [ "$ms" -lt 2000 ] || fail "generation $g: the answer took $ms ms (left unanswered?)"
    case $body in *"$TOKEN"*) fail "generation $g: the answer holds the cluster token" ;; esac
    case $body in *"not this rank"*) fail "generation $g: served a file outside the rank's directory" ;; esac
done
set -- $(ask 98)
[ "$1" = 200 ] && echo "$*" | grep -q '"offset":1000' || fail "generation 98 (valid offset 1000): $*"
echo "generation 98 (valid offset): 200"
echo "rank_log_escapes: ok"
