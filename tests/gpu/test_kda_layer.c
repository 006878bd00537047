/* The kda plugin's whole layer on CUDA against the same plugin on the CPU, through the host's
 * rig as a run drives it.
 *  (a) CPU, always (no GPU needed): packed sequences. A call over B rows with doc_offsets must
 *      equal one call per document (B = 1): a row's first document continues from the row's
 *      state_in and x_prefix, the others start from zero, the row's last document gives its
 *      state_out; y, dx, d_x_prefix, d_state_in, the summed parameter gradients and the
 *      context-parallel summary (a row's map is its last document's, M = 0 unless that
 *      document starts the row). f64, to 1e-10.
 *  (b) CUDA: forward, backward and cp_summary in f32 and bf16 against the CPU in f64 on the
 *      values the device holds (bf16 inputs and weights rounded first; states f32): y,
 *      state_out, dx, d_x_prefix, d_state_in, the increment of every parameter gradient (they
 *      accumulate onto random values) and the summary's m and b; cp_compose once. Shapes: heads
 *      1 to 8, head_dim 32 / 64 / 128, T 1 to 300, GVA, low-rank and full-rank gates, with and
 *      without state and x_prefix, 1, 3 and 7 documents. Outputs, saved parts and workspace
 *      are poisoned (NaN bytes) first; every element must be finite. Error = rms(ref - x) /
 *      rms(ref) (or max |ref - x| <= 1e-6, fla's assert_close). Tolerances: f32 1e-5; bf16
 *      spec §9 (fla's test_chunk): y and state_out 5e-3 (o, ht), activation and weight gradients
 *      and d_state_in 8e-3 (dq, dk, dv, dh0), the forget gate's and beta's 2e-2 (dg, dbeta),
 *      the summary 8e-3. Two runs of one case give the same bits. create() refuses what the
 *      CUDA path cannot run, naming the option.
 * Exit: 1 when a check fails; otherwise 77 (skipped) without a CUDA device, 0 with one. Runs
 * without fork (CUDA does not survive a fork). K3RT_KDA_TEST_SMALL=1 keeps the shapes with
 * T <= 100 (for compute-sanitizer). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plugin/rig.h"
#include "plugin/registry.h"
#include "plugin/sinks.h"

static k3rt_stream *G;  /* CUDA stream on device 0 (NULL without a GPU) */
static k3rt_stream *C;  /* CPU stream of the reference */
static uint64_t seed_next = 91;
static int small_only;

/* ---- failures are collected so one run reports every case --------------------------------- */

static int n_failed;
static char first_failure[600];

static void record_failure(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void record_failure(const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("FAILED: %s\n", msg);
    if (n_failed++ == 0)
        snprintf(first_failure, sizeof first_failure, "%s", msg);
}

static void expect_no_failures(void)
{
    int n = n_failed;
    n_failed = 0; /* each test reports its own */
    ck_assert_msg(n == 0, "%d checks failed; the first: %s", n, first_failure);
}

/* rms(ref - got) / rms(ref), 0 when max |ref - got| <= 1e-6 (fla's assert_close); INFINITY when
 * an element is not finite. */
static double err_of(const double *ref, const double *got, int64_t n)
{
    double mx = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i]))
            return INFINITY;
        mx = fmax(mx, fabs(ref[i] - got[i]));
    }
    return mx <= 1e-6 ? 0 : tu_rel_rms(ref, got, n);
}

/* ---- host values, device buffers ---------------------------------------------------------- */

static size_t nbytes(int dtype, int64_t n)
{
    return (size_t)(n > 0 ? n : 1) * k3rt_dtype_size(dtype);
}

static double *dalloc_h(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    ck_assert_ptr_nonnull(p);
    return p;
}

static double *randv(int64_t n, double scale)
{
    double *v = dalloc_h(n);
    tu_randn(v, n, scale, seed_next++);
    return v;
}

static void round_to(double *x, int64_t n, int dtype)
{
    k3rt_error err = {0};
    void *tmp = malloc(nbytes(dtype, n));
    TU_OK(k3rt_convert(tmp, dtype, x, K3RT_F64, n, &err), err);
    TU_OK(k3rt_convert(x, K3RT_F64, tmp, dtype, n, &err), err);
    free(tmp);
}

