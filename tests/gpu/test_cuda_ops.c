/* Every shared op on CUDA against the CPU reference (k3rt's own CPU ops in f64, fed the same
 * values the device holds: bf16 inputs are rounded first). Outputs are poisoned with NaN bit
 * patterns before each run, shapes include ragged ones, and the error is
 * rms(ref - x) / rms(ref): <= 1e-5 for f32 outputs, <= 1e-2 for bf16 outputs. Deterministic ops
 * must give the same bits twice. Also the caching allocator and pinned memory.
 *
 * Skips (exit 77) without a CUDA device. Runs without fork: CUDA does not survive a fork of an
 * initialised process. */
#define _POSIX_C_SOURCE 200809L  /* setenv */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/peak_kit.h"
#include "testutil/testutil.h"

static k3rt_stream *G;  /* CUDA stream on device 0 */
static k3rt_stream *H;  /* CPU stream of the reference */
static uint64_t seed_next = 1000;
static const int DT[2] = {K3RT_F32, K3RT_BF16};

/* ---- device arrays with their exact values mirrored on the host ------------------------------ */

typedef struct {
    int dtype;
    int64_t n;
    double *ref;  /* the values the device holds (rounded to dtype), or the CPU reference */
    void *dev;
} darr;

static size_t nbytes(int dtype, int64_t n)
{
    return (size_t)(n > 0 ? n : 1) * k3rt_dtype_size(dtype);
}

