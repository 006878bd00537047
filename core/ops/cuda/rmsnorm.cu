// RMSNorm over rows of x(n,d): one warp per row, eight rows per 256-thread block; 16-byte
// accesses when d and the pointers allow. fp32 arithmetic for bf16 data; rstd(n) is F32.
//   forward   r = 1/sqrt(mean(x^2) + eps);  y = x r gain
//   backward  u = gain dy;  dx (=|+=) r u - r^3 x (u . x) / d;  dgain += sum_rows dy x r
// At the row widths of rmsnorm_bwd_fused_kernel dx and dgain come from one pass; otherwise
// dgain goes through the deterministic column sum (colsum.cu).
#include "ops/cuda/internal.cuh"

namespace {

constexpr int kWarps = 8;

template <typename T, int V>
__global__ void __launch_bounds__(kWarps * 32)
rmsnorm_fwd_kernel(const T *x, const T *gain, T *y, float *rstd, int64_t n, int64_t d,
                   float eps)
{
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
    if (row >= n)
        return;  // the whole warp leaves together
    const T *xr = x + row * d;
    T *yr = y + row * d;
    float ss = 0.0f;
#pragma unroll 4
    for (int64_t c = (int64_t)lane * V; c < d; c += 32 * V) {
        float v[V];
        load<V>(xr + c, v);
#pragma unroll
        for (int e = 0; e < V; e++)
            ss += v[e] * v[e];
    }
    ss = warp_sum(ss);
    float r = 1.0f / sqrtf(ss / (float)d + eps);
    if (rstd && lane == 0)
        rstd[row] = r;
#pragma unroll 4
    for (int64_t c = (int64_t)lane * V; c < d; c += 32 * V) {
        float v[V], g[V];
        load<V>(xr + c, v);
        if (gain)
            load<V>(gain + c, g);
#pragma unroll
        for (int e = 0; e < V; e++)
            v[e] = v[e] * r * (gain ? g[e] : 1.0f);
        store<V>(yr + c, v);
    }
}

template <typename T, int V>
__global__ void __launch_bounds__(kWarps * 32)
rmsnorm_bwd_kernel(const T *x, const T *gain, const float *rstd, const T *dy, T *dx, int64_t n,
                   int64_t d, int acc)
{
    int lane = threadIdx.x & 31;
    int64_t row = (int64_t)blockIdx.x * kWarps + (threadIdx.x >> 5);
    if (row >= n)
        return;
    const T *xr = x + row * d, *dyr = dy + row * d;
    T *dxr = dx + row * d;
    float dot = 0.0f;
#pragma unroll 4
    for (int64_t c = (int64_t)lane * V; c < d; c += 32 * V) {
        float xv[V], u[V], g[V];
        load<V>(xr + c, xv);
        load<V>(dyr + c, u);
        if (gain)
            load<V>(gain + c, g);
#pragma unroll
        for (int e = 0; e < V; e++)
            dot += (gain ? g[e] * u[e] : u[e]) * xv[e];
    }
    dot = warp_sum(dot);
    float r = rstd[row], k = r * r * r * dot / (float)d;
#pragma unroll 4
    for (int64_t c = (int64_t)lane * V; c < d; c += 32 * V) {
        float xv[V], u[V], g[V], old[V];
        load<V>(xr + c, xv);
        load<V>(dyr + c, u);
        if (gain)
            load<V>(gain + c, g);
        if (acc)
            load<V>(dxr + c, old);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float v = r * (gain ? g[e] * u[e] : u[e]) - k * xv[e];
            u[e] = acc ? old[e] + v : v;
        }
        store<V>(dxr + c, u);
    }
}

// The backward with the gain gradient in the same pass, when a row is exactly NC chunks of
// 32 lanes x V elements: the warp keeps its row's x and dy in registers (one read of each
// instead of the row kernel's two and the column sum's third), and each lane adds
// dy x rstd of its columns over the block's rows; the block's warps then add theirs in order
// into one partial row, which cu_colsum_finish sums over the blocks in order. kFusedRows
// rows a block, so the bits depend on n only (as the column sum's).
constexpr int kFusedRowsPerWarp = 8, kFusedRows = kWarps * kFusedRowsPerWarp;
constexpr int kFusedMaxD = 1024;

