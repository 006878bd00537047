// Quantile Balancing on the device (bal_cuda.h; the CPU's quantile.c is the oracle): the window,
// the per-token cutoff and required biases, the exact quantile by a radix select per expert and
// the histogram quantile, and the centring. Doubles throughout, as the CPU.
#include <math.h>

#include "common.cuh"

namespace {

constexpr int OBS_WARPS = 4;

__global__ void window_kernel(const float *bias, int E, int64_t bins, double *window)
{
    double mn = bias[0], mx = bias[0];
    for (int e = 1; e < E; e++) {
        mn = bias[e] < mn ? (double)bias[e] : mn;
        mx = bias[e] > mx ? (double)bias[e] : mx;
    }
    window[0] = mn - 1.0;
    window[1] = (mx - mn + 2.0) / (double)bins;
}

// One warp per token: k + 1 rounds of the warp's largest remaining s + b (lane L owns experts
// L, L + 32, ...; a bit mask marks the taken); the last round's value is the cutoff alpha.
__global__ void observe_kernel(const float *scores, const float *bias, int64_t N, int E, int k,
                               const double *window, int64_t bins, double *r_out,
                               unsigned long long *hist)
{
    __shared__ float sb[BAL_CU_MAX_EXPERTS];
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        sb[e] = bias[e];
    __syncthreads();
    const int lane = threadIdx.x & 31;
    const int64_t t = (int64_t)blockIdx.x * OBS_WARPS + (threadIdx.x >> 5);
    if (t >= N)
        return;
    const float *s = scores + t * E;
    unsigned taken = 0;
    double alpha = 0;
    for (int j = 0; j <= k; j++) {
        double bv = 0;
        int bid = -1;
        for (int e = lane, b = 0; e < E; e += 32, b++) {
            double v = (double)s[e] + (double)sb[e];
            if (!(taken >> b & 1u) && (bid < 0 || v > bv || (v == bv && e < bid)))
                bv = v, bid = e;
        }
        for (int o = 16; o > 0; o >>= 1) {
            double ov = __shfl_xor_sync(0xffffffffu, bv, o);
            int oid = __shfl_xor_sync(0xffffffffu, bid, o);
            if (oid >= 0 && (bid < 0 || ov > bv || (ov == bv && oid < bid)))
                bv = ov, bid = oid;
        }
        if (bid >= 0 && (bid & 31) == lane)
            taken |= 1u << (bid >> 5);
        alpha = bv;
    }
    const double lo = window[0], w = window[1];
    for (int e = lane; e < E; e += 32) {
        double r = alpha - (double)s[e];
        if (r_out) {
            r_out[t * E + e] = r;
            continue;
        }
        double x = (r - lo) / w;
        int64_t bin = !(x >= 0) ? 0 : x >= (double)bins ? bins - 1 : (int64_t)x;
        atomicAdd(&hist[(int64_t)e * bins + bin], 1ull);
    }
}

// Order-preserving keys of doubles; every NaN maps to the largest key (the CPU sorts NaN last).
__device__ __forceinline__ unsigned long long key_of(double x)
{
    unsigned long long u = (unsigned long long)__double_as_longlong(x);
    if (isnan(x))
        return ~0ull;
    return (u >> 63) ? ~u : u | (1ull << 63);
}

__device__ __forceinline__ double value_of(unsigned long long key)
{
    unsigned long long u = (key >> 63) ? key & ~(1ull << 63) : ~key;
    return __longlong_as_double((long long)u);
}

// One block per expert: 8 passes of 8 bits from the top fix the key of the idx-th smallest.
__global__ void select_kernel(const double *r, int64_t n, int E, int64_t idx, double *bhat)
{
    __shared__ unsigned long long h[256];
    __shared__ unsigned long long prefix, mask;
    __shared__ long long rest;
    const int e = blockIdx.x;
    if (threadIdx.x == 0)
        prefix = 0, mask = 0, rest = idx;
    for (int shift = 56; shift >= 0; shift -= 8) {
        h[threadIdx.x] = 0;
        __syncthreads();
        for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
            unsigned long long key = key_of(r[i * E + e]);
            if ((key & mask) == prefix)
                atomicAdd(&h[(key >> shift) & 255u], 1ull);
        }
        __syncthreads();
        if (threadIdx.x == 0) {
            unsigned long long digit = 0;
            while ((long long)h[digit] <= rest) {
                rest -= (long long)h[digit];
                digit++;
            }
            prefix |= digit << shift;
            mask |= 255ull << shift;
        }
        __syncthreads();
    }
    if (threadIdx.x == 0)
        bhat[e] = value_of(prefix);
}

