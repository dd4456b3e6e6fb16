# Sourced by the training benchmarks (POSIX sh). Sets DATA to the corpus
# (or a generated stand-in when ../shared/data is absent) and T to a temp dir
# removed on exit, and names the OpenBLAS kernels muster-train picks for
# itself (worker/train/train_main.c), so that every side of a comparison runs the
# same ones. NAME must be set first.
DATA=${MUSTER_DATA:-../shared/data/tinyshakespeare.txt}
T=$(mktemp -d "${TMPDIR:-/tmp}/muster-bench-$NAME.XXXXXX")
trap 'rm -rf "$T"' EXIT INT TERM
if [ ! -f "$DATA" ]; then
    DATA=$T/text.txt
    awk 'BEGIN { srand(3); for (i = 0; i < 20000; i++) print "to be or not to be " int(rand() * 1000) }' > "$DATA"
fi
if [ -z "${OPENBLAS_CORETYPE:-}" ]; then
    if grep -qw avx512f /proc/cpuinfo; then export OPENBLAS_CORETYPE=SkylakeX
    elif grep -qw avx2 /proc/cpuinfo; then export OPENBLAS_CORETYPE=Haswell
    fi
fi
