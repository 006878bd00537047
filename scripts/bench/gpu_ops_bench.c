/* k3rt's CUDA ops timed with CUDA events: the GEMM shapes of K3-mini (d = 1024, B*T = 8*4096
 * tokens), RMSNorm and cross-entropy forward and backward, and a few elementwise ops. Each op
 * runs `--warmup` times, then `--runs` times between a pair of events; the median is printed.
 * Inputs are random normal values (never zeros), bf16 unless stated.
 *
 *   bench_gpu_ops [--runs R] [--warmup W] [--tokens N] [--only SUBSTRING]
 *
 * One line per measurement, key=value pairs, read by scripts/bench/gpu_ops.py (which times the
 * same ops in PyTorch in the same run and prints the ratios):
 *   op=linear_fwd n=32768 in=1024 out=1024 dtype=bf16 ms=0.123 flops=... bytes=...
 * Shapes (rows x in -> out), N = 32768 tokens:
 *   1024->1024 KDA q/k/v/g/o, MLA q/gate/o, shared expert;  1024->128 / 128->1024 KDA forget
 *   gate (rank 128);  1024->320 MLA kv down (rank 256 + 64 shared key);  256->1024 MLA k/v up;
 *   1024->512 / 512->1024 LatentMoE down / up;  1024->4096 / 4096->1024 dense SiTU-GLU FFN;
 *   1024->32000 LM head;  grouped: K3-mini's experts (64, top-8 of N rows, 512->1536 and
 *   768->512) and K3's (128, 65,536 rows, 3584->6144 and 3072->3584), uniform and Zipf(1.2). */
#define _POSIX_C_SOURCE 200809L
#include <cuda_runtime_api.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <k3rt/host.h>
#include <k3rt/k3rt.h>

#include "cuda_bench.h"

static k3rt_stream *S;
static cudaStream_t CS;
static int RUNS = 30, WARM = 5;
static int64_t N = 8 * 4096;
static const char *ONLY;

/* Random N(0, scale^2) values of dtype: one generated chunk, copied over the buffer. */
static void fill_random(void *d, int dtype, int64_t n, double scale, uint64_t seed)
{
    enum { CHUNK = 1 << 20 };
    k3rt_error err = {0};
    int64_t c = n < CHUNK ? n : CHUNK;
    double *v = malloc((size_t)c * sizeof *v);
    size_t es = k3rt_dtype_size(dtype);
    void *h = malloc((size_t)c * es);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 7);
    for (int64_t i = 0; i < c; i++) {
        double x = scale * k3rt_rng_normal(&rng);
        v[i] = x != 0.0 ? x : scale * 0.5;
    }
    if (k3rt_convert(h, dtype, v, K3RT_F64, c, &err))
        bench_die("k3rt_convert", err.msg);
    bench_cuda_check(cudaMemcpy(d, h, (size_t)c * es, cudaMemcpyHostToDevice), "cudaMemcpy");
    for (int64_t off = c; off < n; off += c) {
        int64_t len = n - off < c ? n - off : c;
        bench_cuda_check(cudaMemcpy((char *)d + off * es, d, (size_t)len * es, cudaMemcpyDeviceToDevice),
                   "cudaMemcpy");
    }
    /* Device-to-device copies return early, and the bench stream does not wait for them. */
    bench_cuda_check(cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    free(v);
    free(h);
}

static int32_t *random_ids(int64_t n, int64_t limit, uint64_t seed)
{
    int32_t *h = malloc((size_t)n * 4), *d = bench_dev((size_t)n * 4);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 3);
    for (int64_t i = 0; i < n; i++)
        h[i] = (int32_t)(k3rt_rng_u64(&rng) % (uint64_t)limit);
    bench_cuda_check(cudaMemcpy(d, h, (size_t)n * 4, cudaMemcpyHostToDevice), "cudaMemcpy");
    free(h);
    return d;
}

/* ---- timing ---------------------------------------------------------------------------------- */

static int wanted(const char *op) { return !ONLY || strstr(op, ONLY) != NULL; }

static void report(const char *op, const char *shape, double ms, double flops, double bytes)
{
    printf("op=%s %s ms=%.5f flops=%.6g bytes=%.6g\n", op, shape, ms, flops, bytes);
    fflush(stdout);
}

