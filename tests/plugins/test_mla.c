/* The mla attention plugin (NoPE MLA, K3's gated MLA) through its vtable: finite-difference
 * gradients in double; the forward against a direct O(T^2) scalar computation and against the
 * decode-absorbed form (the latent cache attended token by token); causality; the per-head max
 * logit for QK-clip; the FLOP formula; float against double; parameter roles; refusals. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/rig.h"
#include "check/fdcheck.h"
#include "plugin/registry.h"
#include "plugin/sinks.h"
#include "testutil/testutil.h"

/* ---- configurations ------------------------------------------------------------------------- */

typedef struct mcfg {
    int H, rq, dc, dn, dr, dv, gate;
    double std;
    double scale; /* softmax_scale; 0 leaves the default 1/sqrt(dn + dr) */
} mcfg;

static double cfg_scale(const mcfg *c)
{
    return c->scale > 0 ? c->scale : 1 / sqrt((double)(c->dn + c->dr));
}

static json_t *cfg_json(const mcfg *c)
{
    json_t *j = json_pack("{s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:f}", "heads", c->H, "q_rank",
                          c->rq, "kv_rank", c->dc, "qk_nope_dim", c->dn, "qk_shared_dim", c->dr,
                          "v_dim", c->dv, "output_gate", c->gate, "init_std", c->std);
    ck_assert_ptr_nonnull(j);
    if (c->scale > 0)
        json_object_set_new(j, "softmax_scale", json_real(c->scale));
    return j;
}

/* Every structural variant: q low-rank on/off, shared key on/off, gate on/off; the last one
 * with an explicit softmax scale. */
static const mcfg variants[] = {
    {3, 0, 6, 4, 0, 3, 0, 0.4, 0}, {3, 0, 6, 4, 3, 3, 1, 0.4, 0}, {3, 5, 6, 4, 3, 5, 1, 0.4, 0},
    {2, 5, 7, 3, 0, 4, 1, 0.4, 0}, {4, 6, 5, 2, 2, 3, 0, 0.4, 0}, {2, 4, 6, 3, 2, 3, 1, 0.4, 0.7},
};
#define N_VARIANTS ((int)(sizeof variants / sizeof variants[0]))

static const plugin_entry *load_mla(void) { return tu_plugin("mla"); }

/* ---- a live instance with host parameters and buffers --------------------------------------- */

typedef struct fix {
    rig m;
    k3rt_stream *s;
    int dtype;
    size_t es;
    int64_t B, T, d;
    int np;
    k3rt_tensor *params, *grads;
    void *x, *y, *dy, *dx;
} fix;

static void fix_make(fix *f, const mcfg *c, int dtype, int64_t B, int64_t T, int64_t d,
                     int threads, uint64_t seed)
{
    memset(f, 0, sizeof *f);
    k3rt_error err = {0};
    f->s = tu_cpu_stream(threads);
    f->dtype = dtype, f->es = k3rt_dtype_size(dtype), f->B = B, f->T = T, f->d = d;
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype, a.device = K3RT_DEVICE_CPU, a.d_model = d, a.vocab = 32, a.n_layers = 1;
    a.stream = f->s, a.seed = seed;
    json_t *j = cfg_json(c);
    TU_OK(rig_create(&f->m, load_mla(), j, &a, "test", &err), err);
    json_decref(j);
    f->np = rig_n_params(&f->m);
    f->params = calloc((size_t)f->np, sizeof(k3rt_tensor));
    f->grads = calloc((size_t)f->np, sizeof(k3rt_tensor));
    for (int i = 0; i < f->np; i++) {
        const k3rt_param_decl *p = rig_param(&f->m, i);
        k3rt_tensor t = k3rt_tensor_view(NULL, dtype, K3RT_DEVICE_CPU, p->ndim, p->shape[0],
                                         p->shape[1], 0, 0);
        size_t n = (size_t)k3rt_tensor_numel(&t);
        t.data = calloc(n, f->es);
        f->params[i] = t;
        f->grads[i] = t;
        f->grads[i].data = calloc(n, f->es);
        TU_OK(rig_init_param(&f->m, i, t, seed, p->name, &err), err);
    }
    size_t nx = (size_t)(B * T * d) * f->es;
    f->x = malloc(nx), f->y = calloc(1, nx), f->dy = malloc(nx), f->dx = calloc(1, nx);
    if (dtype == K3RT_F64) {
        tu_randn(f->x, B * T * d, 1.0, seed + 1);
        tu_randn(f->dy, B * T * d, 1.0, seed + 2);
    } else {
        tu_randnf(f->x, B * T * d, 1.0, seed + 1);
        tu_randnf(f->dy, B * T * d, 1.0, seed + 2);
    }
    TU_OK(rig_bind_params(&f->m, f->params, f->grads, &err), err);
    /* Exactly what memory() asks, so the sanitizer build catches an overrun. */
    TU_OK(rig_alloc_shape(&f->m, B, T, 0, &err), err);
}

