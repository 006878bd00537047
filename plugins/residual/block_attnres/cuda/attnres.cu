// The AttnRes mixing op on CUDA (attnres_cuda.h has the contract, cpu.inc.c the math).
//
// Tiling. A token's row of d elements is spread over one thread block, 8 elements a thread up
// to d = 4096 (one 16-byte bf16 vector or two f32 ones), 16 beyond, so 2048 columns take 256
// threads. The forward gives a block to a token; the backward a fixed grid of
// AR_CUDA_BWD_BLOCKS blocks, each walking tokens blockIdx.x, + gridDim.x, ..., so that its
// pseudo-query (and norm gain) gradient partial is one row of the scratch, summed over blocks
// in block order afterwards.
//
// What bounds it: memory traffic (the forward moves n + 1 rows of d per token, the backward
// 2n + 2), so the bytes in flight per SM. The sources are taken a chunk at a time: every
// source's vectors of the chunk are loaded before any is reduced, and one block reduction
// (block_sums.cuh: a warp reduce-scatter, one barrier) gives all their sums at once; a second
// barrier shares the per-source factors. The chunk is what fits in registers beside the rest:
// 16 vectors a thread in the forward, about 96 registers in all in the backward (bwd_chunk),
// so Block AttnRes's 9 bf16 sources at d = 2048 are one chunk, 2 blocks of 256 threads an SM.
// Reducing a source at a time (a barrier and one vector in flight per source) reached 43% of
// copy bandwidth at N 32768, d 2048, 9 sources on the H200 (docs/PERFORMANCE.md).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "attnres_cuda.h"
#include "block_sums.cuh"

namespace {

using attnres::BlockSums;

typedef __nv_bfloat16 bf16;


template <typename T> struct Vec { static constexpr int n = 16 / (int)sizeof(T); };

__device__ __forceinline__ void unpack(const uint4 &u, float *f, float)
{
    f[0] = __uint_as_float(u.x), f[1] = __uint_as_float(u.y);
    f[2] = __uint_as_float(u.z), f[3] = __uint_as_float(u.w);
}

__device__ __forceinline__ void unpack(const uint4 &u, float *f, bf16)
{
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
        f[2 * k] = __uint_as_float(w[k] << 16);
        f[2 * k + 1] = __uint_as_float(w[k] & 0xffff0000u);
    }
}

__device__ __forceinline__ uint4 pack(const float *f, float)
{
    return make_uint4(__float_as_uint(f[0]), __float_as_uint(f[1]), __float_as_uint(f[2]),
                      __float_as_uint(f[3]));
}

__device__ __forceinline__ uint32_t pack2(float a, float b)
{
    __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
    return *reinterpret_cast<uint32_t *>(&h);
}

__device__ __forceinline__ uint4 pack(const float *f, bf16)
{
    return make_uint4(pack2(f[0], f[1]), pack2(f[2], f[3]), pack2(f[4], f[5]),
                      pack2(f[6], f[7]));
}

