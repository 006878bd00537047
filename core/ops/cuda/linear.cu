// Linear and grouped (expert) linear layers as cuBLASLt products; weights are [out, in].
//   forward  y(n,out)  = x(n,in) W^T (+ bias, through the epilogue)
//   backward dx(n,in)  = dy W            (overwrite or accumulate, model dtype)
//            dW(out,in) += dy^T x        (F32 under bf16: C/D in fp32, beta = 1)
//            db(out)    += column sums of dy (colsum.cu, deterministic)
// The grouped forms run CUTLASS's sm90 grouped GEMM where it applies (cutlass/grouped.h: bf16,
// in and out multiples of 8, sm_90) and otherwise, as the f32 path, one cuBLASLt product per
// non-empty group from host offsets.
#include <stdlib.h>

#include "ops/cuda/cutlass/grouped.h"
#include "ops/cuda/internal.cuh"
extern "C" {
#include "ops/dispatch.h"
}

namespace {

int check_dtype(const char *op, int dtype, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return cu_bad_dtype(err, op, dtype, "f32 or bf16");
    return K3RT_OK;
}

// y(rows,out) = x W^T [+ bias]
int fwd_product(cuda_stream_ctx *ctx, int dtype, const void *x, const void *w, const void *bias,
                void *y, int64_t rows, int64_t in, int64_t out, k3rt_error *err,
                int y_dtype = -1)
{
    cu_matmul mm = {0, 1, rows, out, in, dtype, y_dtype < 0 ? dtype : y_dtype, x, in, 0, w, in,
                    0, y, out, 0, 1, 1.0, 0.0, bias, nullptr};
    return cu_matmul_run(ctx, mm, err);
}

// dx(rows,in) (=|+=) dy W
int dx_product(cuda_stream_ctx *ctx, int dtype, const void *dy, const void *w, void *dx,
               int64_t rows, int64_t in, int64_t out, int acc, k3rt_error *err)
{
    cu_matmul mm = {0, 0, rows, in, out, dtype, dtype, dy, out, 0, w, in, 0, dx, in, 0, 1,
                    1.0, acc ? 1.0 : 0.0, nullptr, nullptr};
    return cu_matmul_run(ctx, mm, err);
}

// dW(out,in) += dy^T x, into the parameter-gradient type.
int dw_product(cuda_stream_ctx *ctx, int dtype, const void *x, const void *dy, void *dw,
               int64_t rows, int64_t in, int64_t out, k3rt_error *err)
{
    cu_matmul mm = {1, 0, out, in, rows, dtype, K3RT_F32, dy, out, 0, x, in, 0, dw, in, 0, 1,
                    1.0, 1.0, nullptr, nullptr};
    return cu_matmul_run(ctx, mm, err);
}

int check_sizes(const char *op, int64_t n, int64_t in, int64_t out, k3rt_error *err)
{
    if (n < 0 || in < 0 || out < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: negative size (rows %lld, in %lld, out %lld)",
                         op, (long long)n, (long long)in, (long long)out);
    return K3RT_OK;
}

}  // namespace

extern "C" int cuda_linear_fwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                               const void *bias, void *y, int64_t n, int64_t in, int64_t out,
                               k3rt_error *err)
{
    K3RT_TRY(check_dtype("linear_fwd", dtype, err));
    K3RT_TRY(check_sizes("linear_fwd", n, in, out, err));
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    return fwd_product(ctx, dtype, x, w, bias, y, n, in, out, err);
}

extern "C" int cuda_linear_fwd_f32(k3rt_stream *s, int dtype, const void *x, const void *w,
                                   float *y, int64_t n, int64_t in, int64_t out, k3rt_error *err)
{
    K3RT_TRY(check_dtype("linear_fwd_f32", dtype, err));
    K3RT_TRY(check_sizes("linear_fwd_f32", n, in, out, err));
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    return fwd_product(ctx, dtype, x, w, nullptr, y, n, in, out, err, K3RT_F32);
}

