#!/bin/sh
# Runs everything `make check` promises: the Check unit suites, then the
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

# The Check suites (tests/suites.def), each in a process of its own
# (CK_RUN_SUITE), UNIT_JOBS at a time (default 2): plan's alone is most of
# the CPU time, so it starts first. Each suite's output is printed whole.
echo "== unit suites (Check)"
udir=$(mktemp -d "${TMPDIR:-/tmp}/muster-unit.XXXXXX")
suites=$(sed -n 's/^SUITE(\([a-z_0-9]*\))$/\1/p' tests/suites.def | awk '$0 == "plan" { print; next } { rest = rest $0 "\n" } END { printf "%s", rest }')
echo "$suites" | CK_DEFAULT_TIMEOUT=${CK_DEFAULT_TIMEOUT:-60} UDIR=$udir xargs -P "${UNIT_JOBS:-2}" -I{} \
    sh -c 'CK_RUN_SUITE={} "$BUILD/tests/check_muster" > "$UDIR/{}.log" 2>&1; echo $? > "$UDIR/{}.rc"'
unit_failed=""
for s in $suites; do
    echo "-- suite $s"
    cat "$udir/$s.log" 2>/dev/null
    # A suite that ran no check (a name Check does not know) fails too.
    [ "$(cat "$udir/$s.rc" 2>/dev/null)" = 0 ] && grep -q 'Checks: [1-9]' "$udir/$s.log" \
        || unit_failed="$unit_failed $s"
done
rm -rf "$udir"
if [ -z "$unit_failed" ] && [ -n "$suites" ]; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    failures="$failures check_muster(${unit_failed# })"
fi

# The integration scripts, two at a time where they allow it (tests/run_integration.py).
python3 tests/run_integration.py | tee "${TMPDIR:-/tmp}/muster-itest-run.$$"
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