static void fix_free(fix *f)
{
    rig_destroy(&f->m);
    for (int i = 0; i < f->np; i++) {
        free(f->params[i].data);
        free(f->grads[i].data);
    }
    free(f->params), free(f->grads);
    free(f->x), free(f->y), free(f->dy), free(f->dx);
    k3rt_stream_destroy(f->s);
}

static k3rt_tensor act(const fix *f, void *data)
{
    return k3rt_tensor_view(data, f->dtype, K3RT_DEVICE_CPU, 3, f->B, f->T, f->d, 0);
}

static int fix_forward(fix *f, k3rt_error *err)
{
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.training = 1;
    a.x = act(f, f->x), a.y = act(f, f->y);
    return rig_forward(&f->m, &a, err);
}

static int fix_backward(fix *f, k3rt_error *err)
{
    k3rt_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = act(f, f->x), a.dy = act(f, f->dy), a.dx = act(f, f->dx);
    return rig_backward(&f->m, &a, err);
}

static const double *param_by_name(const fix *f, const char *name)
{
    for (int i = 0; i < f->np; i++)
        if (!strcmp(rig_param(&f->m, i)->name, name))
            return f->params[i].data;
    return NULL;
}

/* ---- the scalar reference ------------------------------------------------------------------- */

typedef struct refw {
    const double *qa, *qa_g, *qn, *qr, *kva, *kv_g, *kb, *vb, *og, *o;
} refw;

static refw ref_weights(const fix *f)
{
    refw w = {param_by_name(f, "q_a_proj.weight"),    param_by_name(f, "q_a_layernorm.weight"),
              param_by_name(f, "q_nope_proj.weight"), param_by_name(f, "q_shared_proj.weight"),
              param_by_name(f, "kv_a_proj_with_mqa.weight"),
              param_by_name(f, "kv_a_layernorm.weight"),
              param_by_name(f, "k_b_proj.weight"),    param_by_name(f, "v_b_proj.weight"),
              param_by_name(f, "o_gate_proj.weight"), param_by_name(f, "o_proj.weight")};
    return w;
}

/* out(rows) = W(rows, cols) in(cols) */
static void matvec(const double *W, const double *in, double *out, int rows, int cols)
{
    for (int r = 0; r < rows; r++) {
        double s = 0;
        for (int k = 0; k < cols; k++)
            s += W[(int64_t)r * cols + k] * in[k];
        out[r] = s;
    }
}

static void rmsnorm(double *v, const double *g, int n, double eps)
{
    double ss = 0;
    for (int i = 0; i < n; i++)
        ss += v[i] * v[i];
    double r = 1 / sqrt(ss / n + eps);
    for (int i = 0; i < n; i++)
        v[i] *= r * g[i];
}

/* One token's projections: queries [H, dn+dr], normalised latent [dc], shared key [dr],
 * gate pre-activation [H*dv]. The reference keeps fixed-size arrays; ref_fits guards them. */
typedef struct tokproj {
    double q[8][16], chat[16], kr[16], z[64];
} tokproj;

static void ref_fits(const mcfg *c, int64_t d)
{
    ck_assert(c->H <= 8 && c->dn + c->dr <= 16 && c->dc <= 16 && c->dv <= 16);
    ck_assert(d <= 64 && c->rq <= 64 && c->H * c->dn <= 64 && c->H * c->dv <= 64);
    ck_assert(c->H * c->dr <= 64 && c->dc + c->dr <= 64);
}

