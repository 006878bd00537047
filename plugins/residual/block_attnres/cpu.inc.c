/* One AttnRes mixing op on the CPU, written once over REAL and included by cpu.c (float,
 * double) with REAL, DTYPE, EXP, SQRT, EPSILON and SUF(name) defined. Per token t, with
 * sources v_0..v_{n-1} (rows of [N, d]), pseudo-query w and key-norm gain gamma (q = gamma*w):
 *
 *   forward   rho_i = 1 / sqrt(mean(v_i^2) + eps)     key RMSNorm scale (keys only)
 *             z_i = rho_i (q . v_i)                   no 1/sqrt(d): the paper's logit
 *             alpha = softmax(z)                      max-subtracted, in REAL (fp32 in runs)
 *             h = sum_i alpha_i v_i                   values are the raw sources
 *   backward  da_i = dh . v_i ;  dz_i = alpha_i (da_i - sum_j alpha_j da_j)
 *             dv_i += alpha_i dh + dz_i rho_i (q - (z_i / d) rho_i v_i)
 *             dq = sum_{t,i} dz_i rho_i v_i ;  dw += dq * gamma ;  dgamma += dq * w
 *
 * Cached for the backward: alpha [N, n] and, for the last source (the partial sum), rho and z
 * [N]. Tokens are independent and run in parallel; dq is a sum over tokens, done as one
 * product per source (c^T V_i) so no thread reduces into shared memory.
 */
#include <math.h>
#include <string.h>

#include "attnres.h"

enum { SUF(GRAIN) = 16 };  /* tokens per parallel chunk: a token costs ~6 n d FLOPs */

/* In 8 interleaved partial sums added in a fixed order: one running sum waits on every add,
 * the lanes vectorise. The result depends on d only, never on threads or the CPU. */
static inline REAL SUF(dot)(const REAL *a, const REAL *b, int64_t d)
{
    REAL p[8] = {0};
    int64_t k = 0;
    for (; k + 8 <= d; k += 8)
        for (int l = 0; l < 8; l++)
            p[l] += a[k + l] * b[k + l];
    for (; k < d; k++)
        p[0] += a[k] * b[k];
    return ((p[0] + p[1]) + (p[2] + p[3])) + ((p[4] + p[5]) + (p[6] + p[7]));
}

static inline const REAL *SUF(row)(const ar_op *op, int i, int64_t t)
{
    return (const REAL *)op->v[i] + t * op->d;
}

/* rho and z of source i at token t. */
static inline void SUF(key)(const ar_op *op, int i, int64_t t, REAL *rho, REAL *z)
{
    const REAL *v = SUF(row)(op, i, t);
    REAL r = (REAL)1 / SQRT(SUF(dot)(v, v, op->d) / (REAL)op->d + (REAL)op->eps);
    *rho = r;
    *z = r * SUF(dot)((const REAL *)op->q, v, op->d);
}

static void SUF(make_q)(const ar_op *op)
{
    const REAL *w = op->w, *g = op->gamma;
    REAL *q = op->q;
    for (int64_t k = 0; k < op->d; k++)
        q[k] = g[k] * w[k];
}

typedef struct SUF(fwd_ctx) {
    const ar_op *op;
    REAL *h;
} SUF(fwd_ctx);

static void SUF(fwd_rows)(void *ctx, int64_t t0, int64_t t1)
{
    const SUF(fwd_ctx) *c = ctx;
    const ar_op *op = c->op;
    const int n = op->n;
    const int64_t d = op->d;
    for (int64_t t = t0; t < t1; t++) {
        REAL *a = (REAL *)op->alpha + t * n, zmax = -INFINITY, rho, z, sum = 0;
        for (int i = 0; i < n; i++) {
            SUF(key)(op, i, t, &rho, &z);
            a[i] = z;
            zmax = z > zmax ? z : zmax;
            if (i == n - 1 && op->rho_last) {
                ((REAL *)op->rho_last)[t] = rho;
                ((REAL *)op->z_last)[t] = z;
            }
        }
        for (int i = 0; i < n; i++) {
            a[i] = EXP(a[i] - zmax);
            sum += a[i];
        }
        for (int i = 0; i < n; i++)
            a[i] /= sum;
        REAL *h = c->h + t * d;
        const REAL *v = SUF(row)(op, 0, t);
        for (int64_t k = 0; k < d; k++)
            h[k] = a[0] * v[k];
        for (int i = 1; i < n; i++) {
            v = SUF(row)(op, i, t);
            for (int64_t k = 0; k < d; k++)
                h[k] += a[i] * v[k];
        }
    }
}

