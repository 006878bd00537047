#!/usr/bin/env bash
# On the GPU machine: the KDA CUDA tests (tests/gpu/test_kda_cuda.c: the recurrence;
# tests/gpu/test_kda_layer.c: the plugin's whole layer against the CPU), `k3rt check-plugin kda`,
# optionally under compute-sanitizer at small T, and the benchmarks against
# flash-linear-attention (scripts/bench/kda_gpu.py: the recurrence, and with --layer the whole
# layer). Builds nothing: the build machine fills DIR with
#   bin/gpu_test_kda_cuda, bin/gpu_test_kda_layer, bin/k3rt, bin/bench_layer,
#   lib/libk3rt.so.2, lib/libk3rt_engine.so.2, lib/libk3rt_kda_cuda_bench.so (the core bench),
#   plugins/libk3rt_kda.so,
#   libs/ (liblua5.4, libjansson, libsubunit, OpenBLAS + libgfortran, libquadmath, libgomp:
#          scripts/gpu/collect_libs.sh says why), bench/kda_gpu.py and bench/bench_util.py
# and fla's Python package lies under FLA (it is pure Python + Triton).
#
#   scripts/gpu/kda.sh [DIR] [FLA]        (defaults .devbuild/kda, .ref/fla_pkg; logs under $OUT)
# KDA_SECTIONS (default "tests bench") picks from tests, layer, check, memcheck, bench,
# layerbench; memcheck also runs when a test fails. KDA_BENCH_SHAPES (B,T,H,D ...) replaces the
# benchmark's shapes; KDA_BENCH_ARGS adds arguments (--no-fla: k3rt alone, seconds instead of
# fla's minutes); KDA_LAYER_ARGS those of the layer benchmark.
set -u
DIR=${1:-.devbuild/kda}
FLA=${2:-.ref/fla_pkg}
LOGS=${OUT:-gpu-logs}
mkdir -p "$LOGS"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OPENBLAS_CORETYPE=SkylakeX PYTHONUNBUFFERED=1 OMP_WAIT_POLICY=passive
cuda_dirs=""
for lib in libcudart.so.13 libcublas.so.13 libcublasLt.so.13; do
    found=""
    for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-13*/lib64 \
             /usr/local/cuda-13*/lib /usr/lib/x86_64-linux-gnu; do
        if [ -e "$d/$lib" ]; then found=$d; break; fi
    done
    if [ -z "$found" ]; then
        nv=$(python3 -c 'import nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null)
        [ -n "$nv" ] && found=$(dirname "$(find "$nv" -name "$lib" 2>/dev/null | head -1)" 2>/dev/null)
    fi
    [ -n "$found" ] && case ":$cuda_dirs:" in *":$found:"*) ;; *) cuda_dirs="$cuda_dirs:$found" ;; esac
done
LIBPATH="$DIR/lib:$DIR/libs$cuda_dirs"
START=$(date +%s)
BUDGET=${KDA_BUDGET_S:-285}  # the whole script's seconds: the benchmark gets what is left
want() { case " ${KDA_SECTIONS:-tests bench} " in *" $1 "*) return 0 ;; esac; return 1; }
{
    echo "== $(date -u +%FT%TZ) $(hostname)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
} | tee "$LOGS/env.log"
status=0
if want tests; then
    t0=$(date +%s)
    LD_LIBRARY_PATH=$LIBPATH K3RT_THREADS=16 CK_DEFAULT_TIMEOUT=600 timeout 100 \
        "$DIR/bin/gpu_test_kda_cuda" > "$LOGS/test_kda_cuda.log" 2>&1
    rc=$?
    echo "gpu_test_kda_cuda: exit $rc ($(( $(date +%s) - t0 )) s)"
    grep -E "^(f32|bf16)|FAILED|two runs|Checks|passed|failed" "$LOGS/test_kda_cuda.log" | head -80
    [ $rc = 0 ] || { status=1; KDA_SECTIONS="${KDA_SECTIONS:-tests bench} memcheck"; }
