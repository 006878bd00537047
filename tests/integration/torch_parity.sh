#!/usr/bin/env bash
# k3rt against its PyTorch peer (scripts/bench/torch_k3.py, pure path) on the CPU: a short
# training run writes a checkpoint, `k3rt eval --grads` one more forward and backward on the
# next step's batch, and the peer must reproduce that loss and every parameter's gradient from
# the checkpoint's weights by name. Runs after two optimizer steps, so the balancers' biases
# are non-zero and the routing follows them.
#   f64 (the main job's model, and a variant through the other branches of every plugin):
#       loss within 1e-10 relative, gradients within 1e-8 relative rms, k3rt's expert choice
#       reproduced token for token;
#   f32 (the main job's model with k3rt's expert choice given, and dense_mla.lua at small
#       widths through torch_dense.py): loss 1e-5, gradients 1e-4;
#   and a mismatched pair (f32 gradients against f64 weights at the f64 tolerances) must fail;
#   --bf16-floor's bound (the bf16 runs' on the GPU) passes at twice the floor and fails below it;
#   scripts/bench/step.sh and scripts/gpu/k3_parity.sh run end to end on the CPU.
# Skips (77) when no python3 with torch is found (K3RT_TORCH_PYTHON names one).
# usage: torch_parity.sh K3RT_BINARY SOURCE_DIR
set -u
K3RT=$1
SRC=$2
. "$(dirname "$0")/torch_python.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$SRC" || exit 1
PEER="$PY scripts/bench/torch_k3.py"
COMMON=(--set train.steps=2 --set train.checkpoint_interval=2 --set train.eval_batches=1
        --set plan.micro_batch=2 --set plan.seq_len=48 --no-sample --quiet)
fail=0

# run NAME RECIPE [--set ...]: trains, then dumps the gradients into $TMP/NAME.grads
run() {
    local name=$1 recipe=$2
    shift 2
    "$K3RT" train "$recipe" --out "$TMP/$name" "${COMMON[@]}" "$@" >"$TMP/$name.log" 2>&1 &&
        "$K3RT" eval "$TMP/$name/checkpoints" --grads "$TMP/$name.grads" >>"$TMP/$name.log" 2>&1 ||
        { echo "FAIL: k3rt on $name:"; cat "$TMP/$name.log"; fail=1; return 1; }
}

# expect pass|fail NAME GRADS [peer options]
expect() {
    local want=$1 name=$2 grads=$3
    shift 3
    echo "== $name ($want expected)"
    $PEER --ckpt "$TMP/$name" --check "$grads" "$@"
    local rc=$?
    if { [ "$want" = pass ] && [ $rc -ne 0 ]; } || { [ "$want" = fail ] && [ $rc -ne 1 ]; }; then
        echo "FAIL: $name: the peer's check returned $rc"
        fail=1
    fi
}

TIGHT=(--dtype f64 --loss-rtol 1e-10 --grad-rtol 1e-8)
F32=(--dtype f32 --loss-rtol 1e-5 --grad-rtol 1e-4)
run k3_f64 scripts/recipes/tiny.lua --set 'plan.dtype="f64"' &&
    expect pass k3_f64 "$TMP/k3_f64.grads" "${TIGHT[@]}"
run variant_f64 scripts/recipes/tiny.lua --set 'plan.dtype="f64"' \
    --set model.mixers.K.value_heads=8 --set model.mixers.K.head_dk=16 \
    --set model.mixers.K.gate_rank=16 --set model.mixers.K.forget_rank=0 \
    --set model.mixers.K.lower_bound=k3.none --set model.mixers.M.q_rank=48 \
    --set model.mixers.M.output_gate=false --set model.residual.full=true \
    --set model.ffn.latent_norm=false --set model.ffn.renormalize=false \
    --set model.ffn.routed_scaling=2.5 --set 'model.ffn.act="swiglu"' &&
    expect pass variant_f64 "$TMP/variant_f64.grads" "${TIGHT[@]}"
run k3_f32 scripts/recipes/tiny.lua &&
    expect pass k3_f32 "$TMP/k3_f32.grads" "${F32[@]}" --forced-routing
# the dense peer on the GPU benchmark's dense model at small widths (heads, shared key, gate,
# GLU; the standard residual), in f32
run dense_mla_f32 scripts/recipes/dense_mla.lua --set model.layers=2 --set model.d_model=64 \
    --set model.vocab=256 --set model.mixers.M.kv_rank=32 --set model.mixers.M.qk_nope_dim=16 \
    --set model.mixers.M.qk_shared_dim=8 --set model.mixers.M.v_dim=16 \
    --set model.ffn.hidden=128 &&
    PEER="$PY scripts/bench/torch_dense.py" expect pass dense_mla_f32 "$TMP/dense_mla_f32.grads" \
        "${F32[@]}"
# --bf16-floor (k3_parity.sh's bf16 cases): every parameter's floor is well above f32's
# differences, so k3rt's f32 gradients pass at twice it with no other tolerance, and fail at
# 1e-9 times it
if [ -f "$TMP/k3_f32.grads" ]; then
    expect pass k3_f32 "$TMP/k3_f32.grads" --dtype f32 --loss-rtol 1e-5 --grad-rtol 1e-12 \
        --bf16-floor 2 --forced-routing
    expect fail k3_f32 "$TMP/k3_f32.grads" --dtype f32 --loss-rtol 1e-5 --grad-rtol 1e-12 \
        --bf16-floor 1e-9 --forced-routing
fi
[ -f "$TMP/k3_f32.grads" ] && [ -d "$TMP/k3_f64" ] &&
    expect fail k3_f64 "$TMP/k3_f32.grads" "${TIGHT[@]}"
# scripts/bench/step.sh end to end on the CPU (pure paths, host clock): its table must have
# the k3rt row and the eager peer's row with a ratio
echo "== step.sh (CPU smoke)"
STEPS=2 WARMUP=1 DEVICE=cpu PEERS=eager PY=$PY PEER_ARGS="--bench-device cpu" STEP_OUT=$TMP/step \
    SET="--set plan.micro_batch=2 --set plan.seq_len=32" \
    bash scripts/bench/step.sh scripts/recipes/tiny.lua "$(dirname "$(dirname "$K3RT")")" \
    > "$TMP/step.out" 2>&1
cat "$TMP/step.out"
grep -q "peer scripts/bench/torch_k3.py" "$TMP/step.out" &&
    grep -Eq "^k3rt +[0-9.]+ +[0-9]+" "$TMP/step.out" &&
    grep -Eq "^torch eager +[0-9.]+ +[0-9]+ .* [0-9]+\.[0-9]+$" "$TMP/step.out" ||
    { echo "FAIL: step.sh's table"; fail=1; }
# scripts/gpu/k3_parity.sh (the same check for runs on the GPU) end to end on the CPU: its f32
# case through `k3rt eval --device cpu` must pass
echo "== k3_parity.sh (CPU smoke)"
DEVICE=cpu CASES=tiny_f32 PY=$PY bash scripts/gpu/k3_parity.sh "$(dirname "$(dirname "$K3RT")")" \
    "$TMP/k3_parity" > "$TMP/k3_parity.out" 2>&1
rc=$?
cat "$TMP/k3_parity.out"
{ [ $rc -eq 0 ] && grep -q "^PASS" "$TMP/k3_parity.out"; } || { echo "FAIL: k3_parity.sh"; fail=1; }
[ $fail -eq 0 ] && echo "torch parity: all passed"
exit $fail
