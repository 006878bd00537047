// The KDA layer's elementwise kernels around the recurrence (kda_layer_cuda.h): short conv +
// SiLU (+ per-head L2 norm) forward and backward, the safe forget gate, the output gate, and the
// fixed-order partial sums behind their parameter gradients.
//
// Tiling. The conv kernels give one warp to a (token, head) pair: a head's hd in {32, 64, 128}
// channels are hd / 32 per lane, so the L2 norm's sum over the head is one warp reduction, and
// a lane reads W input rows of its channels (the W - 1 earlier ones come from L1 / L2: each
// input row is read by W tokens). The input gradient and the gate give a thread to an element;
// parameter gradients sum KDA_CU_SUM_ROWS tokens per block into partials, then one pass adds
// the partials in block order. All of these are bound by memory traffic: the forward conv
// reads u (W times, mostly from cache) and writes out once; none does more than a few FLOPs per
// byte.
#include <math.h>

#include "common.cuh"
#include "kda_layer_cuda.h"

using kdacu::bf16;
using kdacu::from_f;
using kdacu::to_f;

namespace kdalayer {
namespace {

constexpr int kThreads = 256;
constexpr int R = KDA_CU_SUM_ROWS;

unsigned blocks_for(int64_t n, int per = kThreads)
{
    int64_t b = (n + per - 1) / per;
    return (unsigned)(b < 1 ? 1 : b);
}

// sigmoid without overflow, with the accurate expf (these kernels are bound by memory).
__device__ __forceinline__ float sigm(float x)
{
    return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

int check(int dtype, const char *what, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda %s: dtype %s (f32 or bf16)", what,
                         k3rt_dtype_name(dtype));
    return K3RT_OK;
}

// ---- documents ------------------------------------------------------------------------------

__global__ void doc_bounds_kernel(int64_t N, const int32_t *docs, int64_t n_docs, int32_t *ds,
                                  int32_t *de)
{
    int64_t n = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= N)
        return;
    int64_t lo = 0, hi = n_docs - 1;  // the last document starting at or before n
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (docs[mid] <= n)
            lo = mid;
        else
            hi = mid - 1;
    }
    ds[n] = docs[lo];
    de[n] = docs[lo + 1];
}

// ---- conv + activation ------------------------------------------------------------------------

struct ConvArgs {
    int64_t B, T, C, W, heads, N;
    const void *u, *halo, *w;
    const int32_t *dstart;
};

// Input row tau (a global token index, or below the row start for halo rows) of channel c, as
// token n sees it; s = start of n's document, rs = its row's start, b its row.
template <typename E>
__device__ __forceinline__ float conv_in(const ConvArgs &a, int64_t b, int64_t rs, int64_t s,
                                         int64_t tau, int64_t c)
{
    if (tau >= s)
        return to_f(((const E *)a.u)[tau * a.C + c]);
    if (a.halo && s == rs)  // tau - rs in [-(W-1), -1]
        return to_f(((const E *)a.halo)[(b * (a.W - 1) + a.W - 1 + (tau - rs)) * a.C + c]);
    return 0.0f;
}

// z of the NPL channels of this lane: c = h * hd + lane + 32 i.
template <typename E, int NPL>
__device__ __forceinline__ void conv_z(const ConvArgs &a, int64_t n, int64_t h, int lane,
                                       float z[NPL])
{
    const int64_t b = n / a.T, rs = b * a.T, s = a.dstart ? a.dstart[n] : rs;
    const E *w = (const E *)a.w;
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const int64_t c = h * (32 * NPL) + lane + 32 * i;
        float acc = 0.0f;
        for (int64_t j = 0; j < a.W; j++)
            acc += to_f(w[c * a.W + j]) * conv_in<E>(a, b, rs, s, n - a.W + 1 + j, c);
        z[i] = acc;
    }
}

