#!/bin/sh
# Packs what `make check-gpu` needs on a lent GPU machine (the device tool's
# `run`), which has CUDA, NCCL and a python3 with PyTorch but not libuv,
# jansson, libmicrohttpd or OpenBLAS, and nothing to install them from:
#   build/   the built binaries, the GPU module, gpu-check, the Python client
#   lib/     every shared library they link that is not glibc's or CUDA's,
#            copied from this machine
# in .gpu/bundle.tar.xz (about 13 MB: OpenBLAS alone is 35 MB unpacked, and
# what a call carries is bounded at 64 MiB).
# Then, in one device call: carry [".gpu"], command "sh tests/gpu-device.sh".
# Run after `make all tests` with CUDA (nvcc at /usr/local/cuda). .gpu/ is ignored.
set -eu
BUILD=${BUILD:-build}
[ -f "$BUILD/muster-train-gpu.so" ] || { echo "gpu-bundle: no $BUILD/muster-train-gpu.so (build with nvcc first)"; exit 1; }
make -s "$BUILD/tests/gpu-check" "$BUILD/tests/gpu-bench" > /dev/null
rm -rf .gpu
mkdir -p .gpu/build/tests .gpu/lib
cp "$BUILD/muster-worker" "$BUILD/musterd" "$BUILD/musterctl" "$BUILD/muster-train" "$BUILD/muster-train-gpu.so" .gpu/build/
cp "$BUILD/tests/gpu-check" "$BUILD/tests/gpu-bench" .gpu/build/tests/
cp -rL "$BUILD/python" .gpu/build/python
find .gpu/build/python -name __pycache__ -prune -exec rm -rf {} +
for b in .gpu/build/muster-worker .gpu/build/musterd .gpu/build/musterctl .gpu/build/muster-train \
         .gpu/build/muster-train-gpu.so .gpu/build/tests/gpu-check .gpu/build/tests/gpu-bench; do
    ldd "$b" | awk '$2 == "=>" && $3 ~ /^\// { print $3 }'
done | sort -u | while read -r lib; do
    case "$lib" in
        /usr/local/cuda*|*/libc.so*|*/libm.so*|*/libpthread.so*|*/libdl.so*|*/librt.so*|*/ld-linux*) ;;
        *) cp -L "$lib" .gpu/lib/ ;;
    esac
done
nlib=$(ls .gpu/lib | wc -l)
tar -C .gpu -cJf .gpu/bundle.tar.xz build lib
rm -rf .gpu/build .gpu/lib
echo "gpu-bundle: .gpu/bundle.tar.xz, $(du -h .gpu/bundle.tar.xz | cut -f1) ($nlib libraries); device run: carry [\".gpu\"], sh tests/gpu-device.sh"