/* ---- linear layers --------------------------------------------------------------------------- */

typedef struct {
    int dtype;
    int64_t n, in, out;
    void *x, *w, *y, *dy, *dx, *dw;
} lin_ctx;

static int lin_fwd(void *c, k3rt_error *err)
{
    lin_ctx *l = c;
    return k3rt_linear_fwd(S, l->dtype, l->x, l->w, NULL, l->y, l->n, l->in, l->out, err);
}
static int lin_dx(void *c, k3rt_error *err)
{
    lin_ctx *l = c;
    return k3rt_linear_bwd(S, l->dtype, l->x, l->w, l->dy, l->dx, NULL, NULL, l->n, l->in,
                           l->out, 0, err);
}
static int lin_dw(void *c, k3rt_error *err)
{
    lin_ctx *l = c;
    return k3rt_linear_bwd(S, l->dtype, l->x, l->w, l->dy, NULL, l->dw, NULL, l->n, l->in,
                           l->out, 0, err);
}

static void bench_linear(int dtype, int64_t n, int64_t in, int64_t out)
{
    if (!wanted("linear"))
        return;
    size_t es = k3rt_dtype_size(dtype);
    lin_ctx l = {dtype, n, in, out, bench_dev(n * in * es), bench_dev(out * in * es), bench_dev(n * out * es),
                 bench_dev(n * out * es), bench_dev(n * in * es), bench_dev(out * in * 4)};
    fill_random(l.x, dtype, n * in, 1.0, 1);
    fill_random(l.w, dtype, out * in, 0.03, 2);
    fill_random(l.dy, dtype, n * out, 1.0, 3);
    fill_random(l.dw, K3RT_F32, out * in, 1e-3, 4);
    char shape[160];
    snprintf(shape, sizeof shape, "n=%lld in=%lld out=%lld dtype=%s", (long long)n, (long long)in,
             (long long)out, k3rt_dtype_name(dtype));
    double f = 2.0 * n * in * out;
    double b_fwd = (double)(n * in + in * out + n * out) * es;
    report("linear_fwd", shape, bench_median_ms(lin_fwd, &l, CS, WARM, RUNS, "linear_fwd"), f, b_fwd);
    report("linear_dx", shape, bench_median_ms(lin_dx, &l, CS, WARM, RUNS, "linear_bwd dx"), f, b_fwd);
    report("linear_dw", shape, bench_median_ms(lin_dw, &l, CS, WARM, RUNS, "linear_bwd dW"), f,
           (double)(n * in + n * out) * es + 8.0 * in * out);
    k3rt_free(0, l.x), k3rt_free(0, l.w), k3rt_free(0, l.y), k3rt_free(0, l.dy);
    k3rt_free(0, l.dx), k3rt_free(0, l.dw);
}

typedef struct {
    int64_t groups, rows, in, out;
    int32_t *off;  /* device offsets: the router's form, no host synchronisation */
    void *x, *w, *y, *dy, *dx, *dw;
} grp_ctx;

static int grp_fwd(void *c, k3rt_error *err)
{
    grp_ctx *g = c;
    return k3rt_grouped_linear_fwd_dev(S, K3RT_BF16, g->x, g->w, g->y, g->off, K3RT_I32,
                                       g->groups, g->rows, g->in, g->out, err);
}
static int grp_dx(void *c, k3rt_error *err)
{
    grp_ctx *g = c;
    return k3rt_grouped_linear_bwd_dev(S, K3RT_BF16, g->x, g->w, g->dy, g->dx, NULL, g->off,
                                       K3RT_I32, g->groups, g->rows, g->in, g->out, 0, err);
}
static int grp_dw(void *c, k3rt_error *err)
{
    grp_ctx *g = c;
    return k3rt_grouped_linear_bwd_dev(S, K3RT_BF16, g->x, g->w, g->dy, NULL, g->dw, g->off,
                                       K3RT_I32, g->groups, g->rows, g->in, g->out, 0, err);
}
/* dW = dy^T x (the first backward of a step, into a gradient that is not read). */
static int grp_dw_set(void *c, k3rt_error *err)
{
    grp_ctx *g = c;
    return k3rt_grouped_linear_dw_dev(S, K3RT_BF16, g->x, g->dy, g->dw, g->off, K3RT_I32,
                                      g->groups, g->rows, g->in, g->out, 0, err);
}

