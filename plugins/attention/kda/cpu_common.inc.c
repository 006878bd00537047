/* Pieces every file of the CPU reference uses, for one REAL (cpu.c defines REAL, SUF,
 * KDA_DTYPE, EXP, SQRT, LOG1P): the view of one (sequence, value head), a matrix-product
 * wrapper usable inside parallel tasks, a parallel-for over rows, and small row helpers. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kda.h"

#ifndef KDA_ROUND
/* Scratch buffers start on 64-byte boundaries for either dtype. */
#define KDA_ROUND(n) (((n) + 15) / 16 * 16)
#define KDA_MIN(a, b) ((a) < (b) ? (a) : (b))
#endif

/* One (sequence b, value head j) of the recurrence: pointers at token 0, token strides. */
typedef struct SUF(kda_head) {
    const REAL *q, *k;        /* qk head j / (HV/H); stride sq = H*dim_k */
    const REAL *v, *g, *beta; /* strides sv = HV*dim_v, sg = HV*dim_k, sb = HV */
    const REAL *s0;           /* [dim_k, dim_v] or NULL */
    REAL *o;                  /* stride sv */
    REAL *states;             /* [NT, dim_k, dim_v] state at every chunk start */
    REAL *s_final;            /* [dim_k, dim_v] or NULL */
    const REAL *d_o;          /* stride sv */
    const REAL *ds_final;     /* [dim_k, dim_v] or NULL */
    REAL *dq, *dk;            /* stride sdq: this value head's share of the q/k gradients */
    REAL *dv, *dg, *dbeta;    /* strides sv, sg, sb */
    REAL *ds0;                /* [dim_k, dim_v] or NULL */
    int64_t sq, sv, sg, sb, sdq;
} SUF(kda_head);

/* k3rt_gemm from inside a parallel task: the first failure is kept in rc and later products
 * are skipped, so the caller reports it once after the parallel region. */
typedef struct SUF(kda_mm) {
    k3rt_stream *s;
    int rc;
} SUF(kda_mm);

static void SUF(mm)(SUF(kda_mm) *c, int ta, int tb, int64_t m, int64_t n, int64_t k, REAL alpha,
                    const REAL *a, int64_t lda, const REAL *b, int64_t ldb, REAL beta, REAL *out,
                    int64_t ldc)
{
    if (c->rc || m <= 0 || n <= 0)
        return;
    if (k <= 0) { /* an empty sum: C = beta C */
        for (int64_t i = 0; i < m; i++)
            for (int64_t j = 0; j < n; j++)
                out[i * ldc + j] = beta == 0 ? 0 : beta * out[i * ldc + j];
        return;
    }
    k3rt_error e;
    int rc = k3rt_gemm(c->s, KDA_DTYPE, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, out, ldc,
                       &e);
    if (rc)
        c->rc = rc;
}

/* Row-parallel elementwise kernels: fn(ctx, begin, end) over [0, n). */
static void SUF(par)(k3rt_stream *s, int64_t n, k3rt_range_fn fn, void *ctx)
{
    k3rt_parallel_for(s, n, 64, fn, ctx);
}

static REAL SUF(dot)(const REAL *a, const REAL *b, int64_t n)
{
    REAL acc = 0;
    for (int64_t i = 0; i < n; i++)
        acc += a[i] * b[i];
    return acc;
}

/* y += alpha x */
static void SUF(axpy)(REAL alpha, const REAL *x, REAL *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] += alpha * x[i];
}

static REAL SUF(sigmoid)(REAL x)
{
    return x >= 0 ? (REAL)1 / ((REAL)1 + EXP(-x)) : EXP(x) / ((REAL)1 + EXP(x));
}

/* log(1 + e^x) without overflow (the exact form, not torch's identity above 20). */
static REAL SUF(softplus)(REAL x)
{
    return (x > 0 ? x : 0) + LOG1P(EXP(-(x > 0 ? x : -x)));
}
