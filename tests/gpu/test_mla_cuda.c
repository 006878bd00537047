/* The mla plugin on CUDA against the CPU.
 *  (a) The attention core (plugins/attention/mla/mla_cuda.h), forward and backward, against a
 *      direct float64 computation on the values the device holds: o, lse, the per-block max
 *      logits, dq, dk, dv; ragged T, several heads and batches; both of k3rt's kernel families
 *      (tensor cores for bf16 at MLA's widths, fp32 arithmetic otherwise). The backward runs in
 *      both modes: deterministic (two passes on the tensor cores; must give the same bits
 *      twice) and not (one pass, dQ summed with float atomics into a poisoned f32
 *      accumulator). Where T is a multiple of 128, bf16 also runs with cuDNN's fused attention
 *      (kernel "cudnn": its forward and backward; "auto" with the max logits asked for: k3rt's
 *      forward, cuDNN's backward), skipped when cuDNN is not usable unless
 *      K3RT_REQUIRE_CUDNN=1.
 *  (b) The whole plugin, forward and backward, on CUDA against the same plugin on the CPU: y,
 *      dx, the increment of every parameter gradient (they accumulate onto random values) and
 *      the per-head max logits. f32 runs against the CPU in f64; bf16 runs against the CPU in
 *      f32 on the bf16-rounded inputs and weights; bf16 at MLA's widths in both backward modes,
 *      and at T = 128 with cuda_kernel "cudnn" (report_max_logit off: no statistic at all).
 *  Both halves also run packed documents (doc_offsets: each query sees only its own document's
 *  keys up to itself), against references that mask them, and check that the results are far
 *  from attention across the boundaries; cuDNN has no document mask: "auto" runs k3rt's
 *  kernels and "cudnn" is refused.
 * Outputs, saved activations and workspaces are poisoned (NaN bytes) before each run; the error
 * is rms(ref - x) / rms(ref), <= 1e-5 for f32 and <= 1e-2 for bf16.
 *
 * K3RT_MLA_TEST_SMALL=1 keeps the small shapes and half the plugin configurations (for
 * compute-sanitizer runs); CK_RUN_CASE=core or plugin runs one half. Skips (exit 77)
 * without a CUDA device; runs without fork (CUDA does not survive a fork). K3RT_GK_HOST=1
 * (gpu_testkit.h) runs the plugin half's f32 cases with the CPU as the device under test: the
 * harness, on a machine without a GPU. */
#include "gpu_testkit.h"
#include "plugin/rig.h"
#include "plugin/registry.h"
#include "plugin/sinks.h"
#ifdef K3RT_HAVE_CUDA
#include "../../plugins/attention/mla/mla_cuda.h"
#endif

static k3rt_stream *C;  /* CPU stream of the reference */
static uint64_t seed_next = 77;
static int small_only;

static double tol_of(int dtype) { return dtype == K3RT_BF16 ? 1e-2 : 1e-5; }

/* ---- device arrays (gpu_testkit.h: GK_DEV, the device under test; GK_G, its stream) -------- */

/* v (n doubles) rounded in place to dtype, then copied to the device as dtype. */
static void *upload(double *v, int64_t n, int dtype)
{
    k3rt_error err = {0};
    void *h = malloc(gk_bytes(dtype, n));
    TU_OK(k3rt_convert(h, dtype, v, K3RT_F64, n, &err), err);
    TU_OK(k3rt_convert(v, K3RT_F64, h, dtype, n, &err), err);
    free(h);
    return gk_from(dtype, v, n);
}

static double *randv(int64_t n, double scale)
{
    double *v = malloc((size_t)(n ? n : 1) * sizeof *v);
    tu_randn(v, n, scale, seed_next++);
    return v;
}

/* Every element finite and rel_rms(ref, got) <= tol; returns the error. */
static double expect_close(const char *what, const char *ctx, const double *ref,
                           const double *got, int64_t n, double tol)
{
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(got[i])) {
            tu_fail_later("%s %s: an element is %g (reference %g): not written or not "
                          "finite", ctx, what, got[i], ref[i]);
            return INFINITY;
        }
    double e = tu_rel_rms(ref, got, n);
    if (!(e <= tol))
        tu_fail_later("%s %s: relative rms error %.3g > %.1g", ctx, what, e, tol);
    return e;
}

/* Largest |ref - got| / (1 + |ref|): for log-sum-exps and maxima of logits, log-domain values
 * that may sit near 0 (where a relative error means nothing: lse of a one-key row is one
 * logit). */
static double max_rel(const double *ref, const double *got, int64_t n)
{
    double w = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs(ref[i] - got[i]) / (1 + fabs(ref[i]));
        w = e > w || isnan(e) ? e : w;
    }
    return w;
}

static double expect_log_close(const char *what, const char *ctx, const double *ref,
                               const double *got, int64_t n, double tol)
{
    double e = max_rel(ref, got, n);
    if (!(e <= tol))
        tu_fail_later("%s %s: error %.3g > %.1g (|ref - x| / (1 + |ref|))", ctx, what, e, tol);
    return e;
}

/* got must be far from unmasked, the reference without the document boundaries: else the
 * case could not tell a kernel that ignores them. */
static void expect_far(const char *what, const char *ctx, const double *unmasked,
                       const double *got, int64_t n, double tol)
{
    double e = tu_rel_rms(unmasked, got, n);
    printf("%s %s: %.2e from attention across the document boundaries\n", ctx, what, e);
    if (!(e > 10 * tol))
        tu_fail_later("%s %s: within %.3g of attention across the document boundaries: the "
                      "case does not test the document mask", ctx, what, e);
}

/* Packed documents of a case: offsets [n + 1] over the B*T tokens (n = 0: none). */
typedef struct adocs {
    int n;
    int32_t off[12];
} adocs;

static const adocs no_docs = {0, {0}};

/* ---- (a) the attention core ---------------------------------------------------------------- */

#ifdef K3RT_HAVE_CUDA
typedef struct ashape {
    int64_t B, T, H, dqk, dv;
} ashape;

