/* Shared pieces of the per_head_muon suites (test_per_head_muon*.c): a harness that creates the
 * optimizer over a list of parameters through its vtable, and a double-precision Jacobi SVD
 * with the exact Newton-Schulz map U p^k(sigma / ||G||_F) V^T to compare against. */
#ifndef K3RT_TEST_MUON_TESTKIT_H
#define K3RT_TEST_MUON_TESTKIT_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plugin/rig.h"
#include "plugin/registry.h"
#include "plugin/sinks.h"

/* ---- the plugin and a harness over a list of parameters ---------------------------------- */

static inline const plugin_entry *mt_plugin(void) { return tu_plugin("per_head_muon"); }

typedef struct mt_spec {
    const char *name;
    int role;
    int ndim;
    int64_t shape[3];
    int heads, axis, experts, qk;
    uint32_t flags;
} mt_spec;

enum { MT_MAX = 16 };

typedef struct mt_harness {
    rig m;
    k3rt_stream *s;
    int dtype, n;
    k3rt_param_decl decls[MT_MAX];
    k3rt_param_ref refs[MT_MAX];
    float max_logit[MT_MAX][16];
} mt_harness;

static inline int64_t mt_numel(const mt_harness *h, int i)
{
    return k3rt_tensor_numel(&h->refs[i].param);
}

/* Creates the optimizer over specs (weights and gradients zero); returns create's status. */
static inline int mt_try(mt_harness *h, int dtype, const char *cfg_text, const mt_spec *specs,
                         int n, int threads, k3rt_error *err)
{
    memset(h, 0, sizeof *h);
    ck_assert_int_le(n, MT_MAX);
    h->dtype = dtype;
    h->n = n;
    h->s = tu_cpu_stream(threads);
    for (int i = 0; i < n; i++) {
        const mt_spec *sp = &specs[i];
        k3rt_param_decl *d = &h->decls[i];
        d->struct_size = sizeof *d;
        d->role = sp->role;
        d->name = sp->name;
        d->ndim = sp->ndim;
        int64_t numel = 1;
        for (int k = 0; k < sp->ndim; k++)
            d->shape[k] = sp->shape[k], numel *= sp->shape[k];
        d->heads = sp->heads;
        d->head_axis = sp->axis;
        d->experts = sp->experts;
        d->qk_clip = sp->qk;
        d->flags = sp->flags;
        k3rt_param_ref *r = &h->refs[i];
        r->struct_size = sizeof *r;
        r->index = i;
        r->name = sp->name;
        r->decl = d;
        r->param = k3rt_tensor_view(calloc((size_t)numel, k3rt_dtype_size(dtype)), dtype,
                                    K3RT_DEVICE_CPU, sp->ndim, sp->shape[0], sp->shape[1],
                                    sp->shape[2], 0);
        r->grad = r->param;
        r->grad.data = calloc((size_t)numel, k3rt_dtype_size(dtype));
    }
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype;
    a.device = K3RT_DEVICE_CPU;
    a.layer = -1;
    a.params = h->refs;
    a.n_params = n;
    a.stream = h->s;
    int rc = rig_create(&h->m, mt_plugin(), cfg, &a, "optimizer", err);
    json_decref(cfg);
    return rc;
}

static inline void mt_init(mt_harness *h, int dtype, const char *cfg, const mt_spec *specs,
                           int n, int threads)
{
    k3rt_error err = {0};
    TU_OK(mt_try(h, dtype, cfg, specs, n, threads, &err), err);
}

static inline void mt_free(mt_harness *h)
{
    for (int i = 0; i < h->n; i++)
        free(h->refs[i].param.data), free(h->refs[i].grad.data);
    rig_destroy(&h->m);
    k3rt_stream_destroy(h->s);
}

static inline void mt_put(mt_harness *h, void *dst, const double *src, int64_t n)
{
    k3rt_error err = {0};
    TU_OK(k3rt_convert(dst, h->dtype, src, K3RT_F64, n, &err), err);
}

static inline void mt_set_param(mt_harness *h, int i, const double *x)
{
    mt_put(h, h->refs[i].param.data, x, mt_numel(h, i));
}

static inline void mt_set_grad(mt_harness *h, int i, const double *x)
{
    mt_put(h, h->refs[i].grad.data, x, mt_numel(h, i));
}

static inline void mt_get_param(const mt_harness *h, int i, double *out)
{
    k3rt_error err = {0};
    TU_OK(k3rt_convert(out, K3RT_F64, h->refs[i].param.data, h->dtype, mt_numel(h, i), &err),
          err);
}

/* Points parameter i's head_max_logit at the harness's values (set them in h->max_logit[i]). */
static inline void mt_use_max_logit(mt_harness *h, int i, int heads)
{
    h->refs[i].head_max_logit = k3rt_tensor_view(h->max_logit[i], K3RT_F32, K3RT_DEVICE_CPU, 1,
                                                 heads, 0, 0, 0);
}

static inline int mt_step_rc(mt_harness *h, double lr, int64_t step, k3rt_error *err)
{
    return rig_step(&h->m, NULL, lr, step, h->refs, h->n, err);
}

static inline void mt_step(mt_harness *h, double lr, int64_t step)
{
    k3rt_error err = {0};
    TU_OK(mt_step_rc(h, lr, step, &err), err);
}

static inline double *mt_alloc(int64_t n)
{
    double *p = calloc((size_t)(n > 0 ? n : 1), sizeof(double));
    ck_assert_ptr_nonnull(p);
    return p;
}

