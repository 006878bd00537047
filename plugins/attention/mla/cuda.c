/* NoPE MLA on CUDA, f32 or bf16: the steps of cpu.inc.c in the same order, over device
 * buffers carved by mla_layout. Products, norms and the gradient bookkeeping go through the
 * shared ops (k3rt/ops.h), which run on the stream's device; the head assembly, the gate and the
 * attention core are this plugin's kernels (mla_cuda.h). Under bf16 every activation, weight
 * and activation gradient is bf16, and the parameter gradients, rstd, lse and the max logits are
 * f32 (k3rt/ops.h's mixed-precision convention). */
#include "mla.h"
#include "mla_cuda.h"

/* Element `off` of a buffer of `es`-byte elements. */
static void *at(void *base, int64_t off, size_t es)
{
    return (char *)base + off * (int64_t)es;
}

static void by_slot(const mla *m, const k3rt_tensor *t, void *out[MLA_N_SLOTS])
{
    for (int s = 0; s < MLA_N_SLOTS; s++)
        out[s] = m->slot[s] >= 0 ? t[m->slot[s]].data : NULL;
}

/* The attention core of a call over layout L; docs: the call's doc_offsets (ndim 0: none). */
static mla_attn attn_of(const mla *m, void *sv, const mla_layout *L, int64_t B, int64_t T,
                        const k3rt_tensor *docs)
{
    size_t es = k3rt_dtype_size(m->dtype);
    mla_attn at_;
    at_.dtype = m->dtype;
    at_.B = B, at_.T = T, at_.H = m->H, at_.dqk = m->dqk, at_.dv = m->dv;
    at_.scale = m->scale;
    at_.q = at(sv, L->q, es), at_.k = at(sv, L->k, es), at_.v = at(sv, L->v, es);
    at_.o = at(sv, L->o, es);
    at_.lse = at(sv, L->lse, es);
    at_.block_max = NULL;
    at_.dout = NULL, at_.dq = NULL, at_.dk = NULL, at_.dv_out = NULL, at_.drow = NULL;
    at_.deterministic = 1, at_.dq_acc = NULL;
    at_.kernel = m->kernel;
    at_.docs = docs->ndim ? docs->data : NULL;
    at_.n_docs = docs->ndim ? docs->shape[0] - 1 : 0;
    return at_;
}

/* The saved and workspace buffers' entries of layout L, in a function with sv, ws and es. */
#define SV(f) at(sv, L.f, es)
#define WS(f) at(ws, L.f, es)

/* ---- forward ------------------------------------------------------------------------------- */

