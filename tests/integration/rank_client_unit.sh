#!/bin/sh
# The Python rank client's unit tests (clients/python/tests, python3 -m
# unittest): the wire codec, the link against a fake agent on a socketpair,
# where/waiting on synthetic frames and the pure plans under the system
# python3 (standard library only, the tests that need torch skipped), then
# all of them, snapshots and Elastic's state machine with a fake link
# included, under the build's PyTorch environment.
set -eu
. tests/itest-lib.sh

unit() {
    (cd clients/python && env -u PYTHONPATH "$1" -m unittest discover -s tests) > "$ITEST_DIR/unit.log" 2>&1 \
        || { cat "$ITEST_DIR/unit.log" >&2; fail "the client's unit tests failed under $1"; }
    tail -n 1 "$ITEST_DIR/unit.log" | grep -q '^OK' || fail "no verdict from the unit tests under $1"
    echo "rank_client_unit: $1: $(grep '^Ran ' "$ITEST_DIR/unit.log"), $(tail -n 1 "$ITEST_DIR/unit.log")"
}

unit python3
need_torch rank_client_unit torch torch.distributed
unit "$TORCH_PY"
