#!/usr/bin/env python3
"""The PyTorch peer of k3rt's K3-style models: whatever model a k3rt checkpoint holds (its
manifest's recipe document says which plugins with which options), built from its
model.safetensors by name. It adds to torch_common.py's dense pieces (NoPE gated MLA, dense
GLU, standard residual):

- KDA (plugins/attention/kda/cpu_layer*.inc.c): q, k, v projections, causal depthwise short
  conv, SiLU, per-head L2 norm of q and k (eps 1e-6 under the root), the forget gate
  g = lower_bound * sigmoid(e^A_log (z + dt_bias)) (or -e^A_log softplus(z + dt_bias)),
  beta = sigmoid(x Wb^T), the delta rule S <- Diag(e^g) S; S += k beta (v - S^T k)^T;
  o = S^T (q / sqrt(dk)) (value head hv reads query/key head hv / (HV / H)), per-head RMSNorm
  with one gain, sigmoid output gate, output projection. Pure path: the recurrence token by
  token in torch ops; fast path: fla's chunk_kda with the L2 norm, the gate and beta's
  sigmoid in the kernel (as fla's own KDA layer runs it).
- Stable LatentMoE (plugins/moe/latent_moe/moe.c): sigmoid router scores, top-k of the scores
  plus the balancer's bias (state.safetensors: layers.{i}.balancer.bias; ties keep the lower
  expert id), weights renormalised over the chosen scores, the routed experts in the latent
  (down-projection once per token), combine, latent RMSNorm, up-projection, shared experts at
  full width. Pure path: a loop over experts; fast path: torch._grouped_mm over the tokens
  sorted by expert.
- Block AttnRes (plugins/residual/block_attnres/attnres.c, cpu.inc.c): blocks of
  2 * block_layers sublayers; sublayer 0 reads the embedding; sublayer s >= 1 mixes the closed
  blocks' sums and the running partial with softmax_i(rho_i (gamma * w) . v_i); the output
  mixes them once more. Fast path: fla's fused_attnres.

  torch_k3.py --ckpt CKPT --check GRADS [--dtype f64|f32] [--forced-routing]
      k3rt's loss and gradients (`k3rt eval CKPT --grads GRADS`) against autograd here
  torch_k3.py --ckpt CKPT --bench [--compile] [--steps N] [--warmup W]
      a training step on the GPU (fast path, bf16 autocast, fp32 weights), median ms
"""
import math
import os
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_common as tc  # noqa: E402
from torch_common import glu, linear, rmsnorm  # noqa: E402


