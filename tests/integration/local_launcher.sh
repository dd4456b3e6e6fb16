#!/bin/sh
# muster-worker --local: a private daemon and N ranks on this machine; the
# launcher's exit status is the job's (0 completed, 1 failed).
set -eu
. tests/itest-lib.sh

echo '{"name": "local", "nodes": 4, "max_restarts": 1, "batch": 12}' > "$ITEST_DIR/job.json"
RANK="$BUILD/tests/fake-rank --step-ms 10"

# A crash in generation 1 costs one restart; generation 2 completes.
timeout 60 "$BUILD/muster-worker" --local --job "$ITEST_DIR/job.json" --devices cpu:3 \
    --rank-cmd "$RANK --steps 30 --crash-at-step 5 --crash-rank 2" > "$ITEST_DIR/ok.log" 2>&1 \
    || fail "local job that recovers exited non-zero"
grep -q 'completed, generation 2, 3 ranks' "$ITEST_DIR/ok.log" || fail "expected completion in generation 2"

# max_restarts 0: the first crash fails the job and the launcher says so.
echo '{"name": "local", "max_restarts": 0}' > "$ITEST_DIR/job0.json"
set +e
timeout 60 "$BUILD/muster-worker" --local --job "$ITEST_DIR/job0.json" --devices cpu:2 \
    --rank-cmd "$RANK --steps 30 --crash-at-step 5 --crash-rank 1" > "$ITEST_DIR/fail.log" 2>&1
rc=$?
set -e
[ "$rc" -eq 1 ] || fail "failed local job exited $rc, expected 1"
grep -q 'rank 1 on node .* exited with status 3; gave up after 0 restarts' "$ITEST_DIR/fail.log" \
    || fail "the failure reason is not in the log"
kept=$(sed -n 's/.*daemon state kept in \(.*\)$/\1/p' "$ITEST_DIR/fail.log"); case "$kept" in /tmp/muster-launch.*) rm -rf "$kept" ;; esac

# Usage errors exit 2.
set +e
"$BUILD/muster-worker" --local --devices cpu:1 > /dev/null 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--local without --job exited $rc, expected 2"
echo "local launcher: ok"
