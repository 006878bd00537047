#!/usr/bin/env python3
"""The MLA plugin's attention core against PyTorch SDPA, in the same run on the same GPU.

Runs the C driver (bench_mla_attention, built with the CUDA backend), then times
torch.nn.functional.scaled_dot_product_attention (is_causal=True, bf16, forward + backward
through autograd) at the same shapes with the same method: CUDA events around each run after
warm-up, median of the runs, random inputs in the same [B, T, H, D] memory layout (passed to
SDPA as [B, H, T, D] views, as flash attention takes them).

PyTorch is timed with its default backend choice and with each backend it offers alone (flash,
cuDNN, memory-efficient); where the value width differs from the query/key width (MLA's 192/128)
flash cannot run, so it is also timed with V zero-padded to the query width (the usual way MLA
runs on flash attention; its FLOPs are counted at the true widths). The ratio is k3rt's TFLOP/s
over the fastest PyTorch variant. k3rt runs each shape with its own kernels and with cuDNN's
fused attention (its "cudnn" path), where the driver finds cuDNN usable.

FLOPs, causal: forward 2 B H T^2 (dqk + dv) / 2; backward 2.5x the forward. k3rt's backward is
timed in both modes: the default (dQ summed with atomics) and deterministic ("determ.").

  python3 scripts/bench/mla_attention.py [--bench PATH] [--runs R] [--warmup W]
                                         [--shape B,T,H,DQK,DV]... [--json OUT.json]

Results, with the date, GPU and command, are in docs/PERFORMANCE.md.
"""
import argparse
import json
import os

import torch

from bench_util import median_ms, run_driver
import torch.nn.functional as F

BF = torch.bfloat16


