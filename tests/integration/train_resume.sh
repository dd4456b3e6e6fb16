#!/bin/sh
# muster-train standalone: 20 steps straight, and 10 steps + checkpoint +
# 10 steps in a new process from that checkpoint, give bit-identical losses
# (compared as the %.17g values of --metrics). Also checks the step line and
# the validation line, and the program contract (--help, --version, usage
# errors exit 2). Tiny preset, generated text: a few seconds on 2 cores.
set -u
BUILD=${BUILD:-build}
BIN=$BUILD/muster-train
T=$(mktemp -d "${TMPDIR:-/tmp}/muster-train-resume.XXXXXX")
trap 'rm -rf "$T"' EXIT INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

[ -x "$BIN" ] || fail "$BIN not built"
# ~60 KB of text with structure: numbered lines of words.
awk 'BEGIN { srand(7); split("to be or not that is the question whether tis nobler in mind", w, " ");
    for (i = 0; i < 3000; i++) { line = ""; for (j = 0; j < 4; j++) line = line w[int(rand() * 14) + 1] " ";
    print line } }' > "$T/text.txt"

COMMON="--standalone --model tiny --data $T/text.txt --steps 20 --batch 4 --micro-batch 2
    --lr 3e-3 --warmup 5 --eval-every 10 --eval-batches 2 --threads 2 --seed 11"
# shellcheck disable=SC2086
timeout 120 "$BIN" $COMMON --metrics "$T/straight.jsonl" > "$T/straight.out" 2> "$T/straight.err" \
    || fail "straight run failed: $(cat "$T/straight.err")"
# shellcheck disable=SC2086
timeout 120 "$BIN" $COMMON --checkpoint-dir "$T/ck" --stop-after 10 --metrics "$T/resumed.jsonl" \
    > "$T/first.out" 2> "$T/first.err" || fail "first half failed: $(cat "$T/first.err")"
[ -f "$T/ck/step-00000010/manifest.json" ] || fail "no checkpoint at step 10"
[ -f "$T/ck/step-00000010/rank-00000.bin" ] || fail "no rank file at step 10"
[ "$(cat "$T/ck/latest")" = "step-00000010" ] || fail "latest does not name step 10"
# shellcheck disable=SC2086
timeout 120 "$BIN" $COMMON --checkpoint-dir "$T/ck" --resume "$T/ck" --metrics "$T/resumed.jsonl" \
    > "$T/second.out" 2> "$T/second.err" || fail "second half failed: $(cat "$T/second.err")"
grep -q "resumed from .* at step 10" "$T/second.err" || fail "no resume line: $(cat "$T/second.err")"
head -n 1 "$T/second.out" | grep -q '^step 11/20 loss [0-9]*\.[0-9]\{6\} lr ' \
    || fail "second half does not start at step 11: $(head -n 1 "$T/second.out")"

losses() { grep '"loss"' "$1" | sed 's/.*"step": \([0-9]*\), "loss": \([^,]*\),.*/\1 \2/'; }
losses "$T/straight.jsonl" > "$T/a"
losses "$T/resumed.jsonl" > "$T/b"
[ "$(wc -l < "$T/a")" -eq 20 ] || fail "straight run logged $(wc -l < "$T/a") steps, not 20"
cmp -s "$T/a" "$T/b" || { diff "$T/a" "$T/b" >&2; fail "losses differ after resume"; }
grep -q '^val step 20 loss ' "$T/straight.out" || fail "no validation line at step 20"
first=$(head -n 1 "$T/a" | cut -d' ' -f2); last=$(tail -n 1 "$T/a" | cut -d' ' -f2)
awk -v a="$first" -v b="$last" 'BEGIN { exit !(b < a - 0.5) }' || fail "did not learn: $first -> $last"
echo "resume: 20 losses identical bit for bit ($first -> $last)"

"$BIN" --help | grep -q -- '--standalone' || fail "--help"
"$BIN" --version | grep -q '^muster-train [0-9]' || fail "--version"
"$BIN" --standalone --data "$T/text.txt" --steps x 2> "$T/e"; [ $? -eq 2 ] || fail "--steps x: not exit 2"
grep -q -- '--steps: expected an integer, got "x"' "$T/e" || fail "--steps x message: $(cat "$T/e")"
"$BIN" --standalone --data "$T/text.txt" --bogus 2> /dev/null; [ $? -eq 2 ] || fail "--bogus: not exit 2"
echo '{"name": "j", "model": "tiny", "lr": 99}' > "$T/job.json"
"$BIN" --standalone --job "$T/job.json" --data "$T/text.txt" 2> "$T/e"; [ $? -eq 2 ] || fail "lr 99: not exit 2"
grep -q 'job.json + command line: lr: expected a number in \[0, 10\], got 99' "$T/e" \
    || fail "lr 99 message: $(cat "$T/e")"
exit 0
