/* CPU reference kernels, written once over REAL; included by cpu_ops_f32.c / cpu_ops_f64.c
 * with REAL, SUF(name) and the math functions of that precision (R_EXP, R_TANH, R_TANH_DIV,
 * R_SIGMOID_N, R_LOG1P, R_SQRT) defined, so float runs use float math and vectorise. Shapes
 * in comments are (rows, cols). */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <k3rt/ops.h>

/* sum_j a[j] b[j] in double, in RMS_LANES interleaved partial sums added in a fixed order: a
 * single running sum waits on each add (4 cycles), the lanes vectorise. The result depends
 * on n only, never on threads or the CPU. */
#define RMS_LANES 4
static inline double SUF(dot_lanes)(const REAL *a, const REAL *b, int64_t n)
{
    double p[RMS_LANES] = {0};
    int64_t j = 0;
    for (; j + RMS_LANES <= n; j += RMS_LANES)
        for (int l = 0; l < RMS_LANES; l++)
            p[l] += (double)a[j + l] * (double)b[j + l];
    for (; j < n; j++)
        p[0] += (double)a[j] * (double)b[j];
    return (p[0] + p[1]) + (p[2] + p[3]);
}

/* RMSNorm over rows of x(n,d): y = x * rstd * gain, rstd = 1/sqrt(mean(x^2) + eps). */
void SUF(cpu_rmsnorm_fwd)(const REAL *x, const REAL *gain, REAL *y, REAL *rstd, int64_t n,
                          int64_t d, double eps, int threads)
{
#pragma omp parallel for num_threads(threads) if (n * d > 32768) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const REAL *xi = x + i * d;
        REAL *yi = y + i * d;
        double ss = SUF(dot_lanes)(xi, xi, d);
        REAL r = (REAL)(1.0 / sqrt(ss / (double)d + eps));
        if (rstd)
            rstd[i] = r;
        for (int64_t j = 0; j < d; j++)
            yi[j] = xi[j] * r * (gain ? gain[j] : (REAL)1);
    }
}

/* u = gain * dy;  dx = r * u - r^3 * x * (u . x) / d;  dgain += sum_rows dy * x * r */
void SUF(cpu_rmsnorm_bwd)(const REAL *x, const REAL *gain, const REAL *rstd, const REAL *dy,
                          REAL *dx, REAL *dgain, int64_t n, int64_t d, int acc, int threads)
{
    if (dx) {
#pragma omp parallel for num_threads(threads) if (n * d > 32768) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            const REAL *xi = x + i * d, *dyi = dy + i * d;
            REAL *dxi = dx + i * d;
            double r = rstd[i], dot;
            if (gain) {
                double p[RMS_LANES] = {0};
                int64_t j = 0;
                for (; j + RMS_LANES <= d; j += RMS_LANES)
                    for (int l = 0; l < RMS_LANES; l++)
                        p[l] += (double)(gain[j + l] * dyi[j + l]) * (double)xi[j + l];
                for (; j < d; j++)
                    p[0] += (double)(gain[j] * dyi[j]) * (double)xi[j];
                dot = (p[0] + p[1]) + (p[2] + p[3]);
            } else {
                dot = SUF(dot_lanes)(dyi, xi, d);
            }
            double c = r * r * r * dot / (double)d;
            for (int64_t j = 0; j < d; j++) {
                double u = gain ? (double)gain[j] * dyi[j] : (double)dyi[j];
                REAL v = (REAL)(r * u - c * (double)xi[j]);
                dxi[j] = acc ? dxi[j] + v : v;
            }
        }
    }
    if (dgain) {
        int64_t blocks = (n + CPU_REDUCE_BLOCK - 1) / CPU_REDUCE_BLOCK;
        REAL *part = calloc((size_t)(blocks * d), sizeof(REAL));
#pragma omp parallel for num_threads(threads) if (n * d > 32768) schedule(static)
        for (int64_t b = 0; b < blocks; b++) {
            int64_t end = (b + 1) * CPU_REDUCE_BLOCK < n ? (b + 1) * CPU_REDUCE_BLOCK : n;
            REAL *p = part + b * d;
            for (int64_t i = b * CPU_REDUCE_BLOCK; i < end; i++)
                for (int64_t j = 0; j < d; j++)
                    p[j] += dy[i * d + j] * x[i * d + j] * rstd[i];
        }
        for (int64_t b = 0; b < blocks; b++)
            for (int64_t j = 0; j < d; j++)
                dgain[j] += part[b * d + j];
        free(part);
    }
}