/* The weight gradient, accumulating (grouped_dw) and overwriting (grouped_dw_set), with the
 * schedule the library picks and then each forced (K3RT_GG_DW_KERNEL): _co cooperative, _pp
 * pingpong. */
static void bench_grouped_dw(grp_ctx *c, const char *shape, double f)
{
    static const char *force[3][2] = {{NULL, ""}, {"cooperative", "_co"}, {"pingpong", "_pp"}};
    double b_acc = (double)(c->rows * c->in + c->rows * c->out) * 2 + 8.0 * c->groups * c->in * c->out;
    double b_set = b_acc - 4.0 * c->groups * c->in * c->out;
    for (int k = 0; k < 3; k++) {
        char op[64];
        if (force[k][0])
            setenv("K3RT_GG_DW_KERNEL", force[k][0], 1);
        else
            unsetenv("K3RT_GG_DW_KERNEL");
        snprintf(op, sizeof op, "grouped_dw%s", force[k][1]);
        report(op, shape, bench_median_ms(grp_dw, c, CS, WARM, RUNS, "grouped_linear_bwd dW"), f,
               b_acc);
        snprintf(op, sizeof op, "grouped_dw_set%s", force[k][1]);
        report(op, shape, bench_median_ms(grp_dw_set, c, CS, WARM, RUNS, "grouped_linear_dw_dev"),
               f, b_set);
    }
    unsetenv("K3RT_GG_DW_KERNEL");
}

/* Rows per expert: uniform (skew 0) or Zipf(skew), the expert of rank r getting a share
 * proportional to r^-skew (Zipf(1.2) over 64 experts: the largest 18.7x the mean), ranks
 * dealt to the experts in a fixed shuffled order. */
static void expert_counts(int64_t groups, int64_t rows, double skew, int64_t *count)
{
    double *wt = malloc((size_t)groups * sizeof *wt), sum = 0;
    int64_t *rank = malloc((size_t)groups * sizeof *rank);
    for (int64_t g = 0; g < groups; g++)
        rank[g] = g;
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 42, 9);
    for (int64_t g = groups - 1; g > 0; g--) {
        int64_t h = (int64_t)(k3rt_rng_u64(&rng) % (uint64_t)(g + 1)), t = rank[g];
        rank[g] = rank[h], rank[h] = t;
    }
    for (int64_t g = 0; g < groups; g++)
        sum += wt[g] = pow((double)(rank[g] + 1), -skew);
    int64_t given = 0;
    for (int64_t g = 0; g < groups; g++)
        given += count[g] = (int64_t)((double)rows * wt[g] / sum);
    for (int64_t g = 0; given < rows; g = (g + 1) % groups, given++)
        count[g]++;
    free(wt), free(rank);
}

