/* Where each saved tensor and scratch buffer lives (mla.h), computed once for memory() and for
 * every call, so the byte counts the engine plans with are the ones the kernels use. */
#include "mla.h"

typedef struct cursor {
    int64_t at;     /* next free element */
    int64_t align;  /* elements per 64 bytes, at least 16 */
} cursor;

static int64_t take(cursor *c, int64_t n)
{
    int64_t off = c->at;
    c->at += (n + c->align - 1) / c->align * c->align;
    return off;
}

void mla_layout_make(const mla *m, int64_t B, int64_t T, int slots, mla_layout *l)
{
    int64_t N = B * T, H = m->H, es = (int64_t)k3rt_dtype_size(m->dtype);
    int cuda = m->device != K3RT_DEVICE_CPU;
    /* Elements holding one per-row statistic: REAL on the CPU, f32 on CUDA. */
    int64_t st = cuda && es < 4 ? 4 / es : 1;
    int64_t blocks = (T + 31) / 32;
    cursor c = {0, 64 / es > 16 ? 64 / es : 16};
    l->qa = take(&c, m->rq ? N * m->rq : 0);
    l->q_rstd = take(&c, m->rq ? N * st : 0);
    l->qan = take(&c, m->rq ? N * m->rq : 0);
    l->part_end[MLA_SAVED_Q_LATENT] = c.at;
    l->c = take(&c, N * m->dc);
    l->kv_rstd = take(&c, N * st);
    l->part_end[MLA_SAVED_KV_LATENT] = c.at;
    l->chat = take(&c, N * m->dc);
    l->part_end[MLA_SAVED_KV_NORMED] = c.at;
    l->q = take(&c, N * H * m->dqk);
    l->k = take(&c, N * H * m->dqk);
    l->v = take(&c, N * H * m->dv);
    l->part_end[MLA_SAVED_QKV] = c.at;
    l->o = take(&c, N * H * m->dv);
    l->part_end[MLA_SAVED_OUT] = c.at;
    l->lse = take(&c, N * H * st);
    l->part_end[MLA_SAVED_LSE] = c.at;
    l->z = take(&c, m->gate ? N * H * m->dv : 0);
    l->saved = c.at;
    l->part_end[MLA_SAVED_GATE] = c.at;

    c.at = 0;
    l->f_qn = take(&c, N * H * m->dn);
    l->f_qr = take(&c, N * H * m->dr);
    l->f_kn = take(&c, N * H * m->dn);
    l->f_kr = take(&c, N * m->dr);
    l->f_og = take(&c, m->gate ? N * H * m->dv : 0);
    l->f_max = take(&c, (cuda ? B * H * blocks : B * H) * st);
    l->f_scratch = take(&c, (int64_t)slots * MLA_BLOCK * T);
    l->fwd = c.at;

    c.at = 0;
    l->b_g1 = take(&c, m->gate ? N * H * m->dv : 0);
    l->b_g2 = take(&c, N * H * m->dv);
    l->b_dq = take(&c, N * H * m->dqk);
    l->b_dk = take(&c, N * H * m->dqk);
    l->b_dv = take(&c, N * H * m->dv);
    int64_t post = c.at; /* b_dqn .. b_dc are written only after the attention core */
    l->b_dqn = take(&c, N * H * m->dn);
    l->b_dqr = take(&c, N * H * m->dr);
    l->b_dkn = take(&c, N * H * m->dn);
    l->b_dkr = take(&c, N * m->dr);
    l->b_dqin = take(&c, m->rq ? N * m->rq : 0);
    l->b_dqa = take(&c, m->rq ? N * m->rq : 0);
    l->b_dchat = take(&c, N * m->dc);
    l->b_dc = take(&c, N * m->dc);
    /* CUDA bf16: the non-deterministic attention backward's f32 dQ accumulator, dead once the
     * core has written dq; it shares the room of b_dqn .. b_dc. */
    cursor acc = {post, c.align};
    l->b_dqacc = take(&acc, cuda && es < 4 ? N * H * m->dqk * (4 / es) : 0);
    if (acc.at > c.at)
        c.at = acc.at;
    l->b_scratch = take(&c, (int64_t)slots * 2 * MLA_BLOCK * T);
    l->b_drow = take(&c, cuda ? N * H * st : 0);
    l->bwd = c.at;
    l->workspace = l->fwd > l->bwd ? l->fwd : l->bwd;
}
