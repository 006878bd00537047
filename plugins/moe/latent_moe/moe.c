/* Stable LatentMoE forward and backward, the llm.c way (spec moe_balance_attnres.md §1).
 * N = B*T tokens, d = d_model, E experts, k per token, l latent, m expert hidden, R = N*k
 * routed rows, Hs = fused shared hidden:
 *
 *   s  = sigmoid(x Wr^T)          [N, E]  saved; router on the full width, compute dtype (fp32)
 *   sel = top-k(s + bias)         [N, k]  saved; bias from the balancer, never trained
 *   p  = rscale s_sel / sum s_sel [N, k]  saved (renormalize; else rscale s_sel)
 *   c  = x Wdown^T                [N, l]  saved; once per token, before the dispatch
 *   xe = c in grouped order       [R, l]  rows of expert e: offsets[e] .. offsets[e+1]
 *   g, u = xe Wg_e^T, xe Wu_e^T   [R, m]  saved (grouped GEMMs)
 *   a  = glu(g, u)                [R, m]  saved (the SiTU transcendentals cost more than a GEMM
 *                                         on the CPU, so the backward does not recompute it)
 *   ye = a Wd_e^T                 [R, l]  saved
 *   U  = sum_j p_j ye_j           [N, l]  saved; per token in slot order, in the compute dtype
 *   n  = RMSNorm_gamma(U)         [N, l]  saved with its rstd (latent_norm; else n = U)
 *   y  = n Wup^T + glu(x Wsg^T, x Wsu^T) Wsd^T          shared: sg, su, sa [N, Hs] saved
 *
 * Products are core ops (k3rt_linear / k3rt_grouped_linear / k3rt_gemm), as are the GLU,
 * RMSNorm and sigmoid, so this file is dtype-agnostic; the token loops are lmoe_kernels. */
#include "latent_moe.h"

/* A saved tensor by its layout offset, in whichever part holds it (lmoe_layout.part_end). */
#define SV(off) k3rt_saved_at(a->saved, L.part_end, LMOE_SAVED_N, (off), 1)

#include <stdint.h>
#include <string.h>

#define P(i) (a->params[f->slot[(i)]].data)
#define G(i) (a->grads[f->slot[(i)]].data)

static const lmoe_kernels *kernels(const latent_moe *f)
{
    return f->dtype == K3RT_F32 ? &lmoe_kernels_f32 : &lmoe_kernels_f64;
}

/* Counting sort of the (token, slot) pairs by expert, stable in token order: counts, offsets
 * and the grouped row of every pair. Serial: O(N k) integer work, negligible next to the
 * GEMMs, and the order it produces is the one the GPU path must reproduce. */
static void dispatch(const int32_t *sel, int64_t R, int64_t E, int64_t *counts,
                     int64_t *offsets, int32_t *pos)
{
    memset(counts, 0, (size_t)E * sizeof *counts);
    for (int64_t i = 0; i < R; i++)
        counts[sel[i]]++;
    offsets[0] = 0;
    for (int64_t e = 0; e < E; e++)
        offsets[e + 1] = offsets[e] + counts[e];
    /* counts doubles as the fill cursor, then is restored */
    for (int64_t e = 0; e < E; e++)
        counts[e] = offsets[e];
    for (int64_t i = 0; i < R; i++)
        pos[i] = (int32_t)counts[sel[i]]++;
    for (int64_t e = 0; e < E; e++)
        counts[e] = offsets[e + 1] - offsets[e];
}

/* The selection bias into saved: the host's [E] f32 tensor, or zeros when none is given. */
static void take_bias(const latent_moe *f, const k3rt_tensor *bias, float *dst)
{
    if (bias->ndim == 0)
        memset(dst, 0, (size_t)f->E * sizeof(float));
    else
        memcpy(dst, bias->data, (size_t)f->E * sizeof(float));
}

/* What follows the combine, the same on every device and dtype (core ops only), in pieces
 * so that the CUDA path can run the shared experts on a second stream:
 *   routed out:  n = RMSNorm(U) (or U) ; y = n Wup^T          (nrm, rstd: latent_norm only)
 *   shared in:   sg = x Wsg^T ; su = x Wsu^T ; sa = glu(sg, su) (reads x only)
 *   shared out:  y += sa Wsd^T                                  (after both) */
int lmoe_routed_out(const latent_moe *f, k3rt_stream *st, const k3rt_fwd_args *a, const void *U,
                    void *nrm, void *rstd, k3rt_error *err)
{
    int dt = f->dtype;
    int64_t N = a->batch * a->seq, d = f->d, l = f->l;
    const void *n = U;
    if (f->latent_norm) {
        n = nrm;
        K3RT_TRY(k3rt_rmsnorm_fwd(st, dt, U, P(LMOE_NORM), nrm, rstd, N, l, f->norm_eps, err));
    }
    return k3rt_linear_fwd(st, dt, n, P(LMOE_UP), NULL, a->y.data, N, l, d, err);
}