int mla_forward_cuda(mla *m, const k3rt_fwd_args *a, k3rt_error *err)
{
    k3rt_stream *s = a->stream;
    void *st = k3rt_stream_native(s);
    int dt = m->dtype;
    size_t es = k3rt_dtype_size(dt);
    int64_t B = a->batch, T = a->seq, N = B * T, H = m->H, d = m->d;
    int64_t dn = m->dn, dr = m->dr, dv = m->dv, dc = m->dc, rq = m->rq;
    mla_layout L;
    mla_layout_make(m, B, T, 0, &L);
    void *sv = a->saved[0], *ws = a->workspace, *W[MLA_N_SLOTS];
    by_slot(m, a->params, W);
    K3RT_TRY(mla_cuda_enter(m->device, err));
    const void *x = a->x.data;

    /* Queries: qin = RMSNorm(x Wqa^T) (rq > 0; keeps qa, its rstd and qan) or x. */
    const void *qin = x;
    int64_t din = d;
    if (rq) {
        K3RT_TRY(k3rt_linear_fwd(s, dt, x, W[MLA_Q_A], NULL, SV(qa), N, d, rq, err));
        K3RT_TRY(k3rt_rmsnorm_fwd(s, dt, SV(qa), W[MLA_Q_A_NORM], SV(qan), SV(q_rstd), N, rq,
                                  m->eps, err));
        qin = SV(qan), din = rq;
    }
    K3RT_TRY(k3rt_linear_fwd(s, dt, qin, W[MLA_Q_NOPE], NULL, WS(f_qn), N, din, H * dn, err));
    if (dr)
        K3RT_TRY(k3rt_linear_fwd(s, dt, qin, W[MLA_Q_SHARED], NULL, WS(f_qr), N, din, H * dr,
                                 err));

    /* Latent c (kept with its rstd and ĉ) and the shared key kr: the two row blocks of Wkva. */
    K3RT_TRY(k3rt_linear_fwd(s, dt, x, W[MLA_KV_A], NULL, SV(c), N, d, dc, err));
    if (dr)
        K3RT_TRY(k3rt_linear_fwd(s, dt, x, at(W[MLA_KV_A], dc * d, es), NULL, WS(f_kr), N, d,
                                 dr, err));
    K3RT_TRY(k3rt_rmsnorm_fwd(s, dt, SV(c), W[MLA_KV_A_NORM], SV(chat), SV(kv_rstd), N, dc,
                              m->eps, err));
    K3RT_TRY(k3rt_linear_fwd(s, dt, SV(chat), W[MLA_K_B], NULL, WS(f_kn), N, dc, H * dn, err));
    K3RT_TRY(k3rt_linear_fwd(s, dt, SV(chat), W[MLA_V_B], NULL, SV(v), N, dc, H * dv, err));

    /* Q, K as [B, T, H, dn | dr]; every head's key gets the same kr (kept). */
    K3RT_TRY(mla_assemble_cuda(st, dt, SV(q), WS(f_qn), dn, WS(f_qr), dr, 0, N, H, err));
    K3RT_TRY(mla_assemble_cuda(st, dt, SV(k), WS(f_kn), dn, WS(f_kr), dr, 1, N, H, err));

    /* O = causal softmax attention per (b, h), within each packed document; lse kept; per-head
     * max logit on the device (report_max_logit). */
    mla_attn core = attn_of(m, sv, &L, B, T, &a->doc_offsets);
    core.block_max = m->report_max ? WS(f_max) : NULL;
    K3RT_TRY(mla_attn_fwd_cuda(st, &core, err));
    if (m->report_max) {
        K3RT_TRY(mla_head_max_cuda(st, core.block_max, B, H, T, m->dev_max, !m->dev_fresh,
                                   err));
        m->dev_fresh = 0;
    }

    /* Output gate (z = x Wg^T kept): og = O ⊙ sigmoid(z); y = og Wo^T. */
    const void *og = SV(o);
    if (m->gate) {
        K3RT_TRY(k3rt_linear_fwd(s, dt, x, W[MLA_GATE], NULL, SV(z), N, d, H * dv, err));
        K3RT_TRY(k3rt_glu_fwd(s, dt, K3RT_GLU_SIGMOID, SV(z), SV(o), WS(f_og), N * H * dv, 0, 0,
                              err));
        og = WS(f_og);
    }
    return k3rt_linear_fwd(s, dt, og, W[MLA_O], NULL, a->y.data, N, H * dv, d, err);
}

/* ---- backward ------------------------------------------------------------------------------ */