template <typename T, int V, int NC>
__global__ void __launch_bounds__(kWarps * 32)
rmsnorm_bwd_fused_kernel(const T *x, const T *gain, const float *rstd, const T *dy, T *dx,
                         float *part, int64_t n, int acc)
{
    constexpr int D = NC * 32 * V;
    __shared__ float sums[kWarps][D];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float dg[NC][V];
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int e = 0; e < V; e++)
            dg[c][e] = 0.0f;
    for (int k = 0; k < kFusedRowsPerWarp; k++) {
        const int64_t row = (int64_t)blockIdx.x * kFusedRows + (int64_t)k * kWarps + warp;
        if (row >= n)
            break;  // the whole warp leaves together
        const T *xr = x + row * D, *dyr = dy + row * D;
        float xv[NC][V], u[NC][V], dot = 0.0f;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int col = (c * 32 + lane) * V;
            float g[V];
            load<V>(xr + col, xv[c]);
            load<V>(dyr + col, u[c]);
            load<V>(gain + col, g);
#pragma unroll
            for (int e = 0; e < V; e++)
                dot += g[e] * u[c][e] * xv[c][e];
        }
        dot = warp_sum(dot);
        const float r = rstd[row], kk = r * r * r * dot / (float)D;
#pragma unroll
        for (int c = 0; c < NC; c++) {
            const int col = (c * 32 + lane) * V;
            float g[V], out[V], old[V];
            load<V>(gain + col, g);
            if (acc)
                load<V>(dx + row * D + col, old);
#pragma unroll
            for (int e = 0; e < V; e++) {
                const float v = r * g[e] * u[c][e] - kk * xv[c][e];
                out[e] = acc ? old[e] + v : v;
                dg[c][e] += u[c][e] * xv[c][e] * r;
            }
            store<V>(dx + row * D + col, out);
        }
    }
#pragma unroll
    for (int c = 0; c < NC; c++)
#pragma unroll
        for (int e = 0; e < V; e++)
            sums[warp][(c * 32 + lane) * V + e] = dg[c][e];
    __syncthreads();
    for (int col = threadIdx.x; col < D; col += kWarps * 32) {
        float t = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; w++)
            t += sums[w][col];
        part[(int64_t)blockIdx.x * D + col] = t;
    }
}

template <typename T> bool can_vectorize(int64_t d, const void *a, const void *b, const void *c,
                                         const void *e)
{
    const int V = vec_width<T>();
    return d % V == 0 && aligned_to(a, 16) && aligned_to(b, 16) && aligned_to(c, 16) &&
           aligned_to(e, 16);
}

unsigned row_blocks(int64_t n) { return (unsigned)((n + kWarps - 1) / kWarps); }

template <typename T>
int fwd_t(cuda_stream_ctx *ctx, const T *x, const T *gain, T *y, float *rstd, int64_t n,
          int64_t d, float eps, k3rt_error *err)
{
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (can_vectorize<T>(d, x, gain, y, nullptr))
        rmsnorm_fwd_kernel<T, vec_width<T>()><<<row_blocks(n), kWarps * 32, 0, st>>>(
            x, gain, y, rstd, n, d, eps);
    else
        rmsnorm_fwd_kernel<T, 1><<<row_blocks(n), kWarps * 32, 0, st>>>(x, gain, y, rstd, n, d,
                                                                         eps);
    CU_LAUNCHED("rmsnorm_fwd_kernel");
    return K3RT_OK;
}

// Runs the fused backward when d is one of its row widths (V elements a lane, NC chunks) and
// the rows allow its accesses; false: the caller takes the two-pass path.
template <typename T, int V, int NC>
bool fused_if(int64_t d, cuda_stream_ctx *ctx, const T *x, const T *gain, const float *rstd,
              const T *dy, T *dx, float *dgain, int64_t n, int acc, int *rc, k3rt_error *err)
{
    if (d != NC * 32 * V || !aligned_to(x, sizeof(T) * V) || !aligned_to(dy, sizeof(T) * V) ||
        !aligned_to(dx, sizeof(T) * V) || !aligned_to(gain, sizeof(T) * V))
        return false;
    const int64_t blocks = (n + kFusedRows - 1) / kFusedRows;
    void *part;
    *rc = cuda_ctx_scratch(ctx, (size_t)(blocks * d) * sizeof(float), &part, err);
    if (*rc)
        return true;
    rmsnorm_bwd_fused_kernel<T, V, NC><<<(unsigned)blocks, kWarps * 32, 0,
                                         (cudaStream_t)ctx->stream>>>(
        x, gain, rstd, dy, dx, (float *)part, n, acc);
    cudaError_t e = cudaGetLastError();
    *rc = e == cudaSuccess ? cu_colsum_finish(ctx, (const float *)part, blocks, d, dgain, err)
                           : k3rt_fail(err, K3RT_ERR_DEVICE, "launch of rmsnorm_bwd_fused_kernel: "
                                       "%s", cudaGetErrorString(e));
    return true;
}

