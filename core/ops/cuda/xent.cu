// Softmax cross-entropy over rows of logits(n,v): one 256-thread block per row, 16-byte loads
// when v and the pointers allow, fp32 arithmetic; loss and lse are F32.
//   forward   each thread keeps an online (max, sum of exp) over its elements; the pairs are
//             merged by a fixed shuffle tree, so lse = max + log(sum) is deterministic.
//             loss = lse - logit[target]; a target < 0 gives loss 0.
//   backward  dlogits = (exp(logit - lse) - onehot(target)) * scale, in place if asked;
//             a row with target < 0 is zero.
// A target >= v makes the row's outputs NaN and is recorded.
#include "ops/cuda/internal.cuh"

namespace {

constexpr int kThreads = 256;

struct max_sum {
    float m, s;  // running max and sum of exp(x - m); m == -inf means empty
};

__device__ __forceinline__ max_sum merge(max_sum a, max_sum b)
{
    float m = fmaxf(a.m, b.m);
    float s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - m)) +
              (b.m == -INFINITY ? 0.0f : b.s * expf(b.m - m));
    return {m, s};
}

__device__ __forceinline__ void add(max_sum &a, float x)
{
    if (x > a.m) {
        a.s = (a.m == -INFINITY ? 0.0f : a.s * expf(a.m - x)) + 1.0f;
        a.m = x;
    } else if (x != -INFINITY) {
        a.s += expf(x - a.m);  // a NaN logit lands here and makes the sum NaN
    }
}

__device__ __forceinline__ max_sum warp_merge(max_sum v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        max_sum w = {__shfl_xor_sync(0xffffffffu, v.m, o), __shfl_xor_sync(0xffffffffu, v.s, o)};
        v = merge(v, w);
    }
    return v;
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
xent_fwd_kernel(const T *logits, const int32_t *targets, float *loss, float *lse, int64_t v,
                cu_index_record *rec)
{
    __shared__ float sm[32], ss[32];
    int64_t row = blockIdx.x;
    const T *l = logits + row * v;
    max_sum acc = {-INFINITY, 0.0f};
    for (int64_t c = (int64_t)threadIdx.x * V; c < v; c += kThreads * V) {
        float x[V];
        load<V>(l + c, x);
#pragma unroll
        for (int e = 0; e < V; e++)
            add(acc, x[e]);
    }
    acc = warp_merge(acc);
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (lane == 0) {
        sm[warp] = acc.m;
        ss[warp] = acc.s;
    }
    __syncthreads();
    if (warp == 0) {
        max_sum w = {-INFINITY, 0.0f};
        if (lane < kThreads / 32)
            w = {sm[lane], ss[lane]};
        w = warp_merge(w);
        if (lane == 0) {
            float z = w.m + logf(w.s);
            int64_t t = targets[row];
            float lo = 0.0f;
            if (t >= v) {
                report_bad_index(rec, CU_IDX_XENT_FWD, row, t, v);
                z = lo = __int_as_float(0x7fc00000);
            } else if (t >= 0) {
                lo = z - to_f(l[t]);
            }
            if (lse)
                lse[row] = z;
            if (loss)
                loss[row] = lo;
        }
    }
}

template <typename T, int V>
__global__ void __launch_bounds__(kThreads)
xent_bwd_kernel(const T *logits, const int32_t *targets, const float *lse, float scale,
                T *dlogits, int64_t v, cu_index_record *rec)
{
    int64_t row = blockIdx.x, t = targets[row];
    const T *l = logits + row * v;
    T *dl = dlogits + row * v;
    float z = lse[row];
    bool bad = t >= v;
    if (bad && threadIdx.x == 0)
        report_bad_index(rec, CU_IDX_XENT_BWD, row, t, v);
    for (int64_t c = (int64_t)threadIdx.x * V; c < v; c += kThreads * V) {
        float x[V];
        load<V>(l + c, x);
#pragma unroll
        for (int e = 0; e < V; e++) {
            float g = expf(x[e] - z) * scale;
            if (c + e == t)
                g -= scale;
            x[e] = bad ? __int_as_float(0x7fc00000) : t < 0 ? 0.0f : g;
        }
        store<V>(dl + c, x);
    }
}

