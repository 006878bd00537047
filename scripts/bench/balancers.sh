#!/usr/bin/env bash
# MaxVio against step for each load balancer on a tiny LatentMoE model (scripts/bench/moe_tiny.lua):
# trains one run per balancer for the same steps and data, then writes
#   OUT/balancers.md   a markdown table of MaxVio (worst layer, and mean over layers) by step
#   OUT/balancers.svg  MaxVio of the worst layer against step, one line per balancer
# MaxVio = (max load - mean load) / mean load over one step's global batch, per MoE layer.
#
# usage: scripts/bench/balancers.sh [OUT]          (run from anywhere; OUT: runs/bench/balancers)
# environment:
#   K3RT       the k3rt binary (default: build/bin/k3rt)
#   STEPS      steps per run (default 100)
#   JOBS       runs in parallel, one thread each (default 2)
#   EXTRA      more --set overrides for every run (e.g. "--set plan.micro_batch=16")
#   BALANCERS  ';'-separated "label=spec" pairs; the default compares the four balancers.
#              aux_loss uses alpha = 1e-2: at DeepSeek-V3's 1e-4 a run this short cannot tell
#              it from none.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
out=${1:-runs/bench/balancers}
k3rt=${K3RT:-$root/build/bin/k3rt}
steps=${STEPS:-100}
jobs=${JOBS:-2}
extra=${EXTRA:-}
balancers=${BALANCERS:-"none=k3.none{};aux_free=k3.aux_free{gamma=1e-3};aux_loss=k3.aux_loss{alpha=1e-2};quantile=k3.quantile{}"}

[ -x "$k3rt" ] || { echo "balancers.sh: no k3rt binary at $k3rt (set K3RT)" >&2; exit 1; }
mkdir -p "$out"
out=$(cd "$out" && pwd)

IFS=';' read -r -a pairs <<< "$balancers"
labels=()
for pair in "${pairs[@]}"; do
  labels+=("${pair%%=*}")
done

# ---- the runs ---------------------------------------------------------------------------------
run_one() {
  local label=$1 spec=$2
  rm -rf "$out/$label"
  # the recipe's data path is relative to the source tree
  (cd "$root" && K3RT_THREADS=1 "$k3rt" train scripts/bench/moe_tiny.lua --out "$out/$label" \
     --quiet --no-sample --set "model.balancer=$spec" --set "train.steps=$steps" $extra) \
    > "$out/$label.log" 2>&1 || { echo "balancers.sh: run $label failed, see $out/$label.log" >&2
                                   return 1; }
}

start=$(date +%s)
running=0
for pair in "${pairs[@]}"; do
  run_one "${pair%%=*}" "${pair#*=}" &
  running=$((running + 1))
  if [ "$running" -ge "$jobs" ]; then
    wait -n
    running=$((running - 1))
  fi
done
wait
echo "balancers.sh: ${#pairs[@]} runs of $steps steps in $(( $(date +%s) - start )) s"

# ---- per-step series: step, worst-layer MaxVio, mean over layers, loss --------------------------
for label in "${labels[@]}"; do
  awk '{
    step = ""; worst = ""; loss = ""; sum = 0; n = 0
    if (match($0, /"step":[0-9]+/)) step = substr($0, RSTART + 7, RLENGTH - 7)
    if (match($0, /"maxvio_worst":[-0-9.eE+]+/)) worst = substr($0, RSTART + 15, RLENGTH - 15)
    if (match($0, /"loss":[-0-9.eE+]+/)) loss = substr($0, RSTART + 7, RLENGTH - 7)
    line = $0
    while (match(line, /"maxvio":[-0-9.eE+]+/)) {
      sum += substr(line, RSTART + 9, RLENGTH - 9); n++
      line = substr(line, RSTART + RLENGTH)
    }
    if (step != "" && worst != "") printf "%d %.6f %.6f %s\n", step, worst, sum / n, loss
  }' "$out/$label/metrics.jsonl" | sort -n -k1,1 -u > "$out/$label.tsv"
done

