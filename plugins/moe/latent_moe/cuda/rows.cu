// Rows between token order and expert-grouped order (lmoe_cuda.h), and the router's backward.
// A warp owns a row (a token, or a grouped row for the gather) and a lane moves 16 bytes at a
// time (8 bf16 or 4 f32) where the row width allows it, else one element: these kernels only
// move memory, and 2-byte accesses left them at a third of the copy bandwidth. Every sum over
// slots runs in slot order and the combine's backward dot products reduce in a fixed shuffle
// tree, so the results do not depend on scheduling: this is the deterministic combine, and the
// only one.
#include "common.cuh"

namespace lmcu {

constexpr int ROW_THREADS = 256, WARP = 32, ROWS_PER_BLOCK = ROW_THREADS / WARP;
constexpr int ROUTER_THREADS = 128;  // a token's E scores, a thread per expert

template <typename T, int V> struct alignas(sizeof(T) * V) vec {
    T v[V];
};

__device__ __forceinline__ int64_t warp_row()
{
    return (int64_t)blockIdx.x * ROWS_PER_BLOCK + threadIdx.x / WARP;
}

__device__ __forceinline__ int lane() { return (int)(threadIdx.x % WARP); }

template <typename T, int V>
__global__ void gather_kernel(const T *c, const int32_t *src, int64_t R, int64_t k, int64_t l,
                              T *xe)
{
    const int64_t row = warp_row();
    if (row >= R)
        return;
    const vec<T, V> *from = (const vec<T, V> *)(c + (int64_t)(src[row] / k) * l);
    vec<T, V> *to = (vec<T, V> *)(xe + row * l);
    for (int64_t i = lane(); i < l / V; i += WARP)
        to[i] = from[i];
}

template <typename T, int V>
__global__ void combine_kernel(const T *ye, const int32_t *pos, const float *w, int64_t N,
                               int64_t k, int64_t l, T *U)
{
    const int64_t t = warp_row();
    if (t >= N)
        return;
    for (int64_t i = lane(); i < l / V; i += WARP) {
        float acc[V];
        for (int e = 0; e < V; e++)
            acc[e] = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            const vec<T, V> y = ((const vec<T, V> *)(ye + (int64_t)pos[t * k + j] * l))[i];
            const float wj = w ? w[t * k + j] : 1.0f;
            for (int e = 0; e < V; e++)
                acc[e] += wj * to_f(y.v[e]);
        }
        vec<T, V> out;
        for (int e = 0; e < V; e++)
            out.v[e] = from_f<T>(acc[e]);
        ((vec<T, V> *)(U + t * l))[i] = out;
    }
}

// The warp's sum in a fixed butterfly: the same bits on every run.
__device__ __forceinline__ float warp_sum(float v)
{
    for (int h = WARP / 2; h > 0; h >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, h);
    return v;
}

template <typename T, int V>
__global__ void combine_bwd_kernel(const T *dU, const T *ye, const int32_t *pos, const float *p,
                                   int64_t N, int64_t k, int64_t l, float *dp, T *dye)
{
    const int64_t t = warp_row();
    if (t >= N)
        return;
    const vec<T, V> *g = (const vec<T, V> *)(dU + t * l);
    for (int64_t j = 0; j < k; j++) {
        const int64_t row = pos[t * k + j];
        const float w = p[t * k + j];
        const vec<T, V> *y = (const vec<T, V> *)(ye + row * l);
        vec<T, V> *dy = (vec<T, V> *)(dye + row * l);
        float dot = 0.0f;
        for (int64_t i = lane(); i < l / V; i += WARP) {
            const vec<T, V> gv = g[i], yv = y[i];
            vec<T, V> out;
            for (int e = 0; e < V; e++) {
                const float ge = to_f(gv.v[e]);
                dot += ge * to_f(yv.v[e]);
                out.v[e] = from_f<T>(w * ge);
            }
            dy[i] = out;
        }
        dot = warp_sum(dot);
        if (lane() == 0)
            dp[t * k + j] = dot;
    }
}

// Per token (spec §1), S = sum of the chosen scores + 1e-20:
//   renormalised p_j = r s_j / S: ds_l = (r / S) (dp_l - sum_j (s_j / S) dp_j) ; plain: r dp_l
// then dz = s (1 - s) (ds + d_scores), in the CPU's order of operations.
__global__ void router_bwd_kernel(const float *s, const int32_t *sel, const float *dp,
                                  const float *d_scores, int E, int k, int renormalize,
                                  float rscale, float *dz)
{
    __shared__ float sh[2];
    const int64_t t = blockIdx.x;
    const float *st = s + t * E;
    const int32_t *sl = sel + t * k;
    const float *dpt = dp + t * k;
    if (threadIdx.x == 0) {
        float scale = rscale, corr = 0.0f;
        if (renormalize) {
            float sum = 0.0f;
            for (int j = 0; j < k; j++)
                sum += st[sl[j]];
            sum += 1e-20f;
            for (int j = 0; j < k; j++)
                corr += st[sl[j]] / sum * dpt[j];
            scale /= sum;
        }
        sh[0] = scale, sh[1] = corr;
    }
    __syncthreads();
    const float scale = sh[0], corr = sh[1];
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        float g = d_scores ? d_scores[t * E + e] : 0.0f;
        for (int j = 0; j < k; j++)
            if (sl[j] == e)
                g += scale * (dpt[j] - corr);
        float se = st[e];
        dz[t * E + e] = g * (se * (1.0f - se));
    }
}