/* The first key token t of row b sees: its document's start (0 without documents). */
static int64_t first_key(const adocs *d, int64_t b, int64_t T, int64_t t)
{
    int64_t g = b * T + t, j = 0;
    while (j + 1 < d->n && d->off[j + 1] <= g)
        j++;
    return d->n ? d->off[j] - b * T : 0;
}

/* Direct causal attention in float64 over [B, T, H, d] layouts, token t seeing the keys
 * first_key(t) .. t; lse [B, H, T]; bmax [B*H, ceil(T/32)] the largest scaled logit of each 32
 * rows. Backward from dout. */
static void ref_attention(const ashape *s, const adocs *docs, double scale, const double *q,
                          const double *k, const double *v, const double *dout, double *o,
                          double *lse, double *bmax, double *dq, double *dk, double *dv)
{
    int64_t B = s->B, T = s->T, H = s->H, dqk = s->dqk, dvw = s->dv, nb = (T + 31) / 32;
    double *p = malloc((size_t)T * sizeof *p);
    memset(dk, 0, (size_t)(B * T * H * dqk) * sizeof *dk);
    memset(dv, 0, (size_t)(B * T * H * dvw) * sizeof *dv);
    for (int64_t b = 0; b < B; b++)
        for (int64_t h = 0; h < H; h++) {
            int64_t bh = b * H + h;
            for (int64_t i = 0; i < nb; i++)
                bmax[bh * nb + i] = -INFINITY;
            for (int64_t t = 0; t < T; t++) {
                const double *qt = q + ((b * T + t) * H + h) * dqk;
                const int64_t f = first_key(docs, b, T, t);
                double m = -INFINITY, sum = 0;
                for (int64_t j = f; j <= t; j++) {
                    const double *kj = k + ((b * T + j) * H + h) * dqk;
                    double sc = 0;
                    for (int64_t c = 0; c < dqk; c++)
                        sc += qt[c] * kj[c];
                    p[j] = sc * scale;
                    m = p[j] > m ? p[j] : m;
                }
                for (int64_t j = f; j <= t; j++)
                    sum += (p[j] = exp(p[j] - m));
                lse[bh * T + t] = m + log(sum);
                if (m > bmax[bh * nb + t / 32])
                    bmax[bh * nb + t / 32] = m;
                double *ot = o + ((b * T + t) * H + h) * dvw;
                const double *dot = dout + ((b * T + t) * H + h) * dvw;
                double *dqt = dq + ((b * T + t) * H + h) * dqk;
                for (int64_t c = 0; c < dvw; c++) {
                    double acc = 0;
                    for (int64_t j = f; j <= t; j++)
                        acc += p[j] / sum * v[((b * T + j) * H + h) * dvw + c];
                    ot[c] = acc;
                }
                double D = 0;
                for (int64_t c = 0; c < dvw; c++)
                    D += dot[c] * ot[c];
                memset(dqt, 0, (size_t)dqk * sizeof *dqt);
                for (int64_t j = f; j <= t; j++) {
                    const double *kj = k + ((b * T + j) * H + h) * dqk;
                    const double *vj = v + ((b * T + j) * H + h) * dvw;
                    double pj = p[j] / sum, dp = 0;
                    for (int64_t c = 0; c < dvw; c++)
                        dp += dot[c] * vj[c];
                    double ds = pj * (dp - D);
                    for (int64_t c = 0; c < dqk; c++) {
                        dqt[c] += scale * ds * kj[c];
                        dk[((b * T + j) * H + h) * dqk + c] += scale * ds * qt[c];
                    }
                    for (int64_t c = 0; c < dvw; c++)
                        dv[((b * T + j) * H + h) * dvw + c] += pj * dot[c];
                }
            }
        }
    free(p);
}

