#!/bin/sh
# Runs everything `make check` promises: the Check unit suites, then each
# integration script under tests/integration/ (in name order). Each script
# starts real binaries on loopback, bounds every wait, and cleans up after
# itself. The last line is the tally CI reads.
set -u
BUILD=${BUILD:-build}
export BUILD
passed=0
failed=0
failures=""

echo "== unit suites (Check)"
if CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-60} "$BUILD/tests/check_muster"; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    failures="$failures check_muster"
fi

for t in tests/integration/*.sh; do
    [ -e "$t" ] || continue
    name=$(basename "$t" .sh)
    echo "== integration: $name"
    start=$(date +%s)
    if timeout 600 sh "$t"; then
        passed=$((passed + 1))
        echo "-- $name: ok ($(($(date +%s) - start)) s)"
    else
        failed=$((failed + 1))
        failures="$failures $name"
        echo "-- $name: FAILED ($(($(date +%s) - start)) s)"
    fi
done

[ -n "$failures" ] && echo "failed:$failures"
echo "check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
