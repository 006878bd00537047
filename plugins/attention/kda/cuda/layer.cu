// The KDA layer's elementwise kernels around the recurrence (kda_layer_cuda.h): short conv +
// SiLU (+ per-head L2 norm) forward and backward, the safe forget gate, and the fixed-order
// partial sums behind their parameter gradients. (The output gate is the core's sigmoid GLU.)
//
// Tiling. The conv kernels give a thread 8 channels of 16 tokens (the section below says how
// the backward does everything in one pass); the gate forward gives a thread 8 elements, the
// gate backward one. Parameter gradients sum KDA_CU_SUM_ROWS tokens per block into partials,
// then one pass adds the partials in block order. None does more than a
// few FLOPs per byte, so each reads its inputs once (a conv's W - 1 earlier rows stay in
// registers) and writes its outputs once; the conv kernels also stay short of the bytes'
// time by the latency of their per-token chains (sigm below says what that cost).
#include <math.h>

#include <type_traits>

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

// sigmoid without overflow. f32 data: the accurate expf and division (the tests' 1e-5 against
// the CPU). bf16 data: the fast exp and division (relative error ~1e-6, far below bf16's
// 2^-9). At 8-16 warps per SM the conv kernels waited on their chains of dependent accurate
// exps and divisions more than on their bytes: with the fast forms (and the ring below) ncu
// gives K3-mini's conv 154 -> 80 us a call forward and 638 -> 230 us backward.
template <typename E> __device__ __forceinline__ float sigm(float x)
{
    if (std::is_same<E, bf16>::value)
        return __fdividef(1.0f, 1.0f + __expf(-x));  // 0 or 1 at the ends, no NaN
    return x >= 0.0f ? 1.0f / (1.0f + expf(-x)) : expf(x) / (1.0f + expf(x));
}

int check(int dtype, const char *what, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda %s: dtype %s (f32 or bf16)", what,
                         k3rt_dtype_name(dtype));
    return K3RT_OK;
}

// ---- documents ------------------------------------------------------------------------------

__global__ void doc_bounds_kernel(int64_t N, const int32_t *docs, int64_t n_docs, int32_t *ds)
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
}

// ---- conv + activation ------------------------------------------------------------------------
//
// A thread owns 8 channels (one 16-byte bf16 vector) of kTile consecutive tokens; a warp is 32
// such channel groups of one token tile, so a head's hd channels are hd / 8 neighbouring lanes
// (the L2 norm's sum is a shuffle over that segment) and a block of 8 warps covers R tokens of
// 256 channels: the R-token partial sums of the filter gradient are one reduction over the
// block's warps, in warp order. The backward is one pass: it recomputes z and the activation,
// forms dz in registers and keeps the last W of them, so each input row's du (which needs dz
// of the W tokens it feeds) and the filter gradient come out of the same pass; dz never goes
// to memory. In the backward the W input rows a token's conv reads also stay in registers from
// token to token (InRows) and the next tokens' rows arrive through a shared-memory ring filled
// by cp.async several tokens ahead (AheadRing): at its one resident block per SM, reloading W
// rows a token, or loading one token ahead in registers, left it waiting on memory.

constexpr int kVec = 8;              // channels per thread
constexpr int kTile = 16;            // tokens per thread
constexpr int kWarps = R / kTile;    // token tiles per block
static_assert(R % kTile == 0 && kWarps * 32 == kThreads, "block = 8 warps of R / 8 tokens");

struct ConvArgs {
    int64_t B, T, C, W, N;
    const void *u, *halo, *w;
    const int32_t *dstart;
    int vec;  // every row 16-byte aligned: vector loads and stores
};

__device__ __forceinline__ void load8(const bf16 *p, int vec, float v[kVec])
{
    if (vec) {
        const uint4 r = *(const uint4 *)p;
        const __nv_bfloat162 *h = (const __nv_bfloat162 *)&r;
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const float2 f = __bfloat1622float2(h[i]);
            v[2 * i] = f.x, v[2 * i + 1] = f.y;
        }
    } else {
#pragma unroll
        for (int i = 0; i < kVec; i++)
            v[i] = to_f(p[i]);
    }
}

__device__ __forceinline__ void load8(const float *p, int vec, float v[kVec])
{
    if (vec) {
        const float4 a = ((const float4 *)p)[0], b = ((const float4 *)p)[1];
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z,
        v[7] = b.w;
    } else {
#pragma unroll
        for (int i = 0; i < kVec; i++)
            v[i] = p[i];
    }
}