static void project_token(const mcfg *c, const refw *w, const double *x, int d, tokproj *p)
{
    double qin[64], tmp[64];
    int din = d;
    memcpy(qin, x, (size_t)d * sizeof(double));
    if (c->rq) {
        matvec(w->qa, x, qin, c->rq, d);
        rmsnorm(qin, w->qa_g, c->rq, 1e-6);
        din = c->rq;
    }
    matvec(w->qn, qin, tmp, c->H * c->dn, din);
    for (int h = 0; h < c->H; h++)
        for (int i = 0; i < c->dn; i++)
            p->q[h][i] = tmp[h * c->dn + i];
    if (c->dr) {
        matvec(w->qr, qin, tmp, c->H * c->dr, din);
        for (int h = 0; h < c->H; h++)
            for (int i = 0; i < c->dr; i++)
                p->q[h][c->dn + i] = tmp[h * c->dr + i];
    }
    matvec(w->kva, x, tmp, c->dc + c->dr, d);
    memcpy(p->chat, tmp, (size_t)c->dc * sizeof(double));
    memcpy(p->kr, tmp + c->dc, (size_t)c->dr * sizeof(double));
    rmsnorm(p->chat, w->kv_g, c->dc, 1e-6);
    if (c->gate)
        matvec(w->og, x, p->z, c->H * c->dv, d);
}

/* y_t = Wo concat_h(o_h ⊙ sigmoid(z_h)) */
static void finish_token(const mcfg *c, const refw *w, double o[8][16], const tokproj *p, int d,
                         double *y)
{
    double flat[64];
    for (int h = 0; h < c->H; h++)
        for (int j = 0; j < c->dv; j++) {
            double g = c->gate ? 1 / (1 + exp(-p->z[h * c->dv + j])) : 1;
            flat[h * c->dv + j] = o[h][j] * g;
        }
    matvec(w->o, flat, y, d, c->H * c->dv);
}

/* Direct O(T^2) attention with explicit per-head keys and values; max_logit[h] receives the
 * largest scaled causal logit. */
static void ref_direct(const fix *f, const mcfg *c, const double *x, double *y, double *max_logit)
{
    refw w = ref_weights(f);
    ref_fits(c, f->d);
    int T = (int)f->T, d = (int)f->d, dqk = c->dn + c->dr;
    double scale = cfg_scale(c);
    tokproj *p = calloc((size_t)T, sizeof *p);
    double(*k)[8][16] = calloc((size_t)T, sizeof *k), (*v)[8][16] = calloc((size_t)T, sizeof *v);
    double *sc = malloc((size_t)T * sizeof(double));
    for (int h = 0; h < c->H; h++)
        max_logit[h] = -INFINITY;
    for (int b = 0; b < f->B; b++) {
        for (int t = 0; t < T; t++) {
            project_token(c, &w, x + ((int64_t)b * T + t) * d, d, &p[t]);
            double kn[64], vv[64];
            matvec(w.kb, p[t].chat, kn, c->H * c->dn, c->dc);
            matvec(w.vb, p[t].chat, vv, c->H * c->dv, c->dc);
            for (int h = 0; h < c->H; h++) {
                for (int i = 0; i < c->dn; i++)
                    k[t][h][i] = kn[h * c->dn + i];
                for (int i = 0; i < c->dr; i++)
                    k[t][h][c->dn + i] = p[t].kr[i];
                for (int j = 0; j < c->dv; j++)
                    v[t][h][j] = vv[h * c->dv + j];
            }
        }
        for (int t = 0; t < T; t++) {
            double o[8][16] = {{0}};
            for (int h = 0; h < c->H; h++) {
                double mx = -INFINITY, sum = 0;
                for (int u = 0; u <= t; u++) {
                    double s = 0;
                    for (int i = 0; i < dqk; i++)
                        s += p[t].q[h][i] * k[u][h][i];
                    sc[u] = s * scale;
                    mx = fmax(mx, sc[u]);
                }
                max_logit[h] = fmax(max_logit[h], mx);
                for (int u = 0; u <= t; u++)
                    sum += exp(sc[u] - mx);
                for (int u = 0; u <= t; u++)
                    for (int j = 0; j < c->dv; j++)
                        o[h][j] += exp(sc[u] - mx) / sum * v[u][h][j];
            }
            finish_token(c, &w, o, &p[t], d, y + ((int64_t)b * T + t) * d);
        }
    }
    free(p), free(k), free(v), free(sc);
}