/* A buffer of n elements of dtype on device (CPU or 0) holding v, or poisoned when v is NULL. */
static void *buf_of(int device, int dtype, const double *v, int64_t n)
{
    k3rt_error err = {0};
    size_t bytes = nbytes(dtype, n);
    void *h = malloc(bytes);
    ck_assert_ptr_nonnull(h);
    if (v)
        TU_OK(k3rt_convert(h, dtype, v, K3RT_F64, n, &err), err);
    else
        memset(h, 0xff, bytes);
    if (device == K3RT_DEVICE_CPU)
        return h;
    void *d = k3rt_alloc(device, bytes, &err);
    ck_assert_msg(d != NULL, "k3rt_alloc(%zu): %s", bytes, err.msg);
    TU_OK(k3rt_memcpy(G, d, device, h, K3RT_DEVICE_CPU, bytes, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    free(h);
    return d;
}

static double *values_of(int device, int dtype, const void *p, int64_t n)
{
    k3rt_error err = {0};
    size_t bytes = nbytes(dtype, n);
    const void *h = p;
    void *tmp = NULL;
    if (device != K3RT_DEVICE_CPU) {
        tmp = malloc(bytes);
        TU_OK(k3rt_memcpy(G, tmp, K3RT_DEVICE_CPU, p, device, bytes, &err), err);
        TU_OK(k3rt_stream_sync(G, &err), err);
        h = tmp;
    }
    double *x = dalloc_h(n);
    TU_OK(k3rt_convert(x, K3RT_F64, h, dtype, n, &err), err);
    free(tmp);
    return x;
}

static void buf_free(int device, void *p)
{
    if (!p)
        return;
    if (device == K3RT_DEVICE_CPU)
        free(p);
    else
        k3rt_free(device, p);
}

/* ---- one layer configuration and its inputs ----------------------------------------------- */

typedef struct lcase {
    int H, HV, D, W, rf, rg;   /* rf < 0: forget_rank none (= head_dim) */
    int64_t d, B, T;
    int state, prefix;         /* state_in + d_state_out; x_prefix + d_x_prefix */
    int n_docs;                /* 0: none; else lens[] over the B*T tokens */
    int64_t lens[8];
    int summary;               /* also cp_summary */
} lcase;

static json_t *cfg_of(const lcase *c)
{
    json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:i, s:f, s:i}", "heads", c->H, "value_heads",
                          c->HV, "head_dim", c->D, "conv_width", c->W, "gate_rank", c->rg,
                          "init_std", 0.15, "max_documents", c->n_docs ? c->n_docs : 1);
    ck_assert_ptr_nonnull(j);
    if (c->rf >= 0)
        json_object_set_new(j, "forget_rank", json_integer(c->rf));
    return j;
}

static void case_str(const lcase *c, char *buf, size_t len)
{
    int at = snprintf(buf, len, "H=%d HV=%d D=%d W=%d rf=%d rg=%d d=%lld B=%lld T=%lld%s%s", c->H,
                      c->HV, c->D, c->W, c->rf, c->rg, (long long)c->d, (long long)c->B,
                      (long long)c->T, c->state ? " state" : "", c->prefix ? " x_prefix" : "");
    if (c->n_docs)
        at += snprintf(buf + at, len - (size_t)at, " docs=%d", c->n_docs);
}

/* Host values of every input, shared by the runs of one comparison. */
typedef struct linputs {
    int np;
    double **p, **g0;          /* parameters and the gradients they start from */
    int64_t *pn;
    double *x, *dy, *xp, *s_in, *ds_out;
    int32_t *docs;             /* [n_docs + 1] or NULL */
} linputs;

typedef struct lout {
    double *y, *dx, *dxp, *s_out, *ds_in, *sm, *sb;
    double **dg;               /* parameter gradient increments */
} lout;

static int64_t n_state(const lcase *c) { return c->B * c->HV * c->D * c->D; }
static int64_t n_act(const lcase *c) { return c->B * c->T * c->d; }
static int64_t n_pre(const lcase *c) { return c->B * (c->W - 1) * c->d; }

static void make_rig(rig *r, const lcase *c, int device, int dtype)
{
    k3rt_error err = {0};
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype, a.device = device, a.d_model = c->d, a.vocab = 32, a.n_layers = 1;
    a.stream = device == K3RT_DEVICE_CPU ? C : G, a.seed = 5, a.deterministic = 1;
    json_t *j = cfg_of(c);
    TU_OK(rig_create(r, tu_plugin("kda"), j, &a, "test", &err), err);
    json_decref(j);
}

