#!/usr/bin/env bash
# On the GPU machine: block_attnres on CUDA in one call, each section with its own time limit:
# the GPU test (tests/gpu/test_attnres_cuda.c), `k3rt check-plugin block_attnres` (its CUDA
# section), compute-sanitizer memcheck on the test at d = 64 (K3RT_ATTNRES_TEST_SMALL=1) and the
# benchmark against fla's fused_attnres (scripts/bench/attnres_gpu.py). Builds nothing: DIR is
# scripts/gpu/pack.sh's slim copy of a CUDA build (bin/gpu_test_attnres_cuda, bin/k3rt, lib/
# with libk3rt_attnres_cuda_bench.so, plugins/), libs/ beside it, fla's Python package in FLA.
#
#   scripts/gpu/attnres.sh [DIR] [FLA]     (defaults .devbuild/attnres, .ref/fla_pkg; logs in $OUT)
# ATTNRES_SECTIONS (default "test check memcheck bench") picks sections.
#
# On the build machine, in the checkout the device call sends (the session's own repository):
#   scripts/gpu/pack.sh build-cuda .devbuild/attnres gpu_test_attnres_cuda
#   (cd .devbuild/attnres && rm -f lib/libk3rt.so lib/libk3rt.so.0.1.0 lib/libk3rt_engine.so \
#      lib/libk3rt_engine.so.0.1.0 lib/libk3rt_kda_cuda_bench.so && \
#      find plugins -type f ! -name libk3rt_block_attnres.so -delete && rm -rf fixtures)
#   mkdir -p .ref/fla_pkg && git -C <fla mirror> archive HEAD fla | tar -x -C .ref/fla_pkg
# (the slimming keeps the carry, with libs/ at 39 MiB, under 64 MiB), then run
#   bash scripts/gpu/attnres.sh   with carry [".devbuild/attnres", "libs", ".ref/fla_pkg"].
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/.devbuild/attnres}
FLA=${2:-$ROOT/.ref/fla_pkg}
LOGS=${OUT:-$ROOT/gpu-logs}
mkdir -p "$LOGS"
. "$ROOT/scripts/gpu/env.sh"
gpu_env_report "$LOGS/env.log" >/dev/null
want() { case " ${ATTNRES_SECTIONS:-test check memcheck bench} " in *" $1 "*) return 0 ;; esac; return 1; }
export K3RT_PLUGIN_PATH=$BUILD/plugins K3RT_THREADS=${K3RT_THREADS:-16} OMP_WAIT_POLICY=passive
export CK_DEFAULT_TIMEOUT=900
status=0
section() {  # name limit command...: runs it into $LOGS/name.log, prints the tail
    local name=$1 limit=$2 t0=$(date +%s)
    shift 2
    LD_LIBRARY_PATH=$LIBPATH timeout "$limit" "$@" > "$LOGS/$name.log" 2>&1
    local rc=$?
    echo "== $name: exit $rc ($(( $(date +%s) - t0 )) s)"
    [ $rc = 0 ] || status=1
}
if want test; then
    section test 45 "$BUILD/bin/gpu_test_attnres_cuda"
    grep -E "^(op|stack):|worst|FAILED|Checks|differs" "$LOGS/test.log" | head -80
fi
if want check; then
    section check 15 "$BUILD/bin/k3rt" check-plugin block_attnres
    grep -E "PASS|FAIL|SKIP|result" "$LOGS/check.log"
fi
if want memcheck; then
    K3RT_ATTNRES_TEST_SMALL=1 section memcheck 35 compute-sanitizer --tool memcheck \
        --error-exitcode 9 --print-limit 20 "$BUILD/bin/gpu_test_attnres_cuda"
    grep -E "ERROR SUMMARY|Invalid|FAILED|Checks" "$LOGS/memcheck.log" | head -20
fi
if want bench; then
    t0=$(date +%s)
    PYTHONPATH="$FLA:$ROOT/scripts/bench${PYTHONPATH:+:$PYTHONPATH}" timeout ${ATTNRES_BENCH_LIMIT:-100} \
        python3 "$ROOT/scripts/bench/attnres_gpu.py" --lib "$BUILD/lib" --lib "$ROOT/libs" \
        --runs 30 --warmup 5 --json "$LOGS/bench.json" > "$LOGS/bench.log" 2>&1
    rc=$?
    echo "== bench: exit $rc ($(( $(date +%s) - t0 )) s)"
    grep -v -i warning "$LOGS/bench.log" | tail -20
    [ $rc = 0 ] || status=1
fi
exit $status
