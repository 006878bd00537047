// CUDA backend: streams, events and copies behind core/backend/backend.h (device memory is in
// alloc.cu, library handles and per-stream work memory in context.cu).
// CUDA types stay inside this file; the C side sees opaque pointers.
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
}

static int cuda_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "CUDA %s failed: %s (%s)", what,
                     cudaGetErrorName(e), cudaGetErrorString(e));
}

#define CUDA_TRY(call, what)                   \
    do {                                       \
        cudaError_t e_ = (call);               \
        if (e_ != cudaSuccess)                 \
            return cuda_fail(err, e_, what);   \
    } while (0)

extern "C" int cuda_backend_device_count(void)
{
    int n = 0;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();  // clear the sticky "no device" error
        return 0;
    }
    return n;
}

extern "C" int cuda_device_name(int device, char *buf, size_t len, k3rt_error *err)
{
    cudaDeviceProp prop;
    CUDA_TRY(cudaGetDeviceProperties(&prop, device), "cudaGetDeviceProperties");
    snprintf(buf, len, "%s", prop.name);
    return K3RT_OK;
}

extern "C" int cuda_stream_create(int device, void **native, k3rt_error *err)
{
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    cudaStream_t s;
    CUDA_TRY(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
    *native = (void *)s;
    return K3RT_OK;
}

extern "C" void cuda_stream_destroy(void *native)
{
    cuda_ctx_forget(native);  // the ops' per-stream memory goes back to the allocator first
    cudaStreamDestroy((cudaStream_t)native);
}

extern "C" int cuda_stream_sync(void *native, k3rt_error *err)
{
    CUDA_TRY(cudaStreamSynchronize((cudaStream_t)native), "cudaStreamSynchronize");
    return K3RT_OK;
}

extern "C" int cuda_event_create(int device, int timed, void **native, k3rt_error *err)
{
    CUDA_TRY(cudaSetDevice(device), "cudaSetDevice");
    cudaEvent_t e;
    CUDA_TRY(cudaEventCreateWithFlags(&e, timed ? cudaEventDefault : cudaEventDisableTiming),
             "cudaEventCreate");
    *native = (void *)e;
    return K3RT_OK;
}

extern "C" void cuda_event_destroy(void *native) { cudaEventDestroy((cudaEvent_t)native); }

extern "C" int cuda_event_record(void *event, void *stream, k3rt_error *err)
{
    CUDA_TRY(cudaEventRecord((cudaEvent_t)event, (cudaStream_t)stream), "cudaEventRecord");
    return K3RT_OK;
}

extern "C" int cuda_stream_wait(void *stream, void *event, k3rt_error *err)
{
    CUDA_TRY(cudaStreamWaitEvent((cudaStream_t)stream, (cudaEvent_t)event, 0),
             "cudaStreamWaitEvent");
    return K3RT_OK;
}

extern "C" int cuda_event_elapsed_ms(void *start, void *end, float *ms, k3rt_error *err)
{
    CUDA_TRY(cudaEventElapsedTime(ms, (cudaEvent_t)start, (cudaEvent_t)end),
             "cudaEventElapsedTime");
    return K3RT_OK;
}

extern "C" int cuda_memcpy(void *stream, void *dst, int dst_device, const void *src,
                           int src_device, size_t bytes, k3rt_error *err)
{
    cudaMemcpyKind kind = cudaMemcpyDefault;
    (void)dst_device;
    (void)src_device;
    CUDA_TRY(cudaMemcpyAsync(dst, src, bytes, kind, (cudaStream_t)stream), "cudaMemcpyAsync");
    return K3RT_OK;
}

extern "C" int cuda_memset(void *stream, void *dst, int value, size_t bytes, k3rt_error *err)
{
    CUDA_TRY(cudaMemsetAsync(dst, value, bytes, (cudaStream_t)stream), "cudaMemsetAsync");
    return K3RT_OK;
}
