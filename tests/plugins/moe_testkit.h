/* Shared pieces of the LatentMoE suites (test_latent_moe*.c): one plugin instance with its
 * parameters and buffers, driven through the host's rig, and an independent dense reference of the
 * layer written from the spec (every expert on every token, masked to the chosen top-k). */
#ifndef K3RT_TEST_MOE_TESTKIT_H
#define K3RT_TEST_MOE_TESTKIT_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plugin/rig.h"
#include "check/fdcheck.h"
#include "plugin/registry.h"

enum { MH_MAX_PARAMS = 10 };

static const plugin_entry *mh_plugin(void) { return tu_plugin("latent_moe"); }

typedef struct moe_h {
    rig m;                        /* the instance; its saved parts and workspace at B x T */
    k3rt_stream *s;
    int dtype;
    int64_t B, T, d, N, n;
    int32_t E, k;
    int np;
    k3rt_tensor params[MH_MAX_PARAMS], grads[MH_MAX_PARAMS];
    double *p64[MH_MAX_PARAMS];  /* the parameters in double (the reference's copy) */
    double *x64, *dy64;
    void *x, *y, *dy, *dx;
    float *bias, *dscores;        /* [E]; [N, E] or NULL */
    k3rt_routing routing;
} moe_h;

static inline size_t mh_es(const moe_h *h) { return k3rt_dtype_size(h->dtype); }

static inline k3rt_tensor mh_act(const moe_h *h, void *p)
{
    return k3rt_tensor_view(p, h->dtype, K3RT_DEVICE_CPU, 3, h->B, h->T, h->d, 0);
}

static inline int mh_param_index(const moe_h *h, const char *name)
{
    for (int i = 0; i < h->np; i++)
        if (!strcmp(rig_param(&h->m, i)->name, name))
            return i;
    return -1;
}

/* Copies the double master values into the instance's dtype. */
static inline void mh_sync(moe_h *h)
{
    k3rt_error err = {0};
    for (int i = 0; i < h->np; i++)
        TU_OK(k3rt_convert(h->params[i].data, h->dtype, h->p64[i], K3RT_F64,
                           k3rt_tensor_numel(&h->params[i]), &err), err);
    TU_OK(k3rt_convert(h->x, h->dtype, h->x64, K3RT_F64, h->n, &err), err);
    TU_OK(k3rt_convert(h->dy, h->dtype, h->dy64, K3RT_F64, h->n, &err), err);
}

/* Parameters from their declared init (norm gains jittered so they are not all 1), x and dy
 * from N(0, 1), a selection bias from N(0, bias_std^2). */
static inline void mh_init(moe_h *h, int dtype, const char *cfg_text, int64_t B, int64_t T,
                           int64_t d, uint64_t seed, double bias_std, int threads)
{
    memset(h, 0, sizeof *h);
    k3rt_error err = {0};
    h->dtype = dtype, h->B = B, h->T = T, h->d = d, h->N = B * T, h->n = B * T * d;
    h->s = tu_cpu_stream(threads);
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    ck_assert_msg(cfg != NULL, "bad json %s", cfg_text);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = d;
    a.n_layers = 2;
    a.layer = 1;
    a.stream = h->s;
    TU_OK(rig_create(&h->m, mh_plugin(), cfg, &a, "ffn", &err), err);
    json_decref(cfg);
    h->E = h->m.experts, h->k = h->m.top_k;
    h->np = rig_n_params(&h->m);
    ck_assert_int_le(h->np, MH_MAX_PARAMS);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 77);
    for (int i = 0; i < h->np; i++) {
        const k3rt_param_decl *pd = rig_param(&h->m, i);
        k3rt_tensor t = k3rt_tensor_view(NULL, K3RT_F64, K3RT_DEVICE_CPU, pd->ndim, pd->shape[0],
                                         pd->shape[1], pd->shape[2], pd->shape[3]);
        int64_t n = k3rt_tensor_numel(&t);
        h->p64[i] = calloc((size_t)n, sizeof(double));
        t.data = h->p64[i];
        TU_OK(rig_init_param(&h->m, i, t, seed, pd->name, &err), err);
        if (pd->init == K3RT_INIT_ONES)
            for (int64_t j = 0; j < n; j++)
                h->p64[i][j] += 0.1 * k3rt_rng_normal(&rng);
        h->params[i] = t;
        h->params[i].dtype = dtype;
        h->params[i].data = calloc((size_t)n, mh_es(h));
        h->grads[i] = h->params[i];
        h->grads[i].data = calloc((size_t)n, mh_es(h));
    }
    h->x64 = malloc((size_t)h->n * sizeof(double));
    h->dy64 = malloc((size_t)h->n * sizeof(double));
    tu_randn(h->x64, h->n, 1.0, seed + 1);
    tu_randn(h->dy64, h->n, 1.0, seed + 2);
    h->x = malloc((size_t)h->n * mh_es(h));
    h->dy = malloc((size_t)h->n * mh_es(h));
    h->y = calloc((size_t)h->n, mh_es(h));
    h->dx = calloc((size_t)h->n, mh_es(h));
    h->bias = calloc((size_t)h->E, sizeof(float));
    for (int e = 0; e < h->E; e++)
        h->bias[e] = (float)(bias_std * k3rt_rng_normal(&rng));
    TU_OK(rig_bind_params(&h->m, h->params, h->grads, &err), err);
    TU_OK(rig_alloc_shape(&h->m, B, T, 0, &err), err);
    mh_sync(h);
}

