#!/bin/sh
# On a lent GPU machine, from the bundle tests/gpu-bundle.sh made: the GPU
# check (tests/gpu-check.sh) with the bundle's binaries and the machine's own
# python3 (which holds PyTorch), output also in $OUT/gpu-check.log.
set -u
[ -f .gpu/bundle.tar.xz ] || { echo "gpu-device: no .gpu/bundle.tar.xz: run sh tests/gpu-bundle.sh here and carry .gpu"; exit 2; }
G=${TMPDIR:-/tmp}/muster-gpu
rm -rf "$G" && mkdir -p "$G" && tar -C "$G" -xJf .gpu/bundle.tar.xz || exit 2
export LD_LIBRARY_PATH="$G/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
# The binaries were built elsewhere: say at once if this machine cannot run them.
"$G/build/muster-worker" --version || { echo "gpu-device: the bundle's binaries do not run here"; ldd "$G/build/muster-worker"; exit 1; }
PY=${PY:-$(command -v python3)}
"$PY" -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "devices", torch.cuda.device_count())'
log=${OUT:-/tmp}/gpu-check.log
{ BUILD=$G/build MUSTER_TORCH_PY=$PY REQUIRE_GPU=1 PYTHONUNBUFFERED=1 sh tests/gpu-check.sh; echo $? > "$G/rc"; } 2>&1 | tee "$log"
exit "$(cat "$G/rc")"