// A thread's E columns of a row: vector j covers elements (j * blockDim + tid) * V .. + V - 1.
template <typename T, int E> struct Row {
    static constexpr int V = Vec<T>::n, P = E / V;
    int64_t col[P];
    bool ok[P];
    __device__ Row(int64_t d)
    {
#pragma unroll
        for (int j = 0; j < P; j++) {
            col[j] = ((int64_t)j * blockDim.x + threadIdx.x) * V;
            ok[j] = col[j] < d;
        }
    }
    __device__ void load(const void *base, int64_t off, uint4 *u) const
    {
        const T *p = (const T *)base + off;
#pragma unroll
        for (int j = 0; j < P; j++)
            u[j] = ok[j] ? __ldg(reinterpret_cast<const uint4 *>(p + col[j])) : make_uint4(0, 0, 0, 0);
    }
    __device__ void unpack_all(const uint4 *u, float *f) const
    {
#pragma unroll
        for (int j = 0; j < P; j++)
            unpack(u[j], f + j * V, T());
    }
    __device__ void read(const void *base, int64_t off, float *f) const
    {
        uint4 u[P];
        load(base, off, u);
        unpack_all(u, f);
    }
    __device__ void write(void *base, int64_t off, const float *f) const
    {
        T *p = (T *)base + off;
#pragma unroll
        for (int j = 0; j < P; j++)
            if (ok[j])
                *reinterpret_cast<uint4 *>(p + col[j]) = pack(f + j * V, T());
    }
    // f32 rows (accumulators, h32) at this thread's columns
    __device__ void read32(const float *p, float *f) const
    {
#pragma unroll
        for (int j = 0; j < P; j++)
#pragma unroll
            for (int k = 0; k < V; k += 4) {
                float4 x = ok[j] ? *reinterpret_cast<const float4 *>(p + col[j] + k)
                                 : make_float4(0, 0, 0, 0);
                f[j * V + k] = x.x, f[j * V + k + 1] = x.y;
                f[j * V + k + 2] = x.z, f[j * V + k + 3] = x.w;
            }
    }
    __device__ void write32(float *p, const float *f) const
    {
#pragma unroll
        for (int j = 0; j < P; j++)
            if (ok[j])
#pragma unroll
                for (int k = 0; k < V; k += 4)
                    *reinterpret_cast<float4 *>(p + col[j] + k) =
                        make_float4(f[j * V + k], f[j * V + k + 1], f[j * V + k + 2],
                                    f[j * V + k + 3]);
    }
    // rounds f to T and back: what a reader of the stored row sees
    __device__ void round(float *f) const
    {
#pragma unroll
        for (int j = 0; j < P; j++) {
            uint4 u = pack(f + j * V, T());
            unpack(u, f + j * V, T());
        }
    }
};

struct FwdParams {
    ar_cuda_op op;
    void *h;
    float *h32;
};

template <typename T, int EPT>
__device__ __forceinline__ void load_q(const Row<T, EPT> &r, const ar_cuda_op &op, float *q)
{
    float g[EPT];
    r.read(op.w, 0, q);
    r.read(op.gamma, 0, g);
#pragma unroll
    for (int k = 0; k < EPT; k++)
        q[k] *= g[k];
}

// Sources per chunk: n split into equal chunks of at most CH.
__device__ __forceinline__ int chunk_size(int n, int ch)
{
    const int chunks = n > 0 ? (n + ch - 1) / ch : 1;
    return (n + chunks - 1) / chunks;
}

// Issues the loads of sources i0 .. i0 + cnt - 1 (the rest zero): all in flight together.
template <typename T, int EPT, int CH>
__device__ __forceinline__ void load_chunk(const Row<T, EPT> &r, const ar_cuda_op &op, int i0,
                                           int cnt, int64_t off, uint4 (*u)[Row<T, EPT>::P])
{
#pragma unroll
    for (int c = 0; c < CH; c++) {
        if (c < cnt)
            r.load(op.v[i0 + c], off, u[c]);
        else
#pragma unroll
            for (int j = 0; j < Row<T, EPT>::P; j++)
                u[c][j] = make_uint4(0, 0, 0, 0);
    }
}