__device__ __forceinline__ void store8(bf16 *p, int vec, const float v[kVec])
{
    if (vec) {
        __nv_bfloat162 h[4];
#pragma unroll
        for (int i = 0; i < 4; i++)
            h[i] = __floats2bfloat162_rn(v[2 * i], v[2 * i + 1]);
        *(uint4 *)p = *(const uint4 *)h;
    } else {
#pragma unroll
        for (int i = 0; i < kVec; i++)
            p[i] = from_f<bf16>(v[i]);
    }
}

__device__ __forceinline__ void store8(float *p, int vec, const float v[kVec])
{
    if (vec) {
        ((float4 *)p)[0] = make_float4(v[0], v[1], v[2], v[3]);
        ((float4 *)p)[1] = make_float4(v[4], v[5], v[6], v[7]);
    } else {
#pragma unroll
        for (int i = 0; i < kVec; i++)
            p[i] = v[i];
    }
}

// Sum over the hd / 8 lanes of this lane's head (seg a power of two, segments aligned).
__device__ __forceinline__ float head_sum(float v, int seg)
{
    for (int o = seg >> 1; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Where a thread works: channels c0 .. c0 + 7 (clamped in range when the lane has none, so
// its loads stay valid and its shuffles take part) of tokens t0 .. t0 + kTile - 1.
struct ConvThread {
    int64_t c0, t0;
    bool active;
};

__device__ __forceinline__ ConvThread conv_thread(const ConvArgs &a)
{
    ConvThread p;
    const int64_t g = (int64_t)blockIdx.y * 32 + (threadIdx.x & 31);
    p.active = g * kVec < a.C;
    p.c0 = p.active ? g * kVec : 0;
    p.t0 = (int64_t)blockIdx.x * R + (threadIdx.x >> 5) * kTile;
    return p;
}

template <typename E, int W>
__device__ __forceinline__ void load_filter(const ConvArgs &a, int64_t c0, float wr[W][kVec])
{
    const E *w = (const E *)a.w;
#pragma unroll
    for (int i = 0; i < kVec; i++)
#pragma unroll
        for (int j = 0; j < W; j++)
            wr[j][i] = to_f(w[(c0 + i) * W + j]);
}

// Input row tau of the 8 channels as token t (row start rs, document start s, row b) sees it:
// its document's rows, the row's halo before a row's first document, zeros before any other.
template <typename E, int W>
__device__ __forceinline__ void conv_in(const ConvArgs &a, int64_t b, int64_t rs, int64_t s,
                                        int64_t tau, int64_t c0, float v[kVec])
{
    if (tau >= s) {
        load8((const E *)a.u + tau * a.C + c0, a.vec, v);
    } else if (a.halo && s == rs) {  // tau - rs in [-(W-1), -1]
        load8((const E *)a.halo + (b * (W - 1) + W - 1 + (tau - rs)) * a.C + c0, a.vec, v);
    } else {
#pragma unroll
        for (int i = 0; i < kVec; i++)
            v[i] = 0.0f;
    }
}

// The streamed rows of both directions (each token's own input row, in the backward its output
// gradient, and its document start) pass through a ring of kAhead slots per thread in shared
// memory, copied there by cp.async kAhead - 1 tokens before they are used. Loads that land in
// shared memory hold no registers, so a warp keeps kAhead - 1 tokens of rows in flight (one
// token ahead in registers left the backward, one resident block of 8 warps per SM, about
// 8 KB per SM in flight). Measured with the fast sigmoid, the ring against the forward's
// former W rows a token from L1: 80 against 92 us; the backward 230 us (638 before both).
constexpr int kAhead = 8;

template <typename E> struct AheadRing {
    E u[kAhead][kThreads][kVec];  // [slot][thread]: a warp's 16- or 32-byte rows side by side
    E d[kAhead][kThreads][kVec];
    int32_t s[kAhead][kThreads];
};

__device__ __forceinline__ void cp_async4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(kdacu::smem_u32(dst)),
                 "l"(src));
}

// Token t's rows into ring slot `slot` (asynchronously when rows are 16-byte aligned).
template <typename E>
__device__ __forceinline__ void ring_fetch(const ConvArgs &a, const E *dout, int64_t t,
                                           int64_t c0, AheadRing<E> &r, int slot)
{
    E *u = r.u[slot][threadIdx.x], *d = r.d[slot][threadIdx.x];
    const E *gu = (const E *)a.u + t * a.C + c0, *gd = dout ? dout + t * a.C + c0 : nullptr;
    if (a.vec) {
#pragma unroll
        for (int o = 0; o < kVec * (int)sizeof(E); o += 16) {
            kdacu::cp_async16((char *)u + o, (const char *)gu + o, true);
            if (dout)
                kdacu::cp_async16((char *)d + o, (const char *)gd + o, true);
        }
    } else {
#pragma unroll
        for (int i = 0; i < kVec; i++) {
            u[i] = gu[i];
            if (dout)
                d[i] = gd[i];
        }
    }
    if (a.dstart)
        cp_async4(&r.s[slot][threadIdx.x], a.dstart + t);
}

// The first kAhead - 1 of the tokens t0 .. t_stop - 1 into the ring: one commit group per
// token, empty past t_stop, so that a token's group is always the same count back.
template <typename E>
__device__ __forceinline__ void ring_start(const ConvArgs &a, const E *dout, int64_t t0,
                                           int64_t t_stop, int64_t c0, AheadRing<E> &r)
{
#pragma unroll
    for (int k = 0; k + 1 < kAhead; k++) {
        if (t0 + k < t_stop)
            ring_fetch<E>(a, dout, t0 + k, c0, r, k);
        kdacu::cp_async_commit();
    }
}

// Token t (the k-th streamed) out of the ring, its document start into *s when there are
// documents; then token t + kAhead - 1 into the slot token t - 1 left (its rows went into
// registers a token ago). Each lane reads only what it copied, so no barrier.
template <typename E>
__device__ __forceinline__ void ring_take(const ConvArgs &a, const E *dout, int k, int64_t t,
                                          int64_t t_stop, int64_t c0, AheadRing<E> &r,
                                          float u[kVec], float d[kVec], int64_t *s)
{
    kdacu::cp_async_wait<kAhead - 2>();
    const int slot = k % kAhead;
    load8(r.u[slot][threadIdx.x], 1, u);
    if (dout)
        load8(r.d[slot][threadIdx.x], 1, d);
    if (a.dstart)
        *s = r.s[slot][threadIdx.x];
    if (t + kAhead - 1 < t_stop)
        ring_fetch<E>(a, dout, t + kAhead - 1, c0, r, (k + kAhead - 1) % kAhead);
    kdacu::cp_async_commit();
}

// The W input rows token t reads, as conv_in gives them for t's document (start s), kept from
// token to token: the next token of the same document shifts them and adds its own row; a new
// document (or the thread's first token) reads the W - 1 earlier rows again. A token so loads
// one row, not W.
template <typename E, int W> struct InRows {
    float x[W][kVec];
    int64_t s = -1;

    __device__ __forceinline__ void advance(const ConvArgs &a, int64_t b, int64_t rs, int64_t st,
                                            int64_t t, int64_t c0, const float own[kVec])
    {
        if (st != s) {
#pragma unroll
            for (int j = 0; j + 1 < W; j++)
                conv_in<E, W>(a, b, rs, st, t - W + 1 + j, c0, x[j]);
            s = st;
        } else {
#pragma unroll
            for (int j = 0; j + 1 < W; j++)
#pragma unroll
                for (int i = 0; i < kVec; i++)
                    x[j][i] = x[j + 1][i];
        }
#pragma unroll
        for (int i = 0; i < kVec; i++)
            x[W - 1][i] = own[i];
    }
};

// z of token t from the input rows it reads, held in registers (slot j: row t - W + 1 + j).
template <int W>
__device__ __forceinline__ void conv_z_rows(const float wr[W][kVec], const float x[W][kVec],
                                            float z[kVec])
{
#pragma unroll
    for (int i = 0; i < kVec; i++)
        z[i] = 0.0f;
#pragma unroll
    for (int j = 0; j < W; j++)
#pragma unroll
        for (int i = 0; i < kVec; i++)
            z[i] += wr[j][i] * x[j][i];
}

// The forward streams its tokens as the backward does (below): each token's own row through
// the shared-memory ring, the W - 1 rows before it kept in registers (InRows).
template <typename E, int W>
__global__ void __launch_bounds__(kThreads) conv_fwd_kernel(ConvArgs a, int seg, int l2, E *out)
{
    extern __shared__ __align__(16) unsigned char ring_raw[];
    AheadRing<E> &ring_in = *reinterpret_cast<AheadRing<E> *>(ring_raw);
    const ConvThread p = conv_thread(a);
    float wr[W][kVec];
    load_filter<E, W>(a, p.c0, wr);
    int64_t b = p.t0 / a.T, rs = b * a.T;
    const int64_t t_stop = p.t0 + kTile < a.N ? p.t0 + kTile : a.N;
    ring_start<E>(a, nullptr, p.t0, t_stop, p.c0, ring_in);
    InRows<E, W> in;
    for (int k = 0; k < kTile; k++) {
        const int64_t t = p.t0 + k;
        if (t >= a.N)
            break;  // the whole warp: one tile
        if (t >= rs + a.T)
            b++, rs += a.T;
        float own[kVec], unused[kVec], z[kVec], ss = 0.0f;
        int64_t s = rs;
        ring_take<E>(a, nullptr, k, t, t_stop, p.c0, ring_in, own, unused, &s);
        in.advance(a, b, rs, s, t, p.c0, own);
        conv_z_rows<W>(wr, in.x, z);
#pragma unroll
        for (int i = 0; i < kVec; i++) {
            z[i] *= sigm<E>(z[i]);
            ss += z[i] * z[i];
        }
        if (l2) {
            const float r = 1.0f / sqrtf(head_sum(ss, seg) + 1e-6f);
#pragma unroll
            for (int i = 0; i < kVec; i++)
                z[i] *= r;
        }
        if (p.active)
            store8(out + t * a.C + p.c0, a.vec, z);
    }
}

// dz of token t: y = silu(z) (r y with l2); dz = r (dy - (dy . ry) ry) silu'(z), in fp32.
template <typename E, int W>
__device__ __forceinline__ void conv_dz(const float wr[W][kVec], const float x[W][kVec],
                                        int seg, int l2, const float dy[kVec], float dz[kVec])
{
    float z[kVec], y[kVec], d[kVec], sg[kVec], ss = 0.0f;
    conv_z_rows<W>(wr, x, z);
#pragma unroll
    for (int i = 0; i < kVec; i++)
        d[i] = dy[i];
#pragma unroll
    for (int i = 0; i < kVec; i++) {
        sg[i] = sigm<E>(z[i]);
        y[i] = z[i] * sg[i];
        ss += y[i] * y[i];
    }
    if (l2) {
        const float r = 1.0f / sqrtf(head_sum(ss, seg) + 1e-6f);
        float dot = 0.0f;
#pragma unroll
        for (int i = 0; i < kVec; i++) {
            y[i] *= r;
            dot += d[i] * y[i];
        }
        dot = head_sum(dot, seg);
#pragma unroll
        for (int i = 0; i < kVec; i++)
            d[i] = r * (d[i] - dot * y[i]);
    }
#pragma unroll
    for (int i = 0; i < kVec; i++)
        dz[i] = d[i] * sg[i] * (1.0f + z[i] * (1.0f - sg[i]));
}

// The thread streams tokens t0 .. t0 + kTile + W - 2 (the last W - 1 belong to the next tile:
// their dz is recomputed here for the du of this tile's last rows). After dz(t), the ring holds
// dz of tokens tau .. t (tau = t - W + 1) with their document starts, which is all that du(tau)
// needs (t' feeds tau when t' is in tau's document: its start is <= tau) and, for a row start
// r0 in (tau, t], the halo row of r0's row at tau (t' in the row's first document: start r0).
// Filter gradients: part[blk, c, j] = sum over the block's R tokens t of dz(t) in(t - W + 1 + j).
template <typename E, int W>
__global__ void __launch_bounds__(kThreads)
conv_bwd_kernel(ConvArgs a, int seg, int l2, const E *dout, E *du, E *dhalo, float *part)
{
    extern __shared__ __align__(16) unsigned char ring_raw[];
    AheadRing<E> &ring_in = *reinterpret_cast<AheadRing<E> *>(ring_raw);
    const ConvThread p = conv_thread(a);
    float wr[W][kVec];
    load_filter<E, W>(a, p.c0, wr);
    const int64_t t_end = p.t0 + kTile < a.N ? p.t0 + kTile : a.N;
    float ring[W][kVec], gw[W][kVec];
    int64_t rstart[W];  // document start of the ring's tokens; INT64_MAX: no token
#pragma unroll
    for (int j = 0; j < W; j++) {
        rstart[j] = INT64_MAX;
#pragma unroll
        for (int i = 0; i < kVec; i++)
            ring[j][i] = 0.0f, gw[j][i] = 0.0f;
    }
    int64_t b = p.t0 / a.T, rs = b * a.T;
    InRows<E, W> in;
    const int64_t t_stop = p.t0 + kTile + W - 1 < a.N ? p.t0 + kTile + W - 1 : a.N;
    ring_start<E>(a, dout, p.t0, t_stop, p.c0, ring_in);
    for (int k = 0; k < kTile + W - 1; k++) {
        const int64_t t = p.t0 + k, tau = t - W + 1;
        if (tau >= t_end)
            break;  // uniform over the warp
#pragma unroll
        for (int j = 0; j + 1 < W; j++) {
            rstart[j] = rstart[j + 1];
#pragma unroll
            for (int i = 0; i < kVec; i++)
                ring[j][i] = ring[j + 1][i];
        }
        rstart[W - 1] = INT64_MAX;
        if (t < a.N) {
            if (t >= rs + a.T)
                b++, rs += a.T;
            float own[kVec], dy[kVec];
            int64_t s = rs;
            ring_take<E>(a, dout, k, t, t_stop, p.c0, ring_in, own, dy, &s);
            in.advance(a, b, rs, s, t, p.c0, own);
            conv_dz<E, W>(wr, in.x, seg, l2, dy, ring[W - 1]);
            rstart[W - 1] = s;
            if (t < t_end) {
#pragma unroll
                for (int j = 0; j < W; j++)
#pragma unroll
                    for (int i = 0; i < kVec; i++)
                        gw[j][i] += ring[W - 1][i] * in.x[j][i];
            }
        }
        if (!p.active)
            continue;
        if (tau >= p.t0) {
            float acc[kVec] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int kk = 0; kk < W; kk++) {  // ring slot q = W - 1 - kk holds token tau + q
                const int q = W - 1 - kk;
                if (rstart[q] <= tau)
#pragma unroll
                    for (int i = 0; i < kVec; i++)
                        acc[i] += wr[kk][i] * ring[q][i];
            }
            store8(du + tau * a.C + p.c0, a.vec, acc);
        }
        if (dhalo) {
            // row starts r0 in (tau, t] inside this tile: the halo row tau - r0 + W - 1 of r0's row
            for (int64_t r0 = (tau < 0 ? 0 : tau / a.T + 1) * a.T; r0 <= t && r0 < t_end;
                 r0 += a.T) {
                if (r0 < p.t0)
                    continue;
                float acc[kVec] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
                for (int kk = 0; kk < W; kk++) {
                    const int q = W - 1 - kk;
                    if (rstart[q] == r0)
#pragma unroll
                        for (int i = 0; i < kVec; i++)
                            acc[i] += wr[kk][i] * ring[q][i];
                }
                const int64_t row = r0 / a.T, jh = tau - r0 + W - 1;
                store8(dhalo + (row * (W - 1) + jh) * a.C + p.c0, a.vec, acc);
            }
        }
    }
    // the block's filter gradient partials: its warps' sums added in warp order
    __shared__ float red[kWarps][32 * kVec];
    const int lane = threadIdx.x & 31, wid = threadIdx.x >> 5;
#pragma unroll
    for (int j = 0; j < W; j++) {
#pragma unroll
        for (int i = 0; i < kVec; i++)
            red[wid][lane * kVec + i] = gw[j][i];
        __syncthreads();
        const int64_t c = (int64_t)blockIdx.y * 32 * kVec + threadIdx.x;  // 256 channels
        if (c < a.C) {
            float s = 0.0f;
            for (int w = 0; w < kWarps; w++)
                s += red[w][threadIdx.x];
            part[((int64_t)blockIdx.x * a.C + c) * W + j] = s;
        }
        __syncthreads();
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

// Eight elements per thread (16-byte loads when vec); Dg and dk are multiples of 8, so the
// eight share a row and a head.
template <typename E>
__global__ void gate_fwd_kernel(int64_t n, int64_t Dg, int64_t dk, float lb, const E *zf,
                                const E *a_log, const E *dtb, E *g, int vec)
{
    const int64_t i0 = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) * kVec;
    if (i0 >= n)
        return;
    const int64_t c = i0 % Dg;
    const float ea = expf(to_f(a_log[c / dk]));
    float z[kVec], bias[kVec];
    load8(zf + i0, vec, z);
    load8(dtb + c, vec, bias);
#pragma unroll
    for (int i = 0; i < kVec; i++)
        z[i] = lb * sigm<E>(ea * (z[i] + bias[i]));
    store8(g + i0, vec, z);
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
            const float y = ea * (to_f(zf[i]) + bias), sg = sigm<E>(y);
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

bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// vec: every [N, C] row the kernels load or store starts on 16 bytes (C is a multiple of 32).
ConvArgs conv_args(int64_t B, int64_t T, int64_t C, int64_t W, const void *u, const void *halo,
                   const void *w, const int32_t *dstart, const void *o1, const void *o2,
                   const void *o3)
{
    ConvArgs a;
    a.B = B, a.T = T, a.C = C, a.W = W, a.N = B * T;
    a.u = u, a.halo = halo, a.w = w, a.dstart = dstart;
    a.vec = aligned16(u) && aligned16(halo) && aligned16(o1) && aligned16(o2) && aligned16(o3);
    return a;
}

int check_conv(int dtype, int64_t hd, int64_t W, const char *what, k3rt_error *err)
{
    K3RT_TRY(check(dtype, what, err));
    if (hd != 32 && hd != 64 && hd != 128)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "kda cuda %s: head width %lld (32, 64 or "
                         "128)", what, (long long)hd);
    if (W < 1 || W > KDA_CU_MAX_CONV)
        return k3rt_fail(err, K3RT_ERR_UNSUPPORTED, "kda cuda %s: conv width %lld (1 to %d)",
                         what, (long long)W, KDA_CU_MAX_CONV);
    return K3RT_OK;
}

// The eight-element kernels take whole vectors only (every width here is a multiple of 32).
int check_vec8(int64_t n, const char *what, k3rt_error *err)
{
    if (n % kVec)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda %s %lld is not a multiple of %d", what,
                         (long long)n, kVec);
    return K3RT_OK;
}

