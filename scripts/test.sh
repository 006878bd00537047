#!/usr/bin/env bash
# The test suite: install, build, run every test; then a sanitizer build (ASan + UBSan, no
# CUDA) runs every test again. Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh --test-deps
jobs="$(nproc)"
ctest --test-dir build --output-on-failure -j"$jobs" "$@"

K3RT_BUILD_DIR=build-asan K3RT_CMAKE_ARGS="-DK3RT_SANITIZE=ON -DK3RT_CUDA=OFF -DCMAKE_BUILD_TYPE=Debug" \
  ./scripts/setup.sh
ASAN_OPTIONS="detect_leaks=1:abort_on_error=1" \
LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0" \
UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" \
  ctest --test-dir build-asan --output-on-failure -j"$jobs" -LE gpu
