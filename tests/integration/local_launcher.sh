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
grep -q 'rank 1 on node .* exited with status 3: fake-rank 1: crashing at step 5 as asked (--crash-at-step); gave up after 0 restarts' "$ITEST_DIR/fail.log" \
    || fail "the failure reason is not in the log"
kept=$(sed -n 's/.*daemon state kept in \(.*\)$/\1/p' "$ITEST_DIR/fail.log"); case "$kept" in /tmp/muster-launch.*) rm -rf "$kept" ;; esac

# Usage errors exit 2.
set +e
"$BUILD/muster-worker" --local --devices cpu:1 > /dev/null 2>&1; rc=$?
set -e
[ "$rc" -eq 2 ] || fail "--local without --job exited $rc, expected 2"
# Stopping ranks reaches what they started: a rank's helper process that
# ignores SIGTERM dies with its rank's process group.
mkdir -p "$ITEST_DIR/pids"
FAKE_RANK_PIDDIR="$ITEST_DIR/pids" "$BUILD/muster-worker" --local --job "$ITEST_DIR/job.json" --devices cpu:1 \
    --rank-cmd "$RANK --spawn-child" > "$ITEST_DIR/child.log" 2>&1 &
L=$!
ITEST_PIDS="$ITEST_PIDS $L"
i=0; while [ ! -s "$ITEST_DIR/pids/child-0.pid" ] && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
[ -s "$ITEST_DIR/pids/child-0.pid" ] || fail "the rank's helper process did not start"
child=$(cat "$ITEST_DIR/pids/child-0.pid")
kill -TERM "$L"
i=0; while pid_alive "$L" && [ $i -lt 200 ]; do sleep 0.05; i=$((i + 1)); done
pid_alive "$L" && fail "the launcher did not exit within 10 s of SIGTERM"
i=0; while pid_alive "$child" && [ $i -lt 40 ]; do sleep 0.05; i=$((i + 1)); done
pid_alive "$child" && fail "the rank's helper process $child outlived its stopped rank"
# A descriptor the agent was started with (a shell's, a supervisor's) does not reach the ranks.
cat > "$ITEST_DIR/fds.sh" <<'SH'
#!/bin/sh
echo "inherited: $(ls -l /proc/$$/fd/ | grep -c 'itest-secret')"
SH
chmod +x "$ITEST_DIR/fds.sh"
echo secret > "$ITEST_DIR/itest-secret"
(exec 9< "$ITEST_DIR/itest-secret"; timeout 60 "$BUILD/muster-worker" --local --job "$ITEST_DIR/job.json" --devices cpu:1 \
    --rank-cmd "$ITEST_DIR/fds.sh" > "$ITEST_DIR/fds.log" 2>&1) || true
grep -q "inherited: 0" "$ITEST_DIR/fds.log" || fail "a descriptor the launcher was started with reached the rank: $(grep inherited "$ITEST_DIR/fds.log")"
echo "local launcher: ok"
