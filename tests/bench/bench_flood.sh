#!/bin/sh
# Strangers against the control port of a running 2-node job (loopback):
# musterd's peak RSS and a killed member's rejoin time without a flood, under
# 3000 held unauthenticated connections (re-opened as they are closed), and
# under connect/close churn, FLOOD_S seconds each. The run is
# tests/integration/control_flood.sh, which also asserts the bounds
# (RSS_MAX_MB, REJOIN_SLACK_MS); its figures are printed here. MUSTERD is
# not taken: compare builds by running this from each tree.
set -u
BUILD=${BUILD:-build}
out=$(mktemp)
if FLOOD_S=${FLOOD_S:-15} BUILD="$BUILD" sh tests/integration/control_flood.sh > "$out" 2>&1; then
    grep -E "rejoin without|flood:" "$out"
    rm -f "$out"
else
    tail -n 20 "$out"
    rm -f "$out"
    echo "bench_flood: control_flood.sh failed"
    exit 1
fi
