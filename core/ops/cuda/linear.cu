// Linear and grouped (expert) linear layers as cuBLASLt products; weights are [out, in].
//   forward  y(n,out)  = x(n,in) W^T (+ bias, through the epilogue)
//   backward dx(n,in)  = dy W            (overwrite or accumulate, model dtype)
//            dW(out,in) += dy^T x        (F32 under bf16: C/D in fp32, beta = 1)
//            db(out)    += column sums of dy (colsum.cu, deterministic)
// The grouped forms run one product per non-empty group (offsets are on the host).
#include "ops/cuda/internal.cuh"

namespace {

int check_dtype(const char *op, int dtype, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return cu_bad_dtype(err, op, dtype, "f32 or bf16");
    return K3RT_OK;
}

// y(rows,out) = x W^T [+ bias]
int fwd_product(cuda_stream_ctx *ctx, int dtype, const void *x, const void *w, const void *bias,
                void *y, int64_t rows, int64_t in, int64_t out, k3rt_error *err)
{
    cu_matmul mm = {0, 1, rows, out, in, dtype, dtype, x, in, 0, w, in, 0, y, out, 0, 1,
                    1.0, 0.0, bias};
    return cu_matmul_run(ctx, mm, err);
}

// dx(rows,in) (=|+=) dy W
int dx_product(cuda_stream_ctx *ctx, int dtype, const void *dy, const void *w, void *dx,
               int64_t rows, int64_t in, int64_t out, int acc, k3rt_error *err)
{
    cu_matmul mm = {0, 0, rows, in, out, dtype, dtype, dy, out, 0, w, in, 0, dx, in, 0, 1,
                    1.0, acc ? 1.0 : 0.0, nullptr};
    return cu_matmul_run(ctx, mm, err);
}

// dW(out,in) += dy^T x, into the parameter-gradient type.
int dw_product(cuda_stream_ctx *ctx, int dtype, const void *x, const void *dy, void *dw,
               int64_t rows, int64_t in, int64_t out, k3rt_error *err)
{
    cu_matmul mm = {1, 0, out, in, rows, dtype, K3RT_F32, dy, out, 0, x, in, 0, dw, in, 0, 1,
                    1.0, 1.0, nullptr};
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

extern "C" int cuda_grouped_linear_fwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                                       void *y, const int64_t *offsets, int64_t groups,
                                       int64_t in, int64_t out, k3rt_error *err)
{
    K3RT_TRY(check_dtype("grouped_linear_fwd", dtype, err));
    K3RT_TRY(check_sizes("grouped_linear_fwd", 0, in, out, err));
    K3RT_TRY(check_offsets("grouped_linear_fwd", offsets, groups, err));
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
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

extern "C" int cuda_grouped_linear_bwd(k3rt_stream *s, int dtype, const void *x, const void *w,
                                       const void *dy, void *dx, void *dw,
                                       const int64_t *offsets, int64_t groups, int64_t in,
                                       int64_t out, int accumulate_dx, k3rt_error *err)
{
    K3RT_TRY(check_dtype("grouped_linear_bwd", dtype, err));
    K3RT_TRY(check_sizes("grouped_linear_bwd", 0, in, out, err));
    K3RT_TRY(check_offsets("grouped_linear_bwd", offsets, groups, err));
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    size_t es = k3rt_dtype_size(dtype);
    for (int64_t g = 0; g < groups; g++) {
        int64_t r0 = offsets[g], rows = offsets[g + 1] - r0;
        if (rows == 0)
            continue;
        const char *xg = (const char *)x + r0 * in * es, *dyg = (const char *)dy + r0 * out * es;
        const char *wg = (const char *)w + g * out * in * es;
        if (dx)
            K3RT_TRY(dx_product(ctx, dtype, dyg, wg, (char *)dx + r0 * in * es, rows, in, out,
                                accumulate_dx, err));
        if (dw)
            K3RT_TRY(dw_product(ctx, dtype, xg, dyg, (float *)dw + g * out * in, rows, in, out,
                                err));
    }
    return K3RT_OK;
}
