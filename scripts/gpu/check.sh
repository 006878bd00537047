#!/usr/bin/env bash
# On the GPU machine: runs every GPU test (build/bin/gpu_test_*), optionally under
# compute-sanitizer, then the benchmarks against PyTorch. Builds nothing: the binaries are built
# on the build machine and carried here.
#
#   scripts/gpu/check.sh [build dir]         (default build-cuda; logs under $OUT, else gpu-logs/)
#
# Carry (paths from the repository root):
#   <build>/lib, <build>/plugins, <build>/bin   libk3rt with the CUDA backend, the plugins, the
#                                              k3rt command, gpu_test_* and bench_* programs
#   libs                               filled by scripts/gpu/collect_libs.sh on the build machine:
#                                      liblua5.4.so.0, libjansson.so.4, libsubunit.so.0 (Check is
#                                      linked statically, libcheck_pic.a), libopenblas.so.0 (OpenMP
#                                      build) with libgfortran.so.5, libquadmath.so.0, libgomp.so.1
# CUDA's libcudart, libcublas and libcublasLt (.so.13) come from the GPU image: its toolkit, or
# the nvidia wheels next to PyTorch.
#
# Environment: K3RT_GPU_SECTIONS (default "tests bench") picks from tests, memcheck, racecheck,
# parity (scripts/gpu/k3_parity.sh), bench; K3RT_GPU_TESTS (default all) names the gpu_test_*
# programs to run; K3RT_BENCH_RUNS (default 30) sets the timed runs per op.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-${K3RT_BUILD:-$ROOT/build-cuda}}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LOGS=${OUT:-$ROOT/gpu-logs}
mkdir -p "$LOGS"

. "$ROOT/scripts/gpu/env.sh"

gpu_env_report "$LOGS/env.log"

want() { case " ${K3RT_GPU_SECTIONS:-tests bench} " in *" $1 "*) return 0 ;; esac; return 1; }
export K3RT_PLUGIN_PATH=$BUILD/plugins K3RT_BIN=$BUILD/bin/k3rt K3RT_SOURCE_DIR=$ROOT
export CK_DEFAULT_TIMEOUT=900 K3RT_THREADS=${K3RT_THREADS:-8}
tests=()
for t in ${K3RT_GPU_TESTS:-$(cd "$BUILD/bin" && ls gpu_test_* 2>/dev/null)}; do
    tests+=("$BUILD/bin/$t")
done
missing=$(LD_LIBRARY_PATH=$LIBPATH ldd "${tests[@]}" "$BUILD/bin/k3rt" 2>&1 | grep "not found" | sort -u)
if [ -n "$missing" ]; then
    echo "libraries not found (carry them in libs/):"
    echo "$missing"
    exit 1
fi

status=0
summary=()
# Each program runs under its own `timeout`, which leads a process group of its own, so a
# signal to this script's group (an outer `timeout` stopping it) does not reach it: pass it on,
# or the test keeps the GPU busy behind whatever runs next.
child=""
trap '[ -n "$child" ] && kill -TERM "$child" 2>/dev/null; exit 143' TERM INT
run_logged() {  # name log command...
    local name=$1 log=$2; shift 2
    local t0=$(date +%s)
    LD_LIBRARY_PATH=$LIBPATH timeout 900 "$@" > "$log" 2>&1 &
    child=$!
    wait "$child"
    local rc=$?
    child=""
    summary+=("$name: exit $rc ($(( $(date +%s) - t0 )) s, log $(basename "$log"))")
    [ $rc = 0 ] || [ $rc = 77 ] || status=1
    return $rc
}

for t in "${tests[@]}"; do
    name=$(basename "$t")
    want tests && run_logged "$name" "$LOGS/$name.log" "$t"
    # The sanitizers replay the fast tests; whole training runs under them would take hours.
    case $name in gpu_test_train_bf16) continue ;; esac
    want memcheck && run_logged "memcheck $name" "$LOGS/$name.memcheck.log" \
        compute-sanitizer --tool memcheck --error-exitcode 9 "$t"
    want racecheck && run_logged "racecheck $name" "$LOGS/$name.racecheck.log" \
        compute-sanitizer --tool racecheck --racecheck-report hazard --error-exitcode 9 "$t"
done

# Issue 20's parity: K3 models trained on the GPU against the PyTorch peer (f32 and bf16).
want parity && run_logged "parity" "$LOGS/parity.log" "$ROOT/scripts/gpu/k3_parity.sh" "$BUILD" \
    "$LOGS/parity"

if want bench; then
    run_logged "bench ops" "$LOGS/bench.log" python3 "$ROOT/scripts/bench/gpu_ops.py" \
        --bench "$BUILD/bin/bench_gpu_ops" --runs "${K3RT_BENCH_RUNS:-30}" --json "$LOGS/gpu_ops.json"
    if [ -x "$BUILD/bin/bench_mla_attention" ]; then
        run_logged "bench mla" "$LOGS/bench_mla.log" python3 "$ROOT/scripts/bench/mla_attention.py" \
            --bench "$BUILD/bin/bench_mla_attention" --json "$LOGS/mla_attention.json"
    fi
fi

echo
echo "================ summary ================"
printf '%s\n' "${summary[@]}"
for log in "$LOGS"/gpu_test_*.log; do
    [ -e "$log" ] || continue
    grep -H -E "^[0-9]+%: Checks|:(F|E):|step:|validation loss|ERROR SUMMARY|skipped" "$log" | cut -c1-400
done
for log in "$LOGS"/bench*.log; do
    [ -e "$log" ] || continue
    echo "== $(basename "$log")"
    tail -40 "$log"
done
exit $status