/* Decode-absorbed form, one token at a time over the latent cache [ĉ ; kr]:
 *   score = scale (Wkb_h^T q_h^n · ĉ_u + q_h^r · kr_u),  o_h = Wvb_h (Σ_u P_u ĉ_u). */
static void ref_absorbed(const fix *f, const mcfg *c, const double *x, double *y)
{
    refw w = ref_weights(f);
    ref_fits(c, f->d);
    int T = (int)f->T, d = (int)f->d, dc = c->dc, dr = c->dr;
    double scale = cfg_scale(c);
    double *cache_c = malloc((size_t)T * dc * sizeof(double));
    double *cache_r = malloc((size_t)(T * dr + 1) * sizeof(double));
    double *sc = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < f->B; b++)
        for (int t = 0; t < T; t++) {
            tokproj p;
            project_token(c, &w, x + ((int64_t)b * T + t) * d, d, &p);
            memcpy(cache_c + (int64_t)t * dc, p.chat, (size_t)dc * sizeof(double));
            memcpy(cache_r + (int64_t)t * dr, p.kr, (size_t)dr * sizeof(double));
            double o[8][16];
            for (int h = 0; h < c->H; h++) {
                double qabs[16] = {0}, lat[16] = {0}, mx = -INFINITY, sum = 0;
                for (int cc = 0; cc < dc; cc++)
                    for (int i = 0; i < c->dn; i++)
                        qabs[cc] += w.kb[(int64_t)(h * c->dn + i) * dc + cc] * p.q[h][i];
                for (int u = 0; u <= t; u++) {
                    double s = 0;
                    for (int cc = 0; cc < dc; cc++)
                        s += qabs[cc] * cache_c[(int64_t)u * dc + cc];
                    for (int i = 0; i < dr; i++)
                        s += p.q[h][c->dn + i] * cache_r[(int64_t)u * dr + i];
                    sc[u] = s * scale;
                    mx = fmax(mx, sc[u]);
                }
                for (int u = 0; u <= t; u++)
                    sum += exp(sc[u] - mx);
                for (int u = 0; u <= t; u++)
                    for (int cc = 0; cc < dc; cc++)
                        lat[cc] += exp(sc[u] - mx) / sum * cache_c[(int64_t)u * dc + cc];
                matvec(w.vb + (int64_t)h * c->dv * dc, lat, o[h], c->dv, dc);
            }
            finish_token(c, &w, o, &p, d, y + ((int64_t)b * T + t) * d);
        }
    free(cache_c), free(cache_r), free(sc);
}

static double max_rel(const double *ref, const double *x, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num = fmax(num, fabs(ref[i] - x[i]));
        den = fmax(den, fabs(ref[i]));
    }
    return num / den;
}

/* ---- tests ---------------------------------------------------------------------------------- */

static void fd_one(const mcfg *c, int64_t B, int64_t T, int64_t d, int threads)
{
    fd_options o;
    memset(&o, 0, sizeof o);
    o.batch = B, o.seq = T, o.d_model = d, o.seed = 7, o.samples = 12, o.threads = threads;
    o.eps = 1e-5; /* balances truncation and rounding here: worst ~6e-8 against 3e-7 at 1e-6 */
    fd_result r;
    k3rt_error err = {0};
    json_t *j = cfg_json(c);
    TU_OK(fd_check_module(load_mla(), j, &o, &r, &err), err);
    json_decref(j);
    printf("mla fd H=%d rq=%d dc=%d dn=%d dr=%d dv=%d gate=%d T=%lld: %d checked, worst %.2e "
           "(%s)\n", c->H, c->rq, c->dc, c->dn, c->dr, c->dv, c->gate, (long long)T, r.n_checked,
           r.worst, r.worst_what);
    ck_assert_int_gt(r.n_checked, 50);
    ck_assert_msg(r.worst < 1e-6, "worst %s", r.worst_what);
}

START_TEST(test_fd_variants)
{
    for (int i = 0; i < N_VARIANTS; i++)
        fd_one(&variants[i], 2, 5, 16, 1);
}
END_TEST

/* More than one block of query rows (MLA_BLOCK = 64), two threads. */
START_TEST(test_fd_blocks)
{
    mcfg c = {2, 4, 5, 3, 2, 3, 1, 0.4, 0};
    fd_one(&c, 2, 70, 8, 2);
}
END_TEST

