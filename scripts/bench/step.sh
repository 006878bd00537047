#!/usr/bin/env bash
# A whole training step of k3rt beside its PyTorch peer, in one call on the GPU machine, on
# the same model, batch and precision (issue 17):
#   1. `k3rt plan RECIPE --json`: the model FLOPs of one step (the plugins' own counts + the
#      LM head: the same count for both sides) and its tokens;
#   2. `k3rt train RECIPE --profile STEPS` for STEPS + 2 steps (two warm-up steps first): the
#      mean step time of the profiled steps (metrics.jsonl's profile record, step_ms); its
#      final checkpoint holds the weights and the validated recipe;
#   3. the peer (torch_dense.py for a model of MLA, dense GLU and the standard residual, else
#      torch_k3.py) loads that checkpoint by name and times STEPS training steps (forward,
#      backward, optimizer; bf16 autocast over fp32 weights; random tokens) after WARMUP,
#      median of CUDA-event times, once compiled (torch.compile per sublayer) and once eager;
#   4. prints, per run: step ms, tokens/s, model TFLOP/s, MFU against PEAK_TFLOPS (725: cuBLAS
#      bf16 GEMM 8192^3 on the H200) and k3rt's tokens/s over the peer's.
#
#   scripts/bench/step.sh RECIPE [BUILD]          (BUILD: a CUDA build, default ROOT/build)
# environment:
#   STEPS        profiled / timed steps (default 10)       WARMUP   peer warm-up steps (3)
#   PEERS        which peer runs, of "compiled eager" (default both)
#   SET          more --set overrides for k3rt and so the peer (e.g. "--set plan.micro_batch=4")
#   PEAK_TFLOPS  the MFU denominator (default 725)
#   PY           the python with torch (default python3); fla comes from FLA (default
#                ROOT/.ref/fla_pkg) when that folder exists, else from the python's packages
#   DEVICE       k3rt's plan.device (default cuda); PEER_ARGS more options for the peer:
#                DEVICE=cpu PEER_ARGS="--bench-device cpu" runs the whole script on the CPU
#                (a smoke test of the script: the pure paths, host-clock times)
#   STEP_OUT     working folder (default /tmp/step-<recipe stem>): plan.json, k3rt.log, the k3rt
#                run (k3rt/, with its checkpoint unless CLEAN=1), <mode>.log per peer run
#   REUSE=1      skip k3rt's run and use the one STEP_OUT holds (its profile record and
#                checkpoint): the peers in separate calls when one call has too little time
#   PEER_TIMEOUT seconds each peer run may take (default 420: torch.compile and fla's
#                autotuning of the first calls are minutes at K3-mini's size)
# Example (on the GPU machine, from the repository root, with the CUDA build carried):
#   scripts/bench/step.sh scripts/recipes/dense_mla.lua build-cuda
#   scripts/bench/step.sh scripts/recipes/k3_mini.lua build-cuda
#   (or K3-mini's peers one per call: PEERS=eager ..., then REUSE=1 PEERS=compiled ...)
set -u
[ $# -ge 1 ] || { sed -n 2,36p "$0"; exit 2; }
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
RECIPE=$1
BUILD=$(cd "${2:-$ROOT/build}" && pwd) || exit 1
STEPS=${STEPS:-10}
WARMUP=${WARMUP:-3}
PEERS=${PEERS:-"compiled eager"}
PEAK=${PEAK_TFLOPS:-725}
PY=${PY:-python3}
stem=$(basename "$RECIPE" .lua)
OUTDIR=${STEP_OUT:-/tmp/step-$stem}
read -r -a EXTRA <<< "${SET:-}"
K3RT=$BUILD/bin/k3rt
[ -x "$K3RT" ] || { echo "step.sh: no k3rt at $K3RT (give a CUDA build folder)" >&2; exit 1; }
. "$ROOT/scripts/gpu/env.sh"
export K3RT_PLUGIN_PATH=$BUILD/plugins
FLA=${FLA:-$ROOT/.ref/fla_pkg}
[ -d "$FLA" ] && export PYTHONPATH=$FLA${PYTHONPATH:+:$PYTHONPATH}
mkdir -p "$OUTDIR"
k3() { LD_LIBRARY_PATH=$LIBPATH "$K3RT" "$@"; }
json() { "$PY" -c "import json,sys; d=json.load(open(sys.argv[1])); print($1)" "$2"; }

# 1. FLOPs and tokens of one step
k3 plan "$RECIPE" --gpus 1 --json "${EXTRA[@]}" > "$OUTDIR/plan.json" ||
    { echo "step.sh: k3rt plan failed" >&2; exit 1; }
FLOPS=$(json "d['flops_per_step']" "$OUTDIR/plan.json")
TOKENS=$(json "d['tokens_per_step']" "$OUTDIR/plan.json")
# the dense peer when every plugin is one of its own, else the K3 one
PEER=$("$PY" -c '
import json, re, sys
names = " ".join(c["name"] for c in json.load(open(sys.argv[1]))["components"])
dense = set(re.findall(r"\((\w+)\)", names)) <= {"mla", "dense_glu", "standard"}
print("torch_dense.py" if dense else "torch_k3.py")' "$OUTDIR/plan.json")
echo "== $RECIPE: $TOKENS tokens, $FLOPS model FLOPs per step; peer scripts/bench/$PEER"

# 2. k3rt's profiled steps; the final checkpoint is the peer's model
if [ "${REUSE:-0}" = 1 ] && [ -f "$OUTDIR/k3rt/metrics.jsonl" ]; then
    echo "k3rt train: reusing $OUTDIR/k3rt"
else
    rm -rf "$OUTDIR/k3rt"
    t0=$(date +%s)
    k3 train "$RECIPE" --out "$OUTDIR/k3rt" --profile "$STEPS" --no-sample \
        --set train.steps=$((STEPS + 2)) --set train.checkpoint_interval=$((STEPS + 2)) \
        --set train.eval_batches=1 --set train.log_interval=1 \
        --set "plan.device=\"${DEVICE:-cuda}\"" "${EXTRA[@]}" > "$OUTDIR/k3rt.log" 2>&1 ||
        { tail -20 "$OUTDIR/k3rt.log"; echo "step.sh: k3rt train failed" >&2; exit 1; }
    echo "k3rt train: $(( $(date +%s) - t0 )) s (log $OUTDIR/k3rt.log)"
fi
K3_MS=$($PY -c '
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "profile" in r:
        print(r["profile"]["step_ms"])' "$OUTDIR/k3rt/metrics.jsonl")
[ -n "$K3_MS" ] || { echo "step.sh: no profile record in metrics.jsonl" >&2; exit 1; }

# 3. the peer, compiled and eager
declare -A PEER_MS
for mode in $PEERS; do
    flag=""
    [ "$mode" = compiled ] && flag=--compile
    t0=$(date +%s)
    timeout "${PEER_TIMEOUT:-420}" "$PY" "$ROOT/scripts/bench/$PEER" --ckpt "$OUTDIR/k3rt" --bench $flag --steps "$STEPS" \
        --warmup "$WARMUP" ${PEER_ARGS:-} > "$OUTDIR/$mode.log" 2>&1
    ms=$(grep '^{' "$OUTDIR/$mode.log" | tail -1 | "$PY" -c \
        'import json,sys; print(json.loads(sys.stdin.read())["step_ms"])' 2>/dev/null)
    echo "peer $mode: $(( $(date +%s) - t0 )) s (log $OUTDIR/$mode.log)"
    [ -n "$ms" ] && PEER_MS[$mode]=$ms || tail -5 "$OUTDIR/$mode.log"
done
[ "${CLEAN:-0}" = 1 ] && rm -rf "$OUTDIR/k3rt/checkpoints"

# 4. the table
row() {  # row NAME STEP_MS
    "$PY" -c '
import sys
name, ms, tok, fl, peak, k3 = sys.argv[1], *map(float, sys.argv[2:])
tps = tok / (ms / 1e3)
ratio = f"{(tok / (k3 / 1e3)) / tps:.2f}" if name != "k3rt" else "-"
print(f"{name:<16} {ms:>10.1f} {tps:>12.0f} {fl / (ms / 1e3) / 1e12:>9.1f} "
      f"{100 * fl / (ms / 1e3) / (peak * 1e12):>6.1f}% {ratio:>8}")' "$1" "$2" "$TOKENS" "$FLOPS" \
        "$PEAK" "$K3_MS"
}
printf "%-16s %10s %12s %9s %7s %8s\n" run "step ms" "tokens/s" TFLOP/s MFU "k3rt/x"
row k3rt "$K3_MS"
for mode in $PEERS; do
    [ -n "${PEER_MS[$mode]:-}" ] && row "torch $mode" "${PEER_MS[$mode]}"
done
echo "(MFU: model FLOPs from k3rt plan over $PEAK TFLOP/s; k3rt/x: k3rt's tokens/s over the run's)"
