#!/usr/bin/env bash
# On the GPU machine: per_head_muon's CUDA test, `k3rt check-plugin per_head_muon` (default
# options, then Newton-Schulz in f32), the K3-mini optimizer-step benchmark against PyTorch,
# with compute-sanitizer memcheck of the test (time-limited) before the benchmark.
# Builds nothing: the binaries are built on the build machine and carried here.
#
#   scripts/gpu/muon.sh [build dir]          (default .devbuild/muon; logs under $OUT, else gpu-logs/)
#
# Build and pack (on the build machine):
#   ninja -C build-cuda k3rt_cli k3rt_plugin_per_head_muon gpu_test_per_head_muon_cuda bench_muon_step
#   scripts/gpu/pack.sh build-cuda .devbuild/muon gpu_test_per_head_muon_cuda bench_muon_step
# and carry the paths pack.sh prints. K3RT_MUON_MEMCHECK_S (default 60) limits memcheck, K3RT_MUON_BENCH_S (150) the bench.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/.devbuild/muon}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LOGS=${OUT:-$ROOT/gpu-logs}
mkdir -p "$LOGS"
. "$ROOT/scripts/gpu/env.sh"
export K3RT_PLUGIN_PATH=$BUILD/plugins OMP_WAIT_POLICY=passive CK_DEFAULT_TIMEOUT=300
TEST=$BUILD/bin/gpu_test_per_head_muon_cuda
gpu_env_report "$LOGS/env.log"
summary=()
step() {  # name log seconds command...
    local name=$1 log=$2 limit=$3 t0=$(date +%s)
    shift 3
    echo "== $(date -u +%T) $name (log $(basename "$log"))"
    LD_LIBRARY_PATH=$LIBPATH timeout "$limit" "$@" > "$log" 2>&1
    local rc=$?
    summary+=("$name: exit $rc ($(( $(date +%s) - t0 )) s)")
}
step test "$LOGS/test.log" 60 "$TEST"
step check-plugin "$LOGS/check.log" 60 "$BUILD/bin/k3rt" check-plugin per_head_muon
step "check-plugin full" "$LOGS/check_full.log" 60 "$BUILD/bin/k3rt" check-plugin per_head_muon \
    --config '{"ns_precision": "full"}'
step memcheck "$LOGS/memcheck.log" "${K3RT_MUON_MEMCHECK_S:-60}" \
    compute-sanitizer --tool memcheck --error-exitcode 9 "$TEST"
echo "== $(date -u +%T) bench (log bench.log)"
t0=$(date +%s)
timeout "${K3RT_MUON_BENCH_S:-150}" python3 "$ROOT/scripts/bench/muon_step.py" --bench "$BUILD/bin/bench_muon_step" \
    --json "$LOGS/muon_step.json" > "$LOGS/bench.log" 2>&1
summary+=("bench: exit $? ($(( $(date +%s) - t0 )) s)")
echo "================ summary ================"
printf '%s\n' "${summary[@]}"
grep -h -E "^[0-9]+%: Checks|:(F|E):|rel rms" "$LOGS/test.log" | cut -c1-200 | tail -60
grep -h -E "PASS|FAIL|SKIP" "$LOGS/check.log" "$LOGS/check_full.log" | cut -c1-250
tail -12 "$LOGS/bench.log"
grep -h -E "ERROR SUMMARY|^[0-9]+%: Checks" "$LOGS/memcheck.log"