/* Inputs for c; values rounded to what `dtype` holds (f32 for states and gradients). */
static void inputs_make(linputs *in, const lcase *c, int dtype)
{
    k3rt_error err = {0};
    memset(in, 0, sizeof *in);
    rig r;
    make_rig(&r, c, K3RT_DEVICE_CPU, K3RT_F64);
    in->np = rig_n_params(&r);
    in->p = calloc((size_t)in->np, sizeof *in->p);
    in->g0 = calloc((size_t)in->np, sizeof *in->g0);
    in->pn = calloc((size_t)in->np, sizeof *in->pn);
    for (int i = 0; i < in->np; i++) {
        const k3rt_param_decl *pd = rig_param(&r, i);
        k3rt_tensor t = k3rt_tensor_view(NULL, K3RT_F64, K3RT_DEVICE_CPU, pd->ndim, pd->shape[0],
                                         pd->shape[1], 0, 0);
        int64_t n = k3rt_tensor_numel(&t);
        in->pn[i] = n;
        in->p[i] = dalloc_h(n);
        t.data = in->p[i];
        TU_OK(rig_init_param(&r, i, t, 11, pd->name, &err), err);
        if (pd->ndim == 1) /* move A_log, dt_bias and the norm gain off their init */
            for (int64_t e = 0; e < n; e++)
                in->p[i][e] += 0.3 * sin(1.0 + (double)e);
        round_to(in->p[i], n, dtype);
        in->g0[i] = randv(n, 0.01);
        round_to(in->g0[i], n, K3RT_F32);
    }
    rig_destroy(&r);
    in->x = randv(n_act(c), 1.0), in->dy = randv(n_act(c), 1.0);
    round_to(in->x, n_act(c), dtype), round_to(in->dy, n_act(c), dtype);
    if (c->prefix) {
        in->xp = randv(n_pre(c), 1.0);
        round_to(in->xp, n_pre(c), dtype);
    }
    if (c->state) {
        in->s_in = randv(n_state(c), 0.5), in->ds_out = randv(n_state(c), 1.0);
        round_to(in->s_in, n_state(c), K3RT_F32), round_to(in->ds_out, n_state(c), K3RT_F32);
    }
    if (c->n_docs) {
        in->docs = calloc((size_t)c->n_docs + 1, sizeof *in->docs);
        for (int j = 0; j < c->n_docs; j++)
            in->docs[j + 1] = in->docs[j] + (int32_t)c->lens[j];
        ck_assert_int_eq(in->docs[c->n_docs], c->B * c->T);
    }
}

static void inputs_free(linputs *in)
{
    for (int i = 0; i < in->np; i++)
        free(in->p[i]), free(in->g0[i]);
    free(in->p), free(in->g0), free(in->pn);
    free(in->x), free(in->dy), free(in->xp), free(in->s_in), free(in->ds_out), free(in->docs);
}

static void out_free(lout *o, int np)
{
    free(o->y), free(o->dx), free(o->dxp), free(o->s_out), free(o->ds_in), free(o->sm);
    free(o->sb);
    for (int i = 0; o->dg && i < np; i++)
        free(o->dg[i]);
    free(o->dg);
    memset(o, 0, sizeof *o);
}