static void bench_grouped(int64_t groups, int64_t rows, int64_t in, int64_t out, double skew)
{
    if (!wanted("grouped"))
        return;
    int64_t *count = malloc((size_t)groups * sizeof *count), most = 0;
    int32_t *off = malloc((size_t)(groups + 1) * sizeof *off);
    expert_counts(groups, rows, skew, count);
    /* The counts travel in the line, so the PyTorch side runs the same groups. */
    size_t cap = (size_t)groups * 12 + 16, at = 0;
    char *list = malloc(cap);
    off[0] = 0;
    for (int64_t g = 0; g < groups; g++) {
        off[g + 1] = off[g] + (int32_t)count[g];
        most = count[g] > most ? count[g] : most;
        at += (size_t)snprintf(list + at, cap - at, "%s%lld", g ? "," : "", (long long)count[g]);
    }
    grp_ctx c = {groups, rows, in, out, bench_dev((size_t)(groups + 1) * 4),
                 bench_dev(rows * in * 2), bench_dev(groups * out * in * 2),
                 bench_dev(rows * out * 2), bench_dev(rows * out * 2), bench_dev(rows * in * 2),
                 bench_dev(groups * out * in * 4)};
    bench_cuda_check(cudaMemcpy(c.off, off, (size_t)(groups + 1) * 4, cudaMemcpyHostToDevice),
                     "cudaMemcpy");
    fill_random(c.x, K3RT_BF16, rows * in, 1.0, 5);
    fill_random(c.w, K3RT_BF16, groups * out * in, 0.03, 6);
    fill_random(c.dy, K3RT_BF16, rows * out, 1.0, 7);
    fill_random(c.dw, K3RT_F32, groups * out * in, 1e-3, 8);
    char *shape = malloc(cap + 200);
    snprintf(shape, cap + 200,
             "groups=%lld rows=%lld in=%lld out=%lld skew=%g max/mean=%.1f dtype=bf16 counts=%s",
             (long long)groups, (long long)rows, (long long)in, (long long)out, skew,
             (double)most * (double)groups / (double)rows, list);
    double f = 2.0 * rows * in * out, b = (double)(rows * in + groups * in * out + rows * out) * 2;
    report("grouped_fwd", shape, bench_median_ms(grp_fwd, &c, CS, WARM, RUNS, "grouped_linear_fwd"), f, b);
    report("grouped_dx", shape, bench_median_ms(grp_dx, &c, CS, WARM, RUNS, "grouped_linear_bwd dx"), f, b);
    bench_grouped_dw(&c, shape, f);
    k3rt_free(0, c.off), k3rt_free(0, c.x), k3rt_free(0, c.w), k3rt_free(0, c.y);
    k3rt_free(0, c.dy), k3rt_free(0, c.dx), k3rt_free(0, c.dw);
    free(count), free(off), free(list), free(shape);
}

typedef struct {
    int64_t m, n, k;
    void *a, *b, *c;
} gemm_ctx;

static int gemm_f32(void *p, k3rt_error *err)
{
    gemm_ctx *g = p;
    return k3rt_gemm(S, K3RT_F32, 0, 0, g->m, g->n, g->k, 1.0, g->a, g->k, g->b, g->n, 0.0, g->c,
                     g->n, err);
}

static void bench_gemm_f32(int64_t m, int64_t n, int64_t k)
{
    if (!wanted("gemm_f32"))
        return;
    gemm_ctx g = {m, n, k, bench_dev(m * k * 4), bench_dev(k * n * 4), bench_dev(m * n * 4)};
    fill_random(g.a, K3RT_F32, m * k, 1.0, 9);
    fill_random(g.b, K3RT_F32, k * n, 1.0, 10);
    char shape[96];
    snprintf(shape, sizeof shape, "m=%lld n=%lld k=%lld dtype=f32", (long long)m, (long long)n,
             (long long)k);
    report("gemm_f32", shape, bench_median_ms(gemm_f32, &g, CS, WARM, RUNS, "gemm f32"), 2.0 * m * n * k,
           4.0 * (m * k + k * n + m * n));
    k3rt_free(0, g.a), k3rt_free(0, g.b), k3rt_free(0, g.c);
}

/* ---- RMSNorm and cross-entropy --------------------------------------------------------------- */

typedef struct {
    int64_t n, d;
    void *x, *g, *y, *rstd, *dy, *dx, *dg;
} norm_ctx;

static int norm_fwd(void *p, k3rt_error *err)
{
    norm_ctx *c = p;
    return k3rt_rmsnorm_fwd(S, K3RT_BF16, c->x, c->g, c->y, c->rstd, c->n, c->d, 1e-6, err);
}
static int norm_bwd(void *p, k3rt_error *err)
{
    norm_ctx *c = p;
    return k3rt_rmsnorm_bwd(S, K3RT_BF16, c->x, c->g, c->rstd, c->dy, c->dx, c->dg, c->n, c->d, 0,
                            err);
}