/* One attention call pair, docs (no_docs: none) packing the rows. */
static void core_case(int dtype, const ashape *s, const adocs *docs, double scale,
                      int check_determinism, int kernel)
{
    k3rt_error err = {0};
    char ctx[200], mctx[240];
    int64_t nq = s->B * s->T * s->H * s->dqk, nv = s->B * s->T * s->H * s->dv;
    int64_t nr = s->B * s->H * s->T, nb = s->B * s->H * ((s->T + 31) / 32);
    size_t es = k3rt_dtype_size(dtype);
    double *q = randv(nq, 1.0), *k = randv(nq, 1.0), *v = randv(nv, 1.0), *dout = randv(nv, 1.0);
    mla_attn a;
    memset(&a, 0, sizeof a);
    a.dtype = dtype, a.B = s->B, a.T = s->T, a.H = s->H, a.dqk = s->dqk, a.dv = s->dv;
    a.scale = scale, a.kernel = kernel;
    a.q = upload(q, nq, dtype), a.k = upload(k, nq, dtype), a.v = upload(v, nv, dtype);
    a.dout = upload(dout, nv, dtype);
    a.o = gk_alloc((size_t)nv * es), a.lse = gk_alloc((size_t)nr * 4);
    /* cuDNN's forward reports no max logits: asked for none. */
    a.block_max = kernel == MLA_KERNEL_CUDNN ? NULL : gk_alloc((size_t)nb * 4);
    a.dq = gk_alloc((size_t)nq * es), a.dk = gk_alloc((size_t)nq * es);
    a.dv_out = gk_alloc((size_t)nv * es), a.drow = gk_alloc((size_t)nr * 4);
    a.dq_acc = gk_alloc((size_t)nq * 4);
    a.docs = docs->n ? gk_dev_copy(docs->off, (size_t)(docs->n + 1) * 4) : NULL;
    a.n_docs = docs->n;
    snprintf(ctx, sizeof ctx, "attention %s B=%lld T=%lld H=%lld dqk=%lld dv=%lld docs=%d (%s)",
             k3rt_dtype_name(dtype), (long long)s->B, (long long)s->T, (long long)s->H,
             (long long)s->dqk, (long long)s->dv, docs->n, mla_attn_path(&a, 0));
    /* The forward: cuDNN's when asked; k3rt's tensor cores at MLA's widths otherwise (auto
     * included: the max logits are asked for). The backward: cuDNN's under auto too, but
     * k3rt's for packed documents. */
    int tc = dtype == K3RT_BF16 && s->dv == 128 && (s->dqk == 192 || s->dqk == 128);
    const char *want = kernel == MLA_KERNEL_CUDNN ? "cudnn" : tc ? "tensor-core" : NULL;
    if (want)
        ck_assert_msg(!strcmp(mla_attn_path(&a, 0), want), "%s: expected the %s kernels", ctx,
                      want);
    const char *want_bwd = docs->n ? (tc ? "tensor-core" : "fp32") : "cudnn";
    if (kernel != MLA_KERNEL_K3RT)
        ck_assert_msg(!strcmp(mla_attn_path(&a, 1), want_bwd), "%s: expected the %s backward",
                      ctx, want_bwd);

    double *ro = malloc((size_t)nv * 8), *rl = malloc((size_t)nr * 8), *rb = malloc((size_t)nb * 8);
    double *rdq = malloc((size_t)nq * 8), *rdk = malloc((size_t)nq * 8);
    double *rdv = malloc((size_t)nv * 8);
    ref_attention(s, docs, scale, q, k, v, dout, ro, rl, rb, rdq, rdk, rdv);
    /* Boundaries inside a row: the reference without them, which the results must be far
     * from (o and lse overwritten into u*; the gradients into ud*). */
    int inner = docs->n > s->B;
    double *uo = NULL, *ul = NULL, *ub = NULL, *udq = NULL, *udk = NULL, *udv = NULL;
    if (inner) {
        uo = malloc((size_t)nv * 8), ul = malloc((size_t)nr * 8), ub = malloc((size_t)nb * 8);
        udq = malloc((size_t)nq * 8), udk = malloc((size_t)nq * 8), udv = malloc((size_t)nv * 8);
        ref_attention(s, &no_docs, scale, q, k, v, dout, uo, ul, ub, udq, udk, udv);
    }

    gk_poison(a.o, (size_t)nv * es), gk_poison(a.lse, (size_t)nr * 4);
    if (a.block_max)
        gk_poison(a.block_max, (size_t)nb * 4);
    TU_OK(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), err);
    TU_OK(k3rt_stream_sync(GK_G, &err), err);
    double tol = tol_of(dtype);
    double *go = gk_get(a.o, dtype, nv), *gl = gk_get(a.lse, K3RT_F32, nr);
    double *gb = a.block_max ? gk_get(a.block_max, K3RT_F32, nb) : NULL;
    double eo = expect_close("o", ctx, ro, go, nv, tol);
    double el = expect_log_close("lse", ctx, rl, gl, nr, tol);
    double eb = gb ? expect_log_close("block max", ctx, rb, gb, nb, tol) : NAN;
    if (gb)
        printf("%s: o %.2e lse %.2e bmax %.2e\n", ctx, eo, el, eb);
    else
        printf("%s: o %.2e lse %.2e (no block max asked for)\n", ctx, eo, el);
    if (inner) {
        expect_far("o", ctx, uo, go, nv, tol);
        expect_far("lse", ctx, ul, gl, nr, tol);
    }

    void *outs[3] = {a.dq, a.dk, a.dv_out};
    const char *names[3] = {"dq", "dk", "dv"};
    size_t sizes[3] = {(size_t)nq * es, (size_t)nq * es, (size_t)nv * es};
    for (int det = 1; det >= 0; det--) {
        a.deterministic = det;
        snprintf(mctx, sizeof mctx, "%s %s backward (%s)", ctx,
                 det ? "deterministic" : "atomic dQ", mla_attn_path(&a, 1));
        for (int i = 0; i < 3; i++)
            gk_poison(outs[i], sizes[i]);
        gk_poison(a.drow, (size_t)nr * 4), gk_poison(a.dq_acc, (size_t)nq * 4);
        TU_OK(mla_attn_bwd_cuda(k3rt_stream_native(GK_G), &a, &err), err);
        TU_OK(k3rt_stream_sync(GK_G, &err), err);
        double *gq = gk_get(a.dq, dtype, nq), *gk = gk_get(a.dk, dtype, nq);
        double *gv = gk_get(a.dv_out, dtype, nv);
        double eq = expect_close("dq", mctx, rdq, gq, nq, tol);
        double ek = expect_close("dk", mctx, rdk, gk, nq, tol);
        double ev = expect_close("dv", mctx, rdv, gv, nv, tol);
        printf("%s: dq %.2e dk %.2e dv %.2e\n", mctx, eq, ek, ev);
        if (inner) {
            expect_far("dq", mctx, udq, gq, nq, tol);
            expect_far("dk", mctx, udk, gk, nq, tol);
            expect_far("dv", mctx, udv, gv, nv, tol);
        }
        free(gq), free(gk), free(gv);
        if (!det || !check_determinism || small_only) /* small: the sanitizer runs */
            continue;
        void *first[3];
        for (int i = 0; i < 3; i++) {
            first[i] = gk_get_raw(outs[i], sizes[i]);
            gk_poison(outs[i], sizes[i]);
        }
        TU_OK(mla_attn_bwd_cuda(k3rt_stream_native(GK_G), &a, &err), err);
        for (int i = 0; i < 3; i++) {
            void *again = gk_get_raw(outs[i], sizes[i]);
            if (memcmp(first[i], again, sizes[i]))
                tu_fail_later("%s %s: differs between two runs on the same inputs", mctx,
                              names[i]);
            free(first[i]), free(again);
        }
    }
    free(go), free(gl), free(gb);
    free(ro), free(rl), free(rb), free(rdq), free(rdk), free(rdv);
    free(uo), free(ul), free(ub), free(udq), free(udk), free(udv);
    free(q), free(k), free(v), free(dout);
    void *bufs[] = {(void *)a.q, (void *)a.k, (void *)a.v, (void *)a.dout, a.o, a.lse,
                    a.block_max, a.dq, a.dk, a.dv_out, a.drow, a.dq_acc, (void *)a.docs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        k3rt_free(GK_DEV, bufs[i]);
}

