/* The kda layer's test cases and their plumbing, shared by the CUDA comparison
 * (tests/gpu/test_kda_layer.c) and the CPU emulation of its bf16 path
 * (tests/plugins/test_kda_bf16.c), so both see the same shapes and the same input values:
 * a case (lcase, kl_cases), its inputs drawn from a seed and rounded to a dtype (inputs_make),
 * one forward + backward (+ cp_summary) through the host's rig on the CPU or on CUDA with every
 * output poisoned first (run_case), and what a comparison checks (kl_errors, with err_of:
 * fla's assert_close metric). */
#ifndef K3RT_TEST_KDA_LAYER_KIT_H
#define K3RT_TEST_KDA_LAYER_KIT_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plugin/rig.h"
#include "plugin/registry.h"
#include "plugin/sinks.h"

static k3rt_stream *G;  /* CUDA stream on device 0 (NULL without a GPU) */
static k3rt_stream *C;  /* CPU stream of the reference */
static uint64_t seed_next = 91;  /* of randv's next draw */

/* rms(ref - got) / rms(ref), 0 when max |ref - got| <= 1e-6 (fla's assert_close); INFINITY when
 * an element is not finite. */
static inline double err_of(const double *ref, const double *got, int64_t n)
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

static inline size_t nbytes(int dtype, int64_t n)
{
    return (size_t)(n > 0 ? n : 1) * k3rt_dtype_size(dtype);
}

static inline double *dalloc_h(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof *p);
    ck_assert_ptr_nonnull(p);
    return p;
}

static inline double *randv(int64_t n, double scale)
{
    double *v = dalloc_h(n);
    tu_randn(v, n, scale, seed_next++);
    return v;
}

static inline void round_to(double *x, int64_t n, int dtype)
{
    k3rt_error err = {0};
    void *tmp = malloc(nbytes(dtype, n));
    TU_OK(k3rt_convert(tmp, dtype, x, K3RT_F64, n, &err), err);
    TU_OK(k3rt_convert(x, K3RT_F64, tmp, dtype, n, &err), err);
    free(tmp);
}

/* n elements of dtype in host memory holding v, or poisoned (NaN bytes) when v is NULL. */
static inline void *host_of(int dtype, const double *v, int64_t n)
{
    k3rt_error err = {0};
    void *h = malloc(nbytes(dtype, n));
    ck_assert_ptr_nonnull(h);
    if (!v)
        return memset(h, 0xff, nbytes(dtype, n));
    TU_OK(k3rt_convert(h, dtype, v, K3RT_F64, n, &err), err);
    return h;
}

/* A buffer of n elements of dtype on device (CPU or 0) holding v, or poisoned when v is NULL. */
static inline void *buf_of(int device, int dtype, const double *v, int64_t n)
{
    k3rt_error err = {0};
    const size_t bytes = nbytes(dtype, n);
    void *h = host_of(dtype, v, n);
    if (device == K3RT_DEVICE_CPU)
        return h;
    void *d = k3rt_alloc(device, bytes, &err);
    ck_assert_msg(d != NULL, "k3rt_alloc(%zu): %s", bytes, err.msg);
    TU_OK(k3rt_memcpy(G, d, device, h, K3RT_DEVICE_CPU, bytes, &err), err);
    TU_OK(k3rt_stream_sync(G, &err), err);
    free(h);
    return d;
}

static inline double *values_of(int device, int dtype, const void *p, int64_t n)
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

static inline void buf_free(int device, void *p)
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

static inline json_t *cfg_of(const lcase *c)
{
    json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:i, s:f, s:i}", "heads", c->H, "value_heads",
                          c->HV, "head_dim", c->D, "conv_width", c->W, "gate_rank", c->rg,
                          "init_std", 0.15, "max_documents", c->n_docs ? c->n_docs : 1);
    ck_assert_ptr_nonnull(j);
    if (c->rf >= 0)
        json_object_set_new(j, "forget_rank", json_integer(c->rf));
    return j;
}

static inline void case_str(const lcase *c, char *buf, size_t len)
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

static inline int64_t n_state(const lcase *c) { return c->B * c->HV * c->D * c->D; }
static inline int64_t n_act(const lcase *c) { return c->B * c->T * c->d; }
static inline int64_t n_pre(const lcase *c) { return c->B * (c->W - 1) * c->d; }

static inline void make_rig(rig *r, const lcase *c, int device, int dtype)
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

/* Inputs for c drawn from `seed` on; values rounded to what `dtype` holds (f32 for states and
 * gradients). The same seed gives the same values before the rounding in every dtype. */
