#!/usr/bin/env bash
# Coverage-guided fuzzing (libFuzzer, clang) of the readers of untrusted input: safetensors,
# token shards, checkpoint manifests, recipes (tests/fuzz/). Builds build-fuzz/ (ASan + UBSan +
# fuzzer coverage), then runs each target for FUZZ_SECONDS (default 30) over a copy of its
# seed corpus. A crash, a sanitizer report, a leak or a hang (-timeout) fails the script; the
# input is copied to tests/fuzz/regressions/<target>/, where every ordinary build's ctest
# replays it (fuzz/<target>) once it is fixed: commit it with the fix.
#   scripts/fuzz.sh [TARGET...]      (default: all four)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${FUZZ_SECONDS:-30}
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(safetensors shard manifest recipe)

./scripts/setup.sh --fuzz --packages-only
CC=clang cmake -S . -B build-fuzz -DK3RT_FUZZ=ON -DK3RT_CUDA=OFF -DK3RT_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz -j"$(nproc)" >/dev/null

work=$(mktemp -d "${TMPDIR:-/tmp}/k3rt_fuzz_run_XXXXXX")
trap 'rm -rf "$work"' EXIT
export ASAN_OPTIONS="detect_leaks=1:abort_on_error=1"
export LSAN_OPTIONS="suppressions=$PWD/tests/lsan.supp:print_suppressions=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
status=0
for t in "${targets[@]}"; do
  corpus="$work/$t"
  mkdir -p "$corpus" "$work/artifacts-$t"
  cp tests/fuzz/corpus/"$t"/* "$corpus"/
  dict=()
  [ -f "tests/fuzz/$t.dict" ] && dict=(-dict="tests/fuzz/$t.dict")
  echo "fuzz_$t: ${seconds} s"
  if ! ./build-fuzz/bin/fuzz_"$t" "$corpus" "${dict[@]}" -max_total_time="$seconds" \
       -timeout=10 -rss_limit_mb=2048 -max_len=16384 -close_fd_mask=1 -print_final_stats=1 \
       -artifact_prefix="$work/artifacts-$t/" >"$work/$t.log" 2>&1; then
    status=1
    grep -E "ERROR|SUMMARY|Test unit written" "$work/$t.log" | head -20
    mkdir -p tests/fuzz/regressions/"$t"
    cp "$work/artifacts-$t"/* tests/fuzz/regressions/"$t"/ 2>/dev/null || true
    echo "fuzz_$t: FOUND A CRASH; its input is in tests/fuzz/regressions/$t/ (replay:" \
         "./build-fuzz/bin/fuzz_$t FILE)"
  fi
  grep -E "stat::(number_of_executed_units|new_units_added)" "$work/$t.log" | tr '\n' ' '
  echo
done
exit $status