/* Forward + backward (+ cp_summary) of c on device in dtype; outputs poisoned first. */
static void run_case(const lcase *c, const linputs *in, int device, int dtype, lout *o)
{
    k3rt_error err = {0};
    memset(o, 0, sizeof *o);
    rig r;
    make_rig(&r, c, device, dtype);
    const int np = rig_n_params(&r);
    ck_assert_int_eq(np, in->np);
    const int gt = dtype == K3RT_F64 ? K3RT_F64 : K3RT_F32;
    const int st = gt; /* the state's dtype: f64 on the CPU reference, f32 on CUDA */
    k3rt_tensor *P = calloc((size_t)np, sizeof *P), *Gd = calloc((size_t)np, sizeof *Gd);
    for (int i = 0; i < np; i++) {
        const k3rt_param_decl *pd = rig_param(&r, i);
        P[i] = k3rt_tensor_view(buf_of(device, dtype, in->p[i], in->pn[i]), dtype, device,
                                pd->ndim, pd->shape[0], pd->shape[1], 0, 0);
        Gd[i] = k3rt_tensor_view(buf_of(device, gt, in->g0[i], in->pn[i]), gt, device, pd->ndim,
                                 pd->shape[0], pd->shape[1], 0, 0);
    }
    TU_OK(rig_bind_params(&r, P, Gd, &err), err);
    TU_OK(rig_alloc_shape(&r, c->B, c->T, 0, &err), err);
    TU_OK(rig_fill_buffers(&r, 0xff, &err), err);
    const int64_t na = n_act(c), ns = n_state(c), npre = n_pre(c);
    void *x = buf_of(device, dtype, in->x, na), *dy = buf_of(device, dtype, in->dy, na);
    void *y = buf_of(device, dtype, NULL, na), *dx = buf_of(device, dtype, NULL, na);
    void *xp = c->prefix ? buf_of(device, dtype, in->xp, npre) : NULL;
    void *dxp = c->prefix ? buf_of(device, dtype, NULL, npre) : NULL;
    void *s_in = c->state ? buf_of(device, st, in->s_in, ns) : NULL;
    void *ds_out = c->state ? buf_of(device, st, in->ds_out, ns) : NULL;
    void *s_out = buf_of(device, st, NULL, ns), *ds_in = c->state ? buf_of(device, st, NULL, ns)
                                                                  : NULL;
    void *docs = NULL;
    if (c->n_docs) {
        size_t db = (size_t)(c->n_docs + 1) * sizeof(int32_t);
        docs = device == K3RT_DEVICE_CPU ? malloc(db) : k3rt_alloc(device, db, &err);
        ck_assert_ptr_nonnull(docs);
        TU_OK(k3rt_memcpy(device == K3RT_DEVICE_CPU ? C : G, docs, device, in->docs,
                          K3RT_DEVICE_CPU, db, &err), err);
    }
    k3rt_tensor tdocs = c->n_docs ? k3rt_tensor_view(docs, K3RT_I32, device, 1, c->n_docs + 1,
                                                     0, 0, 0)
                                  : (k3rt_tensor){0};
#define ACT(p) k3rt_tensor_view((p), dtype, device, 3, c->B, c->T, c->d, 0)
#define PRE(p) k3rt_tensor_view((p), dtype, device, 3, c->B, c->W - 1, c->d, 0)
#define STATE(p) k3rt_tensor_view((p), st, device, 4, c->B, c->HV, c->D, c->D)
    k3rt_fwd_args f;
    memset(&f, 0, sizeof f);
    f.training = 1;
    f.x = ACT(x), f.y = ACT(y), f.doc_offsets = tdocs;
    f.state_out = STATE(s_out);
    if (c->state)
        f.state_in = STATE(s_in);
    if (c->prefix)
        f.x_prefix = PRE(xp);
    TU_OK(rig_forward(&r, &f, &err), err);
    k3rt_bwd_args b;
    memset(&b, 0, sizeof b);
    b.x = f.x, b.dy = ACT(dy), b.dx = ACT(dx), b.doc_offsets = tdocs;
    if (c->state) {
        b.state_in = f.state_in;
        b.d_state_out = STATE(ds_out);
        b.d_state_in = STATE(ds_in);
    }
    if (c->prefix)
        b.x_prefix = f.x_prefix, b.d_x_prefix = PRE(dxp);
    TU_OK(rig_backward(&r, &b, &err), err);
    TU_OK(k3rt_stream_sync(r.stream, &err), err);
    o->y = values_of(device, dtype, y, na), o->dx = values_of(device, dtype, dx, na);
    o->s_out = values_of(device, st, s_out, ns);
    if (c->state)
        o->ds_in = values_of(device, st, ds_in, ns);
    if (c->prefix)
        o->dxp = values_of(device, dtype, dxp, npre);
    o->dg = calloc((size_t)np, sizeof *o->dg);
    for (int i = 0; i < np; i++) {
        o->dg[i] = values_of(device, gt, Gd[i].data, in->pn[i]);
        for (int64_t e = 0; e < in->pn[i]; e++)
            o->dg[i][e] -= in->g0[i][e];
    }
    if (c->summary) {
        const int64_t nm = c->B * c->HV * c->D * c->D;
        void *sm = buf_of(device, st, NULL, nm), *sb = buf_of(device, st, NULL, ns);
        k3rt_fwd_args s;
        memset(&s, 0, sizeof s);
        s.x = f.x, s.doc_offsets = tdocs, s.x_prefix = f.x_prefix;
        TU_OK(rig_cp_summary(&r, &s, STATE(sm), STATE(sb), &err), err);
        TU_OK(k3rt_stream_sync(r.stream, &err), err);
        o->sm = values_of(device, st, sm, nm), o->sb = values_of(device, st, sb, ns);
        buf_free(device, sm), buf_free(device, sb);
    }
#undef ACT
#undef PRE
#undef STATE
    void *bufs[] = {x, dy, y, dx, xp, dxp, s_in, ds_out, s_out, ds_in, docs};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++)
        buf_free(device, bufs[i]);
    for (int i = 0; i < np; i++)
        buf_free(device, P[i].data), buf_free(device, Gd[i].data);
    free(P), free(Gd);
    rig_destroy(&r);
}

/* ---- (a) CPU: documents ------------------------------------------------------------------- */

static void expect_close_abs(const char *what, const char *ctx, const double *ref,
                             const double *got, int64_t n, double tol)
{
    double e = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        if (!isfinite(got[i])) {
            record_failure("%s %s: element %lld is %g: not written", ctx, what, (long long)i,
                           got[i]);
            return;
        }
        e = fmax(e, fabs(ref[i] - got[i]));
        s = fmax(s, fabs(ref[i]));
    }
    if (!(e <= tol * (s > 1 ? s : 1)))
        record_failure("%s %s: max |ref - x| = %.3g (scale %.3g) > %.0e", ctx, what, e, s, tol);
}

