#!/usr/bin/env python3
"""k3rt's CUDA ops against PyTorch, in the same run on the same GPU.

Runs the C driver (bench_gpu_ops, built with the CUDA backend) and then each op it timed in
PyTorch at the same shape, with the same method: CUDA events around every run after warm-up,
median of the runs, random normal inputs. Prints one table:

  op, shape, k3rt ms, torch ms, speed (torch ms / k3rt ms: > 1 means k3rt is faster),
  TFLOP/s for products, and for memory-bound ops the fraction of the measured copy bandwidth
  (the fewest bytes the op must move over its time; the copy counts bytes read plus written).

Peers: torch.matmul in bf16 (the dW row compares k3rt's fp32-accumulating dW += dy^T x with a
bf16 torch product), torch._grouped_mm for experts (its grouped dW rows, bf16 out, also beside
the peer training would run for an fp32 gradient: fp32 out, added into the gradient for
grouped_dw, written for grouped_dw_set), F.rms_norm and F.cross_entropy with
autograd for the backward, torch.optim.AdamW(fused=True), F.silu(g) * u, Tensor.to, and
torch.linalg.vector_norm (fp32 accumulation, where k3rt's sum of squares accumulates fp64).

  python3 scripts/bench/gpu_ops.py [--bench PATH] [--runs R] [--warmup W] [--only SUBSTRING]
                                   [--json OUT.json]
"""
import argparse
import json
import os

import torch

from bench_util import median_ms, run_driver
from torch_common import glu
import torch.nn.functional as F

COPY_BW_DEFAULT = 4.2e12  # bytes/s, device-to-device copy measured on this H200 (read + write)
BF = torch.bfloat16


def randn(*shape, dtype=BF, scale=1.0):
    return (torch.randn(*shape, device="cuda", dtype=torch.float32) * scale).to(dtype)


def fp32_grad_peer(gm, dy, x, offs, g, o, i, overwrite):
    """torch._grouped_mm as training uses it for a gradient kept in fp32, which k3rt's dW is:
    (fn, what) writing an fp32 result (overwrite: the step's first backward) or adding one into
    the fp32 gradient. An fp32 out_dtype where this PyTorch takes one, else bf16 out then cast."""
    grad = torch.zeros(g, o, i, device="cuda", dtype=torch.float32)
    try:
        gm(dy[:8].t(), x[:8], offs=torch.full_like(offs, 8), out_dtype=torch.float32)
        prod, how = (lambda: gm(dy.t(), x, offs=offs, out_dtype=torch.float32)), "fp32 out"
    except Exception:  # this PyTorch has no fp32 out for it
        prod, how = (lambda: gm(dy.t(), x, offs=offs)), "bf16 out"
    if overwrite:
        if how == "fp32 out":
            return prod, f"torch._grouped_mm ({how})"
        return (lambda: grad.copy_(prod())), f"torch._grouped_mm ({how}) + grad.copy_"
    return (lambda: grad.add_(prod())), f"torch._grouped_mm ({how}) + grad.add_"


