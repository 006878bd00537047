// A grid-stride elementwise kernel over NI input and NO output arrays of n elements. Each
// thread handles V consecutive elements per step with one access per array (16 bytes for the
// widest type) when every pointer is aligned for it; the n % V tail runs scalar. The operator
// sees fp32 values: op(const float in[NI], float out[NO]). An output may alias an input: each
// element is read before it is written, by the same thread.
#ifndef K3RT_OPS_CUDA_ELEMENTWISE_CUH
#define K3RT_OPS_CUDA_ELEMENTWISE_CUH

#include "ops/cuda/internal.cuh"

template <typename TI, typename TO, int NI, int NO> struct ew_args {
    const TI *in[NI > 0 ? NI : 1];
    TO *out[NO];
};

template <int V, typename TI, typename TO, int NI, int NO, typename Op>
__device__ __forceinline__ void ew_apply(const Op &op, const ew_args<TI, TO, NI, NO> &a,
                                         int64_t i)
{
    float x[NI > 0 ? NI : 1][V], y[NO][V];
#pragma unroll
    for (int k = 0; k < NI; k++)
        load<V>(a.in[k] + i, x[k]);
#pragma unroll
    for (int e = 0; e < V; e++) {
        float xi[NI > 0 ? NI : 1], yo[NO];
#pragma unroll
        for (int k = 0; k < NI; k++)
            xi[k] = x[k][e];
        op(xi, yo);
#pragma unroll
        for (int k = 0; k < NO; k++)
            y[k][e] = yo[k];
    }
#pragma unroll
    for (int k = 0; k < NO; k++)
        store<V>(a.out[k] + i, y[k]);
}

template <int V, typename TI, typename TO, int NI, int NO, typename Op>
__global__ void __launch_bounds__(256) ew_kernel(Op op, ew_args<TI, TO, NI, NO> a, int64_t n)
{
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t nv = n / V;
    for (int64_t c = tid; c < nv; c += step)
        ew_apply<V>(op, a, c * V);
    for (int64_t i = nv * V + tid; i < n; i += step)
        ew_apply<1>(op, a, i);
}

template <typename TI, typename TO, int NI, int NO, typename Op>
int ew_launch(cuda_stream_ctx *ctx, const char *name, const Op &op,
              const ew_args<TI, TO, NI, NO> &a, int64_t n, k3rt_error *err)
{
    if (n <= 0)
        return K3RT_OK;
    constexpr size_t wide = sizeof(TI) > sizeof(TO) ? sizeof(TI) : sizeof(TO);
    constexpr int V = (int)(16 / wide);
    bool vec = true;
    for (int k = 0; k < NI; k++)
        vec = vec && aligned_to(a.in[k], sizeof(TI) * V);
    for (int k = 0; k < NO; k++)
        vec = vec && aligned_to(a.out[k], sizeof(TO) * V);
    const int threads = 256;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (vec)
        ew_kernel<V><<<grid_for(n / V > 0 ? n / V : 1, threads, ctx->sms), threads, 0, st>>>(op,
                                                                                          a, n);
    else
        ew_kernel<1><<<grid_for(n, threads, ctx->sms), threads, 0, st>>>(op, a, n);
    cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess)
        return k3rt_fail(err, K3RT_ERR_DEVICE, "CUDA launch of %s failed: %s (%s)", name,
                         cudaGetErrorName(e), cudaGetErrorString(e));
    return K3RT_OK;
}

#endif
