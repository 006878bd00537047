# Sourced by the scripts of scripts/gpu/ on the GPU machine, with ROOT (the repository) and
# BUILD (the carried build folder) set: the environment k3rt's programs and PyTorch run in.
# Sets LIBPATH (for k3rt's programs only: PyTorch keeps the image's own libraries) and exports
# it to the benchmark drivers as K3RT_BENCH_LD_LIBRARY_PATH.

# Never NVLink multicast on these machines. The GPU image's OpenBLAS misdetects its CPU: name
# the AVX-512 kernels, but only where the CPU has them (the scripts' CPU smoke runs in CI too).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
if grep -qw avx512f /proc/cpuinfo 2>/dev/null; then export OPENBLAS_CORETYPE=SkylakeX; fi
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-8}
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


# The machine, the GPU and the library path, on stdout and into $1.
gpu_env_report() {
    {
        echo "== $(date -u +%FT%TZ) $(hostname)"
        nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv 2>&1
        echo "library path of k3rt's programs: $LIBPATH"
    } | tee "$1"
}