extern "C" int cuda_linear_bwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                               const void *dy, void *dx, void *dw, void *db, int64_t n,
                               int64_t in, int64_t out, int accumulate_dx, k3rt_error *err)
{
    K3RT_TRY(check_dtype("linear_bwd", dtype, err));
    K3RT_TRY(check_sizes("linear_bwd", n, in, out, err));
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    if (dx)
        K3RT_TRY(dx_product(ctx, dtype, dy, w, dx, n, in, out, accumulate_dx, err));
    if (dw && n > 0)
        K3RT_TRY(dw_product(ctx, dtype, x, dy, dw, n, in, out, err));
    if (db)
        K3RT_TRY(cu_colsum_accumulate(ctx, dtype, dy, nullptr, nullptr, (float *)db, n, out, err));
    return K3RT_OK;
}

static int check_offsets(const char *op, const int64_t *offsets, int64_t groups,
                         k3rt_error *err)
{
    if (!offsets || groups < 0 || offsets[0] != 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: offsets must start at 0", op);
    for (int64_t g = 0; g < groups; g++)
        if (offsets[g + 1] < offsets[g])
            return k3rt_fail(err, K3RT_ERR_INVALID, "%s: offsets decrease at group %lld", op,
                             (long long)g);
    return K3RT_OK;
}

// The one-product-per-group loop, from host offsets.
static int grouped_fwd_loop(cuda_stream_ctx *ctx, int dtype, const void *x, const void *w,
                            void *y, const int64_t *offsets, int64_t groups, int64_t in,
                            int64_t out, k3rt_error *err)
{
    size_t es = k3rt_dtype_size(dtype);
    for (int64_t g = 0; g < groups; g++) {
        int64_t r0 = offsets[g], rows = offsets[g + 1] - r0;
        if (rows == 0)
            continue;
        K3RT_TRY(fwd_product(ctx, dtype, (const char *)x + r0 * in * es,
                             (const char *)w + g * out * in * es, nullptr,
                             (char *)y + r0 * out * es, rows, in, out, err));
    }
    return K3RT_OK;
}

static int grouped_bwd_loop(cuda_stream_ctx *ctx, int dtype, const void *x, const void *w,
                            const void *dy, void *dx, void *dw, const int64_t *offsets,
                            int64_t groups, int64_t in, int64_t out, int accumulate_dx,
                            k3rt_error *err)
{
    size_t es = k3rt_dtype_size(dtype);
    for (int64_t g = 0; g < groups; g++) {
        int64_t r0 = offsets[g], rows = offsets[g + 1] - r0;
        if (rows == 0)
            continue;
        const char *xg = (const char *)x + r0 * in * es, *dyg = (const char *)dy + r0 * out * es;
        if (dx)
            K3RT_TRY(dx_product(ctx, dtype, dyg, (const char *)w + g * out * in * es,
                                (char *)dx + r0 * in * es, rows, in, out, accumulate_dx, err));
        if (dw)
            K3RT_TRY(dw_product(ctx, dtype, xg, dyg, (float *)dw + g * out * in, rows, in, out,
                                err));
    }
    return K3RT_OK;
}

// Whether the CUTLASS kernels take the call (never in a build without CUTLASS).
static bool use_cutlass(const cuda_stream_ctx *ctx, int dtype, int64_t groups, int64_t rows,
                        int64_t in, int64_t out)
{
#ifdef K3RT_HAVE_CUTLASS
    return rows < INT32_MAX && gg_supported(ctx, dtype, groups, in, out);
#else
    (void)ctx, (void)dtype, (void)groups, (void)rows, (void)in, (void)out;
    return false;
#endif
}

// The CUTLASS products of one call: forward, or dx and dW.
static int grouped_cutlass(cuda_stream_ctx *ctx, gg_call c, void *y, void *dx, void *dw,
                           k3rt_error *err)
{
#ifdef K3RT_HAVE_CUTLASS
    if (y) {
        c.kind = GG_FWD, c.out = y;
        K3RT_TRY(gg_run(ctx, c, err));
    }
    if (dx) {
        c.kind = GG_DX, c.out = dx;
        K3RT_TRY(gg_run(ctx, c, err));
    }
    if (dw && c.rows > 0) {
        c.kind = GG_DW, c.out = dw, c.accumulate = 1;
        K3RT_TRY(gg_run(ctx, c, err));
    }
    return K3RT_OK;
#else
    (void)ctx, (void)c, (void)y, (void)dx, (void)dw;
    return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "grouped linear: built without CUTLASS");
#endif
}

