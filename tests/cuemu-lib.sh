# Sourced by the gpu_emulated*.sh integration scripts, after
# tests/itest-lib.sh: the GPU path's programs under cuemu, CUDA emulated on
# the CPU (tests/cuemu/README.md).

# cuemu_setup NAME PROGRAM...: E is where cuemu's programs are, each named
# one must be there, and $ITEST_DIR/text.txt is the training text. A
# sanitizer build (CUEMU=off) does not build cuemu: the script skips.
cuemu_setup() {
    if [ "${CUEMU:-on}" = off ]; then
        echo "$1: skipped (sanitizer build: cuemu is not built there, see the Makefile)"
        exit 0
    fi
    shift
    E=$BUILD/cuemu
    for b in "$@"; do [ -x "$E/$b" ] || fail "$E/$b not built"; done
    for i in 1 2 3 4; do cat README.md docs/*.md; done > "$ITEST_DIR/text.txt"
}

# cuemu_check_order EAGER: gpu-check and zero-world in one of the two orders
# cuemu can force: every stream lazy, threads ascending (EAGER ""); or the
# communication stream eager, blocks and threads descending (EAGER 2).
cuemu_check_order() {
    eager=$1
    order=forward; [ -n "$eager" ] && order=reverse
    what="${eager:+communication stream eager, }threads $order"
    CUEMU_EAGER=$eager CUEMU_ORDER=$order timeout 300 "$E/gpu-check" --train-model tiny \
        --train-steps 20 --curve-bound 0.005 "$ITEST_DIR/text.txt" > "$ITEST_DIR/check$eager.log" 2>&1 \
        || fail "gpu-check under cuemu ($what): $(grep -E 'FAIL|cuemu:' "$ITEST_DIR/check$eager.log")"
    grep -q '^gpu-check: passed' "$ITEST_DIR/check$eager.log" || fail "gpu-check did not pass"
    CUEMU_EAGER=$eager CUEMU_ORDER=$order timeout 120 "$E/zero-world" > "$ITEST_DIR/world$eager.log" 2>&1 \
        || fail "zero-world under cuemu ($what): $(grep -E 'FAIL|cuemu:' "$ITEST_DIR/world$eager.log")"
    grep -E 'gradients:|world 3: step 1' "$ITEST_DIR/check$eager.log" "$ITEST_DIR/world$eager.log" |
        sed 's/^[^:]*: */  /'
}
