#!/usr/bin/env bash
# On the GPU machine: the mla plugin's CUDA test (attention core and whole plugin against the
# CPU), the attention benchmark against PyTorch SDPA, then compute-sanitizer memcheck and
# racecheck of the test on its small shapes. Builds nothing: the binaries are built on the build
# machine and carried here.
#
#   scripts/gpu/mla.sh [build dir]            (default build-mla; logs under $OUT, else gpu-logs/)
#
# Build (on the build machine):
#   cmake -S . -B build-mla -DK3RT_CUDA=ON -DK3RT_CUDA_ARCHS=90a
#   cmake --build build-mla --target k3rt_plugin_mla gpu_test_mla_cuda bench_mla_attention -j2
# Carry: build-mla/lib build-mla/plugins/libk3rt_mla.so build-mla/bin/gpu_test_mla_cuda
#        build-mla/bin/bench_mla_attention libs   (libs/: scripts/gpu/collect_libs.sh; the same
#        libraries as the op tests: lua, jansson, subunit, OpenBLAS and its runtime)
#
# Environment: K3RT_MLA_STEPS (default "test bench memcheck racecheck"; also "ncu": Nsight Compute
# on one launch of each tensor-core kernel at B=2, T=4096, H=8, 192/128) picks the steps;
# K3RT_BENCH_RUNS (default 20) the timed runs per measurement; K3RT_MLA_SHAPES (e.g.
# "8,4096,8,192,128 8,4096,16,128,128") the bench shapes instead of its defaults;
# K3RT_MLA_MEMCHECK_S (default 150) and K3RT_MLA_RACECHECK_S (default 200) the sanitizers' time
# limits in seconds; K3RT_CUDNN_LIBRARY the libcudnn.so.9 the plugin loads (default: the
# system's), e.g. PyTorch's copy for a comparison at the same cuDNN version.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-${K3RT_BUILD:-$ROOT/build-mla}}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LOGS=${OUT:-$ROOT/gpu-logs}
STEPS=${K3RT_MLA_STEPS:-test bench memcheck racecheck}
mkdir -p "$LOGS"

. "$ROOT/scripts/gpu/env.sh"
export OMP_WAIT_POLICY=passive
export K3RT_PLUGIN_PATH=$BUILD/plugins

TEST=$BUILD/bin/gpu_test_mla_cuda
BENCH=$BUILD/bin/bench_mla_attention
gpu_env_report "$LOGS/env.log"
missing=$(LD_LIBRARY_PATH=$LIBPATH ldd "$TEST" "$BENCH" "$BUILD/plugins/libk3rt_mla.so" 2>&1 |
          grep "not found" | sort -u)
if [ -n "$missing" ]; then
    echo "libraries not found (carry them in libs/):"
    echo "$missing"
    exit 1
fi

want() { case " $STEPS " in *" $1 "*) return 0 ;; esac; return 1; }
test_rc=- bench_rc=- mem_rc=- race_rc=-

if want test; then
    echo "== $(date -u +%T) test: $TEST (log: $LOGS/test_mla_cuda.log)"
    LD_LIBRARY_PATH=$LIBPATH timeout 150 "$TEST" > "$LOGS/test_mla_cuda.log" 2>&1
    test_rc=$?
fi
if want bench; then
    echo "== $(date -u +%T) bench (log: $LOGS/bench_mla.log)"
    shapes=()
    for s in ${K3RT_MLA_SHAPES:-}; do shapes+=(--shape "$s"); done
    timeout 240 python3 "$ROOT/scripts/bench/mla_attention.py" --bench "$BENCH" \
        --runs "${K3RT_BENCH_RUNS:-20}" --json "$LOGS/mla_attention.json" \
        ${shapes[@]+"${shapes[@]}"} \
        > "$LOGS/bench_mla.log" 2>&1
    bench_rc=$?
