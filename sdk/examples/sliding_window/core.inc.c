/* The sliding-window attention core, written once over REAL and included by core_f32.c and
 * core_f64.c with REAL, EXP and SUF(name) defined. Forward and backward side by side; each
 * (sequence, head) pair is independent, so both run k3rt_parallel_for over the B*H pairs and
 * every thread writes only its own pair's rows (no atomics: bitwise reproducible).
 *
 * Shapes: q, k, v, o, dO, dq, dk, dv are [B*T, H*D]: row b*T + t, columns h*D .. h*D + D - 1.
 * p is [B, H, T, L] with L = min(window, T): p[b, h, t, j] is the weight of key u = t - j
 * (j = 0 is the token itself); entries with u < 0 are zero. dp, the backward's scratch, has
 * p's shape. */
#include <string.h>

#include "swa.h"

typedef struct SUF(core_ctx) {
    const swa *m;
    int64_t T, L;
    const REAL *q, *k, *v, *p, *dO;
    REAL *o, *pw, *dq, *dk, *dv, *dp;
} SUF(core_ctx);

/* forward of pairs [begin, end): p_t = softmax(scale q_t . k_u), o_t = sum_u p_tu v_u */
static void SUF(fwd_pairs)(void *arg, int64_t begin, int64_t end)
{
    const SUF(core_ctx) *c = arg;
    const swa *m = c->m;
    const int64_t T = c->T, L = c->L, D = m->D, HD = m->H * m->D;
    for (int64_t bh = begin; bh < end; bh++) {
        int64_t b = bh / m->H, h = bh % m->H;
        for (int64_t t = 0; t < T; t++) {
            const REAL *qt = c->q + (b * T + t) * HD + h * D;
            REAL *pt = c->pw + (bh * T + t) * L, *ot = c->o + (b * T + t) * HD + h * D;
            int64_t n = t + 1 < L ? t + 1 : L;  /* keys t, t-1, ..., t-n+1 */
            REAL mx = 0;
            for (int64_t j = 0; j < n; j++) {
                const REAL *ku = c->k + (b * T + t - j) * HD + h * D;
                REAL s = 0;
                for (int64_t i = 0; i < D; i++)
                    s += qt[i] * ku[i];
                pt[j] = s * (REAL)m->scale;
                mx = j == 0 || pt[j] > mx ? pt[j] : mx;
            }
            REAL sum = 0;
            for (int64_t j = 0; j < n; j++) {
                pt[j] = EXP(pt[j] - mx);
                sum += pt[j];
            }
            memset(ot, 0, (size_t)D * sizeof *ot);
            for (int64_t j = 0; j < n; j++) {
                pt[j] /= sum;
                const REAL *vu = c->v + (b * T + t - j) * HD + h * D;
                for (int64_t i = 0; i < D; i++)
                    ot[i] += pt[j] * vu[i];
            }
            for (int64_t j = n; j < L; j++)
                pt[j] = 0;
        }
    }
}

/* backward of pairs [begin, end):
 *   dp_tu = dO_t . v_u            dv_u += p_tu dO_t
 *   ds_tu = p_tu (dp_tu - sum_u' p_tu' dp_tu')
 *   dq_t  = scale sum_u ds_tu k_u  dk_u += scale ds_tu q_t */
static void SUF(bwd_pairs)(void *arg, int64_t begin, int64_t end)
{
    const SUF(core_ctx) *c = arg;
    const swa *m = c->m;
    const int64_t T = c->T, L = c->L, D = m->D, HD = m->H * m->D;
    const REAL scale = (REAL)m->scale;
    for (int64_t bh = begin; bh < end; bh++) {
        int64_t b = bh / m->H, h = bh % m->H;
        for (int64_t t = 0; t < T; t++) {
            REAL *dqt = c->dq + (b * T + t) * HD + h * D;
            memset(dqt, 0, (size_t)D * sizeof *dqt);
            memset(c->dk + (b * T + t) * HD + h * D, 0, (size_t)D * sizeof(REAL));
            memset(c->dv + (b * T + t) * HD + h * D, 0, (size_t)D * sizeof(REAL));
        }
        for (int64_t t = 0; t < T; t++) {
            const REAL *qt = c->q + (b * T + t) * HD + h * D;
            const REAL *dot = c->dO + (b * T + t) * HD + h * D;
            const REAL *pt = c->p + (bh * T + t) * L;
            REAL *dqt = c->dq + (b * T + t) * HD + h * D;
            int64_t n = t + 1 < L ? t + 1 : L;
            REAL *dp = c->dp + (bh * T + t) * L, dot_pdp = 0;
            for (int64_t j = 0; j < n; j++) {
                const REAL *vu = c->v + (b * T + t - j) * HD + h * D;
                REAL *dvu = c->dv + (b * T + t - j) * HD + h * D;
                REAL s = 0;
                for (int64_t i = 0; i < D; i++) {
                    s += dot[i] * vu[i];
                    dvu[i] += pt[j] * dot[i];
                }
                dp[j] = s;
                dot_pdp += pt[j] * s;
            }
            for (int64_t j = 0; j < n; j++) {
                REAL ds = pt[j] * (dp[j] - dot_pdp) * scale;
                const REAL *ku = c->k + (b * T + t - j) * HD + h * D;
                REAL *dku = c->dk + (b * T + t - j) * HD + h * D;
                for (int64_t i = 0; i < D; i++) {
                    dqt[i] += ds * ku[i];
                    dku[i] += ds * qt[i];
                }
            }
        }
    }
}

int SUF(swa_core_fwd)(const swa *m, k3rt_stream *s, int64_t B, int64_t T, const REAL *q,
                      const REAL *k, const REAL *v, REAL *o, REAL *p, k3rt_error *err)
{
    (void)err;
    SUF(core_ctx) c = {m, T, m->window < T ? m->window : T, q, k, v, NULL, NULL, o, p,
                       NULL, NULL, NULL, NULL};
    k3rt_parallel_for(s, B * m->H, 1, SUF(fwd_pairs), &c);
    return K3RT_OK;
}

int SUF(swa_core_bwd)(const swa *m, k3rt_stream *s, int64_t B, int64_t T, const REAL *q,
                      const REAL *k, const REAL *v, const REAL *p, const REAL *dO, REAL *dq,
                      REAL *dk, REAL *dv, REAL *dp, k3rt_error *err)
{
    (void)err;
    SUF(core_ctx) c = {m, T, m->window < T ? m->window : T, q, k, v, p, dO, NULL, NULL,
                       dq, dk, dv, dp};
    k3rt_parallel_for(s, B * m->H, 1, SUF(bwd_pairs), &c);
    return K3RT_OK;
}
