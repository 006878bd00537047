/* The token loops of LatentMoE, written once over REAL and included by cpu.c (float,
 * double) with REAL and SUF(name) defined. The matrix products are core ops (moe.c);
 * what is here moves rows between token order and expert-grouped order and handles the
 * router. Shapes: N tokens, E experts, k slots per token, l latent width; pos[t, j] is the row
 * of (token t, slot j) in the grouped buffers. Each loop runs over a range of tokens, and every
 * per-token sum runs in slot order, so results are independent of the thread count. */
#include <string.h>

#include "latent_moe.h"

/* Tokens per parallel task: enough work to amortise a thread hand-off. */
#define LMOE_GRAIN 64

typedef struct SUF(route_ctx) {
    const REAL *s;
    const float *bias;
    int64_t E, k;
    int renormalize;
    REAL rscale;
    int32_t *sel;
    REAL *p;
} SUF(route_ctx);

/* Insertion into a descending list of k: experts arrive in ascending id, and a newcomer only
 * passes entries it strictly beats, so equal biased scores keep the lower id first. */
static void SUF(route_range)(void *ctx, int64_t t0, int64_t t1)
{
    const SUF(route_ctx) *c = ctx;
    int64_t E = c->E, k = c->k;
    for (int64_t t = t0; t < t1; t++) {
        const REAL *s = c->s + t * E;
        int32_t *sel = c->sel + t * k;
        int64_t n = 0;
        for (int64_t e = 0; e < E; e++) {
            REAL v = s[e] + (c->bias ? (REAL)c->bias[e] : (REAL)0);
            int64_t at = n < k ? n : k;
            while (at > 0) {
                int32_t o = sel[at - 1];
                REAL vo = s[o] + (c->bias ? (REAL)c->bias[o] : (REAL)0);
                if (!(v > vo))
                    break;
                at--;
            }
            if (at >= k)
                continue;
            int64_t last = n < k ? n : k - 1;
            for (int64_t j = last; j > at; j--)
                sel[j] = sel[j - 1];
            sel[at] = (int32_t)e;
            n += n < k;
        }
        REAL sum = 0;
        for (int64_t j = 0; j < k; j++)
            sum += s[sel[j]];
        REAL scale = c->renormalize ? c->rscale / (sum + (REAL)1e-20) : c->rscale;
        for (int64_t j = 0; j < k; j++)
            c->p[t * k + j] = scale * s[sel[j]];
    }
}

static void SUF(route)(k3rt_stream *st, const void *s, const float *bias, int64_t N, int64_t E,
                       int64_t k, int renormalize, double rscale, int32_t *sel, void *p)
{
    SUF(route_ctx) c = {s, bias, E, k, renormalize, (REAL)rscale, sel, p};
    k3rt_parallel_for(st, N, LMOE_GRAIN, SUF(route_range), &c);
}

/* Rows between token order and grouped order. */
typedef struct SUF(rows_ctx) {
    const REAL *src, *p, *ye;
    const int32_t *pos;
    int64_t k, l;
    REAL *dst, *dp;
} SUF(rows_ctx);

static void SUF(gather_range)(void *ctx, int64_t t0, int64_t t1)
{
    const SUF(rows_ctx) *c = ctx;
    for (int64_t t = t0; t < t1; t++)
        for (int64_t j = 0; j < c->k; j++)
            memcpy(c->dst + (int64_t)c->pos[t * c->k + j] * c->l, c->src + t * c->l,
                   (size_t)c->l * sizeof(REAL));
}

static void SUF(gather)(k3rt_stream *st, const void *c_, const int32_t *pos, int64_t N,
                        int64_t k, int64_t l, void *xe)
{
    SUF(rows_ctx) c = {.src = c_, .pos = pos, .k = k, .l = l, .dst = xe};
    k3rt_parallel_for(st, N, LMOE_GRAIN, SUF(gather_range), &c);
}

/* U[t] = sum_j p[t, j] ye[pos[t, j]] (or dc[t] = sum_j dxe[pos[t, j]] when p is NULL). */
static void SUF(sum_range)(void *ctx, int64_t t0, int64_t t1)
{
    const SUF(rows_ctx) *c = ctx;
    int64_t k = c->k, l = c->l;
    for (int64_t t = t0; t < t1; t++) {
        REAL *out = c->dst + t * l;
        for (int64_t i = 0; i < l; i++)
            out[i] = 0;
        for (int64_t j = 0; j < k; j++) {
            const REAL *row = c->src + (int64_t)c->pos[t * k + j] * l;
            REAL w = c->p ? c->p[t * k + j] : (REAL)1;
            for (int64_t i = 0; i < l; i++)
                out[i] += w * row[i];
        }
    }
}

