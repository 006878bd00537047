/* dense_glu: gradients by finite differences, forward against a scalar reference, f32 against
 * f64, gradient accumulation, counts and options (the host's argument checks are
 * tests/unit/test_rig.c's). */
#include "testutil/testutil.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "plugin/rig.h"
#include "check/fdcheck.h"
#include "plugin/registry.h"

static const plugin_entry *plugin(void) { return tu_plugin("dense_glu"); }

/* ---- one instance with its parameters and buffers ---------------------------------------- */

typedef struct harness {
    rig m;  /* the instance; its saved part and workspace at B x T */
    k3rt_stream *s;
    int dtype;
    int64_t B, T, d, H, n;
    void *x, *y, *dy, *dx;
    k3rt_tensor params[3], grads[3];
} harness;

static size_t es(const harness *h) { return k3rt_dtype_size(h->dtype); }

static k3rt_tensor act_view(const harness *h, void *p)
{
    return k3rt_tensor_view(p, h->dtype, K3RT_DEVICE_CPU, 3, h->B, h->T, h->d, 0);
}

/* Parameters N(0, pstd^2) and x N(0, 1), drawn in double and rounded to the dtype, so an f32
 * harness built with the same seeds sees the same numbers as the f64 one. */
static void harness_init(harness *h, int dtype, const char *cfg_text, int64_t B, int64_t T,
                         int64_t d, double pstd)
{
    memset(h, 0, sizeof *h);
    k3rt_error err = {0};
    h->dtype = dtype, h->B = B, h->T = T, h->d = d, h->n = B * T * d;
    h->s = tu_cpu_stream(1);
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = dtype;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = d;
    a.n_layers = 2;
    a.layer = 0;
    a.stream = h->s;
    TU_OK(rig_create(&h->m, plugin(), cfg, &a, "ffn", &err), err);
    json_decref(cfg);
    ck_assert_int_eq(rig_n_params(&h->m), 3);
    h->H = rig_param(&h->m, 0)->shape[0];
    for (int i = 0; i < 3; i++) {
        const k3rt_param_decl *pd = rig_param(&h->m, i);
        int64_t n = pd->shape[0] * pd->shape[1];
        double *tmp = malloc((size_t)n * sizeof(double));
        tu_randn(tmp, n, pstd, 100 + (uint64_t)i);
        h->params[i] = k3rt_tensor_view(malloc((size_t)n * es(h)), dtype, K3RT_DEVICE_CPU, 2,
                                        pd->shape[0], pd->shape[1], 0, 0);
        h->grads[i] = h->params[i];
        h->grads[i].data = calloc((size_t)n, es(h));
        TU_OK(k3rt_convert(h->params[i].data, dtype, tmp, K3RT_F64, n, &err), err);
        free(tmp);
    }
    TU_OK(rig_bind_params(&h->m, h->params, h->grads, &err), err);
    TU_OK(rig_alloc_shape(&h->m, B, T, 0, &err), err);
    double *tmp = malloc((size_t)h->n * sizeof(double));
    h->x = malloc((size_t)h->n * es(h));
    h->dy = malloc((size_t)h->n * es(h));
    tu_randn(tmp, h->n, 1.0, 1);
    TU_OK(k3rt_convert(h->x, dtype, tmp, K3RT_F64, h->n, &err), err);
    tu_randn(tmp, h->n, 1.0, 2);
    TU_OK(k3rt_convert(h->dy, dtype, tmp, K3RT_F64, h->n, &err), err);
    free(tmp);
    h->y = calloc((size_t)h->n, es(h));
    h->dx = calloc((size_t)h->n, es(h));
}

static void harness_free(harness *h)
{
    rig_destroy(&h->m);
    for (int i = 0; i < 3; i++)
        free(h->params[i].data), free(h->grads[i].data);
    free(h->x), free(h->y), free(h->dy), free(h->dx);
    k3rt_stream_destroy(h->s);
}

static k3rt_fwd_args fwd_args(harness *h, int training)
{
    k3rt_fwd_args a;
    memset(&a, 0, sizeof a);
    a.training = training;
    a.x = act_view(h, h->x);
    a.y = act_view(h, h->y);
    return a;
}

static int forward(harness *h, int training, k3rt_error *err)
{
    k3rt_fwd_args a = fwd_args(h, training);
    return rig_forward(&h->m, &a, err);
}

