/* KDA's chunked recurrence on CUDA (plugins/attention/kda/cuda/kda_cuda.h) against the CPU
 * reference in float64 (kda_core_fwd_f64 / kda_core_bwd_f64 / kda_core_summary_f64, compiled in
 * from the plugin's sources): o, the final state, dq, dk, dv, dg, dbeta, dS0 and the affine
 * summary (M, B), for f32 (fp32 arithmetic) and bf16 (tensor cores), over ragged T, several heads
 * and batches, head widths 32/64/128, with and without an initial state, GVA (HV = 2H) and
 * packed sequences (cu_seqlens with 1, 3 and 7 documents, one of them empty). Inputs are drawn
 * bf16-representable, so one reference serves both dtypes. Outputs, saved tensors and the
 * workspace are poisoned (NaN bytes) before each call: every output element must be finite.
 * Error: rms(ref - x) / rms(ref); f32 <= 1e-5; bf16 (spec §9, fla's thresholds) o, S_T 5e-3,
 * dq, dk, dv, dS0 8e-3, dg, dbeta 2e-2, M, B 8e-3. A second run of two cases must give the same
 * bits. Skips (exit 77) without a CUDA device; runs without fork (CUDA does not survive one).
 * K3RT_KDA_TEST_SMALL=1 keeps the shapes with T <= 100 (compute-sanitizer runs). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"

#include "../../plugins/attention/kda/layout.c"
#include "../../plugins/attention/kda/cpu.c"
#ifdef K3RT_HAVE_CUDA
#include "../../plugins/attention/kda/cuda/kda_cuda.h"
#endif

static k3rt_stream *G;  /* CUDA stream on device 0 */
static k3rt_stream *CPU;
static int small_only;

#ifdef K3RT_HAVE_CUDA

/* ---- device arrays ------------------------------------------------------------------------- */
static void *dalloc(size_t bytes)
{
    k3rt_error err = {0};
    void *p = k3rt_alloc(0, bytes ? bytes : 16, &err);
    ck_assert_msg(p != NULL, "k3rt_alloc(%zu): %s", bytes, err.msg);
    return p;
}

static void poison(void *d, size_t bytes)
{
    k3rt_error err = {0};
    if (d && bytes)
        TU_OK(k3rt_memset(G, d, 0, 0xff, bytes, &err), err);
}