def sdpa_variants():
    """(name, context factory or None for the default choice)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    out = [("default", None)]
    for name in ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION"):
        b = getattr(SDPBackend, name, None)
        if b is not None:
            out.append((name.lower().replace("_attention", ""), lambda b=b: sdpa_kernel([b])))
    return out


def time_torch(r, runs, warmup):
    """Forward and forward+backward ms of each SDPA variant at driver row r."""
    B, T, H, dqk, dv = r["B"], r["T"], r["H"], r["dqk"], r["dv"]
    g = torch.Generator(device="cuda").manual_seed(0)
    s = 3 ** 0.5 * dqk ** 0.25

    def rnd(d, scale):
        return ((torch.rand(B, T, H, d, device="cuda", generator=g) * 2 - 1) * scale).to(BF)

    q, k, v, do = rnd(dqk, s), rnd(dqk, s), rnd(dv, 1.0), rnd(dv, 1.0)
    results = {}
    pads = [False] + ([True] if dv != dqk else [])
    for pad in pads:
        vv, dd = v, do
        if pad:
            vv = F.pad(v, (0, dqk - dv))
            dd = F.pad(do, (0, dqk - dv))
        qt = q.transpose(1, 2).detach().requires_grad_(True)
        kt = k.transpose(1, 2).detach().requires_grad_(True)
        vt = vv.transpose(1, 2).detach().requires_grad_(True)
        dot = dd.transpose(1, 2)
        for name, ctx in sdpa_variants():
            if pad and name != "flash":
                continue
            label = name + (" (V padded)" if pad else "")

            def fwd():
                return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)

            def fwdbwd():
                o = F.scaled_dot_product_attention(qt, kt, vt, is_causal=True)
                torch.autograd.grad(o, (qt, kt, vt), dot)

            try:
                if ctx is None:
                    f = median_ms(fwd, runs, warmup)
                    fb = median_ms(fwdbwd, runs, warmup)
                else:
                    with ctx():
                        f = median_ms(fwd, runs, warmup)
                        fb = median_ms(fwdbwd, runs, warmup)
                results[label] = {"fwd_ms": f, "fwdbwd_ms": fb}
            except Exception as e:  # a backend that does not take this shape
                results[label] = {"error": f"{type(e).__name__}: {str(e).splitlines()[0][:90]}"}
            torch.cuda.empty_cache()
    return results


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(os.path.dirname(here))
    build = os.environ.get("K3RT_BUILD", os.path.join(root, "build-cuda"))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bench", default=os.path.join(build, "bin", "bench_mla_attention"))
    ap.add_argument("--runs", type=int, default=20)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--shape", action="append", default=[])
    ap.add_argument("--json", default=None, help="also write every row here")
    a = ap.parse_args()

    cmd = [a.bench, "--runs", str(a.runs), "--warmup", str(a.warmup)]
    for s in a.shape:
        cmd += ["--shape", s]
    rows = run_driver(cmd)

    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, "
          f"cuDNN {torch.backends.cudnn.version()}")
    shape_of = lambda r: (r["B"], r["T"], r["H"], r["dqk"], r["dv"])
    timed = {}
    for r in rows:  # the driver prints one row per shape and kernel: time torch once per shape
        if shape_of(r) not in timed:
            timed[shape_of(r)] = time_torch(r, a.runs, a.warmup)
        r["torch"] = timed[shape_of(r)]

    def tf(flops, ms):
        return flops / (ms * 1e-3) / 1e12

    print("\nTFLOP/s (causal; fwd 2BHT^2(dqk+dv)/2, bwd 2.5x fwd); ratio = k3rt / fastest torch")
    head = f"{'shape B,T,H,dqk/dv':<24} {'who':<38} {'fwd ms':>8} {'f+b ms':>8} " \
           f"{'fwd TF':>7} {'f+b TF':>7} {'ratio':>6}"
    print(head)
    print("-" * len(head))
    for i, r in enumerate(rows):
        shape = f"{r['B']},{r['T']},{r['H']},{r['dqk']}/{r['dv']}"
        last_of_shape = i + 1 == len(rows) or shape_of(rows[i + 1]) != shape_of(r)
        first_of_shape = i == 0 or shape_of(rows[i - 1]) != shape_of(r)
        ff, fb = r["fwd_flops"], r["fwd_flops"] + r["bwd_flops"]
        best = None
        for label, t in r["torch"].items():
            if "fwdbwd_ms" in t and (best is None or t["fwdbwd_ms"] < best[1]["fwdbwd_ms"]):
                best = (label, t)
        r["best_torch"] = best[0] if best else None
        # The default (non-deterministic) backward, then the deterministic one.
        for key, label, name, bwd in (("fwdbwd_ms", "", shape if first_of_shape else "",
                                       "bwd_path"),
                                      ("fwdbwd_det_ms", " determ.", "", "bwd_det_path")):
            # auto's deterministic run is k3rt's own (cuDNN's backward is not deterministic)
            if key not in r or (label and r.get("kernel") == "auto"):
                continue
            k_tf = tf(fb, r[key])
            ratio = k_tf / tf(fb, best[1]["fwdbwd_ms"]) if best else float("nan")
            r["ratio_vs_best_torch" + ("_det" if label else "")] = ratio
            paths = r["path"] if r.get(bwd, r["path"]) == r["path"] else \
                f"{r['path']}/{r[bwd]}"
            who = f"k3rt[{r.get('kernel', '')}] {paths}{label}"
            print(f"{name:<24} {who:<38} {r['fwd_ms']:8.3f} {r[key]:8.3f} "
                  f"{tf(ff, r['fwd_ms']):7.1f} {k_tf:7.1f} {ratio:6.2f}")
        for label, t in (r["torch"].items() if last_of_shape else ()):
            if "error" in t:
                print(f"{'':<24} {'torch ' + label:<38} {t['error']}")
            else:
                print(f"{'':<24} {'torch ' + label:<38} {t['fwd_ms']:8.3f} {t['fwdbwd_ms']:8.3f} "
                      f"{tf(ff, t['fwd_ms']):7.1f} {tf(fb, t['fwdbwd_ms']):7.1f}")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