// Host offsets into the launch's own copy (the CUTLASS path reads no host memory later).
static gg_host_offsets *narrow_offsets(const int64_t *offsets, int64_t groups,
                                       gg_host_offsets *h)
{
    for (int64_t g = 0; g <= groups; g++)
        h->v[g] = (int32_t)offsets[g];
    return h;
}

static int grouped_enter(const char *op, int dtype, const int64_t *offsets, int64_t groups,
                         int64_t in, int64_t out, k3rt_stream *s, cuda_stream_ctx **ctx,
                         k3rt_error *err)
{
    K3RT_TRY(check_dtype(op, dtype, err));
    K3RT_TRY(check_sizes(op, 0, in, out, err));
    if (offsets)
        K3RT_TRY(check_offsets(op, offsets, groups, err));
    return cu_enter(s, ctx, err);
}

extern "C" int cuda_grouped_linear_fwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                                       void *y, const int64_t *offsets, int64_t groups,
                                       int64_t in, int64_t out, k3rt_error *err)
{
    cuda_stream_ctx *ctx;
    K3RT_TRY(grouped_enter("grouped_linear_fwd", dtype, offsets, groups, in, out, s, &ctx, err));
    int64_t rows = offsets[groups];
    if (!use_cutlass(ctx, dtype, groups, rows, in, out))
        return grouped_fwd_loop(ctx, dtype, x, w, y, offsets, groups, in, out, err);
    gg_host_offsets h;
    gg_call c = {GG_FWD, x, w, nullptr, nullptr, 0, nullptr, 0,
                 narrow_offsets(offsets, groups, &h), groups, rows, in, out};
    return grouped_cutlass(ctx, c, y, nullptr, nullptr, err);
}

extern "C" int cuda_grouped_linear_bwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                                       const void *dy, void *dx, void *dw,
                                       const int64_t *offsets, int64_t groups, int64_t in,
                                       int64_t out, int accumulate_dx, k3rt_error *err)
{
    cuda_stream_ctx *ctx;
    K3RT_TRY(grouped_enter("grouped_linear_bwd", dtype, offsets, groups, in, out, s, &ctx, err));
    int64_t rows = offsets[groups];
    if (!use_cutlass(ctx, dtype, groups, rows, in, out))
        return grouped_bwd_loop(ctx, dtype, x, w, dy, dx, dw, offsets, groups, in, out,
                                accumulate_dx, err);
    gg_host_offsets h;
    gg_call c = {GG_DX, x, w, dy, nullptr, accumulate_dx, nullptr, 0,
                 narrow_offsets(offsets, groups, &h), groups, rows, in, out};
    return grouped_cutlass(ctx, c, nullptr, dx, dw, err);
}

// Device offsets for the loop: copied to the host, which waits for the stream.
static int offsets_to_host(cuda_stream_ctx *ctx, const char *op, const void *offsets, int dtype,
                           int64_t groups, int64_t rows, int64_t **out, k3rt_error *err)
{
    if (groups < 0 || !offsets || (dtype != K3RT_I32 && dtype != K3RT_I64))
        return ops_widen_offsets(op, offsets, dtype, groups, rows, out, err);  // the refusal
    size_t bytes = (size_t)(groups + 1) * k3rt_dtype_size(dtype);
    void *h = malloc(bytes);
    if (!h)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: no memory for %lld offsets", op,
                         (long long)groups + 1);
    cudaStream_t st = (cudaStream_t)ctx->stream;
    cudaError_t e = cudaMemcpyAsync(h, offsets, bytes, cudaMemcpyDeviceToHost, st);
    if (e == cudaSuccess)
        e = cudaStreamSynchronize(st);
    int rc = e == cudaSuccess ? ops_widen_offsets(op, h, dtype, groups, rows, out, err)
                              : cu_fail(err, e, "copy of the group offsets to the host");
    free(h);
    return rc;
}

static int check_dev_offsets(const char *op, const void *offsets, int dtype, int64_t groups,
                             int64_t rows, k3rt_error *err)
{
    if (groups < 0 || rows < 0 || !offsets || (dtype != K3RT_I32 && dtype != K3RT_I64))
        return k3rt_fail(err, K3RT_ERR_INVALID,
                         "%s: %lld groups over %lld rows, offsets %s of dtype %s (i32 or i64 "
                         "please)",
                         op, (long long)groups, (long long)rows, offsets ? "given" : "missing",
                         k3rt_dtype_name(dtype));
    return K3RT_OK;
}

