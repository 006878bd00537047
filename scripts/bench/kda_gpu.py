#!/usr/bin/env python3
"""KDA's chunked recurrence: k3rt's CUDA kernels (plugins/attention/kda/cuda) against
flash-linear-attention's chunk_kda, in one process on identical inputs.

k3rt's C API is reached through ctypes (the shared object k3rt_kda_cuda_bench, built with the CUDA
backend) on PyTorch's tensors and current stream, so both sides read the same q, k, v, g, beta
(bf16) and are timed the same way (CUDA events around each run after warm-up, the median; fla's
first calls, which autotune, are made before timing). fla runs with its safe gate, lower bound
-5 (safe_gate=True, lower_bound=-5: the M=16 tensor-core path), g precomputed (log decay in
[-5, 0)), no initial or final state, chunk 64. Forward: the op alone; forward+backward: the
forward, then every input gradient from dO (fla through autograd). Ratio = fla ms / k3rt ms
(above 1: k3rt faster). Also printed: the relative rms difference between the two outputs and
gradients (both bf16, so ~1e-2 is agreement), and with --profile the time of each k3rt kernel.

  python3 scripts/bench/kda_gpu.py [--lib DIR]... [--runs R] [--warmup W] [--shape B,T,H,D]...
                                   [--json OUT.json] [--profile]
  python3 scripts/bench/kda_gpu.py --layer BIN --plugin SO [--layer-shape B,T]... [--no-fla]

--layer times the whole layer instead: k3rt's plugin through the driver BIN (bench_layer,
scripts/bench/layer_bench.c: the host's rig, CUDA events, the median) against
fla's KimiDeltaAttention configured like K3-mini's KDA layers (d_model 1024, 8 heads x 128,
conv 4, safe gate with lower bound -5, full-rank output gate: fla's low-rank g_proj replaced by
one bias-free [1024 -> 1024] linear), bf16, training mode; forward alone (no autograd graph) and
forward + backward (every input and parameter gradient). Default shape B8 T4096.

--lib names the folders holding libk3rt_kda_cuda_bench.so, libk3rt.so.1 and the libraries they
need that the image lacks (liblua5.4, libjansson, OpenBLAS and its Fortran runtime); they are
loaded by path, in dependency order, so PyTorch keeps its own libraries.
"""
import argparse
import ctypes
import json
import os
import sys
import time

import torch
import torch.nn.functional as F

from bench_util import load_k3rt_library, median_ms

BF = torch.bfloat16
K3RT_BF16 = 3


class Args(ctypes.Structure):
    """Mirror of kda_cuda_args (kda_cuda.h)."""
    _fields_ = [("dtype", ctypes.c_int), ("B", ctypes.c_int64), ("T", ctypes.c_int64),
                ("H", ctypes.c_int64), ("HV", ctypes.c_int64), ("D", ctypes.c_int64),
                ("scale", ctypes.c_double), ("cu_seqlens", ctypes.c_void_p),
                ("n_docs", ctypes.c_int64)] + \
               [(n, ctypes.c_void_p) for n in
                ("q", "k", "v", "g", "beta", "s0", "o", "s_final", "saved", "workspace", "d_o",
                 "d_s_final", "d_q", "d_k", "d_v", "d_g", "d_beta", "d_s0")] + \
               [("row_len", ctypes.c_int64)]


def load_k3rt(dirs):
    lib = load_k3rt_library(dirs, "libk3rt_kda_cuda_bench.so")
    lib.kdab_args_size.restype = ctypes.c_size_t
    if lib.kdab_args_size() != ctypes.sizeof(Args):
        sys.exit(f"kda_cuda_args is {lib.kdab_args_size()} bytes, the mirror "
                 f"{ctypes.sizeof(Args)}: update Args")
    P = ctypes.c_void_p
    lib.kdab_sizes.argtypes = [ctypes.POINTER(Args), ctypes.POINTER(ctypes.c_size_t),
                               ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t),
                               ctypes.c_char_p, ctypes.c_size_t]
    for f in (lib.kdab_fwd, lib.kdab_bwd):
        f.argtypes = [P, ctypes.POINTER(Args), ctypes.c_char_p, ctypes.c_size_t]
    return lib


