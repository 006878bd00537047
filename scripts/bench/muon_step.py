#!/usr/bin/env python3
"""One optimizer step over K3-mini's parameters: k3rt's per_head_muon against PyTorch, in the
same run on the same GPU.

Runs the C driver (bench_muon_step: the plugin's step, its Muon group alone, and the AdamW
group's k3rt_adamw_step_multi) and then the PyTorch peer at the same shapes, with the same
method: CUDA events around every run after warm-up, median of the runs, random normal weights
(std 0.02) and gradients (std 1). The peer:
  Muon group   EMA momentum and the Nesterov mix with torch._foreach_lerp, every block (a
               head's rows or columns, an expert, a whole matrix) gathered by shape into one
               [N, r, c] bf16 batch (tall blocks transposed), Newton-Schulz 5 x (3.4445,
               -4.7750, 2.0315) with torch.baddbmm (fp32 accumulation) compiled by
               torch.compile(dynamic=True) (eager is timed too; the faster is the peer), the
               update 0.2 sqrt(max(r, c)) and decay 0.1 in place through views;
  AdamW group  torch.optim.AdamW(fused=True), betas (0.9, 0.95), eps 1e-8, decay 0.1 on
               embedding, output head and router;
  QK-clip      per-head factors computed on the device from the max logits, one mul_ each.
Prints one table: case, k3rt ms, torch ms, speed (torch / k3rt: > 1 means k3rt is faster).

  python3 scripts/bench/muon_step.py --bench PATH [--params FILE] [--ns bf16|full]
                                     [--runs R] [--warmup W] [--json OUT.json]
"""
import argparse
import json
import math
import os
import time

import torch

from bench_util import median_ms, run_driver

NS_A, NS_B, NS_C = 3.4445, -4.7750, 2.0315
MUON_ROLES = {"matrix", "head_matrix", "expert_matrix"}
DECAYED_ADAMW = {"embedding", "output_head", "router"}
LR, WD, BETA, SCALE, TAU = 1e-4, 0.1, 0.95, 0.2, 100.0


def read_params(path):
    out = []
    for line in open(path):
        if line.startswith("#") or not line.strip():
            continue
        name, role, shape, heads, axis, qk = line.split()
        out.append((name, role, tuple(int(x) for x in shape.split("x")), int(heads),
                    int(axis), qk))
    return out


def ns5(x):
    """Newton-Schulz on a [N, r, c] bf16 batch with r <= c."""
    x = x / (x.norm(dim=(-2, -1), keepdim=True) + 1e-7)
    for _ in range(5):
        s = x @ x.mT
        p = torch.baddbmm(s, s, s, beta=NS_B, alpha=NS_C)
        x = torch.baddbmm(x, p, x, beta=NS_A)
    return x


