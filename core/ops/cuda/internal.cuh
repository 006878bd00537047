// Shared pieces of the CUDA ops: error checks, element conversions, vector access, warp and
// block reductions, launch sizing, and the functions one op file lends another.
#ifndef K3RT_OPS_CUDA_INTERNAL_CUH
#define K3RT_OPS_CUDA_INTERNAL_CUH

#include <cuda_bf16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>
#include <stdint.h>

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "ops/cuda_ops.h"
}

typedef __nv_bfloat16 bf16;
// fp8 e4m3 by its storage byte; conversions below.
struct fp8e4m3 {
    uint8_t bits;
};

// ---- errors -----------------------------------------------------------------------------------

int cu_fail(k3rt_error *err, cudaError_t e, const char *what);
int cu_bad_dtype(k3rt_error *err, const char *op, int dtype, const char *allowed);

#define CU_TRY(call, what)                    \
    do {                                      \
        cudaError_t e_ = (call);              \
        if (e_ != cudaSuccess)                \
            return cu_fail(err, e_, what);    \
    } while (0)

// After a kernel launch: a bad configuration shows here, not at the next synchronisation.
#define CU_LAUNCHED(kernel_name) CU_TRY(cudaGetLastError(), "launch of " kernel_name)

// Makes the stream's device current and returns its context.
int cu_enter(k3rt_stream *s, cuda_stream_ctx **c, k3rt_error *err);

// ---- elements ---------------------------------------------------------------------------------

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(double x) { return (float)x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_f(fp8e4m3 x)
{
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)x.bits, __NV_E4M3);
    return __half2float(__half(h));
}

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ double from_f<double>(float x) { return (double)x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }
template <> __device__ __forceinline__ fp8e4m3 from_f<fp8e4m3>(float x)
{
    // Saturating round-to-nearest-even; every NaN becomes 0x7f, as on the CPU.
    fp8e4m3 r;
    r.bits = x != x ? (uint8_t)0x7f
                    : (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3);
    return r;
}

// V consecutive elements moved as one access (16 bytes when V * sizeof(T) == 16).
template <typename T, int V> struct alignas(sizeof(T) * V) pack {
    T v[V];
};

template <int V, typename T> __device__ __forceinline__ void load(const T *p, float (&out)[V])
{
    pack<T, V> k = *reinterpret_cast<const pack<T, V> *>(p);
#pragma unroll
    for (int e = 0; e < V; e++)
        out[e] = to_f(k.v[e]);
}

template <int V, typename T> __device__ __forceinline__ void store(T *p, const float (&in)[V])
{
    pack<T, V> k;
#pragma unroll
    for (int e = 0; e < V; e++)
        k.v[e] = from_f<T>(in[e]);
    *reinterpret_cast<pack<T, V> *>(p) = k;
}

// Elements per 16-byte access.
template <typename T> constexpr int vec_width() { return (int)(16 / sizeof(T)); }

inline bool aligned_to(const void *p, size_t bytes)
{
    return p == nullptr || ((uintptr_t)p % bytes) == 0;
}

// ---- reductions (fixed shuffle trees: the same inputs give the same bits) -----------------

template <typename R> __device__ __forceinline__ R warp_sum(R v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block; every thread gets the result. `sh` holds 32 entries.
template <typename R> __device__ __forceinline__ R block_sum(R v, R *sh)
{
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, warps = (blockDim.x + 31) >> 5;
    v = warp_sum(v);
    __syncthreads();  // sh may still be read by a previous call
    if (lane == 0)
        sh[warp] = v;
    __syncthreads();
    v = lane < warps ? sh[lane] : (R)0;
    return warp_sum(v);
}

// ---- launch sizing ----------------------------------------------------------------------------

// Blocks for a grid-stride loop over `items`: enough to fill the device, no more.
inline unsigned grid_for(int64_t items, int threads, int sms)
{
    int64_t want = (items + threads - 1) / threads, cap = (int64_t)sms * 16;
    if (want > cap)
        want = cap;
    return (unsigned)(want > 0 ? want : 1);
}

// ---- shared between op files --------------------------------------------------------------------

// cuBLASLt product in row-major terms (gemm.cu): C(m,n) = alpha op(A) op(B) + beta C_in
// [+ bias(n) broadcast over rows], `batch` times at element strides; C_in is C itself unless
// c_in is given (same layout and type). ab_type and c_type are K3RT_F32 or K3RT_BF16.
struct cu_matmul {
    int ta, tb;
    int64_t m, n, k;
    int ab_type, c_type;
    const void *a;
    int64_t lda, stride_a;
    const void *b;
    int64_t ldb, stride_b;
    void *c;
    int64_t ldc, stride_c;
    int64_t batch;
    double alpha, beta;
    const void *bias;  // of type c_type, or nullptr
    const void *c_in;  // the addend when it is not C, or nullptr
};
int cu_matmul_run(cuda_stream_ctx *ctx, const cu_matmul &mm, k3rt_error *err);

// Deterministic column sums (colsum.cu): out(d) += sum over rows i of dy(i,:) [* x(i,:) *
// rstd(i) when x is given], summed in fixed row blocks, then the blocks in order.
int cu_colsum_accumulate(cuda_stream_ctx *ctx, int dtype, const void *dy, const void *x,
                         const float *rstd, float *out, int64_t n, int64_t d, k3rt_error *err);
// Its second pass alone: out(d) += sum over p in order of part(p, :) (a kernel that wrote
// per-block partial column sums itself, as the fused RMSNorm backward does).
int cu_colsum_finish(cuda_stream_ctx *ctx, const float *part, int64_t parts, int64_t d,
                     float *out, k3rt_error *err);

// Out-of-range index record (index_error.cu): the device word kernels report into.
enum {
    CU_IDX_EMBEDDING_FWD = 1,
    CU_IDX_EMBEDDING_BWD = 2,
    CU_IDX_XENT_FWD = 3,
    CU_IDX_XENT_BWD = 4
};
struct cu_index_record {
    int flag;      // 0 clear; set once by the first offender
    int op;        // CU_IDX_*
    long long position, value, limit;
};
int cu_index_record_get(int device, cu_index_record **rec, k3rt_error *err);
// cu_enter, then the record of the stream's device: the start of every op that reads indices.
int cu_enter_indexed(k3rt_stream *s, cuda_stream_ctx **c, cu_index_record **rec,
                     k3rt_error *err);

__device__ __forceinline__ void report_bad_index(cu_index_record *rec, int op, int64_t pos,
                                                 int64_t value, int64_t limit)
{
    if (atomicCAS(&rec->flag, 0, 1) == 0) {
        rec->op = op;
        rec->position = pos;
        rec->value = value;
        rec->limit = limit;
    }
}

#endif
