/* The CUDA backend of a build without the CUDA toolkit: every request says so. */
#include "backend/backend.h"

static int no_cuda(k3rt_error *err)
{
    return k3rt_fail(err, K3RT_ERR_UNSUPPORTED,
                     "this k3rt was built without CUDA (no CUDA toolkit found at configure "
                     "time); use device = \"cpu\" or rebuild with the toolkit installed");
}

int cuda_backend_device_count(void) { return 0; }
int cuda_device_name(int device, char *buf, size_t len, k3rt_error *err)
{
    (void)device;
    if (len)
        buf[0] = 0;
    return no_cuda(err);
}
int cuda_stream_create(int device, void **native, k3rt_error *err)
{
    (void)device;
    *native = 0;
    return no_cuda(err);
}
void cuda_stream_destroy(void *native) { (void)native; }
int cuda_stream_sync(void *native, k3rt_error *err)
{
    (void)native;
    return no_cuda(err);
}
int cuda_event_create(int device, int timed, void **native, k3rt_error *err)
{
    (void)device;
    (void)timed;
    *native = 0;
    return no_cuda(err);
}
void cuda_event_destroy(void *native) { (void)native; }
int cuda_event_record(void *event, void *stream, k3rt_error *err)
{
    (void)event;
    (void)stream;
    return no_cuda(err);
}
int cuda_stream_wait(void *stream, void *event, k3rt_error *err)
{
    (void)stream;
    (void)event;
    return no_cuda(err);
}
int cuda_event_elapsed_ms(void *start, void *end, float *ms, k3rt_error *err)
{
    (void)start;
    (void)end;
    *ms = 0;
    return no_cuda(err);
}
void *cuda_alloc(int device, size_t bytes, k3rt_error *err)
{
    (void)device;
    (void)bytes;
    no_cuda(err);
    return 0;
}
void cuda_free(int device, void *ptr)
{
    (void)device;
    (void)ptr;
}
int cuda_cache_release(int device, k3rt_error *err)
{
    (void)device;
    return no_cuda(err);
}
void cuda_cache_stats(int device, size_t *in_use, size_t *cached)
{
    (void)device;
    if (in_use)
        *in_use = 0;
    if (cached)
        *cached = 0;
}
size_t cuda_cache_peak(int device, int reset)
{
    (void)device;
    (void)reset;
    return 0;
}
void *cuda_alloc_pinned(size_t bytes, k3rt_error *err)
{
    (void)bytes;
    no_cuda(err);
    return 0;
}
void cuda_free_pinned(void *ptr) { (void)ptr; }
int cuda_memcpy(void *stream, void *dst, int dst_device, const void *src, int src_device,
                size_t bytes, k3rt_error *err)
{
    (void)stream, (void)dst, (void)dst_device, (void)src, (void)src_device, (void)bytes;
    return no_cuda(err);
}
int cuda_memset(void *stream, void *dst, int value, size_t bytes, k3rt_error *err)
{
    (void)stream, (void)dst, (void)value, (void)bytes;
    return no_cuda(err);
}
