"""What the PyTorch sides of the GPU benchmarks share: running a C driver and reading its
key=value lines, and the timing loop (CUDA events around each run after warm-up; the median in
milliseconds)."""
import ctypes
import glob
import os
import subprocess
import sys

import torch


def run_driver(cmd):
    """Runs a C driver (echoing its output) with k3rt's library path, which only it gets
    (PyTorch keeps the image's libraries); returns the dicts of its "op=" lines."""
    print("running", " ".join(cmd), flush=True)
    env = dict(os.environ)
    if os.environ.get("K3RT_BENCH_LD_LIBRARY_PATH"):
        env["LD_LIBRARY_PATH"] = os.environ["K3RT_BENCH_LD_LIBRARY_PATH"]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    sys.stdout.write(proc.stdout)
    if proc.returncode != 0:
        sys.stderr.write(proc.stderr)
        sys.exit(f"{os.path.basename(cmd[0])} failed with status {proc.returncode}")
    return [parse_line(l) for l in proc.stdout.splitlines() if l.startswith("op=")]


def parse_line(line):
    """{key: value} from "op=x n=3 ms=0.5": integers, then floats, else strings unquoted."""
    out = {}
    for part in line.split():
        if "=" in part:
            k, v = part.split("=", 1)
            for conv in (int, float):
                try:
                    out[k] = conv(v)
                    break
                except ValueError:
                    pass
            else:
                out[k] = v.strip('"')
    return out


def median_ms(fn, runs, warmup):
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(runs)]
    for i in range(runs):
        starts[i].record()
        fn()
        ends[i].record()
    torch.cuda.synchronize()
    t = sorted(s.elapsed_time(e) for s, e in zip(starts, ends))
    n = len(t)
    return t[n // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2])


def load_k3rt_library(dirs, name):
    """ctypes.CDLL of the benchmark export `name` (e.g. libk3rt_kda_cuda_bench.so) from the
    first of dirs holding it, after the build host's libraries the image lacks and libk3rt
    itself, loaded by path and globally so PyTorch keeps its own libraries."""
    def find(pattern):
        for d in dirs:
            hits = sorted(glob.glob(os.path.join(d, pattern)))
            if hits:
                return hits[0]
        return None
    for dep in ("libquadmath.so.0", "libgfortran.so.5", "libgomp.so.1", "libopenblas.so.0",
                "liblua5.4.so.0", "libjansson.so.4", "libk3rt.so.2", "libk3rt.so.1"):
        p = find(dep)
        if p:
            ctypes.CDLL(p, mode=ctypes.RTLD_GLOBAL)
    p = find(name)
    if not p:
        sys.exit(f"{name} not found in {dirs}")
    return ctypes.CDLL(p)
