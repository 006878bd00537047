"""What the PyTorch peers of k3rt's models share (torch_k3.py, torch_dense.py).

- k3rt's files: a checkpoint's manifest.json (the validated recipe document, every plugin's
  options filled in), model.safetensors and state.safetensors, read with a small reader of the
  safetensors format (8-byte little-endian header length, JSON header, raw data), so no
  package beyond torch is needed;
- the model: embedding, per layer a pre-norm token mixer and a pre-norm FFN, a residual scheme,
  the final norm, the LM head and the mean token cross-entropy, with the same parameter names
  as k3rt (`layers.{i}.mixer.q_proj.weight`, ...); the plugins' math is the CPU references'
  (plugins/*/); the pieces of the dense model are here (NoPE gated MLA, dense GLU, the
  standard residual), torch_k3.py adds KDA, LatentMoE and Block AttnRes;
- or a Hugging Face folder `k3rt export` wrote (--hf DIR, torch_hub.py: the Hub names mapped
  back by plugins/hf_names.json, the model document from config.json);
- two paths: `pure` (explicit attention, recurrences and loops in torch ops; runs on the CPU
  with Debian's torch 1.13, in f64 or f32) and `fast` (SDPA and the GPU kernels each peer
  names; bf16 autocast over fp32 master weights);
- the drivers: `check` (k3rt's loss and gradients from `k3rt eval --grads` against this
  model's autograd on the same weights and batch) and `bench` (whole training steps, CUDA
  events after warm-up, the median).
"""
import argparse
import contextlib
import glob
import json
import math
import os
import struct
import sys

import torch
import torch.nn.functional as F

_DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16,
           "I32": torch.int32, "I64": torch.int64, "U8": torch.uint8, "F16": torch.float16}


# ---- k3rt's files ----------------------------------------------------------------------------

def read_safetensors(path, want=None):
    """{name: tensor} of a safetensors file (CPU tensors); want(name) -> bool reads only those
    (the balancers' biases out of a state file that also holds the optimizer's)."""
    out = {}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
        base = 8 + n
        for name, e in sorted(header.items(), key=lambda kv: kv[1].get("data_offsets", [0])[0]
                              if kv[0] != "__metadata__" else -1):
            if name == "__metadata__" or (want and not want(name)):
                continue
            if e["dtype"] not in _DTYPES:
                sys.exit(f"{path}: tensor {name} has dtype {e['dtype']}, which this reader "
                         "lacks")
            a, b = e["data_offsets"]
            f.seek(base + a)
            buf = bytearray(f.read(b - a))
            t = torch.frombuffer(buf, dtype=_DTYPES[e["dtype"]]) if b > a else \
                torch.empty(0, dtype=_DTYPES[e["dtype"]])
            out[name] = t.reshape(e["shape"])
    return out


def find_checkpoint(path):
    """A checkpoint directory: path itself, or the newest complete one under path (a run's
    checkpoints folder or the run folder)."""
    if os.path.exists(os.path.join(path, "manifest.json")):
        return path
    for root in (path, os.path.join(path, "checkpoints")):
        done = sorted(d for d in glob.glob(os.path.join(root, "step_*"))
                      if os.path.exists(os.path.join(d, "DONE")) and not d.endswith(".tmp"))
        if done:
            return done[-1]
    sys.exit(f"{path}: no checkpoint (a folder with manifest.json, or step_*/DONE under it)")


def open_model(args):
    """The weights to check or time: --hf DIR (a folder `k3rt export` wrote, torch_hub.py) or
    --ckpt (a k3rt checkpoint)."""
    if args.hf:
        from torch_hub import HubFolder
        return HubFolder(args.hf, read_safetensors, args.names)
    return Checkpoint(args.ckpt)


class Checkpoint:
    """A k3rt checkpoint: manifest, the validated recipe document, weights and plugin state."""

    def __init__(self, path):
        self.dir = find_checkpoint(path)
        with open(os.path.join(self.dir, "manifest.json")) as f:
            self.manifest = json.load(f)
        self.doc = self.manifest["config"]
        self.model = json.loads(json.dumps(self.doc["model"]))
        if self.manifest.get("balancer"):  # a mid-run balancer change is the one in effect
            self.model["balancer"] = self.manifest["balancer"]
        self.weights = read_safetensors(os.path.join(self.dir, "model.safetensors"))
        sp = os.path.join(self.dir, "state.safetensors")
        self.state = read_safetensors(sp, lambda n: ".balancer." in n) \
            if os.path.exists(sp) else {}