class KDA(tc.Module):
    def __init__(self, cfg, d, fast):
        super().__init__(cfg, d, fast)
        if fast:  # imported here, not inside the forward that torch.compile traces
            from fla.ops.kda import chunk_kda
            self.chunk_kda = chunk_kda

    def _conv(self, u, w):
        """Causal depthwise conv: z[t, c] = sum_j w[c, j] u[t - W + 1 + j, c]."""
        W = w.shape[1]
        z = F.conv1d(F.pad(u.transpose(1, 2), (W - 1, 0)), w.to(u.dtype).unsqueeze(1),
                     groups=u.shape[-1])
        return z.transpose(1, 2).contiguous()

    def _l2(self, x, heads):
        B, T, D = x.shape
        x = F.silu(x).view(B, T, heads, D // heads)
        return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6)

    def forward(self, x, p):
        c = self.cfg
        B, T, _ = x.shape
        H = c["heads"]
        HV = c["value_heads"] or H
        dk = c["head_dk"] or c["head_dim"]
        dv = c["head_dv"] or c["head_dim"]
        rf = dv if c["forget_rank"] is None else c["forget_rank"]
        q = self._conv(linear(x, p["q_proj.weight"]), p["q_conv1d.weight"])
        k = self._conv(linear(x, p["k_proj.weight"]), p["k_conv1d.weight"])
        v = F.silu(self._conv(linear(x, p["v_proj.weight"]), p["v_conv1d.weight"]))
        v = v.view(B, T, HV, dv)
        z = linear(linear(x, p["f_a_proj.weight"]), p["f_b_proj.weight"]) if rf else \
            linear(x, p["f_proj.weight"])
        z = z.view(B, T, HV, dk)
        a_log, dt_bias = p["A_log"], p["dt_bias"].view(HV, dk)
        lb = c["lower_bound"]
        b_logit = linear(x, p["b_proj.weight"])
        scale = 1.0 / math.sqrt(dk)
        if self.fast:  # as fla's KDA layer calls it: L2 norm, gate and beta in the kernel
            kw = dict(use_qk_l2norm_in_kernel=True, use_gate_in_kernel=True,
                      use_beta_sigmoid_in_kernel=True, A_log=a_log.float(),
                      dt_bias=p["dt_bias"].float())
            if lb is not None:
                kw.update(safe_gate=True, lower_bound=lb)
            dt = v.dtype
            o, _ = self.chunk_kda(F.silu(q).view(B, T, H, dk).to(dt),
                                  F.silu(k).view(B, T, H, dk).to(dt),
                                  v, z.to(dt), b_logit.to(dt), scale=scale, **kw)
        else:
            q, k, beta = self._l2(q, H), self._l2(k, H), torch.sigmoid(b_logit)
            zb = z + dt_bias.to(z.dtype)
            ea = torch.exp(a_log).to(z.dtype).view(1, 1, HV, 1)
            g = lb * torch.sigmoid(ea * zb) if lb is not None else -ea * F.softplus(zb)
            o = self._recurrence(q, k, v, g, beta, scale, HV // H)
        on = rmsnorm(o, p["o_norm.weight"], c["norm_eps"]).reshape(B, T, HV * dv)
        G = linear(linear(x, p["g_a_proj.weight"]), p["g_b_proj.weight"]) if c["gate_rank"] \
            else linear(x, p["g_proj.weight"])
        return linear(on * torch.sigmoid(G), p["o_proj.weight"])

    @staticmethod
    def _recurrence(q, k, v, g, beta, scale, group):
        """The delta rule token by token (cpu_recurrent.inc.c's rec_step)."""
        B, T, HV, dv = v.shape
        q = q.repeat_interleave(group, dim=2) * scale
        k = k.repeat_interleave(group, dim=2)
        S = v.new_zeros(B, HV, k.shape[-1], dv)
        out = []
        for t in range(T):
            S = S * torch.exp(g[:, t]).unsqueeze(-1)
            e = v[:, t] - torch.einsum("bhk,bhkv->bhv", k[:, t], S)
            S = S + torch.einsum("bhk,bhv->bhkv", k[:, t], beta[:, t].unsqueeze(-1) * e)
            out.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
        return torch.stack(out, 1)


class LatentMoE(tc.Module):
    forced = None  # [N, k] expert ids to use instead of this model's own choice

    def route(self, s, bias):
        """Top-k of s + bias in descending order, ties to the lower id (route_range)."""
        c = self.cfg
        k = c["top_k"]
        biased = s.detach().float() if self.fast else s.detach().double()
        if bias is not None:
            biased = biased + bias.to(biased.device).float().to(biased.dtype)
        order = torch.sort(biased, dim=-1, descending=True, stable=True)
        sel, top = order.indices[:, :k], order.values
        if self.report:  # what the check prints (a host sync the benchmark does without)
            self.margin = (top[:, k - 1] - top[:, k]).min().item() if k < s.shape[1] else \
                math.inf
            self.own = sel
        return sel if self.forced is None else self.forced.long().to(s.device)

    def forward(self, x, p):
        c = self.cfg
        B, T, d = x.shape
        N, E = B * T, c["experts"]
        xf = x.reshape(N, d)
        s = torch.sigmoid(linear(xf, p["router.weight"]))
        sel = self.route(s, p.get("balancer.bias"))
        ssel = s.gather(1, sel)
        w = ssel * (c["routed_scaling"] / (ssel.sum(-1, keepdim=True) + 1e-20)) \
            if c["renormalize"] else ssel * c["routed_scaling"]
        lat = linear(xf, p["routed_down_proj.weight"])
        wg, wu, wd = p["experts.gate_proj.weight"], p["experts.up_proj.weight"], \
            p["experts.down_proj.weight"]
        act = lambda g_, u_: glu(g_, u_, c["act"], c["beta1"], c["beta2"])  # noqa: E731
        if self.fast:
            U = self._grouped(lat, sel, w, wg, wu, wd, act)
        else:
            U = lat.new_zeros(N, lat.shape[1])
            for e in range(E):
                tok, slot = (sel == e).nonzero(as_tuple=True)
                if tok.numel() == 0:
                    continue
                xe = lat[tok]
                ye = linear(act(linear(xe, wg[e]), linear(xe, wu[e])), wd[e])
                U = U.index_add(0, tok, ye * w[tok, slot].unsqueeze(-1))
        n = rmsnorm(U, p["routed_norm.weight"], c["norm_eps"]) if c["latent_norm"] else U
        y = linear(n, p["routed_up_proj.weight"])
        if c["shared"]:
            y = y + linear(act(linear(xf, p["shared_experts.gate_proj.weight"]),
                               linear(xf, p["shared_experts.up_proj.weight"])),
                           p["shared_experts.down_proj.weight"])
        return y.view(B, T, d)

    @staticmethod
    def _grouped(lat, sel, w, wg, wu, wd, act):
        """The routed experts as three torch._grouped_mm calls over rows sorted by expert."""
        N, k = sel.shape
        flat = sel.reshape(-1)
        order = torch.argsort(flat, stable=True)
        counts = torch.bincount(flat, minlength=wg.shape[0])
        offs = torch.cumsum(counts, 0).to(torch.int32)
        xe = lat.to(torch.bfloat16)[order // k]
        bf = lambda t: t.to(torch.bfloat16).transpose(1, 2)  # noqa: E731  [E, in, out]
        h = act(torch._grouped_mm(xe, bf(wg), offs=offs), torch._grouped_mm(xe, bf(wu), offs=offs))
        ye = torch._grouped_mm(h, bf(wd), offs=offs)
        inv = torch.empty_like(order)
        inv[order] = torch.arange(order.numel(), device=order.device)
        out = ye[inv].view(N, k, -1)  # back to (token, slot) order
        return (out * w.unsqueeze(-1).to(out.dtype)).sum(1)


class BlockAttnRes:
    """Block AttnRes in the residual protocol of attnres.c: begin, mix(s), push(s, y), finish."""

    def __init__(self, cfg, params, n_layers, fast=False):
        self.p, self.eps, self.fast = params, cfg["norm_eps"], fast
        self.kb = 1 if cfg["full"] else 2 * cfg["block_layers"]
        self.S = 2 * n_layers
        if fast:
            from fla.ops.attnres import fused_attnres
            self.fused_attnres = fused_attnres

    def _op(self, s, sources):
        name = "residual.out." if s == self.S else \
            f"layers.{s // 2}.residual.{'attn' if s % 2 == 0 else 'ffn'}."
        w, gamma = self.p(name + "query"), self.p(name + "key_norm")
        if self.fast:
            return self.fused_attnres(w, sources, gamma, rms_eps=self.eps)
        V = torch.stack(sources)
        rho = torch.rsqrt(V.pow(2).mean(-1) + self.eps)
        alpha = torch.softmax(rho * (V @ (gamma * w).to(V.dtype)), dim=0)
        return (alpha.unsqueeze(-1) * V).sum(0)

    def _closed(self, s):
        return 0 if s <= 0 else (s - 1) // self.kb + 1

    def begin(self, h0):
        self.src, self.P = [h0], None

    def mix(self, s):
        if s == 0:
            return self.src[0]
        n = self._closed(s)
        out = self._op(s, self.src[:n] + [self.P])
        if s % self.kb == 0 and s < self.S:
            self.src.append(self.P)
        return out

    def push(self, s, y):
        self.P = y if s % self.kb == 0 else self.P + y

    def finish(self):
        return self._op(self.S, self.src[:self._closed(self.S)] + [self.P])


tc.PLUGINS.update({"kda": KDA, "latent_moe": LatentMoE})
tc.RESIDUALS.update({"block_attnres": BlockAttnRes})


class K3Model(tc.Model):
    def __init__(self, ck, weights, fast, state, forced=None):
        super().__init__(ck, weights, fast, state)
        res = self.res_cls
        if res is BlockAttnRes:
            self.res_cls = lambda cfg, p, L: BlockAttnRes(cfg, p, L, fast)
        for sub in self.subs:
            key = f"routing.layers.{sub.layer}.selected"
            if isinstance(sub.mod, LatentMoE) and forced is not None and key in forced:
                sub.mod.forced = forced[key]

    def routing_report(self, k3rt_routing):
        """Per routed layer: tokens whose chosen set differs from k3rt's, the smallest gap
        between the k-th and (k+1)-th biased score. True when every choice agrees, or every
        layer was given k3rt's choice."""
        ok = True
        for sub in self.subs:
            mod = sub.mod
            if not isinstance(mod, LatentMoE):
                continue
            ref = k3rt_routing.get(f"routing.layers.{sub.layer}.selected")
            if ref is None:
                print(f"routing: layers.{sub.layer}: k3rt's choice missing")
                ok = False
                continue
            a = torch.sort(mod.own, -1).values
            b = torch.sort(ref.long(), -1).values
            diff = int((a != b).any(-1).sum())
            print(f"routing: layers.{sub.layer}: {diff} of {a.shape[0]} tokens choose other "
                  f"experts than k3rt{' (k3rt choice used)' if mod.forced is not None else ''}; "
                  f"smallest top-k margin {mod.margin:.3e}")
            ok = ok and (diff == 0 or mod.forced is not None)
        return ok


if __name__ == "__main__":
    sys.exit(tc.main(K3Model, tc.compile_blocks, "torch_k3", __doc__.split("\n\n")[0]))