template <typename T, int EPT, int CH, bool NORM>
__global__ void __launch_bounds__(512) fwd_kernel(const FwdParams p)
{
    __shared__ float red[2 * 32 * 2 * CH];
    __shared__ float zs[AR_CUDA_MAX_SOURCES];
    const ar_cuda_op &op = p.op;
    constexpr int P = Row<T, EPT>::P;
    const int n = op.n, cs = chunk_size(n, CH);
    const int64_t t = blockIdx.x, off = t * op.d;
    const float inv_d = 1.0f / (float)op.d;
    Row<T, EPT> r(op.d);
    BlockSums<2 * CH> R{red};
    float q[EPT], acc[EPT], m = -INFINITY, l = 0.0f;
    load_q(r, op, q);
#pragma unroll
    for (int k = 0; k < EPT; k++)
        acc[k] = 0.0f;
    for (int i0 = 0; i0 < n; i0 += cs) {
        const int cnt = min(cs, n - i0);
        uint4 u[CH][P];
        load_chunk<T, EPT, CH>(r, op, i0, cnt, off, u);
        float s[2 * CH];  // per source: |v|^2, q . v
#pragma unroll
        for (int c = 0; c < CH; c++) {
            float f[EPT];
            r.unpack_all(u[c], f);
            s[2 * c] = 0.0f, s[2 * c + 1] = 0.0f;
#pragma unroll
            for (int k = 0; k < EPT; k++)
                s[2 * c] += f[k] * f[k], s[2 * c + 1] += q[k] * f[k];
        }
        R.template reduce<2 * CH>(s);
        if ((int)threadIdx.x < cnt) {
            const int i = i0 + (int)threadIdx.x;
            const float rho = 1.0f / sqrtf(R.total(2 * threadIdx.x) * inv_d + op.eps);
            const float z = rho * R.total(2 * threadIdx.x + 1);
            zs[i] = z;
            if (i == n - 1 && op.rho_last)
                op.rho_last[t] = rho, op.z_last[t] = z;
        }
        __syncthreads();  // zs
        // the online softmax (spec §7), a chunk at a time
        float mn = m;
#pragma unroll
        for (int c = 0; c < CH; c++)
            if (c < cnt)
                mn = fmaxf(mn, zs[i0 + c]);
        const float sc = expf(m - mn);
        l *= sc;
#pragma unroll
        for (int k = 0; k < EPT; k++)
            acc[k] *= sc;
#pragma unroll
        for (int c = 0; c < CH; c++)
            if (c < cnt) {
                const float pz = expf(zs[i0 + c] - mn);
                float f[EPT];
                r.unpack_all(u[c], f);
                l += pz;
#pragma unroll
                for (int k = 0; k < EPT; k++)
                    acc[k] += pz * f[k];
            }
        m = mn;
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int k = 0; k < EPT; k++)
        acc[k] *= inv;
    if (p.h32)
        r.write32(p.h32 + off, acc);
    r.write(p.h, off, acc);
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        op.alpha[t * n + i] = expf(zs[i] - m) * inv;
    if (NORM) {
        // the engine's RMSNorm of h as stored (rounded to T)
        float g[EPT], s[1] = {0.0f};
        r.round(acc);
#pragma unroll
        for (int k = 0; k < EPT; k++)
            s[0] += acc[k] * acc[k];
        R.template reduce<1>(s);
        const float rs = 1.0f / sqrtf(R.total(0) * inv_d + op.norm_eps);
        r.read(op.norm_gain, 0, g);
#pragma unroll
        for (int k = 0; k < EPT; k++)
            acc[k] = acc[k] * rs * g[k];
        r.write(op.normed, off, acc);
        if (threadIdx.x == 0)
            op.rstd[t] = rs;
    }
}

struct BwdParams {
    ar_cuda_op op;
    ar_cuda_bwd b;
    float *part_q, *part_g;  // [gridDim.x, d]
};

// dv_i (+)= a dh + kq q + kv v for one source, and its share of dq.
template <typename T, int EPT>
__device__ __forceinline__ void source_grad(const Row<T, EPT> &r, const BwdParams &p, int i,
                                            int64_t off, float a, float kq, float kv,
                                            const float *dh, const float *q, const float *v,
                                            float *dq)
{
#pragma unroll
    for (int k = 0; k < EPT; k++)
        dq[k] += kq * v[k];
    void *dst = p.b.dv[i];
    if (!dst)
        return;
    float g[EPT];
    if (p.b.overwrite) {
#pragma unroll
        for (int k = 0; k < EPT; k++)
            g[k] = a * dh[k] + kq * q[k] + kv * v[k];
        r.write(dst, off, g);
        return;
    }
    float *acc = (float *)dst + off;
    r.read32(acc, g);
#pragma unroll
    for (int k = 0; k < EPT; k++)
        g[k] += a * dh[k] + kq * q[k] + kv * v[k];
    r.write32(acc, g);
}

// The factors of source i's gradient: with dz = a (dh . v - delta), kq = dz rho (the q term)
// and kv = -dz rho^2 z / d (the key norm's).
__device__ __forceinline__ float3 grad_factors(float a, float dhv, float delta, float rho,
                                               float z, int64_t d)
{
    const float dz = a * (dhv - delta);
    return make_float3(a, dz * rho, -dz * rho * rho * z / (float)d);
}