/* Whether cuDNN's fused attention can run here (the library loads); K3RT_REQUIRE_CUDNN=1 makes
 * its absence a failure instead of a skip of the cuDNN cases. */
static int cudnn_usable(void)
{
    mla_attn a;
    memset(&a, 0, sizeof a);
    a.dtype = K3RT_BF16, a.B = 1, a.T = 128, a.H = 1, a.dqk = 192, a.dv = 128, a.scale = 1;
    int ok = !strcmp(mla_attn_path(&a, 0), "cudnn");
    const char *req = getenv("K3RT_REQUIRE_CUDNN");
    ck_assert_msg(ok || !req || strcmp(req, "1"), "K3RT_REQUIRE_CUDNN=1 but cuDNN's fused "
                  "attention is not usable here (libcudnn.so.9 not loadable, or a build "
                  "without cuDNN's headers)");
    if (!ok)
        printf("cuDNN's fused attention is not usable here: its cases are skipped\n");
    return ok;
}

START_TEST(attention_core_vs_cpu)
{
    /* T a multiple of 128 also runs cuDNN's fused attention (bf16). */
    const ashape shapes[] = {
        {1, 1, 1, 192, 128},  {2, 77, 3, 192, 128}, {1, 300, 2, 192, 128}, {2, 130, 2, 128, 128},
        {1, 64, 2, 128, 128}, {2, 45, 3, 48, 32},   {1, 33, 2, 7, 5},      {1, 1000, 1, 192, 128},
        {2, 128, 3, 192, 128}, {1, 256, 2, 128, 128}, {2, 384, 2, 192, 128}, {1, 128, 2, 64, 32},
    };
    const int dtypes[2] = {K3RT_F32, K3RT_BF16};
    int cudnn = cudnn_usable();
    size_t n = sizeof shapes / sizeof shapes[0];
    for (size_t i = 0; i < n; i++) {
        if (small_only && shapes[i].T > 200)
            continue;
        double scale = 1 / sqrt((double)shapes[i].dqk);
        for (int d = 0; d < 2; d++)
            core_case(dtypes[d], &shapes[i], &no_docs, scale, i == 2 || i == 3 || i == 5,
                      MLA_KERNEL_K3RT);
        if (cudnn && shapes[i].T % 128 == 0) {
            core_case(K3RT_BF16, &shapes[i], &no_docs, scale, 0, MLA_KERNEL_CUDNN);
            core_case(K3RT_BF16, &shapes[i], &no_docs, scale, 0, MLA_KERNEL_AUTO);
        }
    }
    /* A scale far from 1/sqrt(d): large logits. */
    const ashape big = {1, 100, 2, 192, 128}, big128 = {1, 128, 2, 192, 128};
    core_case(K3RT_BF16, &big, &no_docs, 0.3, 0, MLA_KERNEL_K3RT);
    core_case(K3RT_F32, &big, &no_docs, 0.3, 0, MLA_KERNEL_K3RT);
    if (cudnn)
        core_case(K3RT_BF16, &big128, &no_docs, 0.3, 0, MLA_KERNEL_CUDNN);
    tu_expect_no_failures();
}
END_TEST

/* Packed documents, each kernel family against the masked reference: a 1-token document at a
 * row's start, middle and end, boundaries on the edges of every kernel's tiles (32, 64, 128)
 * and inside them, T not a multiple of the tiles, 1, 3 and 7 documents over 1 to 3 rows (and
 * rows that are one document each). Where T is a multiple of 128, "auto" too: cuDNN has no
 * document mask, so k3rt's kernels run both directions. */
START_TEST(attention_core_documents)
{
    static const struct {
        ashape s;
        adocs d;
    } cases[] = {
        {{1, 1, 1, 192, 128}, {1, {0, 1}}},
        {{1, 130, 2, 192, 128}, {3, {0, 64, 65, 130}}},
        {{2, 200, 2, 128, 128}, {3, {0, 128, 200, 400}}},
        {{3, 150, 2, 192, 128}, {7, {0, 1, 77, 150, 300, 332, 449, 450}}},
        {{2, 100, 2, 128, 128}, {2, {0, 100, 200}}},
        {{2, 45, 3, 48, 32}, {3, {0, 20, 45, 90}}},
        {{3, 33, 2, 7, 5}, {7, {0, 1, 2, 33, 40, 66, 98, 99}}},
        {{1, 128, 2, 192, 128}, {1, {0, 128}}},
        {{2, 256, 2, 128, 128}, {3, {0, 96, 256, 512}}},
        {{2, 384, 2, 192, 128}, {7, {0, 5, 128, 129, 384, 500, 640, 768}}},
        {{1, 1000, 1, 192, 128}, {3, {0, 333, 334, 1000}}},
    };
    const int dtypes[2] = {K3RT_F32, K3RT_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const ashape *s = &cases[i].s;
        if (small_only && s->T > 200)
            continue;
        double scale = 1 / sqrt((double)s->dqk);
        for (int d = 0; d < 2; d++)
            core_case(dtypes[d], s, &cases[i].d, scale, i == 3 || i == 6, MLA_KERNEL_K3RT);
        if (s->T % 128 == 0)
            core_case(K3RT_BF16, s, &cases[i].d, scale, 0, MLA_KERNEL_AUTO);
    }
    /* Large logits across a boundary inside a tile. */
    core_case(K3RT_BF16, &cases[3].s, &cases[3].d, 0.3, 0, MLA_KERNEL_K3RT);
    core_case(K3RT_F32, &cases[3].s, &cases[3].d, 0.3, 0, MLA_KERNEL_K3RT);
    tu_expect_no_failures();
}
END_TEST