int SUF(attnres_fwd)(const ar_op *op, void *h, k3rt_error *err)
{
    (void)err;
    SUF(make_q)(op);
    SUF(fwd_ctx) c = {op, h};
    k3rt_parallel_for(op->stream, op->N, SUF(GRAIN), SUF(fwd_rows), &c);
    return K3RT_OK;
}

typedef struct SUF(bwd_ctx) {
    const ar_op *op;
    const REAL *dh;
    void *const *dv;
    REAL *c;
} SUF(bwd_ctx);

static void SUF(bwd_rows)(void *ctx, int64_t t0, int64_t t1)
{
    const SUF(bwd_ctx) *b = ctx;
    const ar_op *op = b->op;
    const int n = op->n;
    const int64_t d = op->d;
    const REAL *q = op->q;
    for (int64_t t = t0; t < t1; t++) {
        const REAL *a = (const REAL *)op->alpha + t * n, *dh = b->dh + t * d;
        REAL *c = b->c + t * n, hd = 0;
        for (int i = 0; i < n; i++) {
            c[i] = SUF(dot)(dh, SUF(row)(op, i, t), d);  /* da_i */
            hd += a[i] * c[i];
        }
        for (int i = 0; i < n; i++) {
            REAL dz = a[i] * (c[i] - hd), rho, z;
            if (i == n - 1 && op->rho_last) {
                rho = ((const REAL *)op->rho_last)[t];
                z = ((const REAL *)op->z_last)[t];
            } else {
                SUF(key)(op, i, t, &rho, &z);
            }
            c[i] = dz * rho;  /* dq's weight of v_i at token t */
            if (!b->dv[i])
                continue;
            REAL *dv = (REAL *)b->dv[i] + t * d, kq = dz * rho, kv = -dz * rho * rho * z / (REAL)d;
            const REAL *v = SUF(row)(op, i, t);
            for (int64_t k = 0; k < d; k++)
                dv[k] += a[i] * dh[k] + kq * q[k] + kv * v[k];
        }
    }
}

int SUF(attnres_bwd)(const ar_op *op, const void *dh, void *const *dv, void *dw, void *dgamma,
                     void *c, void *dq, k3rt_error *err)
{
    SUF(make_q)(op);
    SUF(bwd_ctx) b = {op, dh, dv, c};
    k3rt_parallel_for(op->stream, op->N, SUF(GRAIN), SUF(bwd_rows), &b);
    for (int i = 0; i < op->n; i++)
        K3RT_TRY(k3rt_gemm(op->stream, DTYPE, 1, 0, 1, op->d, op->N, 1.0, (REAL *)c + i, op->n,
                           op->v[i], op->d, i ? 1.0 : 0.0, dq, op->d, err));
    const REAL *w = op->w, *g = op->gamma, *gq = dq;
    REAL *gw = dw, *gg = dgamma;
    for (int64_t k = 0; k < op->d; k++) {
        gw[k] += gq[k] * g[k];
        gg[k] += gq[k] * w[k];
    }
    return K3RT_OK;
}

typedef struct SUF(partial_ctx) {
    const ar_op *op;
    const REAL *h;
    REAL *p;
} SUF(partial_ctx);

static void SUF(partial_rows)(void *ctx, int64_t t0, int64_t t1)
{
    const SUF(partial_ctx) *c = ctx;
    const ar_op *op = c->op;
    const int n = op->n;
    const int64_t d = op->d;
    for (int64_t t = t0; t < t1; t++) {
        const REAL *a = (const REAL *)op->alpha + t * n, *h = c->h + t * d;
        REAL *p = c->p + t * d;
        if (!(a[n - 1] > EPSILON)) {
            memset(p, 0, (size_t)d * sizeof *p);
            continue;
        }
        memcpy(p, h, (size_t)d * sizeof *p);
        for (int i = 0; i < n - 1; i++) {
            const REAL *v = SUF(row)(op, i, t);
            for (int64_t k = 0; k < d; k++)
                p[k] -= a[i] * v[k];
        }
        REAL inv = (REAL)1 / a[n - 1];
        for (int64_t k = 0; k < d; k++)
            p[k] *= inv;
    }
}

int SUF(attnres_partial)(const ar_op *op, const void *h, void *p, k3rt_error *err)
{
    (void)err;
    SUF(partial_ctx) c = {op, h, p};
    k3rt_parallel_for(op->stream, op->N, SUF(GRAIN), SUF(partial_rows), &c);
    return K3RT_OK;
}
