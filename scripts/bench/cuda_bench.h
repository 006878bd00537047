/* What the CUDA benchmark drivers share: fatal errors, device buffers and the timing loop
 * (CUDA events around each run after warm-up; the median in milliseconds). */
#ifndef K3RT_BENCH_CUDA_BENCH_H
#define K3RT_BENCH_CUDA_BENCH_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include <k3rt/host.h>
#include <k3rt/k3rt.h>

/* The program name that prefixes fatal messages. */
extern const char *bench_program;

void bench_die(const char *what, const char *msg);
void bench_cuda_check(cudaError_t e, const char *what);
/* bytes of device memory on device 0 from k3rt's allocator (exits on failure). */
void *bench_dev(size_t bytes);

typedef int (*bench_fn)(void *ctx, k3rt_error *err);
/* Median milliseconds of `runs` calls of f on `stream` after `warm` untimed ones. */
double bench_median_ms(bench_fn f, void *ctx, cudaStream_t stream, int warm, int runs,
                       const char *name);

#endif