template <typename T, int EPT, int CH, bool NORM, bool RECON>
__global__ void __launch_bounds__(512) bwd_kernel(const BwdParams p)
{
    constexpr int K = 3 * CH + 1;  // delta's dh . h, then per source dh . v, |v|^2, q . v
    __shared__ float red[2 * 32 * K];
    __shared__ float3 fac[CH];
    const ar_cuda_op &op = p.op;
    constexpr int P = Row<T, EPT>::P;
    const int n = op.n, nread = RECON ? n - 1 : n, cs = chunk_size(nread, CH);
    const float inv_d = 1.0f / (float)op.d;
    Row<T, EPT> r(op.d);
    BlockSums<K> R{red};
    float q[EPT], dq[EPT], gg[EPT], ng[EPT];
    load_q(r, op, q);
    if (NORM)
        r.read(op.norm_gain, 0, ng);
#pragma unroll
    for (int k = 0; k < EPT; k++)
        dq[k] = 0.0f, gg[k] = 0.0f;
    for (int64_t t = blockIdx.x; t < op.N; t += gridDim.x) {
        const int64_t off = t * op.d;
        const float *al = op.alpha + t * n;
        float h[EPT], dh[EPT], hd = 0.0f;
        uint4 u[CH][P];
        int i0 = 0, cnt = min(cs, nread);
        if (p.b.h32)
            r.read32(p.b.h32 + off, h);
        else
            r.read(p.b.h, off, h);
        r.read(p.b.dh, off, dh);
        load_chunk<T, EPT, CH>(r, op, 0, cnt, off, u);
        if (NORM) {
            // dh = rs g dn - h rs^3 (h . g dn) / d: the engine's RMSNorm backward
            const float rs = op.rstd[t];
            float s[2] = {0.0f, 0.0f};
#pragma unroll
            for (int k = 0; k < EPT; k++) {
                gg[k] += dh[k] * h[k] * rs;
                s[0] += h[k] * ng[k] * dh[k], s[1] += h[k] * h[k];
            }
            R.template reduce<2>(s);
            const float s0 = R.total(0), s1 = R.total(1), c = rs * rs * rs * s0 * inv_d;
#pragma unroll
            for (int k = 0; k < EPT; k++)
                dh[k] = rs * ng[k] * dh[k] - c * h[k];
            hd = rs * s0 - c * s1;
        }
        float S[EPT];  // RECON: sum_{i < n-1} alpha_i v_i
#pragma unroll
        for (int k = 0; k < EPT; k++)
            S[k] = 0.0f;
        for (;;) {
            float s[K];
            s[0] = 0.0f;
            if (!NORM && i0 == 0)
#pragma unroll
                for (int k = 0; k < EPT; k++)
                    s[0] += dh[k] * h[k];
#pragma unroll
            for (int c = 0; c < CH; c++) {
                float f[EPT], *x = s + 1 + 3 * c;
                r.unpack_all(u[c], f);
                x[0] = 0.0f, x[1] = 0.0f, x[2] = 0.0f;
#pragma unroll
                for (int k = 0; k < EPT; k++)
                    x[0] += dh[k] * f[k], x[1] += f[k] * f[k], x[2] += q[k] * f[k];
            }
            R.template reduce<K>(s);
            if (!NORM && i0 == 0)
                hd = R.total(0);
            if ((int)threadIdx.x < cnt) {
                const int c = threadIdx.x, i = i0 + c;
                float rho, z;
                if (i == n - 1 && op.rho_last) {
                    rho = op.rho_last[t], z = op.z_last[t];
                } else {
                    rho = 1.0f / sqrtf(R.total(2 + 3 * c) * inv_d + op.eps);
                    z = rho * R.total(3 + 3 * c);
                }
                fac[c] = grad_factors(al[i], R.total(1 + 3 * c), hd, rho, z, op.d);
            }
            __syncthreads();  // fac
#pragma unroll
            for (int c = 0; c < CH; c++)
                if (c < cnt) {
                    const float3 g = fac[c];
                    float f[EPT];
                    r.unpack_all(u[c], f);
                    source_grad(r, p, i0 + c, off, g.x, g.y, g.z, dh, q, f, dq);
                    if (RECON)
#pragma unroll
                        for (int k = 0; k < EPT; k++)
                            S[k] += g.x * f[k];
                }
            i0 += cs;
            if (i0 >= nread)
                break;
            cnt = min(cs, nread - i0);
            load_chunk<T, EPT, CH>(r, op, i0, cnt, off, u);
        }
        if (RECON) {
            // the partial sum: p = (h - S) / alpha_{n-1}, 0 where alpha_{n-1} underflows (every
            // term that uses it carries that factor)
            const float a = al[n - 1];
            const float inv = a > FLT_EPSILON ? 1.0f / a : 0.0f;
            float s[1] = {0.0f};
#pragma unroll
            for (int k = 0; k < EPT; k++) {
                S[k] = (h[k] - S[k]) * inv;
                s[0] += dh[k] * S[k];
            }
            R.template reduce<1>(s);
            const float3 g = grad_factors(a, R.total(0), hd, op.rho_last[t], op.z_last[t], op.d);
            source_grad(r, p, n - 1, off, g.x, g.y, g.z, dh, q, S, dq);
        }
    }
    r.write32(p.part_q + blockIdx.x * op.d, dq);
    if (NORM)
        r.write32(p.part_g + blockIdx.x * op.d, gg);
}