class K3rt:
    def __init__(self, lib, q, k, v, g, beta, do):
        B, T, H, D = q.shape
        self.lib, self.msg = lib, ctypes.create_string_buffer(512)
        a = Args()
        a.dtype, a.B, a.T, a.H, a.HV, a.D, a.scale = K3RT_BF16, B, T, H, v.shape[2], D, D ** -0.5
        saved, wf, wb = ctypes.c_size_t(), ctypes.c_size_t(), ctypes.c_size_t()
        if lib.kdab_sizes(ctypes.byref(a), ctypes.byref(saved), ctypes.byref(wf),
                          ctypes.byref(wb), self.msg, 512):
            sys.exit(self.msg.value.decode())
        self.saved = torch.empty(saved.value, dtype=torch.uint8, device="cuda")
        self.ws = torch.empty(wb.value, dtype=torch.uint8, device="cuda")
        self.o = torch.empty_like(v)
        self.grads = [torch.empty_like(x) for x in (q, k, v, g, beta)]
        self.keep = (q, k, v, g, beta, do)
        ptr = lambda t: t.data_ptr()
        a.q, a.k, a.v, a.g, a.beta = map(ptr, (q, k, v, g, beta))
        a.o, a.saved, a.workspace, a.d_o = ptr(self.o), ptr(self.saved), ptr(self.ws), ptr(do)
        a.d_q, a.d_k, a.d_v, a.d_g, a.d_beta = map(ptr, self.grads)
        self.a = a
        self.bytes = (saved.value, wb.value)

    def _call(self, f):
        if f(ctypes.c_void_p(torch.cuda.current_stream().cuda_stream), ctypes.byref(self.a),
             self.msg, 512):
            sys.exit(self.msg.value.decode())

    def fwd(self):
        self._call(self.lib.kdab_fwd)
        return self.o

    def fwdbwd(self):
        self._call(self.lib.kdab_fwd)
        self._call(self.lib.kdab_bwd)
        return self.grads


def rel(a, b):
    a, b = a.float(), b.float()
    return ((a - b).pow(2).mean().sqrt() / a.pow(2).mean().sqrt().clamp_min(1e-30)).item()


def profile_kernels(kr, reps=3):
    """Device ms of each k3rt kernel per forward+backward (PyTorch's profiler sees every kernel
    of the process)."""
    from torch.profiler import profile, ProfilerActivity
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            kr.fwdbwd()
        torch.cuda.synchronize()
    per = {}
    for e in prof.events():
        if e.device_type != torch.autograd.DeviceType.CUDA:
            continue
        nm = e.name.replace("void ", "").replace("kdacu::(anonymous namespace)::", "")
        nm = nm.replace("kdacu::", "").split("(")[0]
        t = getattr(e, "device_time", None)
        t = getattr(e, "cuda_time", 0.0) if t is None else t
        per[nm] = per.get(nm, 0.0) + t / reps / 1000.0
    return per


def inputs(B, T, H, D, seed=0):
    g_ = torch.Generator(device="cuda").manual_seed(seed)
    rn = lambda *s: torch.randn(*s, device="cuda", generator=g_)
    q = F.normalize(rn(B, T, H, D), dim=-1).to(BF)
    k = F.normalize(rn(B, T, H, D), dim=-1).to(BF)
    v = rn(B, T, H, D).to(BF)
    g = (-5.0 * torch.sigmoid(rn(B, T, H, D) - 2.0)).to(BF)  # log decay in (-5, 0)
    beta = torch.sigmoid(rn(B, T, H)).to(BF)
    do = rn(B, T, H, D).to(BF)
    return q, k, v, g, beta, do


K3_MINI = {"d": 1024, "heads": 8, "head_dim": 128, "conv": 4, "lb": -5.0}