void SUF(cpu_embedding_fwd)(const REAL *table, const int32_t *tok, REAL *out, int64_t n,
                            int64_t d, int threads)
{
#pragma omp parallel for num_threads(threads) if (n * d > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++)
        memcpy(out + i * d, table + (int64_t)tok[i] * d, (size_t)d * sizeof(REAL));
}

/* Threads own disjoint column ranges and walk the tokens in order: deterministic. */
void SUF(cpu_embedding_bwd)(const int32_t *tok, const REAL *dout, REAL *dtable, int64_t n,
                            int64_t d, int threads)
{
#pragma omp parallel num_threads(threads) if (n * d > 65536)
    {
        int t = 0, nt = 1;
#ifdef _OPENMP
        t = omp_get_thread_num();
        nt = omp_get_num_threads();
#endif
        int64_t j0 = d * t / nt, j1 = d * (t + 1) / nt;
        for (int64_t i = 0; i < n; i++) {
            REAL *row = dtable + (int64_t)tok[i] * d;
            const REAL *g = dout + i * d;
            for (int64_t j = j0; j < j1; j++)
                row[j] += g[j];
        }
    }
}

void SUF(cpu_xent_fwd)(const REAL *logits, const int32_t *tgt, REAL *loss, REAL *lse,
                       int64_t n, int64_t v, int threads)
{
#pragma omp parallel for num_threads(threads) if (n * v > 32768) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const REAL *li = logits + i * v;
        REAL m = li[0];
        for (int64_t j = 1; j < v; j++)
            if (li[j] > m)
                m = li[j];
        double s = 0.0;
        for (int64_t j = 0; j < v; j++)
            s += (double)R_EXP(li[j] - m);
        double l = (double)m + log(s);
        if (lse)
            lse[i] = (REAL)l;
        if (loss)
            loss[i] = tgt[i] < 0 ? (REAL)0 : (REAL)(l - (double)li[tgt[i]]);
    }
}

void SUF(cpu_xent_bwd)(const REAL *logits, const int32_t *tgt, const REAL *lse, double scale,
                       REAL *dlogits, int64_t n, int64_t v, int threads)
{
#pragma omp parallel for num_threads(threads) if (n * v > 32768) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        const REAL *li = logits + i * v;
        REAL *di = dlogits + i * v;
        if (tgt[i] < 0) {
            for (int64_t j = 0; j < v; j++)
                di[j] = 0;
            continue;
        }
        REAL l = lse[i], sc = (REAL)scale;
        for (int64_t j = 0; j < v; j++)
            di[j] = R_EXP(li[j] - l) * sc;
        di[tgt[i]] -= (REAL)scale;
    }
}

static inline REAL SUF(sigmoid)(REAL x)
{
    /* Branch on the sign so exp never overflows. */
    REAL e = R_EXP(x >= 0 ? -x : x);
    return x >= 0 ? (REAL)1 / ((REAL)1 + e) : e / ((REAL)1 + e);
}

