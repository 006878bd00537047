/* GEMM and linear layers on the CPU through OpenBLAS (cblas, OpenMP build); CUDA streams go
 * to core/ops/cuda (cuBLASLt). */
#include "ops/dispatch.h"

#include <cblas.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

/* OpenBLAS's OpenMP build sizes its team from the calling thread's OpenMP budget, so each
 * rank thread of the local backend gets the stream's share. */
static void use_threads(k3rt_stream *s)
{
    int want = k3rt_stream_threads(s);
    if (omp_get_max_threads() != want)
        omp_set_num_threads(want);
}

static int check_cpu_float(k3rt_stream *s, int dtype, const char *op, k3rt_error *err)
{
    if (k3rt_stream_device(s) != K3RT_DEVICE_CPU)
        return ops_no_cuda_kernel(err, op);
    if (dtype != K3RT_F32 && dtype != K3RT_F64)
        return ops_bad_dtype(err, op, dtype);
    use_threads(s);
    return K3RT_OK;
}

static void gemm_one(int dtype, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                     const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                     void *c, int64_t ldc)
{
    if (m <= 0 || n <= 0)
        return;
    enum CBLAS_TRANSPOSE TA = ta ? CblasTrans : CblasNoTrans;
    enum CBLAS_TRANSPOSE TB = tb ? CblasTrans : CblasNoTrans;
    if (dtype == K3RT_F32)
        cblas_sgemm(CblasRowMajor, TA, TB, (blasint)m, (blasint)n, (blasint)k, (float)alpha,
                    a, (blasint)lda, b, (blasint)ldb, (float)beta, c, (blasint)ldc);
    else
        cblas_dgemm(CblasRowMajor, TA, TB, (blasint)m, (blasint)n, (blasint)k, alpha, a,
                    (blasint)lda, b, (blasint)ldb, beta, c, (blasint)ldc);
}

/* OpenBLAS gains little from a second thread on the narrow products of small models, so the
 * output is split here instead: into row blocks when C is tall, column blocks when it is wide,
 * each computed single-threaded inside one OpenMP team. The blocks depend only on the thread
 * count, so a run is reproducible for a given count. */
