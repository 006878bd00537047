// per_head_muon's elementwise kernels on CUDA (muon_cuda.h): momentum into the arena with the
// blocks' partial sums of squares, the Frobenius normalisation, the update, and QK-clip. The
// products of Newton-Schulz are cuBLAS's, through k3rt_gemm_strided_batched (cuda.c).
//
// One CUDA block per chunk; a chunk lies inside one Muon block (or one clip head), so its
// element i sits at row i / cols, column i % cols of that block. Reductions are fixed trees
// (no atomics) so the same inputs give the same bits.
#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>

#include "muon_cuda.h"

typedef __nv_bfloat16 bf16;

namespace {

constexpr int kThreads = 256;

int cu_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "per_head_muon: %s failed: %s (%s)", what,
                     cudaGetErrorName(e), cudaGetErrorString(e));
}

#define MU_TRY(call, what)                  \
    do {                                    \
        cudaError_t e_ = (call);            \
        if (e_ != cudaSuccess)              \
            return cu_fail(err, e_, what);  \
    } while (0)
#define MU_LAUNCHED(name) MU_TRY(cudaGetLastError(), "launch of " name)

// Element i of a block at row i / cols, column i % cols; in 32 bits when it fits (the 64-bit
// division is several times the cost of the element's own work).
__device__ __forceinline__ int64_t elem(int64_t i, int64_t cols, int64_t ld, int64_t src)
{
    if (i <= INT32_MAX && cols <= INT32_MAX) {
        uint32_t r = (uint32_t)i / (uint32_t)cols;
        return src + (int64_t)r * ld + (i - (int64_t)r * cols);
    }
    return src + (i / cols) * ld + i % cols;
}

// Sum over the CUDA block in a fixed order; thread 0 gets the result.
__device__ __forceinline__ double block_sum(double v)
{
    __shared__ double sh[kThreads / 32];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((threadIdx.x & 31) == 0)
        sh[threadIdx.x >> 5] = v;
    __syncthreads();
    double t = 0;
    if (threadIdx.x == 0)
        for (int w = 0; w < kThreads / 32; w++)
            t += sh[w];
    return t;
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }

// V consecutive values (V = 4: one 16-byte or 8-byte access) to and from floats.
template <int V, typename T> __device__ __forceinline__ void ldv(const T *p, float (&x)[V])
{
    if constexpr (V == 1) {
        x[0] = to_f(*p);
    } else if constexpr (sizeof(T) == 4) {
        float4 t = *reinterpret_cast<const float4 *>(p);
        x[0] = t.x, x[1] = t.y, x[2] = t.z, x[3] = t.w;
    } else {
        uint2 t = *reinterpret_cast<const uint2 *>(p);
        const bf16 *h = reinterpret_cast<const bf16 *>(&t);
#pragma unroll
        for (int c = 0; c < 4; c++)
            x[c] = __bfloat162float(h[c]);
    }
}
template <int V, typename T> __device__ __forceinline__ void stv(T *p, const float (&x)[V])
{
    if constexpr (V == 1) {
        if constexpr (sizeof(T) == 2)
            *p = __float2bfloat16_rn(x[0]);
        else
            *p = x[0];
    } else if constexpr (sizeof(T) == 4) {
        *reinterpret_cast<float4 *>(p) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
        uint2 t;
        bf16 *h = reinterpret_cast<bf16 *>(&t);
#pragma unroll
        for (int c = 0; c < 4; c++)
            h[c] = __float2bfloat16_rn(x[c]);
        *reinterpret_cast<uint2 *>(p) = t;
    }
}

__device__ __forceinline__ bool al16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// Whether a chunk runs four elements to an access: every run of four is in one row and starts
// 16 bytes into both its parameter and the arena.
__device__ __forceinline__ bool quads(const muon_cu_block &b, const muon_cu_chunk &c)
{
    return ((b.cols | b.ld | b.src | b.dst | c.first | (int64_t)c.count) & 3) == 0;
}