// Thread per expert; lo + (b + frac) w without a fused multiply-add, as the CPU computes it.
__global__ void hist_quantile_kernel(const unsigned long long *hist, int E, int64_t bins,
                                     const double *window, double tau, double *bhat)
{
    const int e = blockIdx.x * blockDim.x + threadIdx.x;
    if (e >= E)
        return;
    const double lo = window[0], w = window[1], target = ceil(tau);
    const unsigned long long *h = hist + (int64_t)e * bins;
    long long cum = 0;
    int64_t b = 0;
    while (b < bins - 1 && (double)(cum + (long long)h[b]) < target)
        cum += (long long)h[b++];
    double frac = h[b] > 0 ? (tau - (double)cum) / (double)h[b] : 0.0;
    frac = frac < 0 ? 0 : frac > 1 ? 1 : frac;
    bhat[e] = __dadd_rn(lo, __dmul_rn((double)b + frac, w));
}

__global__ void center_kernel(const double *bhat, int E, float *bias)
{
    __shared__ double mean;
    if (threadIdx.x == 0) {
        double m = 0;
        for (int e = 0; e < E; e++)
            m += bhat[e];
        mean = m / E;
    }
    __syncthreads();
    for (int e = threadIdx.x; e < E; e += blockDim.x)
        bias[e] = (float)(bhat[e] - mean);
}

unsigned grid(int64_t n) { return (unsigned)(n > 0 ? n : 1); }

}  // namespace

extern "C" int bal_cu_enter(int device, k3rt_error *err)
{
    cudaError_t e = cudaSetDevice(device);
    return e == cudaSuccess ? K3RT_OK : bal_cu_fail(err, e, "cudaSetDevice");
}

extern "C" int bal_cu_zero(void *stream, void *p, size_t bytes, k3rt_error *err)
{
    cudaError_t e = cudaMemsetAsync(p, 0, bytes, (cudaStream_t)stream);
    if (e == cudaSuccess && !stream)
        e = cudaStreamSynchronize(0);
    return e == cudaSuccess ? K3RT_OK : bal_cu_fail(err, e, "zeroing balancer state");
}

extern "C" int quantile_cu_window(void *stream, const float *bias, int E, int64_t bins, double *window,
                            k3rt_error *err)
{
    window_kernel<<<1, 1, 0, (cudaStream_t)stream>>>(bias, E, bins, window);
    BAL_LAUNCHED("quantile window_kernel");
    return K3RT_OK;
}

extern "C" int quantile_cu_observe(void *stream, const float *scores, const float *bias, int64_t N,
                             int E, int k, const double *window, int64_t bins, double *r_out,
                             unsigned long long *hist, k3rt_error *err)
{
    if (E > BAL_CU_MAX_EXPERTS || k >= E)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "quantile: on CUDA experts must be <= %d "
                         "and top_k < experts, got top-%d of %d", BAL_CU_MAX_EXPERTS, k, E);
    if (N < 1)
        return K3RT_OK;
    observe_kernel<<<grid((N + OBS_WARPS - 1) / OBS_WARPS), OBS_WARPS * 32, 0,
                     (cudaStream_t)stream>>>(scores, bias, N, E, k, window, bins, r_out, hist);
    BAL_LAUNCHED("quantile observe_kernel");
    return K3RT_OK;
}

extern "C" int quantile_cu_select(void *stream, const double *r, int64_t n, int E, int64_t idx,
                            double *bhat, k3rt_error *err)
{
    if (n < 1 || idx < 0 || idx >= n)
        return k3rt_fail(err, K3RT_ERR_INVALID, "quantile: select index %lld of %lld rows",
                         (long long)idx, (long long)n);
    select_kernel<<<grid(E), 256, 0, (cudaStream_t)stream>>>(r, n, E, idx, bhat);
    BAL_LAUNCHED("quantile select_kernel");
    return K3RT_OK;
}

extern "C" int quantile_cu_hist_quantiles(void *stream, const unsigned long long *hist, int E,
                                    int64_t bins, const double *window, double tau,
                                    double *bhat, k3rt_error *err)
{
    hist_quantile_kernel<<<grid((E + 255) / 256), 256, 0, (cudaStream_t)stream>>>(
        hist, E, bins, window, tau, bhat);
    BAL_LAUNCHED("quantile hist_quantile_kernel");
    return K3RT_OK;
}

extern "C" int quantile_cu_center(void *stream, const double *bhat, int E, float *bias,
                            k3rt_error *err)
{
    center_kernel<<<1, 256, 0, (cudaStream_t)stream>>>(bhat, E, bias);
    BAL_LAUNCHED("quantile center_kernel");
    return K3RT_OK;
}