dim3 conv_grid(const ConvArgs &a)
{
    return dim3(blocks_for(a.N, R), blocks_for(a.C, 32 * kVec));
}

// Each conv kernel's dynamic shared memory is its ring: 74 KB in bf16, 139 KB in f32.
template <typename E, int W>
int conv_fwd_w(cudaStream_t st, const ConvArgs &a, int seg, int l2, void *out, k3rt_error *err)
{
    const size_t ring = sizeof(AheadRing<E>);
    K3RT_TRY(kdacu::allow_smem(conv_fwd_kernel<E, W>, ring, "cudaFuncSetAttribute (kda "
                               "conv_fwd_kernel)", err));
    conv_fwd_kernel<E, W><<<conv_grid(a), kThreads, ring, st>>>(a, seg, l2, (E *)out);
    return K3RT_OK;
}

template <typename E>
int launch_conv_fwd(cudaStream_t st, const ConvArgs &a, int seg, int l2, void *out,
                    k3rt_error *err)
{
    switch (a.W) {
    case 1: return conv_fwd_w<E, 1>(st, a, seg, l2, out, err);
    case 2: return conv_fwd_w<E, 2>(st, a, seg, l2, out, err);
    case 3: return conv_fwd_w<E, 3>(st, a, seg, l2, out, err);
    default: return conv_fwd_w<E, 4>(st, a, seg, l2, out, err);
    }
}

