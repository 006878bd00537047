/* Streams, events, device memory and device facts (k3rt/stream.h, k3rt/host.h), dispatched
 * to the CPU or CUDA backend. */
#include "backend/backend.h"

#include <malloc.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int is_cpu(int device) { return device == K3RT_DEVICE_CPU; }

static _Atomic int64_t host_waits;

void host_wait_note(void) { atomic_fetch_add_explicit(&host_waits, 1, memory_order_relaxed); }

int64_t k3rt_host_wait_count(void)
{
    return atomic_load_explicit(&host_waits, memory_order_relaxed);
}

int k3rt_stream_create(int device, int role, k3rt_stream **out, k3rt_error *err)
{
    k3rt_stream *s = calloc(1, sizeof *s);
    if (!s)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "cannot allocate a stream");
    s->device = device;
    s->role = role;
    s->threads = k3rt_cpu_threads();
    if (!is_cpu(device)) {
        int rc = cuda_stream_create(device, &s->native, err);
        if (rc) {
            free(s);
            return rc;
        }
    }
    *out = s;
    return K3RT_OK;
}

void k3rt_stream_destroy(k3rt_stream *s)
{
    if (!s)
        return;
    if (!is_cpu(s->device))
        cuda_stream_destroy(s->native);
    free(s);
}

int k3rt_stream_device(const k3rt_stream *s) { return s ? s->device : K3RT_DEVICE_CPU; }
void *k3rt_stream_native(const k3rt_stream *s) { return s ? s->native : NULL; }

int k3rt_stream_sync(k3rt_stream *s, k3rt_error *err)
{
    host_wait_note();
    if (!s || is_cpu(s->device))
        return K3RT_OK;
    return cuda_stream_sync(s->native, err);
}

static int event_create(int device, int timed, k3rt_event **out, k3rt_error *err)
{
    k3rt_event *e = calloc(1, sizeof *e);
    if (!e)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "cannot allocate an event");
    e->device = device;
    e->timed = timed;
    if (!is_cpu(device)) {
        int rc = cuda_event_create(device, timed, &e->native, err);
        if (rc) {
            free(e);
            return rc;
        }
    }
    *out = e;
    return K3RT_OK;
}

int k3rt_event_create(int device, k3rt_event **out, k3rt_error *err)
{
    return event_create(device, 0, out, err);
}

int k3rt_event_create_timed(int device, k3rt_event **out, k3rt_error *err)
{
    return event_create(device, 1, out, err);
}

void k3rt_event_destroy(k3rt_event *e)
{
    if (!e)
        return;
    if (!is_cpu(e->device))
        cuda_event_destroy(e->native);
    free(e);
}

/* CPU work runs inline, so a CPU event is complete when recorded (and a timed one reads the
 * clock then). */
int k3rt_event_record(k3rt_event *e, k3rt_stream *s, k3rt_error *err)
{
    if (is_cpu(e->device)) {
        if (e->timed)
            e->host_s = k3rt_time_now();
        return K3RT_OK;
    }
    return cuda_event_record(e->native, s->native, err);
}

int k3rt_stream_wait(k3rt_stream *s, k3rt_event *e, k3rt_error *err)
{
    if (is_cpu(e->device) || is_cpu(s->device))
        return K3RT_OK;
    return cuda_stream_wait(s->native, e->native, err);
}

int k3rt_event_elapsed_ms(const k3rt_event *start, const k3rt_event *end, double *ms,
                          k3rt_error *err)
{
    if (!start->timed || !end->timed)
        return k3rt_fail(err, K3RT_ERR_INVALID, "event elapsed time: both events must come "
                         "from k3rt_event_create_timed");
    if (start->device != end->device)
        return k3rt_fail(err, K3RT_ERR_INVALID, "event elapsed time: the events are on "
                         "devices %d and %d", start->device, end->device);
    if (is_cpu(start->device)) {
        *ms = 1e3 * (end->host_s - start->host_s);
        return K3RT_OK;
    }
    float f;
    K3RT_TRY(cuda_event_elapsed_ms(start->native, end->native, &f, err));
    *ms = f;
    return K3RT_OK;
}

/* Host memory handed out by k3rt_alloc, all threads of the process, for the peak-memory
 * report: counted by the allocator's usable size, which free can read back. */
static _Atomic int64_t g_host_in_use, g_host_peak;

static void host_count(void *p, int sign)
{
    int64_t n = sign * (int64_t)malloc_usable_size(p);
    int64_t now = atomic_fetch_add(&g_host_in_use, n) + n;
    int64_t peak = atomic_load(&g_host_peak);
    while (now > peak && !atomic_compare_exchange_weak(&g_host_peak, &peak, now))
        ;
}

void *k3rt_alloc(int device, size_t bytes, k3rt_error *err)
{
    if (!is_cpu(device))
        return cuda_alloc(device, bytes, err);
    /* 64-byte alignment suits AVX-512 loads and keeps rows of small tensors apart. */
    size_t rounded = (bytes + 63) & ~(size_t)63;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    if (!p)
        k3rt_fail(err, K3RT_ERR_NOMEM, "cannot allocate %zu bytes of host memory", bytes);
    else
        host_count(p, 1);
    return p;
}

void k3rt_free(int device, void *ptr)
{
    if (!ptr)
        return;
    if (!is_cpu(device)) {
        cuda_free(device, ptr);
    } else {
        host_count(ptr, -1);
        free(ptr);
    }
}

size_t k3rt_device_memory_peak(int device, int reset)
{
    if (!is_cpu(device))
        return cuda_cache_peak(device, reset);
    int64_t p = atomic_load(&g_host_peak);
    if (reset)
        atomic_store(&g_host_peak, atomic_load(&g_host_in_use));
    return p > 0 ? (size_t)p : 0;
}

void *k3rt_alloc_pinned(size_t bytes, k3rt_error *err) { return cuda_alloc_pinned(bytes, err); }

void k3rt_free_pinned(void *ptr) { cuda_free_pinned(ptr); }

int k3rt_memcpy(k3rt_stream *s, void *dst, int dst_device, const void *src, int src_device,
                size_t bytes, k3rt_error *err)
{
    if (!bytes)
        return K3RT_OK;
    if (is_cpu(dst_device) && is_cpu(src_device)) {
        memmove(dst, src, bytes);
        return K3RT_OK;
    }
    if (is_cpu(dst_device))  /* from pageable memory the host waits for the stream; counted alike */
        host_wait_note();
    return cuda_memcpy(s ? s->native : NULL, dst, dst_device, src, src_device, bytes, err);
}

int k3rt_memset(k3rt_stream *s, void *dst, int device, int value, size_t bytes, k3rt_error *err)
{
    if (!bytes)
        return K3RT_OK;
    if (is_cpu(device)) {
        memset(dst, value, bytes);
        return K3RT_OK;
    }
    return cuda_memset(s ? s->native : NULL, dst, value, bytes, err);
}

int k3rt_cuda_device_count(void) { return cuda_backend_device_count(); }

int k3rt_device_name(int device, char *buf, size_t len, k3rt_error *err)
{
    if (is_cpu(device)) {
        snprintf(buf, len, "cpu");
        return K3RT_OK;
    }
    return cuda_device_name(device, buf, len, err);
}

void k3rt_device_memory_stats(int device, k3rt_device_memory *out)
{
    memset(out, 0, sizeof *out);
    if (!is_cpu(device))
        cuda_cache_stats(device, &out->in_use, &out->cached);
}

int k3rt_device_cache_release(int device, k3rt_error *err)
{
    return is_cpu(device) ? K3RT_OK : cuda_cache_release(device, err);
}