template <typename E, int NPL>
__global__ void conv_fwd_kernel(ConvArgs a, int l2, E *out)
{
    const int64_t pair = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (pair >= a.N * a.heads)
        return;  // whole warps leave together: pairs are per warp
    const int64_t n = pair / a.heads, h = pair % a.heads;
    float z[NPL], y[NPL], ss = 0.0f;
    conv_z<E, NPL>(a, n, h, lane, z);
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        y[i] = z[i] * sigm(z[i]);
        ss += y[i] * y[i];
    }
    float r = 1.0f;
    if (l2)
        r = 1.0f / sqrtf(warp_sum(ss) + 1e-6f);
#pragma unroll
    for (int i = 0; i < NPL; i++)
        out[n * a.C + h * (32 * NPL) + lane + 32 * i] = from_f<E>(y[i] * r);
}

// y = silu(z) (r y with l2); dy -> dz = r (dy - (dy . ry) ry) silu'(z), recomputed in fp32.
template <typename E, int NPL>
__global__ void conv_act_bwd_kernel(ConvArgs a, int l2, const E *dout, float *dz)
{
    const int64_t pair = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    const int lane = threadIdx.x & 31;
    if (pair >= a.N * a.heads)
        return;
    const int64_t n = pair / a.heads, h = pair % a.heads;
    float z[NPL], y[NPL], d[NPL], ss = 0.0f;
    conv_z<E, NPL>(a, n, h, lane, z);
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        y[i] = z[i] * sigm(z[i]);
        ss += y[i] * y[i];
        d[i] = to_f(dout[n * a.C + h * (32 * NPL) + lane + 32 * i]);
    }
    if (l2) {
        const float r = 1.0f / sqrtf(warp_sum(ss) + 1e-6f);
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < NPL; i++) {
            y[i] *= r;
            dot += d[i] * y[i];
        }
        dot = warp_sum(dot);
#pragma unroll
        for (int i = 0; i < NPL; i++)
            d[i] = r * (d[i] - dot * y[i]);
    }
#pragma unroll
    for (int i = 0; i < NPL; i++) {
        const float sg = sigm(z[i]);
        dz[n * a.C + h * (32 * NPL) + lane + 32 * i] = d[i] * sg * (1.0f + z[i] * (1.0f - sg));
    }
}

// Rows r < N: du of token r; rows N .. N + B (W-1): dhalo row (b, j), row-local position
// j - (W-1). An input row feeds the outputs t in [tau, tau + W - 1] of its document (a halo
// row: of its row's first document).
template <typename E>
__global__ void conv_bwd_data_kernel(ConvArgs a, const float *dz, const int32_t *dend, E *du,
                                     E *dhalo)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    const int64_t rows = a.N + (dhalo ? a.B * (a.W - 1) : 0);
    if (i >= rows * a.C)
        return;
    const int64_t r = i / a.C, c = i % a.C;
    int64_t tau, lo, e;  // the input row (global index), the outputs it may feed: [lo, e)
    if (r < a.N) {
        tau = lo = r;
        e = dend ? dend[r] : (r / a.T + 1) * a.T;
    } else {
        const int64_t b = (r - a.N) / (a.W - 1), j = (r - a.N) % (a.W - 1), rs = b * a.T;
        tau = rs + j - (a.W - 1), lo = rs;
        e = dend ? dend[rs] : rs + a.T;
    }
    const E *w = (const E *)a.w;
    float acc = 0.0f;
    for (int64_t k = 0; k < a.W; k++) {
        const int64_t t = tau + a.W - 1 - k;
        if (t >= lo && t < e)
            acc += to_f(w[c * a.W + k]) * dz[t * a.C + c];
    }
    if (r < a.N)
        du[r * a.C + c] = from_f<E>(acc);
    else
        dhalo[(r - a.N) * a.C + c] = from_f<E>(acc);
}

