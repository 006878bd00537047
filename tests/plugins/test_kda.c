/* The kda plugin through its vtable: descriptor, options, parameters (roles, head layout,
 * init), finite-difference checks of the whole layer (every weight, A_log, dt_bias, x and the
 * initial state), FLOP count, causality, the lower bound and the softplus gate. */
#include "kda_testkit.h"

/* GVA (4 value heads on 2 qk heads), dim_k != dim_v, low-rank gates, T = 11 with chunk 4 */
static const char *CFG_GVA = "{\"heads\": 2, \"value_heads\": 4, \"head_dk\": 6, "
                             "\"head_dv\": 5, \"forget_rank\": 3, \"gate_rank\": 3, "
                             "\"chunk_size\": 4, \"init_std\": 0.3}";

START_TEST(test_descriptor)
{
    const plugin_entry *e = kt_plugin();
    ck_assert_str_eq(e->desc.name, "kda");
    ck_assert_int_eq(e->desc.kind, K3RT_KIND_ATTENTION);
    uint64_t want = K3RT_CAP_CPU | K3RT_CAP_F64 | K3RT_CAP_DETERMINISTIC;
    ck_assert_uint_eq(e->desc.caps & want, want);
    ck_assert_ptr_nonnull(e->vt.attention.context);  /* the conv halo */
    ck_assert_ptr_nonnull(e->vt.attention.forward);
    ck_assert_ptr_nonnull(e->vt.attention.backward);
    ck_assert_ptr_nonnull(e->vt.attention.state_layout);
    ck_assert_ptr_nonnull(e->vt.attention.cp_summary);
    ck_assert_ptr_nonnull(e->vt.attention.cp_compose);
    ck_assert_ptr_nonnull(e->inst.init_param);
}
END_TEST

typedef struct want_param {
    const char *name;
    int role, ndim;
    int64_t d0, d1;
    int heads, axis;
} want_param;

static void expect_params(const char *cfg, const want_param *w, int n)
{
    kt_layer L;
    kt_layer_make(&L, cfg, 1, 4, 16, 1);
    ck_assert_int_eq(L.np, n);
    for (int i = 0; i < n; i++) {
        const k3rt_param_decl *p = rig_param(&L.m, i);
        ck_assert_str_eq(p->name, w[i].name);
        ck_assert_msg(p->role == w[i].role, "%s: role %s", p->name, k3rt_role_name(p->role));
        ck_assert_int_eq(p->ndim, w[i].ndim);
        ck_assert_int_eq(p->shape[0], w[i].d0);
        if (w[i].ndim == 2)
            ck_assert_int_eq(p->shape[1], w[i].d1);
        ck_assert_int_eq(p->heads, w[i].heads);
        ck_assert_int_eq(p->head_axis, w[i].axis);
        int no_decay = !strcmp(p->name, "A_log") || !strcmp(p->name, "dt_bias");
        ck_assert_int_eq(!!(p->flags & K3RT_PARAM_NO_DECAY), no_decay);
    }
    kt_layer_free(&L);
}

START_TEST(test_params_low_rank)
{
    enum { HM = K3RT_ROLE_HEAD_MATRIX, MX = K3RT_ROLE_MATRIX, CV = K3RT_ROLE_CONV,
           VE = K3RT_ROLE_VECTOR, NG = K3RT_ROLE_NORM_GAIN };
    const want_param w[] = {
        {"q_proj.weight", HM, 2, 12, 16, 2, 0},   {"k_proj.weight", HM, 2, 12, 16, 2, 0},
        {"v_proj.weight", HM, 2, 20, 16, 4, 0},   {"q_conv1d.weight", CV, 2, 12, 4, 0, 0},
        {"k_conv1d.weight", CV, 2, 12, 4, 0, 0},  {"v_conv1d.weight", CV, 2, 20, 4, 0, 0},
        {"f_a_proj.weight", MX, 2, 3, 16, 0, 0},  {"f_b_proj.weight", HM, 2, 24, 3, 4, 0},
        {"b_proj.weight", HM, 2, 4, 16, 4, 0},    {"A_log", VE, 1, 4, 0, 0, 0},
        {"dt_bias", VE, 1, 24, 0, 0, 0},          {"g_a_proj.weight", MX, 2, 3, 16, 0, 0},
        {"g_b_proj.weight", HM, 2, 20, 3, 4, 0},  {"o_norm.weight", NG, 1, 5, 0, 0, 0},
        {"o_proj.weight", HM, 2, 16, 20, 4, 1}};
    expect_params(CFG_GVA, w, (int)(sizeof w / sizeof w[0]));
}
END_TEST

