// Token embedding.
//   forward   out(n,d) = table[tokens[i]]: one block per token row, 16-byte copies when
//             possible; a token outside [0, vocab) gives a NaN row and is recorded.
//   backward  dtable[t] += sum of dout rows whose token is t, deterministically: positions are
//             sorted by token with a stable radix sort (CUB), then per run of equal tokens and
//             tile of columns one block adds its rows in a fixed order (below) and updates the
//             table row once. No atomics; out-of-range tokens are recorded and dropped.
#include <cub/device/device_radix_sort.cuh>

#include "ops/cuda/internal.cuh"

namespace {

constexpr int kThreads = 128;

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
embedding_fwd_kernel(const T *table, const int32_t *tokens, T *out, int64_t n, int64_t vocab,
                     int64_t d, cu_index_record *rec)
{
    int64_t i = blockIdx.x;
    int64_t t = tokens[i];
    T *o = out + i * d;
    if (t < 0 || t >= vocab) {
        float nan[V];
#pragma unroll
        for (int e = 0; e < V; e++)
            nan[e] = __int_as_float(0x7fc00000);
        for (int64_t c = (int64_t)threadIdx.x * V; c < d; c += kThreads * V)
            store<V>(o + c, nan);
        if (threadIdx.x == 0)
            report_bad_index(rec, CU_IDX_EMBEDDING_FWD, i, t, vocab);
        return;
    }
    const T *row = table + t * d;
    for (int64_t c = (int64_t)threadIdx.x * V; c < d; c += kThreads * V)
        *reinterpret_cast<pack<T, V> *>(o + c) = *reinterpret_cast<const pack<T, V> *>(row + c);
}

// Sort keys: the token, or `vocab` (sorted last and skipped) when out of range.
__global__ void embedding_keys_kernel(const int32_t *tokens, uint32_t *keys, uint32_t *pos,
                                      int64_t n, int64_t vocab, cu_index_record *rec)
{
    int64_t step = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += step) {
        int64_t t = tokens[i];
        bool ok = t >= 0 && t < vocab;
        if (!ok)
            report_bad_index(rec, CU_IDX_EMBEDDING_BWD, i, t, vocab);
        keys[i] = (uint32_t)(ok ? t : vocab);
        pos[i] = (uint32_t)i;
    }
}

// Block (b, y) starts work only where sorted entry b begins a run of equal keys, and owns the
// run's columns [y * kTile, (y + 1) * kTile). A run can be thousands of rows long (a frequent
// token; a byte corpus has a few hundred distinct tokens), so its rows are split over the
// block's warps, warp w taking rows b + w, b + w + kWarps, ..., and the warps' partial sums are
// added in warp order: the same bits on every run, without atomics. (One thread summing a
// whole run of a column took 8.5 ms of a 194 ms dense step on the H200.)
constexpr int kWarps = 8, kTile = 256, kPerLane = kTile / 32;

template <typename T>
__global__ void __launch_bounds__(kWarps * 32)
embedding_bwd_kernel(const uint32_t *keys, const uint32_t *pos, const T *dout, float *dtable,
                     int64_t n, int64_t vocab, int64_t d)
{
    int64_t b = blockIdx.x;
    uint32_t key = keys[b];
    if ((int64_t)key >= vocab || (b > 0 && keys[b - 1] == key))
        return;
    int64_t lo = b + 1, hi = n;  // the run's end: keys are sorted, so a binary search
    while (lo < hi) {
        int64_t mid = lo + (hi - lo) / 2;
        if (keys[mid] == key)
            lo = mid + 1;
        else
            hi = mid;
    }
    int64_t end = lo;
    __shared__ float part[kWarps][kTile];
    int warp = (int)threadIdx.x / 32, lane = (int)threadIdx.x % 32;
    int64_t c0 = (int64_t)blockIdx.y * kTile;
    float acc[kPerLane];
#pragma unroll
    for (int k = 0; k < kPerLane; k++)
        acc[k] = 0.0f;
    for (int64_t j = b + warp; j < end; j += kWarps) {
        const T *src = dout + (int64_t)pos[j] * d + c0;
#pragma unroll
        for (int k = 0; k < kPerLane; k++)
            if (c0 + lane + 32 * k < d)
                acc[k] += to_f(src[lane + 32 * k]);
    }
#pragma unroll
    for (int k = 0; k < kPerLane; k++)
        part[warp][lane + 32 * k] = acc[k];
    __syncthreads();
    int t = (int)threadIdx.x;
    if (c0 + t < d) {
        float sum = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; w++)
            sum += part[w][t];
        dtable[(int64_t)key * d + c0 + t] += sum;
    }
}