static void *upload(const double *v, int64_t n, int dtype)
{
    k3rt_error err = {0};
    size_t bytes = (size_t)n * k3rt_dtype_size(dtype);
    void *h = malloc(bytes ? bytes : 1), *d = dalloc(bytes);
    TU_OK(k3rt_convert(h, dtype, v, K3RT_F64, n, &err), err);
    TU_OK(k3rt_memcpy(G, d, 0, h, K3RT_DEVICE_CPU, bytes, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    free(h);
    return d;
}

static double *download(const void *d, int64_t n, int dtype)
{
    k3rt_error err = {0};
    size_t bytes = (size_t)n * k3rt_dtype_size(dtype);
    void *h = malloc(bytes ? bytes : 1);
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    TU_OK(k3rt_memcpy(G, h, K3RT_DEVICE_CPU, d, 0, bytes, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    TU_OK(k3rt_convert(x, K3RT_F64, h, dtype, n, &err), err);
    free(h);
    return x;
}

static void *download_raw(const void *d, size_t bytes)
{
    k3rt_error err = {0};
    void *h = malloc(bytes ? bytes : 1);
    TU_OK(k3rt_memcpy(G, h, K3RT_DEVICE_CPU, d, 0, bytes, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    return h;
}

static double *dvec(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

/* v rounded to bf16 in place (every input is then exact in either dtype) */
static void round_bf16(double *v, int64_t n)
{
    k3rt_error err = {0};
    uint16_t *h = malloc((size_t)(n ? n : 1) * 2);
    TU_OK(k3rt_convert(h, K3RT_BF16, v, K3RT_F64, n, &err), err);
    TU_OK(k3rt_convert(v, K3RT_F64, h, K3RT_BF16, n, &err), err);
    free(h);
}

/* Every element finite and rel_rms(ref, got) <= tol; returns the error. */
static double expect_close(const char *what, const char *ctx, const double *ref,
                           const double *got, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(got[i])) {
            tu_fail_later("%s %s: element %lld is %g (reference %g): not written or not finite",
                          ctx, what, (long long)i, got[i], ref[i]);
            return INFINITY;
        }
    double e = tu_rel_rms(ref, got, n);
    if (!(e <= tol))
        tu_fail_later("%s %s: relative rms error %.3g > %.1g", ctx, what, e, tol);
    return e;
}

/* ---- one case ------------------------------------------------------------------------------ */
typedef struct kcase {
    int64_t B, T, H, HV, D;
    int s0;               /* with an initial state */
    int n_docs;           /* packed: B = 1, T = sum of lens */
    const int *lens;
    double g_lo, g_hi;    /* g = -U[g_lo, g_hi] */
    int determinism;      /* run twice, compare bits */
} kcase;

typedef struct host {
    int64_t N, n_seq, nq, nv, ng, nb, ns;
    int64_t *t0, *len;
    int32_t *cu;
    double *q, *k, *v, *g, *beta, *s0, *dO, *dsT;
    double *o, *sT, *dq, *dk, *dv, *dg, *dbeta, *ds0, *m, *b;
} host;

static void draw(const kcase *kc, host *h, uint64_t seed)
{
    int64_t D = kc->D;
    memset(h, 0, sizeof *h);
    h->n_seq = kc->n_docs ? kc->n_docs : kc->B;
    h->t0 = calloc((size_t)h->n_seq, sizeof(int64_t));
    h->len = calloc((size_t)h->n_seq, sizeof(int64_t));
    h->cu = calloc((size_t)h->n_seq + 1, sizeof(int32_t));
    int64_t at = 0;
    for (int64_t s = 0; s < h->n_seq; s++) {
        h->t0[s] = at;
        h->len[s] = kc->n_docs ? kc->lens[s] : kc->T;
        at += h->len[s];
        h->cu[s + 1] = (int32_t)at;
    }
    h->N = at;
    h->nq = h->N * kc->H * D, h->nv = h->N * kc->HV * D, h->ng = h->nv, h->nb = h->N * kc->HV;
    h->ns = h->n_seq * kc->HV * D * D;
    h->q = dvec(h->nq), h->k = dvec(h->nq), h->v = dvec(h->nv), h->g = dvec(h->ng);
    h->beta = dvec(h->nb), h->s0 = dvec(h->ns), h->dO = dvec(h->nv), h->dsT = dvec(h->ns);
    h->o = dvec(h->nv), h->sT = dvec(h->ns), h->dq = dvec(h->nq), h->dk = dvec(h->nq);
    h->dv = dvec(h->nv), h->dg = dvec(h->ng), h->dbeta = dvec(h->nb), h->ds0 = dvec(h->ns);
    h->m = dvec(h->ns), h->b = dvec(h->ns);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 0xcda);
    for (int64_t i = 0; i < h->nq; i++)
        h->q[i] = k3rt_rng_normal(&rng), h->k[i] = k3rt_rng_normal(&rng);
    for (int64_t r = 0; r < h->nq / D; r++) { /* unit rows, then bf16: close to unit */
        double nq = 0, nk = 0;
        for (int64_t j = 0; j < D; j++)
            nq += h->q[r * D + j] * h->q[r * D + j], nk += h->k[r * D + j] * h->k[r * D + j];
        for (int64_t j = 0; j < D; j++)
            h->q[r * D + j] /= sqrt(nq), h->k[r * D + j] /= sqrt(nk);
    }
    for (int64_t i = 0; i < h->nv; i++) {
        h->v[i] = k3rt_rng_normal(&rng);
        h->g[i] = -(kc->g_lo + (kc->g_hi - kc->g_lo) * k3rt_rng_uniform(&rng));
        h->dO[i] = k3rt_rng_normal(&rng);
    }
    for (int64_t i = 0; i < h->nb; i++)
        h->beta[i] = 1 / (1 + exp(-k3rt_rng_normal(&rng)));
    for (int64_t i = 0; i < h->ns; i++)
        h->s0[i] = kc->s0 ? 0.5 * k3rt_rng_normal(&rng) : 0.0, h->dsT[i] = k3rt_rng_normal(&rng);
    double *in[] = {h->q, h->k, h->v, h->g, h->beta, h->dO};
    int64_t nin[] = {h->nq, h->nq, h->nv, h->ng, h->nb, h->nv};
    for (int i = 0; i < 6; i++)
        round_bf16(in[i], nin[i]);
}

static void host_free(host *h)
{
    double *all[] = {h->q, h->k, h->v, h->g, h->beta, h->s0, h->dO, h->dsT, h->o, h->sT,
                     h->dq, h->dk, h->dv, h->dg, h->dbeta, h->ds0, h->m, h->b};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    free(h->t0), free(h->len), free(h->cu);
}

/* The float64 reference, one sequence at a time (B = 1 calls on slices). */
static void reference(const kcase *kc, host *h)
{
    int64_t H = kc->H, HV = kc->HV, D = kc->D, maxlen = 1;
    for (int64_t s = 0; s < h->n_seq; s++)
        maxlen = h->len[s] > maxlen ? h->len[s] : maxlen;
    kda_dims d = {1, maxlen, H, HV, D, D, 64, 1.0 / sqrt((double)D)};
    int slots = k3rt_stream_threads(CPU);
    int64_t ws_n = kda_core_ws_elems_f64(&d, slots);
    double *ws = dvec(ws_n), *states = dvec(HV * kda_chunks(maxlen, 64) * D * D);
    for (int64_t s = 0; s < h->n_seq; s++) {
        int64_t t0 = h->t0[s], ns = HV * D * D;
        const double *s0 = kc->s0 ? h->s0 + s * ns : NULL;
        if (h->len[s] == 0) { /* an empty document: the state passes through */
            for (int64_t i = 0; i < ns; i++) {
                h->sT[s * ns + i] = s0 ? s0[i] : 0.0;
                h->ds0[s * ns + i] = h->dsT[s * ns + i];
                h->m[s * ns + i] = (i / D) % D == i % D ? 1.0 : 0.0;
                h->b[s * ns + i] = 0.0;
            }
            continue;
        }
        d.T = h->len[s];
        k3rt_error err = {0};
        const double *q = h->q + t0 * H * D, *k = h->k + t0 * H * D, *v = h->v + t0 * HV * D,
                     *g = h->g + t0 * HV * D, *beta = h->beta + t0 * HV;
        TU_OK(kda_core_fwd_f64(CPU, KDA_CHUNKED, &d, q, k, v, g, beta, s0, h->o + t0 * HV * D,
                               states, h->sT + s * ns, ws, ws_n, &err), err);
        TU_OK(kda_core_bwd_f64(CPU, KDA_CHUNKED, &d, q, k, v, g, beta, states,
                               h->dO + t0 * HV * D, h->dsT + s * ns, h->dq + t0 * H * D,
                               h->dk + t0 * H * D, h->dv + t0 * HV * D, h->dg + t0 * HV * D,
                               h->dbeta + t0 * HV, h->ds0 + s * ns, ws, ws_n, &err), err);
        TU_OK(kda_core_summary_f64(CPU, &d, q, k, v, g, beta, h->m + s * ns, h->b + s * ns, ws,
                                   ws_n, &err), err);
    }
    free(ws);
    free(states);
}

typedef struct dev {
    void *q, *k, *v, *g, *beta, *dO, *o, *dq, *dk, *dv, *dg, *dbeta;
    float *s0, *dsT, *sT, *ds0, *m, *b;
    int32_t *cu;
    void *saved, *ws;
    size_t saved_bytes, ws_bytes;
} dev;

static void dev_free(dev *x)
{
    void *all[] = {x->q,  x->k,  x->v,  x->g,   x->beta, x->dO, x->o,  x->dq, x->dk, x->dv,
                   x->dg, x->dbeta, x->s0, x->dsT, x->sT, x->ds0, x->m, x->b, x->cu, x->saved,
                   x->ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i])
            k3rt_free(0, all[i]);
}

static void run_gpu(const kda_cuda_args *a, dev *x, const host *h)
{
    k3rt_error err = {0};
    size_t es = k3rt_dtype_size(a->dtype);
    poison(x->o, (size_t)h->nv * es), poison(x->sT, (size_t)h->ns * 4);
    poison(x->saved, x->saved_bytes), poison(x->ws, x->ws_bytes);
    poison(x->dq, (size_t)h->nq * es), poison(x->dk, (size_t)h->nq * es);
    poison(x->dv, (size_t)h->nv * es), poison(x->dg, (size_t)h->ng * es);
    poison(x->dbeta, (size_t)h->nb * es), poison(x->ds0, (size_t)h->ns * 4);
    poison(x->m, (size_t)h->ns * 4), poison(x->b, (size_t)h->ns * 4);
    void *st = k3rt_stream_native(G);
    TU_OK(kda_cuda_fwd(st, a, &err), err);
    TU_OK(kda_cuda_bwd(st, a, &err), err);
    TU_OK(kda_cuda_summary(st, a, x->m, x->b, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
}

static void run_case(const kcase *kc, uint64_t seed)
{
    host h;
    draw(kc, &h, seed);
    reference(kc, &h);
    int dtypes[2] = {K3RT_F32, K3RT_BF16};
    for (int di = 0; di < 2; di++) {
        int dt = dtypes[di];
        const int bf = dt == K3RT_BF16;
        char ctx[160];
        snprintf(ctx, sizeof ctx, "%s B%lld T%lld H%lld/%lld D%lld%s%s docs%d g[-%.2g,-%.2g]",
                 bf ? "bf16" : "f32 ", (long long)kc->B, (long long)kc->T, (long long)kc->H,
                 (long long)kc->HV, (long long)kc->D, kc->s0 ? " s0" : "",
                 kc->n_docs ? " packed" : "", kc->n_docs, kc->g_hi, kc->g_lo);
        dev x;
        memset(&x, 0, sizeof x);
        x.q = upload(h.q, h.nq, dt), x.k = upload(h.k, h.nq, dt), x.v = upload(h.v, h.nv, dt);
        x.g = upload(h.g, h.ng, dt), x.beta = upload(h.beta, h.nb, dt), x.dO = upload(h.dO, h.nv, dt);
        x.s0 = kc->s0 ? upload(h.s0, h.ns, K3RT_F32) : NULL;
        x.dsT = upload(h.dsT, h.ns, K3RT_F32);
        size_t es = k3rt_dtype_size(dt);
        x.o = dalloc((size_t)h.nv * es), x.dq = dalloc((size_t)h.nq * es);
        x.dk = dalloc((size_t)h.nq * es), x.dv = dalloc((size_t)h.nv * es);
        x.dg = dalloc((size_t)h.ng * es), x.dbeta = dalloc((size_t)h.nb * es);
        x.sT = dalloc((size_t)h.ns * 4), x.ds0 = dalloc((size_t)h.ns * 4);
        x.m = dalloc((size_t)h.ns * 4), x.b = dalloc((size_t)h.ns * 4);
        kda_cuda_args a;
        memset(&a, 0, sizeof a);
        a.dtype = dt;
        a.B = kc->n_docs ? 1 : kc->B, a.T = kc->n_docs ? h.N : kc->T;
        a.H = kc->H, a.HV = kc->HV, a.D = kc->D;
        if (kc->n_docs) {
            k3rt_error err = {0};
            x.cu = dalloc((size_t)(kc->n_docs + 1) * 4);
            TU_OK(k3rt_memcpy(G, x.cu, 0, h.cu, K3RT_DEVICE_CPU, (size_t)(kc->n_docs + 1) * 4,
                              &err), err);
            a.cu_seqlens = x.cu, a.n_docs = kc->n_docs;
        }
        k3rt_error err = {0};
        TU_OK(kda_cuda_saved_bytes(&a, &x.saved_bytes, &err), err);
        TU_OK(kda_cuda_workspace_bytes(&a, 1, &x.ws_bytes, &err), err);
        x.saved = dalloc(x.saved_bytes), x.ws = dalloc(x.ws_bytes);
        a.q = x.q, a.k = x.k, a.v = x.v, a.g = x.g, a.beta = x.beta, a.s0 = x.s0;
        a.o = x.o, a.s_final = x.sT, a.saved = x.saved, a.workspace = x.ws;
        a.d_o = x.dO, a.d_s_final = x.dsT;
        a.d_q = x.dq, a.d_k = x.dk, a.d_v = x.dv, a.d_g = x.dg, a.d_beta = x.dbeta;
        a.d_s0 = x.ds0;
        run_gpu(&a, &x, &h);

        double t_o = bf ? 5e-3 : 1e-5, t_dqkv = bf ? 8e-3 : 1e-5, t_dg = bf ? 2e-2 : 1e-5;
        double e[10];
        const char *names[10] = {"o", "S_T", "dq", "dk", "dv", "dg", "dbeta", "dS0", "M", "B"};
        struct {
            const void *d;
            const double *ref;
            int64_t n;
            int dtype;
            double tol;
        } outs[10] = {{x.o, h.o, h.nv, dt, t_o},           {x.sT, h.sT, h.ns, K3RT_F32, t_o},
                      {x.dq, h.dq, h.nq, dt, t_dqkv},      {x.dk, h.dk, h.nq, dt, t_dqkv},
                      {x.dv, h.dv, h.nv, dt, t_dqkv},      {x.dg, h.dg, h.ng, dt, t_dg},
                      {x.dbeta, h.dbeta, h.nb, dt, t_dg},  {x.ds0, h.ds0, h.ns, K3RT_F32, t_dqkv},
                      {x.m, h.m, h.ns, K3RT_F32, t_dqkv},  {x.b, h.b, h.ns, K3RT_F32, t_dqkv}};
        for (int i = 0; i < 10; i++) {
            double *got = download(outs[i].d, outs[i].n, outs[i].dtype);
            e[i] = expect_close(names[i], ctx, outs[i].ref, got, outs[i].n, outs[i].tol);
            free(got);
        }
        printf("%-52s", ctx);
        for (int i = 0; i < 10; i++)
            printf(" %s %.2e", names[i], e[i]);
        printf("\n");
        fflush(stdout);

        if (kc->determinism) { /* the same bits again */
            const void *d[8] = {x.o, x.sT, x.dq, x.dk, x.dv, x.dg, x.dbeta, x.ds0};
            size_t nb[8] = {h.nv * es, h.ns * 4, h.nq * es, h.nq * es,
                            h.nv * es, h.ng * es, h.nb * es, h.ns * 4};
            void *first[8];
            for (int i = 0; i < 8; i++)
                first[i] = download_raw(d[i], nb[i]);
            run_gpu(&a, &x, &h);
            for (int i = 0; i < 8; i++) {
                void *again = download_raw(d[i], nb[i]);
                if (memcmp(first[i], again, nb[i]))
                    tu_fail_later("%s %s: a second run gave other bits", ctx, names[i]);
                free(again);
                free(first[i]);
            }
            printf("%-52s two runs: same bits\n", ctx);
        }
        dev_free(&x);
    }
    host_free(&h);
}

static const int docs1[] = {100};
static const int docs3[] = {15, 64, 130};
static const int docs7[] = {1, 63, 0, 65, 128, 7, 300};

START_TEST(kda_cuda_vs_cpu)
{
    /* B, T, H, HV, D, s0, n_docs, lens, g_lo, g_hi, determinism */
    const kcase cases[] = {
        {1, 1, 1, 1, 32, 1, 0, NULL, 0.02, 1.0, 0},
        {2, 15, 3, 3, 64, 0, 0, NULL, 0.02, 1.0, 0},
        {3, 64, 1, 1, 128, 1, 0, NULL, 0.02, 1.0, 1},
        {4, 100, 3, 3, 32, 1, 0, NULL, 0.02, 1.0, 0},
        {2, 100, 3, 6, 64, 1, 0, NULL, 0.02, 1.0, 0},        /* GVA */
        {1, 0, 3, 3, 64, 0, 1, docs1, 0.02, 1.0, 0},         /* packed */
        {1, 0, 2, 2, 128, 1, 3, docs3, 0.02, 1.0, 0},
        {1, 0, 3, 3, 64, 1, 7, docs7, 0.02, 1.0, 1},
        {1, 200, 2, 2, 128, 1, 0, NULL, 0.5, 5.0, 0},        /* decay near the bound */
        {2, 1000, 8, 8, 64, 0, 0, NULL, 0.02, 1.0, 0},
        {1, 1000, 16, 16, 32, 1, 0, NULL, 0.02, 1.0, 0},
        {1, 4096, 16, 16, 128, 1, 0, NULL, 0.02, 1.0, 0},
    };
    uint64_t seed = 1000;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int64_t T = cases[i].n_docs ? 0 : cases[i].T;
        if (small_only && T > 100)
            continue;
        run_case(&cases[i], seed++);
    }
    tu_expect_no_failures();
}
END_TEST

START_TEST(kda_cuda_refuses)
{
    kda_cuda_args a;
    memset(&a, 0, sizeof a);
    a.dtype = K3RT_BF16, a.B = 1, a.T = 8, a.H = 2, a.HV = 2, a.D = 128;
    size_t bytes;
    k3rt_error err = {0};
    ck_assert_int_eq(kda_cuda_saved_bytes(&a, &bytes, &err), 0);
    a.D = 48;
    ck_assert_int_eq(kda_cuda_saved_bytes(&a, &bytes, &err), K3RT_ERR_UNSUPPORTED);
    a.D = 128, a.HV = 3;
    ck_assert_int_eq(kda_cuda_saved_bytes(&a, &bytes, &err), K3RT_ERR_INVALID);
    a.HV = 2, a.dtype = K3RT_F64;
    ck_assert_int_eq(kda_cuda_saved_bytes(&a, &bytes, &err), K3RT_ERR_INVALID);
    a.dtype = K3RT_BF16;
    void *st = k3rt_stream_native(G);
    ck_assert_int_ne(kda_cuda_fwd(st, &a, &err), 0); /* no buffers */
    a.B = 2, a.cu_seqlens = (const int32_t *)&a, a.n_docs = 1;
    ck_assert_int_eq(kda_cuda_saved_bytes(&a, &bytes, &err), K3RT_ERR_INVALID); /* B != 1 */
}
END_TEST

#endif

static Suite *suite(void)
{
    Suite *s = suite_create("kda_cuda");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 600);
#ifdef K3RT_HAVE_CUDA
    tcase_add_test(tc, kda_cuda_vs_cpu);
    tcase_add_test(tc, kda_cuda_refuses);
#endif
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (k3rt_cuda_device_count() == 0) {
        printf("no CUDA device: skipped\n");
        return 77;
    }
    const char *small = getenv("K3RT_KDA_TEST_SMALL");
    small_only = small && *small && strcmp(small, "0") != 0;
    k3rt_error err = {0};
    if (k3rt_stream_create(0, K3RT_STREAM_COMPUTE, &G, &err) != K3RT_OK) {
        fprintf(stderr, "cannot create a CUDA stream: %s\n", err.msg);
        return 1;
    }
    const char *th = getenv("K3RT_THREADS");
    CPU = tu_cpu_stream(th && atoi(th) > 0 ? atoi(th) : 2);
    SRunner *sr = srunner_create(suite());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_VERBOSE);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    k3rt_stream_destroy(G);
    k3rt_stream_destroy(CPU);
    return failed == 0 ? 0 : 1;
}