// dx and dgain in one pass over the rows (d = 128 .. 1024 in the widths below, a gain given).
template <typename T>
bool fused_bwd(cuda_stream_ctx *ctx, const T *x, const T *gain, const float *rstd, const T *dy,
               T *dx, float *dgain, int64_t n, int64_t d, int acc, int *rc, k3rt_error *err)
{
    constexpr int V = vec_width<T>();
    if (!gain || !dx || !dgain || d > kFusedMaxD)
        return false;
    return fused_if<T, V, 1>(d, ctx, x, gain, rstd, dy, dx, dgain, n, acc, rc, err) ||
           fused_if<T, V, 2>(d, ctx, x, gain, rstd, dy, dx, dgain, n, acc, rc, err) ||
           fused_if<T, V, 4>(d, ctx, x, gain, rstd, dy, dx, dgain, n, acc, rc, err) ||
           fused_if<T, V / 2, 1>(d, ctx, x, gain, rstd, dy, dx, dgain, n, acc, rc, err) ||
           (V == 4 && fused_if<T, 4, 8>(d, ctx, x, gain, rstd, dy, dx, dgain, n, acc, rc, err));
}

template <typename T>
int bwd_t(cuda_stream_ctx *ctx, const T *x, const T *gain, const float *rstd, const T *dy, T *dx,
          int64_t n, int64_t d, int acc, k3rt_error *err)
{
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (can_vectorize<T>(d, x, gain, dy, dx))
        rmsnorm_bwd_kernel<T, vec_width<T>()><<<row_blocks(n), kWarps * 32, 0, st>>>(
            x, gain, rstd, dy, dx, n, d, acc);
    else
        rmsnorm_bwd_kernel<T, 1><<<row_blocks(n), kWarps * 32, 0, st>>>(x, gain, rstd, dy, dx,
                                                                         n, d, acc);
    CU_LAUNCHED("rmsnorm_bwd_kernel");
    return K3RT_OK;
}

int check(const char *op, int dtype, int64_t n, int64_t d, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return cu_bad_dtype(err, op, dtype, "f32 or bf16");
    if (n < 0 || d < 0 || (n + kWarps - 1) / kWarps > INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: bad shape (%lld, %lld)", op, (long long)n,
                         (long long)d);
    return K3RT_OK;
}

}  // namespace

extern "C" int cuda_rmsnorm_fwd(k3rt_stream *s, int dtype, const void *x, const void *gain,
                                void *y, void *rstd, int64_t n, int64_t d, double eps,
                                k3rt_error *err)
{
    K3RT_TRY(check("rmsnorm_fwd", dtype, n, d, err));
    if (n == 0 || d == 0)
        return K3RT_OK;
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    if (dtype == K3RT_BF16)
        return fwd_t<bf16>(ctx, (const bf16 *)x, (const bf16 *)gain, (bf16 *)y, (float *)rstd, n,
                           d, (float)eps, err);
    return fwd_t<float>(ctx, (const float *)x, (const float *)gain, (float *)y, (float *)rstd, n,
                        d, (float)eps, err);
}

extern "C" int cuda_rmsnorm_bwd(k3rt_stream *s, int dtype, const void *x, const void *gain,
                                const void *rstd, const void *dy, void *dx, void *dgain,
                                int64_t n, int64_t d, int accumulate_dx, k3rt_error *err)
{
    K3RT_TRY(check("rmsnorm_bwd", dtype, n, d, err));
    if (n == 0 || d == 0)
        return K3RT_OK;
    cuda_stream_ctx *ctx;
    K3RT_TRY(cu_enter(s, &ctx, err));
    int rc = K3RT_OK;
    if (dtype == K3RT_BF16 ? fused_bwd<bf16>(ctx, (const bf16 *)x, (const bf16 *)gain,
                                             (const float *)rstd, (const bf16 *)dy, (bf16 *)dx,
                                             (float *)dgain, n, d, accumulate_dx, &rc, err)
                           : fused_bwd<float>(ctx, (const float *)x, (const float *)gain,
                                              (const float *)rstd, (const float *)dy,
                                              (float *)dx, (float *)dgain, n, d, accumulate_dx,
                                              &rc, err))
        return rc;
    if (dx) {
        if (dtype == K3RT_BF16)
            K3RT_TRY(bwd_t<bf16>(ctx, (const bf16 *)x, (const bf16 *)gain, (const float *)rstd,
                                 (const bf16 *)dy, (bf16 *)dx, n, d, accumulate_dx, err));
        else
            K3RT_TRY(bwd_t<float>(ctx, (const float *)x, (const float *)gain, (const float *)rstd,
                                  (const float *)dy, (float *)dx, n, d, accumulate_dx, err));
    }
    if (dgain)
        K3RT_TRY(cu_colsum_accumulate(ctx, dtype, dy, x, (const float *)rstd, (float *)dgain, n,
                                      d, err));
    return K3RT_OK;
}