// Launches a warp-per-row kernel over `rows` rows of width l, with 16-byte vectors when every
// row of every operand starts 16-byte aligned (l a multiple of the vector, aligned bases).
#define ROWS_LAUNCH(kernel, T, rows, l, aligned, ...)                                         \
    do {                                                                                     \
        constexpr int V16 = 16 / (int)sizeof(T);                                             \
        const unsigned g_ = (unsigned)(((rows) + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK);       \
        if ((l) % V16 == 0 && (aligned))                                                     \
            kernel<T, V16><<<g_, ROW_THREADS, 0, st>>>(__VA_ARGS__);                         \
        else                                                                                 \
            kernel<T, 1><<<g_, ROW_THREADS, 0, st>>>(__VA_ARGS__);                           \
    } while (0)

static bool aligned16(const void *a, const void *b, const void *c = nullptr)
{
    return (((uintptr_t)a | (uintptr_t)b | (uintptr_t)c) & 15) == 0;
}

template <typename T> static void gather(cudaStream_t st, const void *c, const int32_t *src,
                                         int64_t R, int64_t k, int64_t l, void *xe)
{
    ROWS_LAUNCH(gather_kernel, T, R, l, aligned16(c, xe), (const T *)c, src, R, k, l, (T *)xe);
}

template <typename T> static void combine(cudaStream_t st, const void *ye, const int32_t *pos,
                                          const float *w, int64_t N, int64_t k, int64_t l,
                                          void *U)
{
    ROWS_LAUNCH(combine_kernel, T, N, l, aligned16(ye, U), (const T *)ye, pos, w, N, k, l,
                (T *)U);
}

template <typename T> static void combine_bwd(cudaStream_t st, const void *dU, const void *ye,
                                              const int32_t *pos, const float *p, int64_t N,
                                              int64_t k, int64_t l, float *dp, void *dye)
{
    ROWS_LAUNCH(combine_bwd_kernel, T, N, l, aligned16(dU, ye, dye), (const T *)dU,
                (const T *)ye, pos, p, N, k, l, dp, (T *)dye);
}
static int check_dtype(int dtype, k3rt_error *err)
{
    if (dtype == K3RT_F32 || dtype == K3RT_BF16)
        return K3RT_OK;
    return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "latent_moe: CUDA rows take f32 or bf16, got %s",
                     k3rt_dtype_name(dtype));
}

}  // namespace lmcu

using namespace lmcu;

extern "C" int lmoe_cu_gather(void *stream, int dtype, const void *c, const int32_t *src,
                            int64_t R, int64_t k, int64_t l, void *xe, k3rt_error *err)
{
    K3RT_TRY(check_dtype(dtype, err));
    if (R < 1)
        return K3RT_OK;
    (dtype == K3RT_F32 ? gather<float> : gather<bf16>)((cudaStream_t)stream, c, src, R, k, l, xe);
    LMOE_LAUNCHED("gather_kernel");
    return K3RT_OK;
}

extern "C" int lmoe_cu_combine(void *stream, int dtype, const void *ye, const int32_t *pos,
                             const float *w, int64_t N, int64_t k, int64_t l, void *U,
                             k3rt_error *err)
{
    K3RT_TRY(check_dtype(dtype, err));
    if (N < 1)
        return K3RT_OK;
    (dtype == K3RT_F32 ? combine<float> : combine<bf16>)((cudaStream_t)stream, ye, pos, w, N, k,
                                                         l, U);
    LMOE_LAUNCHED("combine_kernel");
    return K3RT_OK;
}

extern "C" int lmoe_cu_combine_bwd(void *stream, int dtype, const void *dU, const void *ye,
                                 const int32_t *pos, const float *p, int64_t N, int64_t k,
                                 int64_t l, float *dp, void *dye, k3rt_error *err)
{
    K3RT_TRY(check_dtype(dtype, err));
    if (N < 1)
        return K3RT_OK;
    (dtype == K3RT_F32 ? combine_bwd<float> : combine_bwd<bf16>)((cudaStream_t)stream, dU, ye,
                                                                 pos, p, N, k, l, dp, dye);
    LMOE_LAUNCHED("combine_bwd_kernel");
    return K3RT_OK;
}

extern "C" int lmoe_cu_router_bwd(void *stream, const float *s, const int32_t *sel,
                                const float *dp, const float *d_scores, int64_t N, int64_t E,
                                int64_t k, int renormalize, double rscale, float *dz,
                                k3rt_error *err)
{
    if (N < 1)
        return K3RT_OK;
    router_bwd_kernel<<<blocks(N), ROUTER_THREADS, 0, (cudaStream_t)stream>>>(
        s, sel, dp, d_scores, (int)E, (int)k, renormalize, (float)rscale, dz);
    LMOE_LAUNCHED("router_bwd_kernel");
    return K3RT_OK;
}
