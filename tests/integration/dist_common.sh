# Shared by dist_mpi.sh and dist_launch.sh: the tiny runs they train and how they compare.
#   source dist_common.sh K3RT_BIN SOURCE_DIR
bin=$1
src=$2
work=$(mktemp -d "${TMPDIR:-/tmp}/k3rt_dist_XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$src"
compare="python3 $src/tests/integration/dist_compare.py"
export OMP_WAIT_POLICY=passive

# A few steps of a tiny model: evaluation and checkpoints every 2 steps.
steps=4
common=(--no-sample --quiet --set plan.seq_len=32 --set train.steps=$steps --set train.warmup=1
        --set train.log_interval=1 --set train.eval_interval=2 --set train.eval_batches=2
        --set train.checkpoint_interval=2 --set train.keep_checkpoints=4 --set plan.threads=2)
final="checkpoints/step_$(printf %08d $steps)"

# Both folders' checkpoints of the last step hold the same weights bytes and the same state
# tensors, byte for byte (a ZeRO-1 checkpoint holds the optimizer's in one file per rank).
same_checkpoint() {
  cmp -s "$1/$final/model.safetensors" "$2/$final/model.safetensors" ||
    { echo "FAIL: model.safetensors differs: $1 vs $2"; exit 1; }
  $compare "$1/$final" "$2/$final" state >"$work/state.cmp" ||
    { cat "$work/state.cmp"; echo "FAIL: the state differs: $1 vs $2"; exit 1; }
  echo "  final checkpoint: weights bitwise equal; $(cat "$work/state.cmp")"
}

# Waits for pid $1 to exit within $2 seconds; its exit status in $status, seconds in $took.
wait_bounded() {
  local t0 i
  t0=$(date +%s.%N)
  for ((i = 0; i < $2 * 10; i++)); do
    kill -0 "$1" 2>/dev/null || break
    sleep 0.1
  done
  if kill -0 "$1" 2>/dev/null; then
    kill -9 "$1"
    echo "FAIL: pid $1 still running $2 s after a rank was killed"
    exit 1
  fi
  status=0
  wait "$1" || status=$?
  took=$(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
}

# The pid of the k3rt process whose environment holds $1 (e.g. RANK=1) and whose command line
# holds $2 (its output folder); read from /proc, so no ps or pgrep is needed.
rank_pid() {
  local d
  for d in /proc/[0-9]*; do
    tr '\0' ' ' 2>/dev/null <"$d/cmdline" | grep -qF -- "$2" || continue
    tr '\0' '\n' 2>/dev/null <"$d/environ" | grep -qx -- "$1" && { echo "${d#/proc/}"; return; }
  done
}

# Waits until run folder $1 holds a committed checkpoint (a kill then lands mid-run).
wait_checkpoint() {
  local i
  for ((i = 0; i < 600; i++)); do
    compgen -G "$1/checkpoints/step_*/DONE" >/dev/null && return
    sleep 0.1
  done
  echo "FAIL: no checkpoint in $1 after 60 s"
  exit 1
}
