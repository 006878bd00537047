/* Device backends behind the stream and ops interfaces. The CPU backend is always built; the
 * CUDA backend when the toolkit is found (K3RT_HAVE_CUDA). Without it every CUDA request fails
 * with a message saying so. */
#ifndef K3RT_BACKEND_H
#define K3RT_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <k3rt/errors.h>
#include <k3rt/host.h>
#include <k3rt/stream.h>

struct k3rt_stream {
    int device;      /* K3RT_DEVICE_CPU or a CUDA ordinal */
    int role;        /* k3rt_stream_role */
    int threads;     /* CPU threads work on this stream may use */
    void *native;    /* cudaStream_t */
};

struct k3rt_event {
    int device;
    int timed;       /* k3rt_event_create_timed: can be read by k3rt_event_elapsed_ms */
    double host_s;   /* CPU: the host clock at the last record */
    void *native;    /* cudaEvent_t */
};

/* Counts one host wait for k3rt_host_wait_count (stream.c). */
#ifdef __cplusplus
extern "C" {
#endif
void host_wait_note(void);
#ifdef __cplusplus
}
#endif

/* CUDA backend (core/backend/cuda); the no-CUDA build provides versions that fail. */
int cuda_backend_device_count(void);
/* The device's marketing name ("NVIDIA H200"), for the progress line and the peak table. */
int cuda_device_name(int device, char *buf, size_t len, k3rt_error *err);
int cuda_stream_create(int device, void **native, k3rt_error *err);
void cuda_stream_destroy(void *native);
int cuda_stream_sync(void *native, k3rt_error *err);
/* timed = 0: cudaEventDisableTiming (cheaper to record and wait on). */
int cuda_event_create(int device, int timed, void **native, k3rt_error *err);
void cuda_event_destroy(void *native);
int cuda_event_record(void *event, void *stream, k3rt_error *err);
int cuda_stream_wait(void *stream, void *event, k3rt_error *err);
/* Milliseconds between two completed timed events (cudaEventElapsedTime). */
int cuda_event_elapsed_ms(void *start, void *end, float *ms, k3rt_error *err);
/* Device memory through the caching allocator (core/backend/cuda/alloc.cu). */
void *cuda_alloc(int device, size_t bytes, k3rt_error *err);
void cuda_free(int device, void *ptr);
/* Gives the device's cached free blocks back to the driver (synchronises the device). */
int cuda_cache_release(int device, k3rt_error *err);
/* Bytes handed out and bytes held on free lists (both rounded to size classes). */
void cuda_cache_stats(int device, size_t *in_use, size_t *cached);
/* The most bytes in use since the last reset; reset starts the next window at what is in use. */
size_t cuda_cache_peak(int device, int reset);
void *cuda_alloc_pinned(size_t bytes, k3rt_error *err);
void cuda_free_pinned(void *ptr);
/* Copies in any direction; kind is derived from the two devices. */
int cuda_memcpy(void *stream, void *dst, int dst_device, const void *src, int src_device,
                size_t bytes, k3rt_error *err);
int cuda_memset(void *stream, void *dst, int value, size_t bytes, k3rt_error *err);

/* The CPU thread budget and the host stream are k3rt/host.h's k3rt_cpu_threads,
 * k3rt_set_cpu_threads and k3rt_host_stream. */

#endif
