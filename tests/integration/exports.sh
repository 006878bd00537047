#!/usr/bin/env bash
# libk3rt exports only its API (k3rt_*) and every plugin only k3rt_plugin_entry: nothing a
# plugin could come to depend on by accident, and no C++ symbols of CUB / cuda::std that the
# CUDA build compiles in.
#   exports.sh LIBK3RT PLUGIN_DIR
set -euo pipefail
lib=$1
plugins=$2
fail=0
stray=$(nm -D --defined-only "$lib" | awk '{print $NF}' | grep -v '^k3rt_' || true)
count=$(nm -D --defined-only "$lib" | grep -c ' k3rt_' || true)
if [ -n "$stray" ]; then
  echo "$lib exports $(echo "$stray" | wc -l) symbols outside k3rt_*:" >&2
  echo "$stray" | head -n 20 >&2
  fail=1
fi
[ "$count" -gt 50 ] || { echo "$lib exports only $count k3rt_* symbols: is this the library?" >&2; fail=1; }
n=0
for p in "$plugins"/libk3rt_*.so; do
  n=$((n + 1))
  extra=$(nm -D --defined-only "$p" | awk '{print $NF}' | grep -v '^k3rt_plugin_entry$' || true)
  if [ -n "$extra" ]; then
    echo "$p exports more than k3rt_plugin_entry:" >&2
    echo "$extra" | head -n 10 >&2
    fail=1
  fi
done
[ "$n" -gt 0 ] || { echo "no plugins in $plugins" >&2; fail=1; }
[ "$fail" -eq 0 ] && echo "exports: $lib has $count k3rt_* symbols and nothing else; $n plugins export only k3rt_plugin_entry"
exit "$fail"