def layer_bench(a):
    """The whole layer: k3rt's plugin (driver) vs fla's KimiDeltaAttention, K3-mini's shape."""
    import subprocess
    c = K3_MINI
    cfg = json.dumps({"heads": c["heads"], "head_dim": c["head_dim"], "conv_width": c["conv"],
                      "lower_bound": c["lb"], "gate_rank": 0})
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.layer_shape] or [(8, 4096)]
    rows = []
    env = dict(os.environ)
    if os.environ.get("K3RT_BENCH_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["K3RT_BENCH_LD_LIBRARY_PATH"]
    for (B, T) in shapes:
        cmd = [a.layer, "--plugin", a.plugin, "--config", cfg, "--batch", str(B), "--seq", str(T),
               "--d-model", str(c["d"]), "--dtype", "bf16", "--runs", str(a.runs),
               "--warmup", str(a.warmup)]
        p = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if p.returncode != 0:
            sys.exit(f"bench_layer failed ({p.returncode}): {p.stderr.strip()}")
        r = {"B": B, "T": T, **{"k3rt_" + k: v for k, v in json.loads(p.stdout).items()}}
        print(f"B{B} T{T}: k3rt layer fwd {r['k3rt_fwd_ms']:.3f} ms, f+b "
              f"{r['k3rt_fwdbwd_ms']:.3f} ms (saved {r['k3rt_saved_bytes'] / 2**20:.0f} MiB, "
              f"workspace {r['k3rt_workspace_bytes'] / 2**20:.0f} MiB)", flush=True)
        rows.append(r)
    if not a.no_fla:
        import torch.nn as nn
        from fla.layers.kda import KimiDeltaAttention
        for r in rows:
            B, T = r["B"], r["T"]
            torch.manual_seed(0)
            layer = KimiDeltaAttention(hidden_size=c["d"], head_dim=c["head_dim"],
                                       num_heads=c["heads"], safe_gate=True,
                                       lower_bound=c["lb"], conv_size=c["conv"])
            layer.g_proj = nn.Linear(c["d"], c["heads"] * c["head_dim"], bias=False)
            layer = layer.to(device="cuda", dtype=BF).train()
            x = torch.randn(B, T, c["d"], device="cuda", dtype=BF, requires_grad=True)
            do = torch.randn(B, T, c["d"], device="cuda", dtype=BF)
            params = [x] + [p for p in layer.parameters()]

            def fla_fwd():
                with torch.no_grad():
                    return layer(x)[0]

            def fla_fwdbwd():
                o = layer(x)[0]
                return torch.autograd.grad(o, params, do)

            t0 = time.time()
            fla_fwdbwd()  # autotuning: minutes on the first call
            fla_fwd()
            torch.cuda.synchronize()
            r["fla_warmup_s"] = time.time() - t0
            r["fla_fwd_ms"] = median_ms(fla_fwd, a.runs, a.warmup)
            r["fla_fwdbwd_ms"] = median_ms(fla_fwdbwd, a.runs, a.warmup)
            r["ratio_fwd"] = r["fla_fwd_ms"] / r["k3rt_fwd_ms"]
            r["ratio_fwdbwd"] = r["fla_fwdbwd_ms"] / r["k3rt_fwdbwd_ms"]
            print(f"B{B} T{T}: fla layer fwd {r['fla_fwd_ms']:.3f} ms, f+b "
                  f"{r['fla_fwdbwd_ms']:.3f} ms (warm-up {r['fla_warmup_s']:.0f} s); ratio fwd "
                  f"{r['ratio_fwd']:.2f}, f+b {r['ratio_fwdbwd']:.2f}", flush=True)
            del layer, x, do, params
            torch.cuda.empty_cache()
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lib", action="append", default=[])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--json", default=None)
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-fla", action="store_true", help="time k3rt alone")
    ap.add_argument("--layer", default=None, help="bench_layer: time the whole layer")
    ap.add_argument("--plugin", default=None, help="libk3rt_kda.so (with --layer)")
    ap.add_argument("--layer-shape", action="append", default=[])
    a = ap.parse_args()
    if a.layer:
        print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)
        return layer_bench(a)
    dirs = a.lib or [os.path.join(root, "build-cuda", "lib")]
    lib = load_k3rt(dirs)
    shapes = [tuple(int(x) for x in s.split(",")) for s in a.shape] or \
        [(8, 4096, 16, 128), (2, 16384, 16, 128), (1, 65536, 16, 128)]
    if not a.no_fla:
        from fla.ops.kda import chunk_kda
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}", flush=True)

    t_start = time.time()
    stamp = lambda: f"[{time.time() - t_start:6.1f} s]"
    rows = []
    # k3rt first, every shape (no autotuning: seconds), then fla shape by shape (its first
    # calls autotune, minutes): whatever the time limit cuts off, k3rt's numbers are in.
    for (B, T, H, D) in shapes:
        q, k, v, g, beta, do = inputs(B, T, H, D)
        kr = K3rt(lib, q, k, v, g, beta, do)
        r = {"B": B, "T": T, "H": H, "D": D,
             "k3rt_saved_bytes": kr.bytes[0], "k3rt_workspace_bytes": kr.bytes[1]}
        kr.fwdbwd()
        r["k3rt_fwd_ms"] = median_ms(kr.fwd, a.runs, a.warmup)
        r["k3rt_fwdbwd_ms"] = median_ms(kr.fwdbwd, a.runs, a.warmup)
        # a second timing of each: the spread between two timings of one version
        r["k3rt_fwd_ms_again"] = median_ms(kr.fwd, a.runs, a.warmup)
        r["k3rt_fwdbwd_ms_again"] = median_ms(kr.fwdbwd, a.runs, a.warmup)
        print(f"{stamp()} B{B} T{T} H{H} D{D}: k3rt fwd {r['k3rt_fwd_ms']:.3f} "
              f"({r['k3rt_fwd_ms_again']:.3f}) ms, f+b {r['k3rt_fwdbwd_ms']:.3f} "
              f"({r['k3rt_fwdbwd_ms_again']:.3f}) ms", flush=True)
        if a.profile:
            try:
                r["k3rt_kernels_ms"] = profile_kernels(kr)
                print("  k3rt kernels (ms per fwd+bwd): " +
                      ", ".join(f"{n} {t:.3f}" for n, t in
                                sorted(r["k3rt_kernels_ms"].items(), key=lambda x: -x[1])),
                      flush=True)
            except Exception as e:  # the profiler is a diagnostic: never lose the timings
                print(f"  (profiler failed: {type(e).__name__}: {e})", flush=True)
        rows.append(r)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        del kr, q, k, v, g, beta, do
        torch.cuda.empty_cache()

    for r in rows if not a.no_fla else []:
        B, T, H, D = r["B"], r["T"], r["H"], r["D"]
        q, k, v, g, beta, do = inputs(B, T, H, D)
        leaves = [x.detach().clone().requires_grad_(True) for x in (q, k, v, g, beta)]

        def fla_fwd():
            o, _ = chunk_kda(q, k, v, g, beta, scale=D ** -0.5, safe_gate=True, lower_bound=-5.0)
            return o

        def fla_fwdbwd():
            o, _ = chunk_kda(*leaves, scale=D ** -0.5, safe_gate=True, lower_bound=-5.0)
            return torch.autograd.grad(o, leaves, do)

        o_f = fla_fwd()
        g_f = fla_fwdbwd()
        with torch.no_grad():
            r["fla_fwd_ms"] = median_ms(fla_fwd, a.runs, a.warmup)
        r["fla_fwdbwd_ms"] = median_ms(fla_fwdbwd, a.runs, a.warmup)
        r["ratio_fwd"] = r["fla_fwd_ms"] / r["k3rt_fwd_ms"]
        r["ratio_fwdbwd"] = r["fla_fwdbwd_ms"] / r["k3rt_fwdbwd_ms"]
        # agreement on the same inputs
        kr = K3rt(lib, q, k, v, g, beta, do)
        o_k = kr.fwd().clone()
        g_k = [x.clone() for x in kr.fwdbwd()]
        torch.cuda.synchronize()
        diff = {"o": rel(o_f, o_k)}
        for name, x, y in zip(("dq", "dk", "dv", "dg", "dbeta"), g_f, g_k):
            diff[name] = rel(x, y)
        r["diff_vs_fla"] = diff
        print(f"{stamp()} B{B} T{T} H{H} D{D}: fla fwd {r['fla_fwd_ms']:.3f} ms, f+b "
              f"{r['fla_fwdbwd_ms']:.3f} ms; ratio fwd {r['ratio_fwd']:.2f}, f+b "
              f"{r['ratio_fwdbwd']:.2f}; diff k3rt vs fla " +
              " ".join(f"{n} {e:.2e}" for n, e in diff.items()), flush=True)
        if a.json:
            with open(a.json, "w") as f:
                json.dump(rows, f, indent=1)
        del kr, q, k, v, g, beta, do, leaves, o_f, g_f, o_k, g_k
        torch.cuda.empty_cache()

    print("\nKDA core, bf16, k3rt vs fla chunk_kda (safe gate, LB=-5); ratio = fla ms / k3rt ms")
    head = f"{'B,T,H,D':<18} {'fla fwd':>8} {'k3rt fwd':>9} {'ratio':>6} {'fla f+b':>8} " \
           f"{'k3rt f+b':>9} {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for r in rows:
        if "fla_fwd_ms" not in r:
            continue
        print(f"{r['B']},{r['T']},{r['H']},{r['D']:<8} {r['fla_fwd_ms']:8.3f} "
              f"{r['k3rt_fwd_ms']:9.3f} {r['ratio_fwd']:6.2f} {r['fla_fwdbwd_ms']:8.3f} "
              f"{r['k3rt_fwdbwd_ms']:9.3f} {r['ratio_fwdbwd']:6.2f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
