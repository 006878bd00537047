// Pieces shared by the MLA plugin's .cu files: error checks, element conversions, the attention
// kernels' launch functions (attn_tc.cu, attn_simple.cu) as attn.cu calls them.
#ifndef K3RT_PLUGIN_MLA_CUDA_COMMON_CUH
#define K3RT_PLUGIN_MLA_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "mla_cuda.h"

typedef __nv_bfloat16 bf16;

int mla_cu_fail(k3rt_error *err, cudaError_t e, const char *what);

#define MLA_CU_TRY(call, what)                  \
    do {                                        \
        cudaError_t e_ = (call);                \
        if (e_ != cudaSuccess)                  \
            return mla_cu_fail(err, e_, what);  \
    } while (0)

// After a launch: a bad configuration shows here, not at the next synchronisation.
#define MLA_LAUNCHED(name) MLA_CU_TRY(cudaGetLastError(), "launch of " name)

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }

template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

// max that keeps a NaN (a broken logit must reach QK-clip's finiteness check).
__device__ __forceinline__ float nan_max(float a, float b)
{
    return (a != a || b != b) ? __int_as_float(0x7fc00000) : fmaxf(a, b);
}

// Packed documents (mla_attn.docs, offsets [n + 1] over the B*T tokens): the document of token t
// of batch row b as [first, end), row-relative, by binary search. Query t sees keys
// first(t) <= j <= t; key j is seen by queries j <= i < end(j). Without documents (off NULL) the
// whole row. Offsets on the device are the data loader's promise, unchecked: the span is
// clamped to the row and to t, so that broken offsets give wrong numbers but no access out of
// bounds.
struct doc_span_t {
    int first, end;
};
// The document of token g of the flattened order, in [0, n).
__device__ __forceinline__ int doc_index(const int *off, int n, int g)
{
    int lo = 0, hi = n;  // off[lo] <= g < off[hi]
    while (hi - lo > 1) {
        const int mid = (lo + hi) >> 1;
        if (off[mid] <= g)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}
__device__ __forceinline__ doc_span_t doc_span(const int *off, int n, int b, int T, int t)
{
    if (!off)
        return {0, T};
    t = min(max(t, 0), T - 1);
    const int base = b * T, d = doc_index(off, n, base + t);
    return {min(max(off[d] - base, 0), t), max(min(off[d + 1] - base, T), t + 1)};
}

// Largest dynamic shared memory a block of the current device may have.
int mla_smem_limit(int *bytes, k3rt_error *err);

// The kernels' launchers; a is checked and its pointers are non-NULL.
int mla_tc_supported(const mla_attn *a);
int mla_tc_fwd(cudaStream_t st, const mla_attn *a, k3rt_error *err);
int mla_tc_bwd(cudaStream_t st, const mla_attn *a, k3rt_error *err);
int mla_simple_fwd(cudaStream_t st, const mla_attn *a, k3rt_error *err);
int mla_simple_bwd(cudaStream_t st, const mla_attn *a, k3rt_error *err);
// drow[b, h, t] = dout[b, t, h, :] . o[b, t, h, :] in fp32.
int mla_row_dots(cudaStream_t st, const mla_attn *a, k3rt_error *err);

#endif