template <typename E, int W>
int conv_bwd_w(cudaStream_t st, const ConvArgs &a, int seg, int l2, const void *dout, void *du,
               void *dhalo, float *part, k3rt_error *err)
{
    const size_t ring = sizeof(AheadRing<E>);
    K3RT_TRY(kdacu::allow_smem(conv_bwd_kernel<E, W>, ring, "cudaFuncSetAttribute (kda "
                               "conv_bwd_kernel)", err));
    conv_bwd_kernel<E, W><<<conv_grid(a), kThreads, ring, st>>>(a, seg, l2, (const E *)dout,
                                                                (E *)du, (E *)dhalo, part);
    return K3RT_OK;
}

template <typename E>
int launch_conv_bwd(cudaStream_t st, const ConvArgs &a, int seg, int l2, const void *dout,
                    void *du, void *dhalo, float *part, k3rt_error *err)
{
    switch (a.W) {
    case 1: return conv_bwd_w<E, 1>(st, a, seg, l2, dout, du, dhalo, part, err);
    case 2: return conv_bwd_w<E, 2>(st, a, seg, l2, dout, du, dhalo, part, err);
    case 3: return conv_bwd_w<E, 3>(st, a, seg, l2, dout, du, dhalo, part, err);
    default: return conv_bwd_w<E, 4>(st, a, seg, l2, dout, du, dhalo, part, err);
    }
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
                                 int32_t *dstart, k3rt_error *err)
{
    if (N < 1 || n_docs < 1)
        return k3rt_fail(err, K3RT_ERR_INVALID, "kda cuda doc bounds: %lld tokens, %lld "
                         "documents", (long long)N, (long long)n_docs);
    doc_bounds_kernel<<<blocks_for(N), kThreads, 0, (cudaStream_t)stream>>>(N, docs, n_docs,
                                                                           dstart);
    KDA_LAUNCHED("kda doc_bounds_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_conv_fwd(void *stream, int dtype, int64_t B, int64_t T, int64_t heads,
                               int64_t hd, int64_t W, const void *u, const void *halo,
                               const void *w, const int32_t *dstart, int l2, void *out,
                               k3rt_error *err)
{
    K3RT_TRY(check_conv(dtype, hd, W, "conv", err));
    ConvArgs a = conv_args(B, T, heads * hd, W, u, W > 1 ? halo : NULL, w, dstart, out, NULL,
                           NULL);
    cudaStream_t st = (cudaStream_t)stream;
    const int seg = (int)(hd / kVec);
    K3RT_TRY(dtype == K3RT_BF16 ? launch_conv_fwd<bf16>(st, a, seg, l2, out, err)
                                : launch_conv_fwd<float>(st, a, seg, l2, out, err));
    KDA_LAUNCHED("kda conv_fwd_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_conv_bwd(void *stream, int dtype, int64_t B, int64_t T, int64_t heads,
                               int64_t hd, int64_t W, const void *u, const void *halo,
                               const void *w, const int32_t *dstart, int l2, const void *dout,
                               void *du, void *dhalo, float *part, float *dw, k3rt_error *err)
{
    K3RT_TRY(check_conv(dtype, hd, W, "conv backward", err));
    if (W < 2 || !halo)
        halo = NULL, dhalo = NULL;
    const int64_t C = heads * hd;
    ConvArgs a = conv_args(B, T, C, W, u, halo, w, dstart, dout, du, dhalo);
    cudaStream_t st = (cudaStream_t)stream;
    const int seg = (int)(hd / kVec);
    K3RT_TRY(dtype == K3RT_BF16 ? launch_conv_bwd<bf16>(st, a, seg, l2, dout, du, dhalo, part, err)
                                : launch_conv_bwd<float>(st, a, seg, l2, dout, du, dhalo, part,
                                                         err));
    KDA_LAUNCHED("kda conv_bwd_kernel");
    const int64_t nb = (a.N + R - 1) / R;
    sum_parts_kernel<<<blocks_for(C * W), kThreads, 0, st>>>(part, nb, C * W, dw);
    KDA_LAUNCHED("kda sum_parts_kernel");
    return K3RT_OK;
}

extern "C" int kda_cu_gate_fwd(void *stream, int dtype, int64_t N, int64_t HV, int64_t dk,
                               double lb, const void *zf, const void *a_log, const void *dt_bias,
                               void *g, k3rt_error *err)
{
    K3RT_TRY(check(dtype, "gate", err));
    K3RT_TRY(check_vec8(dk, "gate: head width", err));
    const int64_t Dg = HV * dk, n = N * Dg;
    const int vec = aligned16(zf) && aligned16(dt_bias) && aligned16(g);
    cudaStream_t st = (cudaStream_t)stream;
    if (dtype == K3RT_BF16)
        gate_fwd_kernel<bf16><<<blocks_for(n, kThreads * kVec), kThreads, 0, st>>>(
            n, Dg, dk, (float)lb, (const bf16 *)zf, (const bf16 *)a_log, (const bf16 *)dt_bias,
            (bf16 *)g, vec);
    else
        gate_fwd_kernel<float><<<blocks_for(n, kThreads * kVec), kThreads, 0, st>>>(
            n, Dg, dk, (float)lb, (const float *)zf, (const float *)a_log,
            (const float *)dt_bias, (float *)g, vec);
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