# ---- shared math -----------------------------------------------------------------------------

def rmsnorm(x, w, eps):
    """x / sqrt(mean(x^2) + eps) * w over the last axis (core/ops: cpu_rmsnorm_fwd)."""
    r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps) if x.dtype == torch.bfloat16 \
        else torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return (x * r.to(x.dtype)) * w.to(x.dtype)


def glu(g, u, act, beta1, beta2):
    """SiTU: beta1 tanh(g/beta1) sigmoid(g) * beta2 tanh(u/beta2); SwiGLU: silu(g) u."""
    if act == "swiglu":
        return F.silu(g) * u
    return (beta1 * torch.tanh(g / beta1) * torch.sigmoid(g)) * (beta2 * torch.tanh(u / beta2))


class _RoundBF16(torch.autograd.Function):
    """x rounded to bf16 and back, its gradient too: a bf16 tensor's value in f32 or f64 math."""

    @staticmethod
    def forward(ctx, x):
        return x.to(torch.bfloat16).to(x.dtype)

    @staticmethod
    def backward(ctx, g):
        return g.to(torch.bfloat16).to(g.dtype)


# The bf16 floor (check's --bf16-floor): linear() rounds its operand and its result, and the
# gradients through them, to bf16, as every bf16 mode's GEMMs do (bf16 in and out, wider
# accumulation); the weights are rounded when loaded. Everything else stays exact.
BF16_GEMMS = False


def linear(x, w):
    """x W^T with W stored [out, in] (k3rt's and nn.Linear's layout); under autocast the cast
    of W is autocast's (cached for the step)."""
    if x.dtype != w.dtype and not torch.is_autocast_enabled():
        w = w.to(x.dtype)
    if BF16_GEMMS:
        return _RoundBF16.apply(F.linear(_RoundBF16.apply(x), w))
    return F.linear(x, w)


def causal_attention(q, k, v, scale, fast):
    """Causal softmax attention. q, k [B, T, H, Dqk], v [B, T, H, Dv] -> [B, T, H, Dv]."""
    if fast:
        o = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2), is_causal=True, scale=scale)
        return o.transpose(1, 2)
    s = torch.einsum("bthd,bshd->bhts", q, k) * scale
    T = q.shape[1]
    mask = torch.ones(T, T, dtype=torch.bool, device=q.device).triu(1)
    p = torch.softmax(s.masked_fill(mask, float("-inf")), dim=-1)
    return torch.einsum("bhts,bshd->bthd", p, v)


# ---- modules (options at construction, parameters by declared name in forward) ---------------

class Module:
    """One plugin's math for its options `cfg`; forward(x, p) takes the instance's parameters
    p by declared name ({"q_proj.weight": tensor, ...}; "balancer.bias" for a routed FFN),
    so instances of the same options share one compiled function."""

    report = True  # keep what the check reports (off in the benchmark: it may sync)

    def __init__(self, cfg, d, fast):
        self.cfg, self.d, self.fast = cfg, d, fast