START_TEST(test_params_full_rank)
{
    enum { HM = K3RT_ROLE_HEAD_MATRIX, CV = K3RT_ROLE_CONV, VE = K3RT_ROLE_VECTOR,
           NG = K3RT_ROLE_NORM_GAIN };
    const want_param w[] = {
        {"q_proj.weight", HM, 2, 8, 16, 2, 0},   {"k_proj.weight", HM, 2, 8, 16, 2, 0},
        {"v_proj.weight", HM, 2, 8, 16, 2, 0},   {"q_conv1d.weight", CV, 2, 8, 3, 0, 0},
        {"k_conv1d.weight", CV, 2, 8, 3, 0, 0},  {"v_conv1d.weight", CV, 2, 8, 3, 0, 0},
        {"f_proj.weight", HM, 2, 8, 16, 2, 0},   {"b_proj.weight", HM, 2, 2, 16, 2, 0},
        {"A_log", VE, 1, 2, 0, 0, 0},            {"dt_bias", VE, 1, 8, 0, 0, 0},
        {"g_proj.weight", HM, 2, 8, 16, 2, 0},   {"o_norm.weight", NG, 1, 4, 0, 0, 0},
        {"o_proj.weight", HM, 2, 16, 8, 2, 1}};
    expect_params("{\"heads\": 2, \"head_dim\": 4, \"conv_width\": 3, \"forget_rank\": 0}", w,
                  (int)(sizeof w / sizeof w[0]));
}
END_TEST

static void expect_create_error(const char *cfg, const char *needle)
{
    json_error_t je;
    json_t *c = json_loads(cfg, 0, &je);
    ck_assert_ptr_nonnull(c);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_F32;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = 16;
    a.n_layers = 1;
    a.stream = kt_stream();
    rig m;
    k3rt_error err;
    int rc = rig_create(&m, kt_plugin(), c, &a, "layers.0.mixer", &err);
    json_decref(c);
    ck_assert_int_ne(rc, K3RT_OK);
    ck_assert_msg(strstr(err.msg, needle) != NULL, "'%s' not in: %s", needle, err.msg);
}

START_TEST(test_option_errors)
{
    expect_create_error("{\"heads\": 2, \"value_heads\": 3}", "multiple of heads");
    expect_create_error("{\"lower_bound\": 0}", "must be < 0");
    expect_create_error("{\"lower_bound\": -6}", "lower_bound");
    expect_create_error("{\"algorithm\": \"fast\"}", "chunked|recurrent");
    expect_create_error("{\"head_dims\": 4}", "did you mean");
    expect_create_error("{\"chunk_size\": 0}", "chunk_size");
}
END_TEST

/* A_log = 0 under the bound; log U[1, 16] without; dt_bias = softplus^-1(dt), dt in
 * [1e-3, 1e-1]. */
START_TEST(test_init)
{
    const char *cfgs[] = {"{\"heads\": 2, \"head_dim\": 8}",
                          "{\"heads\": 2, \"head_dim\": 8, \"lower_bound\": null}"};
    for (int c = 0; c < 2; c++) {
        kt_layer L;
        kt_layer_make(&L, cfgs[c], 1, 4, 16, 7);
        const kda *m = L.m.self;
        k3rt_error err;
        k3rt_tensor a = L.p[m->slot[KDA_ALOG]], b = L.p[m->slot[KDA_DTB]];
        /* the kit jitters constant inits; take the plugin's values again */
        TU_OK(rig_init_param(&L.m, m->slot[KDA_ALOG], a, 7, "A_log", &err), err);
        const double *al = a.data, *db = b.data;
        for (int64_t h = 0; h < m->HV; h++)
            if (c == 0)
                ck_assert_double_eq(al[h], 0.0);
            else
                ck_assert(al[h] >= 0 && al[h] <= log(16.0));
        for (int64_t i = 0; i < m->HV * m->dim_k; i++) {
            double dt = log1p(exp(db[i]));
            ck_assert_msg(dt >= 1e-3 * (1 - 1e-9) && dt <= 1e-1 * (1 + 1e-9), "dt %g", dt);
        }
        kt_layer_free(&L);
    }
}
END_TEST