START_TEST(test_forward_vs_direct_and_absorbed)
{
    for (int i = 0; i < N_VARIANTS; i++) {
        fix f;
        fix_make(&f, &variants[i], K3RT_F64, 2, 70, 12, 2, 11 + (uint64_t)i);
        k3rt_error err = {0};
        TU_OK(fix_forward(&f, &err), err);
        int64_t n = f.B * f.T * f.d;
        double *ref = malloc((size_t)n * sizeof(double));
        double *absorbed = malloc((size_t)n * sizeof(double));
        double ml[8];
        ref_direct(&f, &variants[i], f.x, ref, ml);
        ref_absorbed(&f, &variants[i], f.x, absorbed);
        double e_direct = max_rel(ref, f.y, n), e_abs = max_rel(absorbed, f.y, n);
        printf("mla forward variant %d: direct %.2e, absorbed %.2e\n", i, e_direct, e_abs);
        ck_assert_msg(e_direct < 1e-12, "variant %d: direct %.3e", i, e_direct);
        ck_assert_msg(e_abs < 1e-10, "variant %d: absorbed %.3e", i, e_abs);
        free(ref), free(absorbed);
        fix_free(&f);
    }
}
END_TEST

START_TEST(test_causality)
{
    const mcfg *c = &variants[2];
    const int64_t changed[] = {0, 40, 63, 64, 69};
    for (int k = 0; k < 5; k++) {
        fix f;
        fix_make(&f, c, K3RT_F64, 2, 70, 12, 2, 5);
        k3rt_error err = {0};
        TU_OK(fix_forward(&f, &err), err);
        int64_t n = f.B * f.T * f.d, t0 = changed[k];
        double *y0 = malloc((size_t)n * sizeof(double)), *x = f.x;
        memcpy(y0, f.y, (size_t)n * sizeof(double));
        for (int64_t b = 0; b < f.B; b++)
            for (int64_t j = 0; j < f.d; j++)
                x[(b * f.T + t0) * f.d + j] += 0.5;
        TU_OK(fix_forward(&f, &err), err);
        const double *y = f.y;
        for (int64_t b = 0; b < f.B; b++) {
            size_t row = (size_t)f.d * sizeof(double);
            ck_assert_msg(!memcmp(y0 + b * f.T * f.d, y + b * f.T * f.d, (size_t)t0 * row),
                          "changing token %lld changed an earlier output", (long long)t0);
            ck_assert_msg(memcmp(y0 + (b * f.T + t0) * f.d, y + (b * f.T + t0) * f.d, row),
                          "changing token %lld left its own output unchanged", (long long)t0);
        }
        free(y0);
        fix_free(&f);
    }
}
END_TEST

static void read_max_logit(fix *f, float *out, int H)
{
    k3rt_tensor_sink sink;
    k3rt_error err = {0};
    TU_OK(rig_stats(&f->m, &sink, &err), err);
    ck_assert_int_eq(sink.n, 1);
    ck_assert_str_eq(sink.items[0].name, "max_logit");
    ck_assert_int_eq(sink.items[0].reduce, K3RT_REDUCE_MAX);
    ck_assert_int_eq(sink.items[0].t.dtype, K3RT_F32);
    ck_assert_int_eq(sink.items[0].t.ndim, 1);
    ck_assert_int_eq(sink.items[0].t.shape[0], H);
    memcpy(out, sink.items[0].t.data, (size_t)H * sizeof(float));
    tensor_sink_free(&sink);
}