class MLA(Module):
    """NoPE MLA (plugins/attention/mla/cpu.inc.c): queries from x (or a normed low-rank q),
    keys from the normed latent plus one shared rope-less key for every head, sigmoid output
    gate, scale 1/sqrt(nope + shared) unless softmax_scale."""

    def forward(self, x, p):
        c = self.cfg
        B, T, _ = x.shape
        H, dn, dr, dv, dc = c["heads"], c["qk_nope_dim"], c["qk_shared_dim"], c["v_dim"], \
            c["kv_rank"]
        qin = x
        if c["q_rank"]:
            qin = rmsnorm(linear(x, p["q_a_proj.weight"]), p["q_a_layernorm.weight"],
                          c["norm_eps"])
        q = linear(qin, p["q_nope_proj.weight"]).view(B, T, H, dn)
        ckv = linear(x, p["kv_a_proj_with_mqa.weight"])
        chat = rmsnorm(ckv[..., :dc], p["kv_a_layernorm.weight"], c["norm_eps"])
        k = linear(chat, p["k_b_proj.weight"]).view(B, T, H, dn)
        v = linear(chat, p["v_b_proj.weight"]).view(B, T, H, dv)
        if dr:
            qr = linear(qin, p["q_shared_proj.weight"]).view(B, T, H, dr)
            kr = ckv[..., dc:].unsqueeze(2).expand(B, T, H, dr)
            q, k = torch.cat([q, qr], -1), torch.cat([k, kr], -1)
        scale = c["softmax_scale"] or 1.0 / math.sqrt(dn + dr)
        o = causal_attention(q, k, v, scale, self.fast).reshape(B, T, H * dv)
        if c["output_gate"]:
            o = o * torch.sigmoid(linear(x, p["o_gate_proj.weight"]))
        return linear(o, p["o_proj.weight"])


class DenseGLU(Module):
    """dense_glu (plugins/moe/dense_glu/ffn.c): glu(x Wg^T, x Wu^T) Wd^T."""

    def forward(self, x, p):
        c = self.cfg
        a = glu(linear(x, p["gate_proj.weight"]), linear(x, p["up_proj.weight"]), c["act"],
                c["beta1"], c["beta2"])
        return linear(a, p["down_proj.weight"])


class StandardResidual:
    """h_0 = embedding; sublayer s reads h_s; h_{s+1} = h_s + y_s; out = h_S."""

    def __init__(self, cfg, params, n_layers):
        pass

    def begin(self, h0):
        self.h = h0

    def mix(self, s):
        return self.h

    def push(self, s, y):
        self.h = self.h + y

    def finish(self):
        return self.h


PLUGINS = {"mla": MLA, "dense_glu": DenseGLU}
RESIDUALS = {"standard": StandardResidual}


# ---- the model -------------------------------------------------------------------------------

class Sublayer:
    """Sublayer `slot` (mixer or ffn) of layer i: its module, its parameters by declared name
    (and the balancer's bias from the plugin state), its pre-norm gain, what runs it."""

    def __init__(self, mod, i, slot, weights, state):
        prefix = f"layers.{i}.{slot}."
        self.mod, self.layer, self.norm = mod, i, f"layers.{i}.{slot}_norm.weight"
        self.p = {n[len(prefix):]: t for n, t in weights.items() if n.startswith(prefix)}
        bias = state.get(f"layers.{i}.balancer.bias")
        if slot == "ffn" and bias is not None:
            self.p["balancer.bias"] = bias
        self.run = mod.forward


class Model:
    """k3rt's model (core/model/model_fwd.c) over the weights of a checkpoint, by name."""

    def __init__(self, ck, weights, fast=False, state=None):
        m = ck.model
        self.ck, self.w, self.fast = ck, weights, fast
        self.L, self.d, self.eps = m["layers"], m["d_model"], m["norm_eps"]
        self.subs = []
        for i in range(self.L):
            mix = m["mixers"][m["pattern"][i]]
            ffn = m["dense_ffn"] if i < m.get("dense_layers", 0) else m["ffn"]
            for slot, spec in (("mixer", mix), ("ffn", ffn)):
                cls = PLUGINS.get(spec["plugin"])
                if cls is None:
                    sys.exit(f"layers.{i}.{slot}: plugin '{spec['plugin']}' has no PyTorch peer "
                             f"here (known: {', '.join(sorted(PLUGINS))})")
                self.subs.append(Sublayer(cls(spec["config"], self.d, fast), i, slot, weights,
                                          state or {}))
        res = m["residual"]
        if res["plugin"] not in RESIDUALS:
            sys.exit(f"residual: plugin '{res['plugin']}' has no PyTorch peer here")
        self.res_cls, self.res_cfg = RESIDUALS[res["plugin"]], res["config"]

    @classmethod
    def create(cls, ck, weights, fast, state, forced):
        """What main() builds: forced (k3rt's expert choices) matters only to routed FFNs."""
        return cls(ck, weights, fast, state)

    def forward(self, tokens, targets):
        """Mean token cross-entropy over targets >= 0 (k3rt: the loss of model_train_step)."""
        w = self.w
        h0 = F.embedding(tokens, w["embed.weight"])
        if self.fast:
            h0 = h0.to(torch.bfloat16)
        res = self.res_cls(self.res_cfg, lambda n: w[n], self.L)
        res.begin(h0)
        for s, sub in enumerate(self.subs):
            res.push(s, sub.run(rmsnorm(res.mix(s), w[sub.norm], self.eps), sub.p))
        hn = rmsnorm(res.finish(), w["norm.weight"], self.eps)
        logits = linear(hn, w["head.weight"]).float() if self.fast else \
            linear(hn, w["head.weight"])
        n = tokens.numel()
        return F.cross_entropy(logits.reshape(n, -1), targets.reshape(n).long(),
                               ignore_index=-1, reduction="sum") / n


