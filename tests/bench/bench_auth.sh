#!/bin/sh
# Protocol 2's cost (issue 34): the crypto of one whole join (both proofs,
# the session keys), sealing and opening an 8-rank heartbeat beside its
# encode and decode, and a small frame's echo, from tests/auth-bench.c.
# musterd's CPU at 4096 agents x 8 ranks with the sealed channel is in
# bench_control_scale.sh.
set -u
BUILD=${BUILD:-build}
echo "== auth: handshake and per-frame cost of the authenticated channel"
"$BUILD/tests/auth-bench" --seconds "${AUTH_SECONDS:-3}"
