#!/usr/bin/env python3
"""One AttnRes mixing op, forward + backward: k3rt's CUDA kernels (plugins/residual/
block_attnres/cuda) against flash-linear-attention's fused_attnres (fla/ops/attnres/fused.py,
its default Triton path, checkpoint_level 1), in one process on identical bf16 inputs.

k3rt's C API is reached through ctypes (the shared object k3rt_attnres_cuda_bench) on PyTorch's
tensors and current stream. Both compute o = sum_i softmax_i(w . RMSNorm_gamma(v_i)) v_i with
eps 1e-5 and no logit scale; the backward gives every source's gradient (written) and the
pseudo-query's and gain's. fla's side runs through autograd (torch.autograd.grad, so nothing
accumulates into .grad); its autotuning calls come first, in the warm-up. Timing: CUDA events
around each run after warm-up, the median of --runs. Inputs are random (sources of different
scales, logits of order 1), never zeros.

Printed per shape: each side's forward and forward+backward time, the ratio k3rt / fla (below
1: k3rt faster), and achieved bandwidth over the op's least traffic (forward: read the n
sources, write h; backward: read the n sources and dh, write the n gradients) against the
device-to-device copy measured first. Also the relative rms difference of o and of the
gradients between the two sides and, for both, against an fp32 PyTorch reference.

  python3 scripts/bench/attnres_gpu.py --lib DIR [--lib DIR]... [--runs R] [--warmup W]
                                       [--shape N,d,n]... [--json OUT.json]
"""
import argparse
import ctypes
import json
import sys

import torch
import torch.nn.functional as F

from bench_util import load_k3rt_library, median_ms

BF = torch.bfloat16
K3RT_BF16 = 3
EPS = 1e-5


def load_k3rt(dirs):
    lib = load_k3rt_library(dirs, "libk3rt_attnres_cuda_bench.so")
    P, I64, I = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    lib.arb_scratch_bytes.restype = I64
    lib.arb_scratch_bytes.argtypes = [I64, I64]
    lib.arb_fwd.argtypes = [P, I, I64, I64, I, P, P, P, ctypes.c_float, P, P,
                            ctypes.c_char_p, ctypes.c_size_t]
    lib.arb_bwd.argtypes = [P, I, I64, I64, I, P, P, P, ctypes.c_float, P, P, P, P, P, P, P,
                            ctypes.c_char_p, ctypes.c_size_t]
    return lib


class K3rt:
    """The op on k3rt's kernels over the given tensors (pointers captured once)."""

    def __init__(self, lib, srcs, w, gamma, do):
        N, d = srcs[0].shape
        n = len(srcs)
        self.lib, self.N, self.d, self.n = lib, N, d, n
        self.msg = ctypes.create_string_buffer(512)
        self.h = torch.empty_like(srcs[0])
        self.alpha = torch.empty(N, n, dtype=torch.float32, device="cuda")
        self.dv = [torch.empty_like(s) for s in srcs]
        self.dw = torch.zeros(d, dtype=torch.float32, device="cuda")
        self.dg = torch.zeros(d, dtype=torch.float32, device="cuda")
        self.scratch = torch.empty(lib.arb_scratch_bytes(N, d), dtype=torch.uint8, device="cuda")
        self.keep = (srcs, w, gamma, do)
        self.v = (ctypes.c_void_p * n)(*[s.data_ptr() for s in srcs])
        self.dvp = (ctypes.c_void_p * n)(*[t.data_ptr() for t in self.dv])

    def _ok(self, rc):
        if rc:
            sys.exit("k3rt: " + self.msg.value.decode())

    def fwd(self):
        srcs, w, gamma, _ = self.keep
        st = torch.cuda.current_stream().cuda_stream
        self._ok(self.lib.arb_fwd(st, K3RT_BF16, self.N, self.d, self.n, self.v, w.data_ptr(),
                                  gamma.data_ptr(), EPS, self.alpha.data_ptr(),
                                  self.h.data_ptr(), self.msg, 512))

    def bwd(self):
        _, w, gamma, do = self.keep
        st = torch.cuda.current_stream().cuda_stream
        self._ok(self.lib.arb_bwd(st, K3RT_BF16, self.N, self.d, self.n, self.v, w.data_ptr(),
                                  gamma.data_ptr(), EPS, self.alpha.data_ptr(),
                                  self.h.data_ptr(), do.data_ptr(), self.dvp,
                                  self.dw.data_ptr(), self.dg.data_ptr(),
                                  self.scratch.data_ptr(), self.msg, 512))

    def fwd_bwd(self):
        self.fwd()
        self.bwd()


def reference(srcs, w, gamma, do):
    """fp32 PyTorch AttnRes and its gradients, on the bf16 values upcast."""
    v = [s.float().requires_grad_() for s in srcs]
    wf, gf = w.float().requires_grad_(), gamma.float().requires_grad_()
    V = torch.stack(v)
    k = F.rms_norm(V, (V.shape[-1],), gf, EPS)
    p = torch.einsum("lnd,d->ln", k, wf).softmax(0)
    o = torch.einsum("ln,lnd->nd", p, V)
    g = torch.autograd.grad(o, v + [wf, gf], do.float())
    return o.detach(), [x.detach() for x in g]


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def copy_bandwidth(runs, warmup):
    x = torch.empty(1 << 30, dtype=torch.uint8, device="cuda").random_()
    y = torch.empty_like(x)
    ms = median_ms(lambda: y.copy_(x), runs, warmup)
    return 2 * x.numel() / (ms * 1e-3) / 1e12