# ---- drivers ---------------------------------------------------------------------------------

def rel_rms(a, b):
    """rms(a - b) / rms(b) (0 when both are 0)."""
    a, b = a.double(), b.double()
    den = b.pow(2).mean().sqrt().item()
    num = (a - b).pow(2).mean().sqrt().item()
    return num / den if den > 0 else (0.0 if num == 0 else math.inf)


def autograd_grads(args, make_model, ck, ref, bf16_gemms=False):
    """This model's loss and gradients on the checkpoint's weights and k3rt's batch: the pure
    path on the CPU in --dtype (with bf16_gemms, the bf16 floor's rounding), or --path fast on
    the GPU (bf16 autocast over fp32 weights). Returns (loss, weights, model)."""
    global BF16_GEMMS
    fast = args.path == "fast"
    dev = torch.device("cuda" if fast else "cpu")
    dt = torch.float32 if fast else {"f64": torch.float64, "f32": torch.float32}[args.dtype]
    weights = {}
    for k, v in ck.weights.items():
        v = v.detach().to(dev, dt, copy=True)
        weights[k] = (v.to(torch.bfloat16).to(dt) if bf16_gemms else v).requires_grad_(True)
    ck_routing = {k: v.to(dev) for k, v in ref.items() if k.startswith("routing.")}
    state = {k: v.to(dev) for k, v in ck.state.items()}
    model = make_model(ck, weights, fast, state, ck_routing if args.forced_routing else None)
    BF16_GEMMS = bf16_gemms
    try:
        with torch.autocast("cuda", dtype=torch.bfloat16) if fast else contextlib.nullcontext():
            loss = model.forward(ref["tokens"].long().to(dev), ref["targets"].long().to(dev))
        loss.backward()
    finally:
        BF16_GEMMS = False
    return loss, weights, model


def grad_of(w):
    return (w.grad if w.grad is not None else torch.zeros_like(w)).cpu()