template <int V>
__device__ double momentum_walk(const muon_cu_chunk &c, const muon_cu_block &b,
                                const muon_cu_ptrs &p, float beta, float one_beta, int nesterov,
                                float *u)
{
    double acc = 0.0;
    for (int k = threadIdx.x * V; k < c.count; k += kThreads * V) {
        int64_t i = c.first + k, e = elem(i, b.cols, b.ld, b.src);
        float g[V], m[V], v[V];
        ldv<V>(p.g + e, g);
        ldv<V>(p.mom + e, m);
#pragma unroll
        for (int q = 0; q < V; q++) {
            m[q] = beta * m[q] + one_beta * g[q];
            v[q] = nesterov ? one_beta * g[q] + beta * m[q] : m[q];
            acc += (double)v[q] * v[q];  // in double, as the CPU sums
        }
        stv<V>(p.mom + e, m);
        stv<V>(u + b.dst + i, v);
    }
    return acc;
}

__global__ void __launch_bounds__(kThreads)
momentum_kernel(const muon_cu_ptrs *ptrs, const muon_cu_block *blocks,
                const muon_cu_chunk *chunks, float beta, float one_beta, int nesterov, float *u,
                double *partial)
{
    const muon_cu_chunk c = chunks[blockIdx.x];
    const muon_cu_block b = blocks[c.owner];
    const muon_cu_ptrs p = ptrs[b.ptrs];
    const bool q4 = quads(b, c) && al16(p.g) && al16(p.mom) && al16(u);
    double t = block_sum(q4 ? momentum_walk<4>(c, b, p, beta, one_beta, nesterov, u)
                            : momentum_walk<1>(c, b, p, beta, one_beta, nesterov, u));
    if (threadIdx.x == 0)
        partial[blockIdx.x] = t;
}

