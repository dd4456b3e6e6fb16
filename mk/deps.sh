#!/bin/sh
# Installs the Debian packages muster needs that are missing, and does
# nothing when all are there. `deps.sh build` covers building and testing
# (PyTorch included: make check runs a real DDP program as ranks; etcd-server:
# the failover tests run three etcd members on loopback);
# `deps.sh bench` adds what the reference benchmarks need besides.
set -eu

build_pkgs="gcc g++ make pkg-config libuv1-dev libmicrohttpd-dev libjansson-dev \
check libsubunit-dev libssl-dev libopenblas-dev libcurl4-openssl-dev libfast-float-dev curl \
python3 procps iproute2 python3-torch etcd-server"
bench_pkgs="python3-numpy time"

case "${1:-build}" in
build) want=$build_pkgs ;;
bench) want="$build_pkgs $bench_pkgs" ;;
*) echo "usage: deps.sh build|bench" >&2; exit 2 ;;
esac

missing=""
for p in $want; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$status" in
    *"install ok installed"*) ;;
    *) missing="$missing $p" ;;
    esac
done
[ -z "$missing" ] && exit 0

echo "deps: installing missing packages:$missing"
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: not root; run: sudo apt-get install -y$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing
