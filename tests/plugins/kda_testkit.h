/* Shared pieces of the KDA suites (test_kda*.c). The plugin exports only its entry point, so
 * its sources are compiled into each suite to reach the internal functions (the recurrence,
 * the layer with a conv halo); the vtable tests load the built plugin instead. */
#ifndef K3RT_TEST_KDA_TESTKIT_H
#define K3RT_TEST_KDA_TESTKIT_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plugin/rig.h"
#include "check/fdcheck.h"
#include "plugin/registry.h"

#include "../../plugins/attention/kda/plugin.c"
#include "../../plugins/attention/kda/layout.c"
#include "../../plugins/attention/kda/cpu.c"
#include "../../plugins/attention/kda/decode.c"

static inline void kt_randn(double *x, int64_t n, double scale, k3rt_rng *rng)
{
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * k3rt_rng_normal(rng);
}

static inline double *kt_alloc(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

static inline double kt_dot(const double *a, const double *b, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * b[i];
    return s;
}

static inline double kt_maxabs(const double *a, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i]));
    return m;
}

/* max |a - b| / max |a| */
static inline double kt_maxrel(const double *a, const double *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i] - b[i]));
    double s = kt_maxabs(a, n);
    return s > 0 ? m / s : m;
}

/* ---- the recurrence on its own ------------------------------------------------------------- */

typedef struct kt_core {
    kda_dims d;
    int64_t nq, nv, ng, nb, ns, nst;  /* element counts */
    double *q, *k, *v, *g, *beta, *s0, *dO, *dsT;      /* inputs */
    double *o, *sT, *states;                           /* forward outputs */
    double *dq, *dk, *dv, *dg, *dbeta, *ds0;           /* gradients */
    double *ws;
    int64_t ws_n;
} kt_core;

/* Random inputs as fla's tests draw them: unit-norm q, k rows per head, v ~ N(0,1), beta in
 * (0, 1), g = -U[g_lo, g_hi] (log decay), S_0 ~ N(0, 0.5^2), dO, dS_T ~ N(0, 1). */
static inline void kt_core_make(kt_core *c, kda_dims d, uint64_t seed, double g_lo, double g_hi)
{
    memset(c, 0, sizeof *c);
    c->d = d;
    c->nq = d.B * d.T * d.H * d.dim_k, c->nv = d.B * d.T * d.HV * d.dim_v;
    c->ng = d.B * d.T * d.HV * d.dim_k, c->nb = d.B * d.T * d.HV,
        c->ns = d.B * d.HV * d.dim_k * d.dim_v;
    c->nst = d.B * d.HV * kda_chunks(d.T, d.C) * d.dim_k * d.dim_v;
    c->q = kt_alloc(c->nq), c->k = kt_alloc(c->nq), c->v = kt_alloc(c->nv);
    c->g = kt_alloc(c->ng), c->beta = kt_alloc(c->nb), c->s0 = kt_alloc(c->ns);
    c->dO = kt_alloc(c->nv), c->dsT = kt_alloc(c->ns);
    c->o = kt_alloc(c->nv), c->sT = kt_alloc(c->ns), c->states = kt_alloc(c->nst);
    c->dq = kt_alloc(c->nq), c->dk = kt_alloc(c->nq), c->dv = kt_alloc(c->nv);
    c->dg = kt_alloc(c->ng), c->dbeta = kt_alloc(c->nb), c->ds0 = kt_alloc(c->ns);
    c->ws_n = kda_core_ws_elems_f64(&d, 2);
    c->ws = kt_alloc(c->ws_n);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 0xc03e);
    kt_randn(c->q, c->nq, 1, &rng);
    kt_randn(c->k, c->nq, 1, &rng);
    for (int64_t r = 0; r < c->nq / d.dim_k; r++) {
        double nq = sqrt(kt_dot(c->q + r * d.dim_k, c->q + r * d.dim_k, d.dim_k));
        double nk = sqrt(kt_dot(c->k + r * d.dim_k, c->k + r * d.dim_k, d.dim_k));
        for (int64_t j = 0; j < d.dim_k; j++)
            c->q[r * d.dim_k + j] /= nq, c->k[r * d.dim_k + j] /= nk;
    }
    kt_randn(c->v, c->nv, 1, &rng);
    for (int64_t i = 0; i < c->ng; i++)
        c->g[i] = -(g_lo + (g_hi - g_lo) * k3rt_rng_uniform(&rng));
    for (int64_t i = 0; i < c->nb; i++)
        c->beta[i] = 1 / (1 + exp(-k3rt_rng_normal(&rng)));
    kt_randn(c->s0, c->ns, 0.5, &rng);
    kt_randn(c->dO, c->nv, 1, &rng);
    kt_randn(c->dsT, c->ns, 1, &rng);
}