static void documents_case(const lcase *c)
{
    char ctx[200];
    case_str(c, ctx, sizeof ctx);
    linputs in;
    inputs_make(&in, c, K3RT_F64);
    lout packed;
    run_case(c, &in, K3RT_DEVICE_CPU, K3RT_F64, &packed);
    const int64_t d = c->d, T = c->T, W1 = c->W - 1, HVD = c->HV * c->D * c->D;
    double **dg = calloc((size_t)in.np, sizeof *dg);
    for (int i = 0; i < in.np; i++)
        dg[i] = dalloc_h(in.pn[i]);
    for (int j = 0; j < c->n_docs; j++) {
        int64_t t0 = in.docs[j], len = in.docs[j + 1] - t0, row = t0 / T;
        int first = t0 % T == 0, last = (t0 + len) % T == 0;
        lcase one = *c;
        one.B = 1, one.T = len, one.n_docs = 0;
        one.prefix = c->prefix && first;
        one.state = c->state && first; /* state_in and d_state_out travel together in run_case */
        linputs di = in;
        di.docs = NULL;
        di.x = in.x + t0 * d, di.dy = in.dy + t0 * d;
        di.xp = one.prefix ? in.xp + row * W1 * d : NULL;
        double *zeros = dalloc_h(HVD);
        di.s_in = one.state ? in.s_in + row * HVD : NULL;
        /* the row's d_state_out reaches its last document; a first document that is not also
         * the last gets zero there */
        di.ds_out = one.state ? (last ? in.ds_out + row * HVD : zeros) : NULL;
        if (!one.state && c->state && last) {
            /* no state_in: d_state_out alone cannot be given through run_case, so such a
             * document is checked through its forward only and its gradient of the final
             * state is folded in by giving it a zero state_in */
            one.state = 1;
            di.s_in = zeros;
            di.ds_out = in.ds_out + row * HVD;
        }
        lout o;
        run_case(&one, &di, K3RT_DEVICE_CPU, K3RT_F64, &o);
        char what[64];
        snprintf(what, sizeof what, "y of document %d", j);
        expect_close_abs(what, ctx, o.y, packed.y + t0 * d, len * d, 1e-10);
        snprintf(what, sizeof what, "dx of document %d", j);
        expect_close_abs(what, ctx, o.dx, packed.dx + t0 * d, len * d, 1e-10);
        if (last) {
            snprintf(what, sizeof what, "state_out of row %lld", (long long)row);
            expect_close_abs(what, ctx, o.s_out, packed.s_out + row * HVD, HVD, 1e-10);
        }
        if (first && c->state) {
            snprintf(what, sizeof what, "d_state_in of row %lld", (long long)row);
            expect_close_abs(what, ctx, o.ds_in, packed.ds_in + row * HVD, HVD, 1e-10);
        }
        if (first && c->prefix) {
            snprintf(what, sizeof what, "d_x_prefix of row %lld", (long long)row);
            expect_close_abs(what, ctx, o.dxp, packed.dxp + row * W1 * d, W1 * d, 1e-10);
        }
        if (last && c->summary) {
            const int64_t nm = HVD; /* dim_k = dim_v */
            double *m = o.sm;
            if (!first)
                memset(m, 0, (size_t)nm * sizeof *m);
            snprintf(what, sizeof what, "summary m of row %lld", (long long)row);
            expect_close_abs(what, ctx, m, packed.sm + row * nm, nm, 1e-10);
            snprintf(what, sizeof what, "summary b of row %lld", (long long)row);
            expect_close_abs(what, ctx, o.sb, packed.sb + row * HVD, HVD, 1e-10);
        }
        for (int i = 0; i < in.np; i++)
            for (int64_t e = 0; e < in.pn[i]; e++)
                dg[i][e] += o.dg[i][e];
        out_free(&o, in.np);
        free(zeros);
    }
    for (int i = 0; i < in.np; i++) {
        char what[64];
        snprintf(what, sizeof what, "gradient of parameter %d", i);
        expect_close_abs(what, ctx, dg[i], packed.dg[i], in.pn[i], 1e-10);
        free(dg[i]);
    }
    free(dg);
    /* and the documents matter: the same call without them differs */
    lcase whole = *c;
    whole.n_docs = 0;
    linputs wi = in;
    wi.docs = NULL;
    lout o;
    run_case(&whole, &wi, K3RT_DEVICE_CPU, K3RT_F64, &o);
    double diff = 0;
    for (int64_t e = 0; e < n_act(c); e++)
        diff = fmax(diff, fabs(o.y[e] - packed.y[e]));
    if (!(diff > 1e-6))
        record_failure("%s: y without doc_offsets equals y with them (max diff %.3g)", ctx, diff);
    printf("documents (CPU f64) %s: per-document runs agree; without the offsets y moves by "
           "%.3g\n", ctx, diff);
    out_free(&o, in.np);
    out_free(&packed, in.np);
    inputs_free(&in);
}

START_TEST(cpu_documents)
{
    n_failed = 0;
    /* B = 2, T = 13: row 0 = 5 + 8 tokens, row 1 = 1 + 6 + 6; chunk 4 on the CPU */
    lcase a = {2, 4, 6, 4, 3, 0, 16, 2, 13, 1, 1, 5, {5, 8, 1, 6, 6}, 1};
    /* one row of three documents, low-rank output gate, no state, no prefix */
    lcase b = {1, 1, 8, 3, -1, 4, 12, 1, 20, 0, 0, 3, {2, 9, 9}, 1};
    /* the CUDA checks' multi-document shapes: documents of several chunks (chunk 32) */
    lcase c3 = {3, 3, 32, 3, 0, 0, 48, 2, 100, 1, 1, 3, {37, 63, 100}, 1};
    lcase c7 = {8, 8, 64, 4, -1, 0, 128, 1, 300, 1, 1, 7, {1, 63, 2, 65, 128, 7, 34}, 1};
    documents_case(&a);
    documents_case(&b);
    documents_case(&c3);
    documents_case(&c7);
    expect_no_failures();
}
END_TEST