static void gemm_split(int dtype, int ta, int tb, int64_t m, int64_t n, int64_t k, double alpha,
                       const void *a, int64_t lda, const void *b, int64_t ldb, double beta,
                       void *c, int64_t ldc, int threads)
{
    const int64_t min_block = 32;
    size_t es = k3rt_dtype_size(dtype);
    if (threads <= 1 || omp_in_parallel() || (double)m * (double)n * (double)k < 1 << 18) {
        gemm_one(dtype, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    int by_rows = m >= n;
    int64_t len = by_rows ? m : n;
    if (len < min_block * 2) {
        gemm_one(dtype, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    int parts = (int)(len / min_block) < threads ? (int)(len / min_block) : threads;
#pragma omp parallel num_threads(parts)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t lo = len * t / nt, hi = len * (t + 1) / nt;
        if (by_rows) {
            /* rows of op(A): A + lo*lda, or columns of A when transposed */
            const char *ap = (const char *)a + (size_t)(ta ? lo : lo * lda) * es;
            gemm_one(dtype, ta, tb, hi - lo, n, k, alpha, ap, lda, b, ldb, beta,
                     (char *)c + (size_t)(lo * ldc) * es, ldc);
        } else {
            const char *bp = (const char *)b + (size_t)(tb ? lo * ldb : lo) * es;
            gemm_one(dtype, ta, tb, m, hi - lo, k, alpha, a, lda, bp, ldb, beta,
                     (char *)c + (size_t)lo * es, ldc);
        }
    }
}

int k3rt_gemm(k3rt_stream *s, int dtype, int trans_a, int trans_b, int64_t m, int64_t n,
              int64_t k, double alpha, const void *a, int64_t lda, const void *b, int64_t ldb,
              double beta, void *c, int64_t ldc, k3rt_error *err)
{
    OPS_ON_CUDA(s, "gemm", cuda_gemm(s, dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb,
                                     beta, c, ldc, err));
    K3RT_TRY(check_cpu_float(s, dtype, "gemm", err));
    gemm_split(dtype, trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc,
               k3rt_stream_threads(s));
    return K3RT_OK;
}

int k3rt_gemm_strided_batched_into(k3rt_stream *s, int dtype, int trans_a, int trans_b,
                                   int64_t m, int64_t n, int64_t k, double alpha, const void *a,
                                   int64_t lda, int64_t stride_a, const void *b, int64_t ldb,
                                   int64_t stride_b, double beta, const void *c, void *d,
                                   int64_t ldc, int64_t stride_c, int64_t batch, k3rt_error *err)
{
    OPS_ON_CUDA(s, "gemm_strided_batched",
                cuda_gemm_strided_batched(s, dtype, trans_a, trans_b, m, n, k, alpha, a, lda,
                                          stride_a, b, ldb, stride_b, beta, c, d, ldc, stride_c,
                                          batch, err));
    K3RT_TRY(check_cpu_float(s, dtype, "gemm_strided_batched", err));
    size_t es = k3rt_dtype_size(dtype);
    int threads = k3rt_stream_threads(s);
    /* Many small products: one per thread (BLAS then runs single-threaded inside the team); an
     * addend apart from D is copied into it first (BLAS is in place). */
#pragma omp parallel for num_threads(threads) if (batch >= threads && threads > 1) schedule(static)
    for (int64_t i = 0; i < batch; i++) {
        char *di = (char *)d + i * stride_c * es;
        if (c != d && beta != 0.0 && n > 0)
            for (int64_t r = 0; r < m; r++)
                memcpy(di + r * ldc * es, (const char *)c + (i * stride_c + r * ldc) * es,
                       (size_t)n * es);
        gemm_one(dtype, trans_a, trans_b, m, n, k, alpha, (const char *)a + i * stride_a * es,
                 lda, (const char *)b + i * stride_b * es, ldb, beta, di, ldc);
    }
    return K3RT_OK;
}

int k3rt_gemm_strided_batched(k3rt_stream *s, int dtype, int trans_a, int trans_b, int64_t m,
                              int64_t n, int64_t k, double alpha, const void *a, int64_t lda,
                              int64_t stride_a, const void *b, int64_t ldb, int64_t stride_b,
                              double beta, void *c, int64_t ldc, int64_t stride_c,
                              int64_t batch, k3rt_error *err)
{
    return k3rt_gemm_strided_batched_into(s, dtype, trans_a, trans_b, m, n, k, alpha, a, lda,
                                          stride_a, b, ldb, stride_b, beta, c, c, ldc, stride_c,
                                          batch, err);
}

int k3rt_linear_fwd(k3rt_stream *s, int dtype, const void *x, const void *w, const void *bias,
                    void *y, int64_t n, int64_t in, int64_t out, k3rt_error *err)
{
    OPS_ON_CUDA(s, "linear_fwd", cuda_linear_fwd(s, dtype, x, w, bias, y, n, in, out, err));
    K3RT_TRY(check_cpu_float(s, dtype, "linear_fwd", err));
    int threads = k3rt_stream_threads(s);
    gemm_split(dtype, 0, 1, n, out, in, 1.0, x, in, w, in, 0.0, y, out, threads);
    if (bias) {
        size_t es = k3rt_dtype_size(dtype);
        for (int64_t i = 0; i < n; i++)
            K3RT_TRY(k3rt_axpby(s, dtype, out, 1.0, bias, 1.0, (char *)y + i * out * es, err));
    }
    return K3RT_OK;
}

int k3rt_linear_fwd_f32(k3rt_stream *s, int dtype, const void *x, const void *w, float *y,
                        int64_t n, int64_t in, int64_t out, k3rt_error *err)
{
    OPS_ON_CUDA(s, "linear_fwd_f32", cuda_linear_fwd_f32(s, dtype, x, w, y, n, in, out, err));
    if (dtype != K3RT_F32)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "linear_fwd_f32: on the CPU the inputs are "
                         "f32, got %s", k3rt_dtype_name(dtype));
    return k3rt_linear_fwd(s, dtype, x, w, NULL, y, n, in, out, err);
}

int k3rt_linear_bwd(k3rt_stream *s, int dtype, const void *x, const void *w, const void *dy,
                    void *dx, void *dw, void *db, int64_t n, int64_t in, int64_t out,
                    int accumulate_dx, k3rt_error *err)
{
    OPS_ON_CUDA(s, "linear_bwd",
                cuda_linear_bwd(s, dtype, x, w, dy, dx, dw, db, n, in, out, accumulate_dx, err));
    K3RT_TRY(check_cpu_float(s, dtype, "linear_bwd", err));
    int threads = k3rt_stream_threads(s);
    if (dx)
        gemm_split(dtype, 0, 0, n, in, out, 1.0, dy, out, w, in, accumulate_dx ? 1.0 : 0.0, dx,
                   in, threads);
    if (dw)
        gemm_split(dtype, 1, 0, out, in, n, 1.0, dy, out, x, in, 1.0, dw, in, threads);
    if (db) {
        if (dtype == K3RT_F32)
            cpu_bias_grad_f32(dy, db, n, out, threads);
        else
            cpu_bias_grad_f64(dy, db, n, out, threads);
    }
    return K3RT_OK;
}

static int check_offsets(const int64_t *offsets, int64_t groups, k3rt_error *err)
{
    if (!offsets || offsets[0] != 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "grouped linear: offsets must start at 0");
    for (int64_t g = 0; g < groups; g++)
        if (offsets[g + 1] < offsets[g])
            return k3rt_fail(err, K3RT_ERR_INVALID,
                             "grouped linear: offsets decrease at group %lld", (long long)g);
    return K3RT_OK;
}

int k3rt_grouped_linear_fwd(k3rt_stream *s, int dtype, const void *x, const void *w, void *y,
                            const int64_t *offsets, int64_t groups, int64_t in, int64_t out,
                            k3rt_error *err)
{
    OPS_ON_CUDA(s, "grouped_linear_fwd",
                cuda_grouped_linear_fwd(s, dtype, x, w, y, offsets, groups, in, out, err));
    K3RT_TRY(check_cpu_float(s, dtype, "grouped_linear_fwd", err));
    K3RT_TRY(check_offsets(offsets, groups, err));
    size_t es = k3rt_dtype_size(dtype);
    int threads = k3rt_stream_threads(s);
    /* Experts are many small products: one per thread rather than threads per product. */
#pragma omp parallel for num_threads(threads) if (groups > 1 && threads > 1) schedule(dynamic)
    for (int64_t g = 0; g < groups; g++) {
        int64_t r0 = offsets[g], rows = offsets[g + 1] - r0;
        gemm_one(dtype, 0, 1, rows, out, in, 1.0, (const char *)x + r0 * in * es, in,
                 (const char *)w + g * out * in * es, in, 0.0, (char *)y + r0 * out * es, out);
    }
    return K3RT_OK;
}

int k3rt_grouped_linear_bwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                            const void *dy, void *dx, void *dw, const int64_t *offsets,
                            int64_t groups, int64_t in, int64_t out, int accumulate_dx,
                            k3rt_error *err)
{
    OPS_ON_CUDA(s, "grouped_linear_bwd",
                cuda_grouped_linear_bwd(s, dtype, x, w, dy, dx, dw, offsets, groups, in, out,
                                        accumulate_dx, err));
    K3RT_TRY(check_cpu_float(s, dtype, "grouped_linear_bwd", err));
    K3RT_TRY(check_offsets(offsets, groups, err));
    size_t es = k3rt_dtype_size(dtype);
    int threads = k3rt_stream_threads(s);
#pragma omp parallel for num_threads(threads) if (groups > 1 && threads > 1) schedule(dynamic)
    for (int64_t g = 0; g < groups; g++) {
        int64_t r0 = offsets[g], rows = offsets[g + 1] - r0;
        const char *xg = (const char *)x + r0 * in * es, *dyg = (const char *)dy + r0 * out * es;
        if (dx)
            gemm_one(dtype, 0, 0, rows, in, out, 1.0, dyg, out,
                     (const char *)w + g * out * in * es, in,
                     accumulate_dx ? 1.0 : 0.0, (char *)dx + r0 * in * es, in);
        if (dw && rows > 0)
            gemm_one(dtype, 1, 0, out, in, rows, 1.0, dyg, out, xg, in, 1.0,
                     (char *)dw + g * out * in * es, in);
    }
    return K3RT_OK;
}

int ops_widen_offsets(const char *op, const void *offsets, int dtype, int64_t groups,
                      int64_t rows, int64_t **out, k3rt_error *err)
{
    if (groups < 0 || !offsets || (dtype != K3RT_I32 && dtype != K3RT_I64))
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "%s: %lld groups, offsets %s of dtype %s (i32 or i64 please)", op,
                         (long long)groups, offsets ? "given" : "missing", k3rt_dtype_name(dtype));
    int64_t *w = malloc((size_t)(groups + 1) * sizeof *w);
    if (!w)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: no memory for %lld offsets", op,
                         (long long)groups + 1);
    for (int64_t g = 0; g <= groups; g++)
        w[g] = dtype == K3RT_I32 ? ((const int32_t *)offsets)[g] : ((const int64_t *)offsets)[g];
    if (w[0] != 0 || w[groups] > rows) {
        int64_t first = w[0], last = w[groups];
        free(w);
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "%s: offsets run from %lld to %lld; they must start at 0 and end at "
                         "most at rows = %lld",
                         op, (long long)first, (long long)last, (long long)rows);
    }
    *out = w;
    return K3RT_OK;
}

