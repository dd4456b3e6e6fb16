#!/bin/sh
# make bench-gpu: muster's GPU path and PyTorch on the same GPT-2 (gpt2-124m by
# default) on one GPU, then the ratio. Without a GPU: "no GPU: skipped" (exit 0,
# or 1 with REQUIRE_GPU=1). MICRO_BATCH, SEQ_LEN, STEPS as in gpu-bench.c.
set -u
BUILD=${BUILD:-build}
here=$(dirname "$0")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
"$BUILD/tests/gpu-bench" > "$out"
rc=$?
cat "$out"
grep -q '^{' "$out" || exit $rc   # skipped, or failed
mb=${MICRO_BATCH:-8}
t=${SEQ_LEN:-1024}
if ! python3 -c 'import torch' 2>/dev/null; then
    echo "bench-gpu: python3 has no torch: the PyTorch comparison was not run"
    exit 0
fi
python3 "$here/bench_torch_gpu.py" --batch "$mb" --T "$t" --steps "${STEPS:-10}" | tee -a "$out"
python3 - "$out" <<'PY'
import json, sys
rows = {}
for line in open(sys.argv[1]):
    if line.startswith("{"):
        r = json.loads(line)
        rows[r["impl"]] = r
if "muster" in rows and "torch" in rows:
    m, t = rows["muster"], rows["torch"]
    print("bench-gpu: muster %.0f tok/s (MFU %.1f%%), torch %.0f tok/s (MFU %.1f%%, compile %s): "
          "muster/torch = %.2f; muster peak memory %.2f GiB vs ZeRO-3 estimate %.2f GiB"
          % (m["tokens_per_s"], 100 * m["mfu"], t["tokens_per_s"], 100 * t["mfu"], t["compile"],
             m["tokens_per_s"] / t["tokens_per_s"], m["peak_mem_bytes"] / 2**30,
             m["estimate_bytes"] / 2**30))
PY
