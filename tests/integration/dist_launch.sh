#!/usr/bin/env bash
# Processes without mpirun (the tcp backend):
#  - `k3rt launch -n 2` equals 2 threads of the local backend bit for bit (MoE model), and
#    so does ZeRO-1 (plan.shard_optimizer), which really splits the optimizer state: one
#    shard file per rank at a checkpoint, which an unsharded --resume reads by name (bitwise
#    equal again); a missing shard is named and --resume falls back a step (bitwise equal
#    again); a corrupt one is refused naming the file; ranks killed after writing their shards
#    leave the step uncommitted and --resume ends bitwise equal;
#  - --resume at another plan.dp that changes the global batch is refused, naming it;
#  - SIGKILL of rank 1 under k3rt launch: the launcher exits non-zero within 60 s naming the
#    rank, its pid, the signal and the step; a --resume afterwards ends bitwise equal to the
#    run never interrupted (nothing committed was lost);
#  - ranks started by hand with torchrun's variables (RANK, WORLD_SIZE, MASTER_ADDR,
#    MASTER_PORT): SIGKILL of rank 1 makes rank 0 exit non-zero within 60 s naming rank 1.
#   dist_launch.sh K3RT_BIN SOURCE_DIR
set -euo pipefail
source "$(dirname "$0")/dist_common.sh"
moe=(scripts/recipes/tiny.lua "${common[@]}" --set plan.micro_batch=2 --set plan.dp=2)

echo "k3rt launch -n 2 vs 2 local threads"
"$bin" train "${moe[@]}" --out "$work/local"
"$bin" launch -n 2 "${moe[@]}" --out "$work/launch" >"$work/launch.log"
$compare "$work/local/metrics.jsonl" "$work/launch/metrics.jsonl" bitwise | sed 's/^/  /'
same_checkpoint "$work/local" "$work/launch"

echo "ZeRO-1 under k3rt launch -n 2 vs unsharded local threads"
loud=()
for a in "${moe[@]}"; do [ "$a" = --quiet ] || loud+=("$a"); done
"$bin" launch -n 2 "${loud[@]}" --set plan.shard_optimizer=true --out "$work/zero" \
  >"$work/zero.full" 2>&1 || { cat "$work/zero.full"; exit 1; }
grep "shard_optimizer:" "$work/zero.full" >"$work/zero.log" || true
cut -c1-120 "$work/zero.log" | sed 's/^/  /'
grep -Eq "holds the optimizer state of [0-9]+ of [0-9]+ parameters \((4|5)[0-9]\.[0-9]% " \
  "$work/zero.log" || { echo "FAIL: the optimizer state is not split in halves"; exit 1; }
$compare "$work/local/metrics.jsonl" "$work/zero/metrics.jsonl" bitwise | sed 's/^/  /'
same_checkpoint "$work/local" "$work/zero"

for q in 0 1; do
  [ -s "$work/zero/$final/optimizer.rank$q.safetensors" ] ||
    { echo "FAIL: no optimizer shard of rank $q in $work/zero/$final"; exit 1; }
done
grep -q '"optimizer.' <(head -c 100000 "$work/zero/$final/state.safetensors") &&
  { echo "FAIL: state.safetensors of a ZeRO-1 checkpoint holds optimizer state"; exit 1; }
echo "  one optimizer shard per rank, none in state.safetensors"

echo "ZeRO-1 stopped after step 2, resumed unsharded (the shards found by name)"
"$bin" launch -n 2 "${moe[@]}" --set plan.shard_optimizer=true --out "$work/toggle" \
  --stop-after 2 >"$work/toggle.log" 2>&1 || { cat "$work/toggle.log"; exit 1; }
"$bin" train "${moe[@]}" --out "$work/toggle" --resume
$compare "$work/local/metrics.jsonl" "$work/toggle/metrics.jsonl" bitwise | sed 's/^/  /'
same_checkpoint "$work/local" "$work/toggle"

echo "a missing optimizer shard: --resume names it and falls back a step; a corrupt one"
cp -r "$work/zero" "$work/broken"
rm "$work/broken/$final/optimizer.rank0.safetensors"
"$bin" launch -n 2 "${moe[@]}" --set plan.shard_optimizer=true --out "$work/broken" \
  --resume >"$work/broken.log" 2>&1 || { cat "$work/broken.log"; exit 1; }
grep -q "$final/optimizer.rank0.safetensors.*falling back to the previous complete checkpoint, step 2" \
  "$work/broken.log" || { echo "FAIL: the missing shard is not named:"; cat "$work/broken.log"; exit 1; }
$compare "$work/local/metrics.jsonl" "$work/broken/metrics.jsonl" bitwise | sed 's/^/  /'
same_checkpoint "$work/local" "$work/broken"
for s in 2 4; do
  shard1="$work/broken/checkpoints/step_0000000$s/optimizer.rank1.safetensors"
  size=$(stat -c %s "$shard1")
  printf '\x5a' | dd of="$shard1" bs=1 seek=$((size - 3)) conv=notrunc status=none