static void max_logit_case(const mcfg *c)
{
    fix f;
    fix_make(&f, c, K3RT_F64, 2, 70, 12, 2, 3);
    int64_t n = f.B * f.T * f.d;
    double *y = malloc((size_t)n * sizeof(double)), ml1[8], ml2[8];
    float got[8];
    read_max_logit(&f, got, c->H);
    for (int h = 0; h < c->H; h++)
        ck_assert(isinf(got[h]) && got[h] < 0);
    k3rt_error err = {0};
    TU_OK(fix_forward(&f, &err), err);
    ref_direct(&f, c, f.x, y, ml1);
    read_max_logit(&f, got, c->H);
    for (int h = 0; h < c->H; h++)
        ck_assert_msg(fabs(got[h] - ml1[h]) <= 1e-6 * fmax(1, fabs(ml1[h])),
                      "head %d: %.9g vs %.9g", h, got[h], ml1[h]);
    /* A second forward: the statistic is the max over both. */
    tu_randn(f.x, n, 3.0, 99);
    TU_OK(fix_forward(&f, &err), err);
    ref_direct(&f, c, f.x, y, ml2);
    read_max_logit(&f, got, c->H);
    for (int h = 0; h < c->H; h++) {
        double want = fmax(ml1[h], ml2[h]);
        ck_assert_msg(fabs(got[h] - want) <= 1e-6 * fmax(1, fabs(want)), "head %d", h);
    }
    /* reset_stats starts over. */
    rig_reset_stats(&f.m);
    read_max_logit(&f, got, c->H);
    ck_assert(isinf(got[0]) && got[0] < 0);
    TU_OK(fix_forward(&f, &err), err);
    read_max_logit(&f, got, c->H);
    for (int h = 0; h < c->H; h++)
        ck_assert(fabs(got[h] - ml2[h]) <= 1e-6 * fmax(1, fabs(ml2[h])));
    free(y);
    fix_free(&f);
}

START_TEST(test_max_logit)
{
    max_logit_case(&variants[1]);
    max_logit_case(&variants[5]); /* explicit softmax_scale: the statistic includes it */
}
END_TEST

/* A NaN in token t0 of sequence 0 reaches every later output of that sequence and the max
 * logit of every head (QK-clip's finiteness check), in float and in double. (Earlier outputs
 * of the same row block may turn NaN too, through 0 * NaN in P V, as in flash attention:
 * causality holds for finite inputs.) */
START_TEST(test_nan_propagates)
{
    const int dtypes[] = {K3RT_F64, K3RT_F32};
    for (int k = 0; k < 2; k++) {
        fix f;
        fix_make(&f, &variants[2], dtypes[k], 2, 70, 12, 2, 8);
        int64_t t0 = 30, n = f.B * f.T * f.d;
        double *y = malloc((size_t)n * sizeof(double));
        k3rt_error err = {0};
        if (f.dtype == K3RT_F64)
            ((double *)f.x)[t0 * f.d + 3] = NAN;
        else
            ((float *)f.x)[t0 * f.d + 3] = NAN;
        TU_OK(fix_forward(&f, &err), err);
        TU_OK(k3rt_convert(y, K3RT_F64, f.y, f.dtype, n, &err), err);
        for (int64_t t = 0; t < f.T; t++) {
            if (t >= t0)
                ck_assert_msg(isnan(y[t * f.d]), "sequence 0 token %lld", (long long)t);
            ck_assert(!isnan(y[(f.T + t) * f.d])); /* sequence 1 untouched */
        }
        float got[8];
        read_max_logit(&f, got, variants[2].H);
        for (int h = 0; h < variants[2].H; h++)
            ck_assert_msg(isnan(got[h]), "%s head %d: %g", k3rt_dtype_name(f.dtype), h, got[h]);
        free(y);
        fix_free(&f);
    }
}
END_TEST

START_TEST(test_flops)
{
    /* d 32, H 2, q_rank 8, kv_rank 12, dn 4, dr 2, dv 3, gate; B 2, T 10 (N = 20 tokens).
     * Multiply-adds per token: q_a 32*8 + q up 8*2*6 + kv_a 32*14 + kv up 12*2*7 + gate 32*6
     * + out 6*32 = 256 + 96 + 448 + 168 + 192 + 192 = 1352; attention B*H*T^2/2*(dqk + dv)
     * = 2*2*50*9 = 1800. Forward = 2*(20*1352 + 1800) = 57680; backward = 2 * forward. */
    mcfg c = {2, 8, 12, 4, 2, 3, 1, 0.02, 0};
    fix f;
    fix_make(&f, &c, K3RT_F64, 2, 10, 32, 1, 1);
    k3rt_flops fl;
    k3rt_error err = {0};
    TU_OK(rig_flops(&f.m, 2, 10, &fl, &err), err);
    ck_assert_double_eq(fl.forward, 57680.0);
    ck_assert_double_eq(fl.backward, 115360.0);
    fix_free(&f);
}
END_TEST