static void SUF(combine)(k3rt_stream *st, const void *ye, const int32_t *pos, const void *p,
                         int64_t N, int64_t k, int64_t l, void *U)
{
    SUF(rows_ctx) c = {.src = ye, .p = p, .pos = pos, .k = k, .l = l, .dst = U};
    k3rt_parallel_for(st, N, LMOE_GRAIN, SUF(sum_range), &c);
}

static void SUF(scatter)(k3rt_stream *st, const void *dxe, const int32_t *pos, int64_t N,
                         int64_t k, int64_t l, void *dc)
{
    SUF(rows_ctx) c = {.src = dxe, .p = NULL, .pos = pos, .k = k, .l = l, .dst = dc};
    k3rt_parallel_for(st, N, LMOE_GRAIN, SUF(sum_range), &c);
}

/* dp[t, j] = dU[t] . ye[row] ;  dye[row] = p[t, j] dU[t] */
static void SUF(combine_bwd_range)(void *ctx, int64_t t0, int64_t t1)
{
    const SUF(rows_ctx) *c = ctx;
    int64_t k = c->k, l = c->l;
    for (int64_t t = t0; t < t1; t++) {
        const REAL *dU = c->src + t * l;
        for (int64_t j = 0; j < k; j++) {
            int64_t row = c->pos[t * k + j];
            const REAL *y = c->ye + row * l;
            REAL *dy = c->dst + row * l, w = c->p[t * k + j], dot = 0;
            for (int64_t i = 0; i < l; i++) {
                dot += dU[i] * y[i];
                dy[i] = w * dU[i];
            }
            c->dp[t * k + j] = dot;
        }
    }
}

static void SUF(combine_bwd)(k3rt_stream *st, const void *dU, const void *ye,
                             const int32_t *pos, const void *p, int64_t N, int64_t k, int64_t l,
                             void *dp, void *dye)
{
    SUF(rows_ctx) c = {.src = dU, .p = p, .ye = ye, .pos = pos, .k = k, .l = l, .dst = dye,
                       .dp = dp};
    k3rt_parallel_for(st, N, LMOE_GRAIN, SUF(combine_bwd_range), &c);
}

/* Router backward per token (spec §1), with S = sum of the chosen scores + 1e-20:
 *   renormalised gates p_j = r s_j / S:  ds_l = (r / S) (dp_l - sum_j (s_j / S) dp_j)
 *   plain gates        p_j = r s_j:      ds_l = r dp_l
 * over the chosen l (0 elsewhere); then the balancer's d_scores is added and
 * dz = s (1 - s) ds. */
typedef struct SUF(router_ctx) {
    const REAL *s, *dp;
    const int32_t *sel;
    const float *d_scores;
    int64_t E, k;
    int renormalize;
    REAL rscale;
    REAL *dz;
} SUF(router_ctx);

static void SUF(router_bwd_range)(void *ctx, int64_t t0, int64_t t1)
{
    const SUF(router_ctx) *c = ctx;
    int64_t E = c->E, k = c->k;
    for (int64_t t = t0; t < t1; t++) {
        const REAL *s = c->s + t * E, *dp = c->dp + t * k;
        const int32_t *sel = c->sel + t * k;
        REAL *dz = c->dz + t * E;
        for (int64_t e = 0; e < E; e++)
            dz[e] = c->d_scores ? (REAL)c->d_scores[t * E + e] : (REAL)0;
        REAL scale = c->rscale, corr = 0;
        if (c->renormalize) {
            REAL sum = 0;
            for (int64_t j = 0; j < k; j++)
                sum += s[sel[j]];
            sum += (REAL)1e-20;
            for (int64_t j = 0; j < k; j++)
                corr += s[sel[j]] / sum * dp[j];
            scale /= sum;
        }
        for (int64_t j = 0; j < k; j++)
            dz[sel[j]] += scale * (dp[j] - corr);
        for (int64_t e = 0; e < E; e++)
            dz[e] *= s[e] * ((REAL)1 - s[e]);
    }
}

static void SUF(router_bwd)(k3rt_stream *st, const void *s, const int32_t *sel, const void *dp,
                            const float *d_scores, int64_t N, int64_t E, int64_t k,
                            int renormalize, double rscale, void *dz)
{
    SUF(router_ctx) c = {s, dp, sel, d_scores, E, k, renormalize, (REAL)rscale, dz};
    k3rt_parallel_for(st, N, LMOE_GRAIN, SUF(router_bwd_range), &c);
}

const lmoe_kernels SUF(lmoe_kernels) = {
    .route = SUF(route),
    .gather = SUF(gather),
    .combine = SUF(combine),
    .combine_bwd = SUF(combine_bwd),
    .scatter = SUF(scatter),
    .router_bwd = SUF(router_bwd),
};