def torch_case(r):
    """Returns (callable, what) running the PyTorch peer of driver row r, or None; for the
    grouped weight gradient also (callable, what) of the fp32-gradient peer."""
    op = r["op"]
    if op.startswith("linear_"):
        n, i, o = r["n"], r["in"], r["out"]
        x, w, dy = randn(n, i), randn(o, i, scale=0.03), randn(n, o)
        if op == "linear_fwd":
            return lambda: torch.matmul(x, w.t()), "x @ W^T"
        if op == "linear_dx":
            return lambda: torch.matmul(dy, w), "dy @ W"
        return lambda: torch.matmul(dy.t(), x), "dy^T @ x (bf16 out)"
    if op.startswith("grouped_"):
        g, rows, i, o = r["groups"], r["rows"], r["in"], r["out"]
        x, w, dy = randn(rows, i), randn(g, o, i, scale=0.03), randn(rows, o)
        counts = [int(c) for c in str(r["counts"]).split(",")]  # the driver's, same groups
        offs = torch.tensor(counts, device="cuda", dtype=torch.int32).cumsum(0, dtype=torch.int32)
        gm = getattr(torch, "_grouped_mm", None)
        if gm is None:
            return None
        if op == "grouped_fwd":
            return lambda: gm(x, w.transpose(-2, -1), offs=offs), "torch._grouped_mm"
        if op == "grouped_dx":
            wc = w.transpose(-2, -1).contiguous().transpose(-2, -1)  # column-major W_g
            return lambda: gm(dy, wc, offs=offs), "torch._grouped_mm"
        plain = (lambda: gm(dy.t(), x, offs=offs)), "torch._grouped_mm (bf16 out)"
        return plain + fp32_grad_peer(gm, dy, x, offs, g, o, i, op.startswith("grouped_dw_set"))
    if op == "gemm_f32":
        m, n, k = r["m"], r["n"], r["k"]
        a, b = randn(m, k, dtype=torch.float32), randn(k, n, dtype=torch.float32)
        return lambda: torch.matmul(a, b), "matmul fp32, TF32 off"
    if op.startswith("rmsnorm_"):
        n, d = r["n"], r["d"]
        x = randn(n, d).requires_grad_(True)
        g = randn(d).requires_grad_(True)
        if op == "rmsnorm_fwd":
            return lambda: F.rms_norm(x, (d,), g, 1e-6), "F.rms_norm"
        y = F.rms_norm(x, (d,), g, 1e-6)
        dy = randn(n, d)
        return (lambda: torch.autograd.grad(y, (x, g), dy, retain_graph=True),
                "F.rms_norm backward (dx, dgain)")
    if op.startswith("xent_"):
        n, v = r["n"], r["v"]
        logits = randn(n, v, scale=2.0).requires_grad_(True)
        t = torch.randint(0, v, (n,), device="cuda")
        if op == "xent_fwd":
            return lambda: F.cross_entropy(logits, t, reduction="none"), "F.cross_entropy"
        loss = F.cross_entropy(logits, t, reduction="none")
        gl = torch.full((n,), 1.0 / n, device="cuda", dtype=loss.dtype)
        return (lambda: torch.autograd.grad(loss, logits, gl, retain_graph=True),
                "F.cross_entropy backward")
    if op.startswith("swiglu_"):
        n = r["n"]
        gt, up = randn(n, scale=2.0).requires_grad_(True), randn(n).requires_grad_(True)
        if op == "swiglu_fwd":
            return lambda: F.silu(gt) * up, "F.silu(g) * u"
        out = F.silu(gt) * up
        do = randn(n)
        return lambda: torch.autograd.grad(out, (gt, up), do, retain_graph=True), "autograd"
    if op.startswith("situ_"):
        # the compiled peer: K3's SiTU-GLU and its derivative as inductor fuses them
        n, b1, b2 = r["n"], 4.0, 25.0
        gt, up, do = randn(n, scale=2.0), randn(n), randn(n)
        if op == "situ_fwd":
            f = torch.compile(lambda g, u: glu(g, u, "situ", b1, b2))
            return (lambda: f(gt, up)), "torch.compile SiTU-GLU"

        def bwd(g, u, d):
            gf, uf, df = g.float(), u.float(), d.float()
            t1, t2, sg = torch.tanh(gf / b1), torch.tanh(uf / b2), torch.sigmoid(gf)
            da = (1 - t1 * t1) * sg + b1 * t1 * sg * (1 - sg)
            return ((df * b2 * t2 * da).to(g.dtype),
                    (df * b1 * t1 * sg * (1 - t2 * t2)).to(u.dtype))
        f = torch.compile(bwd)
        return (lambda: f(gt, up, do)), "torch.compile SiTU-GLU backward"
    if op == "cast_f32_bf16":
        x = randn(r["n"], dtype=torch.float32)
        return lambda: x.to(BF), "Tensor.to(bfloat16)"
    if op == "sum_squares":
        x = randn(r["n"], dtype=torch.float32)
        return lambda: torch.linalg.vector_norm(x), "vector_norm (fp32 accumulate)"
    if op == "adamw":
        p = torch.nn.Parameter(randn(r["n"], dtype=torch.float32))
        p.grad = randn(r["n"], dtype=torch.float32, scale=1e-2)
        opt = torch.optim.AdamW([p], lr=1e-4, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                                fused=True)
        return opt.step, "AdamW(fused=True).step"
    if op == "copy":
        a = torch.empty(int(r["bytes"]) // 8, dtype=torch.float32, device="cuda").normal_()
        b = torch.empty_like(a)
        return lambda: b.copy_(a), "Tensor.copy_"
    return None


def shape_of(r):
    keys = [k for k in ("n", "m", "k", "in", "out", "groups", "rows", "skew", "max/mean", "d", "v",
                        "size") if k in r]
    return " ".join(f"{k}={r[k]}" for k in keys)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    build = os.environ.get("K3RT_BUILD", os.path.join(root, "build-cuda"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(build, "bin", "bench_gpu_ops"))
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--only", default=None)
    ap.add_argument("--json", default=None, help="also write every row here")
    a = ap.parse_args()

    cmd = [a.bench, "--runs", str(a.runs), "--warmup", str(a.warmup)]
    if a.only:
        cmd += ["--only", a.only]
    rows = run_driver(cmd)

    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.manual_seed(0)
    bw = COPY_BW_DEFAULT
    for r in rows:
        if r["op"] == "copy":
            bw = r["bytes"] / (r["ms"] * 1e-3)
    peers = {}  # rows differing only in k3rt's forced schedule (_co, _pp) share the peer
    for r in rows:
        key = (r["op"].removesuffix("_co").removesuffix("_pp"), shape_of(r), r.get("counts"))
        if key in peers:
            r.update(peers[key])
            continue
        case = None
        try:
            case = torch_case(r)
        except Exception as e:  # a peer missing from this PyTorch: report, keep going
            r["torch_error"] = f"{type(e).__name__}: {e}"
        if case is not None:
            # (fn, what) for the plain peer, then (fn, what) for the fp32-gradient one if any
            for at, (fn, what) in zip(("torch", "torch32"), (case[i:i + 2] for i in range(0, len(case), 2))):
                r[at + "_what"] = what
                try:
                    r[at + "_ms"] = median_ms(fn, a.runs, a.warmup)
                except Exception as e:
                    r[at + "_error"] = f"{type(e).__name__}: {e}"
            del fn, case
        peers[key] = {k: v for k, v in r.items() if k.startswith("torch")}
        torch.cuda.empty_cache()

    print(f"\ncopy bandwidth used for %BW: {bw / 1e12:.2f} TB/s (read + write)")
    head = f"{'op':<18} {'shape':<34} {'k3rt ms':>9} {'torch ms':>9} {'speed':>6} " \
           f"{'TFLOP/s':>8} {'%BW':>5}  peer"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "torch32_what" in r:  # the fp32-gradient peer beside the plain one
            t32 = r.get("torch32_ms")
            r["peer_note"] = (f"; vs {r['torch32_what']}: {t32:.4f} ms, speed "
                              f"{t32 / r['ms']:.2f}") if t32 else f"; {r.get('torch32_error')}"
        k = r["ms"]
        t = r.get("torch_ms")
        speed = f"{t / k:6.2f}" if t else "     -"
        tf = f"{r['flops'] / (k * 1e-3) / 1e12:8.1f}" if r.get("flops") else "       -"
        pbw = f"{100 * r['bytes'] / (k * 1e-3) / bw:5.0f}" if not r.get("flops") else "    -"
        tms = f"{t:9.4f}" if t else "        -"
        peer = r.get("torch_what", "") if t else r.get("torch_error", "no peer")
        peer += r.get("peer_note", "")
        print(f"{r['op']:<18} {shape_of(r):<34} {k:9.4f} {tms} {speed} {tf} {pbw}  {peer}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump({"copy_bw": bw, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