START_TEST(test_float_vs_double)
{
    for (int i = 0; i < N_VARIANTS; i++) {
        fix fd, ff;
        fix_make(&fd, &variants[i], K3RT_F64, 2, 70, 12, 2, 21);
        fix_make(&ff, &variants[i], K3RT_F32, 2, 70, 12, 2, 21);
        k3rt_error err = {0};
        int64_t n = fd.B * fd.T * fd.d;
        for (int p = 0; p < fd.np; p++)
            TU_OK(k3rt_convert(ff.params[p].data, K3RT_F32, fd.params[p].data, K3RT_F64,
                               k3rt_tensor_numel(&fd.params[p]), &err), err);
        TU_OK(k3rt_convert(ff.x, K3RT_F32, fd.x, K3RT_F64, n, &err), err);
        TU_OK(k3rt_convert(ff.dy, K3RT_F32, fd.dy, K3RT_F64, n, &err), err);
        TU_OK(fix_forward(&fd, &err), err);
        TU_OK(fix_forward(&ff, &err), err);
        TU_OK(fix_backward(&fd, &err), err);
        TU_OK(fix_backward(&ff, &err), err);
        double *yf = malloc((size_t)n * sizeof(double)), *dxf = malloc((size_t)n * sizeof(double));
        TU_OK(k3rt_convert(yf, K3RT_F64, ff.y, K3RT_F32, n, &err), err);
        TU_OK(k3rt_convert(dxf, K3RT_F64, ff.dx, K3RT_F32, n, &err), err);
        double ey = tu_rel_rms(fd.y, yf, n), edx = tu_rel_rms(fd.dx, dxf, n);
        printf("mla f32 vs f64 variant %d: y %.2e, dx %.2e\n", i, ey, edx);
        ck_assert_msg(ey < 1e-5, "variant %d: y rel rms %.3e", i, ey);
        ck_assert_msg(edx < 1e-5, "variant %d: dx rel rms %.3e", i, edx);
        free(yf), free(dxf);
        fix_free(&fd), fix_free(&ff);
    }
}
END_TEST

START_TEST(test_deterministic)
{
    fix f;
    fix_make(&f, &variants[2], K3RT_F32, 3, 70, 12, 2, 4);
    k3rt_error err = {0};
    int64_t n = f.B * f.T * f.d;
    TU_OK(fix_forward(&f, &err), err);
    TU_OK(fix_backward(&f, &err), err);
    float *y0 = malloc((size_t)n * sizeof(float)), *dx0 = malloc((size_t)n * sizeof(float));
    memcpy(y0, f.y, (size_t)n * sizeof(float));
    memcpy(dx0, f.dx, (size_t)n * sizeof(float));
    int p = f.np - 1;
    size_t gbytes = k3rt_tensor_bytes(&f.grads[p]);
    float *g0 = malloc(gbytes);
    memcpy(g0, f.grads[p].data, gbytes);
    memset(f.grads[p].data, 0, gbytes);
    TU_OK(fix_forward(&f, &err), err);
    TU_OK(fix_backward(&f, &err), err);
    ck_assert(!memcmp(y0, f.y, (size_t)n * sizeof(float)));
    ck_assert(!memcmp(dx0, f.dx, (size_t)n * sizeof(float)));
    ck_assert(!memcmp(g0, f.grads[p].data, gbytes));
    free(y0), free(dx0), free(g0);
    fix_free(&f);
}
END_TEST