static inline void kt_core_free(kt_core *c)
{
    double *all[] = {c->q,  c->k,  c->v,  c->g,  c->beta, c->s0,  c->dO,    c->dsT, c->o,
                     c->sT, c->states, c->dq, c->dk, c->dv, c->dg, c->dbeta, c->ds0, c->ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
}

static inline k3rt_stream *kt_stream(void)
{
    static k3rt_stream *s;
    if (!s) {
        k3rt_error err;
        ck_assert_int_eq(k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &s, &err), 0);
        k3rt_stream_set_threads(s, 2);
    }
    return s;
}

static inline void kt_core_fwd(kt_core *c, int alg)
{
    k3rt_error err;
    int rc = kda_core_fwd_f64(kt_stream(), alg, &c->d, c->q, c->k, c->v, c->g, c->beta, c->s0,
                              c->o, c->states, c->sT, c->ws, c->ws_n, &err);
    TU_OK(rc, err);
}

static inline void kt_core_bwd(kt_core *c, int alg)
{
    k3rt_error err;
    int rc = kda_core_bwd_f64(kt_stream(), alg, &c->d, c->q, c->k, c->v, c->g, c->beta,
                              c->states, c->dO, c->dsT, c->dq, c->dk, c->dv, c->dg, c->dbeta,
                              c->ds0, c->ws, c->ws_n, &err);
    TU_OK(rc, err);
}

/* L = sum(o dO) + sum(S_T dS_T), the loss fla's tests use. */
static inline double kt_core_loss(kt_core *c, int alg)
{
    kt_core_fwd(c, alg);
    return kt_dot(c->o, c->dO, c->nv) + kt_dot(c->sT, c->dsT, c->ns);
}

/* Worst relative error of finite differences (fourth-order central stencil, step 1e-3: its
 * truncation error is far below the rounding noise of a 1e-6 two-point step) against the
 * analytic gradient on `samples` random entries of x; entries far below the gradient's RMS
 * are judged on 1e-3 of it. */
static inline double kt_core_fd(kt_core *c, int alg, double *x, const double *grad, int64_t n,
                                int samples, uint64_t seed)
{
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 0xfd);
    double rms = sqrt(kt_dot(grad, grad, n) / (double)n), worst = 0, h = 1e-3;
    for (int s = 0; s < samples; s++) {
        int64_t i = (int64_t)(k3rt_rng_u64(&rng) % (uint64_t)n);
        double keep = x[i], f[4], step[4] = {2 * h, h, -h, -2 * h};
        for (int j = 0; j < 4; j++) {
            x[i] = keep + step[j];
            f[j] = kt_core_loss(c, alg);
        }
        x[i] = keep;
        double num = (8 * (f[1] - f[2]) - (f[0] - f[3])) / (12 * h);
        double scale = fmax(fmax(fabs(num), fabs(grad[i])), 1e-3 * rms + 1e-12);
        worst = fmax(worst, fabs(num - grad[i]) / scale);
    }
    return worst;
}

/* ---- the layer through the built plugin ---------------------------------------------------- */

static inline const plugin_entry *kt_plugin(void) { return tu_plugin("kda"); }

/* One f64 layer instance with parameters initialised as declared (plus jitter on constants). */
typedef struct kt_layer {
    rig m;  /* the instance; its saved part and workspace at B x T */
    int np;
    k3rt_tensor *p, *gr;
    int64_t B, T, d;
} kt_layer;