int lmoe_shared_in(const latent_moe *f, k3rt_stream *st, const k3rt_fwd_args *a, void *sg,
                   void *su, void *sa, k3rt_error *err)
{
    int dt = f->dtype;
    int64_t N = a->batch * a->seq, d = f->d;
    const void *x = a->x.data;
    K3RT_TRY(k3rt_linear_fwd(st, dt, x, P(LMOE_SH_GATE), NULL, sg, N, d, f->Hs, err));
    K3RT_TRY(k3rt_linear_fwd(st, dt, x, P(LMOE_SH_UP), NULL, su, N, d, f->Hs, err));
    return k3rt_glu_fwd(st, dt, f->glu, sg, su, sa, N * f->Hs, f->beta1, f->beta2, err);
}

int lmoe_shared_out(const latent_moe *f, k3rt_stream *st, const k3rt_fwd_args *a,
                    const void *sa, k3rt_error *err)
{
    int64_t N = a->batch * a->seq, d = f->d;
    return k3rt_gemm(st, f->dtype, 0, 1, N, d, f->Hs, 1.0, sa, f->Hs, P(LMOE_SH_DOWN), f->Hs, 1.0,
                     a->y.data, d, err);
}

int lmoe_out_forward(const latent_moe *f, k3rt_stream *st, const k3rt_fwd_args *a, const void *U,
                   void *nrm, void *rstd, void *sg, void *su, void *sa, k3rt_error *err)
{
    K3RT_TRY(lmoe_routed_out(f, st, a, U, nrm, rstd, err));
    if (f->Hs == 0)
        return K3RT_OK;
    K3RT_TRY(lmoe_shared_in(f, st, a, sg, su, sa, err));
    return lmoe_shared_out(f, st, a, sa, err);
}

/* The backward pieces:
 *   shared weights:  dWsd += dy^T sa ; dsa = dy Wsd ; (dsg, dsu) = glu' ; dWsg += dsg^T x ;
 *                    dWsu += dsu^T x                            (reads dy, x and the saved)
 *   shared dx:       dx (=|+=) dsg Wsg + dsu Wsu
 *   routed out:      dWup += dy^T n ; dn = dy Wup ; dU = RMSNorm'(dn) (dgamma +=); dU may
 *                    alias dn without the latent norm */
int lmoe_shared_bwd_w(const latent_moe *f, k3rt_stream *st, const k3rt_bwd_args *a,
                      const void *sg, const void *su, const void *sa, void *dsa, void *dsg,
                      void *dsu, k3rt_error *err)
{
    int dt = f->dtype;
    int64_t N = a->batch * a->seq, d = f->d;
    const void *x = a->x.data;
    K3RT_TRY(k3rt_linear_bwd(st, dt, sa, P(LMOE_SH_DOWN), a->dy.data, dsa, G(LMOE_SH_DOWN), NULL,
                             N, f->Hs, d, 0, err));
    K3RT_TRY(k3rt_glu_bwd(st, dt, f->glu, sg, su, dsa, dsg, dsu, N * f->Hs, f->beta1, f->beta2,
                          err));
    K3RT_TRY(k3rt_linear_bwd(st, dt, x, P(LMOE_SH_GATE), dsg, NULL, G(LMOE_SH_GATE), NULL, N, d,
                             f->Hs, 0, err));
    return k3rt_linear_bwd(st, dt, x, P(LMOE_SH_UP), dsu, NULL, G(LMOE_SH_UP), NULL, N, d, f->Hs,
                           0, err);
}

int lmoe_shared_bwd_dx(const latent_moe *f, k3rt_stream *st, const k3rt_bwd_args *a,
                       const void *dsg, const void *dsu, int accumulate, k3rt_error *err)
{
    int dt = f->dtype;
    int64_t N = a->batch * a->seq, d = f->d;
    const void *x = a->x.data;
    void *dx = a->dx.data;
    K3RT_TRY(k3rt_linear_bwd(st, dt, x, P(LMOE_SH_GATE), dsg, dx, NULL, NULL, N, d, f->Hs,
                             accumulate, err));
    return k3rt_linear_bwd(st, dt, x, P(LMOE_SH_UP), dsu, dx, NULL, NULL, N, d, f->Hs, 1, err);
}