static inline REAL SUF(act_value)(int act, REAL x)
{
    switch (act) {
    case K3RT_ACT_SILU: return x * SUF(sigmoid)(x);
    case K3RT_ACT_SIGMOID: return SUF(sigmoid)(x);
    case K3RT_ACT_SOFTPLUS:
        return x > 0 ? x + R_LOG1P(R_EXP(-x)) : R_LOG1P(R_EXP(x));
    case K3RT_ACT_TANH: return R_TANH(x);
    case K3RT_ACT_RELU: return x > 0 ? x : 0;
    default: return x;
    }
}

static inline REAL SUF(act_slope)(int act, REAL x)
{
    switch (act) {
    case K3RT_ACT_SILU: {
        REAL s = SUF(sigmoid)(x);
        return s * ((REAL)1 + x * ((REAL)1 - s));
    }
    case K3RT_ACT_SIGMOID: {
        REAL s = SUF(sigmoid)(x);
        return s * ((REAL)1 - s);
    }
    case K3RT_ACT_SOFTPLUS: return SUF(sigmoid)(x);
    case K3RT_ACT_TANH: {
        REAL t = R_TANH(x);
        return (REAL)1 - t * t;
    }
    case K3RT_ACT_RELU: return x > 0 ? (REAL)1 : (REAL)0;
    default: return (REAL)1;
    }
}

static inline void SUF(sigmoid_n)(const REAL *x, REAL *y, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = SUF(sigmoid)(x[i]);
}

/* Sigmoid and SiLU in blocks: a block's sigmoids first, as one vectorised pass (R_SIGMOID_N),
 * then act_value's / act_slope's products. */
#define ACT_BLOCK 256

static int SUF(act_by_sigmoid)(int act)
{
    return act == K3RT_ACT_SIGMOID || act == K3RT_ACT_SILU;
}

void SUF(cpu_act_fwd)(int act, const REAL *x, REAL *y, int64_t n, int threads)
{
    if (!SUF(act_by_sigmoid)(act)) {
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++)
            y[i] = SUF(act_value)(act, x[i]);
        return;
    }
    int64_t blocks = (n + ACT_BLOCK - 1) / ACT_BLOCK;
    int silu = act == K3RT_ACT_SILU;
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
    for (int64_t bk = 0; bk < blocks; bk++) {
        int64_t i0 = bk * ACT_BLOCK, len = n - i0 < ACT_BLOCK ? n - i0 : ACT_BLOCK;
        REAL s[ACT_BLOCK];
        R_SIGMOID_N(x + i0, s, len);
        const REAL *xb = x + i0;
        REAL *yb = y + i0;
#pragma omp simd
        for (int64_t j = 0; j < len; j++)
            yb[j] = silu ? xb[j] * s[j] : s[j];
    }
}

void SUF(cpu_act_bwd)(int act, const REAL *x, const REAL *dy, REAL *dx, int64_t n, int acc,
                      int threads)
{
    if (!SUF(act_by_sigmoid)(act)) {
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
        for (int64_t i = 0; i < n; i++) {
            REAL v = dy[i] * SUF(act_slope)(act, x[i]);
            dx[i] = acc ? dx[i] + v : v;
        }
        return;
    }
    int64_t blocks = (n + ACT_BLOCK - 1) / ACT_BLOCK;
    int silu = act == K3RT_ACT_SILU;
    const REAL one = 1;
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
    for (int64_t bk = 0; bk < blocks; bk++) {
        int64_t i0 = bk * ACT_BLOCK, len = n - i0 < ACT_BLOCK ? n - i0 : ACT_BLOCK;
        REAL s[ACT_BLOCK];
        R_SIGMOID_N(x + i0, s, len);
        const REAL *xb = x + i0, *dyb = dy + i0;
        REAL *dxb = dx + i0;
#pragma omp simd
        for (int64_t j = 0; j < len; j++) {
            REAL slope = silu ? s[j] * (one + xb[j] * (one - s[j])) : s[j] * (one - s[j]);
            REAL v = dyb[j] * slope;
            dxb[j] = acc ? dxb[j] + v : v;
        }
    }
}

