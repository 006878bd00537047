#!/usr/bin/env bash
# AdamW, plain Muon and Per-Head Muon on the baseline recipe: each trains for a fixed number of
# steps at three learning rates, and the final validation loss of every run is printed as a
# markdown table with the best learning rate of each optimizer marked.
#
#   scripts/bench/optimizers.sh [extra k3rt train arguments...]
#
# Environment (defaults in brackets):
#   K3RT      the k3rt binary                          [build/bin/k3rt]
#   RECIPE    the recipe                               [scripts/recipes/tiny_dense.lua]
#   STEPS     optimizer steps per run                  [300]
#   WARMUP    warm-up steps of the cosine schedule     [30]
#   SEQ, MB   plan.seq_len and plan.micro_batch        [64, 8]
#   LRS       learning rates, one grid for all three   ["1e-3 3e-3 1e-2"]
#   EVAL      validation batches at the end (0 = all)  [0]
#   JOBS      runs at the same time                    [1]
#   OUT       where the runs go                        [a fresh temporary directory]
# Muon's update is RMS-matched to AdamW (0.2 * sqrt(max(rows, cols)) per block), so the same
# learning-rate grid is meaningful for all three. Run from the repository root.
set -euo pipefail

K3RT=${K3RT:-build/bin/k3rt}
RECIPE=${RECIPE:-scripts/recipes/tiny_dense.lua}
STEPS=${STEPS:-300}
WARMUP=${WARMUP:-30}
SEQ=${SEQ:-64}
MB=${MB:-8}
LRS=${LRS:-"1e-3 3e-3 1e-2"}
EVAL=${EVAL:-0}
JOBS=${JOBS:-1}
OUT=${OUT:-$(mktemp -d "${TMPDIR:-/tmp}/k3rt_bench_optimizers.XXXXXX")}

[ -x "$K3RT" ] || { echo "optimizers.sh: no k3rt binary at $K3RT (set K3RT=...)" >&2; exit 1; }
[ -f "$RECIPE" ] || { echo "optimizers.sh: no recipe $RECIPE (run from the repository root)" >&2; exit 1; }
mkdir -p "$OUT"

NAMES=("AdamW" "Muon (per_head=false)" "Per-Head Muon")
SPECS=("k3.adamw{lr=%s}" "k3.per_head_muon{lr=%s,per_head=false}" "k3.per_head_muon{lr=%s}")

run_one() {  # optimizer index, learning rate
    local spec dir
    # shellcheck disable=SC2059
    spec=$(printf "${SPECS[$1]}" "$2")
    dir="$OUT/opt$1_lr$2"
    if ! "$K3RT" train "$RECIPE" --out "$dir" --quiet --no-sample \
        --set "optimizer=$spec" --set "train.steps=$STEPS" --set "train.warmup=$WARMUP" \
        --set train.eval_interval=0 --set train.checkpoint_interval=0 \
        --set "train.eval_batches=$EVAL" --set "plan.seq_len=$SEQ" \
        --set "plan.micro_batch=$MB" "${EXTRA[@]}" >"$dir.log" 2>&1; then
        echo "optimizers.sh: run ${NAMES[$1]} lr $2 failed; see $dir.log" >&2
        touch "$dir.failed"
    fi
}

# The last "val_loss" of a run's metrics (the trainer evaluates after the final step).
final_val() {
    grep -o '"val_loss":[^,}]*' "$OUT/opt$1_lr$2/metrics.jsonl" | tail -n 1 | cut -d: -f2
}

EXTRA=("$@")
echo "recipe $RECIPE | $STEPS steps (warm-up $WARMUP, cosine) | micro-batch $MB x $SEQ tokens | runs in $OUT" >&2
for i in 0 1 2; do
    for lr in $LRS; do
        run_one "$i" "$lr" &
        while [ "$(jobs -rp | wc -l)" -ge "$JOBS" ]; do wait -n || true; done
    done
done
wait
if compgen -G "$OUT/*.failed" >/dev/null; then exit 1; fi

printf '| optimizer |'
for lr in $LRS; do printf ' lr %s |' "$lr"; done
printf '\n|---|'
for _ in $LRS; do printf -- '---|'; done
printf '\n'
for i in 0 1 2; do
    best=""
    for lr in $LRS; do
        v=$(final_val "$i" "$lr")
        if [ -z "$best" ] || awk -v a="$v" -v b="$best" 'BEGIN { exit !(a < b) }'; then best=$v; fi
    done
    printf '| %s |' "${NAMES[$i]}"
    for lr in $LRS; do
        v=$(final_val "$i" "$lr")
        if [ "$v" = "$best" ]; then printf ' **%.4f** |' "$v"; else printf ' %.4f |' "$v"; fi
    done
    printf '\n'
done
echo "final validation loss (nats/token) after $STEPS steps; bold: the best learning rate of each optimizer" >&2
