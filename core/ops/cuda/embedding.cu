// Token embedding.
//   forward   out(n,d) = table[tokens[i]]: one block per token row, 16-byte copies when
//             possible; a token outside [0, vocab) gives a NaN row and is recorded.
//   backward  dtable[t] += sum of dout rows whose token is t, deterministically: positions are
//             sorted by token with a stable radix sort (CUB), then one block per run of equal
//             tokens adds its rows in position order (each thread owns columns) and updates the
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

// Block b starts work only where sorted entry b begins a run of equal keys.
template <typename T>
__global__ void __launch_bounds__(kThreads)
embedding_bwd_kernel(const uint32_t *keys, const uint32_t *pos, const T *dout, float *dtable,
                     int64_t n, int64_t vocab, int64_t d)
{
    int64_t b = blockIdx.x;
    uint32_t key = keys[b];
    if ((int64_t)key >= vocab || (b > 0 && keys[b - 1] == key))
        return;
    int64_t end = b + 1;
    while (end < n && keys[end] == key)
        end++;
    float *row = dtable + (int64_t)key * d;
    for (int64_t c = threadIdx.x; c < d; c += kThreads) {
        float acc = 0.0f;
#pragma unroll 4
        for (int64_t j = b; j < end; j++)
            acc += to_f(dout[(int64_t)pos[j] * d + c]);
        row[c] += acc;
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
    embedding_bwd_kernel<T><<<(unsigned)n, kThreads, 0, st>>>(keys, pos, dout, dtable, n, vocab,
                                                              d);
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
