#!/usr/bin/env bash
# The mpi backend under mpirun (skipped, exit 77, when this build has no MPI):
#  - data parallelism over 2 and 4 processes equals one process with the same global batch
#    (dense model: losses, gradient norms and final weights within 1e-5 relative rms);
#  - 2 processes equal 2 threads of the local backend bit for bit (the MoE model: routing,
#    Quantile Balancing statistics and Per-Head Muon included);
#  - a 2-process run stopped and resumed ends bitwise equal to the straight one, also with
#    ZeRO-1 (plan.shard_optimizer: each rank steps and checkpoints its share of the optimizer
#    state), which equals the unsharded run bit for bit;
#  - a job whose size is not plan.dp is refused by name; a rank killed with SIGKILL ends the
#    job within 60 s.
#   dist_mpi.sh K3RT_BIN SOURCE_DIR K3RT_MPI MPIEXEC
set -euo pipefail
[ "${3:-OFF}" = ON ] || { echo "SKIP: built without MPI (K3RT_MPI=OFF)"; exit 77; }
mpiexec=${4:-mpirun}
command -v "$mpiexec" >/dev/null || { echo "SKIP: $mpiexec not found"; exit 77; }
source "$(dirname "$0")/dist_common.sh"
mpi=("$mpiexec" --oversubscribe)
[ "$(id -u)" = 0 ] && mpi+=(--allow-run-as-root)
# Under the sanitizer build (scripts/test.sh sets ASAN_OPTIONS): Open MPI never frees what
# MPI_Init allocates, and its libraries lack frame pointers, so LeakSanitizer cannot trace
# those blocks back to MPI_Init to suppress them (tests/lsan.supp). The ranks under mpirun
# run without leak checking; k3rt's own code is leak-checked by the single-process runs here
# and by dist_launch.sh, which run the same training over the other backends.
[ -n "${ASAN_OPTIONS:-}" ] && mpi+=(-x "ASAN_OPTIONS=$ASAN_OPTIONS:detect_leaks=0")

echo "dense model: 1 process x 4 sequences vs 2 x 2 and 4 x 1"
"$bin" train scripts/recipes/tiny_dense.lua "${common[@]}" --set plan.micro_batch=4 --out "$work/d1"
for n in 2 4; do
  "${mpi[@]}" -n $n "$bin" train scripts/recipes/tiny_dense.lua "${common[@]}" \
    --set plan.micro_batch=$((4 / n)) --set plan.dp=$n --out "$work/d$n"
  echo " dp $n:"
  $compare "$work/d1/metrics.jsonl" "$work/d$n/metrics.jsonl" rms 1e-5 | sed 's/^/  /'
  $compare "$work/d1/$final/model.safetensors" "$work/d$n/$final/model.safetensors" weights \
    1e-5 | sed 's/^/  /'
done

echo "MoE model: 2 mpi processes vs 2 local threads"
moe=(scripts/recipes/tiny.lua "${common[@]}" --set plan.micro_batch=2 --set plan.dp=2)
"$bin" train "${moe[@]}" --out "$work/local"
"${mpi[@]}" -n 2 "$bin" train "${moe[@]}" --out "$work/mpi"
$compare "$work/local/metrics.jsonl" "$work/mpi/metrics.jsonl" bitwise | sed 's/^/  /'
same_checkpoint "$work/local" "$work/mpi"

echo "stopped after step 2 and resumed, 2 processes"
"${mpi[@]}" -n 2 "$bin" train "${moe[@]}" --out "$work/resumed" --stop-after 2
"${mpi[@]}" -n 2 "$bin" train "${moe[@]}" --out "$work/resumed" --resume
$compare "$work/mpi/metrics.jsonl" "$work/resumed/metrics.jsonl" bitwise | sed 's/^/  /'
same_checkpoint "$work/mpi" "$work/resumed"

echo "ZeRO-1, 2 processes, stopped after step 2 and resumed, vs unsharded"
"${mpi[@]}" -n 2 "$bin" train "${moe[@]}" --set plan.shard_optimizer=true --out "$work/zero" \
  --stop-after 2
"${mpi[@]}" -n 2 "$bin" train "${moe[@]}" --set plan.shard_optimizer=true --out "$work/zero" \
  --resume
$compare "$work/mpi/metrics.jsonl" "$work/zero/metrics.jsonl" bitwise | sed 's/^/  /'
same_checkpoint "$work/mpi" "$work/zero"

echo "a job of 2 processes with plan.dp = 1 is refused"
if "${mpi[@]}" -n 2 "$bin" train "${moe[@]}" --set plan.dp=1 --out "$work/bad" >"$work/bad.log" 2>&1; then
  echo "FAIL: accepted"; exit 1
fi
grep -q "the job has 2 processes but plan.dp x plan.ep x plan.cp = 1" "$work/bad.log" ||
  { echo "FAIL: no clear message:"; cat "$work/bad.log"; exit 1; }
echo "  $(grep -m1 -o 'the job has 2 processes[^:]*' "$work/bad.log")"

echo "SIGKILL of rank 1 under mpirun"
"${mpi[@]}" -n 2 "$bin" train "${moe[@]}" --set train.steps=400 --out "$work/killed" \
  >"$work/killed.log" 2>&1 &
job=$!
wait_checkpoint "$work/killed"
victim=$(rank_pid OMPI_COMM_WORLD_RANK=1 "$work/killed")
[ -n "$victim" ] || { echo "FAIL: rank 1 not found; the job's log:"; cat "$work/killed.log"; exit 1; }
kill -9 "$victim"
wait_bounded "$job" 60
[ "$status" -ne 0 ] || { echo "FAIL: mpirun exited 0 after rank 1 was killed"; exit 1; }
echo "  mpirun exited with status $status ${took} s after the kill"
