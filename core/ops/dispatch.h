/* Dispatch of a public op to its CPU kernel by dtype (f32 / f64). CUDA kernels arrive with the
 * CUDA backend; until an op has one, a CUDA stream gets an error naming the op. */
#ifndef K3RT_OPS_DISPATCH_H
#define K3RT_OPS_DISPATCH_H

#include <k3rt/ops.h>
#include "ops/cpu_ops.h"

int ops_no_cuda_kernel(k3rt_error *err, const char *op);
int ops_bad_dtype(k3rt_error *err, const char *op, int dtype);

/* CALL(SUF, REAL, THREADS) expands to the kernel call for one instantiation. */
#define OPS_DISPATCH(s, dtype, opname, CALL)                               \
    do {                                                                   \
        if (k3rt_stream_device(s) != K3RT_DEVICE_CPU)                      \
            return ops_no_cuda_kernel(err, opname);                        \
        int threads_ = k3rt_stream_threads(s);                             \
        if ((dtype) == K3RT_F32) {                                         \
            CALL(f32, float, threads_);                                    \
            return K3RT_OK;                                                \
        }                                                                  \
        if ((dtype) == K3RT_F64) {                                         \
            CALL(f64, double, threads_);                                   \
            return K3RT_OK;                                                \
        }                                                                  \
        return ops_bad_dtype(err, opname, dtype);                          \
    } while (0)

#endif
