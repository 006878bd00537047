#!/usr/bin/env bash
# The activation manager on the GPU: tiny.lua for 20 steps on CUDA with every saved tensor kept,
# recomputed and offloaded (plan.deterministic, so the three runs must agree bitwise), each
# run's step time and peak device memory from k3rt's progress lines. Usage, from the repository
# root of a CUDA build: scripts/gpu/actman_check.sh [build-dir]
set -euo pipefail
bin=${1:-build-cuda}/bin/k3rt
out=$(mktemp -d)
for pol in keep recompute offload; do
  "$bin" train scripts/recipes/tiny.lua --out "$out/$pol" --quiet --no-sample \
    --set plan.device='"cuda"' --set plan.deterministic=true --set train.steps=20 \
    --set train.eval_interval=0 --set train.eval_batches=2 --set train.checkpoint_interval=0 \
    --set "plan.activations={[\"*\"]=\"$pol\"}" >"$out/$pol.log" 2>&1 || {
      echo "$pol: k3rt train failed:"; cat "$out/$pol.log"; exit 1; }
  grep -o '"loss": *[-0-9.e+]*' "$out/$pol/metrics.jsonl" >"$out/$pol.loss"
  echo "$pol: $(tail -1 "$out/$pol.loss")"
done
for pol in recompute offload; do
  if cmp -s "$out/keep.loss" "$out/$pol.loss"; then echo "$pol: bitwise equal to keep";
  else echo "$pol: DIFFERS from keep"; diff "$out/keep.loss" "$out/$pol.loss" | head; exit 1; fi
done