static int backward(harness *h, k3rt_error *err)
{
    k3rt_bwd_args a;
    memset(&a, 0, sizeof a);
    a.x = act_view(h, h->x);
    a.dy = act_view(h, h->dy);
    a.dx = act_view(h, h->dx);
    return rig_backward(&h->m, &a, err);
}

/* ---- finite differences ------------------------------------------------------------------- */

static void fd_case(const char *cfg_text)
{
    k3rt_error err = {0};
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    fd_options o;
    memset(&o, 0, sizeof o);
    o.batch = 2, o.seq = 3, o.d_model = 16, o.n_layers = 2, o.seed = 11, o.samples = 24;
    o.eps = 1e-5;  /* truncation ~eps^2 stays far below the rounding noise of 1e-6 */
    fd_result r;
    TU_OK(fd_check_module(plugin(), cfg, &o, &r, &err), err);
    json_decref(cfg);
    printf("dense_glu fd %s: %d entries, worst %.2e (%s)\n", cfg_text, r.n_checked, r.worst,
           r.worst_what);
    ck_assert_int_eq(r.n_checked, 4 * 24);  /* x and three weights */
    ck_assert_msg(r.worst < 1e-6, "%s: %s", cfg_text, r.worst_what);
}

START_TEST(fd_situ)
{
    fd_case("{\"act\": \"situ\", \"hidden\": 24}");
    /* Small caps and large weights put g and u where tanh bends. */
    fd_case("{\"act\": \"situ\", \"hidden\": 24, \"beta1\": 1.5, \"beta2\": 2.0, "
            "\"init_std\": 0.5}");
}
END_TEST

START_TEST(fd_swiglu)
{
    fd_case("{\"act\": \"swiglu\", \"hidden\": 24}");
    fd_case("{\"act\": \"swiglu\", \"hidden\": 24, \"init_std\": 0.5}");
}
END_TEST

/* ---- forward against a direct computation ------------------------------------------------- */

static double sigmoid(double z) { return 1.0 / (1.0 + exp(-z)); }

static double glu_ref(int situ, double g, double u, double b1, double b2)
{
    if (situ)
        return b1 * tanh(g / b1) * sigmoid(g) * b2 * tanh(u / b2);
    return g * sigmoid(g) * u;
}

/* y[n, i] = sum_j glu(x_n . Wg[j], x_n . Wu[j]) Wd[i, j] */
static void reference(const harness *h, int situ, double b1, double b2, double *y)
{
    const double *x = h->x, *wg = h->params[0].data, *wu = h->params[1].data;
    const double *wd = h->params[2].data;
    double *a = malloc((size_t)h->H * sizeof(double));
    for (int64_t n = 0; n < h->B * h->T; n++) {
        for (int64_t j = 0; j < h->H; j++) {
            double g = 0, u = 0;
            for (int64_t k = 0; k < h->d; k++) {
                g += x[n * h->d + k] * wg[j * h->d + k];
                u += x[n * h->d + k] * wu[j * h->d + k];
            }
            a[j] = glu_ref(situ, g, u, b1, b2);
        }
        for (int64_t i = 0; i < h->d; i++) {
            double s = 0;
            for (int64_t j = 0; j < h->H; j++)
                s += a[j] * wd[i * h->H + j];
            y[n * h->d + i] = s;
        }
    }
    free(a);
}

static void forward_case(const char *cfg_text, int situ, double b1, double b2)
{
    k3rt_error err = {0};
    harness h;
    harness_init(&h, K3RT_F64, cfg_text, 2, 3, 16, 0.5);
    ck_assert_int_eq(h.H, 24);
    TU_OK(forward(&h, 1, &err), err);
    double *ref = malloc((size_t)h.n * sizeof(double));
    reference(&h, situ, b1, b2, ref);
    double worst = 0, scale = 0;
    for (int64_t i = 0; i < h.n; i++) {
        worst = fmax(worst, fabs(((double *)h.y)[i] - ref[i]));
        scale = fmax(scale, fabs(ref[i]));
    }
    printf("dense_glu forward %s: max |y - ref| = %.2e (max |ref| %.2f)\n", cfg_text, worst,
           scale);
    ck_assert(scale > 1.0);  /* the caps are in play, not a near-zero output */
    ck_assert_msg(worst <= 1e-12 * scale, "max error %.3e", worst);
    /* Inference computes the same y. */
    double *y_train = malloc((size_t)h.n * sizeof(double));
    memcpy(y_train, h.y, (size_t)h.n * sizeof(double));
    memset(h.y, 0, (size_t)h.n * sizeof(double));
    TU_OK(forward(&h, 0, &err), err);
    ck_assert(memcmp(y_train, h.y, (size_t)h.n * sizeof(double)) == 0);
    free(y_train);
    free(ref);
    harness_free(&h);
}