static void fd_layer(const char *cfg, int64_t T, double tol)
{
    fd_options o;
    memset(&o, 0, sizeof o);
    o.batch = 2, o.seq = T, o.d_model = 16, o.seed = 3, o.samples = 8, o.threads = 2;
    json_t *c = json_loads(cfg, 0, NULL);
    ck_assert_ptr_nonnull(c);
    fd_result r;
    k3rt_error err;
    TU_OK(fd_check_module(kt_plugin(), c, &o, &r, &err), err);
    json_decref(c);
    printf("  fd layer %s T=%lld: %d entries, worst %s\n", cfg, (long long)T, r.n_checked,
           r.worst_what);
    ck_assert_msg(r.worst < tol, "%s: %s", cfg, r.worst_what);
    ck_assert_int_gt(r.n_checked, 100);
}

START_TEST(test_fd_layer_chunked) { fd_layer(CFG_GVA, 11, 1e-6); }
END_TEST

START_TEST(test_fd_layer_recurrent)
{
    fd_layer("{\"heads\": 2, \"value_heads\": 4, \"head_dk\": 6, \"head_dv\": 5, "
             "\"forget_rank\": 3, \"gate_rank\": 3, \"chunk_size\": 4, \"algorithm\": "
             "\"recurrent\", \"init_std\": 0.3}", 11, 1e-6);
}
END_TEST

START_TEST(test_fd_layer_softplus_full_rank)
{
    fd_layer("{\"heads\": 2, \"head_dim\": 4, \"lower_bound\": null, \"forget_rank\": 0, "
             "\"chunk_size\": 3, \"conv_width\": 2, \"init_std\": 0.3}", 9, 1e-6);
}
END_TEST

START_TEST(test_fd_layer_one_chunk)
{
    fd_layer("{\"heads\": 1, \"head_dk\": 3, \"head_dv\": 7, \"conv_width\": 1, "
             "\"lower_bound\": -2.5, \"init_std\": 0.3}", 6, 1e-6);
    /* two tokens, shorter than the conv */
    fd_layer("{\"heads\": 1, \"value_heads\": 2, \"head_dim\": 3, \"init_std\": 0.3}", 2, 1e-6);
}
END_TEST

/* The count restated from the formula (kda_core_flops documents the per-chunk terms). */
START_TEST(test_flops)
{
    const char *cfgs[] = {CFG_GVA, "{\"heads\": 2, \"value_heads\": 4, \"head_dk\": 6, "
                                   "\"head_dv\": 5, \"forget_rank\": 3, \"gate_rank\": 3, "
                                   "\"chunk_size\": 4, \"algorithm\": \"recurrent\"}"};
    for (int c = 0; c < 2; c++) {
        kt_layer L;
        kt_layer_make(&L, cfgs[c], 1, 4, 16, 1);
        k3rt_flops f;
        k3rt_error err;
        TU_OK(rig_flops(&L.m, 2, 11, &f, &err), err);
        double N = 22, d = 16, Dk = 12, Dv = 20, Dg = 24, HV = 4, dim_k = 6, dim_v = 5;
        double proj = d * (2 * Dk + Dv) + (d * 3 + 3 * Dg) + d * HV + (d * 3 + 3 * Dv) + Dv * d;
        double conv = 4 * (2 * Dk + Dv), heads = 2 * HV;
        double cf = 0, cb = 0;
        if (c == 0) {
            double chunks[] = {4, 4, 3};
            for (int i = 0; i < 3; i++) {
                double n = chunks[i];
                cf += 2 * n * n * (dim_k + dim_v) + 6 * n * dim_k * dim_v;
                cb += 6 * n * n * dim_k + 5 * n * n * dim_v + 14 * n * dim_k * dim_v;
            }
        } else {
            cf = 7 * 11 * dim_k * dim_v, cb = 23 * 11 * dim_k * dim_v;
        }
        ck_assert_double_eq_tol(f.forward, 2 * N * (proj + conv) + heads * cf, 1e-6);
        ck_assert_double_eq_tol(f.backward, 4 * N * (proj + conv) + heads * cb, 1e-6);
        kt_layer_free(&L);
    }
}
END_TEST