int lmoe_routed_out_bwd(const latent_moe *f, k3rt_stream *st, const k3rt_bwd_args *a,
                        const void *U, const void *nrm, const void *rstd, void *dn, void *dU,
                        k3rt_error *err)
{
    int dt = f->dtype;
    int64_t N = a->batch * a->seq, d = f->d, l = f->l;
    const void *n = f->latent_norm ? nrm : U;
    K3RT_TRY(k3rt_linear_bwd(st, dt, n, P(LMOE_UP), a->dy.data, dn, G(LMOE_UP), NULL, N, l, d, 0,
                             err));
    if (f->latent_norm)
        K3RT_TRY(k3rt_rmsnorm_bwd(st, dt, U, P(LMOE_NORM), rstd, dn, dU, G(LMOE_NORM), N, l, 0, err));
    return K3RT_OK;
}

/* Shared experts first (their input gradient initialises a->dx, which the routed path then
 * accumulates into). */
int lmoe_out_backward(const latent_moe *f, k3rt_stream *st, const k3rt_bwd_args *a, const void *U,
                    const void *nrm, const void *rstd, const void *sg, const void *su,
                    const void *sa, void *dsa, void *dsg, void *dsu, void *dn, void *dU,
                    k3rt_error *err)
{
    if (f->Hs > 0) {
        K3RT_TRY(lmoe_shared_bwd_w(f, st, a, sg, su, sa, dsa, dsg, dsu, err));
        K3RT_TRY(lmoe_shared_bwd_dx(f, st, a, dsg, dsu, 0, err));
    }
    return lmoe_routed_out_bwd(f, st, a, U, nrm, rstd, dn, dU, err);
}

int lmoe_cpu_forward(void *self, const k3rt_fwd_args *a, k3rt_error *err)
{
    const latent_moe *f = self;
    int64_t N = a->batch * a->seq, E = f->E, k = f->k, R = N * f->k, l = f->l, m = f->m;
    int64_t d = f->d;
    if (R > INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "latent_moe: %lld tokens x top-%lld routed rows "
                         "exceed the i32 row index; use a smaller micro-batch", (long long)N,
                         (long long)k);
    lmoe_layout L;
    lmoe_layout_make(f, N, &L);
    char *ws = a->workspace;
    float *bias = (float *)(SV(L.bias));
    take_bias(f, &a->bias, bias);
    k3rt_stream *st = a->stream;
    int dt = f->dtype;
    const lmoe_kernels *K = kernels(f);
    void *s = SV(L.s), *p = SV(L.p), *c = SV(L.c), *g = SV(L.g), *u = SV(L.u);
    void *act = SV(L.a), *ye = SV(L.ye), *U = SV(L.U), *xe = ws + L.f_xe;
    int32_t *sel = (int32_t *)(SV(L.sel)), *pos = (int32_t *)(SV(L.pos));
    int64_t *counts = (int64_t *)(SV(L.counts)), *offsets = (int64_t *)(SV(L.offsets));

    /* route */
    K3RT_TRY(k3rt_linear_fwd(st, dt, a->x.data, P(LMOE_ROUTER), NULL, s, N, d, E, err));
    K3RT_TRY(k3rt_act_fwd(st, dt, K3RT_ACT_SIGMOID, s, s, N * E, err));
    K->route(st, s, bias, N, E, k, f->renormalize, f->rscale, sel, p);
    dispatch(sel, R, E, counts, offsets, pos);

    /* routed experts in the latent space */
    K3RT_TRY(k3rt_linear_fwd(st, dt, a->x.data, P(LMOE_DOWN), NULL, c, N, d, l, err));
    K->gather(st, c, pos, N, k, l, xe);
    K3RT_TRY(k3rt_grouped_linear_fwd(st, dt, xe, P(LMOE_EX_GATE), g, offsets, E, l, m, err));
    K3RT_TRY(k3rt_grouped_linear_fwd(st, dt, xe, P(LMOE_EX_UP), u, offsets, E, l, m, err));
    K3RT_TRY(k3rt_glu_fwd(st, dt, f->glu, g, u, act, R * m, f->beta1, f->beta2, err));
    K3RT_TRY(k3rt_grouped_linear_fwd(st, dt, act, P(LMOE_EX_DOWN), ye, offsets, E, m, l, err));
    K->combine(st, ye, pos, p, N, k, l, U);
    K3RT_TRY(lmoe_out_forward(f, st, a, U, SV(L.nrm), SV(L.rstd), SV(L.sg), SV(L.su), SV(L.sa),
                            err));

    if (a->routing) {
        k3rt_routing *r = a->routing;
        void *s32 = SV(L.s32);
        if (dt != K3RT_F32)
            K3RT_TRY(k3rt_cast(st, s, dt, s32, K3RT_F32, N * E, err));
        r->scores = k3rt_tensor_view(s32, K3RT_F32, K3RT_DEVICE_CPU, 2, N, E, 0, 0);
        r->selected = k3rt_tensor_view(sel, K3RT_I32, K3RT_DEVICE_CPU, 2, N, k, 0, 0);
        r->counts = k3rt_tensor_view(counts, K3RT_I64, K3RT_DEVICE_CPU, 1, E, 0, 0, 0);
        r->offsets = k3rt_tensor_view(offsets, K3RT_I64, K3RT_DEVICE_CPU, 1, E + 1, 0, 0, 0);
    }
    return K3RT_OK;
}

