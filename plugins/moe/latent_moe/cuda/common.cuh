// Pieces shared by LatentMoE's kernels: conversions and the error check after CUDA calls.
#ifndef K3RT_PLUGIN_LATENT_MOE_CUDA_COMMON_CUH
#define K3RT_PLUGIN_LATENT_MOE_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include "lmoe_cuda.h"

namespace lmcu {

typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float to_f(float x) { return x; }
__device__ __forceinline__ float to_f(bf16 x) { return __bfloat162float(x); }
template <typename T> __device__ __forceinline__ T from_f(float x);
template <> __device__ __forceinline__ float from_f<float>(float x) { return x; }
template <> __device__ __forceinline__ bf16 from_f<bf16>(float x) { return __float2bfloat16_rn(x); }

static inline int cu_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "latent_moe: %s failed: %s (%s)", what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

// Grid sizes stay within CUDA's 2^31 - 1 blocks: R < 2^31 rows is checked at the forward.
static inline unsigned blocks(int64_t n) { return (unsigned)(n > 0 ? n : 1); }

}  // namespace lmcu

#define LMOE_CU_TRY(call, what)                     \
    do {                                          \
        cudaError_t e_ = (call);                  \
        if (e_ != cudaSuccess)                    \
            return ::lmcu::cu_fail(err, e_, what); \
    } while (0)

// After a launch: a bad configuration shows here, not at the next synchronisation.
#define LMOE_LAUNCHED(name) LMOE_CU_TRY(cudaGetLastError(), "launch of " name)

#endif