static inline void mh_free(moe_h *h)
{
    for (int i = 0; i < h->np; i++)
        free(h->params[i].data), free(h->grads[i].data), free(h->p64[i]);
    rig_destroy(&h->m);
    free(h->x64), free(h->dy64), free(h->x), free(h->dy), free(h->y), free(h->dx);
    free(h->bias), free(h->dscores);
    k3rt_stream_destroy(h->s);
}

static inline k3rt_fwd_args mh_fwd_args(moe_h *h, int training)
{
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.training = training;
    a.x = mh_act(h, h->x);
    a.y = mh_act(h, h->y);
    a.bias = k3rt_tensor_view(h->bias, K3RT_F32, K3RT_DEVICE_CPU, 1, h->E, 0, 0, 0);
    a.routing = &h->routing;
    return a;
}

static inline k3rt_bwd_args mh_bwd_args(moe_h *h)
{
    k3rt_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = mh_act(h, h->x);
    a.dy = mh_act(h, h->dy);
    a.dx = mh_act(h, h->dx);
    if (h->dscores)
        a.d_scores = k3rt_tensor_view(h->dscores, K3RT_F32, K3RT_DEVICE_CPU, 2, h->N, h->E, 0,
                                      0);
    return a;
}

static inline void mh_forward(moe_h *h, int training)
{
    k3rt_error err = {0};
    k3rt_fwd_args a = mh_fwd_args(h, training);
    TU_OK(rig_forward(&h->m, &a, &err), err);
}

static inline void mh_backward(moe_h *h)
{
    k3rt_error err = {0};
    k3rt_bwd_args a = mh_bwd_args(h);
    TU_OK(rig_backward(&h->m, &a, &err), err);
}

static inline void mh_zero_grads(moe_h *h)
{
    for (int i = 0; i < h->np; i++)
        memset(h->grads[i].data, 0, k3rt_tensor_bytes(&h->grads[i]));
}

/* Element i of a buffer of the harness dtype, as a double. */
static inline double mh_get(const moe_h *h, const void *p, int64_t i)
{
    return h->dtype == K3RT_F64 ? ((const double *)p)[i] : (double)((const float *)p)[i];
}

/* ---- the dense reference, in double ---------------------------------------------------------- */

typedef struct mh_cfg {
    int situ;
    double beta1, beta2;
    int latent_norm, renormalize;
    double eps, rscale;
} mh_cfg;

static inline double mh_glu(const mh_cfg *c, double g, double u)
{
    double sg = 1.0 / (1.0 + exp(-g));
    if (c->situ)
        return c->beta1 * tanh(g / c->beta1) * sg * c->beta2 * tanh(u / c->beta2);
    return g * sg * u;
}

/* y[n, i] = sum_j W[i, j] v[j] for W of shape [rows, cols] */
static inline void mh_matvec(const double *W, const double *v, int64_t rows, int64_t cols,
                             double *out)
{
    for (int64_t i = 0; i < rows; i++) {
        double s = 0;
        for (int64_t j = 0; j < cols; j++)
            s += W[i * cols + j] * v[j];
        out[i] = s;
    }
}

/* Router scores s [N, E] from the double copies. */
static inline void mh_scores(const moe_h *h, double *s)
{
    const double *Wr = h->p64[mh_param_index(h, "router.weight")];
    for (int64_t t = 0; t < h->N; t++) {
        mh_matvec(Wr, h->x64 + t * h->d, h->E, h->d, s + t * h->E);
        for (int e = 0; e < h->E; e++)
            s[t * h->E + e] = 1.0 / (1.0 + exp(-s[t * h->E + e]));
    }
}