static inline double mt_max_abs_diff(const double *a, const double *b, int64_t n)
{
    double w = 0;
    for (int64_t i = 0; i < n; i++)
        w = fmax(w, fabs(a[i] - b[i]));
    return w;
}

static inline double mt_frob(const double *a, int64_t n)
{
    double s = 0;
    for (int64_t i = 0; i < n; i++)
        s += a[i] * a[i];
    return sqrt(s);
}

/* ---- Jacobi SVD and the exact Newton-Schulz map ------------------------------------------ */

/* One-sided Jacobi SVD of A (m x n, row-major), m >= n: A = U diag(s) V^T with U (m x n) and
 * V (n x n) column-orthonormal, stored row-major. Columns of U whose s is 0 are left zero. */
static inline void mt_svd_tall(const double *A, int64_t m, int64_t n, double *U, double *s,
                               double *V)
{
    memcpy(U, A, (size_t)(m * n) * sizeof(double));
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < n; j++)
            V[i * n + j] = i == j;
    for (int sweep = 0; sweep < 100; sweep++) {
        double off = 0;
        for (int64_t p = 0; p < n - 1; p++)
            for (int64_t q = p + 1; q < n; q++) {
                double al = 0, be = 0, ga = 0;
                for (int64_t i = 0; i < m; i++) {
                    double up = U[i * n + p], uq = U[i * n + q];
                    al += up * up, be += uq * uq, ga += up * uq;
                }
                if (ga == 0 || fabs(ga) <= 1e-15 * sqrt(al * be))
                    continue;
                off = fmax(off, fabs(ga) / sqrt(al * be));
                double zeta = (be - al) / (2 * ga);
                double t = (zeta >= 0 ? 1.0 : -1.0) / (fabs(zeta) + sqrt(1 + zeta * zeta));
                double c = 1 / sqrt(1 + t * t), sn = c * t;
                for (int64_t i = 0; i < m; i++) {
                    double up = U[i * n + p], uq = U[i * n + q];
                    U[i * n + p] = c * up - sn * uq, U[i * n + q] = sn * up + c * uq;
                }
                for (int64_t i = 0; i < n; i++) {
                    double vp = V[i * n + p], vq = V[i * n + q];
                    V[i * n + p] = c * vp - sn * vq, V[i * n + q] = sn * vp + c * vq;
                }
            }
        if (off < 1e-15)
            break;
    }
    for (int64_t j = 0; j < n; j++) {
        double nrm = 0;
        for (int64_t i = 0; i < m; i++)
            nrm += U[i * n + j] * U[i * n + j];
        s[j] = sqrt(nrm);
        for (int64_t i = 0; i < m; i++)
            U[i * n + j] = s[j] > 0 ? U[i * n + j] / s[j] : 0;
    }
}

/* SVD of any A (m x n): U (m x k), s (k), V (n x k), k = min(m, n). */
static inline void mt_svd(const double *A, int64_t m, int64_t n, double *U, double *s,
                          double *V)
{
    if (m >= n) {
        mt_svd_tall(A, m, n, U, s, V);
        return;
    }
    double *At = mt_alloc(m * n);
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < n; j++)
            At[j * m + i] = A[i * n + j];
    mt_svd_tall(At, n, m, V, s, U);  /* A^T = V diag(s) U^T */
    free(At);
}

/* The quintic p(x) = a x + b x^3 + c x^5 applied k times. */
static inline double mt_quintic(double x, int k)
{
    for (int i = 0; i < k; i++) {
        double x2 = x * x;
        x = 3.4445 * x - 4.7750 * x * x2 + 2.0315 * x * x2 * x2;
    }
    return x;
}

/* O = U diag(p^k(s / (||G||_F + 1e-7))) V^T, the exact result of k Newton-Schulz steps on G
 * (m x n). Optionally returns the normalised singular values (k = min(m, n) of them). */
static inline void mt_ns_exact(const double *G, int64_t m, int64_t n, int steps, double *O,
                               double *normalised)
{
    int64_t k = m < n ? m : n;
    double *U = mt_alloc(m * k), *s = mt_alloc(k), *V = mt_alloc(n * k);
    mt_svd(G, m, n, U, s, V);
    double nrm = mt_frob(G, m * n) + 1e-7;
    memset(O, 0, (size_t)(m * n) * sizeof(double));
    for (int64_t j = 0; j < k; j++) {
        double f = mt_quintic(s[j] / nrm, steps);
        if (normalised)
            normalised[j] = s[j] / nrm;
        for (int64_t r = 0; r < m; r++)
            for (int64_t c = 0; c < n; c++)
                O[r * n + c] += f * U[r * k + j] * V[c * k + j];
    }
    free(U), free(s), free(V);
}

/* A random m x n matrix with orthonormal columns (m >= n), by Gram-Schmidt twice. */
static inline void mt_orthonormal(double *Q, int64_t m, int64_t n, uint64_t seed)
{
    tu_randn(Q, m * n, 1.0, seed);
    for (int pass = 0; pass < 2; pass++)
        for (int64_t j = 0; j < n; j++) {
            for (int64_t p = 0; p < j; p++) {
                double d = 0;
                for (int64_t i = 0; i < m; i++)
                    d += Q[i * n + p] * Q[i * n + j];
                for (int64_t i = 0; i < m; i++)
                    Q[i * n + j] -= d * Q[i * n + p];
            }
            double nrm = 0;
            for (int64_t i = 0; i < m; i++)
                nrm += Q[i * n + j] * Q[i * n + j];
            for (int64_t i = 0; i < m; i++)
                Q[i * n + j] /= sqrt(nrm);
        }
}

#endif