/* SwiGLU: a = silu(g), b = u.  SiTU: a = b1 tanh(g/b1) sigmoid(g), b = b2 tanh(u/b2).
 * Sigmoid: a = sigmoid(g), b = u.
 * In blocks: a block's sigmoid and tanh first, each as one vectorised pass (R_SIGMOID_N,
 * R_TANH_DIV), then the products. */
#define GLU_BLOCK 256

/* The transcendentals of elements i0 .. i0 + len: sg = sigmoid(g), and for SiTU
 * t1 = tanh(g / b1), t2 = tanh(u / b2). */
static void SUF(glu_block)(int glu, const REAL *g, const REAL *u, int64_t i0, int64_t len,
                           double b1, double b2, REAL *sg, REAL *t1, REAL *t2)
{
    R_SIGMOID_N(g + i0, sg, len);
    if (glu == K3RT_GLU_SITU) {
        R_TANH_DIV(g + i0, t1, len, (REAL)b1);
        R_TANH_DIV(u + i0, t2, len, (REAL)b2);
    }
}

void SUF(cpu_glu_fwd)(int glu, const REAL *g, const REAL *u, REAL *out, int64_t n, double b1,
                      double b2, int threads)
{
    int64_t blocks = (n + GLU_BLOCK - 1) / GLU_BLOCK;
    const REAL B1 = (REAL)b1, B2 = (REAL)b2;
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
    for (int64_t bk = 0; bk < blocks; bk++) {
        int64_t i0 = bk * GLU_BLOCK, len = n - i0 < GLU_BLOCK ? n - i0 : GLU_BLOCK;
        REAL sg[GLU_BLOCK], t1[GLU_BLOCK], t2[GLU_BLOCK];
        SUF(glu_block)(glu, g, u, i0, len, b1, b2, sg, t1, t2);
        REAL *o = out + i0;
        if (glu == K3RT_GLU_SITU) {
#pragma omp simd
            for (int64_t j = 0; j < len; j++)
                o[j] = (B1 * t1[j] * sg[j]) * (B2 * t2[j]);
        } else if (glu == K3RT_GLU_SIGMOID) {
            const REAL *ub = u + i0;
#pragma omp simd
            for (int64_t j = 0; j < len; j++)
                o[j] = sg[j] * ub[j];
        } else {
            const REAL *gb = g + i0, *ub = u + i0;
#pragma omp simd
            for (int64_t j = 0; j < len; j++)
                o[j] = gb[j] * sg[j] * ub[j];
        }
    }
}

void SUF(cpu_glu_bwd)(int glu, const REAL *g, const REAL *u, const REAL *dout, REAL *dg,
                      REAL *du, int64_t n, double b1, double b2, int threads)
{
    int64_t blocks = (n + GLU_BLOCK - 1) / GLU_BLOCK;
    const REAL B1 = (REAL)b1, B2 = (REAL)b2, one = 1;
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
    for (int64_t bk = 0; bk < blocks; bk++) {
        int64_t i0 = bk * GLU_BLOCK, len = n - i0 < GLU_BLOCK ? n - i0 : GLU_BLOCK;
        REAL sg[GLU_BLOCK], t1[GLU_BLOCK], t2[GLU_BLOCK];
        SUF(glu_block)(glu, g, u, i0, len, b1, b2, sg, t1, t2);
        const REAL *gb = g + i0, *ub = u + i0, *dy = dout + i0;
        REAL *dgb = dg + i0, *dub = du + i0;
        if (glu == K3RT_GLU_SITU) {
#pragma omp simd
            for (int64_t j = 0; j < len; j++) {
                REAL s = sg[j], a = B1 * t1[j] * s, b = B2 * t2[j];
                REAL da = (one - t1[j] * t1[j]) * s + B1 * t1[j] * s * (one - s);
                REAL db = one - t2[j] * t2[j];
                dgb[j] = dy[j] * b * da;
                dub[j] = dy[j] * a * db;
            }
        } else if (glu == K3RT_GLU_SIGMOID) {
#pragma omp simd
            for (int64_t j = 0; j < len; j++) {
                REAL s = sg[j], d = dy[j];
                dgb[j] = d * ub[j] * s * (one - s);
                dub[j] = d * s;
            }
        } else {
#pragma omp simd
            for (int64_t j = 0; j < len; j++) {
                REAL s = sg[j];
                dgb[j] = dy[j] * ub[j] * s * (one + gb[j] * (one - s));
                dub[j] = dy[j] * (gb[j] * s);
            }
        }
    }
}