START_TEST(attention_core_refuses)
{
    k3rt_error err = {0};
    mla_attn a;
    memset(&a, 0, sizeof a);
    a.dtype = K3RT_F64, a.B = 1, a.T = 4, a.H = 1, a.dqk = 8, a.dv = 8, a.scale = 1;
    ck_assert_int_ne(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "f64"));
    a.dtype = K3RT_F32;
    ck_assert_int_ne(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0); /* no buffers */
    a.T = 0;
    ck_assert_int_ne(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "T 0"));
    /* Widths past shared memory: a clear refusal, no launch. */
    void *buf = gk_alloc(1 << 20);
    a.T = 4, a.dqk = 4000, a.dv = 4000;
    a.q = a.k = a.v = buf, a.o = buf, a.lse = buf;
    ck_assert_int_ne(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "shared memory"));
    /* The non-deterministic tensor-core backward without its f32 dQ accumulator. */
    a.dtype = K3RT_BF16, a.dqk = 192, a.dv = 128;
    a.dout = a.dq = a.dk = a.dv_out = buf, a.drow = buf;
    ck_assert_str_eq(mla_attn_path(&a, 1), "tensor-core");
    ck_assert_int_ne(mla_attn_bwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "dq_acc"));
    /* cuDNN asked for where it cannot run: f32, T not a multiple of 128, the max logits. */
    a.kernel = MLA_KERNEL_CUDNN, a.dtype = K3RT_F32;
    ck_assert_int_ne(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "cudnn"));
    a.dtype = K3RT_BF16, a.T = 100;
    ck_assert_int_ne(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "multiple of 128"));
    a.T = 128, a.block_max = buf;
    ck_assert_int_ne(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "report_max_logit"));
    /* Packed documents: fewer than one a row; and cuDNN asked for, which has no mask for
     * them (forward and backward; its message names the plugin's option). */
    a.block_max = NULL, a.B = 2, a.docs = (const int32_t *)buf, a.n_docs = 1;
    ck_assert_int_ne(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "n_docs 1"));
    a.n_docs = 3;
    if (cudnn_usable()) {
        ck_assert_int_ne(mla_attn_fwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
        ck_assert_ptr_nonnull(strstr(err.msg, "doc_offsets"));
        ck_assert_ptr_nonnull(strstr(err.msg, "cuda_kernel"));
        a.deterministic = 0, a.dq_acc = buf;
        ck_assert_int_ne(mla_attn_bwd_cuda(k3rt_stream_native(GK_G), &a, &err), 0);
        ck_assert_ptr_nonnull(strstr(err.msg, "doc_offsets"));
    }
    k3rt_free(GK_DEV, buf);
}
END_TEST
#endif

/* ---- (b) the whole plugin ------------------------------------------------------------------- */

typedef struct pcfg {
    int H, rq, dc, dn, dr, dv, gate;
    int64_t d, B, T;
    const char *kernel; /* the plugin's cuda_kernel for bf16 runs; NULL: the default (auto) */
} pcfg;

static const plugin_entry *load_mla(void) { return tu_plugin("mla"); }

static json_t *pcfg_json(const pcfg *c, int dtype)
{
    json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f}", "heads", c->H, "q_rank",
                          c->rq, "kv_rank", c->dc, "qk_nope_dim", c->dn, "qk_shared_dim", c->dr,
                          "v_dim", c->dv, "output_gate", c->gate, "init_std", 0.15);
    ck_assert_ptr_nonnull(j);
    if (c->kernel && dtype == K3RT_BF16) {
        json_object_set_new(j, "cuda_kernel", json_string(c->kernel));
        /* cuDNN's forward cannot report them. */
        json_object_set_new(j, "report_max_logit", json_boolean(strcmp(c->kernel, "cudnn")));
    }
    return j;
}

static void make_module(rig *m, const pcfg *c, int dtype, int device, k3rt_stream *s, int det)
{
    k3rt_error err = {0};
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype, a.device = device, a.d_model = c->d, a.vocab = 32, a.n_layers = 1;
    a.stream = s, a.seed = 5, a.deterministic = det;
    json_t *j = pcfg_json(c, dtype);
    TU_OK(rig_create(m, load_mla(), j, &a, "test", &err), err);
    json_decref(j);
}

/* Runs forward + backward of module m with the given host (CPU) or device buffers through the
 * host's rig, docs (NULL: none) its doc_offsets on the module's device; poisons what the plugin
 * must write when it is the module under test (poison). */
static void run_module(rig *m, int device, int dtype, const pcfg *c, void *x, void *y, void *dy,
                       void *dx, k3rt_tensor *params, k3rt_tensor *grads, const adocs *d,
                       const void *docs, int poison)
{
    k3rt_error err = {0};
    TU_OK(rig_bind_params(m, params, grads, &err), err);
    TU_OK(rig_alloc_shape(m, c->B, c->T, 0, &err), err);
    if (poison) {
        TU_OK(rig_fill_buffers(m, 0xff, &err), err);
        gk_poison(y, (size_t)(c->B * c->T * c->d) * k3rt_dtype_size(dtype));
        gk_poison(dx, (size_t)(c->B * c->T * c->d) * k3rt_dtype_size(dtype));
    }
    k3rt_fwd_args f;
    memset(&f, 0, sizeof f);
    f.training = 1;
    f.x = k3rt_tensor_view(x, dtype, device, 3, c->B, c->T, c->d, 0);
    f.y = k3rt_tensor_view(y, dtype, device, 3, c->B, c->T, c->d, 0);
    if (docs)
        f.doc_offsets = k3rt_tensor_view((void *)docs, K3RT_I32, device, 1, d->n + 1, 0, 0, 0);
    TU_OK(rig_forward(m, &f, &err), err);
    k3rt_bwd_args b;
    memset(&b, 0, sizeof b);
    b.doc_offsets = f.doc_offsets;
    b.x = f.x, b.dy = k3rt_tensor_view(dy, dtype, device, 3, c->B, c->T, c->d, 0);
    b.dx = k3rt_tensor_view(dx, dtype, device, 3, c->B, c->T, c->d, 0);
    TU_OK(rig_backward(m, &b, &err), err);
    TU_OK(k3rt_stream_sync(m->stream, &err), err);
}

