// The AttnRes mixing op on CUDA (attnres_cuda.h has the contract, cpu.inc.c the math).
//
// Tiling. A token's row of d elements is spread over one thread block, 8 elements a thread up
// to d = 4096 (one 16-byte bf16 vector or two f32 ones), 16 beyond, so 2048 columns take 256
// threads and every per-token sum over d is one block reduction: warp shuffles, then the warps' partials added
// in warp order from shared memory (double-buffered, one barrier per reduction). The forward
// gives a block to a token; the backward a fixed grid of AR_CUDA_BWD_BLOCKS blocks, each
// walking tokens blockIdx.x, + gridDim.x, ..., so that its pseudo-query (and norm gain)
// gradient partial is one row of the scratch, summed over blocks in block order afterwards.
//
// Both kernels stream each source row once from memory and hold the next source's vectors in
// flight while the current one is reduced. The op is bound by memory traffic: the forward moves
// (n + 1) rows of d per token, the backward 2n + 2 (or, accumulating f32 gradients, more).
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <float.h>
#include <math.h>
#include <stdint.h>

#include "attnres_cuda.h"

namespace {

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

// Sums K values over the block; every thread gets the totals. `ph` alternates the shared
// buffer so one barrier per call suffices; the warps' partials are added in warp order.
template <int K> struct Reducer {
    float (*buf)[32][K];
    int ph = 0;
    __device__ void sum(float *x)
    {
#pragma unroll
        for (int k = 0; k < K; k++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                x[k] += __shfl_xor_sync(0xffffffffu, x[k], o);
        const int nw = blockDim.x >> 5;
        if (nw == 1)
            return;
        const int w = threadIdx.x >> 5;
        if ((threadIdx.x & 31) == 0)
#pragma unroll
            for (int k = 0; k < K; k++)
                buf[ph][w][k] = x[k];
        __syncthreads();
#pragma unroll
        for (int k = 0; k < K; k++) {
            float s = 0.0f;
            for (int i = 0; i < nw; i++)
                s += buf[ph][i][k];
            x[k] = s;
        }
        ph ^= 1;
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

template <typename T, int EPT, bool NORM>
__global__ void __launch_bounds__(512) fwd_kernel(const FwdParams p)
{
    __shared__ float red[2][32][2];
    __shared__ float zs[AR_CUDA_MAX_SOURCES];
    const ar_cuda_op &op = p.op;
    constexpr int P = Row<T, EPT>::P;
    const int64_t t = blockIdx.x, off = t * op.d;
    const float inv_d = 1.0f / (float)op.d;
    Row<T, EPT> r(op.d);
    Reducer<2> R{red};
    float q[EPT], acc[EPT], m = -INFINITY, l = 0.0f;
    load_q(r, op, q);
#pragma unroll
    for (int k = 0; k < EPT; k++)
        acc[k] = 0.0f;
    uint4 cur[P], nxt[P];
    r.load(op.v[0], off, cur);
    for (int i = 0; i < op.n; i++) {
        if (i + 1 < op.n)
            r.load(op.v[i + 1], off, nxt);
        float f[EPT], s[2] = {0.0f, 0.0f};
        r.unpack_all(cur, f);
#pragma unroll
        for (int k = 0; k < EPT; k++)
            s[0] += f[k] * f[k], s[1] += q[k] * f[k];
        R.sum(s);
        const float rho = 1.0f / sqrtf(s[0] * inv_d + op.eps), z = rho * s[1];
        if (threadIdx.x == 0) {
            zs[i] = z;
            if (i == op.n - 1 && op.rho_last)
                op.rho_last[t] = rho, op.z_last[t] = z;
        }
        const float mn = fmaxf(m, z), sc = expf(m - mn), pz = expf(z - mn);
        l = l * sc + pz;
#pragma unroll
        for (int k = 0; k < EPT; k++)
            acc[k] = acc[k] * sc + pz * f[k];
        m = mn;
#pragma unroll
        for (int j = 0; j < P; j++)
            cur[j] = nxt[j];
    }
    const float inv = 1.0f / l;
#pragma unroll
    for (int k = 0; k < EPT; k++)
        acc[k] *= inv;
    if (p.h32)
        r.write32(p.h32 + off, acc);
    r.write(p.h, off, acc);
    __syncthreads();  // zs
    for (int i = threadIdx.x; i < op.n; i += blockDim.x)
        op.alpha[t * op.n + i] = expf(zs[i] - m) * inv;
    if (NORM) {
        // the engine's RMSNorm of h as stored (rounded to T)
        float g[EPT], s[2] = {0.0f, 0.0f};
        r.round(acc);
#pragma unroll
        for (int k = 0; k < EPT; k++)
            s[0] += acc[k] * acc[k];
        R.sum(s);
        const float rs = 1.0f / sqrtf(s[0] * inv_d + op.norm_eps);
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
                                            int64_t off, float a, float dz, float rho, float z,
                                            const float *dh, const float *q, const float *v,
                                            float *dq)
{
    const float kq = dz * rho, kv = -dz * rho * rho * z / (float)p.op.d;
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

template <typename T, int EPT, bool NORM, bool RECON>
__global__ void __launch_bounds__(512) bwd_kernel(const BwdParams p)
{
    __shared__ float red[2][32][3];
    const ar_cuda_op &op = p.op;
    constexpr int P = Row<T, EPT>::P;
    const int n = op.n, nread = RECON ? n - 1 : n;
    const float inv_d = 1.0f / (float)op.d;
    Row<T, EPT> r(op.d);
    Reducer<3> R{red};
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
        float h[EPT], dh[EPT], hd;
        if (p.b.h32)
            r.read32(p.b.h32 + off, h);
        else
            r.read(p.b.h, off, h);
        r.read(p.b.dh, off, dh);
        if (NORM) {
            // dh = rs g dn - h rs^3 (h . g dn) / d: the engine's RMSNorm backward
            const float rs = op.rstd[t];
            float s[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int k = 0; k < EPT; k++) {
                gg[k] += dh[k] * h[k] * rs;
                s[0] += h[k] * ng[k] * dh[k], s[1] += h[k] * h[k];
            }
            R.sum(s);
            const float c = rs * rs * rs * s[0] * inv_d;
#pragma unroll
            for (int k = 0; k < EPT; k++)
                dh[k] = rs * ng[k] * dh[k] - c * h[k];
            hd = rs * s[0] - c * s[1];
        } else {
            float s[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int k = 0; k < EPT; k++)
                s[0] += dh[k] * h[k];
            R.sum(s);
            hd = s[0];
        }
        float S[EPT];  // RECON: sum_{i < n-1} alpha_i v_i
#pragma unroll
        for (int k = 0; k < EPT; k++)
            S[k] = 0.0f;
        uint4 cur[P], nxt[P];
        if (nread > 0)
            r.load(op.v[0], off, cur);
        for (int i = 0; i < nread; i++) {
            if (i + 1 < nread)
                r.load(op.v[i + 1], off, nxt);
            float f[EPT], s[3] = {0.0f, 0.0f, 0.0f};
            r.unpack_all(cur, f);
#pragma unroll
            for (int k = 0; k < EPT; k++)
                s[0] += dh[k] * f[k], s[1] += f[k] * f[k], s[2] += q[k] * f[k];
            R.sum(s);
            float rho, z;
            if (i == n - 1 && op.rho_last) {
                rho = op.rho_last[t], z = op.z_last[t];
            } else {
                rho = 1.0f / sqrtf(s[1] * inv_d + op.eps), z = rho * s[2];
            }
            const float a = al[i];
            source_grad(r, p, i, off, a, a * (s[0] - hd), rho, z, dh, q, f, dq);
            if (RECON)
#pragma unroll
                for (int k = 0; k < EPT; k++)
                    S[k] += a * f[k];
#pragma unroll
            for (int j = 0; j < P; j++)
                cur[j] = nxt[j];
        }
        if (RECON) {
            // the partial sum: p = (h - S) / alpha_{n-1}, 0 where alpha_{n-1} underflows (every
            // term that uses it carries that factor)
            const float a = al[n - 1];
            const float inv = a > FLT_EPSILON ? 1.0f / a : 0.0f;
            float s[3] = {0.0f, 0.0f, 0.0f};
#pragma unroll
            for (int k = 0; k < EPT; k++) {
                S[k] = (h[k] - S[k]) * inv;
                s[0] += dh[k] * S[k];
            }
            R.sum(s);
            source_grad(r, p, n - 1, off, a, a * (s[0] - hd), op.rho_last[t], op.z_last[t], dh,
                        q, S, dq);
        }
    }
    r.write32(p.part_q + blockIdx.x * op.d, dq);
    if (NORM)
        r.write32(p.part_g + blockIdx.x * op.d, gg);
}

// dq[k] = sum over blocks (in block order); dw += dq gamma, dgamma += dq w; the norm gain's too.
template <typename T>
__global__ void params_kernel(const float *part_q, const float *part_g, int blocks, int64_t d,
                              const T *w, const T *gamma, float *dw, float *dgamma, float *dng)
{
    const int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= d)
        return;
    float s = 0.0f, g = 0.0f;
    for (int b = 0; b < blocks; b++)
        s += part_q[b * d + k];
    dw[k] += s * (float)gamma[k];
    dgamma[k] += s * (float)w[k];
    if (part_g) {
        for (int b = 0; b < blocks; b++)
            g += part_g[b * d + k];
        dng[k] += g;
    }
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

template <typename T, int E>
void fwd_e(cudaStream_t st, const FwdParams &p, dim3 grid, dim3 block)
{
    if (p.op.norm_gain)
        fwd_kernel<T, E, true><<<grid, block, 0, st>>>(p);
    else
        fwd_kernel<T, E, false><<<grid, block, 0, st>>>(p);
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

template <typename T, int E>
void bwd_e(cudaStream_t st, const BwdParams &p, dim3 grid, dim3 block)
{
    const bool norm = p.op.norm_gain != nullptr;
    if (norm && p.b.recon)
        bwd_kernel<T, E, true, true><<<grid, block, 0, st>>>(p);
    else if (norm)
        bwd_kernel<T, E, true, false><<<grid, block, 0, st>>>(p);
    else if (p.b.recon)
        bwd_kernel<T, E, false, true><<<grid, block, 0, st>>>(p);
    else
        bwd_kernel<T, E, false, false><<<grid, block, 0, st>>>(p);
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
    const unsigned pt = 256, pb = (unsigned)((p.op.d + pt - 1) / pt);
    params_kernel<T><<<pb, pt, 0, st>>>(p.part_q, norm ? p.part_g : nullptr, (int)grid.x,
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
