#!/bin/sh
# docs/jobspec.md must match the key table it is generated from.
set -eu
BUILD=${BUILD:-build}
"$BUILD/tests/jobspec-doc" | diff -u docs/jobspec.md - || { echo "docs/jobspec.md is stale: run make docs"; exit 1; }
