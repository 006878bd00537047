/* Shared pieces of the block_attnres suites (test_block_attnres*.c): an instance with its
 * parameters and buffers, and a toy model driven through the residual protocol (sublayer s is
 * y = tanh(g_s * x)) in either dtype. */
#ifndef K3RT_TEST_ATTNRES_TESTKIT_H
#define K3RT_TEST_ATTNRES_TESTKIT_H

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plugin/rig.h"
#include "check/fdcheck.h"
#include "plugin/registry.h"
#include "plugins/attnres_ref.h"

#define EPS 1e-5
#define MAX_S 200


static inline const plugin_entry *plugin(void) { return tu_plugin("block_attnres"); }

/* ---- harness: one instance with its parameters, saved and workspace ------------------------ */

typedef struct harness {
    rig m;  /* the instance; its saved part and workspace at B x T */
    k3rt_stream *s;
    int dtype, L, S, np;
    int64_t B, T, d, n;    /* n = B*T*d */
    k3rt_tensor *params, *grads;
} harness;

static inline void harness_init(harness *h, int dtype, int L, int64_t B, int64_t T, int64_t d,
                         const char *config, int threads)
{
    k3rt_error err = {0};
    memset(h, 0, sizeof *h);
    h->dtype = dtype, h->L = L, h->S = 2 * L, h->B = B, h->T = T, h->d = d, h->n = B * T * d;
    h->s = tu_cpu_stream(threads);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = d;
    a.n_layers = L;
    a.layer = -1;
    a.stream = h->s;
    json_t *cfg = json_loads(config ? config : "{}", 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    TU_OK(rig_create(&h->m, plugin(), cfg, &a, "model.residual", &err), err);
    json_decref(cfg);
    h->np = rig_n_params(&h->m);
    h->params = calloc((size_t)h->np, sizeof *h->params);
    h->grads = calloc((size_t)h->np, sizeof *h->grads);
    for (int i = 0; i < h->np; i++) {
        k3rt_tensor t = k3rt_tensor_view(NULL, dtype, K3RT_DEVICE_CPU, 1, d, 0, 0, 0);
        h->params[i] = t, h->grads[i] = t;
        h->params[i].data = calloc((size_t)d, k3rt_dtype_size(dtype));
        h->grads[i].data = calloc((size_t)d, k3rt_dtype_size(dtype));
        TU_OK(rig_init_param(&h->m, i, h->params[i], 1, rig_param(&h->m, i)->name, &err),
              err);
    }
    TU_OK(rig_bind_params(&h->m, h->params, h->grads, &err), err);
    TU_OK(rig_alloc_shape(&h->m, B, T, 0, &err), err);
}

static inline void harness_free(harness *h)
{
    rig_destroy(&h->m);
    for (int i = 0; i < h->np; i++) {
        free(h->params[i].data);
        free(h->grads[i].data);
    }
    free(h->params), free(h->grads);
    k3rt_stream_destroy(h->s);
}

static inline double *param64(harness *h, int i) { return h->params[i].data; }
static inline double *grad64(harness *h, int i) { return h->grads[i].data; }

/* Random queries (scale qs) and gains 1 + N(0, 0.3^2). */
static inline void random_params(harness *h, double qs, uint64_t seed)
{
    for (int i = 0; i < h->np; i++) {
        double tmp[512];
        tu_randn(tmp, h->d, i % 2 ? 0.3 : qs, seed + (uint64_t)i);
        for (int64_t k = 0; k < h->d; k++) {
            double v = i % 2 ? 1 + tmp[k] : tmp[k];
            if (h->dtype == K3RT_F64)
                param64(h, i)[k] = v;
            else
                ((float *)h->params[i].data)[k] = (float)v;
        }
    }
}

static inline k3rt_residual_args args(harness *h, int s, void *t)
{
    k3rt_residual_args a;
    memset(&a, 0, sizeof a);
    a.sublayer = s;
    a.t = k3rt_tensor_view(t, h->dtype, K3RT_DEVICE_CPU, 3, h->B, h->T, h->d, 0);
    a.training = 1;
    return a;
}

static inline void call(harness *h, rig_residual_call which, int s, void *t)
{
    k3rt_error err = {0};
    k3rt_residual_args a = args(h, s, t);
    TU_OK(rig_residual(&h->m, which, &a, &err), err);
}

/* ---- a toy model over the protocol: sublayer s is y = tanh(g_s * x) ------------------------ */

static inline double gate(int s, int64_t k) { return 0.4 + 0.15 * (double)((s * 7 + k * 3) % 11); }

static inline void toy(int s, const double *x, double *y, int64_t n, int64_t d)
{
    for (int64_t i = 0; i < n; i++)
        y[i] = tanh(gate(s, i % d) * x[i]);
}

/* Forward (xs [S][n] receives every sublayer input, out the aggregation) and, when dout is
 * given, the backward into demb and the parameter gradients. Works in the harness dtype
 * (double buffers are converted for f32). */
static inline void run_model(harness *h, const double *emb, double *xs, double *out, const double *dout,
                      double *demb)
{
    int64_t n = h->n;
    size_t es = k3rt_dtype_size(h->dtype);
    char *buf = malloc((size_t)(h->S + 3) * (size_t)n * es);
    char *t = buf + (size_t)(h->S + 1) * (size_t)n * es, *t2 = t + (size_t)n * es;
    k3rt_error err = {0};
#define SLOT(s) (buf + (size_t)(s) * (size_t)n * es)
#define TO(dst, src) TU_OK(k3rt_convert(dst, h->dtype, src, K3RT_F64, n, &err), err)
#define FROM(dst, src) TU_OK(k3rt_convert(dst, K3RT_F64, src, h->dtype, n, &err), err)
    double *y = malloc((size_t)n * sizeof *y), *dx = malloc((size_t)n * sizeof *dx);
    TO(t, emb);
    call(h, RIG_BEGIN, 0, t);
    for (int s = 0; s < h->S; s++) {
        call(h, RIG_MIX, s, SLOT(s));
        FROM(xs + (int64_t)s * n, SLOT(s));
        toy(s, xs + (int64_t)s * n, y, n, h->d);
        TO(t, y);
        call(h, RIG_PUSH, s, t);
    }
    call(h, RIG_FINISH, h->S, t);
    FROM(out, t);
    if (dout) {
        for (int i = 0; i < h->np; i++)
            memset(h->grads[i].data, 0, (size_t)h->d * es);
        TO(t, dout);
        call(h, RIG_FINISH_BACKWARD, h->S, t);
        for (int s = h->S - 1; s >= 0; s--) {
            call(h, RIG_PUSH_BACKWARD, s, t);
            FROM(y, t);
            const double *x = xs + (int64_t)s * n;
            for (int64_t i = 0; i < n; i++) {
                double th = tanh(gate(s, i % h->d) * x[i]);
                dx[i] = y[i] * (1 - th * th) * gate(s, i % h->d);
            }
            TO(t2, dx);
            k3rt_residual_args a = args(h, s, t2);
            a.sublayer_input = k3rt_tensor_view(SLOT(s), h->dtype, K3RT_DEVICE_CPU, 3, h->B,
                                                h->T, h->d, 0);
            TU_OK(rig_residual(&h->m, RIG_MIX_BACKWARD, &a, &err), err);
        }
        call(h, RIG_BEGIN_BACKWARD, 0, t);
        FROM(demb, t);
    }
#undef SLOT
#undef TO
#undef FROM
    free(y), free(dx), free(buf);
}


static inline double max_diff(const double *a, const double *b, int64_t n)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(a[i] - b[i]));
    return m;
}

#endif
