/* k3rt/host.h — the runtime's host side: what k3rt's engine, the k3rt command and a program
 * embedding the runtime call to set up streams, devices and communicators, convert host
 * buffers and log. Plugins do not need it for their calls (k3rt/k3rt.h does not include it):
 * the host hands them streams, memory and communicators. A plugin that overlaps its own work
 * on a second stream creates that stream and its events here (latent_moe's shared experts),
 * recording on the call's stream at entry and making it wait before it returns.
 *
 * libk3rt exports the functions of this header and of the plugin SDK (k3rt/k3rt.h), and
 * nothing else. */
#ifndef K3RT_HOST_H
#define K3RT_HOST_H

#include <stddef.h>
#include <stdint.h>
#include "errors.h"
#include "tensor.h"
#include "stream.h"
#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Streams and events ---------------------------------------------------------------------- */

typedef enum k3rt_stream_role {
    K3RT_STREAM_COMPUTE = 0,
    K3RT_STREAM_COPY = 1,
    K3RT_STREAM_COMM = 2
} k3rt_stream_role;

typedef struct k3rt_event k3rt_event;

K3RT_API int k3rt_stream_create(int device, int role, k3rt_stream **out, k3rt_error *err);
K3RT_API void k3rt_stream_destroy(k3rt_stream *s);
K3RT_API void k3rt_stream_set_threads(k3rt_stream *s, int threads);
/* A process-wide single-threaded CPU stream for small host-side work (fills, conversions). */
K3RT_API k3rt_stream *k3rt_host_stream(void);
/* Threads a new CPU stream gets: every core unless k3rt_set_cpu_threads said otherwise. */
K3RT_API int k3rt_cpu_threads(void);
K3RT_API void k3rt_set_cpu_threads(int threads);

K3RT_API int k3rt_event_create(int device, k3rt_event **out, k3rt_error *err);
K3RT_API void k3rt_event_destroy(k3rt_event *e);
K3RT_API int k3rt_event_record(k3rt_event *e, k3rt_stream *s, k3rt_error *err);
K3RT_API int k3rt_stream_wait(k3rt_stream *s, k3rt_event *e, k3rt_error *err);
/* An event that can time (k3rt train --profile): k3rt_event_elapsed_ms gives the milliseconds
 * from start to end, two events recorded on one stream, once both are complete (after a
 * k3rt_stream_sync). On the CPU, whose streams run inline, a record reads the host clock.
 * Timing costs a little on a GPU, so k3rt_event_create's events do not time. */
K3RT_API int k3rt_event_create_timed(int device, k3rt_event **out, k3rt_error *err);
K3RT_API int k3rt_event_elapsed_ms(const k3rt_event *start, const k3rt_event *end, double *ms,
                                   k3rt_error *err);

/* An index a CUDA kernel found out of range since the last call (a token outside the
 * vocabulary): kernels record it instead of trapping, and the host asks after a
 * synchronisation it makes anyway. K3RT_OK when none. */
K3RT_API int k3rt_stream_index_error(k3rt_stream *s, k3rt_error *err);

/* How many times this process has waited on a stream so far (every k3rt_stream_sync, every
 * k3rt_memcpy from a CUDA device into host memory, the backend's own synchronisations): what
 * `k3rt train --profile` shows per step. On the CPU the synchronisations wait nowhere but
 * still count (the places a GPU run waits, less its copies to the host). Direct CUDA calls of
 * plugins are not seen. */
K3RT_API int64_t k3rt_host_wait_count(void);

/* ---- Devices ---------------------------------------------------------------------------------- */

/* Number of CUDA devices usable by this build (0 without CUDA or without a GPU). */
K3RT_API int k3rt_cuda_device_count(void);
/* The device's name ("NVIDIA H200"; "cpu" for the CPU), for messages and the peak table. */
K3RT_API int k3rt_device_name(int device, char *buf, size_t len, k3rt_error *err);

typedef struct k3rt_device_memory {
    size_t in_use;   /* bytes handed out by the caching allocator (size classes) */
    size_t cached;   /* bytes held on its free lists */
} k3rt_device_memory;
K3RT_API void k3rt_device_memory_stats(int device, k3rt_device_memory *out);
/* The most bytes in use at once through k3rt_alloc on the device since the last reset (the
 * CPU: host memory, every thread of the process; CUDA: the caching allocator's size classes,
 * without its free lists or the CUDA context). reset starts the next window at what is in
 * use now. */
K3RT_API size_t k3rt_device_memory_peak(int device, int reset);
/* Gives the device's cached free blocks back to the driver (synchronises the device). */
K3RT_API int k3rt_device_cache_release(int device, k3rt_error *err);

/* Page-locked host memory, for asynchronous copies to and from CUDA devices. Fails in a build
 * without CUDA or on a machine without a usable driver. */
K3RT_API void *k3rt_alloc_pinned(size_t bytes, k3rt_error *err);
K3RT_API void k3rt_free_pinned(void *ptr);

/* Converts n elements between host buffers of any float dtypes. */
K3RT_API int k3rt_convert(void *dst, int dst_dtype, const void *src, int src_dtype, int64_t n,
                          k3rt_error *err);

/* ---- Communicators ----------------------------------------------------------------------------- */

typedef enum k3rt_group {
    K3RT_GROUP_WORLD = 0,
    K3RT_GROUP_DP = 1,
    K3RT_GROUP_EP = 2,
    K3RT_GROUP_CP = 3
} k3rt_group;

/* The sub-communicator of a plan axis; the world itself for K3RT_GROUP_WORLD. Owned by c. */
K3RT_API k3rt_comm *k3rt_comm_group(k3rt_comm *c, int group);
/* recv holds count elements; send holds count * size. */
K3RT_API int k3rt_reduce_scatter(k3rt_comm *c, k3rt_stream *s, const void *send, void *recv,
                                 int64_t count, int dtype, int op, k3rt_error *err);
/* Counts and displacements per peer, in elements. */
K3RT_API int k3rt_all_to_all_v(k3rt_comm *c, k3rt_stream *s, const void *send,
                               const int64_t *send_counts, const int64_t *send_displs, void *recv,
                               const int64_t *recv_counts, const int64_t *recv_displs, int dtype,
                               k3rt_error *err);
K3RT_API int k3rt_send(k3rt_comm *c, k3rt_stream *s, const void *buf, int64_t count, int dtype,
                       int peer, k3rt_error *err);
K3RT_API int k3rt_recv(k3rt_comm *c, k3rt_stream *s, void *buf, int64_t count, int dtype,
                       int peer, k3rt_error *err);
K3RT_API int k3rt_broadcast(k3rt_comm *c, k3rt_stream *s, void *buf, int64_t count, int dtype,
                            int root, k3rt_error *err);
K3RT_API int k3rt_barrier(k3rt_comm *c, k3rt_stream *s, k3rt_error *err);

/* ---- Console ------------------------------------------------------------------------------------ */

enum { K3RT_LOG_QUIET = 0, K3RT_LOG_INFO = 1, K3RT_LOG_DEBUG = 2 };

K3RT_API void k3rt_log_set_level(int level);
K3RT_API int k3rt_log_level(void);
/* A line to stdout (info, from level INFO) or stderr (warning: always; debug: from DEBUG). */
K3RT_API void k3rt_log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
K3RT_API void k3rt_log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
K3RT_API void k3rt_log_debug(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Seconds since an arbitrary epoch, monotonic. */
K3RT_API double k3rt_time_now(void);

#ifdef __cplusplus
}
#endif
#endif
