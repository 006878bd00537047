#!/usr/bin/env bash
# The pure-PyTorch peer (scripts/bench/torch_k3.py --hf, CPU, f32) loading an exported Hugging
# Face folder by its Hub names gives k3rt's loss and gradients: a Kimi-Linear-shaped model (KDA
# with a low-rank output gate, MLA with a query low rank, a dense first layer, LatentMoE with a
# shared expert) trains two steps in f32, `k3rt export --hf --dtype f32` writes it in shards,
# `k3rt eval --grads` dumps one more forward and backward, and the peer must match them from
# the Hub folder alone (loss 1e-5 relative, gradients 1e-4 relative rms, k3rt's expert choice
# given). The same check against a folder with one tensor scaled must fail.
# Skips (77) when no python3 with torch is found (K3RT_TORCH_PYTHON names one).
# usage: hf_torch_parity.sh K3RT_BINARY SOURCE_DIR
set -u
K3RT=$1
SRC=$2
. "$(dirname "$0")/torch_python.sh"
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cd "$SRC" || exit 1
cat > "$TMP/kimi.lua" <<'LUA'
return k3.recipe {
  model = {
    d_model = 64, vocab = 256, layers = 4, pattern = 'KKKM',
    mixers = {
      K = k3.kda { heads = 2, head_dim = 32, lower_bound = k3.none, gate_rank = 32 },
      M = k3.mla { heads = 2, q_rank = 24, kv_rank = 32, qk_nope_dim = 16,
                   qk_shared_dim = 8, v_dim = 16, output_gate = false },
    },
    dense_layers = 1,
    dense_ffn = k3.dense_glu { hidden = 128, act = 'swiglu' },
    ffn = k3.latent_moe { experts = 4, top_k = 2, expert_hidden = 32, shared = 1,
                          shared_hidden = 32, act = 'swiglu' },
    balancer = k3.none {}, residual = k3.standard {},
  },
  optimizer = k3.adamw { lr = 3e-3 },
  plan = { micro_batch = 2, seq_len = 32, dtype = 'f32' },
  train = { steps = 2, eval_interval = 2, eval_batches = 1, checkpoint_interval = 2 },
  data = { path = 'data/tinyshakespeare.txt', tokenizer = 'bytes' },
}
LUA
{ "$K3RT" train "$TMP/kimi.lua" --out "$TMP/run" --no-sample --quiet &&
    "$K3RT" eval "$TMP/run/checkpoints" --grads "$TMP/grads" &&
    "$K3RT" export "$TMP/run/checkpoints" --hf "$TMP/hf" --dtype f32 --shard-size 200000
} >"$TMP/k3rt.log" 2>&1 || { echo "FAIL: k3rt:"; cat "$TMP/k3rt.log"; exit 1; }
ls "$TMP/hf"
[ -f "$TMP/hf/model.safetensors.index.json" ] || { echo "FAIL: the export is not sharded"; exit 1; }
fail=0
CHECK=(--check "$TMP/grads" --dtype f32 --loss-rtol 1e-5 --grad-rtol 1e-4 --forced-routing)
echo "== the Hub folder (pass expected)"
$PY scripts/bench/torch_k3.py --hf "$TMP/hf" "${CHECK[@]}" || { echo "FAIL: the peer's check"; fail=1; }
# one Hub tensor (a fused MLA projection, split back by the table) scaled: must fail
cp -r "$TMP/hf" "$TMP/bad"
$PY - "$TMP/bad" <<'PY' || fail=1
import json, os, struct, sys
d = sys.argv[1]
wm = json.load(open(os.path.join(d, "model.safetensors.index.json")))["weight_map"]
name = "model.layers.3.self_attn.kv_b_proj.weight"
path = os.path.join(d, wm[name])
with open(path, "r+b") as f:
    (n,) = struct.unpack("<Q", f.read(8))
    e = json.loads(f.read(n))[name]
    a, b = e["data_offsets"]
    f.seek(8 + n + a)
    v = list(struct.unpack(f"<{(b - a) // 4}f", f.read(b - a)))
    f.seek(8 + n + a)
    f.write(struct.pack(f"<{len(v)}f", *[x * 1.01 for x in v]))
PY
echo "== one tensor scaled by 1.01 (fail expected)"
$PY scripts/bench/torch_k3.py --hf "$TMP/bad" "${CHECK[@]}"
[ $? -eq 1 ] || { echo "FAIL: the check passed a changed folder"; fail=1; }
[ $fail -eq 0 ] && echo "hf torch parity: all passed"
exit $fail