// dq[k] = sum over the backward's blocks in a fixed order; dw += dq gamma, dgamma += dq w; the
// norm gain's too. A block covers 32 columns with PK_GROUPS warps, warp g adding rows g,
// g + PK_GROUPS, ...; the warps' sums are added in warp order. (One thread a column walking all
// 2048 rows left a few dozen warps on the GPU, latency bound.)
constexpr int PK_GROUPS = 16;

template <typename T>
__global__ void __launch_bounds__(32 * PK_GROUPS)
params_kernel(const float *part_q, const float *part_g, int blocks, int64_t d, const T *w,
              const T *gamma, float *dw, float *dgamma, float *dng)
{
    __shared__ float sh[2][PK_GROUPS][32];
    const int lane = threadIdx.x & 31, g = threadIdx.x >> 5;
    const int64_t k = (int64_t)blockIdx.x * 32 + lane;
    float s = 0.0f, sg = 0.0f;
    if (k < d) {
#pragma unroll 8
        for (int b = g; b < blocks; b += PK_GROUPS)
            s += part_q[b * d + k];
        if (part_g)
#pragma unroll 8
            for (int b = g; b < blocks; b += PK_GROUPS)
                sg += part_g[b * d + k];
    }
    sh[0][g][lane] = s, sh[1][g][lane] = sg;
    __syncthreads();
    if (g || k >= d)
        return;
    s = 0.0f, sg = 0.0f;
    for (int i = 0; i < PK_GROUPS; i++)
        s += sh[0][i][lane], sg += sh[1][i][lane];
    dw[k] += s * (float)gamma[k];
    dgamma[k] += s * (float)w[k];
    if (part_g)
        dng[k] += sg;
}

// One block per slot of the row: the column sum of alpha in a fixed tree.
__global__ void stats_kernel(const float *alpha, int64_t N, int n, int fresh, double tokens,
                             double *sum, float *mean)
{
    __shared__ double sh[256];
    const int i = blockIdx.x;
    double s = 0.0;
    if (i < n)
        for (int64_t t = threadIdx.x; t < N; t += blockDim.x)
            s += alpha ? (double)alpha[t * n + i] : (i == 0 ? 1.0 : 0.0);
    sh[threadIdx.x] = s;
    __syncthreads();
    for (int o = blockDim.x / 2; o > 0; o >>= 1) {
        if (threadIdx.x < o)
            sh[threadIdx.x] += sh[threadIdx.x + o];
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        double total = (fresh ? 0.0 : sum[i]) + sh[0];
        sum[i] = total;
        mean[i] = tokens > 0 ? (float)(total / tokens) : 0.0f;
    }
}

int cu_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "block_attnres cuda: %s: %s", what,
                     cudaGetErrorString(e));
}

#define AR_TRY(call, what)                    \
    do {                                      \
        cudaError_t e_ = (call);              \
        if (e_ != cudaSuccess)                \
            return cu_fail(err, e_, what);    \
    } while (0)

