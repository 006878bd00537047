// Deterministic column sums for parameter gradients: db += sum_rows dy (linear) and
// dgain += sum_rows dy * x * rstd (RMSNorm).
//
// Pass 1: block (cx, p) gives each thread one column and walks rows [p*R, (p+1)*R) in order,
// writing an fp32 partial (parts, d). Pass 2 adds each column's parts in a fixed order (below)
// and accumulates into the F32 output. No atomics, so the bits depend only on the inputs and R;
// R depends only on n.
#include "ops/cuda/internal.cuh"

namespace {

constexpr int kThreads = 256;
constexpr int64_t kRowsPerPart = 64;
constexpr int64_t kMaxParts = 1024;

template <typename T, bool WITH_X>
__global__ void __launch_bounds__(kThreads)
colsum_partial_kernel(const T *dy, const T *x, const float *rstd, float *part, int64_t n,
                      int64_t d, int64_t rows_per_part)
{
    int64_t col = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (col >= d)
        return;
    int64_t r0 = (int64_t)blockIdx.y * rows_per_part, r1 = r0 + rows_per_part;
    if (r1 > n)
        r1 = n;
    float acc = 0.0f;
#pragma unroll 4
    for (int64_t i = r0; i < r1; i++) {
        float g = to_f(dy[i * d + col]);
        if (WITH_X)
            g = g * to_f(x[i * d + col]) * rstd[i];
        acc += g;
    }
    part[(int64_t)blockIdx.y * d + col] = acc;
}

// Pass 2: a block per kFinishCols columns; warp w adds parts w, w + kFinishWarps, ... in
// order, then lane 0's column of each warp's sum is added in warp order. (One thread per
// column walking every part left 4 blocks for d = 1024 and took 58 us on the H200.)
constexpr int kFinishCols = 32, kFinishWarps = 16;

__global__ void __launch_bounds__(kFinishCols * kFinishWarps)
colsum_finish_kernel(const float *part, float *out, int64_t parts, int64_t d)
{
    __shared__ float sums[kFinishWarps][kFinishCols];
    const int lane = threadIdx.x % kFinishCols, w = threadIdx.x / kFinishCols;
    const int64_t col = (int64_t)blockIdx.x * kFinishCols + lane;
    float acc = 0.0f;
    if (col < d) {
#pragma unroll 8
        for (int64_t p = w; p < parts; p += kFinishWarps)
            acc += part[p * d + col];
    }
    sums[w][lane] = acc;
    __syncthreads();
    if (w == 0 && col < d) {
        float total = 0.0f;
#pragma unroll
        for (int k = 0; k < kFinishWarps; k++)
            total += sums[k][lane];
        out[col] += total;
    }
}

template <typename T>
int colsum_t(cuda_stream_ctx *ctx, const T *dy, const T *x, const float *rstd, float *out,
             int64_t n, int64_t d, k3rt_error *err)
{
    int64_t rows = kRowsPerPart, parts = (n + rows - 1) / rows;
    if (parts > kMaxParts) {
        parts = kMaxParts;
        rows = (n + parts - 1) / parts;
        parts = (n + rows - 1) / rows;
    }
    void *scratch;
    K3RT_TRY(cuda_ctx_scratch(ctx, (size_t)(parts * d) * sizeof(float), &scratch, err));
    float *part = (float *)scratch;
    cudaStream_t st = (cudaStream_t)ctx->stream;
    dim3 grid((unsigned)((d + kThreads - 1) / kThreads), (unsigned)parts);
    if (x)
        colsum_partial_kernel<T, true><<<grid, kThreads, 0, st>>>(dy, x, rstd, part, n, d, rows);
    else
        colsum_partial_kernel<T, false><<<grid, kThreads, 0, st>>>(dy, x, rstd, part, n, d, rows);
    CU_LAUNCHED("colsum_partial_kernel");
    return cu_colsum_finish(ctx, part, parts, d, out, err);
}

}  // namespace

int cu_colsum_finish(cuda_stream_ctx *ctx, const float *part, int64_t parts, int64_t d,
                     float *out, k3rt_error *err)
{
    colsum_finish_kernel<<<(unsigned)((d + kFinishCols - 1) / kFinishCols),
                           kFinishCols * kFinishWarps, 0, (cudaStream_t)ctx->stream>>>(
        part, out, parts, d);
    CU_LAUNCHED("colsum_finish_kernel");
    return K3RT_OK;
}

int cu_colsum_accumulate(cuda_stream_ctx *ctx, int dtype, const void *dy, const void *x,
                         const float *rstd, float *out, int64_t n, int64_t d, k3rt_error *err)
{
    if (n <= 0 || d <= 0)
        return K3RT_OK;
    if ((d + kFinishCols - 1) / kFinishCols > INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "column sum: %lld columns is too many",
                         (long long)d);
    if (dtype == K3RT_BF16)
        return colsum_t<bf16>(ctx, (const bf16 *)dy, (const bf16 *)x, rstd, out, n, d, err);
    return colsum_t<float>(ctx, (const float *)dy, (const float *)x, rstd, out, n, d, err);
}
