/* The MLA plugin's attention core (plugins/attention/mla/mla_cuda.h) timed with CUDA events:
 * causal forward, backward (with its row-dot pass) and forward + backward, bf16 unless asked,
 * at MLA's widths; the backward in both modes (bwd_ms: not deterministic, the default of
 * training; bwd_det_ms: deterministic). Each measurement runs `--warmup` times, then `--runs`
 * times between pairs of events; the median is printed. Inputs are uniform random in [-1, 1)
 * (never zero), queries scaled so the logits have unit spread.
 *
 *   bench_mla_attention [--runs R] [--warmup W] [--dtype bf16|f32] [--shape B,T,H,DQK,DV]...
 *
 * Default shapes: 8,4096,8,192,128  2,16384,8,192,128  8,4096,16,128,128. Each shape runs with
 * k3rt's kernels (max logits on), then, where cuDNN is usable, with cuDNN's fused attention
 * (max logits off) and under the auto choice with the max logits on (k3rt's forward, cuDNN's
 * backward: training with QK-clip) (mla_cuda.h's kernel choice). One line per shape and
 * kernel, key=value pairs, read by scripts/bench/mla_attention.py (which times PyTorch's
 * scaled_dot_product_attention at the same shapes in the same run):
 *   op=mla_attn B=8 T=4096 H=8 dqk=192 dv=128 dtype=bf16 kernel=cudnn path=cudnn bwd_path=cudnn
 *   bwd_det_path=tensor-core fwd_ms=... bwd_ms=... fwdbwd_ms=... bwd_det_ms=...
 *   fwdbwd_det_ms=... fwd_flops=... bwd_flops=...
 * (kernel: the choice asked for, k3rt, cudnn or auto; path: the forward's kernels; bwd_path,
 * bwd_det_path: the two backwards'.)
 * FLOPs, causal (half of the T x T pairs): forward 2 B H T^2 (dqk + dv) / 2; backward 2.5 times
 * the forward (the usual convention: five products against the forward's two, recomputation not
 * counted). */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <k3rt/host.h>
#include <k3rt/k3rt.h>

#include "cuda_bench.h"

#include "mla_cuda.h"

static cudaStream_t CS;
static int RUNS = 20, WARM = 5;

/* n uniform values in [-scale, scale), never 0, as dtype, onto the device. */
static void *random_dev(int dtype, int64_t n, double scale, uint64_t seed)
{
    k3rt_error err = {0};
    size_t es = k3rt_dtype_size(dtype);
    float *f = malloc((size_t)n * sizeof *f);
    void *h = malloc((size_t)n * es), *d = bench_dev((size_t)n * es);
    uint64_t s = seed * 0x9E3779B97F4A7C15ull + 1;
    for (int64_t i = 0; i < n; i++) {
        s ^= s >> 12, s ^= s << 25, s ^= s >> 27;
        double u = (double)((s * 0x2545F4914F6CDD1Dull) >> 11) / 9007199254740992.0;
        double x = scale * (2 * u - 1);
        f[i] = (float)(x != 0 ? x : scale * 0.5);
    }
    if (k3rt_convert(h, dtype, f, K3RT_F32, n, &err))
        bench_die("k3rt_convert", err.msg);
    bench_cuda_check(cudaMemcpy(d, h, (size_t)n * es, cudaMemcpyHostToDevice), "cudaMemcpy");
    free(f);
    free(h);
    return d;
}

static int run_fwd(void *a, k3rt_error *err) { return mla_attn_fwd_cuda(CS, a, err); }
static int run_bwd(void *a, k3rt_error *err) { return mla_attn_bwd_cuda(CS, a, err); }
static int run_both(void *a, k3rt_error *err)
{
    K3RT_TRY(mla_attn_fwd_cuda(CS, a, err));
    return mla_attn_bwd_cuda(CS, a, err);
}