static inline void kt_layer_make(kt_layer *L, const char *config, int64_t B, int64_t T, int64_t d,
                          uint64_t seed)
{
    memset(L, 0, sizeof *L);
    L->B = B, L->T = T, L->d = d;
    json_error_t je;
    json_t *cfg = json_loads(config, 0, &je);
    ck_assert_msg(cfg != NULL, "bad JSON %s: %s", config, je.text);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_F64;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = d;
    a.n_layers = 1;
    a.stream = kt_stream();
    a.seed = seed;
    k3rt_error err;
    TU_OK(rig_create(&L->m, kt_plugin(), cfg, &a, "kda", &err), err);
    json_decref(cfg);
    L->np = rig_n_params(&L->m);
    L->p = calloc((size_t)L->np, sizeof(k3rt_tensor));
    L->gr = calloc((size_t)L->np, sizeof(k3rt_tensor));
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 0x9a);
    for (int i = 0; i < L->np; i++) {
        const k3rt_param_decl *pd = rig_param(&L->m, i);
        k3rt_tensor t = k3rt_tensor_view(NULL, K3RT_F64, K3RT_DEVICE_CPU, pd->ndim, pd->shape[0],
                                         pd->shape[1], pd->shape[2], pd->shape[3]);
        int64_t n = k3rt_tensor_numel(&t);
        t.data = kt_alloc(n);
        L->p[i] = t;
        L->gr[i] = t;
        L->gr[i].data = kt_alloc(n);
        TU_OK(rig_init_param(&L->m, i, t, seed, pd->name, &err), err);
        if (pd->init == K3RT_INIT_ONES || pd->init == K3RT_INIT_ZEROS)
            for (int64_t j = 0; j < n; j++)
                ((double *)t.data)[j] += 0.1 * k3rt_rng_normal(&rng);
    }
    TU_OK(rig_bind_params(&L->m, L->p, L->gr, &err), err);
    TU_OK(rig_alloc_shape(&L->m, B, T, 0, &err), err);
}

static inline void kt_layer_free(kt_layer *L)
{
    rig_destroy(&L->m);
    for (int i = 0; i < L->np; i++) {
        free(L->p[i].data);
        free(L->gr[i].data);
    }
    free(L->p), free(L->gr);
}

static inline k3rt_fwd_args kt_fwd_args(kt_layer *L, double *x, double *y)
{
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.training = 1;
    a.x = k3rt_tensor_view(x, K3RT_F64, K3RT_DEVICE_CPU, 3, L->B, L->T, L->d, 0);
    a.y = k3rt_tensor_view(y, K3RT_F64, K3RT_DEVICE_CPU, 3, L->B, L->T, L->d, 0);
    return a;
}

static inline k3rt_tensor kt_state(kt_layer *L, double *data)
{
    return k3rt_tensor_view(data, K3RT_F64, K3RT_DEVICE_CPU, 4, L->B, ((kda *)L->m.self)->HV,
                            ((kda *)L->m.self)->dim_k, ((kda *)L->m.self)->dim_v);
}

static inline void kt_layer_fwd(kt_layer *L, double *x, double *y, double *s_in, double *s_out)
{
    k3rt_fwd_args a = kt_fwd_args(L, x, y);
    if (s_in)
        a.state_in = kt_state(L, s_in);
    if (s_out)
        a.state_out = kt_state(L, s_out);
    k3rt_error err;
    TU_OK(rig_forward(&L->m, &a, &err), err);
}

/* The layer's internal io for the same instance and buffers (halo tests). */
static inline kda_io kt_io(kt_layer *L, int64_t B, int64_t T)
{
    kda_io io;
    memset(&io, 0, sizeof io);
    const kda *m = L->m.self;
    io.B = B, io.T = T;
    for (int s = 0; s < KDA_N_SLOTS; s++) {
        io.params[s] = m->slot[s] >= 0 ? L->p[m->slot[s]].data : NULL;
        io.grads[s] = m->slot[s] >= 0 ? L->gr[m->slot[s]].data : NULL;
    }
    io.saved = L->m.saved, io.ws = L->m.ws;
    return io;
}

#endif
