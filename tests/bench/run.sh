#!/bin/sh
# `make bench`: runs every tests/bench/bench_*.sh in name order and reports
# which failed. Each script prints its own figures.
set -u
BUILD=${BUILD:-build}
export BUILD
failed=""
for b in tests/bench/bench_*.sh; do
    [ -e "$b" ] || continue
    if ! sh "$b"; then
        failed="$failed $(basename "$b" .sh)"
    fi
done
[ -z "$failed" ] || { echo "bench failed:$failed"; exit 1; }
