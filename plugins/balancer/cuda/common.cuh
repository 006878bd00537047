// The error check after the balancers' CUDA calls.
#ifndef K3RT_PLUGIN_BALANCER_CUDA_COMMON_CUH
#define K3RT_PLUGIN_BALANCER_CUDA_COMMON_CUH

#include <cuda_runtime.h>

#include "bal_cuda.h"

static inline int bal_cu_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "balancer: %s failed: %s (%s)", what,
                     cudaGetErrorString(e), cudaGetErrorName(e));
}

#define BAL_LAUNCHED(name)                                       \
    do {                                                         \
        cudaError_t e_ = cudaGetLastError();                     \
        if (e_ != cudaSuccess)                                   \
            return bal_cu_fail(err, e_, "launch of " name);      \
    } while (0)

#endif
