#!/usr/bin/env python3
"""Compares the training records of two runs' metrics.jsonl (dist_mpi.sh, dist_launch.sh).

  dist_compare.py A/metrics.jsonl B/metrics.jsonl bitwise
      every step's loss, aux_loss and grad_norm equal to the last bit
  dist_compare.py A/metrics.jsonl B/metrics.jsonl rms TOL
      relative rms difference of the loss and of the grad_norm columns <= TOL each
  dist_compare.py A/model.safetensors B/model.safetensors weights TOL
      relative rms difference of all f32/f64 tensors together <= TOL
  dist_compare.py A/step_N B/step_N state
      the state of two checkpoints (state.safetensors plus the ZeRO-1 shards
      optimizer.rank*.safetensors, whichever each has) holds the same tensors, byte for byte
Prints the numbers it compared; exits 1 on a mismatch."""
import array
import glob
import json
import os
import math
import struct
import sys


def tensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    out = {}
    for name, t in head.items():
        if name == "__metadata__" or t["dtype"] not in ("F32", "F64"):
            continue
        lo, hi = t["data_offsets"]
        out[name] = array.array("f" if t["dtype"] == "F32" else "d", data[8 + n + lo:8 + n + hi])
    return out


def raw(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    head = json.loads(data[8:8 + n])
    return {name: (t["dtype"], t["shape"], data[8 + n + t["data_offsets"][0]:8 + n + t["data_offsets"][1]])
            for name, t in head.items() if name != "__metadata__"}


def state(folder):
    out = raw(os.path.join(folder, "state.safetensors"))
    shards = sorted(glob.glob(os.path.join(folder, "optimizer.rank*.safetensors")))
    for f in shards:
        for name, t in raw(f).items():
            if name in out and out[name] != t:
                sys.exit(f"{f}: {name} differs from another file of the checkpoint")
            out[name] = t
    return out, len(shards)


if sys.argv[3] == "state":
    (a, na), (b, nb) = state(sys.argv[1]), state(sys.argv[2])
    if sorted(a) != sorted(b) or not a:
        sys.exit(f"the states hold different tensors: {sorted(set(a) ^ set(b))[:5]}")
    bad = [k for k in a if a[k] != b[k]]
    if bad:
        sys.exit(f"state differs: {len(bad)} of {len(a)} tensors, first {bad[0]}")
    print(f"state: {len(a)} tensors byte for byte equal ({na} vs {nb} optimizer shard files)")
    sys.exit(0)

if sys.argv[3] == "weights":
    a, b, tol = tensors(sys.argv[1]), tensors(sys.argv[2]), float(sys.argv[4])
    if sorted(a) != sorted(b) or not a:
        sys.exit("the files hold different tensors")
    num = sum((x - y) ** 2 for k in a for x, y in zip(a[k], b[k]))
    den = sum(x * x for k in a for x in a[k])
    rel = math.sqrt(num / den)
    print(f"weights: relative rms difference {rel:.3e} over {len(a)} tensors (tolerance {tol:g})")
    sys.exit(0 if rel <= tol else f"weights differ: {rel:.3e} > {tol:g}")


def steps(path):
    out = {}
    for line in open(path):
        r = json.loads(line)
        if "loss" in r and "tokens" in r:
            out[r["step"]] = r
    return out


a, b, mode = steps(sys.argv[1]), steps(sys.argv[2]), sys.argv[3]
if sorted(a) != sorted(b) or not a:
    sys.exit(f"steps differ: {sorted(a)} vs {sorted(b)}")
if mode == "bitwise":
    for s in sorted(a):
        for k in ("loss", "aux_loss", "grad_norm", "val_loss"):
            if a[s].get(k) != b[s].get(k):
                sys.exit(f"step {s}: {k} {a[s].get(k)!r} != {b[s].get(k)!r}")
    print(f"bitwise equal over {len(a)} steps (loss, aux_loss, grad_norm, val_loss)")
else:
    tol = float(sys.argv[4])
    worst = 0.0
    for k in ("loss", "grad_norm"):
        num = sum((a[s][k] - b[s][k]) ** 2 for s in a)
        den = sum(a[s][k] ** 2 for s in a)
        rel = math.sqrt(num / den)
        print(f"{k}: relative rms difference {rel:.3e} over {len(a)} steps (tolerance {tol:g})")
        worst = max(worst, rel)
    if worst > tol:
        sys.exit(f"relative rms difference {worst:.3e} > {tol:g}")