def blocks(t, spec):
    """t as [count, rows, cols] block views (no copy)."""
    _, role, shape, heads, axis, _ = spec
    if role == "expert_matrix":
        return t
    if heads and axis == 0:
        return t.view(heads, shape[0] // heads, shape[1])
    if heads:
        return t.view(shape[0], heads, shape[1] // heads).transpose(0, 1)
    return t.unsqueeze(0)


class PerHeadMuon:
    def __init__(self, params, grads, specs, ns):
        self.p, self.g, self.specs, self.ns = params, grads, specs, ns
        self.m = [torch.zeros_like(p) for p in params]
        self.groups = {}
        for i, spec in enumerate(specs):
            b = blocks(params[i], spec)
            self.groups.setdefault(tuple(b.shape[1:]), []).append(i)

    def step(self):
        torch._foreach_lerp_(self.m, self.g, 1 - BETA)          # m = beta m + (1 - beta) g
        u = torch._foreach_lerp(self.g, self.m, BETA)            # (1 - beta) g + beta m
        torch._foreach_mul_(self.p, 1 - LR * WD)
        for (r, c), members in self.groups.items():
            x = torch.cat([blocks(u[i], self.specs[i]) for i in members]).to(torch.bfloat16)
            o = self.ns(x.mT if r > c else x)
            o = o.mT if r > c else o
            rate = -LR * SCALE * math.sqrt(max(r, c))
            k = 0
            for i in members:
                b = blocks(self.p[i], self.specs[i])
                b.add_(o[k:k + b.shape[0]], alpha=rate)
                k += b.shape[0]


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    ap = argparse.ArgumentParser()
    ap.add_argument("--bench", required=True)
    ap.add_argument("--params", default=os.path.join(here, "k3_mini_params.txt"))
    ap.add_argument("--ns", default="bf16")
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--json")
    a = ap.parse_args()
    rows = {r["op"]: r for r in run_driver([a.bench, a.params, "--ns", a.ns, "--runs",
                                            str(a.runs), "--warmup", str(a.warmup)])}

    torch.backends.cuda.matmul.allow_tf32 = False
    specs = read_params(a.params)
    dev = "cuda"
    mu = [s for s in specs if s[1] in MUON_ROLES]
    aw = [s for s in specs if s[1] not in MUON_ROLES]
    mk = lambda s, std: torch.randn(s[2], device=dev) * std
    mp, mg = [mk(s, 0.02) for s in mu], [mk(s, 1.0) for s in mu]
    ap_, ag = [mk(s, 0.02) for s in aw], [mk(s, 1.0) for s in aw]
    for p, g in zip(ap_, ag):
        p.grad = g
    clip = [(mp[i], s) for i, s in enumerate(mu) if s[5] != "none"]
    logits = [(100 + 30 * torch.randn(s[3], device=dev)) for _, s in clip]

    def qk_clip():
        for (p, s), lg in zip(clip, logits):
            gamma = torch.where(lg > TAU, TAU / lg, torch.ones_like(lg))
            f = gamma.sqrt() if s[5] == "sqrt" else gamma
            p.view(s[3], -1).mul_(f[:, None])

    adamw = torch.optim.AdamW(
        [{"params": [p for p, s in zip(ap_, aw) if s[1] in DECAYED_ADAMW], "weight_decay": WD},
         {"params": [p for p, s in zip(ap_, aw) if s[1] not in DECAYED_ADAMW],
          "weight_decay": 0.0}], lr=LR, betas=(0.9, 0.95), eps=1e-8, fused=True)

    peers = {}
    t0 = time.time()
    compiled = torch.compile(ns5, dynamic=True)
    for name, fn in (("eager", ns5), ("compiled", compiled)):
        opt = PerHeadMuon(mp, mg, mu, fn)
        opt.step()  # compiles
        torch.cuda.synchronize()
        t_muon = median_ms(opt.step, a.runs, a.warmup)
        t_step = median_ms(lambda: (opt.step(), adamw.step(), qk_clip()), a.runs, a.warmup)
        peers[name] = (t_muon, t_step)
        print(f"peer {name}: muon {t_muon:.3f} ms, step {t_step:.3f} ms "
              f"({time.time() - t0:.0f} s so far)", flush=True)
    best = min(peers, key=lambda k: peers[k][1])
    t_adamw = median_ms(adamw.step, a.runs, a.warmup)

    table = [("step", rows["step"]["ms"], peers[best][1], f"Per-Head Muon ({best}) + fused AdamW + QK-clip"),
             ("muon", rows["muon"]["ms"], peers[best][0], f"Per-Head Muon ({best})"),
             ("adamw", rows["adamw"]["ms"], t_adamw, "torch.optim.AdamW(fused=True)")]
    print(f"\n{torch.cuda.get_device_name()} | {len(specs)} parameters, "
          f"{sum(math.prod(s[2]) for s in specs) / 1e9:.3f}B elements | Newton-Schulz {a.ns} | "
          f"median of {a.runs} after {a.warmup} warm-up")
    print("| case | k3rt ms | torch ms | speed | peer |")
    print("|---|---|---|---|---|")
    out = []
    for case, k, t, what in table:
        print(f"| {case} | {k:.3f} | {t:.3f} | {t / k:.2f}x | {what} |")
        out.append({"case": case, "k3rt_ms": k, "torch_ms": t, "speed": t / k, "peer": what})
    print(f"peer eager vs compiled (muon, step ms): {peers}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"rows": out, "peers": peers, "device": torch.cuda.get_device_name()}, f,
                      indent=1)


if __name__ == "__main__":
    main()