template <typename T> bool rows_vectorize(int64_t v, const void *a, const void *b)
{
    return v % vec_width<T>() == 0 && aligned_to(a, 16) && aligned_to(b, 16);
}

template <typename T>
int fwd_t(cuda_stream_ctx *ctx, const T *logits, const int32_t *targets, float *loss, float *lse,
          int64_t n, int64_t v, cu_index_record *rec, k3rt_error *err)
{
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (rows_vectorize<T>(v, logits, nullptr))
        xent_fwd_kernel<T, vec_width<T>()><<<(unsigned)n, kThreads, 0, st>>>(logits, targets,
                                                                             loss, lse, v, rec);
    else
        xent_fwd_kernel<T, 1><<<(unsigned)n, kThreads, 0, st>>>(logits, targets, loss, lse, v,
                                                                rec);
    CU_LAUNCHED("xent_fwd_kernel");
    return K3RT_OK;
}

template <typename T>
int bwd_t(cuda_stream_ctx *ctx, const T *logits, const int32_t *targets, const float *lse,
          float scale, T *dlogits, int64_t n, int64_t v, cu_index_record *rec, k3rt_error *err)
{
    cudaStream_t st = (cudaStream_t)ctx->stream;
    if (rows_vectorize<T>(v, logits, dlogits))
        xent_bwd_kernel<T, vec_width<T>()><<<(unsigned)n, kThreads, 0, st>>>(
            logits, targets, lse, scale, dlogits, v, rec);
    else
        xent_bwd_kernel<T, 1><<<(unsigned)n, kThreads, 0, st>>>(logits, targets, lse, scale,
                                                                dlogits, v, rec);
    CU_LAUNCHED("xent_bwd_kernel");
    return K3RT_OK;
}

int check(const char *op, int dtype, int64_t n, int64_t v, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return cu_bad_dtype(err, op, dtype, "f32 or bf16");
    if (n < 0 || v < 1 || n > INT32_MAX)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s: bad shape (%lld rows, %lld classes)", op,
                         (long long)n, (long long)v);
    return K3RT_OK;
}

}  // namespace

extern "C" int cuda_xent_fwd(k3rt_stream *s, int dtype, const void *logits,
                             const int32_t *targets, void *loss, void *lse, int64_t n, int64_t v,
                             k3rt_error *err)
{
    K3RT_TRY(check("xent_fwd", dtype, n, v, err));
    if (n == 0)
        return K3RT_OK;
    cuda_stream_ctx *ctx;
    cu_index_record *rec;
    K3RT_TRY(cu_enter_indexed(s, &ctx, &rec, err));
    if (dtype == K3RT_BF16)
        return fwd_t<bf16>(ctx, (const bf16 *)logits, targets, (float *)loss, (float *)lse, n, v,
                           rec, err);
    return fwd_t<float>(ctx, (const float *)logits, targets, (float *)loss, (float *)lse, n, v,
                        rec, err);
}

extern "C" int cuda_xent_bwd(k3rt_stream *s, int dtype, const void *logits,
                             const int32_t *targets, const void *lse, double scale,
                             void *dlogits, int64_t n, int64_t v, k3rt_error *err)
{
    K3RT_TRY(check("xent_bwd", dtype, n, v, err));
    if (n == 0)
        return K3RT_OK;
    cuda_stream_ctx *ctx;
    cu_index_record *rec;
    K3RT_TRY(cu_enter_indexed(s, &ctx, &rec, err));
    if (dtype == K3RT_BF16)
        return bwd_t<bf16>(ctx, (const bf16 *)logits, targets, (const float *)lse, (float)scale,
                           (bf16 *)dlogits, n, v, rec, err);
    return bwd_t<float>(ctx, (const float *)logits, targets, (const float *)lse, (float)scale,
                        (float *)dlogits, n, v, rec, err);
}
