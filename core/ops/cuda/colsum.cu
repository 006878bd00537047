// Deterministic column sums for parameter gradients: db += sum_rows dy (linear) and
// dgain += sum_rows dy * x * rstd (RMSNorm).
//
// Pass 1: block (cx, p) gives each thread one column and walks rows [p*R, (p+1)*R) in order,
// writing an fp32 partial (parts, d). Pass 2: one thread per column adds the parts in order and
// accumulates into the F32 output. No atomics, so the bits depend only on the inputs and R;
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

__global__ void __launch_bounds__(kThreads)
colsum_finish_kernel(const float *part, float *out, int64_t parts, int64_t d)
{
    int64_t col = (int64_t)blockIdx.x * kThreads + threadIdx.x;
    if (col >= d)
        return;
    float acc = 0.0f;
    for (int64_t p = 0; p < parts; p++)
        acc += part[p * d + col];
    out[col] += acc;
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
    colsum_finish_kernel<<<grid.x, kThreads, 0, st>>>(part, out, parts, d);
    CU_LAUNCHED("colsum_finish_kernel");
    return K3RT_OK;
}

}  // namespace

int cu_colsum_accumulate(cuda_stream_ctx *ctx, int dtype, const void *dy, const void *x,
                         const float *rstd, float *out, int64_t n, int64_t d, k3rt_error *err)
{
    if (n <= 0 || d <= 0)
        return K3RT_OK;
    if ((d + kThreads - 1) / kThreads > INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "column sum: %lld columns is too many",
                         (long long)d);
    if (dtype == K3RT_BF16)
        return colsum_t<bf16>(ctx, (const bf16 *)dy, (const bf16 *)x, rstd, out, n, d, err);
    return colsum_t<float>(ctx, (const float *)dy, (const float *)x, rstd, out, n, d, err);
}