def check(args, make_model):
    """k3rt's loss and gradients (k3rt eval --grads) against autograd on the same weights:
    the pure path on the CPU in --dtype, or --path fast on the GPU (bf16 autocast over fp32
    weights: give it bf16-sized tolerances). With --bf16-floor F, a parameter whose bf16
    floor (this model's error against itself with the weights and every projection's operand
    and result rounded to bf16) is above --grad-rtol / F may be F times its floor off."""
    ck = open_model(args)
    ref = read_safetensors(args.check)
    loss, weights, model = autograd_grads(args, make_model, ck, ref)
    floor = {}
    if args.bf16_floor:
        _, w16, _ = autograd_grads(args, make_model, ck, ref, bf16_gemms=True)
        floor = {n: rel_rms(grad_of(w16[n]), grad_of(w)) for n, w in weights.items()}
    k_loss = ref["loss"][0].item()
    rel = abs(loss.item() - k_loss) / abs(k_loss)
    print(f"loss: torch {loss.item():.12g}  k3rt {k_loss:.12g}  relative difference {rel:.3e}")
    worst, over, missing = (0.0, ""), [], []
    for name, w in weights.items():
        g = ref.get("grad." + name)
        if g is None:
            missing.append(name)
            continue
        r = rel_rms(grad_of(w), g)
        bound = max(args.grad_rtol, args.bf16_floor * floor.get(name, 0.0))
        if args.verbose:
            print(f"  {name}: {r:.3e}" + (f"  (bf16 floor {floor[name]:.3e}, bound {bound:.3e})"
                                          if floor else ""))
        worst = max(worst, (r, name))
        if r > bound:
            over.append(name)
    extra = [k[5:] for k in ref if k.startswith("grad.") and k[5:] not in weights]
    print(f"gradients: {len(weights) - len(missing)} compared, worst relative rms "
          f"{worst[0]:.3e} ({worst[1]})" + (f"; {len(over)} over their bound" if over else ""))
    if floor:
        v = sorted(floor.values())
        print(f"bf16 floor: median {v[len(v) // 2]:.3e}, worst {v[-1]:.3e}; "
              f"{sum(x > args.grad_rtol for x in v)} of {len(v)} above {args.grad_rtol:g} "
              f"without any other error")
    report_routing = getattr(model, "routing_report", None)
    routing_ok = report_routing({k: v for k, v in ref.items() if k.startswith("routing.")}) \
        if report_routing else True
    ok = rel <= args.loss_rtol and not over and not missing and not extra and routing_ok
    if missing or extra:
        print(f"names: missing in k3rt's gradients {missing[:5]}, unknown here {extra[:5]}")
    tol = f"loss {args.loss_rtol:g}, gradients {args.grad_rtol:g}" + \
        (f" or {args.bf16_floor:g}x the bf16 floor" if floor else "")
    print("PASS" if ok else f"FAIL (tolerances: {tol}; over: {over[:5]})")
    return 0 if ok else 1