template <typename T>
int fwd_t(cuda_stream_ctx *ctx, const T *table, const int32_t *tokens, T *out, int64_t n,
          int64_t vocab, int64_t d, cu_index_record *rec, k3rt_error *err)
{
    cudaStream_t st = (cudaStream_t)ctx->stream;
    const int V = vec_width<T>();
    if (d % V == 0 && aligned_to(table, 16) && aligned_to(out, 16))
        embedding_fwd_kernel<T, vec_width<T>()><<<(unsigned)n, kThreads, 0, st>>>(
            table, tokens, out, n, vocab, d, rec);
    else
        embedding_fwd_kernel<T, 1><<<(unsigned)n, kThreads, 0, st>>>(table, tokens, out, n, vocab,
                                                                     d, rec);
    CU_LAUNCHED("embedding_fwd_kernel");
    return K3RT_OK;
}

size_t round_up(size_t x) { return (x + 255) & ~(size_t)255; }

template <typename T>
int bwd_t(cuda_stream_ctx *ctx, const int32_t *tokens, const T *dout, float *dtable, int64_t n,
          int64_t vocab, int64_t d, cu_index_record *rec, k3rt_error *err)
{
    cudaStream_t st = (cudaStream_t)ctx->stream;
    int end_bit = 1;
    while (end_bit < 31 && ((int64_t)1 << end_bit) <= vocab)
        end_bit++;
    size_t sort_bytes = 0;
    CU_TRY(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, (const uint32_t *)nullptr,
                                           (uint32_t *)nullptr, (const uint32_t *)nullptr,
                                           (uint32_t *)nullptr, (int)n, 0, end_bit, st),
           "cub::DeviceRadixSort::SortPairs (sizing)");
    size_t arr = round_up((size_t)n * sizeof(uint32_t));
    void *scratch;
    K3RT_TRY(cuda_ctx_scratch(ctx, 4 * arr + round_up(sort_bytes), &scratch, err));
    char *p = (char *)scratch;
    uint32_t *keys_in = (uint32_t *)p, *pos_in = (uint32_t *)(p + arr);
    uint32_t *keys = (uint32_t *)(p + 2 * arr), *pos = (uint32_t *)(p + 3 * arr);
    void *sort_tmp = p + 4 * arr;

    embedding_keys_kernel<<<grid_for(n, 256, ctx->sms), 256, 0, st>>>(tokens, keys_in, pos_in, n,
                                                                      vocab, rec);
    CU_LAUNCHED("embedding_keys_kernel");
    CU_TRY(cub::DeviceRadixSort::SortPairs(sort_tmp, sort_bytes, keys_in, keys, pos_in, pos,
                                           (int)n, 0, end_bit, st),
           "cub::DeviceRadixSort::SortPairs");
    static_assert(kWarps * 32 == kTile, "one thread per column of the tile in the final sum");
    dim3 grid((unsigned)n, (unsigned)((d + kTile - 1) / kTile));
    embedding_bwd_kernel<T><<<grid, kWarps * 32, 0, st>>>(keys, pos, dout, dtable, n, vocab, d);
    CU_LAUNCHED("embedding_bwd_kernel");
    return K3RT_OK;
}

int check(const char *op, int dtype, int64_t n, int64_t vocab, int64_t d, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return cu_bad_dtype(err, op, dtype, "f32 or bf16");
    if (n < 0 || d < 0 || vocab < 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: negative size", op);
    if (n > INT32_MAX || vocab >= INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: %lld tokens or a vocabulary of %lld is "
                         "beyond 2^31 - 1", op, (long long)n, (long long)vocab);
    return K3RT_OK;
}

}  // namespace

extern "C" int cuda_embedding_fwd(k3rt_stream *s, int dtype, const void *table,
                                  const int32_t *tokens, void *out, int64_t n, int64_t vocab,
                                  int64_t d, k3rt_error *err)
{
    K3RT_TRY(check("embedding_fwd", dtype, n, vocab, d, err));
    if (n == 0 || d == 0)
        return K3RT_OK;
    cuda_stream_ctx *ctx;
    cu_index_record *rec;
    K3RT_TRY(cu_enter_indexed(s, &ctx, &rec, err));
    if (dtype == K3RT_BF16)
        return fwd_t<bf16>(ctx, (const bf16 *)table, tokens, (bf16 *)out, n, vocab, d, rec, err);
    return fwd_t<float>(ctx, (const float *)table, tokens, (float *)out, n, vocab, d, rec, err);
}

extern "C" int cuda_embedding_bwd(k3rt_stream *s, int dtype, const int32_t *tokens,
                                  const void *dout, void *dtable, int64_t n, int64_t vocab,
                                  int64_t d, k3rt_error *err)
{
    K3RT_TRY(check("embedding_bwd", dtype, n, vocab, d, err));
    if (n == 0 || d == 0)
        return K3RT_OK;
    cuda_stream_ctx *ctx;
    cu_index_record *rec;
    K3RT_TRY(cu_enter_indexed(s, &ctx, &rec, err));
    if (dtype == K3RT_BF16)
        return bwd_t<bf16>(ctx, tokens, (const bf16 *)dout, (float *)dtable, n, vocab, d, rec,
                           err);
    return bwd_t<float>(ctx, tokens, (const float *)dout, (float *)dtable, n, vocab, d, rec, err);
}