/* ---- (b) CUDA against the CPU ------------------------------------------------------------- */

enum { TOL_OUT, TOL_GRAD, TOL_GATE };

static double tol_of(int dtype, int cls)
{
    if (dtype != K3RT_BF16)
        return 1e-5;
    return cls == TOL_OUT ? 5e-3 : cls == TOL_GRAD ? 8e-3 : 2e-2;
}

/* Tolerance class of a parameter gradient by name. */
static int grad_class(const char *name)
{
    static const char *const gate[] = {"f_a_proj", "f_b_proj", "f_proj", "b_proj", "A_log",
                                       "dt_bias"};
    for (size_t i = 0; i < sizeof gate / sizeof gate[0]; i++)
        if (!strncmp(name, gate[i], strlen(gate[i])))
            return TOL_GATE;
    return TOL_GRAD;
}

static double check(const char *what, const char *ctx, int dtype, int cls, const double *ref,
                    const double *got, int64_t n, double *worst)
{
    double e = err_of(ref, got, n), tol = tol_of(dtype, cls);
    if (!(e <= tol))
        record_failure("%s %s %s: relative rms error %.3g > %.0e", k3rt_dtype_name(dtype), ctx,
                       what, e, tol);
    if (e > *worst)
        *worst = e;
    return e;
}

static void gpu_case(const lcase *c, int dtype, int determinism)
{
    char ctx[200];
    case_str(c, ctx, sizeof ctx);
    linputs in;
    inputs_make(&in, c, dtype);
    lout ref, got;
    run_case(c, &in, K3RT_DEVICE_CPU, K3RT_F64, &ref);
    run_case(c, &in, 0, dtype, &got);
    const int64_t na = n_act(c), ns = n_state(c), npre = n_pre(c);
    double worst = 0, e;
    char line[1600];
    int at = snprintf(line, sizeof line, "%s %s:", k3rt_dtype_name(dtype), ctx);
#define CHK(name, cls, r, g, n)                                                                  \
    do {                                                                                         \
        e = check(name, ctx, dtype, cls, r, g, n, &worst);                                       \
        at += snprintf(line + at, sizeof line - (size_t)at, " %s %.2e", name, e);                \
    } while (0)
    CHK("y", TOL_OUT, ref.y, got.y, na);
    CHK("state_out", TOL_OUT, ref.s_out, got.s_out, ns);
    CHK("dx", TOL_GRAD, ref.dx, got.dx, na);
    if (c->prefix)
        CHK("d_x_prefix", TOL_GRAD, ref.dxp, got.dxp, npre);
    if (c->state)
        CHK("d_state_in", TOL_GRAD, ref.ds_in, got.ds_in, ns);
    if (c->summary) {
        CHK("summary_m", TOL_GRAD, ref.sm, got.sm, c->B * c->HV * c->D * c->D);
        CHK("summary_b", TOL_GRAD, ref.sb, got.sb, ns);
    }
    {
        rig r;
        make_rig(&r, c, K3RT_DEVICE_CPU, K3RT_F64);
        for (int i = 0; i < in.np; i++) {
            const char *name = rig_param(&r, i)->name;
            char what[80];
            snprintf(what, sizeof what, "d%s", name);
            CHK(what, grad_class(name), ref.dg[i], got.dg[i], in.pn[i]);
        }
        rig_destroy(&r);
    }
#undef CHK
    printf("%s | worst %.2e\n", line, worst);
    if (determinism) {
        lout again;
        run_case(c, &in, 0, dtype, &again);
        int same = !memcmp(got.y, again.y, (size_t)na * sizeof(double)) &&
                   !memcmp(got.dx, again.dx, (size_t)na * sizeof(double)) &&
                   !memcmp(got.s_out, again.s_out, (size_t)ns * sizeof(double));
        if (c->state)
            same = same && !memcmp(got.ds_in, again.ds_in, (size_t)ns * sizeof(double));
        for (int i = 0; i < in.np; i++)
            same = same && !memcmp(got.dg[i], again.dg[i], (size_t)in.pn[i] * sizeof(double));
        if (!same)
            record_failure("%s %s: two runs on the same inputs differ", k3rt_dtype_name(dtype),
                           ctx);
        printf("%s %s: two runs %s\n", k3rt_dtype_name(dtype), ctx,
               same ? "bitwise equal (y, dx, state, every gradient)" : "DIFFER");
        out_free(&again, in.np);
    }
    out_free(&ref, in.np);
    out_free(&got, in.np);
    inputs_free(&in);
}