// part[blk, c, j] = sum over the block's tokens n of dz[n, c] u[n - W + 1 + j, c].
template <typename E>
__global__ void conv_bwd_w_kernel(ConvArgs a, const float *dz, float *part)
{
    const int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, blk = blockIdx.y;
    if (c >= a.C)
        return;
    const int64_t n0 = blk * R, n1 = n0 + R < a.N ? n0 + R : a.N;
    for (int64_t j = 0; j < a.W; j++) {
        float acc = 0.0f;
        for (int64_t n = n0; n < n1; n++) {
            const int64_t b = n / a.T, rs = b * a.T, s = a.dstart ? a.dstart[n] : rs;
            acc += dz[n * a.C + c] * conv_in<E>(a, b, rs, s, n - a.W + 1 + j, c);
        }
        part[(blk * a.C + c) * a.W + j] = acc;
    }
}

// out[i] += sum_b part[b * n + i], b in order.
__global__ void sum_parts_kernel(const float *part, int64_t nb, int64_t n, float *out)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    float acc = 0.0f;
    for (int64_t b = 0; b < nb; b++)
        acc += part[b * n + i];
    out[i] += acc;
}

// ---- gates ------------------------------------------------------------------------------------

template <typename E>
__global__ void gate_fwd_kernel(int64_t n, int64_t Dg, int64_t dk, float lb, const E *zf,
                                const E *a_log, const E *dtb, E *g)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const int64_t c = i % Dg;
    const float z = to_f(zf[i]) + to_f(dtb[c]), ea = expf(to_f(a_log[c / dk]));
    g[i] = from_f<E>(lb * sigm(ea * z));
}

// Block (32 channels, 8 row groups) over R tokens: dzf, and the block's sums of dz and of
// dg dg/dA_log per channel into part_z / part_a [blk, Dg].
template <typename E>
__global__ void gate_bwd_kernel(int64_t N, int64_t Dg, int64_t dk, float lb, const E *zf,
                                const E *a_log, const E *dtb, const E *dg, E *dzf, float *part_z,
                                float *part_a)
{
    __shared__ float sz[8][33], sa[8][33];
    const int tx = threadIdx.x & 31, ty = threadIdx.x >> 5;
    const int64_t c = (int64_t)blockIdx.x * 32 + tx, blk = blockIdx.y;
    float accz = 0.0f, acca = 0.0f;
    if (c < Dg) {
        const float ea = expf(to_f(a_log[c / dk])), bias = to_f(dtb[c]);
        const int64_t n1 = blk * R + R < N ? blk * R + R : N;
        for (int64_t n = blk * R + ty; n < n1; n += 8) {
            const int64_t i = n * Dg + c;
            const float y = ea * (to_f(zf[i]) + bias), sg = sigm(y);
            const float ds = lb * sg * (1.0f - sg), d = to_f(dg[i]);
            const float dz = d * ds * ea;
            dzf[i] = from_f<E>(dz);
            accz += dz;
            acca += d * ds * y;
        }
    }
    sz[ty][tx] = accz, sa[ty][tx] = acca;
    __syncthreads();
    if (ty == 0 && c < Dg) {
        float z = 0.0f, a = 0.0f;
        for (int k = 0; k < 8; k++)
            z += sz[k][tx], a += sa[k][tx];
        part_z[blk * Dg + c] = z;
        part_a[blk * Dg + c] = a;
    }
}

// One block per value head: d_dt_bias[c] += sum_b part_z[b, c]; d_a_log[h] += the head's
// channels of sum_b part_a[b, c], summed in channel order.
__global__ void gate_finish_kernel(const float *part_z, const float *part_a, int64_t nb,
                                   int64_t Dg, int64_t dk, float *d_dtb, float *d_alog)
{
    __shared__ float sa[128];
    const int64_t h = blockIdx.x;
    float head = 0.0f;
    for (int64_t c0 = 0; c0 < dk; c0 += 128) {
        const int64_t c = h * dk + c0 + threadIdx.x;
        float z = 0.0f, a = 0.0f;
        if (c0 + threadIdx.x < dk) {
            for (int64_t b = 0; b < nb; b++)
                z += part_z[b * Dg + c], a += part_a[b * Dg + c];
            d_dtb[c] += z;
        }
        sa[threadIdx.x] = a;
        __syncthreads();
        if (threadIdx.x == 0)
            for (int k = 0; k < 128 && c0 + k < dk; k++)
                head += sa[k];
        __syncthreads();
    }
    if (threadIdx.x == 0)
        d_alog[h] += head;
}

