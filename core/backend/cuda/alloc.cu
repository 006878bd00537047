// Device memory: a caching allocator over cudaMalloc, and page-locked host buffers.
//
// Blocks are rounded to a size class and, once freed, kept on that class's free list for the
// next request of the same class: training allocates the same sizes every step, and cudaMalloc
// and cudaFree synchronise the device. Memory is never managed (unified) memory.
//
// A freed block is handed out again at once, with no stream bookkeeping: free memory only
// when the work that uses it is ordered before its next user (the same stream, or after a
// synchronisation or an event), as with any stream-ordered buffer reuse.
#include <cuda_runtime.h>

#include <map>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

extern "C" {
#include "backend/backend.h"
#include "util/log.h"
}

namespace {

constexpr int kMaxDevices = 64;

struct device_cache {
    std::mutex mu;
    std::unordered_map<void *, size_t> live;       // block -> its size class
    std::map<size_t, std::vector<void *>> free_;   // size class -> cached blocks
    size_t in_use = 0, cached = 0;
    size_t peak = 0;                               // most in_use since the last reset
    void take(size_t cls)
    {
        in_use += cls;
        if (in_use > peak)
            peak = in_use;
    }
};

device_cache g_cache[kMaxDevices];

// 512-byte steps below 1 MiB, then four classes per power of two (at most 25% slack).
size_t size_class(size_t bytes)
{
    if (bytes < ((size_t)1 << 20)) {
        size_t r = (bytes + 511) & ~(size_t)511;
        return r ? r : 512;
    }
    int top = 63 - __builtin_clzll((unsigned long long)bytes);
    size_t step = (size_t)1 << (top - 2);
    return (bytes + step - 1) & ~(step - 1);
}

int cuda_fail(k3rt_error *err, cudaError_t e, const char *what)
{
    return k3rt_fail(err, K3RT_ERR_DEVICE, "CUDA %s failed: %s (%s)", what, cudaGetErrorName(e),
                     cudaGetErrorString(e));
}

int check_device(int device, k3rt_error *err)
{
    if (device < 0 || device >= kMaxDevices)
        return k3rt_fail(err, K3RT_ERR_INVALID, "CUDA device %d is outside [0, %d)", device,
                         kMaxDevices);
    return K3RT_OK;
}

// Frees every cached block of the device; the caller holds c.mu.
int release_locked(device_cache &c, int device, k3rt_error *err)
{
    cudaError_t e = cudaSetDevice(device);
    if (e != cudaSuccess)
        return cuda_fail(err, e, "cudaSetDevice");
    cudaError_t first = cudaSuccess;
    for (auto &kv : c.free_)
        for (void *p : kv.second) {
            cudaError_t f = cudaFree(p);
            if (f != cudaSuccess && first == cudaSuccess)
                first = f;
        }
    c.free_.clear();
    c.cached = 0;
    if (first != cudaSuccess)
        return cuda_fail(err, first, "cudaFree (releasing the allocator cache)");
    return K3RT_OK;
}

}  // namespace

extern "C" void *cuda_alloc(int device, size_t bytes, k3rt_error *err)
{
    if (check_device(device, err))
        return nullptr;
    device_cache &c = g_cache[device];
    size_t cls = size_class(bytes);
    std::lock_guard<std::mutex> lock(c.mu);
    try {
        auto it = c.free_.find(cls);
        if (it != c.free_.end() && !it->second.empty()) {
            void *p = it->second.back();
            it->second.pop_back();
            c.live[p] = cls;
            c.cached -= cls;
            c.take(cls);
            return p;
        }
        int prev = -1;
        cudaError_t e = cudaGetDevice(&prev);
        if (e == cudaSuccess && prev != device)
            e = cudaSetDevice(device);
        if (e != cudaSuccess) {
            cuda_fail(err, e, "cudaSetDevice");
            return nullptr;
        }
        void *p = nullptr;
        e = cudaMalloc(&p, cls);
        if (e == cudaErrorMemoryAllocation && c.cached > 0) {
            cudaGetLastError();  // the failure is not sticky; clear it and retry uncached
            if (release_locked(c, device, err))
                return nullptr;
            e = cudaMalloc(&p, cls);
        }
        if (prev != device)
            cudaSetDevice(prev);  // leave the caller's current device as it was
        if (e != cudaSuccess) {
            cudaGetLastError();
            k3rt_fail(err, e == cudaErrorMemoryAllocation ? K3RT_ERR_NOMEM : K3RT_ERR_DEVICE,
                      "CUDA cudaMalloc of %zu bytes on device %d failed: %s (%s); %zu bytes "
                      "in use through k3rt", cls, device, cudaGetErrorName(e),
                      cudaGetErrorString(e), c.in_use);
            return nullptr;
        }
        c.live[p] = cls;
        c.take(cls);
        return p;
    } catch (const std::bad_alloc &) {
        k3rt_fail(err, K3RT_ERR_NOMEM, "out of host memory in the CUDA allocator's tables");
        return nullptr;
    }
}

extern "C" void cuda_free(int device, void *ptr)
{
    if (!ptr || check_device(device, nullptr))
        return;
    device_cache &c = g_cache[device];
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.live.find(ptr);
    if (it == c.live.end()) {
        log_warn("k3rt_free: %p is not a live allocation of CUDA device %d (freed twice, or "
                 "given the wrong device); ignored", ptr, device);
        return;
    }
    size_t cls = it->second;
    c.live.erase(it);
    c.in_use -= cls;
    try {
        c.free_[cls].push_back(ptr);
        c.cached += cls;
    } catch (const std::bad_alloc &) {
        cudaSetDevice(device);
        cudaFree(ptr);  // cannot remember it: give it back to the driver instead
    }
}

extern "C" int cuda_cache_release(int device, k3rt_error *err)
{
    K3RT_TRY(check_device(device, err));
    device_cache &c = g_cache[device];
    std::lock_guard<std::mutex> lock(c.mu);
    return release_locked(c, device, err);
}

extern "C" void cuda_cache_stats(int device, size_t *in_use, size_t *cached)
{
    size_t u = 0, k = 0;
    if (!check_device(device, nullptr)) {
        device_cache &c = g_cache[device];
        std::lock_guard<std::mutex> lock(c.mu);
        u = c.in_use;
        k = c.cached;
    }
    if (in_use)
        *in_use = u;
    if (cached)
        *cached = k;
}

extern "C" size_t cuda_cache_peak(int device, int reset)
{
    if (check_device(device, nullptr))
        return 0;
    device_cache &c = g_cache[device];
    std::lock_guard<std::mutex> lock(c.mu);
    size_t p = c.peak;
    if (reset)
        c.peak = c.in_use;
    return p;
}

extern "C" void *cuda_alloc_pinned(size_t bytes, k3rt_error *err)
{
    void *p = nullptr;
    cudaError_t e = cudaHostAlloc(&p, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        k3rt_fail(err, e == cudaErrorMemoryAllocation ? K3RT_ERR_NOMEM : K3RT_ERR_DEVICE,
                  "CUDA cudaHostAlloc of %zu pinned bytes failed: %s (%s)", bytes,
                  cudaGetErrorName(e), cudaGetErrorString(e));
        return nullptr;
    }
    return p;
}

extern "C" void cuda_free_pinned(void *ptr)
{
    if (ptr && cudaFreeHost(ptr) != cudaSuccess) {
        cudaGetLastError();
        log_warn("k3rt_free_pinned: %p is not pinned memory from k3rt_alloc_pinned; ignored",
                 ptr);
    }
}