static void bench_rmsnorm(int64_t n, int64_t d)
{
    if (!wanted("rmsnorm"))
        return;
    norm_ctx c = {n, d, bench_dev(n * d * 2), bench_dev(d * 2), bench_dev(n * d * 2), bench_dev(n * 4), bench_dev(n * d * 2),
                  bench_dev(n * d * 2), bench_dev(d * 4)};
    fill_random(c.x, K3RT_BF16, n * d, 1.0, 11);
    fill_random(c.g, K3RT_BF16, d, 1.0, 12);
    fill_random(c.dy, K3RT_BF16, n * d, 1.0, 13);
    fill_random(c.dg, K3RT_F32, d, 1.0, 14);
    k3rt_error err = {0};
    if (norm_fwd(&c, &err))
        bench_die("rmsnorm_fwd", err.msg);
    char shape[96];
    snprintf(shape, sizeof shape, "n=%lld d=%lld dtype=bf16", (long long)n, (long long)d);
    report("rmsnorm_fwd", shape, bench_median_ms(norm_fwd, &c, CS, WARM, RUNS, "rmsnorm_fwd"), 0,
           4.0 * n * d + 4.0 * n + 2.0 * d);
    report("rmsnorm_bwd", shape, bench_median_ms(norm_bwd, &c, CS, WARM, RUNS, "rmsnorm_bwd"), 0,
           6.0 * n * d + 4.0 * n + 10.0 * d);
    k3rt_free(0, c.x), k3rt_free(0, c.g), k3rt_free(0, c.y), k3rt_free(0, c.rstd);
    k3rt_free(0, c.dy), k3rt_free(0, c.dx), k3rt_free(0, c.dg);
}

typedef struct {
    int64_t n, v;
    void *logits, *loss, *lse, *dlogits;
    int32_t *tgt;
} xent_ctx;

static int xent_fwd(void *p, k3rt_error *err)
{
    xent_ctx *c = p;
    return k3rt_xent_fwd(S, K3RT_BF16, c->logits, c->tgt, c->loss, c->lse, c->n, c->v, err);
}
static int xent_bwd(void *p, k3rt_error *err)
{
    xent_ctx *c = p;
    return k3rt_xent_bwd(S, K3RT_BF16, c->logits, c->tgt, c->lse, 1.0 / (double)c->n, c->dlogits,
                         c->n, c->v, err);
}

static void bench_xent(int64_t n, int64_t v)
{
    if (!wanted("xent"))
        return;
    xent_ctx c = {n, v, bench_dev(n * v * 2), bench_dev(n * 4), bench_dev(n * 4), bench_dev(n * v * 2), NULL};
    c.tgt = random_ids(n, v, 15);
    fill_random(c.logits, K3RT_BF16, n * v, 2.0, 16);
    k3rt_error err = {0};
    if (xent_fwd(&c, &err))
        bench_die("xent_fwd", err.msg);
    char shape[96];
    snprintf(shape, sizeof shape, "n=%lld v=%lld dtype=bf16", (long long)n, (long long)v);
    report("xent_fwd", shape, bench_median_ms(xent_fwd, &c, CS, WARM, RUNS, "xent_fwd"), 0, 2.0 * n * v + 12.0 * n);
    report("xent_bwd", shape, bench_median_ms(xent_bwd, &c, CS, WARM, RUNS, "xent_bwd"), 0, 4.0 * n * v + 8.0 * n);
    k3rt_free(0, c.logits), k3rt_free(0, c.loss), k3rt_free(0, c.lse), k3rt_free(0, c.dlogits);
    k3rt_free(0, c.tgt);
}

/* ---- elementwise and optimizer --------------------------------------------------------------- */

typedef struct {
    int64_t n;
    void *a, *b, *c, *d, *e;
} ew_ctx;

static int swiglu_fwd(void *p, k3rt_error *err)
{
    ew_ctx *c = p;
    return k3rt_glu_fwd(S, K3RT_BF16, K3RT_GLU_SWIGLU, c->a, c->b, c->c, c->n, 0, 0, err);
}
static int swiglu_bwd(void *p, k3rt_error *err)
{
    ew_ctx *c = p;
    return k3rt_glu_bwd(S, K3RT_BF16, K3RT_GLU_SWIGLU, c->a, c->b, c->c, c->d, c->e, c->n, 0, 0,
                        err);
}
/* K3's SiTU-GLU with its default caps (latent_moe's beta1 = 4, beta2 = 25) */
static int situ_fwd(void *p, k3rt_error *err)
{
    ew_ctx *c = p;
    return k3rt_glu_fwd(S, K3RT_BF16, K3RT_GLU_SITU, c->a, c->b, c->c, c->n, 4.0, 25.0, err);
}
static int situ_bwd(void *p, k3rt_error *err)
{
    ew_ctx *c = p;
    return k3rt_glu_bwd(S, K3RT_BF16, K3RT_GLU_SITU, c->a, c->b, c->c, c->d, c->e, c->n, 4.0,
                        25.0, err);
}
static int cast_op(void *p, k3rt_error *err)
{
    ew_ctx *c = p;
    return k3rt_cast(S, c->a, K3RT_F32, c->b, K3RT_BF16, c->n, err);
}
static int sumsq_op(void *p, k3rt_error *err)
{
    ew_ctx *c = p;
    double out;
    return k3rt_sum_squares(S, K3RT_F32, c->a, c->n, &out, err);
}
static int adamw_op(void *p, k3rt_error *err)
{
    ew_ctx *c = p;
    return k3rt_adamw_step(S, K3RT_F32, c->a, c->b, c->c, c->d, c->n, 1e-4, 0.9, 0.95, 1e-8, 0.1,
                           10, err);
}