def median_wall_ms(fn, runs, warmup):
    """The CPU's stand-in for bench_util.median_ms: host clock, median."""
    import time
    for _ in range(warmup):
        fn()
    t = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        t.append((time.perf_counter() - t0) * 1e3)
    t.sort()
    n = len(t)
    return t[n // 2] if n % 2 else 0.5 * (t[n // 2 - 1] + t[n // 2])


def bench(args, make_model, compile_hint):
    """Median training step (forward, backward, optimizer) after warm-up; prints one JSON
    line. On the GPU: the fast path in bf16 autocast over fp32 weights, CUDA events. With
    --bench-device cpu: the pure path in f32 on the host clock (a smoke test of the loop)."""
    gpu = args.bench_device == "cuda"
    if gpu and not torch.cuda.is_available():
        sys.exit("bench: needs a CUDA device")
    if gpu:
        torch.backends.cuda.matmul.allow_tf32 = True
    ck = open_model(args)
    dev = torch.device(args.bench_device)
    weights = {k: v.to(dev, torch.float32).requires_grad_(True) for k, v in ck.weights.items()}
    state = {k: v.to(dev) for k, v in ck.state.items()}
    model = make_model(ck, weights, gpu, state, None)
    for sub in model.subs:
        sub.mod.report = False
    if args.compile:
        compile_hint(model)
    plan = ck.doc["plan"]
    B, T, V = plan["micro_batch"], plan["seq_len"], ck.model["vocab"]
    g = torch.Generator(device="cpu").manual_seed(1)
    tokens = torch.randint(0, V, (B, T + 1), generator=g).to(dev)
    opt = make_optimizer(ck.doc["optimizer"], weights, fused=gpu)

    def step():
        if gpu:
            with torch.autocast("cuda", dtype=torch.bfloat16):
                loss = model.forward(tokens[:, :-1], tokens[:, 1:])
        else:
            loss = model.forward(tokens[:, :-1], tokens[:, 1:])
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    if gpu:
        from bench_util import median_ms
        ms = median_ms(step, args.steps, args.warmup)
    else:
        ms = median_wall_ms(step, args.steps, args.warmup)
    out = {"peer": args.peer_name, "compiled": bool(args.compile), "device": args.bench_device,
           "B": B, "T": T, "step_ms": ms, "tokens_per_s": B * T / (ms / 1e3)}
    print(json.dumps(out), flush=True)
    return 0


def make_optimizer(spec, weights, fused):
    """The recipe's optimizer family in torch: AdamW (fused) for adamw; for per_head_muon,
    torch.optim.Muon on the 2-D matrices where this torch has it (whole matrices, not per
    head) and AdamW on the rest."""
    cfg, lr = spec["config"], spec.get("lr", 1e-3)
    params = list(weights.values())
    if spec["plugin"] == "per_head_muon" and hasattr(torch.optim, "Muon"):
        mats = [w for n, w in weights.items() if w.ndim == 2 and "embed" not in n
                and not n.startswith("head.")]
        ids = {id(w) for w in mats}
        rest = [w for w in params if id(w) not in ids]
        muon = torch.optim.Muon(mats, lr=lr, weight_decay=cfg.get("weight_decay", 0.0))
        adam = torch.optim.AdamW(rest, lr=lr, fused=fused)

        class Both:
            def step(self):
                muon.step(), adam.step()

            def zero_grad(self, set_to_none=True):
                muon.zero_grad(set_to_none=set_to_none), adam.zero_grad(set_to_none=set_to_none)
        return Both()
    return torch.optim.AdamW(params, lr=lr, weight_decay=cfg.get("weight_decay", 0.0),
                             **({"fused": True} if fused else {}))


def compile_blocks(model):
    """torch.compile per sublayer module (a mixer, an FFN): one compiled function per plugin
    and options, shared by every layer that has them (the parameters are its inputs)."""
    compiled = {}
    for sub in model.subs:
        key = (type(sub.mod).__name__, json.dumps(sub.mod.cfg, sort_keys=True))
        if key not in compiled:
            compiled[key] = torch.compile(sub.mod.forward)
        sub.run = compiled[key]


def main(make_model, compile_hint, peer_name, description):
    ap = argparse.ArgumentParser(description=description)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--ckpt",
                     help="a k3rt checkpoint directory, or a run (folder) holding checkpoints")
    src.add_argument("--hf", metavar="DIR",
                     help="a Hugging Face folder `k3rt export` wrote (Hub names mapped back "
                          "by plugins/hf_names.json)")
    ap.add_argument("--names", metavar="FILE", help="--hf: the table (default: the repo's)")
    ap.add_argument("--check", metavar="GRADS",
                    help="compare with `k3rt eval CKPT --grads GRADS`'s loss and gradients")
    ap.add_argument("--dtype", choices=["f64", "f32"], default="f64", help="check precision")
    ap.add_argument("--path", choices=["pure", "fast"], default="pure",
                    help="check: pure (CPU, --dtype) or fast (GPU kernels, bf16 autocast)")
    ap.add_argument("--loss-rtol", type=float, default=1e-5)
    ap.add_argument("--grad-rtol", type=float, default=1e-4)
    ap.add_argument("--bf16-floor", type=float, default=0.0, metavar="F",
                    help="check a bf16 run: a gradient may also be F times its bf16 floor off "
                         "(pure path: the weights and every projection's operand and result "
                         "rounded to bf16, the rest exact)")
    ap.add_argument("--forced-routing", action="store_true",
                    help="route every token to the experts k3rt chose (near-ties)")
    ap.add_argument("--verbose", action="store_true", help="every parameter's residual")
    ap.add_argument("--bench", action="store_true", help="time training steps on the GPU")
    ap.add_argument("--compile", action="store_true", help="bench: torch.compile per block")
    ap.add_argument("--steps", type=int, default=10, help="bench: timed steps")
    ap.add_argument("--warmup", type=int, default=3, help="bench: untimed steps first")
    ap.add_argument("--bench-device", choices=["cuda", "cpu"], default="cuda",
                    help="bench: cpu runs the pure path in f32 (a smoke test of the loop)")
    args = ap.parse_args()
    args.peer_name = peer_name
    torch.manual_seed(0)
    if args.bf16_floor and args.path == "fast":
        ap.error("--bf16-floor measures the pure path's floor: drop --path fast")
    if args.check:
        return check(args, make_model)
    if args.bench:
        return bench(args, make_model, compile_hint)
    ap.error("give --check GRADS or --bench")
