// aux_free's counts and sign update, and aux_loss's sequence-wise balance loss with its gradient
// into the scores, on the device (bal_cuda.h; the CPU plugins are the oracle).
#include "common.cuh"

namespace {

constexpr int LOSS_WARPS = 4;

__global__ void accumulate_kernel(const int64_t *counts, int E, int64_t *acc)
{
    int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e < E)
        acc[e] += counts[e];
}

__global__ void sign_update_kernel(const int64_t *acc, int E, double gamma, float *bias)
{
    __shared__ long long total;
    if (threadIdx.x == 0) {
        long long t = 0;
        for (int e = 0; e < E; e++)
            t += acc[e];
        total = t;
    }
    __syncthreads();
    if (total <= 0)
        return;
    for (int e = threadIdx.x; e < E; e += blockDim.x) {
        long long diff = total - (long long)E * acc[e];
        int sign = (diff > 0) - (diff < 0);
        bias[e] = (float)__dadd_rn((double)bias[e], __dmul_rn(gamma, (double)sign));
    }
}

// f[q, e] = E / (k T) * #{t in sequence q : e chosen for t}: one block per sequence.
__global__ void load_kernel(const int32_t *sel, int64_t T, int E, int k, double *f)
{
    __shared__ int cnt[BAL_CU_MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        cnt[e] = 0;
    __syncthreads();
    const int32_t *sq = sel + (int64_t)blockIdx.x * T * k;
    for (int64_t i = threadIdx.x; i < T * k; i += blockDim.x)
        atomicAdd(&cnt[sq[i]], 1);
    __syncthreads();
    const double scale = (double)E / (double)(k * T);
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        f[(int64_t)blockIdx.x * E + e] = (double)cnt[e] * scale;
}

__device__ __forceinline__ double warp_sum(double v)
{
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// One warp per token: S = sum_e s, F = sum_e f_e s_e / S, ds = c (f - F) with
// c = scale alpha / (B T S); Ft[t] = F (0 for a token with S <= 0, whose ds is 0).
__global__ void token_kernel(const float *scores, const double *f, int64_t B, int64_t T, int E,
                             double alpha, double scale, float *ds, double *Ft)
{
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * LOSS_WARPS + (threadIdx.x >> 5);
    if (t >= B * T)
        return;
    const float *s = scores + t * E;
    const double *fq = f + (t / T) * E;
    float *dst = ds + t * E;
    double S = 0, F = 0;
    for (int e = lane; e < E; e += 32)
        S += s[e];
    S = warp_sum(S);
    if (!(S > 0)) {
        for (int e = lane; e < E; e += 32)
            dst[e] = 0.0f;
        if (lane == 0)
            Ft[t] = 0;
        return;
    }
    for (int e = lane; e < E; e += 32)
        F += fq[e] * s[e] / S;
    F = warp_sum(F);
    const double c = scale * alpha / ((double)B * (double)T * S);
    for (int e = lane; e < E; e += 32)
        dst[e] = (float)(c * (fq[e] - F));
    if (lane == 0)
        Ft[t] = F;
}

// loss (+)= (1/B) sum_q alpha (1/T) sum_t F_t, every sum in token order.
__global__ void loss_kernel(const double *Ft, int64_t B, int64_t T, double alpha, int accumulate,
                            double *loss)
{
    double total = 0;
    for (int64_t q = 0; q < B; q++) {
        double lq = 0;
        for (int64_t t = 0; t < T; t++)
            lq += Ft[q * T + t];
        total += alpha * lq / (double)T;
    }
    *loss = accumulate ? *loss + total / (double)B : total / (double)B;
}

unsigned grid(int64_t n) { return (unsigned)(n > 0 ? n : 1); }

}  // namespace

extern "C" int aux_free_cu_accumulate(void *stream, const int64_t *counts, int E, int64_t *acc,
                                k3rt_error *err)
{
    accumulate_kernel<<<grid((E + 255) / 256), 256, 0, (cudaStream_t)stream>>>(counts, E, acc);
    BAL_LAUNCHED("aux_free accumulate_kernel");
    return K3RT_OK;
}

extern "C" int aux_free_cu_update(void *stream, const int64_t *acc, int E, double gamma, float *bias,
                            k3rt_error *err)
{
    sign_update_kernel<<<1, 256, 0, (cudaStream_t)stream>>>(acc, E, gamma, bias);
    BAL_LAUNCHED("aux_free sign_update_kernel");
    return K3RT_OK;
}

extern "C" int64_t aux_loss_cu_scratch(int64_t B, int64_t T, int E)
{
    return (B * E + B * T) * (int64_t)sizeof(double);
}

extern "C" int aux_loss_cu_loss(void *stream, const float *scores, const int32_t *sel, int64_t B,
                          int64_t T, int E, int k, double alpha, double scale, void *scratch,
                          float *d_scores, double *loss_dev, int accumulate, k3rt_error *err)
{
    if (E > BAL_CU_MAX_EXPERTS)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "aux_loss: on CUDA experts must be <= %d, "
                         "got %d", BAL_CU_MAX_EXPERTS, E);
    cudaStream_t st = (cudaStream_t)stream;
    double *f = (double *)scratch, *Ft = f + B * E;
    load_kernel<<<grid(B), 256, 0, st>>>(sel, T, E, k, f);
    BAL_LAUNCHED("aux_loss load_kernel");
    token_kernel<<<grid((B * T + LOSS_WARPS - 1) / LOSS_WARPS), LOSS_WARPS * 32, 0, st>>>(
        scores, f, B, T, E, alpha, scale, d_scores, Ft);
    BAL_LAUNCHED("aux_loss token_kernel");
    loss_kernel<<<1, 1, 0, st>>>(Ft, B, T, alpha, accumulate, loss_dev);
    BAL_LAUNCHED("aux_loss loss_kernel");
    return K3RT_OK;
}