static void upload(darr *a)
{
    k3rt_error err = {0};
    void *h = malloc(nbytes(a->dtype, a->n));
    TU_OK(k3rt_convert(h, a->dtype, a->ref, K3RT_F64, a->n, &err), err);
    TU_OK(k3rt_convert(a->ref, K3RT_F64, h, a->dtype, a->n, &err), err); /* exact values */
    TU_OK(k3rt_memcpy(G, a->dev, 0, h, K3RT_DEVICE_CPU, nbytes(a->dtype, a->n), &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    free(h);
}

static darr alloc_arr(int dtype, int64_t n)
{
    k3rt_error err = {0};
    darr a = {dtype, n, calloc((size_t)(n > 0 ? n : 1), sizeof(double)), NULL};
    a.dev = k3rt_alloc(0, nbytes(dtype, n), &err);
    ck_assert_msg(a.dev != NULL, "k3rt_alloc: %s", err.msg);
    return a;
}

/* N(0, scale^2) values, rounded to dtype. */
static darr rnd(int dtype, int64_t n, double scale)
{
    darr a = alloc_arr(dtype, n);
    tu_randn(a.ref, n, scale, seed_next++);
    upload(&a);
    return a;
}

/* An output: NaN bits everywhere on the device (0xff bytes are NaN in f32 and bf16). */
static darr poisoned(int dtype, int64_t n)
{
    k3rt_error err = {0};
    darr a = alloc_arr(dtype, n);
    TU_OK(k3rt_memset(G, a.dev, 0, 0xff, nbytes(dtype, n), &err), err);
    return a;
}

static double *download(const darr *a)
{
    k3rt_error err = {0};
    void *h = malloc(nbytes(a->dtype, a->n));
    double *x = calloc((size_t)(a->n > 0 ? a->n : 1), sizeof(double));
    TU_OK(k3rt_memcpy(G, h, K3RT_DEVICE_CPU, a->dev, 0, nbytes(a->dtype, a->n), &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    TU_OK(k3rt_convert(x, K3RT_F64, h, a->dtype, a->n, &err), err);
    free(h);
    return x;
}

static void *download_raw(const darr *a)
{
    k3rt_error err = {0};
    void *h = malloc(nbytes(a->dtype, a->n));
    TU_OK(k3rt_memcpy(G, h, K3RT_DEVICE_CPU, a->dev, 0, nbytes(a->dtype, a->n), &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    return h;
}

static void drop(darr *a)
{
    k3rt_free(0, a->dev);
    free(a->ref);
    a->dev = NULL;
    a->ref = NULL;
}

static int32_t *dev_i32(const int32_t *v, int64_t n)
{
    k3rt_error err = {0};
    int32_t *d = k3rt_alloc(0, (size_t)(n > 0 ? n : 1) * 4, &err);
    ck_assert_msg(d != NULL, "k3rt_alloc: %s", err.msg);
    TU_OK(k3rt_memcpy(G, d, 0, v, K3RT_DEVICE_CPU, (size_t)n * 4, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    return d;
}

static double tol_of(int dtype) { return dtype == K3RT_BF16 ? 1e-2 : 1e-5; }

/* got (device) against ref (host, n values): finite everywhere and within the tolerance of
 * got's dtype. */
static void expect_close(const char *what, const double *ref, const darr *got)
{
    double *x = download(got);
    for (int64_t i = 0; i < got->n; i++)
        ck_assert_msg(isfinite(x[i]) || !isfinite(ref[i]),
                      "%s: element %lld is %g (reference %g): not written or not finite", what,
                      (long long)i, x[i], ref[i]);
    double e = tu_rel_rms(ref, x, got->n), tol = tol_of(got->dtype);
    ck_assert_msg(e <= tol, "%s (%s): relative rms error %.3g > %.1g", what,
                  k3rt_dtype_name(got->dtype), e, tol);
    free(x);
}

/* The same bits in two device arrays. */
static void expect_same_bits(const char *what, const darr *a, const darr *b)
{
    void *x = download_raw(a), *y = download_raw(b);
    ck_assert_msg(memcmp(x, y, nbytes(a->dtype, a->n)) == 0,
                  "%s: two runs on the same inputs differ (not deterministic)", what);
    free(x);
    free(y);
}

static double *copy_of(const double *v, int64_t n)
{
    double *c = malloc((size_t)(n > 0 ? n : 1) * sizeof *c);
    memcpy(c, v, (size_t)n * sizeof *c);
    return c;
}

/* ---- GEMM ------------------------------------------------------------------------------------ */

/* Row-major C(m,n) = alpha op(A) op(B) + beta C over `batch` matrices with padded rows; with
 * `apart`, k3rt_gemm_strided_batched_into writes D (poisoned) from the addend C, which it must
 * leave as it was. */
static void gemm_case_of(int dtype, int ta, int tb, int64_t m, int64_t n, int64_t k,
                         int64_t batch, double alpha, double beta, int apart)
{
    k3rt_error err = {0};
    int64_t ar = ta ? k : m, ac = ta ? m : k, br = tb ? n : k, bc = tb ? k : n;
    int64_t lda = ac + 3, ldb = bc + 1, ldc = n + 2;
    int64_t sa = ar * lda + 5, sb = br * ldb, sc = m * ldc + 7;
    darr A = rnd(dtype, sa * batch, 1.0), B = rnd(dtype, sb * batch, 1.0);
    darr Cm = beta != 0.0 ? rnd(dtype, sc * batch, 1.0) : poisoned(dtype, sc * batch);
    double *ref = copy_of(Cm.ref, sc * batch);
    TU_OK(k3rt_gemm_strided_batched(H, K3RT_F64, ta, tb, m, n, k, alpha, A.ref, lda, sa, B.ref,
                                    ldb, sb, beta, ref, ldc, sc, batch, &err), err);
    darr Cin = {0};
    if (apart) {  /* the addend stays in Cin; Cm becomes the poisoned output */
        Cin = Cm;
        Cm = poisoned(dtype, sc * batch);
        TU_OK(k3rt_gemm_strided_batched_into(G, dtype, ta, tb, m, n, k, alpha, A.dev, lda, sa,
                                             B.dev, ldb, sb, beta, Cin.dev, Cm.dev, ldc, sc,
                                             batch, &err), err);
        if (beta != 0.0) {  /* else C is poisoned and must not even be read */
            double *c_after = download(&Cin);
            ck_assert_msg(memcmp(c_after, Cin.ref, (size_t)(sc * batch) * sizeof *c_after) == 0,
                          "gemm_strided_batched_into changed its addend C");
            free(c_after);
        }
    } else if (batch == 1)
        TU_OK(k3rt_gemm(G, dtype, ta, tb, m, n, k, alpha, A.dev, lda, B.dev, ldb, beta, Cm.dev,
                        ldc, &err), err);
    else
        TU_OK(k3rt_gemm_strided_batched(G, dtype, ta, tb, m, n, k, alpha, A.dev, lda, sa, B.dev,
                                        ldb, sb, beta, Cm.dev, ldc, sc, batch, &err), err);
    /* Compare the matrices; the padding must be untouched (still NaN when poisoned). */
    double *x = download(&Cm);
    int64_t cnt = batch * m * n, j = 0;
    double *r = malloc((size_t)cnt * sizeof *r), *g = malloc((size_t)cnt * sizeof *g);
    for (int64_t b = 0; b < batch; b++)
        for (int64_t i = 0; i < m; i++)
            for (int64_t c = 0; c < n; c++, j++) {
                r[j] = ref[b * sc + i * ldc + c];
                g[j] = x[b * sc + i * ldc + c];
                ck_assert_msg(isfinite(g[j]), "gemm %dx%dx%d: C[%lld,%lld,%lld] not written",
                              (int)m, (int)n, (int)k, (long long)b, (long long)i, (long long)c);
            }
    if ((beta == 0.0 || apart) && n < ldc)
        ck_assert_msg(isnan(x[n]), "gemm wrote into the padding of C");
    double e = tu_rel_rms(r, g, cnt);
    ck_assert_msg(e <= tol_of(dtype), "gemm%s %s ta=%d tb=%d m=%lld n=%lld k=%lld "
                  "batch=%lld alpha=%g beta=%g: relative rms error %.3g", apart ? " into" : "",
                  k3rt_dtype_name(dtype), ta, tb, (long long)m, (long long)n, (long long)k,
                  (long long)batch, alpha, beta, e);
    free(r), free(g), free(x), free(ref);
    drop(&A), drop(&B), drop(&Cm);
    if (apart)
        drop(&Cin);
}

static void gemm_case(int dtype, int ta, int tb, int64_t m, int64_t n, int64_t k, int64_t batch,
                      double alpha, double beta)
{
    gemm_case_of(dtype, ta, tb, m, n, k, batch, alpha, beta, 0);
}

START_TEST(gemm_vs_cpu)
{
    const int64_t shapes[][3] = {{1, 1, 1}, {17, 33, 9}, {64, 48, 128}, {129, 257, 65},
                                 {300, 200, 511}, {8, 1024, 3}};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int t = 0; t < 4; t++)
                gemm_case(DT[d], t & 1, t >> 1, shapes[s][0], shapes[s][1], shapes[s][2], 1,
                          s % 2 ? 0.75 : 1.0, s % 3 == 1 ? 0.5 : 0.0);
}
END_TEST

START_TEST(gemm_batched_vs_cpu)
{
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 4; t++) {
            gemm_case(DT[d], t & 1, t >> 1, 33, 20, 47, 3, 1.0, 0.0);
            gemm_case(DT[d], t & 1, t >> 1, 64, 64, 64, 5, -0.5, 1.0);
        }
}
END_TEST

/* The addend apart from the output, as Newton-Schulz uses it (P = c S S + b S, X' = P X + a X):
 * also an empty inner dimension (D = beta C) and beta 0 (C not read). */
START_TEST(gemm_into_vs_cpu)
{
    for (int d = 0; d < 2; d++)
        for (int t = 0; t < 4; t++) {
            gemm_case_of(DT[d], t & 1, t >> 1, 64, 96, 64, 3, 2.0315, -4.775, 1);
            gemm_case_of(DT[d], t & 1, t >> 1, 33, 20, 47, 2, 1.0, 3.4445, 1);
            gemm_case_of(DT[d], t & 1, t >> 1, 17, 9, 0, 2, 1.0, 0.5, 1);
            gemm_case_of(DT[d], t & 1, t >> 1, 17, 9, 5, 1, 1.0, 0.0, 1);
        }
}
END_TEST

/* ---- linear and grouped linear ------------------------------------------------------------- */

static void linear_case(int dtype, int64_t n, int64_t in, int64_t out, int bias, int acc)
{
    k3rt_error err = {0};
    darr x = rnd(dtype, n * in, 1.0), w = rnd(dtype, out * in, 0.2), dy = rnd(dtype, n * out, 1.0);
    darr b = bias ? rnd(dtype, out, 1.0) : (darr){0};
    darr y = poisoned(dtype, n * out);
    double *yr = calloc((size_t)(n * out), sizeof *yr);
    TU_OK(k3rt_linear_fwd(H, K3RT_F64, x.ref, w.ref, bias ? b.ref : NULL, yr, n, in, out, &err),
          err);
    TU_OK(k3rt_linear_fwd(G, dtype, x.dev, w.dev, bias ? b.dev : NULL, y.dev, n, in, out, &err),
          err);
    expect_close("linear_fwd y", yr, &y);

    /* Parameter gradients are F32 under bf16 and accumulate onto their old values. */
    darr dx = acc ? rnd(dtype, n * in, 1.0) : poisoned(dtype, n * in);
    darr dw = rnd(K3RT_F32, out * in, 1.0), db = rnd(K3RT_F32, out, 1.0);
    double *dxr = copy_of(dx.ref, n * in), *dwr = copy_of(dw.ref, out * in);
    double *dbr = copy_of(db.ref, out);
    TU_OK(k3rt_linear_bwd(H, K3RT_F64, x.ref, w.ref, dy.ref, dxr, dwr, dbr, n, in, out, acc, &err),
          err);
    TU_OK(k3rt_linear_bwd(G, dtype, x.dev, w.dev, dy.dev, dx.dev, dw.dev, db.dev, n, in, out, acc,
                          &err), err);
    expect_close("linear_bwd dx", dxr, &dx);
    expect_close("linear_bwd dW", dwr, &dw);
    expect_close("linear_bwd db", dbr, &db);
    free(yr), free(dxr), free(dwr), free(dbr);
    drop(&x), drop(&w), drop(&dy), drop(&y), drop(&dx), drop(&dw), drop(&db);
    if (bias)
        drop(&b);
}

START_TEST(linear_vs_cpu)
{
    const int64_t shapes[][3] = {{1, 8, 8}, {37, 24, 16}, {256, 129, 67}, {100, 64, 256}};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int v = 0; v < 2; v++)
                linear_case(DT[d], shapes[s][0], shapes[s][1], shapes[s][2], v, v);
}
END_TEST

/* The f32-output forward (a router's scores): bf16 or f32 inputs, f32 out, against the f64
 * product of the same (rounded) values at f32's tolerance, into a poisoned output. */
START_TEST(linear_fwd_f32_vs_cpu)
{
    k3rt_error err = {0};
    const int64_t shapes[][3] = {{1, 8, 8}, {37, 24, 16}, {300, 1024, 64}, {100, 64, 257}};
    for (int d = 0; d < 2; d++)
        for (size_t c = 0; c < sizeof shapes / sizeof shapes[0]; c++) {
            const int64_t n = shapes[c][0], in = shapes[c][1], out = shapes[c][2];
            darr x = rnd(DT[d], n * in, 1.0), w = rnd(DT[d], out * in, 0.2);
            darr y = poisoned(K3RT_F32, n * out);
            double *yr = calloc((size_t)(n * out), sizeof *yr);
            TU_OK(k3rt_linear_fwd(H, K3RT_F64, x.ref, w.ref, NULL, yr, n, in, out, &err), err);
            TU_OK(k3rt_linear_fwd_f32(G, DT[d], x.dev, w.dev, (float *)y.dev, n, in, out, &err),
                  err);
            expect_close("linear_fwd_f32 y", yr, &y);
            free(yr);
            drop(&x), drop(&w), drop(&y);
        }
}
END_TEST

START_TEST(grouped_linear_vs_cpu)
{
    k3rt_error err = {0};
    const int64_t off[] = {0, 10, 10, 37, 38, 60}, G5 = 5, rows = 60, in = 33, out = 20;
    for (int d = 0; d < 2; d++) {
        int dt = DT[d];
        darr x = rnd(dt, rows * in, 1.0), w = rnd(dt, G5 * out * in, 0.3);
        darr dy = rnd(dt, rows * out, 1.0), y = poisoned(dt, rows * out);
        double *yr = calloc((size_t)(rows * out), sizeof *yr);
        TU_OK(k3rt_grouped_linear_fwd(H, K3RT_F64, x.ref, w.ref, yr, off, G5, in, out, &err), err);
        TU_OK(k3rt_grouped_linear_fwd(G, dt, x.dev, w.dev, y.dev, off, G5, in, out, &err), err);
        expect_close("grouped_linear_fwd y", yr, &y);
        for (int acc = 0; acc < 2; acc++) {
            darr dx = acc ? rnd(dt, rows * in, 1.0) : poisoned(dt, rows * in);
            darr dw = rnd(K3RT_F32, G5 * out * in, 1.0);
            double *dxr = copy_of(dx.ref, rows * in), *dwr = copy_of(dw.ref, G5 * out * in);
            TU_OK(k3rt_grouped_linear_bwd(H, K3RT_F64, x.ref, w.ref, dy.ref, dxr, dwr, off, G5,
                                          in, out, acc, &err), err);
            TU_OK(k3rt_grouped_linear_bwd(G, dt, x.dev, w.dev, dy.dev, dx.dev, dw.dev, off, G5,
                                          in, out, acc, &err), err);
            expect_close("grouped_linear_bwd dx", dxr, &dx);
            expect_close("grouped_linear_bwd dW", dwr, &dw);
            free(dxr), free(dwr);
            drop(&dx), drop(&dw);
        }
        free(yr);
        drop(&x), drop(&w), drop(&dy), drop(&y);
    }
}
END_TEST

/* The weight gradient alone under each schedule (the library's pick, then each forced):
 * accumulating onto random values, and overwriting a poisoned gradient, whose empty groups
 * must come out zero. */
static void grouped_dw_case(int64_t groups, const int64_t *off, const void *doff, int odt,
                            const darr *x, const darr *dy, int64_t in, int64_t out)
{
    static const char *sched[3] = {NULL, "cooperative", "pingpong"};
    k3rt_error err = {0};
    int64_t rows = off[groups], n = groups * out * in;
    for (int k = 0; k < 3; k++)
        for (int acc = 0; acc < 2; acc++) {
            if (sched[k])
                setenv("K3RT_GG_DW_KERNEL", sched[k], 1);
            else
                unsetenv("K3RT_GG_DW_KERNEL");
            darr dw = acc ? rnd(K3RT_F32, n, 1.0) : poisoned(K3RT_F32, n);
            double *dwr = acc ? copy_of(dw.ref, n) : calloc((size_t)(n > 0 ? n : 1), sizeof *dwr);
            TU_OK(k3rt_grouped_linear_bwd(H, K3RT_F64, x->ref, NULL, dy->ref, NULL, dwr, off,
                                          groups, in, out, 0, &err), err);
            TU_OK(k3rt_grouped_linear_dw_dev(G, K3RT_BF16, x->dev, dy->dev, dw.dev, doff, odt,
                                             groups, rows, in, out, acc, &err), err);
            char what[96];
            snprintf(what, sizeof what, "grouped bf16 dW %s, %s", acc ? "+=" : "=",
                     sched[k] ? sched[k] : "library's schedule");
            expect_close(what, dwr, &dw);
            free(dwr);
            drop(&dw);
        }
    unsetenv("K3RT_GG_DW_KERNEL");
}

/* The CUTLASS grouped GEMM (bf16, in and out multiples of 8, sm_90; elsewhere the same calls
 * take the loop and the test still holds): offsets from the host (odt 0) and from the device
 * (odt K3RT_I32 or K3RT_I64). */
static void grouped_bf16_case(int64_t groups, const int64_t *off, int64_t in, int64_t out,
                              int odt)
{
    k3rt_error err = {0};
    const int dt = K3RT_BF16, dev_offsets = odt != 0;
    int64_t rows = off[groups];
    int32_t *off32 = malloc((size_t)(groups + 1) * sizeof *off32);
    void *doff = NULL;
    for (int64_t g = 0; g <= groups; g++)
        off32[g] = (int32_t)off[g];
    if (odt == K3RT_I32)
        doff = dev_i32(off32, groups + 1);
    else if (odt == K3RT_I64) {
        doff = k3rt_alloc(0, (size_t)(groups + 1) * 8, &err);
        ck_assert_msg(doff != NULL, "k3rt_alloc: %s", err.msg);
        TU_OK(k3rt_memcpy(G, doff, 0, off, K3RT_DEVICE_CPU, (size_t)(groups + 1) * 8, &err), err);
        TU_OK(k3rt_stream_sync(G, &err), err);
    }
    darr x = rnd(dt, rows * in, 1.0), w = rnd(dt, groups * out * in, 0.2);
    darr dy = rnd(dt, rows * out, 1.0), y = poisoned(dt, rows * out), y2 = poisoned(dt, rows * out);
    double *yr = calloc((size_t)(rows * out > 0 ? rows * out : 1), sizeof *yr);
    TU_OK(k3rt_grouped_linear_fwd(H, K3RT_F64, x.ref, w.ref, yr, off, groups, in, out, &err), err);
    for (int rep = 0; rep < 2; rep++) {
        void *yd = rep ? y2.dev : y.dev;
        if (dev_offsets)
            TU_OK(k3rt_grouped_linear_fwd_dev(G, dt, x.dev, w.dev, yd, doff, odt, groups, rows,
                                              in, out, &err), err);
        else
            TU_OK(k3rt_grouped_linear_fwd(G, dt, x.dev, w.dev, yd, off, groups, in, out, &err), err);
    }
    expect_close("grouped bf16 fwd y", yr, &y);
    expect_same_bits("grouped bf16 fwd y", &y, &y2);
    for (int acc = 0; acc < 2; acc++) {
        darr dx = acc ? rnd(dt, rows * in, 1.0) : poisoned(dt, rows * in);
        darr dw = rnd(K3RT_F32, groups * out * in, 1.0);
        double *dxr = copy_of(dx.ref, rows * in), *dwr = copy_of(dw.ref, groups * out * in);
        TU_OK(k3rt_grouped_linear_bwd(H, K3RT_F64, x.ref, w.ref, dy.ref, dxr, dwr, off, groups,
                                      in, out, acc, &err), err);
        if (dev_offsets)
            TU_OK(k3rt_grouped_linear_bwd_dev(G, dt, x.dev, w.dev, dy.dev, dx.dev, dw.dev, doff,
                                              odt, groups, rows, in, out, acc, &err), err);
        else
            TU_OK(k3rt_grouped_linear_bwd(G, dt, x.dev, w.dev, dy.dev, dx.dev, dw.dev, off,
                                          groups, in, out, acc, &err), err);
        expect_close("grouped bf16 bwd dx", dxr, &dx);
        expect_close("grouped bf16 bwd dW", dwr, &dw);
        free(dxr), free(dwr);
        drop(&dx), drop(&dw);
    }
    if (odt == K3RT_I32)
        grouped_dw_case(groups, off, doff, odt, &x, &dy, in, out);
    free(yr), free(off32);
    if (doff)
        k3rt_free(0, doff);
    drop(&x), drop(&w), drop(&dy), drop(&y), drop(&y2);
}

/* Offsets of `groups` groups over `rows` rows: weights (g+1)^-skew in a shuffled order, every
 * `empty_every`-th group empty (0: none). */
static int64_t *ragged_offsets(int64_t groups, int64_t rows, double skew, int empty_every,
                               uint64_t seed)
{
    double *wt = malloc((size_t)groups * sizeof *wt), sum = 0;
    int64_t *off = malloc((size_t)(groups + 1) * sizeof *off);
    for (int64_t g = 0; g < groups; g++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        int64_t r = (int64_t)((seed >> 33) % (uint64_t)groups);  /* a rank, shuffled */
        wt[g] = (empty_every && g % empty_every == 1) ? 0.0 : pow((double)(r + 1), -skew);
        sum += wt[g];
    }
    double acc = 0;
    off[0] = 0;
    for (int64_t g = 0; g < groups; g++) {
        acc += wt[g];
        off[g + 1] = (int64_t)(rows * (acc / sum) + 0.5);
    }
    off[groups] = rows;
    free(wt);
    return off;
}

START_TEST(grouped_bf16_vs_cpu)
{
    /* Ragged with empty groups; all rows in one group; Zipf(1.2) over 64 experts; the most
     * groups one launch takes (mostly empty); one more (the loop). */
    int64_t *ragged = ragged_offsets(8, 1000, 0.5, 3, 11);
    int64_t all_in_one[7] = {0, 0, 0, 777, 777, 777, 777};
    int64_t *zipf = ragged_offsets(64, 4096, 1.2, 0, 12);
    int64_t *many = ragged_offsets(1024, 3000, 1.0, 2, 13);
    int64_t *more = ragged_offsets(1025, 40, 0.0, 4, 14);  /* few launches of the loop */
    const int odt[3] = {0, K3RT_I32, K3RT_I64};
    for (int o = 0; o < 3; o++) {
        grouped_bf16_case(8, ragged, 128, 96, odt[o]);
        grouped_bf16_case(6, all_in_one, 64, 136, odt[o]);
        grouped_bf16_case(64, zipf, 128, 256, odt[o]);
        grouped_bf16_case(1024, many, 32, 16, odt[o]);
        grouped_bf16_case(1025, more, 8, 24, odt[o]);
    }
    free(ragged), free(zipf), free(many), free(more);
}
END_TEST

START_TEST(grouped_dev_offsets_checked_on_fallback)
{
    /* f32 takes the loop: device offsets are read back and a bad end is refused. */
    k3rt_error err = {0};
    const int32_t bad[] = {0, 4, 9};
    int32_t *d = dev_i32(bad, 3);
    darr x = rnd(K3RT_F32, 8 * 8, 1.0), w = rnd(K3RT_F32, 2 * 8 * 8, 1.0);
    darr y = poisoned(K3RT_F32, 8 * 8);
    int rc = k3rt_grouped_linear_fwd_dev(G, K3RT_F32, x.dev, w.dev, y.dev, d, K3RT_I32, 2, 8, 8,
                                         8, &err);
    ck_assert_int_eq(rc, K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "rows = 8") != NULL, "message: %s", err.msg);
    k3rt_free(0, d);
    drop(&x), drop(&w), drop(&y);
}
END_TEST

/* ---- RMSNorm --------------------------------------------------------------------------------- */

static void rmsnorm_case(int dtype, int64_t n, int64_t d, int gain, int acc)
{
    k3rt_error err = {0};
    darr x = rnd(dtype, n * d, 2.0), g = gain ? rnd(dtype, d, 1.0) : (darr){0};
    darr y = poisoned(dtype, n * d), r = poisoned(K3RT_F32, n);
    double *yr = calloc((size_t)(n * d), sizeof *yr), *rr = calloc((size_t)n, sizeof *rr);
    TU_OK(k3rt_rmsnorm_fwd(H, K3RT_F64, x.ref, gain ? g.ref : NULL, yr, rr, n, d, 1e-5, &err),
          err);
    TU_OK(k3rt_rmsnorm_fwd(G, dtype, x.dev, gain ? g.dev : NULL, y.dev, r.dev, n, d, 1e-5, &err),
          err);
    expect_close("rmsnorm_fwd y", yr, &y);
    expect_close("rmsnorm_fwd rstd", rr, &r);

    /* The backward reads the same rstd on both sides: the device's (rounded to f32). */
    double *rdev = download(&r);
    darr dy = rnd(dtype, n * d, 1.0);
    darr dx = acc ? rnd(dtype, n * d, 1.0) : poisoned(dtype, n * d);
    darr dg = rnd(K3RT_F32, d, 1.0);
    double *dxr = copy_of(dx.ref, n * d), *dgr = copy_of(dg.ref, d);
    TU_OK(k3rt_rmsnorm_bwd(H, K3RT_F64, x.ref, gain ? g.ref : NULL, rdev, dy.ref, dxr,
                           gain ? dgr : NULL, n, d, acc, &err), err);
    TU_OK(k3rt_rmsnorm_bwd(G, dtype, x.dev, gain ? g.dev : NULL, r.dev, dy.dev, dx.dev,
                           gain ? dg.dev : NULL, n, d, acc, &err), err);
    expect_close("rmsnorm_bwd dx", dxr, &dx);
    if (gain)
        expect_close("rmsnorm_bwd dgain", dgr, &dg);
    free(yr), free(rr), free(rdev), free(dxr), free(dgr);
    drop(&x), drop(&y), drop(&r), drop(&dy), drop(&dx), drop(&dg);
    if (gain)
        drop(&g);
}

START_TEST(rmsnorm_vs_cpu)
{
    const int64_t shapes[][2] = {{1, 8}, {37, 1024}, {50, 777}, {9, 4096}, {130, 64}};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int v = 0; v < 2; v++)
                rmsnorm_case(DT[d], shapes[s][0], shapes[s][1], s % 2 == 0 || v, v);
    /* the one-pass backward's row widths (dx and the gain gradient together), with a last
     * block of fewer than its 64 rows, and beside them widths it leaves to the two passes */
    const int64_t fused[][2] = {{200, 128}, {131, 256}, {70, 512}, {65, 1024}, {3, 1024}};
    for (int d = 0; d < 2; d++)
        for (size_t s = 0; s < sizeof fused / sizeof fused[0]; s++)
            for (int v = 0; v < 2; v++)
                rmsnorm_case(DT[d], fused[s][0], fused[s][1], 1, v);
}
END_TEST

/* ---- embedding and cross-entropy --------------------------------------------------------- */

static void random_tokens(int32_t *t, int64_t n, int64_t vocab, int ignore_some)
{
    double *u = malloc((size_t)n * sizeof *u);
    tu_randn(u, n, 1.0, seed_next++);
    for (int64_t i = 0; i < n; i++) {
        /* Skewed towards small ids, so that tokens repeat. */
        int64_t v = (int64_t)(fabs(u[i]) * (double)vocab / 3.0) % vocab;
        t[i] = ignore_some && i % 7 == 3 ? -1 : (int32_t)v;
    }
    free(u);
}

static void embedding_case(int dtype, int64_t n, int64_t vocab, int64_t d)
{
    k3rt_error err = {0};
    int32_t *tok = malloc((size_t)n * 4);
    random_tokens(tok, n, vocab, 0);
    int32_t *dtok = dev_i32(tok, n);
    darr table = rnd(dtype, vocab * d, 1.0), out = poisoned(dtype, n * d);
    double *outr = calloc((size_t)(n * d), sizeof *outr);
    TU_OK(k3rt_embedding_fwd(H, K3RT_F64, table.ref, tok, outr, n, vocab, d, &err), err);
    TU_OK(k3rt_embedding_fwd(G, dtype, table.dev, dtok, out.dev, n, vocab, d, &err), err);
    expect_close("embedding_fwd out", outr, &out);

    darr dout = rnd(dtype, n * d, 1.0), dt1 = rnd(K3RT_F32, vocab * d, 1.0);
    darr dt2 = alloc_arr(K3RT_F32, vocab * d);
    memcpy(dt2.ref, dt1.ref, (size_t)(vocab * d) * sizeof(double));
    upload(&dt2);
    double *dtr = copy_of(dt1.ref, vocab * d);
    TU_OK(k3rt_embedding_bwd(H, K3RT_F64, tok, dout.ref, dtr, n, vocab, d, &err), err);
    TU_OK(k3rt_embedding_bwd(G, dtype, dtok, dout.dev, dt1.dev, n, vocab, d, &err), err);
    TU_OK(k3rt_embedding_bwd(G, dtype, dtok, dout.dev, dt2.dev, n, vocab, d, &err), err);
    expect_close("embedding_bwd dtable", dtr, &dt1);
    expect_same_bits("embedding_bwd dtable", &dt1, &dt2);
    free(tok), free(outr), free(dtr);
    k3rt_free(0, dtok);
    drop(&table), drop(&out), drop(&dout), drop(&dt1), drop(&dt2);
}

START_TEST(embedding_vs_cpu)
{
    for (int d = 0; d < 2; d++) {
        embedding_case(DT[d], 1, 50, 16);
        embedding_case(DT[d], 100, 50, 130);
        embedding_case(DT[d], 1000, 300, 64);
        embedding_case(DT[d], 257, 70000, 24);
    }
}
END_TEST

static void xent_case(int dtype, int64_t n, int64_t v, int in_place)
{
    k3rt_error err = {0};
    int32_t *tgt = malloc((size_t)n * 4);
    random_tokens(tgt, n, v, 1);
    int32_t *dtgt = dev_i32(tgt, n);
    darr lg = rnd(dtype, n * v, 3.0), loss = poisoned(K3RT_F32, n), lse = poisoned(K3RT_F32, n);
    double *lr = calloc((size_t)n, sizeof *lr), *zr = calloc((size_t)n, sizeof *zr);
    TU_OK(k3rt_xent_fwd(H, K3RT_F64, lg.ref, tgt, lr, zr, n, v, &err), err);
    TU_OK(k3rt_xent_fwd(G, dtype, lg.dev, dtgt, loss.dev, lse.dev, n, v, &err), err);
    expect_close("xent_fwd loss", lr, &loss);
    expect_close("xent_fwd lse", zr, &lse);

    double *zdev = download(&lse), scale = 1.0 / (double)n;
    double *dr = calloc((size_t)(n * v), sizeof *dr);
    TU_OK(k3rt_xent_bwd(H, K3RT_F64, lg.ref, tgt, zdev, scale, dr, n, v, &err), err);
    darr dl = in_place ? lg : poisoned(dtype, n * v);
    TU_OK(k3rt_xent_bwd(G, dtype, lg.dev, dtgt, lse.dev, scale, dl.dev, n, v, &err), err);
    expect_close("xent_bwd dlogits", dr, &dl);
    free(tgt), free(lr), free(zr), free(zdev), free(dr);
    k3rt_free(0, dtgt);
    if (!in_place)
        drop(&dl);
    drop(&lg), drop(&loss), drop(&lse);
}

START_TEST(xent_vs_cpu)
{
    for (int d = 0; d < 2; d++) {
        xent_case(DT[d], 3, 7, 0);
        xent_case(DT[d], 33, 1000, 1);
        xent_case(DT[d], 20, 32000, 0);
        xent_case(DT[d], 5, 4099, 0);
    }
}
END_TEST

#ifdef K3RT_HAVE_CUDA
/* A bad index is recorded, never read out of bounds, and reported once. */
START_TEST(bad_index_is_reported)
{
    k3rt_error err = {0};
    int32_t tok[5] = {1, 2, 3, 60, 4};
    int32_t *dtok = dev_i32(tok, 5);
    darr table = rnd(K3RT_F32, 50 * 8, 1.0), out = poisoned(K3RT_F32, 5 * 8);
    TU_OK(k3rt_stream_index_error(G, &err), err); /* nothing pending from earlier tests */
    TU_OK(k3rt_embedding_fwd(G, K3RT_F32, table.dev, dtok, out.dev, 5, 50, 8, &err), err);
    int rc = k3rt_stream_index_error(G, &err);
    ck_assert_int_eq(rc, K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "token 60 at position 3"), "message: %s", err.msg);
    double *x = download(&out);
    ck_assert(isnan(x[3 * 8]) && isfinite(x[4 * 8]));
    TU_OK(k3rt_stream_index_error(G, &err), err); /* cleared */
    free(x);
    k3rt_free(0, dtok);
    drop(&table), drop(&out);
}
END_TEST
#endif

/* ---- elementwise ----------------------------------------------------------------------------- */

static const int64_t LENS[] = {1, 7, 1000, 4097, 65536 + 3};

START_TEST(act_vs_cpu)
{
    k3rt_error err = {0};
    for (int d = 0; d < 2; d++)
        for (int act = K3RT_ACT_IDENTITY; act <= K3RT_ACT_RELU; act++)
            for (size_t l = 0; l < sizeof LENS / sizeof LENS[0]; l++) {
                int64_t n = LENS[l];
                int acc = (int)(l % 2);
                darr x = rnd(DT[d], n, 3.0), y = poisoned(DT[d], n), dy = rnd(DT[d], n, 1.0);
                darr dx = acc ? rnd(DT[d], n, 1.0) : poisoned(DT[d], n);
                double *yr = calloc((size_t)n, sizeof *yr), *dxr = copy_of(dx.ref, n);
                TU_OK(k3rt_act_fwd(H, K3RT_F64, act, x.ref, yr, n, &err), err);
                TU_OK(k3rt_act_fwd(G, DT[d], act, x.dev, y.dev, n, &err), err);
                TU_OK(k3rt_act_bwd(H, K3RT_F64, act, x.ref, dy.ref, dxr, n, acc, &err), err);
                TU_OK(k3rt_act_bwd(G, DT[d], act, x.dev, dy.dev, dx.dev, n, acc, &err), err);
                char what[64];
                snprintf(what, sizeof what, "act %d fwd (n %lld)", act, (long long)n);
                expect_close(what, yr, &y);
                snprintf(what, sizeof what, "act %d bwd (n %lld, acc %d)", act, (long long)n, acc);
                expect_close(what, dxr, &dx);
                free(yr), free(dxr);
                drop(&x), drop(&y), drop(&dy), drop(&dx);
            }
}
END_TEST

/* v rounded to the nearest bf16 (ties to even; v finite) */
static double bf16_nearest(double v)
{
    float f = (float)v;
    uint32_t b;
    memcpy(&b, &f, sizeof b);
    b = (b + 0x7fffu + ((b >> 16) & 1u)) & 0xffff0000u;
    memcpy(&f, &b, sizeof f);
    return f;
}

/* bf16 results within 1.25x of the best a bf16 answer can be, the exact value rounded (the
 * SiTU and sigmoid GLUs' fast tanh, exp and division on bf16 data must cost less than rounding
 * does) */
static void expect_near_rounding(const char *what, const double *ref, const darr *got)
{
    double *x = download(got), *r = malloc((size_t)got->n * sizeof *r);
    for (int64_t i = 0; i < got->n; i++)
        r[i] = bf16_nearest(ref[i]);
    double e = tu_rel_rms(ref, x, got->n), e0 = tu_rel_rms(ref, r, got->n);
    ck_assert_msg(e <= 1.25 * e0, "%s (bf16): relative rms error %.3g, rounding alone %.3g: "
                  "more than 1.25x", what, e, e0);
    free(x), free(r);
}

START_TEST(glu_vs_cpu)
{
    k3rt_error err = {0};
    for (int d = 0; d < 2; d++)
        for (int glu = K3RT_GLU_SWIGLU; glu <= K3RT_GLU_SIGMOID; glu++)
            for (size_t l = 0; l < sizeof LENS / sizeof LENS[0]; l++) {
                static const char *name[][3] = {{"swiglu fwd", "swiglu dgate", "swiglu dup"},
                                                {"situ fwd", "situ dgate", "situ dup"},
                                                {"sigmoid fwd", "sigmoid dgate", "sigmoid dup"}};
                int64_t n = LENS[l];
                double b1 = 4.0, b2 = 25.0;
                darr g = rnd(DT[d], n, 3.0), u = rnd(DT[d], n, 10.0), dout = rnd(DT[d], n, 1.0);
                darr o = poisoned(DT[d], n), dg = poisoned(DT[d], n), du = poisoned(DT[d], n);
                double *orf = calloc((size_t)n, sizeof *orf), *dgr = calloc((size_t)n, sizeof *dgr);
                double *dur = calloc((size_t)n, sizeof *dur);
                TU_OK(k3rt_glu_fwd(H, K3RT_F64, glu, g.ref, u.ref, orf, n, b1, b2, &err), err);
                TU_OK(k3rt_glu_fwd(G, DT[d], glu, g.dev, u.dev, o.dev, n, b1, b2, &err), err);
                TU_OK(k3rt_glu_bwd(H, K3RT_F64, glu, g.ref, u.ref, dout.ref, dgr, dur, n, b1, b2,
                                   &err), err);
                TU_OK(k3rt_glu_bwd(G, DT[d], glu, g.dev, u.dev, dout.dev, dg.dev, du.dev, n, b1,
                                   b2, &err), err);
                expect_close(name[glu][0], orf, &o);
                expect_close(name[glu][1], dgr, &dg);
                expect_close(name[glu][2], dur, &du);
                if (glu == K3RT_GLU_SIGMOID) {  /* dup in place of dout (the MLA gate's use) */
                    darr dd = poisoned(DT[d], n);
                    TU_OK(k3rt_memcpy(G, dd.dev, 0, dout.dev, 0, nbytes(DT[d], n), &err), err);
                    TU_OK(k3rt_glu_bwd(G, DT[d], glu, g.dev, u.dev, dd.dev, dg.dev, dd.dev, n, b1,
                                       b2, &err), err);
                    expect_close("sigmoid dup in place", dur, &dd);
                    drop(&dd);
                }
                if (DT[d] == K3RT_BF16 && glu != K3RT_GLU_SWIGLU && n > 1000) {
                    expect_near_rounding(name[glu][0], orf, &o);
                    expect_near_rounding(name[glu][1], dgr, &dg);
                    expect_near_rounding(name[glu][2], dur, &du);
                }
                free(orf), free(dgr), free(dur);
                drop(&g), drop(&u), drop(&dout), drop(&o), drop(&dg), drop(&du);
            }
}
END_TEST

START_TEST(axpby_mul_fill_vs_cpu)
{
    k3rt_error err = {0};
    for (int d = 0; d < 2; d++)
        for (size_t l = 0; l < sizeof LENS / sizeof LENS[0]; l++) {
            int64_t n = LENS[l];
            darr x = rnd(DT[d], n, 1.0), y = rnd(DT[d], n, 1.0), z = poisoned(DT[d], n);
            double *yr = copy_of(y.ref, n), *zr = calloc((size_t)n, sizeof *zr);
            /* beta = 0 must not read y: z is NaN there. */
            TU_OK(k3rt_axpby(H, K3RT_F64, n, 1.5, x.ref, 0.0, zr, &err), err);
            TU_OK(k3rt_axpby(G, DT[d], n, 1.5, x.dev, 0.0, z.dev, &err), err);
            expect_close("axpby beta=0", zr, &z);
            TU_OK(k3rt_axpby(H, K3RT_F64, n, -0.5, x.ref, 2.0, yr, &err), err);
            TU_OK(k3rt_axpby(G, DT[d], n, -0.5, x.dev, 2.0, y.dev, &err), err);
            expect_close("axpby", yr, &y);
            /* mul in place: out aliases a */
            double *mr = calloc((size_t)n, sizeof *mr);
            double *xv = download(&x), *yv = download(&y);
            TU_OK(k3rt_mul(H, K3RT_F64, n, xv, yv, mr, &err), err);
            TU_OK(k3rt_mul(G, DT[d], n, x.dev, y.dev, x.dev, &err), err);
            expect_close("mul (in place)", mr, &x);
            double *fr = calloc((size_t)n, sizeof *fr);
            TU_OK(k3rt_fill(H, K3RT_F64, fr, n, -3.25, &err), err);
            TU_OK(k3rt_fill(G, DT[d], z.dev, n, -3.25, &err), err);
            expect_close("fill", fr, &z);
            free(yr), free(zr), free(mr), free(xv), free(yv), free(fr);
            drop(&x), drop(&y), drop(&z);
        }
}
END_TEST

/* cast: the value the CPU's k3rt_convert gives, for every pair of float dtypes (the value, not
 * the bits, so that +-0 and NaN payloads may differ; every other value has one encoding). */
START_TEST(cast_matches_cpu)
{
    k3rt_error err = {0};
    const int types[4] = {K3RT_F32, K3RT_F64, K3RT_BF16, K3RT_FP8_E4M3};
    enum { NV = 4099 };
    double *v = malloc(NV * sizeof *v);
    tu_randn(v, NV, 40.0, seed_next++);
    for (int i = 0; i < 600; i++)
        v[i] = ldexp(v[i] / 40.0, -(i % 12)); /* small and subnormal fp8 values */
    const double special[] = {0.0, -0.0, 448.0, -448.0, 464.0, 480.0, -1e6, 1e30, INFINITY,
                              -INFINITY, NAN, 0x1p-9, 0x1p-10, 0x1.8p-10, 0x1p-7};
    for (size_t i = 0; i < sizeof special / sizeof special[0]; i++)
        v[600 + i] = special[i];
    for (int i = 0; i < 256; i++)
        v[700 + i] = (double)k3rt_fp8e4m3_to_f32((uint8_t)i); /* every fp8 code */
    for (int si = 0; si < 4; si++)
        for (int di = 0; di < 4; di++) {
            int st = types[si], dt = types[di];
            size_t ss = k3rt_dtype_size(st), ds = k3rt_dtype_size(dt);
            void *src = malloc(NV * ss), *want = malloc(NV * ds), *got = malloc(NV * ds);
            TU_OK(k3rt_convert(src, st, v, K3RT_F64, NV, &err), err);
            TU_OK(k3rt_convert(want, dt, src, st, NV, &err), err);
            void *dsrc = k3rt_alloc(0, NV * ss, &err), *ddst = k3rt_alloc(0, NV * ds, &err);
            ck_assert(dsrc && ddst);
            TU_OK(k3rt_memcpy(G, dsrc, 0, src, K3RT_DEVICE_CPU, NV * ss, &err), err);
            TU_OK(k3rt_memset(G, ddst, 0, 0xff, NV * ds, &err), err);
            TU_OK(k3rt_cast(G, dsrc, st, ddst, dt, NV, &err), err);
            TU_OK(k3rt_memcpy(G, got, K3RT_DEVICE_CPU, ddst, 0, NV * ds, &err), err);
            TU_OK(k3rt_stream_sync(G, &err), err);
            double *gw = malloc(NV * sizeof *gw), *gg = malloc(NV * sizeof *gg);
            TU_OK(k3rt_convert(gw, K3RT_F64, want, dt, NV, &err), err);
            TU_OK(k3rt_convert(gg, K3RT_F64, got, dt, NV, &err), err);
            for (int i = 0; i < NV; i++)
                ck_assert_msg(gw[i] == gg[i] || (isnan(gw[i]) && isnan(gg[i])),
                              "cast %s -> %s of %.9g: CPU gives %.9g, CUDA %.9g",
                              k3rt_dtype_name(st), k3rt_dtype_name(dt), v[i], gw[i], gg[i]);
            free(src), free(want), free(got), free(gw), free(gg);
            k3rt_free(0, dsrc);
            k3rt_free(0, ddst);
        }
    free(v);
}
END_TEST

/* ---- reductions and the optimizer ---------------------------------------------------------- */

START_TEST(sum_squares_vs_cpu)
{
    k3rt_error err = {0};
    const int64_t lens[] = {1, 1000, (1 << 20) + 3, 5000001};
    for (int d = 0; d < 2; d++)
        for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
            int64_t n = lens[l];
            darr x = rnd(DT[d], n, 1.0);
            double want = 0, got = -1, again = -2;
            TU_OK(k3rt_sum_squares(H, K3RT_F64, x.ref, n, &want, &err), err);
            TU_OK(k3rt_sum_squares(G, DT[d], x.dev, n, &got, &err), err);
            TU_OK(k3rt_sum_squares(G, DT[d], x.dev, n, &again, &err), err);
            ck_assert_msg(fabs(got - want) <= 1e-10 * want, "sum_squares n=%lld: %.17g vs %.17g",
                          (long long)n, got, want);
            ck_assert_msg(memcmp(&got, &again, sizeof got) == 0, "sum_squares not deterministic");
            /* Unaligned start: the scalar path. */
            size_t es = k3rt_dtype_size(DT[d]);
            if (n > 1) {
                TU_OK(k3rt_sum_squares(H, K3RT_F64, x.ref + 1, n - 1, &want, &err), err);
                TU_OK(k3rt_sum_squares(G, DT[d], (char *)x.dev + es, n - 1, &got, &err), err);
                ck_assert_msg(fabs(got - want) <= 1e-10 * want, "sum_squares offset 1");
            }
            drop(&x);
        }
    /* A NaN anywhere makes the result non-finite. */
    darr x = rnd(K3RT_F32, 100000, 1.0);
    x.ref[77777] = NAN;
    upload(&x);
    double got = 0;
    TU_OK(k3rt_sum_squares(G, K3RT_F32, x.dev, 100000, &got, &err), err);
    ck_assert(!isfinite(got));
    drop(&x);
}
END_TEST

START_TEST(adamw_vs_cpu)
{
    k3rt_error err = {0};
    const int64_t lens[] = {1, 1001, 2 * 65536 + 5};
    for (size_t l = 0; l < sizeof lens / sizeof lens[0]; l++) {
        int64_t n = lens[l];
        darr p = rnd(K3RT_F32, n, 1.0), m = rnd(K3RT_F32, n, 0.1), v = poisoned(K3RT_F32, n);
        for (int64_t i = 0; i < n; i++)
            v.ref[i] = fabs(m.ref[i]) * 0.3;
        upload(&v);
        double *pr = copy_of(p.ref, n), *mr = copy_of(m.ref, n), *vr = copy_of(v.ref, n);
        for (int step = 1; step <= 3; step++) {
            darr g = rnd(K3RT_F32, n, 1.0);
            TU_OK(k3rt_adamw_step(H, K3RT_F64, pr, g.ref, mr, vr, n, 1e-2, 0.9, 0.95, 1e-8, 0.1,
                                  step, &err), err);
            TU_OK(k3rt_adamw_step(G, K3RT_F32, p.dev, g.dev, m.dev, v.dev, n, 1e-2, 0.9, 0.95,
                                  1e-8, 0.1, step, &err), err);
            drop(&g);
        }
        expect_close("adamw param", pr, &p);
        expect_close("adamw m", mr, &m);
        expect_close("adamw v", vr, &v);
        free(pr), free(mr), free(vr);
        drop(&p), drop(&m), drop(&v);
    }
}
END_TEST

/* The multi-tensor form updates like the single-tensor one, each tensor with its own decay. */
START_TEST(adamw_multi_vs_cpu)
{
    k3rt_error err = {0};
    enum { T = 4 };
    const int64_t lens[T] = {3, 70000, 0, 65536};
    const double wd[T] = {0.01, 0.0, 0.01, 0.3};
    darr p[T], m[T], v[T], g[T];
    double *pr[T], *mr[T], *vr[T];
    void *pd[T], *md[T], *vd[T];
    const void *gd[T];
    for (int i = 0; i < T; i++) {
        int64_t n = lens[i];
        p[i] = rnd(K3RT_F32, n, 1.0), m[i] = rnd(K3RT_F32, n, 0.1), g[i] = rnd(K3RT_F32, n, 1.0);
        v[i] = poisoned(K3RT_F32, n);
        for (int64_t j = 0; j < n; j++)
            v[i].ref[j] = fabs(g[i].ref[j]) * 0.2;
        upload(&v[i]);
        pr[i] = copy_of(p[i].ref, n), mr[i] = copy_of(m[i].ref, n), vr[i] = copy_of(v[i].ref, n);
        TU_OK(k3rt_adamw_step(H, K3RT_F64, pr[i], g[i].ref, mr[i], vr[i], n, 3e-3, 0.9, 0.999,
                              1e-8, wd[i], 7, &err), err);
        pd[i] = p[i].dev, gd[i] = g[i].dev, md[i] = m[i].dev, vd[i] = v[i].dev;
    }
    TU_OK(k3rt_adamw_step_multi(G, K3RT_F32, T, pd, gd, md, vd, lens, wd, 3e-3, 0.9, 0.999, 1e-8,
                                7, &err), err);
    for (int i = 0; i < T; i++) {
        if (lens[i] > 0) {
            expect_close("adamw_multi param", pr[i], &p[i]);
            expect_close("adamw_multi m", mr[i], &m[i]);
            expect_close("adamw_multi v", vr[i], &v[i]);
        }
        free(pr[i]), free(mr[i]), free(vr[i]);
        drop(&p[i]), drop(&m[i]), drop(&v[i]), drop(&g[i]);
    }
}
END_TEST

/* ---- determinism ----------------------------------------------------------------------------- */

/* The RMSNorm backward twice on the same inputs: the same dx and gain gradient bits. */
static void rmsnorm_bwd_twice(int dt, int64_t n, int64_t d)
{
    k3rt_error err = {0};
    darr x = rnd(dt, n * d, 1.0), g = rnd(dt, d, 1.0), y = poisoned(dt, n * d);
    darr r = poisoned(K3RT_F32, n), dy = rnd(dt, n * d, 1.0);
    darr dg1 = rnd(K3RT_F32, d, 1.0), dg2 = alloc_arr(K3RT_F32, d);
    memcpy(dg2.ref, dg1.ref, (size_t)d * sizeof(double));
    upload(&dg2);
    darr dx1 = poisoned(dt, n * d), dx2 = poisoned(dt, n * d);
    TU_OK(k3rt_rmsnorm_fwd(G, dt, x.dev, g.dev, y.dev, r.dev, n, d, 1e-5, &err), err);
    TU_OK(k3rt_rmsnorm_bwd(G, dt, x.dev, g.dev, r.dev, dy.dev, dx1.dev, dg1.dev, n, d, 0, &err),
          err);
    TU_OK(k3rt_rmsnorm_bwd(G, dt, x.dev, g.dev, r.dev, dy.dev, dx2.dev, dg2.dev, n, d, 0, &err),
          err);
    expect_same_bits("rmsnorm_bwd dx (one pass)", &dx1, &dx2);
    expect_same_bits("rmsnorm_bwd dgain (one pass)", &dg1, &dg2);
    drop(&x), drop(&g), drop(&y), drop(&r), drop(&dy), drop(&dg1), drop(&dg2), drop(&dx1),
        drop(&dx2);
}

/* Ops that reduce (column sums, row statistics, products) give the same bits twice. */
START_TEST(reductions_are_deterministic)
{
    k3rt_error err = {0};
    const int64_t n = 3000, d = 1000, in = 256, out = 96;
    for (int k = 0; k < 2; k++) {
        rmsnorm_bwd_twice(DT[k], n, 1024);  /* the one-pass backward's width */
        int dt = DT[k];
        darr x = rnd(dt, n * d, 1.0), g = rnd(dt, d, 1.0), y = poisoned(dt, n * d);
        darr r = poisoned(K3RT_F32, n);
        TU_OK(k3rt_rmsnorm_fwd(G, dt, x.dev, g.dev, y.dev, r.dev, n, d, 1e-5, &err), err);
        darr dg1 = rnd(K3RT_F32, d, 1.0), dg2 = alloc_arr(K3RT_F32, d);
        memcpy(dg2.ref, dg1.ref, (size_t)d * sizeof(double));
        upload(&dg2);
        darr dx1 = poisoned(dt, n * d), dx2 = poisoned(dt, n * d);
        darr dyr = rnd(dt, n * d, 1.0);
        TU_OK(k3rt_rmsnorm_bwd(G, dt, x.dev, g.dev, r.dev, dyr.dev, dx1.dev, dg1.dev, n, d, 0,
                               &err), err);
        TU_OK(k3rt_rmsnorm_bwd(G, dt, x.dev, g.dev, r.dev, dyr.dev, dx2.dev, dg2.dev, n, d, 0,
                               &err), err);
        expect_same_bits("rmsnorm_bwd dx", &dx1, &dx2);
        expect_same_bits("rmsnorm_bwd dgain", &dg1, &dg2);

        darr xl = rnd(dt, n * in, 1.0), dyl = rnd(dt, n * out, 1.0);
        darr dw1 = poisoned(K3RT_F32, out * in), dw2 = poisoned(K3RT_F32, out * in);
        darr db1 = poisoned(K3RT_F32, out), db2 = poisoned(K3RT_F32, out);
        TU_OK(k3rt_fill(G, K3RT_F32, dw1.dev, out * in, 0.0, &err), err);
        TU_OK(k3rt_fill(G, K3RT_F32, dw2.dev, out * in, 0.0, &err), err);
        TU_OK(k3rt_fill(G, K3RT_F32, db1.dev, out, 0.0, &err), err);
        TU_OK(k3rt_fill(G, K3RT_F32, db2.dev, out, 0.0, &err), err);
        TU_OK(k3rt_linear_bwd(G, dt, xl.dev, NULL, dyl.dev, NULL, dw1.dev, db1.dev, n, in, out, 0,
                              &err), err);
        TU_OK(k3rt_linear_bwd(G, dt, xl.dev, NULL, dyl.dev, NULL, dw2.dev, db2.dev, n, in, out, 0,
                              &err), err);
        expect_same_bits("linear_bwd dW", &dw1, &dw2);
        expect_same_bits("linear_bwd db", &db1, &db2);

        int32_t *tgt = malloc((size_t)n * 4);
        random_tokens(tgt, n, d, 1);
        int32_t *dtgt = dev_i32(tgt, n);
        darr l1 = poisoned(K3RT_F32, n), l2 = poisoned(K3RT_F32, n);
        darr z1 = poisoned(K3RT_F32, n), z2 = poisoned(K3RT_F32, n);
        TU_OK(k3rt_xent_fwd(G, dt, x.dev, dtgt, l1.dev, z1.dev, n, d, &err), err);
        TU_OK(k3rt_xent_fwd(G, dt, x.dev, dtgt, l2.dev, z2.dev, n, d, &err), err);
        expect_same_bits("xent_fwd loss", &l1, &l2);
        expect_same_bits("xent_fwd lse", &z1, &z2);
        free(tgt);
        k3rt_free(0, dtgt);
        drop(&x), drop(&g), drop(&y), drop(&r), drop(&dg1), drop(&dg2), drop(&dx1), drop(&dx2);
        drop(&dyr), drop(&xl), drop(&dyl), drop(&dw1), drop(&dw2), drop(&db1), drop(&db2);
        drop(&l1), drop(&l2), drop(&z1), drop(&z2);
    }
}
END_TEST

/* ---- argument errors ------------------------------------------------------------------------- */

START_TEST(bad_arguments_fail_cleanly)
{
    k3rt_error err = {0};
    darr x = rnd(K3RT_F32, 64, 1.0);
    ck_assert_int_ne(k3rt_act_fwd(G, K3RT_F64, K3RT_ACT_SILU, x.dev, x.dev, 8, &err), K3RT_OK);
    ck_assert_msg(strstr(err.msg, "f64"), "message: %s", err.msg);
    ck_assert_int_ne(k3rt_adamw_step(G, K3RT_BF16, x.dev, x.dev, x.dev, x.dev, 8, 1e-3, 0.9,
                                     0.99, 1e-8, 0, 1, &err), K3RT_OK);
    ck_assert_int_ne(k3rt_gemm(G, K3RT_F32, 0, 0, 4, 4, 4, 1.0, x.dev, 3, x.dev, 4, 0.0, x.dev, 4,
                               &err), K3RT_OK);
    ck_assert_msg(strstr(err.msg, "lda"), "message: %s", err.msg);
    ck_assert_int_ne(k3rt_cast(G, x.dev, K3RT_F32, x.dev, K3RT_I32, 8, &err), K3RT_OK);
    drop(&x);
}
END_TEST

/* ---- memory ---------------------------------------------------------------------------------- */

static void mem_stats(size_t *in_use, size_t *cached)
{
    k3rt_device_memory m;
    k3rt_device_memory_stats(0, &m);
    *in_use = m.in_use, *cached = m.cached;
}

/* The peak-memory report's counter on the device (testutil/peak_kit.h). */
START_TEST(allocator_peak_windows)
{
    pk_check_peak(0);
}
END_TEST

START_TEST(allocator_reuses_and_releases)
{
    k3rt_error err = {0};
    size_t u0, c0, u, c;
    TU_OK(k3rt_device_cache_release(0, &err), err);
    mem_stats(&u0, &c0);
    ck_assert_uint_eq(c0, 0);
    void *p = k3rt_alloc(0, 1000, &err);
    ck_assert_msg(p != NULL, "%s", err.msg);
    mem_stats(&u, &c);
    ck_assert_uint_eq(u, u0 + 1024);
    k3rt_free(0, p);
    mem_stats(&u, &c);
    ck_assert_uint_eq(u, u0);
    ck_assert_uint_eq(c, 1024);
    void *q = k3rt_alloc(0, 900, &err); /* same size class: the cached block */
    ck_assert_ptr_eq(p, q);
    k3rt_free(0, q);

    size_t big = (3u << 20) + 5;
    void *b1 = k3rt_alloc(0, big, &err);
    ck_assert_msg(b1 != NULL, "%s", err.msg);
    /* The block is usable memory: write and read back through it. */
    TU_OK(k3rt_memset(G, b1, 0, 0x5a, big, &err), err);
    unsigned char tail = 0;
    TU_OK(k3rt_memcpy(G, &tail, K3RT_DEVICE_CPU, (char *)b1 + big - 1, 0, 1, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    ck_assert_uint_eq(tail, 0x5a);
    k3rt_free(0, b1);
    void *b2 = k3rt_alloc(0, (3u << 20) + 300000, &err);
    ck_assert_ptr_eq(b1, b2);
    k3rt_free(0, b2);
    mem_stats(&u, &c);
    ck_assert_uint_gt(c, 3u << 20);
    TU_OK(k3rt_device_cache_release(0, &err), err);
    mem_stats(&u, &c);
    ck_assert_uint_eq(c, 0);
    ck_assert_uint_eq(u, u0);
    void *r = k3rt_alloc(0, big, &err);
    ck_assert_msg(r != NULL, "allocation after release: %s", err.msg);
    k3rt_free(0, r);
}
END_TEST

START_TEST(pinned_round_trip)
{
    k3rt_error err = {0};
    size_t n = 1 << 20;
    unsigned char *h = k3rt_alloc_pinned(n, &err);
    ck_assert_msg(h != NULL, "%s", err.msg);
    for (size_t i = 0; i < n; i++)
        h[i] = (unsigned char)(i * 7);
    void *d = k3rt_alloc(0, n, &err);
    TU_OK(k3rt_memcpy(G, d, 0, h, K3RT_DEVICE_CPU, n, &err), err);
    /* The copy is asynchronous: host memory may change only after the stream has read it. */
    TU_OK(k3rt_stream_sync(G, &err), err);
    memset(h, 0, n);
    TU_OK(k3rt_memcpy(G, h, K3RT_DEVICE_CPU, d, 0, n, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    for (size_t i = 0; i < n; i += 4099)
        ck_assert_uint_eq(h[i], (unsigned char)(i * 7));
    k3rt_free(0, d);
    k3rt_free_pinned(h);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("cuda_ops");
    TCase *t = tcase_create("ops");
    tcase_set_timeout(t, 300);
    tcase_add_test(t, gemm_vs_cpu);
    tcase_add_test(t, gemm_batched_vs_cpu);
    tcase_add_test(t, gemm_into_vs_cpu);
    tcase_add_test(t, linear_vs_cpu);
    tcase_add_test(t, linear_fwd_f32_vs_cpu);
    tcase_add_test(t, grouped_linear_vs_cpu);
    tcase_add_test(t, rmsnorm_vs_cpu);
    tcase_add_test(t, embedding_vs_cpu);
    tcase_add_test(t, xent_vs_cpu);
    tcase_add_test(t, act_vs_cpu);
    tcase_add_test(t, glu_vs_cpu);
    tcase_add_test(t, axpby_mul_fill_vs_cpu);
    tcase_add_test(t, cast_matches_cpu);
    tcase_add_test(t, sum_squares_vs_cpu);
    tcase_add_test(t, adamw_vs_cpu);
    tcase_add_test(t, reductions_are_deterministic);
    tcase_add_test(t, bad_arguments_fail_cleanly);
#ifdef K3RT_HAVE_CUDA
    tcase_add_test(t, bad_index_is_reported);
#endif
    tcase_add_test(t, adamw_multi_vs_cpu);
    tcase_add_test(t, allocator_reuses_and_releases);
    tcase_add_test(t, allocator_peak_windows);
    tcase_add_test(t, pinned_round_trip);
    suite_add_tcase(s, t);
    /* Its own case, so that CK_RUN_CASE=grouped runs it alone (under compute-sanitizer). */
    TCase *gr = tcase_create("grouped");
    tcase_set_timeout(gr, 300);
    tcase_add_test(gr, grouped_bf16_vs_cpu);
    tcase_add_test(gr, grouped_dev_offsets_checked_on_fallback);
    suite_add_tcase(s, gr);
    return s;
}

int main(void)
{
    H = tu_cpu_stream(4);
    int rc = tu_run_gpu_suite(suite, &G);
    k3rt_stream_destroy(H);
    return rc;
}