template <typename E>
__global__ void ogate_fwd_kernel(int64_t n, const E *on, const E *G, E *yg)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        yg[i] = from_f<E>(to_f(on[i]) * sigm(to_f(G[i])));
}

template <typename E>
__global__ void ogate_bwd_kernel(int64_t n, const E *on, const E *G, const E *dyg, E *don, E *dG)
{
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n)
        return;
    const float sg = sigm(to_f(G[i])), d = to_f(dyg[i]);
    dG[i] = from_f<E>(d * to_f(on[i]) * sg * (1.0f - sg));
    don[i] = from_f<E>(d * sg);
}

ConvArgs conv_args(int64_t B, int64_t T, int64_t C, int64_t W, int64_t heads, const void *u,
                   const void *halo, const void *w, const int32_t *dstart)
{
    ConvArgs a;
    a.B = B, a.T = T, a.C = C, a.W = W, a.heads = heads, a.N = B * T;
    a.u = u, a.halo = halo, a.w = w, a.dstart = dstart;
    return a;
}

int check_conv(int dtype, int64_t hd, int64_t W, const char *what, k3rt_error *err)
{
    K3RT_TRY(check(dtype, what, err));
    if (hd != 32 && hd != 64 && hd != 128)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "kda cuda %s: head width %lld (32, 64 or "
                         "128)", what, (long long)hd);
    if (W < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda %s: conv width %lld", what,
                         (long long)W);
    return K3RT_OK;
}

template <typename E>
void launch_conv_fwd(cudaStream_t st, const ConvArgs &a, int64_t hd, int l2, void *out)
{
    const unsigned grid = blocks_for(a.N * a.heads * 32);
    if (hd == 32)
        conv_fwd_kernel<E, 1><<<grid, kThreads, 0, st>>>(a, l2, (E *)out);
    else if (hd == 64)
        conv_fwd_kernel<E, 2><<<grid, kThreads, 0, st>>>(a, l2, (E *)out);
    else
        conv_fwd_kernel<E, 4><<<grid, kThreads, 0, st>>>(a, l2, (E *)out);
}

template <typename E>
void launch_conv_act_bwd(cudaStream_t st, const ConvArgs &a, int64_t hd, int l2,
                         const void *dout, float *dz)
{
    const unsigned grid = blocks_for(a.N * a.heads * 32);
    if (hd == 32)
        conv_act_bwd_kernel<E, 1><<<grid, kThreads, 0, st>>>(a, l2, (const E *)dout, dz);
    else if (hd == 64)
        conv_act_bwd_kernel<E, 2><<<grid, kThreads, 0, st>>>(a, l2, (const E *)dout, dz);
    else
        conv_act_bwd_kernel<E, 4><<<grid, kThreads, 0, st>>>(a, l2, (const E *)dout, dz);
}

}  // namespace
}  // namespace kdalayer

using namespace kdalayer;

extern "C" int kda_cu_enter(int device, k3rt_error *err)
{
    KDA_CU_TRY(cudaSetDevice(device), "cudaSetDevice");
    return K3RT_OK;
}

