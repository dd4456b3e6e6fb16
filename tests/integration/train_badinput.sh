#!/bin/sh
# muster-train refuses bad input with a message that says what was wrong and
# exit status 1: a truncated token file, a file with a wrong magic, a
# checkpoint of another model, a damaged checkpoint, and a loss that turns
# NaN (fault injection: MUSTER_FAULT_NAN_STEP), which must name the step.
set -u
BUILD=${BUILD:-build}
BIN=$BUILD/muster-train
T=$(mktemp -d "${TMPDIR:-/tmp}/muster-train-bad.XXXXXX")
trap 'rm -rf "$T"' EXIT INT TERM
fail() { echo "FAIL: $*" >&2; exit 1; }

[ -x "$BIN" ] || fail "$BIN not built"
awk 'BEGIN { for (i = 0; i < 2000; i++) print "all the world is a stage and all the men " i }' > "$T/text.txt"

# expect_fail NAME PATTERN CMD...: CMD exits 1 and stderr matches PATTERN.
expect_fail() {
    name=$1 pattern=$2
    shift 2
    timeout 60 "$@" > "$T/out" 2> "$T/err"
    rc=$?
    [ "$rc" -eq 1 ] || fail "$name: exit $rc, expected 1: $(cat "$T/err")"
    grep -q "$pattern" "$T/err" || fail "$name: message does not match '$pattern': $(cat "$T/err")"
    echo "$name: $(grep error "$T/err" | head -n 1)"
}

# llm.c header: int32 magic 20240520 (0x0134D888), version 1, count 1000, rest 0.
{ printf '\210\330\064\001\001\000\000\000\350\003\000\000'; head -c 1012 /dev/zero; head -c 200 /dev/zero; } > "$T/trunc.bin"
expect_fail truncated "truncated token file: header says 1000 tokens, file holds 100" \
    "$BIN" --standalone --model tiny --data "$T/trunc.bin" --steps 1

{ printf '\001\002\003\004\001\000\000\000\350\003\000\000'; head -c 3012 /dev/zero; } > "$T/magic.bin"
expect_fail wrong-magic "header holds magic 67305985, version 1, count 1000" \
    "$BIN" --standalone --model tiny --data "$T/magic.bin" --steps 1

timeout 60 "$BIN" --standalone --model tiny --data "$T/text.txt" --steps 2 --batch 2 \
    --checkpoint-dir "$T/ck" > /dev/null 2> "$T/err" || fail "tiny run: $(cat "$T/err")"
expect_fail other-model "of another model: L is 2 there (preset tiny), 4 here (preset small)" \
    "$BIN" --standalone --model small --data "$T/text.txt" --steps 4 --batch 2 --resume "$T/ck"

printf 'XXXX' | dd of="$T/ck/step-00000002/rank-00000.bin" bs=1 seek=2000 conv=notrunc 2> /dev/null
expect_fail damaged "checksum .* (file damaged)" \
    "$BIN" --standalone --model tiny --data "$T/text.txt" --steps 4 --batch 2 --resume "$T/ck"

MUSTER_FAULT_NAN_STEP=3 expect_fail nan "step 3: loss is nan" \
    "$BIN" --standalone --model tiny --data "$T/text.txt" --steps 5 --batch 2
grep -q '^step 2/5 ' "$T/out" || fail "nan: steps before the fault were not logged"
exit 0
