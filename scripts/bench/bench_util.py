"""What the PyTorch sides of the GPU benchmarks share: reading the C drivers' key=value lines
and the timing loop (CUDA events around each run after warm-up; the median in milliseconds)."""
import torch


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