template <int V, typename T>
__device__ void normalise_walk(const muon_cu_chunk &c, const muon_cu_block &b, float f,
                               const float *u, T *x)
{
    for (int k = threadIdx.x * V; k < c.count; k += kThreads * V) {
        int64_t i = b.dst + c.first + k;
        float v[V];
        ldv<V>(u + i, v);
#pragma unroll
        for (int q = 0; q < V; q++)
            v[q] *= f;
        stv<V>(x + i, v);
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
normalise_kernel(const muon_cu_block *blocks, const muon_cu_chunk *chunks,
                 const double *partial, double eps, const float *u, T *x)
{
    const muon_cu_chunk c = chunks[blockIdx.x];
    const muon_cu_block b = blocks[c.owner];
    __shared__ float inv;
    if (threadIdx.x == 0) {
        double ss = 0;
        for (int64_t k = b.chunk0; k < b.chunk1; k++)
            ss += partial[k];
        inv = (float)(1.0 / (sqrt(ss) + eps));
    }
    __syncthreads();
    if (quads(b, c) && al16(u) && al16(x))
        normalise_walk<4>(c, b, inv, u, x);
    else
        normalise_walk<1>(c, b, inv, u, x);
}

template <int V, typename T>
__device__ void apply_walk(const muon_cu_chunk &c, const muon_cu_block &b, float *w, const T *x,
                           float keep, float rate)
{
    for (int k = threadIdx.x * V; k < c.count; k += kThreads * V) {
        int64_t i = c.first + k, e = elem(i, b.cols, b.ld, b.src);
        float wv[V], xv[V];
        ldv<V>(w + e, wv);
        ldv<V>(x + b.dst + i, xv);
#pragma unroll
        for (int q = 0; q < V; q++)
            wv[q] = wv[q] * keep - rate * xv[q];
        stv<V>(w + e, wv);
    }
}

template <typename T>
__global__ void __launch_bounds__(kThreads)
apply_kernel(const muon_cu_ptrs *ptrs, const muon_cu_block *blocks, const muon_cu_chunk *chunks,
             const T *x, double lr, double scale, double wd)
{
    const muon_cu_chunk c = chunks[blockIdx.x];
    const muon_cu_block b = blocks[c.owner];
    float *w = ptrs[b.ptrs].w;
    // As the CPU folds them: in double, then the parameters' f32.
    const float rate = (float)(lr * scale * b.shape);
    const float keep = (float)(1.0 - (b.decayed ? lr * wd : 0.0));
    if (quads(b, c) && al16(w) && al16(x))
        apply_walk<4>(c, b, w, x, keep, rate);
    else
        apply_walk<1>(c, b, w, x, keep, rate);
}

__global__ void __launch_bounds__(kThreads)
qk_clip_kernel(const muon_cu_ptrs *ptrs, const muon_cu_clip *clips, const muon_cu_chunk *chunks,
               double tau, int32_t *bad)
{
    const muon_cu_chunk c = chunks[blockIdx.x];
    const muon_cu_clip h = clips[c.owner];
    const muon_cu_ptrs p = ptrs[h.ptrs];
    const float s = p.logit[h.head];
    if (isnan(s) || s == INFINITY) {
        if (threadIdx.x == 0)
            atomicMin(bad, h.id);
        return;
    }
    if (!((double)s > tau))  // as the CPU compares: the f32 logit against tau in double
        return;
    double gamma = tau / (double)s;
    const float f = (float)(h.mode == K3RT_QK_SQRT ? sqrt(gamma) : gamma);
    for (int k = threadIdx.x; k < c.count; k += kThreads) {
        int64_t e = elem(c.first + k, h.cols, h.ld, h.src);
        p.w[e] *= f;
    }
}

int grid(int64_t n_chunks, unsigned *g, k3rt_error *err)
{
    if (n_chunks > 0x7fffffff)
        return k3rt_fail(err, K3RT_ERR_INVALID, "per_head_muon: %lld chunks exceed one launch",
                         (long long)n_chunks);
    *g = (unsigned)n_chunks;
    return K3RT_OK;
}

}  // namespace

extern "C" int muon_cu_momentum(void *stream, const muon_cu_ptrs *ptrs,
                                const muon_cu_block *blocks, const muon_cu_chunk *chunks,
                                int64_t n_chunks, double beta, int nesterov, float *u,
                                double *partial, k3rt_error *err)
{
    unsigned g = 0;
    K3RT_TRY(grid(n_chunks, &g, err));
    if (!g)
        return K3RT_OK;
    momentum_kernel<<<g, kThreads, 0, (cudaStream_t)stream>>>(
        ptrs, blocks, chunks, (float)beta, (float)(1.0 - beta), nesterov, u, partial);
    MU_LAUNCHED("momentum_kernel");
    return K3RT_OK;
}

extern "C" int muon_cu_normalise(void *stream, const muon_cu_block *blocks,
                                 const muon_cu_chunk *chunks, int64_t n_chunks,
                                 const double *partial, double eps, const float *u, void *x,
                                 int x_bf16, k3rt_error *err)
{
    unsigned g = 0;
    K3RT_TRY(grid(n_chunks, &g, err));
    if (!g)
        return K3RT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (x_bf16)
        normalise_kernel<bf16><<<g, kThreads, 0, st>>>(blocks, chunks, partial, eps, u,
                                                       (bf16 *)x);
    else
        normalise_kernel<float><<<g, kThreads, 0, st>>>(blocks, chunks, partial, eps, u,
                                                        (float *)x);
    MU_LAUNCHED("normalise_kernel");
    return K3RT_OK;
}

extern "C" int muon_cu_apply(void *stream, const muon_cu_ptrs *ptrs, const muon_cu_block *blocks,
                             const muon_cu_chunk *chunks, int64_t n_chunks, const void *x,
                             int x_bf16, double lr, double scale, double weight_decay,
                             k3rt_error *err)
{
    unsigned g = 0;
    K3RT_TRY(grid(n_chunks, &g, err));
    if (!g)
        return K3RT_OK;
    cudaStream_t st = (cudaStream_t)stream;
    if (x_bf16)
        apply_kernel<bf16><<<g, kThreads, 0, st>>>(ptrs, blocks, chunks, (const bf16 *)x, lr,
                                                   scale, weight_decay);
    else
        apply_kernel<float><<<g, kThreads, 0, st>>>(ptrs, blocks, chunks, (const float *)x, lr,
                                                    scale, weight_decay);
    MU_LAUNCHED("apply_kernel");
    return K3RT_OK;
}

extern "C" int muon_cu_qk_clip(void *stream, const muon_cu_ptrs *ptrs, const muon_cu_clip *clips,
                               const muon_cu_chunk *chunks, int64_t n_chunks, double tau,
                               int32_t *bad, k3rt_error *err)
{
    unsigned g = 0;
    K3RT_TRY(grid(n_chunks, &g, err));
    if (!g)
        return K3RT_OK;
    qk_clip_kernel<<<g, kThreads, 0, (cudaStream_t)stream>>>(ptrs, clips, chunks, tau, bad);
    MU_LAUNCHED("qk_clip_kernel");
    return K3RT_OK;
}

// ---- a word read back without a synchronisation ------------------------------------------

struct muon_cu_word {
    int32_t *dev, *host;  // dev: the caller's; host: pinned
    cudaEvent_t done;
    int posted;
};

extern "C" int muon_cu_word_create(muon_cu_word **out, int device, int32_t *dev,
                                   k3rt_error *err)
{
    muon_cu_word *w = (muon_cu_word *)calloc(1, sizeof *w);
    if (!w)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "per_head_muon: out of memory");
    *out = w;
    w->dev = dev;
    MU_TRY(cudaSetDevice(device), "cudaSetDevice");
    MU_TRY(cudaMallocHost(&w->host, sizeof(int32_t)), "cudaMallocHost (QK-clip flag)");
    MU_TRY(cudaEventCreateWithFlags(&w->done, cudaEventDisableTiming), "cudaEventCreate");
    *w->host = MUON_CU_NONE;
    return K3RT_OK;
}