/* The GLUs over n elements: bf16 gate, up and d(out); the outputs are the other two buffers. */
static void bench_glu(int64_t n, int swiglu, int situ)
{
    char shape[64];
    snprintf(shape, sizeof shape, "n=%lld", (long long)n);
    if (swiglu || situ) {
        ew_ctx c = {n, bench_dev(n * 2), bench_dev(n * 2), bench_dev(n * 2), bench_dev(n * 2), bench_dev(n * 2)};
        fill_random(c.a, K3RT_BF16, n, 2.0, 17);
        fill_random(c.b, K3RT_BF16, n, 1.0, 18);
        fill_random(c.c, K3RT_BF16, n, 1.0, 20);
        if (swiglu) {
            report("swiglu_fwd", shape, bench_median_ms(swiglu_fwd, &c, CS, WARM, RUNS, "glu_fwd"), 0, 6.0 * n);
            report("swiglu_bwd", shape, bench_median_ms(swiglu_bwd, &c, CS, WARM, RUNS, "glu_bwd"), 0, 10.0 * n);
        }
        if (situ) {
            /* c: d(out) of the backward, then the forward's output */
            report("situ_bwd", shape, bench_median_ms(situ_bwd, &c, CS, WARM, RUNS, "glu_bwd"), 0, 10.0 * n);
            report("situ_fwd", shape, bench_median_ms(situ_fwd, &c, CS, WARM, RUNS, "glu_fwd"), 0, 6.0 * n);
        }
        k3rt_free(0, c.a), k3rt_free(0, c.b), k3rt_free(0, c.c), k3rt_free(0, c.d);
        k3rt_free(0, c.e);
    }
}

static void bench_elementwise(int64_t n)
{
    char shape[64];
    snprintf(shape, sizeof shape, "n=%lld", (long long)n);
    bench_glu(n, wanted("swiglu"), wanted("situ"));
    if (wanted("cast") || wanted("sum_squares")) {
        ew_ctx c = {n, bench_dev(n * 4), bench_dev(n * 2), NULL, NULL, NULL};
        fill_random(c.a, K3RT_F32, n, 1.0, 19);
        if (wanted("cast"))
            report("cast_f32_bf16", shape, bench_median_ms(cast_op, &c, CS, WARM, RUNS, "cast"), 0, 6.0 * n);
        if (wanted("sum_squares"))
            report("sum_squares", shape, bench_median_ms(sumsq_op, &c, CS, WARM, RUNS, "sum_squares"), 0, 4.0 * n);
        k3rt_free(0, c.a), k3rt_free(0, c.b);
    }
    if (wanted("adamw")) {
        ew_ctx c = {n, bench_dev(n * 4), bench_dev(n * 4), bench_dev(n * 4), bench_dev(n * 4), NULL};
        fill_random(c.a, K3RT_F32, n, 1.0, 20);
        fill_random(c.b, K3RT_F32, n, 1e-2, 21);
        fill_random(c.c, K3RT_F32, n, 1e-3, 22);
        fill_random(c.d, K3RT_F32, n, 1e-3, 23);
        k3rt_error err = {0};
        /* v must be >= 0: one step from v = x^2 style values keeps it so. */
        if (k3rt_mul(S, K3RT_F32, n, c.d, c.d, c.d, &err))
            bench_die("mul", err.msg);
        report("adamw", shape, bench_median_ms(adamw_op, &c, CS, WARM, RUNS, "adamw_step"), 0, 28.0 * n);
        k3rt_free(0, c.a), k3rt_free(0, c.b), k3rt_free(0, c.c), k3rt_free(0, c.d);
    }
}

