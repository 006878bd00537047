/* k3rt/stream.h — ordered queues of device work, and device memory.
 *
 * A stream belongs to one device. On the CPU work runs inline when it is enqueued (a CPU
 * stream is just the device tag plus a thread budget); on CUDA a stream wraps a cudaStream_t.
 * The host creates streams and orders them with events (k3rt/host.h); a plugin enqueues on the
 * stream of each call. No CUDA type crosses this header: the native handle is an opaque
 * pointer.
 */
#ifndef K3RT_STREAM_H
#define K3RT_STREAM_H

#include <stdint.h>
#include <stddef.h>
#include "errors.h"
#include "tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct k3rt_stream k3rt_stream;

K3RT_API int k3rt_stream_device(const k3rt_stream *s);
K3RT_API int k3rt_stream_sync(k3rt_stream *s, k3rt_error *err);
/* cudaStream_t for CUDA streams, NULL on the CPU. */
K3RT_API void *k3rt_stream_native(const k3rt_stream *s);
/* Threads CPU work on this stream may use (>= 1). */
K3RT_API int k3rt_stream_threads(const k3rt_stream *s);

/* Device memory. CUDA memory comes from the caching allocator (never managed memory): a freed
 * block is kept for the next request of its size class and handed out again at once, so free
 * CUDA memory only when the work using it is ordered before its next user (same stream, or
 * after a synchronisation or event). */
K3RT_API void *k3rt_alloc(int device, size_t bytes, k3rt_error *err);
K3RT_API void k3rt_free(int device, void *ptr);
K3RT_API int k3rt_memcpy(k3rt_stream *s, void *dst, int dst_device, const void *src,
                         int src_device, size_t bytes, k3rt_error *err);
K3RT_API int k3rt_memset(k3rt_stream *s, void *dst, int device, int value, size_t bytes,
                         k3rt_error *err);

#ifdef __cplusplus
}
#endif
#endif
