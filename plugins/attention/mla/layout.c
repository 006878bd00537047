/* Where each saved tensor and scratch buffer lives (mla.h), computed once for memory() and for
 * every call, so the byte counts the engine plans with are the ones the kernels use. */
#include "mla.h"

/* Buffers start on 64-byte boundaries for either dtype. */
static int64_t take(int64_t *at, int64_t n)
{
    int64_t off = *at;
    *at += (n + 15) / 16 * 16;
    return off;
}

void mla_layout_make(const mla *m, int64_t B, int64_t T, int slots, mla_layout *l)
{
    int64_t N = B * T, H = m->H, at = 0;
    l->qa = take(&at, m->rq ? N * m->rq : 0);
    l->q_rstd = take(&at, m->rq ? N : 0);
    l->qan = take(&at, m->rq ? N * m->rq : 0);
    l->c = take(&at, N * m->dc);
    l->kv_rstd = take(&at, N);
    l->chat = take(&at, N * m->dc);
    l->q = take(&at, N * H * m->dqk);
    l->k = take(&at, N * H * m->dqk);
    l->v = take(&at, N * H * m->dv);
    l->o = take(&at, N * H * m->dv);
    l->lse = take(&at, N * H);
    l->z = take(&at, m->gate ? N * H * m->dv : 0);
    l->saved = at;

    at = 0;
    l->f_qn = take(&at, N * H * m->dn);
    l->f_qr = take(&at, N * H * m->dr);
    l->f_kn = take(&at, N * H * m->dn);
    l->f_kr = take(&at, N * m->dr);
    l->f_og = take(&at, m->gate ? N * H * m->dv : 0);
    l->f_max = take(&at, B * H);
    l->f_scratch = take(&at, (int64_t)slots * MLA_BLOCK * T);
    l->fwd = at;

    at = 0;
    l->b_g1 = take(&at, m->gate ? N * H * m->dv : 0);
    l->b_g2 = take(&at, N * H * m->dv);
    l->b_dq = take(&at, N * H * m->dqk);
    l->b_dk = take(&at, N * H * m->dqk);
    l->b_dv = take(&at, N * H * m->dv);
    l->b_dqn = take(&at, N * H * m->dn);
    l->b_dqr = take(&at, N * H * m->dr);
    l->b_dkn = take(&at, N * H * m->dn);
    l->b_dkr = take(&at, N * m->dr);
    l->b_dqin = take(&at, m->rq ? N * m->rq : 0);
    l->b_dqa = take(&at, m->rq ? N * m->rq : 0);
    l->b_dchat = take(&at, N * m->dc);
    l->b_dc = take(&at, N * m->dc);
    l->b_scratch = take(&at, (int64_t)slots * 2 * MLA_BLOCK * T);
    l->bwd = at;
    l->workspace = l->fwd > l->bwd ? l->fwd : l->bwd;
}