/* Changing token t changes no output before t (and does change t). */
START_TEST(test_causality)
{
    const char *cfgs[] = {CFG_GVA, "{\"heads\": 2, \"head_dim\": 4, \"algorithm\": "
                                   "\"recurrent\", \"chunk_size\": 5}"};
    for (int c = 0; c < 2; c++) {
        int64_t B = 2, T = 13, d = 16, n = B * T * d;
        kt_layer L;
        kt_layer_make(&L, cfgs[c], B, T, d, 5);
        double *x = kt_alloc(n), *y0 = kt_alloc(n), *y1 = kt_alloc(n);
        k3rt_rng rng;
        k3rt_rng_seed(&rng, 5, 1);
        kt_randn(x, n, 1, &rng);
        kt_layer_fwd(&L, x, y0, NULL, NULL);
        for (int64_t t = 0; t < T; t += 3) {
            double keep[16];
            for (int64_t j = 0; j < d; j++) {
                keep[j] = x[(T + t) * d + j];
                x[(T + t) * d + j] += 0.5;
            }
            kt_layer_fwd(&L, x, y1, NULL, NULL);
            for (int64_t j = 0; j < d; j++)
                x[(T + t) * d + j] = keep[j];
            ck_assert_double_eq(kt_maxrel(y0, y1, T * d), 0.0);             /* sequence 0 */
            ck_assert_double_eq(kt_maxrel(y0 + T * d, y1 + T * d, t * d), 0.0); /* before t */
            ck_assert_double_gt(kt_maxrel(y0 + (T + t) * d, y1 + (T + t) * d, d), 1e-6);
        }
        free(x), free(y0), free(y1);
        kt_layer_free(&L);
    }
}
END_TEST

/* Large inputs and biases saturate the gate: g stays >= lower_bound (retention >=
 * e^lower_bound) and reaches it. */
START_TEST(test_lower_bound)
{
    double bounds[] = {-5.0, -2.0};
    for (int c = 0; c < 2; c++) {
        char cfg[128];
        snprintf(cfg, sizeof cfg, "{\"heads\": 2, \"head_dim\": 4, \"lower_bound\": %g}",
                 bounds[c]);
        int64_t B = 2, T = 9, d = 16, n = B * T * d;
        kt_layer L;
        kt_layer_make(&L, cfg, B, T, d, 9);
        const kda *m = L.m.self;
        double *x = kt_alloc(n), *y = kt_alloc(n);
        k3rt_rng rng;
        k3rt_rng_seed(&rng, 9, 1);
        kt_randn(x, n, 300, &rng);
        double *al = L.p[m->slot[KDA_ALOG]].data, *db = L.p[m->slot[KDA_DTB]].data;
        for (int64_t h = 0; h < m->HV; h++)
            al[h] = 2.0;
        for (int64_t i = 0; i < m->HV * m->dim_k; i++) /* drive half the channels to the bound */
            db[i] = i % 2 ? 40.0 : -40.0;
        kt_layer_fwd(&L, x, y, NULL, NULL);
        kda_layout l;
        kda_layout_make(m, B, T, m->slots, &l);
        const double *g = k3rt_saved_at(L.m.saved, l.part_end, KDA_SAVED_N, l.g, sizeof(double));
        double lo = 0, hi = -1e300;
        for (int64_t i = 0; i < B * T * m->HV * m->dim_k; i++) {
            lo = fmin(lo, g[i]);
            hi = fmax(hi, g[i]);
        }
        printf("  lower bound %g: g in [%.6f, %.3g], min retention %.6f >= e^lb = %.6f\n",
               bounds[c], lo, hi, exp(lo), exp(bounds[c]));
        ck_assert_double_ge(lo, bounds[c]);
        ck_assert_double_ge(exp(lo), exp(bounds[c]));
        ck_assert_double_lt(lo, bounds[c] + 1e-3);
        ck_assert_double_lt(hi, 0);
        free(x), free(y);
        kt_layer_free(&L);
    }
}
END_TEST