extern "C" int cuda_grouped_linear_fwd_dev(k3rt_stream *s, int dtype, const void *x,
                                           const void *w, void *y, const void *offsets,
                                           int offsets_dtype, int64_t groups, int64_t rows,
                                           int64_t in, int64_t out, k3rt_error *err)
{
    const char *op = "grouped_linear_fwd_dev";
    cuda_stream_ctx *ctx;
    K3RT_TRY(check_dev_offsets(op, offsets, offsets_dtype, groups, rows, err));
    K3RT_TRY(grouped_enter(op, dtype, nullptr, groups, in, out, s, &ctx, err));
    if (use_cutlass(ctx, dtype, groups, rows, in, out)) {
        gg_call c = {GG_FWD, x, w, nullptr, nullptr, 0, offsets, offsets_dtype == K3RT_I64,
                     nullptr, groups, rows, in, out};
        return grouped_cutlass(ctx, c, y, nullptr, nullptr, err);
    }
    int64_t *off;
    K3RT_TRY(offsets_to_host(ctx, op, offsets, offsets_dtype, groups, rows, &off, err));
    int rc = cuda_grouped_linear_fwd(s, dtype, x, w, y, off, groups, in, out, err);
    free(off);
    return rc;
}

extern "C" int cuda_grouped_linear_bwd_dev(k3rt_stream *s, int dtype, const void *x,
                                           const void *w, const void *dy, void *dx, void *dw,
                                           const void *offsets, int offsets_dtype,
                                           int64_t groups, int64_t rows, int64_t in,
                                           int64_t out, int accumulate_dx, k3rt_error *err)
{
    const char *op = "grouped_linear_bwd_dev";
    cuda_stream_ctx *ctx;
    K3RT_TRY(check_dev_offsets(op, offsets, offsets_dtype, groups, rows, err));
    K3RT_TRY(grouped_enter(op, dtype, nullptr, groups, in, out, s, &ctx, err));
    if (use_cutlass(ctx, dtype, groups, rows, in, out)) {
        gg_call c = {GG_DX, x, w, dy, nullptr, accumulate_dx, offsets,
                     offsets_dtype == K3RT_I64, nullptr, groups, rows, in, out};
        return grouped_cutlass(ctx, c, nullptr, dx, dw, err);
    }
    int64_t *off;
    K3RT_TRY(offsets_to_host(ctx, op, offsets, offsets_dtype, groups, rows, &off, err));
    int rc = cuda_grouped_linear_bwd(s, dtype, x, w, dy, dx, dw, off, groups, in, out,
                                     accumulate_dx, err);
    free(off);
    return rc;
}

extern "C" int cuda_grouped_linear_dw_dev(k3rt_stream *s, int dtype, const void *x,
                                          const void *dy, void *dw, const void *offsets,
                                          int offsets_dtype, int64_t groups, int64_t rows,
                                          int64_t in, int64_t out, int accumulate,
                                          k3rt_error *err)
{
    const char *op = "grouped_linear_dw_dev";
    cuda_stream_ctx *ctx;
    K3RT_TRY(check_dev_offsets(op, offsets, offsets_dtype, groups, rows, err));
    K3RT_TRY(grouped_enter(op, dtype, nullptr, groups, in, out, s, &ctx, err));
#ifdef K3RT_HAVE_CUTLASS
    // The kernel overwrites (beta 0, C never read) and zeroes the empty groups itself.
    if (use_cutlass(ctx, dtype, groups, rows, in, out)) {
        gg_call c = {GG_DW, x, nullptr, dy, dw, accumulate != 0, offsets,
                     offsets_dtype == K3RT_I64, nullptr, groups, rows, in, out};
        return gg_run(ctx, c, err);
    }
#endif
    if (!accumulate && groups > 0 && in > 0 && out > 0) {
        cudaError_t e = cudaMemsetAsync(dw, 0, (size_t)(groups * out * in) * sizeof(float),
                                        (cudaStream_t)ctx->stream);
        if (e != cudaSuccess)
            return cu_fail(err, e, "zeroing the grouped weight gradient");
    }
    return cuda_grouped_linear_bwd_dev(s, dtype, x, nullptr, dy, nullptr, dw, offsets,
                                       offsets_dtype, groups, rows, in, out, 0, err);
}
