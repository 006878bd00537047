#!/usr/bin/env bash
# kill -9 at random moments and in the middle of checkpoint writes, each time resumed: the run
# that was killed N times ends bitwise equal to one never interrupted — weights, optimizer and
# balancer state, the loss columns of metrics.jsonl, and the manifest but for the run's
# identity.
#   kill_resume.sh K3RT_BIN SOURCE_DIR [KILLS] [SEED]
# The main job's recipe (every K3 plugin: KDA + MLA, LatentMoE with Quantile Balancing, Block
# AttnRes, Per-Head Muon) at a small shape. Random kills land anywhere: start-up, a step, an
# evaluation, a metrics line, a save. Kills during saves use K3RT_FAULT (core/util/fault.h),
# which makes the process SIGKILL itself after each file of a checkpoint and around the
# commit's rename.
set -euo pipefail
bin=$1
src=$2
kills=${3:-10}
RANDOM=${4:-15}
work=$(mktemp -d "${TMPDIR:-/tmp}/k3rt_kill_XXXXXX")
trap 'rm -rf "$work"' EXIT
cd "$src"

steps=40
args=(scripts/recipes/tiny.lua --no-sample --set plan.micro_batch=2 --set plan.seq_len=32
      --set train.steps=$steps --set train.warmup=4 --set train.checkpoint_interval=2
      --set train.keep_checkpoints=2 --set train.log_interval=1 --set train.eval_interval=6
      --set train.eval_batches=2)

newest() {
  ls -d "$work"/run/checkpoints/step_*[0-9] 2>/dev/null | sed 's/.*step_0*//' | sort -n | tail -1 || true
}

# Starts a run in $work/run: --resume when it has a complete checkpoint, else afresh.
start() {
  local resume=()
  compgen -G "$work/run/checkpoints/step_*[0-9]/DONE" >/dev/null && resume=(--resume)
  "$bin" train "${args[@]}" --out "$work/run" "${resume[@]}" >>"$work/log" 2>&1 &
  pid=$!
}

echo "reference: $steps steps uninterrupted"
t0=$(date +%s.%N)
"$bin" train "${args[@]}" --out "$work/ref" --quiet
t1=$(date +%s.%N)
span=$(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%d", (b - a) * 1000 }')

echo "kills in the middle of checkpoint writes"
for point in ckpt.weights ckpt.state ckpt.manifest ckpt.done ckpt.renamed; do
  # The next save the run will make: two steps after its newest complete checkpoint.
  last=$(newest)
  next=$(( ${last:-0} + 2 ))
  [ "$next" -gt "$steps" ] && break
  export K3RT_FAULT="$point:$next"
  start
  unset K3RT_FAULT
  status=0
  wait "$pid" 2>/dev/null || status=$?
  [ "$status" -eq 137 ] || { echo "no kill at $point:$next (exit $status)"; cat "$work/log"; exit 1; }
  echo "  killed at $point of step $next"
done
window=$((span / 5))
echo "random kills: $kills, each within the first $window ms of a run"
for ((i = 0; i < kills; i++)); do
  start
  ms=$((RANDOM % window))
  sleep "$(awk -v m="$ms" 'BEGIN { printf "%.3f", m / 1000 }')"
  if kill -9 "$pid" 2>/dev/null; then
    wait "$pid" 2>/dev/null || true
    echo "  kill -9 after $ms ms (newest checkpoint: step $(newest))"
  else
    wait "$pid" 2>/dev/null || true
    echo "  the run finished before its kill at $ms ms"
  fi
done
start
wait "$pid" || { echo "the last resume failed"; tail -20 "$work/log"; exit 1; }
grep -c -- "--resume: continuing run" "$work/log" | sed 's/^/resumes that said whose run and which step: /'

status=0
final="checkpoints/step_$(printf %08d $steps)"
for f in model.safetensors state.safetensors; do
  if cmp -s "$work/ref/$final/$f" "$work/run/$final/$f"; then
    echo "same: $f"
  else
    echo "DIFFERENT: $f"; status=1
  fi
done
python3 - "$work/ref" "$work/run" "$final" "$steps" <<'EOF' || status=1
import json, sys
ref, run, final, steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
def columns(out):
    rows = {}
    for line in open(f"{out}/metrics.jsonl"):
        r = json.loads(line)
        key = r["step"]
        if key in rows:
            sys.exit(f"{out}/metrics.jsonl: step {key} logged twice")
        rows[key] = [r.get(k) for k in ("loss", "aux_loss", "grad_norm", "lr", "val_loss")]
    return rows
a, b = columns(ref), columns(run)
if sorted(a) != list(range(1, steps + 1)) or a != b:
    bad = [s for s in sorted(set(a) | set(b)) if a.get(s) != b.get(s)]
    sys.exit(f"loss columns differ at steps {bad[:5]}: {a.get(bad[0])} vs {b.get(bad[0])}")
print(f"same: loss, aux_loss, grad_norm, lr, val_loss of {steps} steps")
ma, mb = (json.load(open(f"{d}/{final}/manifest.json")) for d in (ref, run))
if ma.pop("run")["id"] == mb.pop("run")["id"]:
    sys.exit("the two runs share an identity")
if ma != mb:
    diff = [k for k in ma if ma[k] != mb.get(k)]
    sys.exit(f"manifests differ beyond the run identity: {diff}")
print("same: manifest but for the run identity")
EOF
exit $status
