# Shared by the memory checkpoint benchmarks (bench_memrep.sh,
# bench_memckpt_recovery.sh); sourced, not run (run.sh runs bench_*.sh only).
# Needs BUILD, PY, D (the benchmark's directory, with D/token) and pids.

free_port() { "$PY" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# mem_job DIR: musterd on DIR/job.json and agents a and b of 1 rank, each in a
# mount namespace of its own (its tmpfs that node's alone); logs in DIR.
# Sets daemon and agents, and adds them to pids.
mem_job() {
    ctl=$(free_port); http=$(free_port)
    "$BUILD/musterd" --job "$1/job.json" --listen "127.0.0.1:$ctl" --http "127.0.0.1:$http" \
        --state-dir "$1/state" --token-file "$D/token" > "$1/musterd.log" 2>&1 &
    daemon=$!
    pids="$pids $daemon"
    agents=""
    for n in a b; do
        unshare -m --propagation private "$BUILD/muster-worker" --daemon "127.0.0.1:$ctl" --node $n \
            --devices cpu:1 --state-dir "$1/agent-state" --token-file "$D/token" > "$1/agent-$n.log" 2>&1 &
        agents="$agents $!"
        pids="$pids $!"
    done
}