/* The per-head max logits the module reports (f32 [H] on the instance's device). */
static void max_logits(rig *m, double *out, int64_t H)
{
    k3rt_error err = {0};
    k3rt_tensor_sink sink;
    TU_OK(rig_stats(m, &sink, &err), err);
    ck_assert_int_eq(sink.n, 1);
    ck_assert_str_eq(sink.items[0].name, "max_logit");
    const k3rt_tensor *t = &sink.items[0].t;
    ck_assert_int_eq(t->device, m->device);
    ck_assert_int_eq(k3rt_tensor_numel(t), H);
    float *v = malloc((size_t)H * sizeof *v);
    TU_OK(k3rt_memcpy(m->stream, v, K3RT_DEVICE_CPU, t->data, t->device,
                      (size_t)H * sizeof *v, &err), err);
    TU_OK(k3rt_stream_sync(m->stream, &err), err);
    for (int64_t h = 0; h < H; h++)
        out[h] = v[h];
    free(v);
    tensor_sink_free(&sink);
}

/* Host copy of n values as dtype ct. */
static void *host_as(const double *v, int64_t n, int ct)
{
    k3rt_error err = {0};
    void *h = malloc((size_t)(n ? n : 1) * k3rt_dtype_size(ct));
    TU_OK(k3rt_convert(h, ct, v, K3RT_F64, n, &err), err);
    return h;
}

static double *as_double(const void *h, int64_t n, int dt)
{
    k3rt_error err = {0};
    double *x = malloc((size_t)(n ? n : 1) * sizeof *x);
    TU_OK(k3rt_convert(x, K3RT_F64, h, dt, n, &err), err);
    return x;
}

/* The plugin on the device under test against the CPU, docs (no_docs: none) packing the rows. */
static void plugin_case(int dtype, const pcfg *c, const adocs *docs, int det)
{
    k3rt_error err = {0};
    char ctx[240];
    snprintf(ctx, sizeof ctx, "plugin %s H=%d rq=%d dc=%d dn=%d dr=%d dv=%d gate=%d d=%lld "
             "B=%lld T=%lld docs=%d deterministic=%d kernel=%s", k3rt_dtype_name(dtype), c->H,
             c->rq, c->dc, c->dn, c->dr, c->dv, c->gate, (long long)c->d, (long long)c->B,
             (long long)c->T, docs->n, det, c->kernel && dtype == K3RT_BF16 ? c->kernel : "auto");
    /* The CPU reference: f64 for f32 runs, f32 (on bf16-rounded values) for bf16 runs. */
    int ct = dtype == K3RT_BF16 ? K3RT_F32 : K3RT_F64, gt = dtype == K3RT_BF16 ? K3RT_F32 : dtype;
    rig mc, mg;
    make_module(&mc, c, ct, K3RT_DEVICE_CPU, C, det);
    make_module(&mg, c, dtype, GK_DEV, GK_G, det);
    int np = rig_n_params(&mc);
    ck_assert_int_eq(np, rig_n_params(&mg));
    k3rt_tensor *pc = calloc((size_t)np, sizeof *pc), *gc = calloc((size_t)np, sizeof *gc);
    k3rt_tensor *pg = calloc((size_t)np, sizeof *pg), *gg = calloc((size_t)np, sizeof *gg);
    double **g0 = calloc((size_t)np, sizeof *g0);
    for (int i = 0; i < np; i++) {
        const k3rt_param_decl *p = rig_param(&mc, i);
        k3rt_tensor t = k3rt_tensor_view(NULL, K3RT_F64, K3RT_DEVICE_CPU, p->ndim, p->shape[0],
                                         p->shape[1], 0, 0);
        int64_t n = k3rt_tensor_numel(&t);
        double *w = malloc((size_t)n * sizeof *w);
        t.data = w;
        TU_OK(rig_init_param(&mc, i, t, 11, p->name, &err), err);
        /* Norm gains start at 1: move them off it so their use is tested. */
        if (p->ndim == 1)
            for (int64_t e = 0; e < n; e++)
                w[e] += 0.3 * sin((double)e);
        pg[i] = t, pg[i].dtype = dtype, pg[i].device = GK_DEV, pg[i].data = upload(w, n, dtype);
        pc[i] = t, pc[i].dtype = ct, pc[i].data = host_as(w, n, ct);
        g0[i] = randv(n, 0.01); /* small: the f32 rounding of g0 + increment stays far below
                                   the tolerance on the increment */
        gg[i] = t, gg[i].dtype = gt, gg[i].device = GK_DEV, gg[i].data = upload(g0[i], n, gt);
        gc[i] = t, gc[i].dtype = ct, gc[i].data = host_as(g0[i], n, ct);
        free(w);
    }
    int64_t nx = c->B * c->T * c->d;
    double *x = randv(nx, 1.0), *dy = randv(nx, 1.0);
    void *xg = upload(x, nx, dtype), *dyg = upload(dy, nx, dtype);
    size_t xbytes = (size_t)nx * k3rt_dtype_size(dtype), cbytes = (size_t)nx * k3rt_dtype_size(ct);
    void *yg = gk_alloc(xbytes), *dxg = gk_alloc(xbytes);
    void *xc = host_as(x, nx, ct), *dyc = host_as(dy, nx, ct);
    void *yc = malloc(cbytes), *dxc = malloc(cbytes);

    const int32_t *dh = docs->n ? docs->off : NULL;
    void *dd = docs->n ? gk_dev_copy(docs->off, (size_t)(docs->n + 1) * 4) : NULL;
    run_module(&mc, K3RT_DEVICE_CPU, ct, c, xc, yc, dyc, dxc, pc, gc, docs, dh, 0);
    run_module(&mg, GK_DEV, dtype, c, xg, yg, dyg, dxg, pg, gg, docs, dd, 1);

    double tol = tol_of(dtype), worst = 0;
    double *ry = as_double(yc, nx, ct), *gy = gk_get(yg, dtype, nx);
    double *rdx = as_double(dxc, nx, ct), *gdx = gk_get(dxg, dtype, nx);
    double e = expect_close("y", ctx, ry, gy, nx, tol);
    worst = e > worst ? e : worst;
    e = expect_close("dx", ctx, rdx, gdx, nx, tol);
    worst = e > worst ? e : worst;
    for (int i = 0; i < np; i++) {
        const char *name = rig_param(&mc, i)->name;
        int64_t n = k3rt_tensor_numel(&pc[i]);
        double *rg = as_double(gc[i].data, n, ct), *dg = gk_get(gg[i].data, gt, n);
        for (int64_t k = 0; k < n; k++)
            rg[k] -= g0[i][k], dg[k] -= g0[i][k];
        char what[96];
        snprintf(what, sizeof what, "grad %s", name);
        e = expect_close(what, ctx, rg, dg, n, tol);
        worst = e > worst ? e : worst;
        free(rg), free(dg);
    }
    double *mlc = malloc((size_t)c->H * sizeof *mlc), *mlg = malloc((size_t)c->H * sizeof *mlg);
    double em = NAN;
    if (c->kernel && dtype == K3RT_BF16 && !strcmp(c->kernel, "cudnn")) {
        /* report_max_logit = false: no statistic at all. */
        k3rt_tensor_sink sink;
        TU_OK(rig_stats(&mg, &sink, &err), err);
        if (sink.n != 0)
            tu_fail_later("%s: %d statistics reported under report_max_logit = false", ctx,
                          sink.n);
        tensor_sink_free(&sink);
    } else {
        max_logits(&mc, mlc, c->H);
        max_logits(&mg, mlg, c->H);
        em = expect_log_close("per-head max logit", ctx, mlc, mlg, c->H, tol);
        /* After reset_stats nothing is reported but -inf. */
        rig_reset_stats(&mg);
        max_logits(&mg, mlg, c->H);
        if (!(isinf(mlg[0]) && mlg[0] < 0))
            tu_fail_later("%s max logit: %g after reset_stats, not -inf", ctx, mlg[0]);
    }
    if (isnan(em))
        printf("%s: worst relative rms %.2e over y, dx and %d gradients; no max logits "
               "(report_max_logit off)\n", ctx, worst, np);
    else
        printf("%s: worst relative rms %.2e over y, dx and %d gradients; max logit %.2e\n",
               ctx, worst, np, em);
    /* Boundaries inside a row: the CPU without them is far from the result. */
    if (docs->n > c->B) {
        run_module(&mc, K3RT_DEVICE_CPU, ct, c, xc, yc, dyc, dxc, pc, gc, &no_docs, NULL, 0);
        double *uy = as_double(yc, nx, ct);
        expect_far("y", ctx, uy, gy, nx, tol);
        free(uy);
    }

    free(ry), free(gy), free(rdx), free(gdx), free(mlc), free(mlg);
    for (int i = 0; i < np; i++) {
        k3rt_free(GK_DEV, pg[i].data), k3rt_free(GK_DEV, gg[i].data);
        free(pc[i].data), free(gc[i].data), free(g0[i]);
    }
    free(pc), free(gc), free(pg), free(gg), free(g0);
    k3rt_free(GK_DEV, xg), k3rt_free(GK_DEV, dyg), k3rt_free(GK_DEV, yg), k3rt_free(GK_DEV, dxg);
    k3rt_free(GK_DEV, dd);
    free(x), free(dy), free(xc), free(dyc), free(yc), free(dxc);
    rig_destroy(&mc);
    rig_destroy(&mg);
}

