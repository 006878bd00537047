// Per-device library handles (cuBLASLt, cuBLAS) and per-stream work memory for the CUDA ops.
#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <mutex>
#include <new>
#include <vector>

extern "C" {
#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
}

namespace {

constexpr int kMaxDevices = 64;
// NVIDIA's recommendation for Hopper; enough for every cuBLASLt algorithm.
constexpr size_t kBlasWorkspace = (size_t)32 << 20;

struct device_state {
    std::mutex mu;          // guards creation of the handles
    cublasLtHandle_t lt = nullptr;
    int sms = 0;
    std::mutex blas_mu;     // held while the classic handle is in use
    cublasHandle_t blas = nullptr;
};

device_state g_dev[kMaxDevices];
std::mutex g_ctx_mu;
std::vector<cuda_stream_ctx *> g_ctx;

int cuda_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "CUDA %s failed: %s (%s)", what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

int blas_fail(k3rt_error *err, cublasStatus_t s, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "cuBLAS %s failed: %s (%s)", what,
                     cublasGetStatusName(s), cublasGetStatusString(s));
}

int use_device(int device, k3rt_error *err)
{
    if (device < 0 || device >= kMaxDevices)
        return k3rt_fail(err, K3RT_ERR_INVALID, "CUDA device %d is outside [0, %d)", device,
                         kMaxDevices);
    int cur = -1;
    cudaError_t e = cudaGetDevice(&cur);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "cudaGetDevice");
    if (cur != device && (e = cudaSetDevice(device)) != cudaSuccess)
        return cuda_fail(err, e, "cudaSetDevice");
    return K3RT_OK;
}

// Creates the device's cuBLASLt handle and reads its multiprocessor count, once.
int device_init(int device, k3rt_error *err)
{
    device_state &d = g_dev[device];
    std::lock_guard<std::mutex> lock(d.mu);
    if (d.lt)
        return K3RT_OK;
    int sms = 0;
    cudaError_t e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "cudaDeviceGetAttribute(MultiProcessorCount)");
    cublasLtHandle_t h = nullptr;
    cublasStatus_t s = cublasLtCreate(&h);
    if (s != CUBLAS_STATUS_SUCCESS)
        return blas_fail(err, s, "cublasLtCreate");
    d.sms = sms;
    d.lt = h;
    return K3RT_OK;
}

}  // namespace

extern "C" int cuda_ctx_get(void *stream, int device, cuda_stream_ctx **out, k3rt_error *err)
{
    K3RT_TRY(use_device(device, err));
    K3RT_TRY(device_init(device, err));
    std::lock_guard<std::mutex> lock(g_ctx_mu);
    for (cuda_stream_ctx *c : g_ctx)
        if (c->stream == stream && c->device == device) {
            *out = c;
            return K3RT_OK;
        }
    cuda_stream_ctx *c = new (std::nothrow) cuda_stream_ctx();
    if (!c)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "cannot allocate a CUDA stream context");
    c->stream = stream;
    c->device = device;
    c->sms = g_dev[device].sms;
    c->blaslt = (void *)g_dev[device].lt;
    c->blas_ws = cuda_alloc(device, kBlasWorkspace, err);
    if (!c->blas_ws) {
        delete c;
        return k3rt_error_prefix(err, "cuBLASLt workspace: ");
    }
    c->blas_ws_bytes = kBlasWorkspace;
    try {
        g_ctx.push_back(c);
    } catch (const std::bad_alloc &) {
        cuda_free(device, c->blas_ws);
        delete c;
        return k3rt_fail(err, K3RT_ERR_NOMEM, "cannot register a CUDA stream context");
    }
    *out = c;
    return K3RT_OK;
}

extern "C" int cuda_ctx_scratch(cuda_stream_ctx *c, size_t bytes, void **out, k3rt_error *err)
{
    if (bytes > c->scratch_bytes) {
        // The old buffer may still be read by queued kernels of this stream.
        host_wait_note();
        cudaError_t e = cudaStreamSynchronize((cudaStream_t)c->stream);
        if (e != cudaSuccess)
            return cuda_fail(err, e, "cudaStreamSynchronize (growing scratch memory)");
        cuda_free(c->device, c->scratch);
        c->scratch = nullptr;
        c->scratch_bytes = 0;
        size_t want = bytes < ((size_t)1 << 20) ? ((size_t)1 << 20) : bytes + bytes / 4;
        void *p = cuda_alloc(c->device, want, err);
        if (!p)
            return k3rt_error_prefix(err, "kernel scratch memory: ");
        c->scratch = p;
        c->scratch_bytes = want;
    }
    *out = c->scratch;
    return K3RT_OK;
}

extern "C" void cuda_ctx_forget(void *stream)
{
    std::lock_guard<std::mutex> lock(g_ctx_mu);
    for (size_t i = 0; i < g_ctx.size(); i++) {
        cuda_stream_ctx *c = g_ctx[i];
        if (c->stream != stream)
            continue;
        cudaSetDevice(c->device);
        cudaStreamSynchronize((cudaStream_t)stream);
        cuda_free(c->device, c->blas_ws);
        cuda_free(c->device, c->scratch);
        delete c;
        g_ctx.erase(g_ctx.begin() + (long)i);
        return;
    }
}

extern "C" int cuda_blas_acquire(int device, void **handle, k3rt_error *err)
{
    K3RT_TRY(use_device(device, err));
    device_state &d = g_dev[device];
    d.blas_mu.lock();
    if (!d.blas) {
        cublasStatus_t s = cublasCreate(&d.blas);
        if (s == CUBLAS_STATUS_SUCCESS)
            s = cublasSetPointerMode(d.blas, CUBLAS_POINTER_MODE_HOST);
        if (s != CUBLAS_STATUS_SUCCESS) {
            if (d.blas)
                cublasDestroy(d.blas);
            d.blas = nullptr;
            d.blas_mu.unlock();
            return blas_fail(err, s, "cublasCreate");
        }
    }
    *handle = (void *)d.blas;
    return K3RT_OK;
}

extern "C" void cuda_blas_release(int device) { g_dev[device].blas_mu.unlock(); }
