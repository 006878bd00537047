// Error reporting and stream entry shared by the CUDA op files.
#include "ops/cuda/internal.cuh"

int cu_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "CUDA %s failed: %s (%s)", what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

int cu_bad_dtype(k3rt_error *err, const char *op, int dtype, const char *allowed)
{
    return k3rt_fail(err, K3RT_ERR_INVALID, "op %s: dtype %s is not supported on CUDA (%s)", op,
                     k3rt_dtype_name(dtype), allowed);
}

int cu_enter(k3rt_stream *s, cuda_stream_ctx **c, k3rt_error *err)
{
    return cuda_ctx_get(k3rt_stream_native(s), k3rt_stream_device(s), c, err);
}
