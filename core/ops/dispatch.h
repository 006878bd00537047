/* Dispatch of a public op: a CUDA stream goes to the op's CUDA kernel (ops/cuda_ops.h), a CPU
 * stream to its CPU kernel by dtype (f32 / f64). A build without CUDA answers a CUDA stream
 * with an error naming the op. */
#ifndef K3RT_OPS_DISPATCH_H
#define K3RT_OPS_DISPATCH_H

#include <k3rt/host.h>
#include <k3rt/ops.h>
#include "ops/cpu_ops.h"
#ifdef K3RT_HAVE_CUDA
#include "ops/cuda_ops.h"
#endif

int ops_no_cuda_kernel(k3rt_error *err, const char *op);
/* The int64 host copy (malloc'd, *out) of groups + 1 group offsets of dtype K3RT_I32 or
 * K3RT_I64, checked: start at 0, end at most at `rows` (the grouped ops check the order). */
int ops_widen_offsets(const char *op, const void *offsets, int dtype, int64_t groups,
                      int64_t rows, int64_t **out, k3rt_error *err);
int ops_bad_dtype(k3rt_error *err, const char *op, int dtype);

/* Returns CUDA_EXPR (a cuda_* call) when s is a CUDA stream; the expression is not compiled
 * without the toolkit. */
#ifdef K3RT_HAVE_CUDA
#define OPS_ON_CUDA(s, opname, CUDA_EXPR)                                  \
    do {                                                                   \
        if (k3rt_stream_device(s) != K3RT_DEVICE_CPU)                      \
            return (CUDA_EXPR);                                            \
    } while (0)
#else
#define OPS_ON_CUDA(s, opname, CUDA_EXPR)                                  \
    do {                                                                   \
        if (k3rt_stream_device(s) != K3RT_DEVICE_CPU)                      \
            return ops_no_cuda_kernel(err, opname);                        \
    } while (0)
#endif

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
