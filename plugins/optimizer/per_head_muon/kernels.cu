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

__device__ __forceinline__ int64_t elem(int64_t i, int64_t cols, int64_t ld, int64_t src)
{
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

__global__ void __launch_bounds__(kThreads)
momentum_kernel(const muon_cu_ptrs *ptrs, const muon_cu_block *blocks,
                const muon_cu_chunk *chunks, float beta, float one_beta, int nesterov, float *u,
                double *partial)
{
    const muon_cu_chunk c = chunks[blockIdx.x];
    const muon_cu_block b = blocks[c.owner];
    const muon_cu_ptrs p = ptrs[b.ptrs];
    double acc = 0.0;
    for (int k = threadIdx.x; k < c.count; k += kThreads) {
        int64_t i = c.first + k, e = elem(i, b.cols, b.ld, b.src);
        float g = p.g[e];
        float m = beta * p.mom[e] + one_beta * g;
        p.mom[e] = m;
        float v = nesterov ? one_beta * g + beta * m : m;
        u[b.dst + i] = v;
        acc += (double)v * v;  // in double, as the CPU sums
    }
    double t = block_sum(acc);
    if (threadIdx.x == 0)
        partial[blockIdx.x] = t;
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
    const float f = inv;
    for (int k = threadIdx.x; k < c.count; k += kThreads) {
        int64_t i = b.dst + c.first + k;
        float v = u[i] * f;
        if constexpr (sizeof(T) == 2)
            x[i] = __float2bfloat16_rn(v);
        else
            x[i] = v;
    }
}

__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(bf16 v) { return __bfloat162float(v); }

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
    for (int k = threadIdx.x; k < c.count; k += kThreads) {
        int64_t i = c.first + k, e = elem(i, b.cols, b.ld, b.src);
        w[e] = w[e] * keep - rate * to_f(x[b.dst + i]);
    }
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
