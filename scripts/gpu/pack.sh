#!/usr/bin/env bash
# On the BUILD machine: a slim copy of a CUDA build for the GPU machine, whose carry is limited
# (64 MiB): the libraries (symlinks resolved, stripped), every plugin, the named programs of
# bin/ (all gpu_test_* when none are named, and always the k3rt command), and libs/ (the
# third-party libraries, collect_libs.sh). Prints the carry list for the device call.
#
#   scripts/gpu/pack.sh BUILD DEST [program ...]
#   e.g. scripts/gpu/pack.sh build-cuda .devbuild/attnres gpu_test_attnres bench_attnres
#
# On the GPU machine use DEST as the build folder: BUILD=$PWD/DEST scripts/gpu/check.sh "$BUILD".
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
[ $# -ge 2 ] || { sed -n 2,10p "$0" >&2; exit 2; }
BUILD=$1 DEST=$2
shift 2
[ -d "$BUILD/lib" ] || { echo "pack.sh: $BUILD/lib missing: build first" >&2; exit 1; }
rm -rf "$DEST"
mkdir -p "$DEST/lib" "$DEST/plugins" "$DEST/bin"
# Every name a loader may ask for (libk3rt.so.2 and libk3rt.so), each a plain stripped file.
for f in "$BUILD"/lib/*.so*; do
    cp -L "$f" "$DEST/lib/"
done
cp -L "$BUILD"/plugins/*.so "$DEST/plugins/"
programs=("$@")
[ ${#programs[@]} -gt 0 ] || programs=($(cd "$BUILD/bin" && ls gpu_test_* 2>/dev/null))
programs+=(k3rt)
for p in "${programs[@]}"; do
    [ -e "$BUILD/bin/$p" ] || { echo "pack.sh: $BUILD/bin/$p missing: ninja -C $BUILD $p" >&2; exit 1; }
    cp -L "$BUILD/bin/$p" "$DEST/bin/"
done
[ -d "$BUILD/fixtures" ] && cp -rL "$BUILD/fixtures" "$DEST/"
strip --strip-unneeded "$DEST"/lib/* "$DEST"/plugins/* "$DEST"/bin/* 2>/dev/null || true
[ -e "$ROOT/libs/liblua5.4.so.0" ] || "$ROOT/scripts/gpu/collect_libs.sh" "$BUILD" >/dev/null
du -sh "$DEST" "$ROOT/libs" >&2
rel=${DEST#"$ROOT"/}
echo "carry: [\"$rel\", \"libs\"]"