extern "C" int kda_cu_doc_bounds(void *stream, int64_t N, const int32_t *docs, int64_t n_docs,
                                 int32_t *dstart, int32_t *dend, k3rt_error *err)
{
    if (N < 1 || n_docs < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda doc bounds: %lld tokens, %lld "
                         "documents", (long long)N, (long long)n_docs);
    doc_bounds_kernel<<<blocks_for(N), kThreads, 0, (cudaStream_t)stream>>>(N, docs, n_docs,
                                                                           dstart, dend);
    KDA_LAUNCHED("kda doc_bounds_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_conv_fwd(void *stream, int dtype, int64_t B, int64_t T, int64_t heads,
                               int64_t hd, int64_t W, const void *u, const void *halo,
                               const void *w, const int32_t *dstart, int l2, void *out,
                               k3rt_error *err)
{
    K3RT_TRY(check_conv(dtype, hd, W, "conv", err));
    ConvArgs a = conv_args(B, T, heads * hd, W, heads, u, halo, w, dstart);
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        launch_conv_fwd<bf16>(st, a, hd, l2, out);
    else
        launch_conv_fwd<float>(st, a, hd, l2, out);
    KDA_LAUNCHED("kda conv_fwd_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_conv_act_bwd(void *stream, int dtype, int64_t B, int64_t T, int64_t heads,
                                   int64_t hd, int64_t W, const void *u, const void *halo,
                                   const void *w, const int32_t *dstart, int l2,
                                   const void *dout, float *dz, k3rt_error *err)
{
    K3RT_TRY(check_conv(dtype, hd, W, "conv backward", err));
    ConvArgs a = conv_args(B, T, heads * hd, W, heads, u, halo, w, dstart);
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        launch_conv_act_bwd<bf16>(st, a, hd, l2, dout, dz);
    else
        launch_conv_act_bwd<float>(st, a, hd, l2, dout, dz);
    KDA_LAUNCHED("kda conv_act_bwd_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_conv_bwd_data(void *stream, int dtype, int64_t B, int64_t T, int64_t C,
                                    int64_t W, const void *w, const float *dz,
                                    const int32_t *dend, void *du, void *dhalo, k3rt_error *err)
{
    K3RT_TRY(check(dtype, "conv backward", err));
    ConvArgs a = conv_args(B, T, C, W, 1, NULL, NULL, w, NULL);
    if (W < 2)
        dhalo = NULL;
    const int64_t n = (a.N + (dhalo ? B * (W - 1) : 0)) * C;
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        conv_bwd_data_kernel<bf16><<<blocks_for(n), kThreads, 0, st>>>(a, dz, dend, (bf16 *)du,
                                                                       (bf16 *)dhalo);
    else
        conv_bwd_data_kernel<float><<<blocks_for(n), kThreads, 0, st>>>(a, dz, dend, (float *)du,
                                                                        (float *)dhalo);
    KDA_LAUNCHED("kda conv_bwd_data_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_conv_bwd_w(void *stream, int dtype, int64_t B, int64_t T, int64_t C,
                                 int64_t W, const void *u, const void *halo, const float *dz,
                                 const int32_t *dstart, float *part, float *dw, k3rt_error *err)
{
    K3RT_TRY(check(dtype, "conv filter gradient", err));
    ConvArgs a = conv_args(B, T, C, W, 1, u, halo, NULL, dstart);
    const int64_t nb = (a.N + R - 1) / R;
    if (nb > 65535)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda conv filter gradient: %lld tokens "
                         "(at most %lld)", (long long)a.N, (long long)65535 * R);
    cudaStream_t st = (cudaStream_t)stream;
    dim3 grid(blocks_for(C, 128), (unsigned)nb);
    if (dtype == K3RT_BF16)
        conv_bwd_w_kernel<bf16><<<grid, 128, 0, st>>>(a, dz, part);
    else
        conv_bwd_w_kernel<float><<<grid, 128, 0, st>>>(a, dz, part);
    KDA_LAUNCHED("kda conv_bwd_w_kernel");
    sum_parts_kernel<<<blocks_for(C * W), kThreads, 0, st>>>(part, nb, C * W, dw);
    KDA_LAUNCHED("kda sum_parts_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_gate_fwd(void *stream, int dtype, int64_t N, int64_t HV, int64_t dk,
                               double lb, const void *zf, const void *a_log, const void *dt_bias,
                               void *g, k3rt_error *err)
{
    K3RT_TRY(check(dtype, "gate", err));
    const int64_t Dg = HV * dk, n = N * Dg;
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        gate_fwd_kernel<bf16><<<blocks_for(n), kThreads, 0, st>>>(
            n, Dg, dk, (float)lb, (const bf16 *)zf, (const bf16 *)a_log, (const bf16 *)dt_bias,
            (bf16 *)g);
    else
        gate_fwd_kernel<float><<<blocks_for(n), kThreads, 0, st>>>(
            n, Dg, dk, (float)lb, (const float *)zf, (const float *)a_log,
            (const float *)dt_bias, (float *)g);
    KDA_LAUNCHED("kda gate_fwd_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_gate_bwd(void *stream, int dtype, int64_t N, int64_t HV, int64_t dk,
                               double lb, const void *zf, const void *a_log, const void *dt_bias,
                               const void *dg, void *dzf, float *part, float *d_dt_bias,
                               float *d_a_log, k3rt_error *err)
{
    K3RT_TRY(check(dtype, "gate backward", err));
    const int64_t Dg = HV * dk, nb = (N + R - 1) / R;
    if (nb > 65535 || HV > 65535)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda gate backward: %lld tokens, %lld "
                         "heads (at most %lld, 65535)", (long long)N, (long long)HV,
                         (long long)65535 * R);
    float *pz = part, *pa = part + nb * Dg;
    cudaStream_t st = (cudaStream_t)stream;
    dim3 grid(blocks_for(Dg, 32), (unsigned)nb);
    if (dtype == K3RT_BF16)
        gate_bwd_kernel<bf16><<<grid, 256, 0, st>>>(N, Dg, dk, (float)lb, (const bf16 *)zf,
                                                    (const bf16 *)a_log, (const bf16 *)dt_bias,
                                                    (const bf16 *)dg, (bf16 *)dzf, pz, pa);
    else
        gate_bwd_kernel<float><<<grid, 256, 0, st>>>(N, Dg, dk, (float)lb, (const float *)zf,
                                                     (const float *)a_log,
                                                     (const float *)dt_bias, (const float *)dg,
                                                     (float *)dzf, pz, pa);
    KDA_LAUNCHED("kda gate_bwd_kernel");
    gate_finish_kernel<<<(unsigned)HV, 128, 0, st>>>(pz, pa, nb, Dg, dk, d_dt_bias, d_a_log);
    KDA_LAUNCHED("kda gate_finish_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_ogate_fwd(void *stream, int dtype, int64_t n, const void *on,
                                const void *G, void *yg, k3rt_error *err)
{
    K3RT_TRY(check(dtype, "output gate", err));
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        ogate_fwd_kernel<bf16><<<blocks_for(n), kThreads, 0, st>>>(n, (const bf16 *)on,
                                                                   (const bf16 *)G, (bf16 *)yg);
    else
        ogate_fwd_kernel<float><<<blocks_for(n), kThreads, 0, st>>>(n, (const float *)on,
                                                                    (const float *)G,
                                                                    (float *)yg);
    KDA_LAUNCHED("kda ogate_fwd_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_ogate_bwd(void *stream, int dtype, int64_t n, const void *on,
                                const void *G, const void *dyg, void *don, void *dG,
                                k3rt_error *err)
{
    K3RT_TRY(check(dtype, "output gate backward", err));
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        ogate_bwd_kernel<bf16><<<blocks_for(n), kThreads, 0, st>>>(
            n, (const bf16 *)on, (const bf16 *)G, (const bf16 *)dyg, (bf16 *)don, (bf16 *)dG);
    else
        ogate_bwd_kernel<float><<<blocks_for(n), kThreads, 0, st>>>(
            n, (const float *)on, (const float *)G, (const float *)dyg, (float *)don,
            (float *)dG);
    KDA_LAUNCHED("kda ogate_bwd_kernel");
    return K3RT_OK;
}