# ---- table -------------------------------------------------------------------------------------
{
  echo "MaxVio by step on scripts/bench/moe_tiny.lua ($steps steps; worst layer / mean over the"
  echo "MoE layers). Balancers: ${balancers//;/, }."
  echo
  printf "| step |"; for l in "${labels[@]}"; do printf " %s |" "$l"; done; echo
  printf "|---:|"; for l in "${labels[@]}"; do printf -- "---:|"; done; echo
  for s in 1 2 5 10 20 30 40 50 60 70 80 90 100 150 200 300 400 500 1000; do
    [ "$s" -le "$steps" ] || continue
    printf "| %d |" "$s"
    for l in "${labels[@]}"; do
      awk -v s="$s" '$1 == s { printf " %.3f / %.3f |", $2, $3; found = 1 }
                     END { if (!found) printf " - |" }' "$out/$l.tsv"
    done
    echo
  done
  tail_from=$(( steps > 20 ? steps - 19 : 1 ))
  printf "| mean of steps %d-%d |" "$tail_from" "$steps"
  for l in "${labels[@]}"; do
    awk -v a="$tail_from" '$1 >= a { w += $2; m += $3; n++ }
                           END { printf " %.3f / %.3f |", w / n, m / n }' "$out/$l.tsv"
  done
  echo
  printf "| final train loss |"
  for l in "${labels[@]}"; do
    awk 'END { printf " %.4f |", $4 }' "$out/$l.tsv"
  done
  echo
} > "$out/balancers.md"

# ---- plot --------------------------------------------------------------------------------------
for l in "${labels[@]}"; do sed "s/^/$l /" "$out/$l.tsv"; done | awk -v steps="$steps" '
  BEGIN { W = 760; H = 420; L = 60; R = 130; T = 30; B = 50
          split("#1f77b4 #d62728 #2ca02c #ff7f0e #9467bd #8c564b #e377c2 #7f7f7f", col, " ") }
  { lab = $1; if (!(lab in idx)) { idx[lab] = ++nl; name[nl] = lab }
    x[lab, ++cnt[lab]] = $2; y[lab, cnt[lab]] = $3; if ($3 > ymax) ymax = $3 }
  END {
    ymax = ymax > 0 ? ymax * 1.05 : 1; pw = W - L - R; ph = H - T - B
    printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"12\">\n", W, H
    printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n"
    printf "<text x=\"%d\" y=\"18\" font-size=\"14\">MaxVio (worst MoE layer) per step, moe_tiny.lua</text>\n", L
    for (i = 0; i <= 5; i++) {
      v = ymax * i / 5; py = T + ph - ph * i / 5
      printf "<line x1=\"%d\" y1=\"%.1f\" x2=\"%d\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, py, L + pw, py
      printf "<text x=\"%d\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n", L - 6, py + 4, v
      sx = steps * i / 5; px = L + pw * i / 5
      printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">%d</text>\n", px, T + ph + 18, sx
    }
    printf "<text x=\"%.1f\" y=\"%d\" text-anchor=\"middle\">step</text>\n", L + pw / 2, H - 8
    printf "<rect x=\"%d\" y=\"%d\" width=\"%d\" height=\"%d\" fill=\"none\" stroke=\"#333\"/>\n", L, T, pw, ph
    for (k = 1; k <= nl; k++) {
      lab = name[k]; pts = ""
      for (i = 1; i <= cnt[lab]; i++)
        pts = pts sprintf("%.1f,%.1f ", L + pw * x[lab, i] / steps, T + ph - ph * y[lab, i] / ymax)
      printf "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.5\" points=\"%s\"/>\n", col[k], pts
      printf "<line x1=\"%d\" y1=\"%d\" x2=\"%d\" y2=\"%d\" stroke=\"%s\" stroke-width=\"3\"/>\n", L + pw + 12, T + 16 * k, L + pw + 32, T + 16 * k, col[k]
      printf "<text x=\"%d\" y=\"%d\">%s</text>\n", L + pw + 38, T + 16 * k + 4, lab
    }
    printf "</svg>\n"
  }' > "$out/balancers.svg"

cat "$out/balancers.md"
echo "wrote $out/balancers.md and $out/balancers.svg"
