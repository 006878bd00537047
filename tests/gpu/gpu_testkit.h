/* Pieces of the routed-MoE GPU suites (test_latent_moe_cuda.c, test_balancers_cuda.c): device
 * buffers filled from and read back into host doubles, values exact in a dtype, the relative
 * rms comparison, and failures collected so that one run reports every case. */
#ifndef K3RT_TEST_GPU_TESTKIT_H
#define K3RT_TEST_GPU_TESTKIT_H

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"

static int GK_DEV = 0;        /* the CUDA device under test (K3RT_DEVICE_CPU: harness mode) */
static k3rt_stream *GK_G;     /* CUDA stream on GK_DEV (tu_run_gpu_suite) */
static int gk_failed;

/* Runs the suite on the GPU (77 without one). K3RT_GK_HOST=1 instead runs the "device" side on
 * the CPU: the comparisons then hold trivially; what it checks is the harness itself (calls,
 * shapes, the rig's validation) on a machine without a GPU. The f32 cases only. */
static inline int gk_main(Suite *(*make)(void))
{
    const char *host = getenv("K3RT_GK_HOST");
    if (!(host && *host == '1'))
        return tu_run_gpu_suite(make, &GK_G);
    GK_DEV = K3RT_DEVICE_CPU;
    GK_G = tu_cpu_stream(2);
    int rc = tu_run_suite(make());
    k3rt_stream_destroy(GK_G);
    return rc;
}

static void gk_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void gk_fail(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    printf("FAILED: ");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    gk_failed++;
}

static inline size_t gk_bytes(int dtype, int64_t n)
{
    return (size_t)(n > 0 ? n : 1) * k3rt_dtype_size(dtype);
}

static inline void *gk_alloc(size_t bytes)
{
    k3rt_error err = {0};
    void *p = k3rt_alloc(GK_DEV, bytes ? bytes : 1, &err);
    ck_assert_msg(p != NULL, "k3rt_alloc(%zu bytes): %s", bytes, err.msg);
    return p;
}

static inline void gk_poison(void *p, size_t bytes)
{
    k3rt_error err = {0};
    TU_OK(k3rt_memset(GK_G, p, GK_DEV, 0xff, bytes, &err), err);
}

/* Raw bytes to and from the device (waits). */
static inline void gk_put_raw(void *dev, const void *host, size_t bytes)
{
    k3rt_error err = {0};
    TU_OK(k3rt_memcpy(GK_G, dev, GK_DEV, host, K3RT_DEVICE_CPU, bytes, &err), err);
    TU_OK(k3rt_stream_sync(GK_G, &err), err);
}

static inline void *gk_get_raw(const void *dev, size_t bytes)
{
    k3rt_error err = {0};
    void *h = malloc(bytes ? bytes : 1);
    TU_OK(k3rt_memcpy(GK_G, h, K3RT_DEVICE_CPU, dev, GK_DEV, bytes, &err), err);
    TU_OK(k3rt_stream_sync(GK_G, &err), err);
    return h;
}

static inline void *gk_dev_copy(const void *host, size_t bytes)
{
    void *d = gk_alloc(bytes);
    gk_put_raw(d, host, bytes);
    return d;
}

/* n doubles into a device buffer of dtype, and back. */
static inline void gk_put(void *dev, int dtype, const double *x, int64_t n)
{
    k3rt_error err = {0};
    void *h = malloc(gk_bytes(dtype, n));
    TU_OK(k3rt_convert(h, dtype, x, K3RT_F64, n, &err), err);
    gk_put_raw(dev, h, (size_t)n * k3rt_dtype_size(dtype));
    free(h);
}

static inline void *gk_from(int dtype, const double *x, int64_t n)
{
    void *d = gk_alloc(gk_bytes(dtype, n));
    gk_put(d, dtype, x, n);
    return d;
}

static inline double *gk_get(const void *dev, int dtype, int64_t n)
{
    k3rt_error err = {0};
    void *h = gk_get_raw(dev, (size_t)n * k3rt_dtype_size(dtype));
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    TU_OK(k3rt_convert(x, K3RT_F64, h, dtype, n, &err), err);
    free(h);
    return x;
}

/* N(0, scale^2) values rounded to dtype (the values a buffer of that dtype holds exactly). */
static inline double *gk_randn(int64_t n, double scale, int dtype, uint64_t seed)
{
    k3rt_error err = {0};
    double *x = malloc((size_t)(n > 0 ? n : 1) * sizeof(double));
    void *tmp = malloc(gk_bytes(dtype, n));
    tu_randn(x, n, scale, seed);
    TU_OK(k3rt_convert(tmp, dtype, x, K3RT_F64, n, &err), err);
    TU_OK(k3rt_convert(x, K3RT_F64, tmp, dtype, n, &err), err);
    free(tmp);
    return x;
}

/* got against ref: finite where ref is, rms(ref - got) / rms(ref) <= tol; returns the error. */
static inline double gk_close(const char *where, const char *what, const double *ref,
                              const double *got, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(got[i]) && isfinite(ref[i])) {
            gk_fail("%s: %s element %lld of %lld is %g (reference %g): not written by the "
                    "device, or not finite", where, what, (long long)i, (long long)n, got[i],
                    ref[i]);
            return INFINITY;
        }
    double e = tu_rel_rms(ref, got, n);
    printf("  %-64s %-26s rel rms %.2e (tol %.0e)\n", where, what, e, tol);
    if (!(e <= tol))
        gk_fail("%s: %s relative rms error %.3g > %.1g", where, what, e, tol);
    return e;
}

static inline void gk_same_bytes(const char *where, const char *what, const void *a,
                                 const void *b, size_t bytes)
{
    if (memcmp(a, b, bytes))
        gk_fail("%s: %s differs between two runs on the same inputs", where, what);
}

#endif
