#!/usr/bin/env bash
# On the BUILD machine: copies into libs/ the shared libraries that the CUDA test and bench
# binaries need and the GPU machine's image does not have, for scripts/gpu/check.sh.
#
#   scripts/gpu/collect_libs.sh [build dir]     (default build-cuda)
#
# What ldd showed for gpu_test_cuda_ops and bench_gpu_ops (2026-11-30, Debian 12 build host):
#   liblua5.4.so.0, libjansson.so.4   k3rt's config and JSON libraries
#   libsubunit.so.0                   Check's dependency (Check itself is static: libcheck_pic.a)
#   libopenblas.so.0                  the OpenMP build of OpenBLAS (about 36 MB), with
#   libgfortran.so.5, libquadmath.so.0, libgomp.so.1
# Not copied: glibc, libstdc++ and libgcc_s (every image has them, and newer), and CUDA's
# libcudart/libcublas/libcublasLt.so.13 (the GPU image's toolkit or PyTorch's wheels; check.sh
# finds them).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=${1:-$ROOT/build-cuda}
DEST=$ROOT/libs
WANT='liblua5\.4|libjansson|libsubunit|libopenblas|libgfortran|libquadmath|libgomp'
mkdir -p "$DEST"
bins=("$BUILD/bin/gpu_test_cuda_ops" "$BUILD/bin/bench_gpu_ops" "$BUILD"/lib/libk3rt.so)
present=()
for b in "${bins[@]}" "$BUILD"/bin/gpu_test_* "$BUILD"/bin/bench_*; do
    [ -e "$b" ] && present+=("$b")
done
[ -e "$BUILD/lib/libk3rt.so" ] || { echo "missing $BUILD/lib/libk3rt.so: build first" >&2; exit 1; }
bins=("${present[@]}")
ldd "${bins[@]}" | awk '/=>/ {print $1, $3}' | sort -u | grep -E "^($WANT)" |
while read -r name path; do
    cp -L "$path" "$DEST/$name"
    echo "libs/$name <- $path"
done
du -sh "$DEST"
