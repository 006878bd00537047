/* The shared pieces of the CUDA benchmark drivers (cuda_bench.h). */
#include "cuda_bench.h"

#include <stdio.h>
#include <stdlib.h>

const char *bench_program = "bench";

void bench_die(const char *what, const char *msg)
{
    fprintf(stderr, "%s: %s: %s\n", bench_program, what, msg);
    exit(1);
}

void bench_cuda_check(cudaError_t e, const char *what)
{
    if (e != cudaSuccess)
        bench_die(what, cudaGetErrorString(e));
}

void *bench_dev(size_t bytes)
{
    k3rt_error err = {0};
    void *p = k3rt_alloc(0, bytes, &err);
    if (!p)
        bench_die("k3rt_alloc", err.msg);
    return p;
}

static int cmp_float(const void *a, const void *b)
{
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

double bench_median_ms(bench_fn f, void *ctx, cudaStream_t stream, int warm, int runs,
                       const char *name)
{
    k3rt_error err = {0};
    for (int i = 0; i < warm; i++)
        if (f(ctx, &err))
            bench_die(name, err.msg);
    cudaEvent_t *ev = malloc(sizeof *ev * 2 * (size_t)runs);
    for (int i = 0; i < 2 * runs; i++)
        bench_cuda_check(cudaEventCreate(&ev[i]), "cudaEventCreate");
    for (int i = 0; i < runs; i++) {
        bench_cuda_check(cudaEventRecord(ev[2 * i], stream), "cudaEventRecord");
        if (f(ctx, &err))
            bench_die(name, err.msg);
        bench_cuda_check(cudaEventRecord(ev[2 * i + 1], stream), "cudaEventRecord");
    }
    bench_cuda_check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
    bench_cuda_check(cudaGetLastError(), name);
    float *t = malloc(sizeof *t * (size_t)runs);
    for (int i = 0; i < runs; i++)
        bench_cuda_check(cudaEventElapsedTime(&t[i], ev[2 * i], ev[2 * i + 1]),
                         "cudaEventElapsedTime");
    qsort(t, (size_t)runs, sizeof *t, cmp_float);
    double med = runs % 2 ? t[runs / 2] : 0.5 * (t[runs / 2 - 1] + t[runs / 2]);
    for (int i = 0; i < 2 * runs; i++)
        cudaEventDestroy(ev[i]);
    free(ev);
    free(t);
    return med;
}
