// Rows between token order and expert-grouped order (lmoe_cuda.h), and the router's backward.
// One block per token (or per grouped row for the gather); every sum over slots runs in slot
// order and the dot products of the combine's backward reduce in a fixed tree, so the results
// do not depend on scheduling: this is the deterministic combine, and the only one.
#include "common.cuh"

namespace lmcu {

constexpr int ROW_THREADS = 128;

template <typename T>
__global__ void gather_kernel(const T *c, const int32_t *src, int64_t k, int64_t l, T *xe)
{
    const int64_t row = blockIdx.x, t = src[row] / k;
    for (int64_t i = threadIdx.x; i < l; i += blockDim.x)
        xe[row * l + i] = c[t * l + i];
}

template <typename T>
__global__ void combine_kernel(const T *ye, const int32_t *pos, const float *w, int64_t k,
                               int64_t l, T *U)
{
    const int64_t t = blockIdx.x;
    for (int64_t i = threadIdx.x; i < l; i += blockDim.x) {
        float acc = 0.0f;
        for (int64_t j = 0; j < k; j++) {
            float y = to_f(ye[(int64_t)pos[t * k + j] * l + i]);
            acc += w ? w[t * k + j] * y : y;
        }
        U[t * l + i] = from_f<T>(acc);
    }
}

// A fixed-shape tree over the block's partial sums.
__device__ float block_sum(float v, float *red)
{
    red[threadIdx.x] = v;
    __syncthreads();
    for (int h = ROW_THREADS / 2; h > 0; h >>= 1) {
        if ((int)threadIdx.x < h)
            red[threadIdx.x] += red[threadIdx.x + h];
        __syncthreads();
    }
    float r = red[0];
    __syncthreads();
    return r;
}

template <typename T>
__global__ void combine_bwd_kernel(const T *dU, const T *ye, const int32_t *pos, const float *p,
                                   int64_t k, int64_t l, float *dp, T *dye)
{
    __shared__ float red[ROW_THREADS];
    const int64_t t = blockIdx.x;
    for (int64_t j = 0; j < k; j++) {
        const int64_t row = pos[t * k + j];
        const float w = p[t * k + j];
        float dot = 0.0f;
        for (int64_t i = threadIdx.x; i < l; i += blockDim.x) {
            float g = to_f(dU[t * l + i]);
            dot += g * to_f(ye[row * l + i]);
            dye[row * l + i] = from_f<T>(w * g);
        }
        dot = block_sum(dot, red);
        if (threadIdx.x == 0)
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

template <typename T> static void gather(cudaStream_t st, const void *c, const int32_t *src,
                                         int64_t R, int64_t k, int64_t l, void *xe)
{
    gather_kernel<T><<<blocks(R), ROW_THREADS, 0, st>>>((const T *)c, src, k, l, (T *)xe);
}

template <typename T> static void combine(cudaStream_t st, const void *ye, const int32_t *pos,
                                          const float *w, int64_t N, int64_t k, int64_t l,
                                          void *U)
{
    combine_kernel<T><<<blocks(N), ROW_THREADS, 0, st>>>((const T *)ye, pos, w, k, l, (T *)U);
}

template <typename T> static void combine_bwd(cudaStream_t st, const void *dU, const void *ye,
                                              const int32_t *pos, const float *p, int64_t N,
                                              int64_t k, int64_t l, float *dp, void *dye)
{
    combine_bwd_kernel<T><<<blocks(N), ROW_THREADS, 0, st>>>((const T *)dU, (const T *)ye, pos,
                                                             p, k, l, dp, (T *)dye);
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
    router_bwd_kernel<<<blocks(N), ROW_THREADS, 0, (cudaStream_t)stream>>>(
        s, sel, dp, d_scores, (int)E, (int)k, renormalize, (float)rscale, dz);
    LMOE_LAUNCHED("router_bwd_kernel");
    return K3RT_OK;
}