START_TEST(cuda_vs_cpu)
{
    n_failed = 0;
    ck_assert_msg(tu_plugin("kda")->desc.caps & K3RT_CAP_CUDA,
                  "kda does not declare K3RT_CAP_CUDA in this CUDA build");
    /* H HV D W rf rg d B T state prefix docs lens summary */
    const lcase cases[] = {
        {1, 1, 32, 4, -1, 0, 32, 1, 1, 0, 0, 0, {0}, 1},
        {2, 2, 64, 4, -1, 0, 64, 2, 15, 1, 1, 0, {0}, 1},
        {4, 8, 32, 4, 16, 0, 64, 2, 64, 1, 0, 0, {0}, 0},      /* GVA */
        {2, 2, 128, 4, -1, 16, 64, 1, 100, 1, 1, 0, {0}, 1},  /* low-rank output gate */
        {2, 2, 64, 4, -1, 0, 48, 1, 64, 1, 0, 1, {64}, 1},    /* one document */
        {3, 3, 32, 3, 0, 0, 48, 2, 100, 1, 1, 3, {37, 63, 100}, 1}, /* full-rank forget gate */
        {8, 8, 64, 4, -1, 0, 128, 1, 300, 1, 1, 7, {1, 63, 2, 65, 128, 7, 34}, 1},
        {8, 8, 128, 4, -1, 0, 128, 2, 300, 1, 1, 0, {0}, 0},
    };
    const int dtypes[2] = {K3RT_F32, K3RT_BF16};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        if (small_only && cases[i].T > 100)
            continue;
        for (int k = 0; k < 2; k++)
            gpu_case(&cases[i], dtypes[k], (i == 3 || i == 6) && !small_only);
    }
    expect_no_failures();
}
END_TEST

/* cp_compose on CUDA against the CPU, outputs aliasing the first map (a running fold). */
START_TEST(cuda_compose)
{
    n_failed = 0;
    k3rt_error err = {0};
    const lcase c = {2, 2, 64, 4, -1, 0, 32, 3, 4, 0, 0, 0, {0}, 0};
    rig rc, rg;
    make_rig(&rc, &c, K3RT_DEVICE_CPU, K3RT_F64);
    make_rig(&rg, &c, 0, K3RT_F32);
    TU_OK(rig_alloc_params(&rc, &err), err);
    TU_OK(rig_alloc_params(&rg, &err), err);
    TU_OK(rig_alloc_shape(&rc, c.B, c.T, 0, &err), err);
    TU_OK(rig_alloc_shape(&rg, c.B, c.T, 0, &err), err);
    const int64_t n = c.B * c.HV * c.D * c.D;
    double *m1 = randv(n, 0.2), *b1 = randv(n, 1), *m2 = randv(n, 0.2), *b2 = randv(n, 1);
    round_to(m1, n, K3RT_F32), round_to(b1, n, K3RT_F32);
    round_to(m2, n, K3RT_F32), round_to(b2, n, K3RT_F32);
    void *hm1 = buf_of(K3RT_DEVICE_CPU, K3RT_F64, m1, n), *hb1 = buf_of(K3RT_DEVICE_CPU, K3RT_F64, b1, n);
    void *hm2 = buf_of(K3RT_DEVICE_CPU, K3RT_F64, m2, n), *hb2 = buf_of(K3RT_DEVICE_CPU, K3RT_F64, b2, n);
    void *gm1 = buf_of(0, K3RT_F32, m1, n), *gb1 = buf_of(0, K3RT_F32, b1, n);
    void *gm2 = buf_of(0, K3RT_F32, m2, n), *gb2 = buf_of(0, K3RT_F32, b2, n);
#define SH(p, dt, dev) k3rt_tensor_view((p), dt, dev, 4, c.B, c.HV, c.D, c.D)
    TU_OK(rig_cp_compose(&rc, SH(hm1, K3RT_F64, K3RT_DEVICE_CPU), SH(hb1, K3RT_F64, K3RT_DEVICE_CPU), SH(hm2, K3RT_F64, K3RT_DEVICE_CPU),
                         SH(hb2, K3RT_F64, K3RT_DEVICE_CPU), SH(hm1, K3RT_F64, K3RT_DEVICE_CPU), SH(hb1, K3RT_F64, K3RT_DEVICE_CPU), &err),
          err);
    TU_OK(rig_cp_compose(&rg, SH(gm1, K3RT_F32, 0), SH(gb1, K3RT_F32, 0), SH(gm2, K3RT_F32, 0),
                         SH(gb2, K3RT_F32, 0), SH(gm1, K3RT_F32, 0), SH(gb1, K3RT_F32, 0), &err),
          err);
#undef SH
    double *rm = values_of(K3RT_DEVICE_CPU, K3RT_F64, hm1, n), *rb = values_of(K3RT_DEVICE_CPU, K3RT_F64, hb1, n);
    double *xm = values_of(0, K3RT_F32, gm1, n), *xb = values_of(0, K3RT_F32, gb1, n);
    double em = err_of(rm, xm, n), eb = err_of(rb, xb, n);
    printf("cp_compose f32 on CUDA vs CPU (in place): m %.2e b %.2e\n", em, eb);
    if (!(em <= 1e-5 && eb <= 1e-5))
        record_failure("cp_compose: m %.3g b %.3g > 1e-5", em, eb);
    void *bufs[] = {hm1, hb1, hm2, hb2};
    for (int i = 0; i < 4; i++)
        free(bufs[i]);
    void *gbufs[] = {gm1, gb1, gm2, gb2};
    for (int i = 0; i < 4; i++)
        k3rt_free(0, gbufs[i]);
    free(m1), free(b1), free(m2), free(b2), free(rm), free(rb), free(xm), free(xb);
    rig_destroy(&rc);
    rig_destroy(&rg);
    expect_no_failures();
}
END_TEST