/* Chosen experts by rank: e is chosen iff fewer than k experts beat it, where j beats e when
 * v_j > v_e or (v_j == v_e and j < e). mask [N, E]. */
static inline void mh_choose(const moe_h *h, const double *s, const float *bias, int *mask)
{
    for (int64_t t = 0; t < h->N; t++)
        for (int e = 0; e < h->E; e++) {
            double ve = s[t * h->E + e] + (double)bias[e];
            int beaten = 0;
            for (int j = 0; j < h->E; j++) {
                double vj = s[t * h->E + j] + (double)bias[j];
                beaten += vj > ve || (vj == ve && j < e);
            }
            mask[t * h->E + e] = beaten < h->k;
        }
}

/* The whole layer, every expert on every token, masked to the choice: y [N, d]. */
static inline void mh_dense_reference(const moe_h *h, const mh_cfg *c, int64_t l, int64_t m,
                                      int64_t Hs, double *y, int *mask)
{
    int64_t d = h->d, E = h->E;
    double *s = malloc((size_t)(h->N * E) * sizeof(double));
    mh_scores(h, s);
    mh_choose(h, s, h->bias, mask);
    const double *Wdn = h->p64[mh_param_index(h, "routed_down_proj.weight")];
    const double *Wg = h->p64[mh_param_index(h, "experts.gate_proj.weight")];
    const double *Wu = h->p64[mh_param_index(h, "experts.up_proj.weight")];
    const double *Wd = h->p64[mh_param_index(h, "experts.down_proj.weight")];
    const double *Wup = h->p64[mh_param_index(h, "routed_up_proj.weight")];
    int in = mh_param_index(h, "routed_norm.weight");
    const double *gam = in >= 0 ? h->p64[in] : NULL;
    double *cv = malloc((size_t)l * sizeof(double)), *U = malloc((size_t)l * sizeof(double));
    double *g = malloc((size_t)(m > Hs ? m : Hs) * sizeof(double));
    double *u = malloc((size_t)(m > Hs ? m : Hs) * sizeof(double));
    double *ye = malloc((size_t)l * sizeof(double)), *r = malloc((size_t)d * sizeof(double));
    for (int64_t t = 0; t < h->N; t++) {
        const double *x = h->x64 + t * d, *st = s + t * E;
        double S = 0;
        for (int e = 0; e < E; e++)
            S += mask[t * E + e] ? st[e] : 0;
        mh_matvec(Wdn, x, l, d, cv);
        memset(U, 0, (size_t)l * sizeof(double));
        for (int e = 0; e < E; e++) {
            double p = c->renormalize ? c->rscale * st[e] / (S + 1e-20) : c->rscale * st[e];
            p = mask[t * E + e] ? p : 0.0;
            mh_matvec(Wg + e * m * l, cv, m, l, g);
            mh_matvec(Wu + e * m * l, cv, m, l, u);
            for (int64_t j = 0; j < m; j++)
                g[j] = mh_glu(c, g[j], u[j]);
            mh_matvec(Wd + e * l * m, g, l, m, ye);
            for (int64_t i = 0; i < l; i++)
                U[i] += p * ye[i];
        }
        if (c->latent_norm) {
            double ms = 0;
            for (int64_t i = 0; i < l; i++)
                ms += U[i] * U[i];
            double rs = 1.0 / sqrt(ms / (double)l + c->eps);
            for (int64_t i = 0; i < l; i++)
                U[i] *= rs * gam[i];
        }
        mh_matvec(Wup, U, d, l, y + t * d);
        if (Hs > 0) {
            const double *Wsg = h->p64[mh_param_index(h, "shared_experts.gate_proj.weight")];
            const double *Wsu = h->p64[mh_param_index(h, "shared_experts.up_proj.weight")];
            const double *Wsd = h->p64[mh_param_index(h, "shared_experts.down_proj.weight")];
            mh_matvec(Wsg, x, Hs, d, g);
            mh_matvec(Wsu, x, Hs, d, u);
            for (int64_t j = 0; j < Hs; j++)
                g[j] = mh_glu(c, g[j], u[j]);
            mh_matvec(Wsd, g, d, Hs, r);
            for (int64_t i = 0; i < d; i++)
                y[t * d + i] += r[i];
        }
    }
    free(s), free(cv), free(U), free(g), free(u), free(ye), free(r);
}

#endif