// Elements a thread holds: 8 up to d = 4096 (registers for more blocks in flight), else 16.
int ept_for(int64_t d) { return d <= 4096 ? 8 : 16; }

unsigned threads_for(int64_t d)
{
    int64_t e = ept_for(d), t = (d + e - 1) / e;
    return (unsigned)((t + 31) / 32 * 32);
}

unsigned bwd_blocks(int64_t N) { return (unsigned)(N < AR_CUDA_BWD_BLOCKS ? N : AR_CUDA_BWD_BLOCKS); }

// The sources a chunk keeps in flight: at most 16 vectors a thread (64 registers), half as many
// when the op has few sources (registers spared for more resident blocks).
template <typename T, int E> struct Chunks {
    static constexpr int P = Row<T, E>::P, BIG = 16 / P > 1 ? 16 / P : 1,
                         SMALL = BIG / 2 > 1 ? BIG / 2 : 1;
};

template <typename T, int E, int CH>
void fwd_ch(cudaStream_t st, const FwdParams &p, dim3 grid, dim3 block)
{
    if (p.op.norm_gain)
        fwd_kernel<T, E, CH, true><<<grid, block, 0, st>>>(p);
    else
        fwd_kernel<T, E, CH, false><<<grid, block, 0, st>>>(p);
}

template <typename T, int E>
void fwd_e(cudaStream_t st, const FwdParams &p, dim3 grid, dim3 block)
{
    using C = Chunks<T, E>;
    if (p.op.n <= C::SMALL)
        fwd_ch<T, E, C::SMALL>(st, p, grid, block);
    else
        fwd_ch<T, E, C::BIG>(st, p, grid, block);
}

template <typename T>
int launch_fwd(cudaStream_t st, const FwdParams &p, k3rt_error *err)
{
    dim3 grid((unsigned)p.op.N), block(threads_for(p.op.d));
    if (ept_for(p.op.d) == 8)
        fwd_e<T, 8>(st, p, grid, block);
    else
        fwd_e<T, 16>(st, p, grid, block);
    AR_TRY(cudaGetLastError(), "launch of the forward");
    return K3RT_OK;
}

// The backward holds more per thread (h, dh, q, dq, with the fused norm its gain and gradient,
// rebuilding the partial its sum): its chunk is what fits beside them in about 96 registers, a
// source costing its vectors and its three sums. Block AttnRes's 9 sources at d <= 2048 in bf16
// are one chunk.
constexpr int bwd_chunk(int P, int E, bool norm, bool recon)
{
    const int c = (96 - (4 + 2 * norm + recon) * E) / (4 * P + 3);
    return c > 1 ? c : 1;
}

template <typename T, int E, bool NORM, bool RECON>
void bwd_nr(cudaStream_t st, const BwdParams &p, dim3 grid, dim3 block)
{
    constexpr int big = bwd_chunk(Row<T, E>::P, E, NORM, RECON), small = (big + 1) / 2;
    if (p.op.n - (RECON ? 1 : 0) <= small)
        bwd_kernel<T, E, small, NORM, RECON><<<grid, block, 0, st>>>(p);
    else
        bwd_kernel<T, E, big, NORM, RECON><<<grid, block, 0, st>>>(p);
}

template <typename T, int E>
void bwd_e(cudaStream_t st, const BwdParams &p, dim3 grid, dim3 block)
{
    const bool norm = p.op.norm_gain != nullptr;
    if (norm && p.b.recon)
        bwd_nr<T, E, true, true>(st, p, grid, block);
    else if (norm)
        bwd_nr<T, E, true, false>(st, p, grid, block);
    else if (p.b.recon)
        bwd_nr<T, E, false, true>(st, p, grid, block);
    else
        bwd_nr<T, E, false, false>(st, p, grid, block);
}

