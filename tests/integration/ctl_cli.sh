#!/bin/sh
# musterctl without a daemon: usage errors exit 2, an unreachable musterd
# exits 1 with "cannot reach musterd at URL", `token new` writes a 0600 file
# of 64 hex digits and refuses to overwrite one without --force.
set -u
BUILD=${BUILD:-build}
CTL="$BUILD/musterctl"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT INT TERM
fails=0

fail() {
    echo "ctl_cli: $*" >&2
    fails=$((fails + 1))
}

# expect CODE CMD...: run CMD, check its exit status, keep stderr in $tmp/err
expect() {
    want=$1
    shift
    "$@" >"$tmp/out" 2>"$tmp/err"
    got=$?
    [ "$got" -eq "$want" ] || fail "'$*' exited $got, expected $want: $(cat "$tmp/err")"
}

expect 0 "$CTL" --help
grep -q "drain NODE" "$tmp/out" || fail "--help does not list drain"
expect 0 "$CTL" --version
grep -q "^musterctl [0-9]" "$tmp/out" || fail "--version printed '$(cat "$tmp/out")'"
expect 2 "$CTL"
expect 2 "$CTL" frobnicate
expect 2 "$CTL" --no-such-option status
expect 2 "$CTL" status extra
expect 2 "$CTL" drain
expect 2 "$CTL" --server
expect 2 "$CTL" --server ftp://x status
expect 2 "$CTL" drain 'bad name'
expect 2 env -u MUSTER_ADMIN_TOKEN "$CTL" stop

# Nothing listens on port 1 of loopback.
expect 1 "$CTL" --server http://127.0.0.1:1 status
grep -q "cannot reach musterd at http://127.0.0.1:1" "$tmp/err" || fail "unreachable: $(cat "$tmp/err")"
expect 1 env MUSTER_SERVER=http://127.0.0.1:1 "$CTL" nodes
grep -q "cannot reach musterd at http://127.0.0.1:1" "$tmp/err" || fail "MUSTER_SERVER ignored: $(cat "$tmp/err")"

expect 0 "$CTL" token new "$tmp/token"
grep -Eqx '[0-9a-f]{64}' "$tmp/token" || fail "token file holds '$(cat "$tmp/token")'"
[ "$(stat -c %a "$tmp/token")" = 600 ] || fail "token file mode $(stat -c %a "$tmp/token")"
first=$(cat "$tmp/token")
expect 1 "$CTL" token new "$tmp/token"
grep -q -- "--force" "$tmp/err" || fail "overwrite refusal does not mention --force: $(cat "$tmp/err")"
[ "$(cat "$tmp/token")" = "$first" ] || fail "token file changed without --force"
expect 0 "$CTL" token new "$tmp/token" --force
[ "$(cat "$tmp/token")" != "$first" ] || fail "--force kept the old token"
expect 2 "$CTL" token old "$tmp/x"

[ "$fails" -eq 0 ] && echo "ctl_cli: ok"
[ "$fails" -eq 0 ]
