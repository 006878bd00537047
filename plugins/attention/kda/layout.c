/* Where each saved tensor and scratch buffer lives (kda.h), computed once for memory() and for
 * every call so the byte counts the engine plans with are the ones the kernels use; and the
 * FLOP count of the recurrence. */
#include "kda.h"

/* Buffers start on 64-byte boundaries for either dtype. */
static int64_t take(int64_t *at, int64_t n)
{
    int64_t off = *at;
    *at += (n + 15) / 16 * 16;
    return off;
}

static int64_t max2(int64_t a, int64_t b) { return a > b ? a : b; }

void kda_layout_make(const kda *m, int64_t B, int64_t T, int slots, kda_layout *l)
{
    int64_t N = B * T, H = m->H, HV = m->HV, Dk = H * m->dim_k, Dv = HV * m->dim_v,
        Dg = HV * m->dim_k;
    int64_t nh = B * (m->W - 1), at = 0;
    l->qp = take(&at, N * Dk);
    l->kp = take(&at, N * Dk);
    l->vp = take(&at, N * Dv);
    l->part_end[KDA_SAVED_PROJ] = at;
    l->qc = take(&at, N * Dk);
    l->kc = take(&at, N * Dk);
    l->vc = take(&at, N * Dv);
    l->part_end[KDA_SAVED_CONV] = at;
    l->qn = take(&at, N * Dk);
    l->kn = take(&at, N * Dk);
    l->v = take(&at, N * Dv);
    l->part_end[KDA_SAVED_CORE_IN] = at;
    l->rq = take(&at, N * H);
    l->rk = take(&at, N * H);
    l->part_end[KDA_SAVED_QK_RSTD] = at;
    l->fa = take(&at, N * m->rf);
    l->part_end[KDA_SAVED_FORGET_LOW] = at;
    l->z = take(&at, N * Dg);
    l->g = take(&at, N * Dg);
    l->beta = take(&at, N * HV);
    l->part_end[KDA_SAVED_GATES] = at;
    l->o = take(&at, N * Dv);
    l->part_end[KDA_SAVED_CORE_OUT] = at;
    l->rstd = take(&at, N * HV);
    l->part_end[KDA_SAVED_OUT_RSTD] = at;
    l->ga = take(&at, N * m->rg);
    l->part_end[KDA_SAVED_OGATE_LOW] = at;
    l->G = take(&at, N * Dv);
    l->part_end[KDA_SAVED_OGATE] = at;
    l->yg = take(&at, N * Dv);
    l->part_end[KDA_SAVED_OUT_IN] = at;
    /* with documents, each one beyond the first of its row may start one more chunk */
    int64_t chunks = B * kda_chunks(T, m->C) + kda_doc_cap(m, B) - B;
    l->states = take(&at, chunks * HV * m->dim_k * m->dim_v);
    l->saved = at;
    l->part_end[KDA_SAVED_STATES] = at;

    at = 0;
    l->on = take(&at, N * Dv);
    l->halo = take(&at, nh * (2 * Dk + Dv));
    l->dhalo = take(&at, nh * max2(Dk, Dv));
    l->d1 = take(&at, N * Dv);
    l->d2 = take(&at, N * Dv);
    l->d3 = take(&at, N * Dv);
    l->dlow = take(&at, N * max2(m->rf, m->rg));
    l->dq = take(&at, N * Dk);
    l->dk = take(&at, N * Dk);
    l->dv = take(&at, N * Dv);
    l->dg = take(&at, N * Dg);
    l->dbeta = take(&at, N * HV);
    l->dp = take(&at, N * max2(Dk, Dv));
    l->dac = take(&at, Dg);
    kda_dims d = {B, T, H, HV, m->dim_k, m->dim_v, m->C, 0};
    l->core_n = m->dtype == K3RT_F64 ? kda_core_ws_elems_f64(&d, slots)
                                     : kda_core_ws_elems_f32(&d, slots);
    l->core = take(&at, l->core_n);
    l->workspace = at;
}

/* Multiply-adds of the recurrence per (sequence, value head) as the kernels do them, counted
 * as 2 FLOPs (a lone multiply as 1); exponentials and other elementwise work are not counted,
 * and triangular products count their triangle only.
 *   recurrent, per token:
 *     forward  7 dim_k dim_v: decay, S^T k, k u^T, S^T q
 *     backward 23 dim_k dim_v: the chunk's states again (5), the decayed state and e again
 *              (3), then q dO^T, S dO, dS u, dS^T k (8) and S de, k de^T, rowsum(dS ⊙ S),
 *              decay (7)
 *   chunked, per chunk of c tokens:
 *     forward  2 c^2 (dim_k + dim_v) + 6 c dim_k dim_v: Aqk and Lk (c^2 dim_k each), the
 *              solve and Aqk Δ (c^2 dim_v each), (k Γ) S, (q Γ) S, (k Γ̄)^T Δ
 *     backward 6 c^2 dim_k + 5 c^2 dim_v + 14 c dim_k dim_v: Aqk, Lk, (k Γ) S and the solve
 *              again, then dO Δ^T, Aqk^T dO, the transposed solve, R Δ^T (c^2 dim_v each),
 *              the pairwise backward (4 c^2 dim_k) and six [c, dim_k] x [dim_k, dim_v]-sized
 *              products */
void kda_core_flops(const kda_dims *d, int algorithm, double *fwd, double *bwd)
{
    double heads = (double)d->B * (double)d->HV, dim_k = (double)d->dim_k, dim_v = (double)d->dim_v;
    if (algorithm == KDA_RECURRENT) {
        double t = heads * (double)d->T * dim_k * dim_v;
        *fwd = 7 * t;
        *bwd = 23 * t;
        return;
    }
    double f = 0, b = 0;
    for (int64_t t0 = 0; t0 < d->T; t0 += d->C) {
        double c = (double)(d->T - t0 < d->C ? d->T - t0 : d->C);
        f += 2 * c * c * (dim_k + dim_v) + 6 * c * dim_k * dim_v;
        b += 6 * c * c * dim_k + 5 * c * c * dim_v + 14 * c * dim_k * dim_v;
    }
    *fwd = heads * f;
    *bwd = heads * b;
}