done
if "$bin" launch -n 2 "${moe[@]}" --set plan.shard_optimizer=true --out "$work/broken" \
  --resume >"$work/broken.log" 2>&1; then
  echo "FAIL: resumed from corrupt shards"; exit 1
fi
grep -q "$final/optimizer.rank1.safetensors: tensor .* the file is corrupt" "$work/broken.log" ||
  { echo "FAIL: the corrupt shard is not named:"; cat "$work/broken.log"; exit 1; }
echo "  $(grep -m1 -o "optimizer.rank1.safetensors: tensor .*corrupt" "$work/broken.log")"

echo "ZeRO-1 ranks killed after writing their shards of step 4: no commit; --resume"
K3RT_FAULT=ckpt.shard:4 "$bin" launch -n 2 "${moe[@]}" --set plan.shard_optimizer=true \
  --out "$work/cut" >"$work/cut.log" 2>&1 && { echo "FAIL: no rank was killed"; exit 1; }
[ -d "$work/cut/$final.tmp" ] && [ ! -e "$work/cut/$final" ] ||
  { echo "FAIL: step 4 committed without its ranks"; ls "$work/cut/checkpoints"; exit 1; }
echo "  $(ls "$work/cut/$final.tmp" | tr '\n' ' ')left uncommitted in $(basename "$final").tmp"
"$bin" launch -n 2 "${moe[@]}" --set plan.shard_optimizer=true --out "$work/cut" --resume \
  >>"$work/cut.log" 2>&1 || { cat "$work/cut.log"; exit 1; }
$compare "$work/local/metrics.jsonl" "$work/cut/metrics.jsonl" bitwise | sed 's/^/  /'
same_checkpoint "$work/local" "$work/cut"

echo "--resume with plan.dp = 1 of a dp = 2 run at a smaller global batch is refused"
if "$bin" train "${moe[@]}" --set plan.dp=1 --out "$work/zero" --resume >"$work/re.log" 2>&1; then
  echo "FAIL: accepted"; exit 1
fi
grep -q "= 2 x 2 x 1 = 4 sequences a step, this run 1 x 2 x 1 = 2" "$work/re.log" ||
  { cat "$work/re.log"; exit 1; }
echo "  $(cut -c1-150 "$work/re.log")"

echo "SIGKILL of rank 1 under k3rt launch, then --resume"
"$bin" launch -n 2 "${moe[@]}" --out "$work/killed" >"$work/killed.log" 2>&1 &
launcher=$!
wait_checkpoint "$work/killed"
victim=$(rank_pid RANK=1 "$work/killed")
if [ -n "$victim" ] && kill -9 "$victim" 2>/dev/null; then
  wait_bounded "$launcher" 60
  [ "$status" -ne 0 ] || { echo "FAIL: k3rt launch exited 0 after rank 1 was killed"; exit 1; }
  grep -Eq "k3rt launch: rank 1 \(pid $victim\) was killed by signal 9 \(Killed\) (after step [0-9]+|before its first step)" \
    "$work/killed.log" || { echo "FAIL: no message naming rank 1:"; cat "$work/killed.log"; exit 1; }
  echo "  $(grep -m1 'k3rt launch: rank 1' "$work/killed.log") (exit $status, ${took} s)"
else
  wait "$launcher"  # the run ended before the kill: resume below still must match
  echo "  the run finished before the kill"
fi
"$bin" launch -n 2 "${moe[@]}" --out "$work/killed" --resume >>"$work/killed.log" 2>&1 ||
  { echo "FAIL: resume"; tail "$work/killed.log"; exit 1; }
same_checkpoint "$work/local" "$work/killed"

echo "torchrun-style ranks started by hand, SIGKILL of rank 1"
port=$((20000 + RANDOM % 20000))
pids=()
for r in 0 1; do
  RANK=$r WORLD_SIZE=2 LOCAL_RANK=$r LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$port \
    "$bin" train "${moe[@]}" --set train.steps=400 --out "$work/torchrun" >"$work/tr$r.log" 2>&1 &
  pids+=($!)
done
wait_checkpoint "$work/torchrun"
kill -9 "${pids[1]}"
{ wait "${pids[1]}" || true; } 2>/dev/null
wait_bounded "${pids[0]}" 60
[ "$status" -ne 0 ] || { echo "FAIL: rank 0 exited 0 after rank 1 was killed"; exit 1; }
grep -q "rank 1 (pid ${pids[1]}) closed its connection" "$work/tr0.log" ||
  { echo "FAIL: rank 0 did not name rank 1:"; cat "$work/tr0.log"; exit 1; }
echo "  rank 0: $(tail -1 "$work/tr0.log") (exit $status, ${took} s)"