int k3rt_grouped_linear_fwd_dev(k3rt_stream *s, int dtype, const void *x, const void *w,
                                void *y, const void *offsets, int offsets_dtype, int64_t groups,
                                int64_t rows, int64_t in, int64_t out, k3rt_error *err)
{
    OPS_ON_CUDA(s, "grouped_linear_fwd_dev",
                cuda_grouped_linear_fwd_dev(s, dtype, x, w, y, offsets, offsets_dtype, groups,
                                            rows, in, out, err));
    int64_t *off;
    K3RT_TRY(ops_widen_offsets("grouped_linear_fwd_dev", offsets, offsets_dtype, groups, rows,
                               &off, err));
    int rc = k3rt_grouped_linear_fwd(s, dtype, x, w, y, off, groups, in, out, err);
    free(off);
    return rc;
}

int k3rt_grouped_linear_bwd_dev(k3rt_stream *s, int dtype, const void *x, const void *w,
                                const void *dy, void *dx, void *dw, const void *offsets,
                                int offsets_dtype, int64_t groups, int64_t rows, int64_t in,
                                int64_t out, int accumulate_dx, k3rt_error *err)
{
    OPS_ON_CUDA(s, "grouped_linear_bwd_dev",
                cuda_grouped_linear_bwd_dev(s, dtype, x, w, dy, dx, dw, offsets, offsets_dtype,
                                            groups, rows, in, out, accumulate_dx, err));
    int64_t *off;
    K3RT_TRY(ops_widen_offsets("grouped_linear_bwd_dev", offsets, offsets_dtype, groups, rows,
                               &off, err));
    int rc = k3rt_grouped_linear_bwd(s, dtype, x, w, dy, dx, dw, off, groups, in, out,
                                     accumulate_dx, err);
    free(off);
    return rc;
}

int k3rt_grouped_linear_dw_dev(k3rt_stream *s, int dtype, const void *x, const void *dy,
                               void *dw, const void *offsets, int offsets_dtype, int64_t groups,
                               int64_t rows, int64_t in, int64_t out, int accumulate,
                               k3rt_error *err)
{
    OPS_ON_CUDA(s, "grouped_linear_dw_dev",
                cuda_grouped_linear_dw_dev(s, dtype, x, dy, dw, offsets, offsets_dtype, groups,
                                           rows, in, out, accumulate, err));
    K3RT_TRY(check_cpu_float(s, dtype, "grouped_linear_dw_dev", err));
    if (!accumulate && groups > 0 && in > 0 && out > 0)
        memset(dw, 0, (size_t)(groups * out * in) * k3rt_dtype_size(dtype));
    return k3rt_grouped_linear_bwd_dev(s, dtype, x, NULL, dy, NULL, dw, offsets, offsets_dtype,
                                       groups, rows, in, out, 0, err);
}