int mla_backward_cuda(mla *m, const k3rt_bwd_args *a, k3rt_error *err)
{
    k3rt_stream *s = a->stream;
    void *st = k3rt_stream_native(s);
    int dt = m->dtype;
    size_t es = k3rt_dtype_size(dt), gs = dt == K3RT_BF16 ? 4 : es; /* gradient element size */
    int64_t B = a->batch, T = a->seq, N = B * T, H = m->H, d = m->d;
    int64_t dn = m->dn, dr = m->dr, dv = m->dv, dc = m->dc, rq = m->rq;
    mla_layout L;
    mla_layout_make(m, B, T, 0, &L);
    void *sv = a->saved[0], *ws = a->workspace, *W[MLA_N_SLOTS], *G[MLA_N_SLOTS];
    by_slot(m, a->params, W);
    by_slot(m, a->grads, G);
    K3RT_TRY(mla_cuda_enter(m->device, err));
    const void *x = a->x.data, *dy = a->dy.data;
    void *dx = a->dx.data;
    int acc = 0; /* dx is overwritten by its first contribution, then accumulated */

    /* Output projection and gate: dog = dy Wo; dWo += dy^T og;
     * dz = dog ⊙ O ⊙ σ'(z) -> dWg, dx;  dO = dog ⊙ σ(z). */
    void *dO = WS(b_g2);
    if (m->gate) {
        void *g1 = WS(b_g1);
        K3RT_TRY(k3rt_glu_fwd(s, dt, K3RT_GLU_SIGMOID, SV(z), SV(o), g1, N * H * dv, 0, 0, err));
        K3RT_TRY(k3rt_linear_bwd(s, dt, g1, W[MLA_O], dy, dO, G[MLA_O], NULL, N, H * dv, d, 0,
                                 err));
        K3RT_TRY(k3rt_glu_bwd(s, dt, K3RT_GLU_SIGMOID, SV(z), SV(o), dO, g1, dO, N * H * dv, 0,
                              0, err));
        K3RT_TRY(k3rt_linear_bwd(s, dt, x, W[MLA_GATE], g1, dx, G[MLA_GATE], NULL, N, d, H * dv,
                                 0, err));
        acc = 1;
    } else {
        K3RT_TRY(k3rt_linear_bwd(s, dt, SV(o), W[MLA_O], dy, dO, G[MLA_O], NULL, N, H * dv, d, 0,
                                 err));
    }

    /* Attention: dQ, dK, dV per (b, h); without `deterministic` dQ sums with atomics. */
    mla_attn core = attn_of(m, sv, &L, B, T, &a->doc_offsets);
    core.dout = dO, core.dq = WS(b_dq), core.dk = WS(b_dk), core.dv_out = WS(b_dv);
    core.drow = WS(b_drow);
    core.deterministic = a->deterministic;
    core.dq_acc = dt == K3RT_BF16 ? (float *)WS(b_dqacc) : NULL;
    K3RT_TRY(mla_attn_bwd_cuda(st, &core, err));

    /* Split dQ, dK into their nope and shared parts; the shared key's gradient sums the heads
     * in order (deterministic). */
    K3RT_TRY(mla_split_cuda(st, dt, WS(b_dq), WS(b_dqn), dn, WS(b_dqr), dr, 0, N, H, err));
    K3RT_TRY(mla_split_cuda(st, dt, WS(b_dk), WS(b_dkn), dn, WS(b_dkr), dr, 1, N, H, err));

    /* Latent side: dĉ = dkn Wkb + dV Wvb; RMSNorm backward; dx += dc Wkva[:dc] + dkr Wkva[dc:]. */
    K3RT_TRY(k3rt_linear_bwd(s, dt, SV(chat), W[MLA_K_B], WS(b_dkn), WS(b_dchat), G[MLA_K_B],
                             NULL, N, dc, H * dn, 0, err));
    K3RT_TRY(k3rt_linear_bwd(s, dt, SV(chat), W[MLA_V_B], WS(b_dv), WS(b_dchat), G[MLA_V_B],
                             NULL, N, dc, H * dv, 1, err));
    K3RT_TRY(k3rt_rmsnorm_bwd(s, dt, SV(c), W[MLA_KV_A_NORM], SV(kv_rstd), WS(b_dchat),
                              WS(b_dc), G[MLA_KV_A_NORM], N, dc, 0, err));
    K3RT_TRY(k3rt_linear_bwd(s, dt, x, W[MLA_KV_A], WS(b_dc), dx, G[MLA_KV_A], NULL, N, d, dc,
                             acc, err));
    if (dr)
        K3RT_TRY(k3rt_linear_bwd(s, dt, x, at(W[MLA_KV_A], dc * d, es), WS(b_dkr), dx,
                                 at(G[MLA_KV_A], dc * d, gs), NULL, N, d, dr, 1, err));

    /* Query side: dqin = dqn Wqn + dqr Wqr, through the query RMSNorm and Wqa when rq > 0. */
    const void *qin = rq ? SV(qan) : x;
    int64_t din = rq ? rq : d;
    void *dqin = rq ? WS(b_dqin) : dx;
    K3RT_TRY(k3rt_linear_bwd(s, dt, qin, W[MLA_Q_NOPE], WS(b_dqn), dqin, G[MLA_Q_NOPE], NULL, N,
                             din, H * dn, rq ? 0 : 1, err));
    if (dr)
        K3RT_TRY(k3rt_linear_bwd(s, dt, qin, W[MLA_Q_SHARED], WS(b_dqr), dqin, G[MLA_Q_SHARED],
                                 NULL, N, din, H * dr, 1, err));
    if (rq) {
        K3RT_TRY(k3rt_rmsnorm_bwd(s, dt, SV(qa), W[MLA_Q_A_NORM], SV(q_rstd), dqin, WS(b_dqa),
                                  G[MLA_Q_A_NORM], N, rq, 0, err));
        K3RT_TRY(k3rt_linear_bwd(s, dt, x, W[MLA_Q_A], WS(b_dqa), dx, G[MLA_Q_A], NULL, N, d, rq,
                                 1, err));
    }
    return K3RT_OK;
}

#undef SV
#undef WS

