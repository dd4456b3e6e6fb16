#!/bin/sh
# On a GPU node: torchrun's device contract under the agent, for real.
# muster-worker --local runs one rank of tests/torch/gpu_contract.py per GPU;
# each does set_device(LOCAL_RANK), joins NCCL, all-reduces; rank 0 asks NCCL's
# RAS service for the job's status; every rank dumps the flight recorder.
# Checked here: cuda:LOCAL_RANK is, by UUID (nvidia-smi), the GPU the agent
# started the rank on; the all-reduce's sum; TORCH_NCCL_ASYNC_ERROR_HANDLING
# unset (torch's default); printed: the NCCL transport between local ranks
# (NCCL_DEBUG=INFO), RAS's answer, the recorder's entries. Prints "skipped"
# and exits 0 without nvidia-smi or a GPU. Usage: BUILD=build PY=python3 sh tests/gpu-contract.sh
set -u
BUILD=${BUILD:-build}
PY=${PY:-.venv/bin/python}
command -v nvidia-smi > /dev/null 2>&1 || { echo "gpu contract: no nvidia-smi: skipped"; exit 0; }
n=$(nvidia-smi -L 2> /dev/null | grep -c '^GPU ')
[ "$n" -ge 1 ] || { echo "gpu contract: no GPU: skipped"; exit 0; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
devs=$(seq -s, 0 $((n - 1)))
nvidia-smi --query-gpu=index,uuid --format=csv,noheader > "$dir/uuids"
cat > "$dir/job.json" <<JSON
{"name": "gpu-contract", "nodes": 1, "max_restarts": 0,
 "rank_cmd": ["$PY", "$(pwd)/tests/torch/gpu_contract.py"]}
JSON
echo "gpu contract: $n GPU(s), muster-worker --local --devices gpu:$devs, one NCCL rank each"
start=$(date +%s)
NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,P2P,SHM,NET TORCH_FR_BUFFER_SIZE=2000 \
    timeout 150 "$BUILD/muster-worker" --local --job "$dir/job.json" --devices "gpu:$devs" > "$dir/out" 2>&1
rc=$?
echo "gpu contract: the launcher exited $rc after $(( $(date +%s) - start )) s"
python3 - "$dir/out" "$dir/uuids" "$n" "$rc" <<'PY'
import json, re, sys
text = open(sys.argv[1], errors="replace").read()
uuids = {}
for line in open(sys.argv[2]):
    idx, uuid = [f.strip() for f in line.split(",", 1)]
    uuids[int(idx)] = uuid.lower().removeprefix("gpu-")
n = int(sys.argv[3])
launcher_rc = int(sys.argv[4])
started = {int(r): (int(l), int(g)) for r, l, g in
           re.findall(r"started rank (\d+) \(local rank (\d+), gpu (\d+), pid", text)}
results = [json.loads(m) for m in re.findall(r"gpu-contract (\{.*\})", text)]
bad = []
if len(results) != n:
    bad.append(f"{len(results)} rank results for {n} GPUs")
for r in results:
    rank, local = r["rank"], r["local_rank"]
    gpu = started.get(rank, (None, None))[1]
    head = f"rank {rank} (local {local}, agent's gpu {gpu}, visible '{r['visible']}')"
    if "error" in r:
        bad.append(f"{head}: {r['error']}")
        continue
    vis = r["visible"].split(",")
    ok_vis = local < len(vis) and vis[local] == str(gpu)
    ok_uuid = gpu in uuids and r["uuid"].lower() == uuids[gpu]
    ok_sum = abs(r["sum"] - r["want"]) < 1e-3
    print(f"  {head}: cuda:{local} is {'the agent GPU' if ok_uuid else 'ANOTHER GPU'} "
          f"(uuid {r['uuid']}); visible[LOCAL_RANK] {'ok' if ok_vis else 'WRONG'}; all-reduce {r['sum']:g} "
          f"(want {r['want']:g}); TORCH_NCCL_ASYNC_ERROR_HANDLING {r['nccl_error_handling']}")
    print(f"    flight recorder: {json.dumps(r.get('fr'))}")
    if "ras" in r:
        ras = r["ras"]
        if "error" in ras:
            print(f"    RAS: {ras['error']}")
        else:
            print(f"    RAS: {ras['server']}, {ras['bytes']} bytes; first lines:")
            for l in ras["head"][:25]:
                print(f"      | {l}")
    if not (ok_vis and ok_uuid and ok_sum):
        bad.append(head)
    if r["nccl_error_handling"] != "unset":
        bad.append(f"{head}: TORCH_NCCL_ASYNC_ERROR_HANDLING={r['nccl_error_handling']}, torch's default expected")
for t in sorted(set(re.findall(r"Channel \d+/\d+ : \d+\[\d+\] -> \d+\[\d+\] via (\S+)", text)))[:5]:
    print(f"  NCCL transport between local ranks: via {t}")
if launcher_rc != 0:
    bad.append(f"the launcher exited {launcher_rc} (0: the job completed)")
if bad:
    print("gpu contract: FAILED: " + "; ".join(bad))
    print("---- launcher output (last 60 lines) ----")
    print("\n".join(text.splitlines()[-60:]))
    sys.exit(1)
print(f"gpu contract: {n} rank(s) selected their own GPU through set_device(LOCAL_RANK), NCCL all-reduce right: ok")
PY