START_TEST(test_params)
{
    mcfg c = {4, 24, 16, 8, 4, 6, 1, 0.02, 0};
    fix f;
    fix_make(&f, &c, K3RT_F64, 1, 4, 32, 1, 1);
    struct {
        const char *name;
        int role, ndim;
        int64_t r, k;
        int heads, axis, clip;
    } want[] = {
        {"q_a_proj.weight", K3RT_ROLE_MATRIX, 2, 24, 32, 0, 0, K3RT_QK_NONE},
        {"q_a_layernorm.weight", K3RT_ROLE_NORM_GAIN, 1, 24, 0, 0, 0, K3RT_QK_NONE},
        {"q_nope_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, 32, 24, 4, 0, K3RT_QK_SQRT},
        {"q_shared_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, 16, 24, 4, 0, K3RT_QK_FULL},
        {"kv_a_proj_with_mqa.weight", K3RT_ROLE_MATRIX, 2, 20, 32, 0, 0, K3RT_QK_NONE},
        {"kv_a_layernorm.weight", K3RT_ROLE_NORM_GAIN, 1, 16, 0, 0, 0, K3RT_QK_NONE},
        {"k_b_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, 32, 16, 4, 0, K3RT_QK_SQRT},
        {"v_b_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, 24, 16, 4, 0, K3RT_QK_NONE},
        {"o_gate_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, 24, 32, 4, 0, K3RT_QK_NONE},
        {"o_proj.weight", K3RT_ROLE_HEAD_MATRIX, 2, 32, 24, 4, 1, K3RT_QK_NONE},
    };
    ck_assert_int_eq(f.np, 10);
    for (int i = 0; i < 10; i++) {
        const k3rt_param_decl *p = rig_param(&f.m, i);
        ck_assert_str_eq(p->name, want[i].name);
        ck_assert_int_eq(p->role, want[i].role);
        ck_assert_int_eq(p->ndim, want[i].ndim);
        ck_assert_int_eq(p->shape[0], want[i].r);
        if (p->ndim == 2)
            ck_assert_int_eq(p->shape[1], want[i].k);
        ck_assert_int_eq(p->heads, want[i].heads);
        ck_assert_int_eq(p->head_axis, want[i].axis);
        ck_assert_int_eq(p->qk_clip, want[i].clip);
        ck_assert_int_eq(p->init, p->ndim == 1 ? K3RT_INIT_ONES : K3RT_INIT_NORMAL);
    }
    fix_free(&f);
    /* Without q low-rank, shared key and gate: 6 parameters, queries straight from x. */
    mcfg c2 = {4, 0, 16, 8, 0, 6, 0, 0.02, 0};
    fix_make(&f, &c2, K3RT_F64, 1, 4, 32, 1, 1);
    ck_assert_int_eq(f.np, 6);
    ck_assert_str_eq(rig_param(&f.m, 0)->name, "q_nope_proj.weight");
    ck_assert_int_eq(rig_param(&f.m, 0)->shape[1], 32);
    ck_assert_int_eq(rig_param(&f.m, 1)->shape[0], 16);
    fix_free(&f);
}
END_TEST

START_TEST(test_refusals)
{
    const plugin_entry *e = load_mla();
    k3rt_error err = {0};
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_BF16, a.device = K3RT_DEVICE_CPU, a.d_model = 16, a.n_layers = 1;
    rig m;
    json_t *j = json_pack("{s:i}", "heads", 2);
    ck_assert_int_ne(rig_create(&m, e, j, &a, "test", &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "bf16"));
    json_decref(j);
    j = json_pack("{s:i}", "kv_rnk", 2);
    a.dtype = K3RT_F32;
    ck_assert_int_ne(rig_create(&m, e, j, &a, "test", &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "kv_rank"));
    json_decref(j);
    /* cuDNN's attention cannot compute the max logits: asking for both is refused at create;
     * with the reporting off the module reports no statistic. */
    j = json_pack("{s:s}", "cuda_kernel", "cudnn");
    ck_assert_int_ne(rig_create(&m, e, j, &a, "test", &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "report_max_logit = false"));
    json_object_set_new(j, "report_max_logit", json_false());
    a.stream = tu_cpu_stream(1);
    TU_OK(rig_create(&m, e, j, &a, "test", &err), err);
    k3rt_tensor_sink sink;
    TU_OK(rig_stats(&m, &sink, &err), err);
    ck_assert_int_eq(sink.n, 0);
    tensor_sink_free(&sink);
    rig_destroy(&m);
    k3rt_stream_destroy(a.stream);
    json_decref(j);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("mla");
    TCase *tc = tcase_create("mla");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fd_variants);
    tcase_add_test(tc, test_fd_blocks);
    tcase_add_test(tc, test_forward_vs_direct_and_absorbed);
    tcase_add_test(tc, test_causality);
    tcase_add_test(tc, test_max_logit);
    tcase_add_test(tc, test_nan_propagates);
    tcase_add_test(tc, test_flops);
    tcase_add_test(tc, test_float_vs_double);
    tcase_add_test(tc, test_deterministic);
    tcase_add_test(tc, test_params);
    tcase_add_test(tc, test_refusals);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