def bench_shape(lib, fused_attnres, N, d, n, runs, warmup, copy_tbs):
    g = torch.Generator(device="cuda").manual_seed(N * 31 + d * 7 + n)
    srcs = [((0.5 + 0.25 * i) * torch.randn(N, d, device="cuda", generator=g) + 0.05 * i).to(BF)
            for i in range(n)]
    w = (torch.randn(d, device="cuda", generator=g) / d ** 0.5).to(BF)
    gamma = (1 + 0.2 * torch.randn(d, device="cuda", generator=g)).to(BF)
    do = torch.randn(N, d, device="cuda", generator=g).to(BF)
    k = K3rt(lib, srcs, w, gamma, do)

    leaves = [s.detach().requires_grad_() for s in srcs]
    wq, gq = w.detach().requires_grad_(), gamma.detach().requires_grad_()
    fla_out = {}

    def fla_fwd():
        with torch.no_grad():
            fla_out["o"] = fused_attnres(wq, leaves, gq, rms_eps=EPS)

    def fla_fwd_bwd():
        o = fused_attnres(wq, leaves, gq, rms_eps=EPS)
        fla_out["o"] = o.detach()
        fla_out["g"] = torch.autograd.grad(o, leaves + [wq, gq], do)

    fla_fwd_bwd()  # autotunes both directions
    fla_fwd()
    torch.cuda.synchronize()
    t = {
        "fla_fwd": median_ms(fla_fwd, runs, warmup),
        "k3rt_fwd": median_ms(k.fwd, runs, warmup),
        "fla_fwd_bwd": median_ms(fla_fwd_bwd, runs, warmup),
        "k3rt_fwd_bwd": median_ms(k.fwd_bwd, runs, warmup),
    }
    # agreement: one more run of each, then the fp32 reference
    k.dw.zero_(), k.dg.zero_()
    k.fwd_bwd()
    fla_fwd_bwd()
    torch.cuda.synchronize()
    o_ref, g_ref = reference(srcs, w, gamma, do)
    kg = k.dv + [k.dw, k.dg]  # the pseudo-query's and the gain's gradients
    fg = list(fla_out["g"])
    diff = {
        "o k3rt-fla": rel(k.h, fla_out["o"]),
        "o k3rt-ref": rel(k.h, o_ref), "o fla-ref": rel(fla_out["o"], o_ref),
        "dv k3rt-ref": max(rel(a, b) for a, b in zip(kg[:n], g_ref[:n])),
        "dv fla-ref": max(rel(a, b) for a, b in zip(fg[:n], g_ref[:n])),
        "dw k3rt-ref": rel(kg[n], g_ref[n]), "dw fla-ref": rel(fg[n], g_ref[n]),
        "dgamma k3rt-ref": rel(kg[n + 1], g_ref[n + 1]),
        "dgamma fla-ref": rel(fg[n + 1], g_ref[n + 1]),
    }
    row = N * d * 2
    fwd_bytes, bwd_bytes = (n + 1) * row, (2 * n + 1) * row
    out = {"N": N, "d": d, "n": n, "runs": runs, "ms": t, "diff": diff,
           "ratio_fwd": t["k3rt_fwd"] / t["fla_fwd"],
           "ratio_fwd_bwd": t["k3rt_fwd_bwd"] / t["fla_fwd_bwd"],
           "least_bytes_fwd": fwd_bytes, "least_bytes_fwd_bwd": fwd_bytes + bwd_bytes}
    for side in ("k3rt", "fla"):
        out[f"{side}_tbs_fwd"] = fwd_bytes / (t[f"{side}_fwd"] * 1e-3) / 1e12
        out[f"{side}_tbs_fwd_bwd"] = (fwd_bytes + bwd_bytes) / (t[f"{side}_fwd_bwd"] * 1e-3) / 1e12
    print(f"N {N} d {d} sources {n}:")
    for side in ("k3rt", "fla"):
        print(f"  {side:5s} fwd {t[side + '_fwd']:.3f} ms ({out[side + '_tbs_fwd']:.2f} TB/s, "
              f"{out[side + '_tbs_fwd'] / copy_tbs:.0%} of copy)   fwd+bwd "
              f"{t[side + '_fwd_bwd']:.3f} ms ({out[side + '_tbs_fwd_bwd']:.2f} TB/s, "
              f"{out[side + '_tbs_fwd_bwd'] / copy_tbs:.0%} of copy)")
    print(f"  k3rt/fla: fwd {out['ratio_fwd']:.3f}x  fwd+bwd {out['ratio_fwd_bwd']:.3f}x")
    print("  rel rms: " + ", ".join(f"{k_} {v:.2e}" for k_, v in diff.items()))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", default=[])
    ap.add_argument("--runs", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--json")
    a = ap.parse_args()
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shape] or \
        [(32768, 2048, 9), (32768, 1024, 5)]
    lib = load_k3rt(a.lib)
    from fla.ops.attnres import fused_attnres
    print(f"{torch.cuda.get_device_name()}  torch {torch.__version__}", flush=True)
    copy_tbs = copy_bandwidth(a.runs, a.warmup)
    print(f"device-to-device copy of 1 GiB: {copy_tbs:.2f} TB/s (read + write)", flush=True)
    res = {"gpu": torch.cuda.get_device_name(), "copy_tbs": copy_tbs, "shapes": []}
    for N, d, n in shapes:
        res["shapes"].append(bench_shape(lib, fused_attnres, N, d, n, a.runs, a.warmup,
                                         copy_tbs))
        if a.json:
            with open(a.json, "w") as f:
                json.dump(res, f, indent=1)


if __name__ == "__main__":
    main()