/* Device-to-device copy bandwidth, counting bytes read plus written. */
typedef struct {
    size_t bytes;
    void *a, *b;
} copy_ctx;

static int copy_op(void *p, k3rt_error *err)
{
    copy_ctx *c = p;
    (void)err;
    bench_cuda_check(cudaMemcpyAsync(c->b, c->a, c->bytes, cudaMemcpyDeviceToDevice, CS),
               "cudaMemcpyAsync");
    return 0;
}

static void bench_copy(void)
{
    if (!wanted("copy"))
        return;
    copy_ctx c = {(size_t)2 << 30, NULL, NULL};
    c.a = bench_dev(c.bytes), c.b = bench_dev(c.bytes);
    fill_random(c.a, K3RT_F32, (int64_t)(c.bytes / 4), 1.0, 24);
    report("copy", "size=2147483648", bench_median_ms(copy_op, &c, CS, WARM, RUNS, "copy"), 0, 2.0 * (double)c.bytes);
    k3rt_free(0, c.a), k3rt_free(0, c.b);
}

int main(int argc, char **argv)
{
    bench_program = "bench_gpu_ops";
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--runs") && i + 1 < argc)
            RUNS = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--warmup") && i + 1 < argc)
            WARM = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--tokens") && i + 1 < argc)
            N = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--only") && i + 1 < argc)
            ONLY = argv[++i];
        else {
            fprintf(stderr, "usage: %s [--runs R] [--warmup W] [--tokens N] [--only SUBSTRING]\n",
                    argv[0]);
            return 2;
        }
    }
    if (RUNS < 1 || WARM < 0 || N < 1)
        bench_die("arguments", "--runs >= 1, --warmup >= 0 and --tokens >= 1 please");
    if (k3rt_cuda_device_count() == 0)
        bench_die("device", "no CUDA device");
    k3rt_error err = {0};
    if (k3rt_stream_create(0, K3RT_STREAM_COMPUTE, &S, &err))
        bench_die("k3rt_stream_create", err.msg);
    CS = (cudaStream_t)k3rt_stream_native(S);
    struct cudaDeviceProp prop;
    bench_cuda_check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    printf("device=\"%s\" sms=%d runs=%d warmup=%d tokens=%lld\n", prop.name,
           prop.multiProcessorCount, RUNS, WARM, (long long)N);

    bench_copy();
    const int64_t lin[][2] = {{1024, 1024}, {1024, 128}, {128, 1024}, {1024, 320}, {256, 1024},
                              {1024, 512},  {512, 1024}, {1024, 4096}, {4096, 1024},
                              {1024, 32000}};
    for (size_t i = 0; i < sizeof lin / sizeof lin[0]; i++)
        bench_linear(K3RT_BF16, N, lin[i][0], lin[i][1]);
    /* K3-mini's experts (top-8 of N tokens over 64: 512 -> 2 x 768 gate/up, 768 -> 512
     * down) and K3's (128 local experts, latent 3584 -> 2 x 3072, 3072 -> 3584, 65,536 rows),
     * uniform and Zipf(1.2)-skewed. */
    const int64_t grp[][4] = {{64, N * 8, 512, 1536}, {64, N * 8, 768, 512},
                              {128, 65536, 3584, 6144}, {128, 65536, 3072, 3584}};
    for (size_t i = 0; i < sizeof grp / sizeof grp[0]; i++)
        for (int z = 0; z < 2; z++)
            bench_grouped(grp[i][0], grp[i][1], grp[i][2], grp[i][3], z ? 1.2 : 0.0);
    bench_gemm_f32(4096, 4096, 4096);
    bench_rmsnorm(N, 1024);
    bench_rmsnorm(N, 512);
    bench_xent(N, 32000);
    bench_elementwise(N * 4096);  /* the dense FFN's hidden activations */
    bench_glu(N * 8 * 768, 0, wanted("situ"));  /* LatentMoE's routed width at K3-mini: top-8 x 768 */
    k3rt_stream_destroy(S);
    return 0;
}