fi
if want ncu; then
    echo "== $(date -u +%T) ncu (log: $LOGS/ncu.log, $LOGS/ncu_metrics.log)"
    prof=(ncu --clock-control none -k "regex:fwd_kernel|dkdv_kernel|dq_kernel" -c 3)
    run=("$BENCH" --runs 1 --warmup 0 --shape 2,4096,8,192,128)
    LD_LIBRARY_PATH=$LIBPATH timeout 100 "${prof[@]}" --section SpeedOfLight \
        --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section Occupancy \
        --section WarpStateStats "${run[@]}" > "$LOGS/ncu.log" 2>&1
    m=gpu__time_duration.sum,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active
    m=$m,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed
    m=$m,l1tex__data_bank_conflicts_pipe_lsu_mem_shared.sum,sm__warps_active.avg.per_cycle_active
    for r in barrier short_scoreboard long_scoreboard mio_throttle math_pipe_throttle wait \
             not_selected selected dispatch_stall no_instruction lg_throttle; do
        m=$m,smsp__warp_issue_stalled_${r}_per_warp_active.pct
    done
    LD_LIBRARY_PATH=$LIBPATH timeout 100 "${prof[@]}" --metrics "$m" "${run[@]}" \
        > "$LOGS/ncu_metrics.log" 2>&1
fi
# memcheck over the whole test; racecheck over the attention core (the shared-memory kernels).
for tool in memcheck racecheck; do
    want $tool || continue
    echo "== $(date -u +%T) compute-sanitizer $tool, small shapes (log: $LOGS/$tool.log)"
    pick=(); [ $tool = racecheck ] && pick=(CK_RUN_CASE=core)
    limit=${K3RT_MLA_MEMCHECK_S:-150}; [ $tool = racecheck ] && limit=${K3RT_MLA_RACECHECK_S:-200}
    lines=(); command -v stdbuf > /dev/null && lines=(stdbuf -oL)  # progress survives a timeout
    env LD_LIBRARY_PATH="$LIBPATH" K3RT_MLA_TEST_SMALL=1 ${pick[@]+"${pick[@]}"} timeout $limit \
        ${lines[@]+"${lines[@]}"} compute-sanitizer --tool $tool --error-exitcode 9 "$TEST" \
        > "$LOGS/$tool.log" 2>&1
    rc=$?
    [ $tool = memcheck ] && mem_rc=$rc || race_rc=$rc
done

echo
echo "================ summary ================"
if [ "$test_rc" != - ]; then
    echo "test: exit $test_rc (0 passed, 1 failed, 77 no GPU, 124 timed out)"
    grep -E "^(attention|plugin|FAILED)" "$LOGS/test_mla_cuda.log" | cut -c1-220
    grep -E "^[0-9]+%: Checks|:(F|E):" "$LOGS/test_mla_cuda.log" | cut -c1-400
    [ "$test_rc" != 0 ] && tail -5 "$LOGS/test_mla_cuda.log"
fi
for tool in memcheck racecheck; do
    rc=$mem_rc; [ $tool = racecheck ] && rc=$race_rc
    [ "$rc" = - ] && continue
    echo "$tool: exit $rc (0 clean, 9 errors found, 124 timed out)"
    grep -m3 -E "ERROR SUMMARY|RACECHECK SUMMARY|Invalid|Race|hazard" "$LOGS/$tool.log"
    # cuDNN's wgmma kernels synchronise through asynchronous barriers racecheck does not model:
    # count apart what it reports in them and in k3rt's own kernels.
    [ $tool = racecheck ] && echo "races reported in cuDNN's kernels:" \
        "$(grep "Race reported" "$LOGS/$tool.log" | grep -c cudnn_generated)," \
        "in k3rt's: $(grep "Race reported" "$LOGS/$tool.log" | grep -vc cudnn_generated)"
    grep -E "^[0-9]+%: Checks" "$LOGS/$tool.log"
done
if [ -e "$LOGS/ncu_metrics.log" ]; then
    echo "ncu:"
    grep -E "kernel|Duration|Throughput|Achieved Occupancy|Issue Slots|Warp Cycles" \
        "$LOGS/ncu.log" | cut -c1-110
    grep -E "kernel|duration|pct|sum|per_cycle|ERR" "$LOGS/ncu_metrics.log" | cut -c1-110
fi
if [ "$bench_rc" != - ]; then
    echo "bench: exit $bench_rc"
    if [ "$bench_rc" = 0 ]; then
        sed -n '/^TFLOP\/s/,$p' "$LOGS/bench_mla.log"
    else
        tail -20 "$LOGS/bench_mla.log"
    fi
fi
ok=1
for rc in "$test_rc" "$bench_rc" "$mem_rc" "$race_rc"; do
    [ "$rc" = - ] || [ "$rc" = 0 ] || ok=0
done
[ $ok = 1 ]