/* Whether the plugin's cuDNN configurations can run: on a GPU where cuDNN's fused attention
 * loads (never in harness mode, GK_DEV the CPU). */
static int plugin_cudnn_usable(void)
{
#ifdef K3RT_HAVE_CUDA
    return GK_DEV != K3RT_DEVICE_CPU && cudnn_usable();
#else
    return 0; /* a build without CUDA: the test skips before this */
#endif
}

/* c in f32 and, on a GPU, in bf16 (the tensor-core backward in both of its schedules at MLA's
 * widths). */
static void plugin_dtypes(const pcfg *c, const adocs *docs)
{
    plugin_case(K3RT_F32, c, docs, 0);
    if (GK_DEV == K3RT_DEVICE_CPU) /* harness mode: the CPU path has no bf16 */
        return;
    plugin_case(K3RT_BF16, c, docs, 0);
    if (c->dv == 128)
        plugin_case(K3RT_BF16, c, docs, 1);
}

START_TEST(plugin_vs_cpu)
{
    /* fp32-kernel widths (with and without q low-rank, shared key, gate), then MLA's widths. */
    const pcfg cfgs[] = {
        {2, 0, 24, 16, 8, 16, 1, 32, 2, 37, NULL},
        {3, 20, 16, 8, 0, 8, 0, 24, 1, 50, NULL},
        {2, 0, 64, 128, 64, 128, 1, 64, 2, 150, NULL},
        {2, 48, 32, 128, 0, 128, 1, 64, 1, 100, NULL},
        {2, 0, 64, 128, 64, 128, 1, 64, 2, 128, "cudnn"}, /* skipped without cuDNN */
        {2, 0, 64, 128, 64, 128, 1, 64, 2, 256, NULL}, /* auto: cuDNN's backward, if usable */
    };
    int cudnn = plugin_cudnn_usable();
    for (size_t i = 0; i < sizeof cfgs / sizeof cfgs[0]; i++)
        if (!(small_only && (i == 1 || i == 3)) && !(cfgs[i].kernel && !cudnn))
            plugin_dtypes(&cfgs[i], &no_docs);
    tu_expect_no_failures();
}
END_TEST

/* Packed documents through the whole plugin, as in the core's cases: 7 documents over 3 rows
 * (1-token ones at a row's start) at the fp32 kernels' widths; one document on one row; at
 * MLA's widths (tensor cores for bf16) a boundary on the 128-row tile edge, and at T = 256,
 * where cuDNN would take the shape, 7 documents with one of 1 token (auto runs k3rt's
 * kernels). */