template <typename T>
int launch_bwd(cudaStream_t st, const BwdParams &p, k3rt_error *err)
{
    dim3 grid(bwd_blocks(p.op.N)), block(threads_for(p.op.d));
    if (ept_for(p.op.d) == 8)
        bwd_e<T, 8>(st, p, grid, block);
    else
        bwd_e<T, 16>(st, p, grid, block);
    AR_TRY(cudaGetLastError(), "launch of the backward");
    const bool norm = p.op.norm_gain != nullptr;
    const unsigned pb = (unsigned)((p.op.d + 31) / 32);
    params_kernel<T><<<pb, 32 * PK_GROUPS, 0, st>>>(p.part_q, norm ? p.part_g : nullptr, (int)grid.x,
                                        p.op.d, (const T *)p.op.w, (const T *)p.op.gamma,
                                        p.b.dw, p.b.dgamma, p.b.norm_gain_grad);
    AR_TRY(cudaGetLastError(), "launch of the parameter sums");
    return K3RT_OK;
}

}  // namespace

extern "C" int ar_cuda_enter(int device, k3rt_error *err)
{
    AR_TRY(cudaSetDevice(device), "cudaSetDevice");
    return K3RT_OK;
}

extern "C" int ar_cuda_supported(int dtype, int64_t d, int n, k3rt_error *err)
{
    if (dtype != K3RT_F32 && dtype != K3RT_BF16)
        return k3rt_fail(err, K3RT_ERR_INVALID, "block_attnres cuda: dtype %s (f32 or bf16)",
                         k3rt_dtype_name(dtype));
    if (d < 1 || d > AR_CUDA_MAX_D || d % AR_CUDA_D_MULTIPLE)
        return k3rt_fail(err, K3RT_ERR_INVALID, "block_attnres cuda: d_model %lld must be a "
                         "multiple of %d and at most %d", (long long)d, AR_CUDA_D_MULTIPLE,
                         AR_CUDA_MAX_D);
    if (n < 1 || n > AR_CUDA_MAX_SOURCES)
        return k3rt_fail(err, K3RT_ERR_INVALID, "block_attnres cuda: %d sources in one op (at "
                         "most %d): use fewer blocks (a larger block_layers, or full = false)",
                         n, AR_CUDA_MAX_SOURCES);
    return K3RT_OK;
}

extern "C" int ar_cuda_fwd(void *stream, const ar_cuda_op *op, void *h, float *h32,
                           k3rt_error *err)
{
    K3RT_TRY(ar_cuda_supported(op->dtype, op->d, op->n, err));
    if (op->N < 1)
        return K3RT_OK;
    FwdParams p{*op, h, h32};
    cudaStream_t st = (cudaStream_t)stream;
    return op->dtype == K3RT_BF16 ? launch_fwd<bf16>(st, p, err) : launch_fwd<float>(st, p, err);
}

extern "C" int64_t ar_cuda_bwd_scratch_bytes(int64_t N, int64_t d)
{
    return 2 * (int64_t)bwd_blocks(N < 1 ? 1 : N) * d * (int64_t)sizeof(float);
}

extern "C" int ar_cuda_bwd_run(void *stream, const ar_cuda_op *op, const ar_cuda_bwd *b,
                               k3rt_error *err)
{
    K3RT_TRY(ar_cuda_supported(op->dtype, op->d, op->n, err));
    if (b->recon && (op->n < 1 || !op->rho_last || !op->z_last))
        return k3rt_fail(err, K3RT_ERR_INVALID, "block_attnres cuda: rebuilding the partial "
                         "sum needs its cached rho and z");
    if (op->N < 1)
        return K3RT_OK;
    float *part = (float *)b->scratch;
    BwdParams p{*op, *b, part, part + (int64_t)bwd_blocks(op->N) * op->d};
    cudaStream_t st = (cudaStream_t)stream;
    return op->dtype == K3RT_BF16 ? launch_bwd<bf16>(st, p, err) : launch_bwd<float>(st, p, err);
}

extern "C" int ar_cuda_alpha_stats(void *stream, const float *alpha, int64_t N, int n, int cols,
                                   int fresh, double tokens, double *sum, float *mean,
                                   k3rt_error *err)
{
    stats_kernel<<<(unsigned)cols, 256, 0, (cudaStream_t)stream>>>(alpha, N, n, fresh, tokens,
                                                                    sum, mean);
    AR_TRY(cudaGetLastError(), "launch of the depth-weight statistics");
    return K3RT_OK;
}