/* Without a bound the gate is Kimi-Linear's g = -e^A_log softplus(z), which can go far below
 * -5 (a step may forget everything). */
START_TEST(test_softplus_gate)
{
    int64_t B = 1, T = 7, d = 16, n = B * T * d;
    kt_layer L;
    kt_layer_make(&L, "{\"heads\": 2, \"head_dim\": 4, \"lower_bound\": null}", B, T, d, 4);
    const kda *m = L.m.self;
    ck_assert_int_eq(m->has_lb, 0);
    double *x = kt_alloc(n), *y = kt_alloc(n);
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 4, 1);
    kt_randn(x, n, 300, &rng);
    kt_layer_fwd(&L, x, y, NULL, NULL);
    kda_layout l;
    kda_layout_make(m, B, T, m->slots, &l);
    const double *g = k3rt_saved_at(L.m.saved, l.part_end, KDA_SAVED_N, l.g, sizeof(double));
    const double *z = k3rt_saved_at(L.m.saved, l.part_end, KDA_SAVED_N, l.z, sizeof(double));
    const double *al = L.p[m->slot[KDA_ALOG]].data;
    double lo = 0, err = 0;
    for (int64_t i = 0; i < B * T * m->HV * m->dim_k; i++) {
        double want = -exp(al[(i % (m->HV * m->dim_k)) / m->dim_k]) * (fmax(z[i], 0) +
                                                                 log1p(exp(-fabs(z[i]))));
        err = fmax(err, fabs(g[i] - want) / fmax(1, fabs(want)));
        lo = fmin(lo, g[i]);
    }
    printf("  softplus gate: min g %.3f, max deviation from -e^A softplus(z) %.1e\n", lo, err);
    ck_assert_double_lt(err, 1e-15);
    ck_assert_double_lt(lo, -5.0);
    free(x), free(y);
    kt_layer_free(&L);
}
END_TEST

/* The float layer (the training path) against the double one on the same inputs and weights:
 * rms(ref - x) / rms(ref) of outputs, final state, dx, every weight gradient and dS_0. */