START_TEST(plugin_documents)
{
    static const struct {
        pcfg c;
        adocs d;
    } cases[] = {
        {{2, 0, 24, 16, 8, 16, 1, 32, 3, 37, NULL}, {7, {0, 1, 20, 37, 74, 80, 100, 111}}},
        {{3, 20, 16, 8, 0, 8, 0, 24, 1, 50, NULL}, {1, {0, 50}}},
        {{2, 0, 64, 128, 64, 128, 1, 64, 2, 150, NULL}, {3, {0, 128, 150, 300}}},
        {{2, 0, 64, 128, 64, 128, 1, 64, 2, 256, NULL}, {7, {0, 32, 33, 200, 256, 384, 500, 512}}},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        if (!(small_only && cases[i].c.T > 200))
            plugin_dtypes(&cases[i].c, &cases[i].d);
    tu_expect_no_failures();
}
END_TEST

/* Parameters and gradients of m (dtype, gdtype; contents left as allocated) on device 0, bound
 * with the buffers of shape (B, T). free_device_params frees them. */
static void bind_device_params(rig *m, int dtype, int gdtype, int64_t B, int64_t T)
{
    k3rt_error err = {0};
    int np = rig_n_params(m);
    k3rt_tensor *p = calloc((size_t)np, sizeof *p), *g = calloc((size_t)np, sizeof *g);
    for (int i = 0; i < np; i++) {
        const k3rt_param_decl *d = rig_param(m, i);
        p[i] = k3rt_tensor_view(NULL, dtype, 0, d->ndim, d->shape[0], d->shape[1], 0, 0);
        p[i].data = gk_alloc(k3rt_tensor_bytes(&p[i]));
        g[i] = p[i], g[i].dtype = gdtype, g[i].data = gk_alloc(k3rt_tensor_bytes(&g[i]));
    }
    TU_OK(rig_bind_params(m, p, g, &err), err);
    TU_OK(rig_alloc_shape(m, B, T, 0, &err), err);
}

static void free_device_params(rig *m)
{
    for (int i = 0; i < rig_n_params(m); i++)
        k3rt_free(0, m->params[i].data), k3rt_free(0, m->grads[i].data);
    free(m->params), free(m->grads);
}

START_TEST(plugin_refuses)
{
    const plugin_entry *e = load_mla();
    ck_assert_msg(e->desc.caps & K3RT_CAP_CUDA, "the plugin was built without its CUDA path");
    k3rt_error err = {0};
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_F64, a.device = 0, a.d_model = 16, a.n_layers = 1, a.stream = GK_G;
    rig m;
    json_t *j = json_pack("{s:i}", "heads", 2);
    ck_assert_int_ne(rig_create(&m, e, j, &a, "test", &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "f32 or bf16"));
    json_decref(j);

    /* A CUDA instance handed host tensors: the host refuses before anything launches. */
    const pcfg c = {2, 0, 8, 4, 2, 4, 1, 16, 1, 5, NULL};
    make_module(&m, &c, K3RT_F32, 0, GK_G, 0);
    bind_device_params(&m, K3RT_F32, K3RT_F32, 1, 5);
    float hx[80] = {0};
    k3rt_fwd_args f;
    memset(&f, 0, sizeof f);
    f.x = k3rt_tensor_view(hx, K3RT_F32, K3RT_DEVICE_CPU, 3, 1, 5, 16, 0);
    f.y = f.x;
    ck_assert_int_ne(rig_forward(&m, &f, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "on cuda:0, got f32 [1, 5, 16] on the CPU"));
    free_device_params(&m);
    rig_destroy(&m);

#ifdef K3RT_HAVE_CUDA
    /* cuda_kernel "cudnn" with packed documents: refused at the call, naming the option. */
    if (cudnn_usable()) {
        const pcfg cd = {2, 0, 8, 8, 8, 8, 1, 16, 1, 128, "cudnn"};
        make_module(&m, &cd, K3RT_BF16, 0, GK_G, 0);
        bind_device_params(&m, K3RT_BF16, K3RT_F32, 1, 128);
        const int32_t off[3] = {0, 50, 128};
        void *x = gk_alloc(128 * 16 * 2), *y = gk_alloc(128 * 16 * 2);
        void *docs = gk_dev_copy(off, sizeof off);
        f.x = k3rt_tensor_view(x, K3RT_BF16, 0, 3, 1, 128, 16, 0);
        f.y = k3rt_tensor_view(y, K3RT_BF16, 0, 3, 1, 128, 16, 0);
        f.doc_offsets = k3rt_tensor_view(docs, K3RT_I32, 0, 1, 3, 0, 0, 0);
        ck_assert_int_ne(rig_forward(&m, &f, &err), 0);
        ck_assert_ptr_nonnull(strstr(err.msg, "doc_offsets"));
        ck_assert_ptr_nonnull(strstr(err.msg, "cuda_kernel"));
        free_device_params(&m);
        rig_destroy(&m);
        k3rt_free(0, x), k3rt_free(0, y), k3rt_free(0, docs);
    }
#endif
}
END_TEST

/* Two cases, so a run can pick one (CK_RUN_CASE=core or plugin). In harness mode (GK_DEV the
 * CPU) only the plugin's comparisons, which run there. */
static Suite *suite(void)
{
    Suite *s = suite_create("mla_cuda");
    TCase *core = tcase_create("core"), *plugin = tcase_create("plugin");
    tcase_set_timeout(core, 300);
    tcase_set_timeout(plugin, 300);
    int gpu = GK_DEV != K3RT_DEVICE_CPU;
#ifdef K3RT_HAVE_CUDA
    if (gpu) {
        tcase_add_test(core, attention_core_vs_cpu);
        tcase_add_test(core, attention_core_documents);
        tcase_add_test(core, attention_core_refuses);
    }
#endif
    tcase_add_test(plugin, plugin_vs_cpu);
    tcase_add_test(plugin, plugin_documents);
    if (gpu)
        tcase_add_test(plugin, plugin_refuses);
    suite_add_tcase(s, core);
    suite_add_tcase(s, plugin);
    return s;
}

int main(void)
{
    const char *small = getenv("K3RT_MLA_TEST_SMALL");
    small_only = small && *small && strcmp(small, "0") != 0;
    C = tu_cpu_stream(2);
    int rc = gk_main(suite);
    k3rt_stream_destroy(C);
    return rc;
}
