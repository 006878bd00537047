/* What the CUDA ops (core/ops/cuda) need from the CUDA backend: per-device library handles
 * and per-stream work memory. Opaque pointers only, so C code may include it too. */
#ifndef K3RT_CUDA_BACKEND_H
#define K3RT_CUDA_BACKEND_H

#include <stddef.h>
#include <k3rt/errors.h>

#ifdef __cplusplus
extern "C" {
#endif

/* One per CUDA stream, created on first use and freed when the stream is destroyed. A stream
 * is driven by one host thread at a time, so the fields need no lock. */
typedef struct cuda_stream_ctx {
    void *stream;          /* cudaStream_t */
    int device;
    int sms;               /* multiprocessors of the device */
    void *blaslt;          /* the device's cublasLtHandle_t (shared by its streams) */
    void *blas_ws;         /* cuBLASLt workspace of this stream */
    size_t blas_ws_bytes;
    void *scratch;         /* kernels' temporary memory (cuda_ctx_scratch) */
    size_t scratch_bytes;
} cuda_stream_ctx;

/* The context of a stream of `device`; also makes `device` current on the calling thread. */
int cuda_ctx_get(void *stream, int device, cuda_stream_ctx **out, k3rt_error *err);
/* At least `bytes` of device memory private to the stream, valid until the next call on the
 * same stream (growing it waits for the stream's pending work first). */
int cuda_ctx_scratch(cuda_stream_ctx *c, size_t bytes, void **out, k3rt_error *err);
/* Called by cuda_stream_destroy: waits for the stream and frees its context. */
void cuda_ctx_forget(void *stream);

/* The device's classic cuBLAS handle (the fallback GEMM path), created on first use. It is
 * shared by the device's streams, so calls set its stream and workspace under the lock. */
int cuda_blas_acquire(int device, void **handle, k3rt_error *err);
void cuda_blas_release(int device);

#ifdef __cplusplus
}
#endif
#endif
