#!/usr/bin/env python3
"""The PyTorch peer of k3rt's dense models (scripts/recipes/dense_mla.lua, tiny_dense.lua):
NoPE gated MLA, a dense GLU, the standard pre-norm residual, the final norm, an untied LM head
and the mean token cross-entropy, built from a k3rt checkpoint's model.safetensors by name
with the options its manifest's recipe document gives. The pieces are torch_common.py's
(shared with torch_k3.py): on the pure path explicit causal attention (CPU, f64 or f32), on the
fast path SDPA under bf16 autocast over fp32 weights, each sublayer's module under
torch.compile with --compile.

  torch_dense.py --ckpt CKPT --check GRADS [--dtype f64|f32]
      k3rt's loss and gradients (`k3rt eval CKPT --grads GRADS`) against autograd here
  torch_dense.py --ckpt CKPT --bench [--compile] [--steps N] [--warmup W]
      a training step on the GPU (forward, backward, fused AdamW), median ms
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402

if __name__ == "__main__":
    sys.exit(tc.main(tc.Model.create, tc.compile_blocks, "torch_dense",
                     __doc__.split("\n\n")[0]))