START_TEST(forward_matches_scalar_reference)
{
    forward_case("{\"act\": \"situ\", \"hidden\": 24, \"beta1\": 1.5, \"beta2\": 2.0}", 1, 1.5,
                 2.0);
    forward_case("{\"act\": \"situ\", \"hidden\": 24}", 1, 4.0, 25.0);
    forward_case("{\"act\": \"swiglu\", \"hidden\": 24}", 0, 0, 0);
}
END_TEST

/* ---- f32 against f64, and accumulation ---------------------------------------------------- */

START_TEST(f32_matches_f64)
{
    k3rt_error err = {0};
    const char *cfg = "{\"act\": \"situ\", \"hidden\": 40, \"beta1\": 2.0, \"beta2\": 3.0}";
    harness h64, h32;
    harness_init(&h64, K3RT_F64, cfg, 2, 4, 32, 0.3);
    harness_init(&h32, K3RT_F32, cfg, 2, 4, 32, 0.3);
    TU_OK(forward(&h64, 1, &err), err);
    TU_OK(backward(&h64, &err), err);
    TU_OK(forward(&h32, 1, &err), err);
    TU_OK(backward(&h32, &err), err);
    int64_t most = h64.d * h64.H > h64.n ? h64.d * h64.H : h64.n;
    double *tmp = malloc((size_t)most * sizeof(double));
    TU_OK(k3rt_convert(tmp, K3RT_F64, h32.y, K3RT_F32, h32.n, &err), err);
    double ey = tu_rel_rms(h64.y, tmp, h64.n);
    TU_OK(k3rt_convert(tmp, K3RT_F64, h32.dx, K3RT_F32, h32.n, &err), err);
    double edx = tu_rel_rms(h64.dx, tmp, h64.n);
    double edw = 0;
    for (int i = 0; i < 3; i++) {
        int64_t n = h64.d * h64.H;
        TU_OK(k3rt_convert(tmp, K3RT_F64, h32.grads[i].data, K3RT_F32, n, &err), err);
        edw = fmax(edw, tu_rel_rms(h64.grads[i].data, tmp, n));
    }
    printf("dense_glu f32 vs f64: y %.2e, dx %.2e, dW %.2e (relative rms)\n", ey, edx, edw);
    ck_assert(ey < 1e-5 && edx < 1e-5 && edw < 1e-5);
    free(tmp);
    harness_free(&h64);
    harness_free(&h32);
}
END_TEST

START_TEST(grads_accumulate_dx_overwrites)
{
    k3rt_error err = {0};
    harness h;
    harness_init(&h, K3RT_F64, "{\"hidden\": 24}", 2, 3, 16, 0.3);
    TU_OK(forward(&h, 1, &err), err);
    TU_OK(backward(&h, &err), err);
    double *dx1 = malloc((size_t)h.n * sizeof(double)), *g1[3];
    memcpy(dx1, h.dx, (size_t)h.n * sizeof(double));
    for (int i = 0; i < 3; i++) {
        size_t b = k3rt_tensor_bytes(&h.grads[i]);
        g1[i] = malloc(b);
        memcpy(g1[i], h.grads[i].data, b);
    }
    TU_OK(backward(&h, &err), err);
    ck_assert(memcmp(dx1, h.dx, (size_t)h.n * sizeof(double)) == 0);
    for (int i = 0; i < 3; i++) {
        int64_t n = k3rt_tensor_numel(&h.grads[i]);
        double nz = 0;
        for (int64_t j = 0; j < n; j++) {
            ck_assert(((double *)h.grads[i].data)[j] == 2 * g1[i][j]);
            nz += fabs(g1[i][j]);
        }
        ck_assert(nz > 0);
        free(g1[i]);
    }
    free(dx1);
    harness_free(&h);
}
END_TEST

/* ---- declarations, counts, options -------------------------------------------------------- */

