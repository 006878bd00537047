/* CPU thread budget (the default, and each stream's) and the parallel-for used by ops and
 * plugins. */
#include <k3rt/host.h>
#include <k3rt/ops.h>
#include "backend/backend.h"

#include <omp.h>
#include <stdlib.h>

static int g_default_threads = 0;

int k3rt_cpu_threads(void)
{
    if (g_default_threads <= 0) {
        const char *env = getenv("K3RT_THREADS");
        int n = env ? atoi(env) : 0;
        g_default_threads = n > 0 ? n : omp_get_num_procs();
        if (g_default_threads < 1)
            g_default_threads = 1;
    }
    return g_default_threads;
}

void k3rt_set_cpu_threads(int threads) { g_default_threads = threads > 0 ? threads : 1; }

int k3rt_stream_threads(const k3rt_stream *s) { return s && s->threads > 0 ? s->threads : 1; }

void k3rt_stream_set_threads(k3rt_stream *s, int threads)
{
    if (s)
        s->threads = threads > 0 ? threads : 1;
}

k3rt_stream *k3rt_host_stream(void)
{
    static k3rt_stream host = {K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, 1, NULL};
    return &host;
}

void k3rt_parallel_for(k3rt_stream *s, int64_t n, int64_t grain, k3rt_range_fn fn, void *ctx)
{
    if (n <= 0)
        return;
    int threads = k3rt_stream_threads(s);
    if (grain < 1)
        grain = 1;
    int64_t max_chunks = (n + grain - 1) / grain;
    if (threads > max_chunks)
        threads = (int)max_chunks;
    if (threads <= 1 || omp_in_parallel()) {
        fn(ctx, 0, n);
        return;
    }
#pragma omp parallel num_threads(threads)
    {
        int t = omp_get_thread_num(), nt = omp_get_num_threads();
        int64_t begin = n * t / nt, end = n * (t + 1) / nt;
        if (begin < end)
            fn(ctx, begin, end);
    }
}
