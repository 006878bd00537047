// Conversions between f32, f64, bf16 and fp8 e4m3 on the device, through fp32 as the CPU's
// k3rt_convert does: round-to-nearest-even, fp8 saturating at +-448 and NaN -> 0x7f.
#include "ops/cuda/elementwise.cuh"

namespace {

struct copy_op {
    __device__ void operator()(const float *in, float *out) const { out[0] = in[0]; }
};

template <typename TI, typename TO>
int cast_t(cuda_stream_ctx *ctx, const void *src, void *dst, int64_t n, k3rt_error *err)
{
    return ew_launch(ctx, "cast", copy_op{},
                     ew_args<TI, TO, 1, 1>{{(const TI *)src}, {(TO *)dst}}, n, err);
}

template <typename TI>
int cast_from(cuda_stream_ctx *ctx, const void *src, void *dst, int dst_dtype, int64_t n,
              k3rt_error *err)
{
    switch (dst_dtype) {
    case K3RT_F32: return cast_t<TI, float>(ctx, src, dst, n, err);
    case K3RT_F64: return cast_t<TI, double>(ctx, src, dst, n, err);
    case K3RT_BF16: return cast_t<TI, bf16>(ctx, src, dst, n, err);
    default: return cast_t<TI, fp8e4m3>(ctx, src, dst, n, err);
    }
}

bool castable(int dtype)
{
    return dtype == K3RT_F32 || dtype == K3RT_F64 || dtype == K3RT_BF16 || dtype == K3RT_FP8_E4M3;
}

}  // namespace

extern "C" int cuda_cast(k3rt_stream *s, const void *src, int src_dtype, void *dst,
                         int dst_dtype, int64_t n, k3rt_error *err)
{
    if (!castable(src_dtype) || !castable(dst_dtype))
        return k3rt_fail(err, K3RT_ERR_INVALID, "cast: %s -> %s is not a conversion between "
                         "f32, f64, bf16 and fp8e4m3", k3rt_dtype_name(src_dtype),
                         k3rt_dtype_name(dst_dtype));
    if (n < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "cast: negative length %lld", (long long)n);
    if (n == 0)
        return K3RT_OK;
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    if (src_dtype == dst_dtype) {
        CU_TRY(cudaMemcpyAsync(dst, src, (size_t)n * k3rt_dtype_size(src_dtype),
                               cudaMemcpyDeviceToDevice, (cudaStream_t)ctx->stream),
               "cudaMemcpyAsync (cast to the same dtype)");
        return K3RT_OK;
    }
    switch (src_dtype) {
    case K3RT_F32: return cast_from<float>(ctx, src, dst, dst_dtype, n, err);
    case K3RT_F64: return cast_from<double>(ctx, src, dst, dst_dtype, n, err);
    case K3RT_BF16: return cast_from<bf16>(ctx, src, dst, dst_dtype, n, err);
    default: return cast_from<fp8e4m3>(ctx, src, dst, dst_dtype, n, err);
    }
}