static inline void inputs_make(linputs *in, const lcase *c, int dtype, uint64_t seed)
{
    k3rt_error err = {0};
    memset(in, 0, sizeof *in);
    seed_next = seed;
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

static inline void inputs_free(linputs *in)
{
    for (int i = 0; i < in->np; i++)
        free(in->p[i]), free(in->g0[i]);
    free(in->p), free(in->g0), free(in->pn);
    free(in->x), free(in->dy), free(in->xp), free(in->s_in), free(in->ds_out), free(in->docs);
}

static inline void out_free(lout *o, int np)
{
    free(o->y), free(o->dx), free(o->dxp), free(o->s_out), free(o->ds_in), free(o->sm);
    free(o->sb);
    for (int i = 0; o->dg && i < np; i++)
        free(o->dg[i]);
    free(o->dg);
    memset(o, 0, sizeof *o);
}

/* Forward + backward (+ cp_summary) of c on device in dtype; outputs poisoned first. */
static inline void run_case(const lcase *c, const linputs *in, int device, int dtype, lout *o)
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

/* ---- the CUDA checks' cases ---------------------------------------------------------------- */

/* H HV D W rf rg d B T state prefix docs lens summary; case i draws its inputs from kl_seed(i). */
static const lcase kl_cases[] = {
    {1, 1, 32, 4, -1, 0, 32, 1, 1, 0, 0, 0, {0}, 1},
    {2, 2, 64, 4, -1, 0, 64, 2, 15, 1, 1, 0, {0}, 1},
    {4, 8, 32, 4, 16, 0, 64, 2, 64, 1, 0, 0, {0}, 0},      /* GVA */
    {2, 2, 128, 4, -1, 16, 64, 1, 100, 1, 1, 0, {0}, 1},  /* low-rank output gate */
    {2, 2, 64, 4, -1, 0, 48, 1, 64, 1, 0, 1, {64}, 1},    /* one document */
    {3, 3, 32, 3, 0, 0, 48, 2, 100, 1, 1, 3, {37, 63, 100}, 1}, /* full-rank forget gate */
    {8, 8, 64, 4, -1, 0, 128, 1, 300, 1, 1, 7, {1, 63, 2, 65, 128, 7, 34}, 1},
    {8, 8, 128, 4, -1, 0, 128, 2, 300, 1, 1, 0, {0}, 0},
};
enum { KL_N_CASES = (int)(sizeof kl_cases / sizeof kl_cases[0]) };

static inline uint64_t kl_seed(int i) { return 1000 + 100 * (uint64_t)i; }

/* Case i ready to compare: its name, its inputs in a dtype and the float64 CPU layer's outputs
 * on them (kl_prepare; kl_release frees them). */
typedef struct kl_run {
    const lcase *c;
    char ctx[200];
    linputs in;
    lout ref;
} kl_run;

static inline void kl_prepare(int i, int dtype, kl_run *k)
{
    k->c = &kl_cases[i];
    case_str(k->c, k->ctx, sizeof k->ctx);
    inputs_make(&k->in, k->c, dtype, kl_seed(i));
    run_case(k->c, &k->in, K3RT_DEVICE_CPU, K3RT_F64, &k->ref);
}

static inline void kl_release(kl_run *k)
{
    out_free(&k->ref, k->in.np);
    inputs_free(&k->in);
}

/* ---- what a comparison checks ---------------------------------------------------------------- */

/* One compared quantity: its name and relative error (err_of). */
typedef struct kl_err {
    char name[64];
    double e;
} kl_err;

enum { KL_MAX_ERRS = 40 };

/* Every quantity of case c that the CUDA checks compare, got against ref; returns the count. */
static inline int kl_errors(const lcase *c, const linputs *in, const lout *ref, const lout *got,
                            kl_err *out)
{
    int n = 0;
#define KL_ADD(nm, r, g, len)                                                                    \
    do {                                                                                         \
        snprintf(out[n].name, sizeof out[n].name, "%s", nm);                                     \
        out[n].e = err_of(r, g, len), n++;                                                       \
    } while (0)
    const int64_t ns = n_state(c);
    KL_ADD("y", ref->y, got->y, n_act(c));
    KL_ADD("state_out", ref->s_out, got->s_out, ns);
    KL_ADD("dx", ref->dx, got->dx, n_act(c));
    if (c->prefix)
        KL_ADD("d_x_prefix", ref->dxp, got->dxp, n_pre(c));
    if (c->state)
        KL_ADD("d_state_in", ref->ds_in, got->ds_in, ns);
    if (c->summary) {
        KL_ADD("summary_m", ref->sm, got->sm, ns);
        KL_ADD("summary_b", ref->sb, got->sb, ns);
    }
    rig r;
    make_rig(&r, c, K3RT_DEVICE_CPU, K3RT_F64);
    for (int i = 0; i < in->np; i++) {
        char what[64];
        snprintf(what, sizeof what, "d%s", rig_param(&r, i)->name);
        KL_ADD(what, ref->dg[i], got->dg[i], in->pn[i]);
    }
    rig_destroy(&r);
#undef KL_ADD
    ck_assert_int_le(n, KL_MAX_ERRS);
    return n;
}


#endif
