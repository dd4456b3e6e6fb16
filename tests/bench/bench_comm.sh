#!/bin/sh
# Ring collectives on loopback: all-gather and reduce-scatter bandwidth for
# 2 and 4 ranks (threads of one process, each with its own ring sockets),
# 1..64 MiB buffers, against one TCP connection streaming on loopback in the
# same run. busbw = algbw * (N-1)/N is what each ring link carries; all N
# links share this machine's cores, so sum/raw = N * busbw / raw says how much
# of a bare stream's rate the whole ring reaches (1.0 = as much).
set -eu
BUILD=${BUILD:-build}
echo "== comm: ring all-gather / reduce-scatter vs raw loopback TCP ($(nproc) cores)"
"$BUILD/tests/comm-bench" --ranks "${COMM_RANKS:-2,4}" --min-mib 1 --max-mib 64
