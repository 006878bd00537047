#!/usr/bin/env python3
"""The whole LatentMoE layer (router, top-k, dispatch, routed experts, combine, latent RMSNorm,
up-projection, shared expert) forward and forward + backward: k3rt's latent_moe plugin through
the rig (scripts/bench/layer_bench.c) beside the same layer in PyTorch (scripts/bench/torch_k3.py's
LatentMoE, fast path: torch._grouped_mm over the rows sorted by expert, torch.compile), at
K3-mini's shape (64 experts, top-8, latent 512, expert hidden 768, one shared expert of 1024,
d 1024, B 8 x T 4096, bf16), on uniform routing and on routing skewed by a selection bias of
-A ln(1 + e) (the same bias on both sides; the script prints the largest expert's load over the
mean that k3rt's routing reports). At the layer's initialisation A = 0.05 is a graded skew (a CPU
draw of the same distributions: the largest expert 3.6x the mean, none empty) and A = 0.5 the
extreme one (experts 0-7 take every token: 8x, 56 empty).

The PyTorch layer holds bf16 parameters (its gradients are bf16); k3rt's writes f32 parameter
gradients, as its bf16 training mode does. Times: CUDA events, medians after warm-up.

  moe_layer.py --bench BUILD/bin/bench_layer --plugin BUILD/plugins/libk3rt_latent_moe.so
               [--skew 0 --skew 0.05 --skew 0.5] [--runs 20] [--warmup 5] [--eager] [--json FILE]
"""
import argparse
import json
import math
import os
import subprocess
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_util import median_ms  # noqa: E402
import torch_k3  # noqa: E402

K3_MINI = {"experts": 64, "top_k": 8, "latent": 512, "expert_hidden": 768, "shared": 1,
           "shared_hidden": 1024, "act": "situ", "latent_norm": True}
D, B, T = 1024, 8, 4096


def k3rt_layer(a, skew):
    cmd = [a.bench, "--plugin", a.plugin, "--config", json.dumps(K3_MINI), "--batch", str(B),
           "--seq", str(T), "--d-model", str(D), "--dtype", "bf16", "--runs", str(a.runs),
           "--warmup", str(a.warmup), "--skew", str(skew)]
    env = dict(os.environ)
    if os.environ.get("K3RT_BENCH_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["K3RT_BENCH_LD_LIBRARY_PATH"]
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.exit(f"bench_layer failed ({p.returncode}): {p.stderr.strip()}")
    return json.loads(p.stdout)


def torch_layer(a, skew, compiled):
    """The peer's fwd and fwd + bwd medians (ms) and its largest expert's load over the mean."""
    E, k, l, m, hs = (K3_MINI[n] for n in ("experts", "top_k", "latent", "expert_hidden",
                                          "shared_hidden"))
    cfg = {"experts": E, "top_k": k, "routed_scaling": 1.0, "renormalize": True, "act": "situ",
           "beta1": 4.0, "beta2": 25.0, "latent_norm": True, "norm_eps": 1e-5, "shared": 1}
    mod = torch_k3.LatentMoE(cfg, D, True)
    mod.report = False
    g = torch.Generator(device="cpu").manual_seed(0)

    def w(*shape, std=0.02):
        t = torch.randn(*shape, generator=g) * std
        return t.to("cuda", torch.bfloat16).requires_grad_(True)
    p = {"router.weight": w(E, D), "routed_down_proj.weight": w(l, D),
         "experts.gate_proj.weight": w(E, m, l), "experts.up_proj.weight": w(E, m, l),
         "experts.down_proj.weight": w(E, l, m),
         "routed_norm.weight": torch.ones(l, device="cuda", dtype=torch.bfloat16,
                                          requires_grad=True),
         "routed_up_proj.weight": w(D, l), "shared_experts.gate_proj.weight": w(hs, D),
         "shared_experts.up_proj.weight": w(hs, D), "shared_experts.down_proj.weight": w(D, hs)}
    bias = torch.tensor([-skew * math.log1p(e) for e in range(E)], device="cuda")
    p["balancer.bias"] = bias
    x = torch.randn(B, T, D, generator=g).to("cuda", torch.bfloat16).requires_grad_(True)
    dy = torch.randn(B, T, D, generator=g).to("cuda", torch.bfloat16)
    fwd = torch.compile(mod.forward) if compiled else mod.forward
    params = [x] + [t for t in p.values() if t.requires_grad]
    with torch.no_grad():  # the load the bias gives, as k3rt reports it
        s = torch.sigmoid(x.reshape(-1, D).float() @ p["router.weight"].float().t())
        sel = torch.topk(s + bias, k, dim=-1).indices
        counts = torch.bincount(sel.reshape(-1), minlength=E).float()
        load = (counts.max() / counts.mean()).item()

    def f():
        with torch.no_grad():
            return fwd(x, p)

    def fb():
        return torch.autograd.grad(fwd(x, p), params, dy)

    t0 = time.time()
    fb(), f()
    torch.cuda.synchronize()
    warm = time.time() - t0
    return median_ms(f, a.runs, a.warmup), median_ms(fb, a.runs, a.warmup), load, warm


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bench", required=True, help="bench_layer (scripts/bench/layer_bench.c)")
    ap.add_argument("--plugin", required=True, help="libk3rt_latent_moe.so")
    ap.add_argument("--skew", type=float, action="append", default=[])
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--eager", action="store_true", help="also the uncompiled PyTorch layer")
    ap.add_argument("--no-torch", action="store_true", help="time k3rt alone")
    ap.add_argument("--json", default=None)
    a = ap.parse_args()
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
    rows = []
    for skew in a.skew or [0.0, 0.05, 0.5]:
        r = {"skew": skew, **{"k3rt_" + k: v for k, v in k3rt_layer(a, skew).items()}}
        print(f"skew {skew}: k3rt fwd {r['k3rt_fwd_ms']:.3f} ms, f+b {r['k3rt_fwdbwd_ms']:.3f} ms "
              f"(largest expert {r['k3rt_max_over_mean']:.2f}x the mean; saved "
              f"{r['k3rt_saved_bytes'] / 2**20:.0f} MiB, workspace "
              f"{r['k3rt_workspace_bytes'] / 2**20:.0f} MiB)", flush=True)
        for compiled in ([] if a.no_torch else [True] + ([False] if a.eager else [])):
            name = "compiled" if compiled else "eager"
            fms, fbms, load, warm = torch_layer(a, skew, compiled)
            r[name] = {"fwd_ms": fms, "fwdbwd_ms": fbms, "max_over_mean": load, "warmup_s": warm}
            print(f"skew {skew}: torch {name} fwd {fms:.3f} ms, f+b {fbms:.3f} ms (largest expert "
                  f"{load:.2f}x; warm-up {warm:.0f} s); k3rt speed fwd "
                  f"{fms / r['k3rt_fwd_ms']:.2f}x, f+b {fbms / r['k3rt_fwdbwd_ms']:.2f}x",
                  flush=True)
            torch.cuda.empty_cache()
        rows.append(r)
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
