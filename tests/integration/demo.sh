#!/bin/sh
# make demo in its short mode (DEMO_SHORT=1, mk/demo.py), checked against
# what musterd and the agents recorded, not only against what it printed:
#   - it exits 0 and prints the key lines: each node joined (before the
#     first generation formed), the dashboard's URL (musterd's REST
#     address), the kill, "healed in place", "steps lost: none", the plan
#     beside the measurement, the summary; and stays quiet (at most 40
#     lines: the first demo printed ~230);
#   - a rank was SIGKILLed and healed in place: one new generation (2),
#     opened for that kill, no third; musterd says generation 2 resumed
#     from memory; the three other ranks' processes of generation 1 are
#     those that finish generation 2;
#   - nothing lost: the step generation 2 resumed at is the last step rank
#     0 finished in generation 1;
#   - the job completed: every rank finished the last step;
#   - a second demo on the same DEMO_DIR while it runs is refused (exit 2)
#     rather than wiping its files; a DEMO_DIR holding other files is left
#     alone; a data file too short for a step makes the nodes unfit, and the
#     demo says so at once instead of waiting out its deadline.
# itest: solo
set -eu
. tests/itest-lib.sh

need_data
D="$ITEST_DIR/demo"
OUT="$ITEST_DIR/demo.out"
start=$(date +%s)
DEMO_SHORT=1 KEEP=1 DEMO_DIR="$D" DATA="$DATA" python3 mk/demo.py > "$OUT" 2>&1 &
DEMO_PID=$!
ITEST_PIDS="$ITEST_PIDS $DEMO_PID"
i=0
until [ -f "$D/job.json" ] || [ $i -ge 300 ]; do sleep 0.1; i=$((i + 1)); done
set +e
DEMO_SHORT=1 DEMO_DIR="$D" DATA="$DATA" python3 mk/demo.py > "$ITEST_DIR/second.out" 2>&1; rc=$?
set -e
wait "$DEMO_PID" || { cat "$OUT"; cp "$D"/*.log "$ITEST_DIR"/ 2>/dev/null || true; fail "the demo failed"; }
took=$(($(date +%s) - start))
[ $rc -eq 2 ] && grep -q "another demo is running in $D/" "$ITEST_DIR/second.out" \
    || fail "a second demo on the running one's DEMO_DIR: exit $rc, expected 2: $(cat "$ITEST_DIR/second.out")"
cat "$OUT"
cp "$D"/*.log "$ITEST_DIR"/ # for fail's tails

has() { grep -q -- "$1" "$OUT" || fail "the demo's output lacks '$1'"; }
line_of() { grep -n -- "$1" "$OUT" | head -n 1 | cut -d: -f1; }

# ---- what it printed
has "node-a joined at"
has "node-b joined at"
has "generation 1 formed at"
for n in node-a node-b; do
    [ "$(line_of "$n joined")" -lt "$(line_of "generation 1 formed")" ] \
        || fail "$n is printed joined after the generation formed"
done
rest=$(grep -o 'REST http://127.0.0.1:[0-9]*' "$D/musterd.log" | head -n 1 | cut -d' ' -f2)
has "dashboard: $rest/"
has "SIGKILL to rank 3 (node-b, pid"
has "healed in place: generation 2"
has "steps lost: none"
has "plan vs measured: communication"
has "Bytes per step agree"
has "job completed: 60 steps, generation 2, 1 restart"
has "demo: done"
lines=$(wc -l < "$OUT")
[ "$lines" -le 40 ] || fail "the short demo printed $lines lines; it should stay quiet (at most 40)"

# ---- what musterd and the agents recorded
ev="$D/events.json"
grep -q '"generation 2 opened: rank 3 on node node-b was killed by signal 9' "$ev" \
    || fail "no generation 2 opened for the SIGKILL of rank 3: $(grep -o '"generation [0-9]* opened[^"]*' "$ev")"
! grep -q '"generation 3 opened' "$ev" || fail "a third generation was opened"
resumed=$(grep -o 'generation 2 resumed at step [0-9]* from memory' "$ev" | cut -d' ' -f6)
[ -n "$resumed" ] || fail "musterd does not say generation 2 resumed from memory: $(grep -o '"state_[a-z_]*"' "$ev")"
grep -q '"job demo completed in generation 2' "$ev" || fail "the job did not complete in generation 2"
for r in 0 1 2 3; do
    grep -q "\"rank $r on node-[ab] finished at step 60\"" "$ev" || fail "rank $r did not finish step 60"
done

# Rank 0's last step before generation 2, from its own lines in node-a's log.
last=$(awk '/^rank 0: muster-train\[0\] info: generation 2:/ { exit }
    /^rank 0: step [0-9]+\// { split($4, s, "/"); n = s[1] } END { print n }' "$D/node-a.log")
[ "$last" = "$resumed" ] || fail "rank 0 finished step $last in generation 1; generation 2 resumed at step $resumed"

# The processes of ranks 0-2 in generation 1 finish generation 2; rank 3's was SIGKILLed.
for r in 0 1 2; do
    pid=$(grep -ho "started rank $r (local rank [0-9], cpu [0-9], pid [0-9]*) for generation 1" "$D"/node-*.log |
        sed 's/.*pid \([0-9]*\).*/\1/')
    [ -n "$pid" ] || fail "no start of rank $r in generation 1"
    grep -q "rank $r (pid $pid, generation 2) exited with status 0" "$D"/node-*.log \
        || fail "rank $r's process of generation 1 (pid $pid) did not finish generation 2"
done
grep -q "rank 3 (pid [0-9]*, generation 1) was killed by signal 9" "$D/node-b.log" \
    || fail "node-b's log does not report rank 3 killed by signal 9"

# a DEMO_DIR that holds someone's files is not the demo's to wipe
mkdir -p "$ITEST_DIR/mine"
echo keep > "$ITEST_DIR/mine/notes.txt"
set +e
DEMO_SHORT=1 DEMO_DIR="$ITEST_DIR/mine" DATA="$DATA" python3 mk/demo.py > "$ITEST_DIR/mine.out" 2>&1; rc=$?
set -e
[ $rc -eq 2 ] && grep -q "holds files a demo did not write (notes.txt)" "$ITEST_DIR/mine.out" \
    && [ -f "$ITEST_DIR/mine/notes.txt" ] || fail "DEMO_DIR with other files: exit $rc: $(cat "$ITEST_DIR/mine.out")"
# data too short for one step: the nodes are unfit, said within seconds, not after the 240 s deadline
: > "$ITEST_DIR/empty.txt"
t0=$(date +%s)
set +e
DEMO_SHORT=1 DEMO_DIR="$ITEST_DIR/unfit" DATA="$ITEST_DIR/empty.txt" python3 mk/demo.py > "$ITEST_DIR/unfit.out" 2>&1
rc=$?
set -e
t=$(($(date +%s) - t0))
[ $rc -eq 1 ] && grep -q "is unfit for the job: data .*0 tokens are too few" "$ITEST_DIR/unfit.out" && [ $t -lt 60 ] \
    || fail "an empty data file: exit $rc after $t s, expected 1 and the unfit reason: $(cat "$ITEST_DIR/unfit.out")"
! pgrep -f "$ITEST_DIR/unfit" > /dev/null || fail "processes of the refused demo outlived it"
echo "demo: a second run on its DEMO_DIR refused, a foreign DEMO_DIR left alone, unfit data said in $t s"
echo "demo (short): healed in place at step $resumed, nothing lost, completed in $took s: ok"