static int create(const char *cfg_text, int64_t d, int n_layers, rig *m, k3rt_error *err)
{
    json_t *cfg = json_loads(cfg_text, 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    k3rt_create_args a;
    memset(&a, 0, sizeof a);
    a.struct_size = sizeof a;
    a.dtype = K3RT_F32;
    a.device = K3RT_DEVICE_CPU;
    a.d_model = d;
    a.n_layers = n_layers;
    int rc = rig_create(m, plugin(), cfg, &a, "model.ffn", err);
    json_decref(cfg);
    return rc;
}

START_TEST(declarations_and_counts)
{
    k3rt_error err = {0};
    rig m;
    /* Default hidden: ceil(8*256/3) = 683, rounded up to 704. */
    TU_OK(create("{}", 256, 8, &m, &err), err);
    const char *names[3] = {"gate_proj.weight", "up_proj.weight", "down_proj.weight"};
    const int64_t shapes[3][2] = {{704, 256}, {704, 256}, {256, 704}};
    for (int i = 0; i < 3; i++) {
        const k3rt_param_decl *pd = rig_param(&m, i);
        ck_assert_str_eq(pd->name, names[i]);
        ck_assert_int_eq(pd->role, K3RT_ROLE_MATRIX);
        ck_assert_int_eq(pd->ndim, 2);
        ck_assert_int_eq(pd->shape[0], shapes[i][0]);
        ck_assert_int_eq(pd->shape[1], shapes[i][1]);
        ck_assert_int_eq(pd->init, K3RT_INIT_NORMAL);
        ck_assert(fabs(pd->init_a - (i == 2 ? 0.02 / 4.0 : 0.02)) < 1e-15);
    }
    ck_assert_int_eq(m.experts, 0);  /* dense: what experts() reported to the rig */
    ck_assert_int_eq(m.top_k, 0);
    rig_destroy(&m);

    TU_OK(create("{}", 16, 2, &m, &err), err);
    ck_assert_int_eq(rig_param(&m, 0)->shape[0], 64);  /* ceil(42.7) = 43 -> 64 */
    rig_destroy(&m);

    /* forward 6*N*d*H (three projections), backward 12*N*d*H; saved g, u, a and workspace
     * da, dg, du: f32 buffers of N*H = 144 elements (576 bytes), each rounded up to 768. */
    TU_OK(create("{\"hidden\": 24}", 16, 2, &m, &err), err);
    k3rt_flops f;
    k3rt_memory mem;
    TU_OK(rig_flops(&m, 2, 3, &f, &err), err);
    TU_OK(rig_memory(&m, 2, 3, &mem, &err), err);
    ck_assert(f.forward == 6.0 * 6 * 16 * 24);
    ck_assert(f.backward == 12.0 * 6 * 16 * 24);
    ck_assert_int_eq(mem.saved_bytes, 3 * 768);
    ck_assert_int_eq(mem.workspace_bytes, 3 * 768);
    ck_assert_int_eq(mem.state_bytes, 0);
    rig_destroy(&m);
}
END_TEST

static void expect_refused(const char *cfg_text, const char *msg)
{
    k3rt_error err = {0};
    rig m;
    int rc = create(cfg_text, 16, 2, &m, &err);
    ck_assert_int_eq(rc, K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, msg) != NULL, "%s: message '%s' lacks '%s'", cfg_text,
                  err.msg, msg);
}

START_TEST(options_refused)
{
    expect_refused("{\"hiden\": 32}", "unknown key 'hiden'; did you mean 'hidden'?");
    expect_refused("{\"act\": \"gelu\"}", "key 'act' must be one of situ|swiglu, got 'gelu'");
    expect_refused("{\"act\": 3}", "key 'act' expects a string");
    expect_refused("{\"beta1\": 0}", "key 'beta1' must be > 0, got 0");
    expect_refused("{\"beta2\": -2.5}", "key 'beta2' must be > 0, got -2.5");
    expect_refused("{\"hidden\": -1}", "key 'hidden' must be in [0, 1e+06], got -1");
    expect_refused("{\"init_std\": -0.1}", "key 'init_std' must be in [0, 10]");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("dense_glu");
    TCase *tc = tcase_create("core");
    tcase_add_test(tc, fd_situ);
    tcase_add_test(tc, fd_swiglu);
    tcase_add_test(tc, forward_matches_scalar_reference);
    tcase_add_test(tc, f32_matches_f64);
    tcase_add_test(tc, grads_accumulate_dx_overwrites);
    tcase_add_test(tc, declarations_and_counts);
    tcase_add_test(tc, options_refused);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
