#!/bin/sh
# Installs the Debian packages muster needs that are missing, then makes
# the build's Python environment (.venv at the top of the tree: PyTorch
# 2.x, DeepSpeed, accelerate and the Python rank client, pinned in
# mk/torch-requirements.txt), and does nothing when all are there.
# `deps.sh build` covers building and testing (make check runs real
# PyTorch, DeepSpeed and accelerate programs as ranks); `deps.sh bench`
# adds what the reference benchmarks need besides; `deps.sh venv` makes
# only the environment, `deps.sh system` only the Debian packages of build
# (make check makes the environment while it builds). MUSTER_TORCH_ENV=off leaves the environment out
# (the tests that need it then skip, or fail under CI). etcd-server: the
# failover tests run three etcd members on loopback; etcd-client: etcdctl
# sets up TLS and auth in store_tls_auth.sh. chromium: the dashboard
# test renders the page in headless Chromium (about 120 MB to download with
# its libraries, without recommends; Chromium itself is 350 MB installed).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)

build_pkgs="gcc g++ make pkg-config libuv1-dev libmicrohttpd-dev libjansson-dev \
check libsubunit-dev libssl-dev libopenblas-dev libcurl4-openssl-dev libfast-float-dev curl \
python3 python3-venv python3-dev procps iproute2 openssl etcd-server etcd-client chromium"
# python3-torch: Debian's PyTorch (1.13, OpenBLAS) is the reference of
# tests/bench/bench_train_cpu.sh and tests/reference/gen_fixture.py; user
# programs run with .venv's PyTorch 2.x.
bench_pkgs="python3-numpy time python3-torch"

# torch_env: .venv from mk/torch-requirements.txt, unless its stamp says it
# was made from this very file (and client, at this path). The stamp is
# written last, so an interrupted install is made again from nothing.
torch_env() {
    [ "${MUSTER_TORCH_ENV:-on}" = off ] && return 0
    venv=$root/.venv
    req=$root/mk/torch-requirements.txt
    want_stamp="$(cat "$req" "$root/clients/python/pyproject.toml" | sha256sum | cut -d' ' -f1) $root"
    [ "$(cat "$venv/muster-stamp" 2>/dev/null)" = "$want_stamp" ] && return 0
    if [ -e "$venv" ] && [ ! -e "$venv/muster-owned" ]; then
        echo "deps: $venv exists and was not made by mk/deps.sh; move it away (or MUSTER_TORCH_ENV=off)" >&2
        return 1
    fi
    echo "deps: making the Python environment $venv (PyTorch, DeepSpeed, accelerate; ~5 GB, minutes)"
    rm -rf "$venv"
    mkdir "$venv"
    : > "$venv/muster-owned"
    /usr/bin/python3 -m venv "$venv"
    pip="$venv/bin/pip install --no-cache-dir --no-deps --quiet"
    grep -v '^deepspeed==' "$req" > "$venv/wheels.txt"
    $pip --only-binary :all: -r "$venv/wheels.txt"
    # shellcheck disable=SC2046
    DS_ACCELERATOR=cpu DS_BUILD_OPS=0 DS_BUILD_SHM_COMM=1 \
        $pip --no-build-isolation --use-pep517 $(grep '^deepspeed==' "$req")
    # Editable: the environment runs this tree's client as it is edited.
    $pip --no-build-isolation --editable "$root/clients/python"
    # Build backend for tests/integration/rank_client_package.sh's offline `pip install clients/python`.
    # shellcheck disable=SC2046
    "$venv/bin/pip" download --no-cache-dir --no-deps --quiet --only-binary :all: -d "$venv/wheels" \
        $(grep '^setuptools==' "$req")
    "$venv/bin/pip" check
    echo "$want_stamp" > "$venv/muster-stamp"
    echo "deps: $venv ready ($(du -sh "$venv" | cut -f1))"
}

env_too=torch_env
case "${1:-build}" in
build) want=$build_pkgs ;;
bench) want="$build_pkgs $bench_pkgs" ;;
system) want=$build_pkgs; env_too=true ;;
venv) torch_env; exit ;;
*) echo "usage: deps.sh build|bench|system|venv" >&2; exit 2 ;;
esac

missing=""
for p in $want; do
    status=$(dpkg-query -W -f='${Status}' "$p" 2>/dev/null || true)
    case "$status" in
    *"install ok installed"*) ;;
    *) missing="$missing $p" ;;
    esac
done
if [ -z "$missing" ]; then
    $env_too
    exit
fi

echo "deps: installing missing packages:$missing"
if [ "$(id -u)" -ne 0 ]; then
    echo "deps: not root; run: sudo apt-get install -y$missing" >&2
    exit 1
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
# shellcheck disable=SC2086
apt-get install -y -qq --no-install-recommends $missing
$env_too