static void bench_shape(int dtype, int64_t B, int64_t T, int64_t H, int64_t dqk, int64_t dv,
                        int kernel)
{
    size_t es = k3rt_dtype_size(dtype);
    int64_t nq = B * T * H * dqk, nv = B * T * H * dv, nr = B * H * T;
    mla_attn a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype, a.B = B, a.T = T, a.H = H, a.dqk = dqk, a.dv = dv;
    a.scale = 1.0 / sqrt((double)dqk), a.kernel = kernel;
    /* q, k uniform in [-s, s) with s = sqrt(3) d^(1/4): scale * q.k has unit variance. */
    double s = 1.7320508 * sqrt(sqrt((double)dqk));
    a.q = random_dev(dtype, nq, s, 1), a.k = random_dev(dtype, nq, s, 2);
    a.v = random_dev(dtype, nv, 1.0, 3), a.dout = random_dev(dtype, nv, 1.0, 4);
    a.o = bench_dev((size_t)nv * es), a.lse = bench_dev((size_t)nr * 4);
    a.block_max = bench_dev((size_t)(B * H * ((T + 31) / 32)) * 4);
    a.dq = bench_dev((size_t)nq * es), a.dk = bench_dev((size_t)nq * es);
    a.dv_out = bench_dev((size_t)nv * es);
    a.drow = bench_dev((size_t)nr * 4), a.dq_acc = bench_dev((size_t)nq * 4);
    /* cuDNN's forward reports no max logits; auto asks for them, as QK-clip training does, so
     * it runs k3rt's forward and cuDNN's backward. */
    float *block_max = a.block_max;
    if (kernel == MLA_KERNEL_CUDNN)
        a.block_max = NULL;
    if (kernel != MLA_KERNEL_K3RT && strcmp(mla_attn_path(&a, 1), "cudnn"))
        goto done; /* cuDNN not usable here: no line */
    bench_cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");

    double fwd = bench_median_ms(run_fwd, &a, CS, WARM, RUNS, "forward");
    a.deterministic = 0;
    const char *bwd_path = mla_attn_path(&a, 1);
    double bwd = bench_median_ms(run_bwd, &a, CS, WARM, RUNS, "backward");
    double both = bench_median_ms(run_both, &a, CS, WARM, RUNS, "forward+backward");
    a.deterministic = 1;
    double bwd_det = bench_median_ms(run_bwd, &a, CS, WARM, RUNS, "backward (deterministic)");
    double both_det =
        bench_median_ms(run_both, &a, CS, WARM, RUNS, "forward+backward (deterministic)");
    double ff = (double)B * H * (double)T * (double)T * (double)(dqk + dv);
    const char *kname = kernel == MLA_KERNEL_CUDNN ? "cudnn"
                        : kernel == MLA_KERNEL_K3RT ? "k3rt" : "auto";
    printf("op=mla_attn B=%lld T=%lld H=%lld dqk=%lld dv=%lld dtype=%s kernel=%s path=%s "
           "bwd_path=%s "
           "bwd_det_path=%s fwd_ms=%.4f bwd_ms=%.4f fwdbwd_ms=%.4f bwd_det_ms=%.4f "
           "fwdbwd_det_ms=%.4f fwd_flops=%.6g bwd_flops=%.6g\n",
           (long long)B, (long long)T, (long long)H, (long long)dqk, (long long)dv,
           k3rt_dtype_name(dtype), kname, mla_attn_path(&a, 0), bwd_path, mla_attn_path(&a, 1), fwd,
           bwd, both, bwd_det, both_det, ff, 2.5 * ff);
    fflush(stdout);
done:;
    void *bufs[] = {(void *)a.q, (void *)a.k, (void *)a.v, (void *)a.dout, a.o, a.lse,
                    block_max, a.dq, a.dk, a.dv_out, a.drow, a.dq_acc};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        k3rt_free(0, bufs[i]);
}

int main(int argc, char **argv)
{
    bench_program = "bench_mla_attention";
    int64_t shapes[16][5], n = 0;
    int dtype = K3RT_BF16;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            RUNS = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            WARM = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--dtype") && i + 1 < argc)
            dtype = k3rt_dtype_from_name(argv[++i]);
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc && n < 16) {
            long long v[5];
            if (sscanf(argv[++i], "%lld,%lld,%lld,%lld,%lld", &v[0], &v[1], &v[2], &v[3],
                       &v[4]) != 5)
                bench_die("--shape", "expected B,T,H,DQK,DV");
            for (int j = 0; j < 5; j++)
                shapes[n][j] = v[j];
            n++;
        } else {
            fprintf(stderr, "usage: %s [--runs R] [--warmup W] [--dtype bf16|f32] "
                    "[--shape B,T,H,DQK,DV]...\n", argv[0]);
            return 2;
        }
    }
    const int kernels[3] = {MLA_KERNEL_K3RT, MLA_KERNEL_CUDNN, MLA_KERNEL_AUTO};
    if (RUNS < 1 || WARM < 0 || (dtype != K3RT_BF16 && dtype != K3RT_F32))
        bench_die("arguments", "runs >= 1, warmup >= 0, dtype bf16 or f32");
    if (n == 0) {
        const int64_t def[3][5] = {{8, 4096, 8, 192, 128}, {2, 16384, 8, 192, 128},
                                   {8, 4096, 16, 128, 128}};
        memcpy(shapes, def, sizeof def);
        n = 3;
    }
    if (k3rt_cuda_device_count() == 0)
        bench_die("device", "no CUDA device");
    k3rt_error err = {0};
    k3rt_stream *s;
    if (k3rt_stream_create(0, K3RT_STREAM_COMPUTE, &s, &err))
        bench_die("k3rt_stream_create", err.msg);
    CS = (cudaStream_t)k3rt_stream_native(s);
    for (int64_t i = 0; i < n; i++)
        for (int k = 0; k < 3; k++)
            bench_shape(dtype, shapes[i][0], shapes[i][1], shapes[i][2], shapes[i][3],
                        shapes[i][4], kernels[k]);
    k3rt_stream_destroy(s);
    return 0;
}
