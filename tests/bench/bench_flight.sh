#!/bin/sh
# The flight recorder's cost per step and per collective (tests/bench/bench_flight.py).
set -eu
PY=${TORCH_PY:-.venv/bin/python}
if ! "$PY" -c 'import torch.distributed' 2>/dev/null; then
    echo "bench_flight: skipped: no torch at $PY (sh mk/deps.sh build)"
    exit 0
fi
"$PY" tests/bench/bench_flight.py --runs "${FLIGHT_RUNS:-5}"