static double rel_rms_fd(const double *ref, const float *x, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (ref[i] - x[i]) * (ref[i] - x[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

static float *f32_copy(const double *x, int64_t n)
{
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(y);
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)x[i];
    return y;
}

START_TEST(test_f32_layer)
{
    const char *cfgs[] = {CFG_GVA, "{\"heads\": 2, \"head_dim\": 16, \"chunk_size\": 16, "
                                   "\"algorithm\": \"recurrent\", \"init_std\": 0.3}",
                          "{\"heads\": 2, \"head_dim\": 16, \"chunk_size\": 32, "
                          "\"lower_bound\": null, \"init_std\": 0.3}"};
    for (int c = 0; c < 3; c++) {
        int64_t B = 2, T = 37, d = 16, n = B * T * d;
        kt_layer L;
        kt_layer_make(&L, cfgs[c], B, T, d, 12);
        const kda *m = L.m.self;
        int64_t ns = B * m->HV * m->dim_k * m->dim_v;
        k3rt_rng rng;
        k3rt_rng_seed(&rng, 12, 1);
        double *x = kt_alloc(n), *y = kt_alloc(n), *dy = kt_alloc(n), *dx = kt_alloc(n);
        double *s0 = kt_alloc(ns), *sT = kt_alloc(ns), *dsT = kt_alloc(ns), *ds0 = kt_alloc(ns);
        kt_randn(x, n, 1, &rng), kt_randn(dy, n, 1, &rng);
        kt_randn(s0, ns, 0.5, &rng), kt_randn(dsT, ns, 1, &rng);
        k3rt_error err;
        kda_io io = kt_io(&L, B, T);
        io.x = x, io.y = y, io.s_in = s0, io.s_out = sT, io.dy = dy, io.dx = dx;
        io.ds_out = dsT, io.ds_in = ds0;
        TU_OK(kda_layer_fwd_f64(m, kt_stream(), &io, &err), err);
        TU_OK(kda_layer_bwd_f64(m, kt_stream(), &io, &err), err);
        /* the same instance as float */
        kda mf = *m;
        mf.dtype = K3RT_F32;
        k3rt_memory mem;
        kda_memory(&mf, B, T, &mem);
        kda_io fo;
        memset(&fo, 0, sizeof fo);
        fo.B = B, fo.T = T;
        float *fp[KDA_N_SLOTS] = {0}, *fg[KDA_N_SLOTS] = {0};
        for (int sl = 0; sl < KDA_N_SLOTS; sl++)
            if (m->slot[sl] >= 0) {
                int64_t np = k3rt_tensor_numel(&L.p[m->slot[sl]]);
                fp[sl] = f32_copy(L.p[m->slot[sl]].data, np);
                fg[sl] = calloc((size_t)np, sizeof(float));
                fo.params[sl] = fp[sl], fo.grads[sl] = fg[sl];
            }
        float *fx = f32_copy(x, n), *fy = calloc((size_t)n, 4), *fdy = f32_copy(dy, n);
        float *fdx = calloc((size_t)n, 4), *fs0 = f32_copy(s0, ns), *fsT = calloc((size_t)ns, 4);
        float *fdsT = f32_copy(dsT, ns), *fds0 = calloc((size_t)ns, 4);
        fo.x = fx, fo.y = fy, fo.s_in = fs0, fo.s_out = fsT, fo.dy = fdy, fo.dx = fdx;
        fo.ds_out = fdsT, fo.ds_in = fds0;
        void *fsaved = calloc(1, (size_t)mem.saved_bytes), *fparts[KDA_SAVED_N];
        kda_layout fl;
        kda_layout_make(&mf, B, T, mf.slots, &fl);
        kda_parts_in_block(&fl, fsaved, sizeof(float), fparts);
        fo.saved = fparts, fo.ws = calloc(1, (size_t)mem.workspace_bytes);
        TU_OK(kda_layer_fwd_f32(&mf, kt_stream(), &fo, &err), err);
        TU_OK(kda_layer_bwd_f32(&mf, kt_stream(), &fo, &err), err);
        double ef = fmax(rel_rms_fd(y, fy, n), rel_rms_fd(sT, fsT, ns));
        double eb = fmax(rel_rms_fd(dx, fdx, n), rel_rms_fd(ds0, fds0, ns));
        for (int sl = 0; sl < KDA_N_SLOTS; sl++)
            if (m->slot[sl] >= 0)
                eb = fmax(eb, rel_rms_fd(L.gr[m->slot[sl]].data, fg[sl],
                                         k3rt_tensor_numel(&L.gr[m->slot[sl]])));
        printf("  f32 layer vs f64, config %d: forward %.1e, gradients %.1e (rms ratios)\n", c,
               ef, eb);
        ck_assert_double_lt(ef, 1e-5);
        ck_assert_double_lt(eb, 1e-4);
        for (int sl = 0; sl < KDA_N_SLOTS; sl++)
            free(fp[sl]), free(fg[sl]);
        free(fx), free(fy), free(fdy), free(fdx), free(fs0), free(fsT), free(fdsT), free(fds0);
        free(fsaved), free(fo.ws);
        free(x), free(y), free(dy), free(dx), free(s0), free(sT), free(dsT), free(ds0);
        kt_layer_free(&L);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kda");
    TCase *tc = tcase_create("plugin");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_descriptor);
    tcase_add_test(tc, test_params_low_rank);
    tcase_add_test(tc, test_params_full_rank);
    tcase_add_test(tc, test_option_errors);
    tcase_add_test(tc, test_init);
    tcase_add_test(tc, test_fd_layer_chunked);
    tcase_add_test(tc, test_fd_layer_recurrent);
    tcase_add_test(tc, test_fd_layer_softplus_full_rank);
    tcase_add_test(tc, test_fd_layer_one_chunk);
    tcase_add_test(tc, test_flops);
    tcase_add_test(tc, test_causality);
    tcase_add_test(tc, test_lower_bound);
    tcase_add_test(tc, test_softplus_gate);
    tcase_add_test(tc, test_f32_layer);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