/* Backward, in reverse (spec §1):
 *   shared:  dWsd += dy^T sa ; dsa = dy Wsd ; (dsg, dsu) = glu' ; dx = dsg Wsg + dsu Wsu
 *   dWup += dy^T n ; dn = dy Wup ; dU = RMSNorm'(dn) (dgamma +=)
 *   dp_j = dU . ye_j ; dye_j = p_j dU
 *   dWd_e += dye^T a ; da = dye Wd_e ; (dg, du) = glu'(g, u) da
 *   dWg_e += dg^T xe ; dWu_e += du^T xe ; dxe = dg Wg_e + du Wu_e ; dc = sum_j dxe_j
 *   dWdown += dc^T x ; dx += dc Wdown
 *   dz = s (1 - s) (gate backward of dp + d_scores) ; dWr += dz^T x ; dx += dz Wr */
int lmoe_cpu_backward(void *self, const k3rt_bwd_args *a, k3rt_error *err)
{
    const latent_moe *f = self;
    int64_t N = a->batch * a->seq, E = f->E, k = f->k, R = N * f->k, l = f->l, m = f->m;
    int64_t d = f->d;
    lmoe_layout L;
    lmoe_layout_make(f, N, &L);
    const float *d_scores = a->d_scores.ndim ? a->d_scores.data : NULL;
    char *ws = a->workspace;
    k3rt_stream *st = a->stream;
    int dt = f->dtype;
    const lmoe_kernels *K = kernels(f);
    const int32_t *sel = (const int32_t *)(SV(L.sel)), *pos = (const int32_t *)(SV(L.pos));
    const int64_t *offsets = (const int64_t *)(SV(L.offsets));
    const void *x = a->x.data;
    void *dx = a->dx.data;

    void *dU = ws + L.b_dU;
    K3RT_TRY(lmoe_out_backward(f, st, a, SV(L.U), SV(L.nrm), SV(L.rstd), SV(L.sg), SV(L.su),
                             SV(L.sa), ws + L.b_dsa, ws + L.b_dsg, ws + L.b_dsu, ws + L.b_dn, dU,
                             err));
    int acc = f->Hs > 0;

    /* combine, experts, dispatch */
    void *dp = ws + L.b_dp, *dye = ws + L.b_dye, *da = ws + L.b_da, *dg = ws + L.b_dg;
    void *du = ws + L.b_du, *xe = ws + L.b_xe, *dc = ws + L.b_dc, *dz = ws + L.b_dz;
    K->combine_bwd(st, dU, SV(L.ye), pos, SV(L.p), N, k, l, dp, dye);
    K3RT_TRY(k3rt_grouped_linear_bwd(st, dt, SV(L.a), P(LMOE_EX_DOWN), dye, da, G(LMOE_EX_DOWN),
                                     offsets, E, m, l, 0, err));
    K3RT_TRY(k3rt_glu_bwd(st, dt, f->glu, SV(L.g), SV(L.u), da, dg, du, R * m, f->beta1,
                          f->beta2, err));
    K->gather(st, SV(L.c), pos, N, k, l, xe);
    void *dxe = dye;  /* dye is spent */
    K3RT_TRY(k3rt_grouped_linear_bwd(st, dt, xe, P(LMOE_EX_GATE), dg, dxe, G(LMOE_EX_GATE), offsets,
                                     E, l, m, 0, err));
    K3RT_TRY(k3rt_grouped_linear_bwd(st, dt, xe, P(LMOE_EX_UP), du, dxe, G(LMOE_EX_UP), offsets, E,
                                     l, m, 1, err));
    K->scatter(st, dxe, pos, N, k, l, dc);
    K3RT_TRY(k3rt_linear_bwd(st, dt, x, P(LMOE_DOWN), dc, dx, G(LMOE_DOWN), NULL, N, d, l, acc,
                             err));

    /* router */
    K->router_bwd(st, SV(L.s), sel, dp, d_scores, N, E, k, f->renormalize, f->rscale, dz);
    return k3rt_linear_bwd(st, dt, x, P(LMOE_ROUTER), dz, dx, G(LMOE_ROUTER), NULL, N, d, E, 1,
                           err);
}