extern "C" int muon_cu_word_post(muon_cu_word *w, void *stream, k3rt_error *err)
{
    cudaStream_t st = (cudaStream_t)stream;
    MU_TRY(cudaMemcpyAsync(w->host, w->dev, sizeof(int32_t), cudaMemcpyDeviceToHost, st),
           "cudaMemcpyAsync (QK-clip flag)");
    MU_TRY(cudaMemsetAsync(w->dev, 0x7f, sizeof(int32_t), st), "cudaMemsetAsync (QK-clip flag)");
    MU_TRY(cudaEventRecord(w->done, st), "cudaEventRecord (QK-clip flag)");
    w->posted = 1;
    return K3RT_OK;
}

extern "C" int muon_cu_word_poll(muon_cu_word *w, int32_t *value, k3rt_error *err)
{
    *value = MUON_CU_NONE;
    if (!w->posted)
        return K3RT_OK;
    cudaError_t e = cudaEventQuery(w->done);
    if (e == cudaErrorNotReady)
        return K3RT_OK;
    MU_TRY(e, "cudaEventQuery (QK-clip flag)");
    *value = *w->host;
    *w->host = MUON_CU_NONE;
    w->posted = 0;
    return K3RT_OK;
}

extern "C" int muon_cu_word_posted(const muon_cu_word *w) { return w->posted; }

extern "C" void muon_cu_word_destroy(muon_cu_word *w)
{
    if (!w)
        return;
    if (w->done)
        cudaEventDestroy(w->done);
    if (w->host)
        cudaFreeHost(w->host);
    free(w);
}