void SUF(cpu_axpby)(int64_t n, double alpha, const REAL *x, double beta, REAL *y, int threads)
{
    REAL a = (REAL)alpha, b = (REAL)beta;
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++)
        y[i] = beta == 0.0 ? a * x[i] : a * x[i] + b * y[i];
}

void SUF(cpu_mul)(int64_t n, const REAL *a, const REAL *b, REAL *out, int threads)
{
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++)
        out[i] = a[i] * b[i];
}

void SUF(cpu_fill)(REAL *x, int64_t n, double value, int threads)
{
    REAL v = (REAL)value;
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++)
        x[i] = v;
}

/* Accumulated in double, sequentially: the gradient norm must not depend on threads. */
double SUF(cpu_sum_squares)(const REAL *x, int64_t n)
{
    double s = 0.0;
    for (int64_t i = 0; i < n; i++)
        s += (double)x[i] * (double)x[i];
    return s;
}

/* db(out) += column sums of dy(n,out), in fixed row blocks. */
void SUF(cpu_bias_grad)(const REAL *dy, REAL *db, int64_t n, int64_t out, int threads)
{
    int64_t blocks = (n + CPU_REDUCE_BLOCK - 1) / CPU_REDUCE_BLOCK;
    REAL *part = calloc((size_t)(blocks * out), sizeof(REAL));
#pragma omp parallel for num_threads(threads) if (n * out > 32768) schedule(static)
    for (int64_t b = 0; b < blocks; b++) {
        int64_t end = (b + 1) * CPU_REDUCE_BLOCK < n ? (b + 1) * CPU_REDUCE_BLOCK : n;
        for (int64_t i = b * CPU_REDUCE_BLOCK; i < end; i++)
            for (int64_t j = 0; j < out; j++)
                part[b * out + j] += dy[i * out + j];
    }
    for (int64_t b = 0; b < blocks; b++)
        for (int64_t j = 0; j < out; j++)
            db[j] += part[b * out + j];
    free(part);
}

/* Bias corrections and the step size are folded in double once; the element loop runs in
 * REAL (as torch's AdamW does) so float updates vectorise. */
void SUF(cpu_adamw)(REAL *p, const REAL *g, REAL *m, REAL *v, int64_t n, double lr, double b1,
                    double b2, double eps, double wd, int64_t step, int threads)
{
    double c1 = 1.0 - pow(b1, (double)step), c2 = 1.0 - pow(b2, (double)step);
    const REAL decay = (REAL)(1.0 - lr * wd), step_size = (REAL)(lr / c1);
    const REAL rc2 = (REAL)(1.0 / sqrt(c2)), e = (REAL)eps, B1 = (REAL)b1, B2 = (REAL)b2;
    const REAL one_b1 = (REAL)(1.0 - b1), one_b2 = (REAL)(1.0 - b2);
#pragma omp parallel for num_threads(threads) if (n > 65536) schedule(static)
    for (int64_t i = 0; i < n; i++) {
        REAL gi = g[i];
        m[i] = B1 * m[i] + one_b1 * gi;
        v[i] = B2 * v[i] + one_b2 * gi * gi;
        p[i] = p[i] * decay - step_size * m[i] / (R_SQRT(v[i]) * rc2 + e);
    }
}
