#!/bin/sh
# Runs everything `make check` promises: the Check unit suites and the
# integration scripts under tests/integration/, two at a time where they
# allow it (ITEST_JOBS, tests/run_integration.py). Each script starts real
# binaries on loopback, bounds every wait, and cleans up after itself. The
# last line is the tally CI reads.
set -u
BUILD=${BUILD:-build}
export BUILD
passed=0
failed=0
failures=""

# The Check unit suites are one more item of the runner's (unit_suites),
# run beside the light solo scripts, and the integration scripts two at a
# time where they allow it (tests/run_integration.py).
# They run in the background lane beside a solo (a low CPU weight, by
# design): their per-case timeouts are stretched (CK_TIMEOUT_MULTIPLIER).
python3 tests/run_integration.py --unit "env CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-60} CK_TIMEOUT_MULTIPLIER=${CK_TIMEOUT_MULTIPLIER:-4} $BUILD/tests/check_muster" |
    tee "${TMPDIR:-/tmp}/muster-itest-run.$$"
tally=$(sed -n 's/^integration: \([0-9]*\) passed, \([0-9]*\) failed$/\1 \2/p' "${TMPDIR:-/tmp}/muster-itest-run.$$")
names=$(sed -n 's/^failed: //p' "${TMPDIR:-/tmp}/muster-itest-run.$$")
rm -f "${TMPDIR:-/tmp}/muster-itest-run.$$"
if [ -z "$tally" ]; then
    failed=$((failed + 1))
    failures="$failures run_integration"
else
    passed=$((passed + ${tally% *}))
    failed=$((failed + ${tally#* }))
    [ -n "$names" ] && failures="$failures $names"
fi

[ -n "$failures" ] && echo "failed:$failures"
echo "check: $passed passed, $failed failed"
[ "$failed" -eq 0 ]
