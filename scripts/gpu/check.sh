#!/usr/bin/env bash
# On the GPU machine: runs the CUDA op tests, then the op benchmark against PyTorch. Builds
# nothing: the binaries are built on the build machine and carried here.
#
#   scripts/gpu/check.sh [build dir]         (default build-cuda; logs under $OUT, else gpu-logs/)
#
# Carry (paths from the repository root):
#   build-cuda/lib                     libk3rt.so* built with the CUDA backend (K3RT_HAVE_CUDA)
#   build-cuda/bin/gpu_test_cuda_ops   tests/gpu/test_cuda_ops.c
#   build-cuda/bin/bench_gpu_ops       scripts/bench/gpu_ops_bench.c
#   libs                               filled by scripts/gpu/collect_libs.sh on the build machine:
#                                      liblua5.4.so.0, libjansson.so.4, libsubunit.so.0 (Check is
#                                      linked statically, libcheck_pic.a), libopenblas.so.0 (OpenMP
#                                      build) with libgfortran.so.5, libquadmath.so.0, libgomp.so.1
# CUDA's libcudart, libcublas and libcublasLt (.so.13) come from the GPU image: its toolkit, or
# the nvidia wheels next to PyTorch.
#
# Environment: K3RT_GPU_MEMCHECK=1 also runs the tests under compute-sanitizer (slow);
# K3RT_BENCH_RUNS (default 30) sets the timed runs per op.
set -u
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-${K3RT_BUILD:-$ROOT/build-cuda}}
case "$BUILD" in /*) ;; *) BUILD=$ROOT/$BUILD ;; esac
LOGS=${OUT:-$ROOT/gpu-logs}
mkdir -p "$LOGS"

# Never NVLink multicast on these machines; this image's OpenBLAS misdetects the CPU.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export OPENBLAS_CORETYPE=SkylakeX OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
export PYTHONUNBUFFERED=1

# Directories holding CUDA's libraries: the toolkit's first, then PyTorch's wheels.
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
# Only k3rt's programs see libs/: PyTorch keeps the image's own libraries.
LIBPATH="$BUILD/lib:$ROOT/libs$cuda_dirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export K3RT_BENCH_LD_LIBRARY_PATH=$LIBPATH

{
    echo "== $(date -u +%FT%TZ) $(hostname)"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
    echo "library path of k3rt's programs: $LIBPATH"
} | tee "$LOGS/env.log"

TEST=$BUILD/bin/gpu_test_cuda_ops
BENCH=$BUILD/bin/bench_gpu_ops
missing=$(LD_LIBRARY_PATH=$LIBPATH ldd "$TEST" "$BENCH" 2>&1 | grep "not found" | sort -u)
if [ -n "$missing" ]; then
    echo "libraries not found (carry them in libs/):"
    echo "$missing"
    exit 1
fi

echo "== tests: $TEST (log: $LOGS/test_cuda_ops.log)"
LD_LIBRARY_PATH=$LIBPATH timeout 540 "$TEST" > "$LOGS/test_cuda_ops.log" 2>&1
test_rc=$?
mem_rc=-
if [ "${K3RT_GPU_MEMCHECK:-0}" = 1 ]; then
    echo "== compute-sanitizer memcheck (log: $LOGS/memcheck.log)"
    LD_LIBRARY_PATH=$LIBPATH timeout 540 compute-sanitizer --tool memcheck --error-exitcode 9 "$TEST" \
        > "$LOGS/memcheck.log" 2>&1
    mem_rc=$?
fi

echo "== bench (log: $LOGS/bench.log)"
timeout 420 python3 "$ROOT/scripts/bench/gpu_ops.py" --bench "$BENCH" \
    --runs "${K3RT_BENCH_RUNS:-30}" --json "$LOGS/gpu_ops.json" > "$LOGS/bench.log" 2>&1
bench_rc=$?

echo
echo "================ summary ================"
echo "tests: exit $test_rc (0 passed, 1 failed, 77 no GPU, 124 timed out)"
grep -E "^[0-9]+%: Checks" "$LOGS/test_cuda_ops.log"
grep -E ":(F|E):" "$LOGS/test_cuda_ops.log" | cut -c1-400
[ "$test_rc" != 0 ] && tail -5 "$LOGS/test_cuda_ops.log"
[ "$mem_rc" != - ] && { echo "memcheck: exit $mem_rc"; grep -m5 -E "ERROR SUMMARY|Invalid" "$LOGS/memcheck.log"; }
echo "bench: exit $bench_rc"
if [ "$bench_rc" = 0 ]; then
    sed -n '/^copy bandwidth used/,$p' "$LOGS/bench.log"
else
    tail -20 "$LOGS/bench.log"
fi
[ "$test_rc" = 0 ] && [ "$bench_rc" = 0 ]