fi
export K3RT_PLUGIN_PATH=$DIR/plugins
if want layer; then
    t0=$(date +%s)
    LD_LIBRARY_PATH=$LIBPATH CK_DEFAULT_TIMEOUT=600 timeout 200 \
        "$DIR/bin/gpu_test_kda_layer" > "$LOGS/test_kda_layer.log" 2>&1
    rc=$?
    echo "gpu_test_kda_layer: exit $rc ($(( $(date +%s) - t0 )) s)"
    grep -E "^(f32|bf16|documents|refused|cp_compose)|FAILED|Checks|Assertion" \
        "$LOGS/test_kda_layer.log" | head -60
    [ $rc = 0 ] || { status=1; KDA_SECTIONS="${KDA_SECTIONS:-tests bench} layermemcheck"; }
fi
if want check; then
    t0=$(date +%s)
    LD_LIBRARY_PATH=$LIBPATH timeout 120 "$DIR/bin/k3rt" check-plugin kda \
        > "$LOGS/check_plugin_kda.log" 2>&1
    rc=$?
    echo "k3rt check-plugin kda: exit $rc ($(( $(date +%s) - t0 )) s)"
    cat "$LOGS/check_plugin_kda.log" | head -30
    [ $rc = 0 ] || status=1
fi
if want layermemcheck; then
    t0=$(date +%s)
    LD_LIBRARY_PATH=$LIBPATH K3RT_KDA_TEST_SMALL=1 timeout 120 \
        compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$DIR/bin/gpu_test_kda_layer" > "$LOGS/memcheck_kda_layer.log" 2>&1
    rc=$?
    echo "memcheck gpu_test_kda_layer (small): exit $rc ($(( $(date +%s) - t0 )) s)"
    grep -E "ERROR SUMMARY|Invalid|at 0x|by thread|FAILED" "$LOGS/memcheck_kda_layer.log" | head -30
    [ $rc = 0 ] || status=1
fi
if want memcheck; then
    t0=$(date +%s)
    LD_LIBRARY_PATH=$LIBPATH K3RT_THREADS=16 K3RT_KDA_TEST_SMALL=1 timeout 70 \
        compute-sanitizer --tool memcheck --error-exitcode 9 --print-limit 20 \
        "$DIR/bin/gpu_test_kda_cuda" > "$LOGS/memcheck_kda_cuda.log" 2>&1
    rc=$?
    echo "memcheck gpu_test_kda_cuda (small): exit $rc ($(( $(date +%s) - t0 )) s)"
    grep -E "ERROR SUMMARY|Invalid|at 0x|by thread|FAILED" "$LOGS/memcheck_kda_cuda.log" | head -30
    [ $rc = 0 ] || status=1
fi
if want bench; then
    shapes=()
    for s in ${KDA_BENCH_SHAPES:-}; do shapes+=(--shape "$s"); done
    left=$(( BUDGET - ($(date +%s) - START) )); [ $left -gt 30 ] || left=30
    PYTHONPATH="$FLA:$DIR/bench${PYTHONPATH:+:$PYTHONPATH}" timeout $left \
        python3 "$DIR/bench/kda_gpu.py" --lib "$DIR/lib" --lib "$DIR/libs" --profile ${KDA_BENCH_ARGS:-} \
        --json "$LOGS/kda_bench.json" "${shapes[@]}" 2>&1 | tee "$LOGS/kda_bench.log" | grep -v Warning
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
if want layerbench; then
    left=$(( BUDGET - ($(date +%s) - START) )); [ $left -gt 30 ] || left=30
    PYTHONPATH="$FLA:$DIR/bench${PYTHONPATH:+:$PYTHONPATH}" K3RT_BENCH_LD_LIBRARY_PATH=$LIBPATH \
        timeout $left python3 "$DIR/bench/kda_gpu.py" --layer "$DIR/bin/bench_layer" \
        --plugin "$DIR/plugins/libk3rt_kda.so" ${KDA_LAYER_ARGS:-} --json "$LOGS/kda_layer.json" \
        2>&1 | tee "$LOGS/kda_layer_bench.log" | grep -v Warning
    [ "${PIPESTATUS[0]}" = 0 ] || status=1
fi
exit $status
