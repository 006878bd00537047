// Sum of squares, deterministically: a fixed grid of kBlocks blocks walks the data with a fixed
// thread-to-element map, each thread accumulating squares in fp64; blocks reduce by a fixed
// shuffle tree into partial sums, and one block adds the partials in the same way. The grid
// does not depend on the device, so the bits depend only on the data and its alignment (which
// picks 16-byte or scalar loads). NaN/Inf propagate to the result.
#include "ops/cuda/internal.cuh"

namespace {

constexpr int kBlocks = 1024, kThreads = 256;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads) sumsq_partial_kernel(const T *x, int64_t n,
                                                                 double *part)
{
    __shared__ double sh[32];
    int64_t step = (int64_t)kBlocks * kThreads;
    int64_t tid = (int64_t)blockIdx.x * kThreads + threadIdx.x, nv = n / V;
    double acc = 0.0;
    for (int64_t c = tid; c < nv; c += step) {
        float v[V];
        load<V>(x + c * V, v);
#pragma unroll
        for (int e = 0; e < V; e++)
            acc += (double)v[e] * (double)v[e];
    }
    for (int64_t i = nv * V + tid; i < n; i += step) {
        double v = to_f(x[i]);
        acc += v * v;
    }
    acc = block_sum(acc, sh);
    if (threadIdx.x == 0)
        part[blockIdx.x] = acc;
}

// One block of kBlocks threads: each takes one partial.
__global__ void __launch_bounds__(kBlocks) sumsq_final_kernel(const double *part, double *out,
                                                              int accumulate)
{
    __shared__ double sh[32];
    double v = block_sum(part[threadIdx.x], sh);
    if (threadIdx.x == 0)
        *out = accumulate ? *out + v : v;
}

template <typename T>
int run(cuda_stream_ctx *ctx, const T *x, int64_t n, double *dev_out, int accumulate,
        k3rt_error *err)
{
    void *scratch;
    K3RT_TRY(cuda_ctx_scratch(ctx, kBlocks * sizeof(double), &scratch, err));
    double *part = (double *)scratch;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (aligned_to(x, 16))
        sumsq_partial_kernel<T, vec_width<T>()><<<kBlocks, kThreads, 0, st>>>(x, n, part);
    else
        sumsq_partial_kernel<T, 1><<<kBlocks, kThreads, 0, st>>>(x, n, part);
    CU_LAUNCHED("sumsq_partial_kernel");
    sumsq_final_kernel<<<1, kBlocks, 0, st>>>(part, dev_out, accumulate);
    CU_LAUNCHED("sumsq_final_kernel");
    return K3RT_OK;
}

}  // namespace

extern "C" int cuda_sum_squares_device(k3rt_stream *s, int dtype, const void *x, int64_t n,
                                       double *dev_out, int accumulate, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return cu_bad_dtype(err, "sum_squares", dtype, "f32 or bf16");
    if (n < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "sum_squares: negative length %lld",
                         (long long)n);
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    if (dtype == K3RT_BF16)
        return run<bf16>(ctx, (const bf16 *)x, n, dev_out, accumulate, err);
    return run<float>(ctx, (const float *)x, n, dev_out, accumulate, err);
}

extern "C" int cuda_sum_squares(k3rt_stream *s, int dtype, const void *x, int64_t n,
                                double *out, k3rt_error *err)
{
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    // The result lives just past the partials in the stream's scratch memory.
    void *scratch;
    K3RT_TRY(cuda_ctx_scratch(ctx, (kBlocks + 1) * sizeof(double), &scratch, err));
    double *result = (double *)scratch + kBlocks;
    K3RT_TRY(cuda_sum_squares_device(s, dtype, x, n, result, 0, err));
    double h = 0.0;
    CU_TRY(cudaMemcpyAsync(&h, result, sizeof h, cudaMemcpyDeviceToHost,
                           (cudaStream_t)ctx->stream),
           "cudaMemcpyAsync (sum of squares to the host)");
    CU_TRY(cudaStreamSynchronize((cudaStream_t)ctx->stream),
           "cudaStreamSynchronize (sum of squares)");
    *out = h;
    return K3RT_OK;
}