/* What the CUDA path cannot run is refused at create, naming the option; documents beyond
 * max_documents are refused at the call. */
START_TEST(cuda_refuses)
{
    n_failed = 0;
    k3rt_error err = {0};
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_BF16, a.device = 0, a.d_model = 32, a.n_layers = 1, a.stream = G;
    struct {
        const char *json, *frag;
    } bad[] = {
        {"{\"lower_bound\": null}", "lower_bound"},
        {"{\"head_dk\": 64, \"head_dv\": 32}", "head_dv"},
        {"{\"head_dim\": 48}", "head_dim = 48"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        json_error_t je;
        json_t *j = json_loads(bad[i].json, 0, &je);
        ck_assert_ptr_nonnull(j);
        rig r;
        int rc = rig_create(&r, tu_plugin("kda"), j, &a, "test", &err);
        json_decref(j);
        ck_assert_msg(rc != K3RT_OK, "%s was accepted on CUDA", bad[i].json);
        ck_assert_msg(strstr(err.msg, bad[i].frag) && strstr(err.msg, "CUDA"),
                      "%s: message \"%s\" lacks \"%s\"", bad[i].json, err.msg, bad[i].frag);
        printf("refused on CUDA: %s -> %s\n", bad[i].json, err.msg);
    }
    /* three documents in a call planned for one per row */
    lcase c = {1, 1, 32, 4, -1, 0, 32, 1, 9, 0, 0, 0, {0}, 0};
    rig r;
    make_rig(&r, &c, 0, K3RT_F32); /* max_documents 1 */
    TU_OK(rig_alloc_params(&r, &err), err);
    TU_OK(rig_alloc_shape(&r, 1, 9, 0, &err), err);
    double zeros[9 * 32] = {0};
    int32_t offs[4] = {0, 3, 6, 9};
    void *x = buf_of(0, K3RT_F32, zeros, 9 * 32), *y = buf_of(0, K3RT_F32, NULL, 9 * 32);
    void *docs = k3rt_alloc(0, sizeof offs, &err);
    TU_OK(k3rt_memcpy(G, docs, 0, offs, K3RT_DEVICE_CPU, sizeof offs, &err), err);
    k3rt_fwd_args f;
    memset(&f, 0, sizeof f);
    f.x = k3rt_tensor_view(x, K3RT_F32, 0, 3, 1, 9, 32, 0);
    f.y = k3rt_tensor_view(y, K3RT_F32, 0, 3, 1, 9, 32, 0);
    f.doc_offsets = k3rt_tensor_view(docs, K3RT_I32, 0, 1, 4, 0, 0, 0);
    ck_assert_int_ne(rig_forward(&r, &f, &err), K3RT_OK);
    ck_assert_msg(strstr(err.msg, "max_documents"), "message \"%s\"", err.msg);
    printf("refused: %s\n", err.msg);
    k3rt_free(0, x), k3rt_free(0, y), k3rt_free(0, docs);
    rig_destroy(&r);
}
END_TEST

static Suite *cpu_suite(void)
{
    Suite *s = suite_create("kda_layer_cpu");
    TCase *tc = tcase_create("documents");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, cpu_documents);
    suite_add_tcase(s, tc);
    return s;
}

static Suite *gpu_suite(void)
{
    Suite *s = suite_create("kda_layer_cuda");
    TCase *tc = tcase_create("cuda");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, cuda_vs_cpu);
    tcase_add_test(tc, cuda_compose);
    tcase_add_test(tc, cuda_refuses);
    suite_add_tcase(s, tc);
    return s;
}

static int run(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_VERBOSE);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed;
}

int main(void)
{
    const char *small = getenv("K3RT_KDA_TEST_SMALL");
    small_only = small && *small && strcmp(small, "0") != 0;
    C = tu_cpu_stream(k3rt_cuda_device_count() > 0 ? 8 : 2);
    int failed = run(cpu_suite());
    if (!failed && k3rt_cuda_device_count() > 0) {
        k3rt_error err = {0};
        if (k3rt_stream_create(0, K3RT_STREAM_COMPUTE, &G, &err) != K3RT_OK) {
            fprintf(stderr, "cannot create a CUDA stream: %s\n", err.msg);
            return 1;
        }
        failed = run(gpu_suite());
        k3rt_stream_destroy(G);
    } else if (!failed) {
        printf("no CUDA device: the CUDA checks are skipped\n");
        k3rt_stream_destroy(C);
        return 77;
    }
    k3rt_stream_destroy(C);
    return failed ? 1 : 0;
}
