/* latent_moe through its vtable: declarations and roles, defaults, FLOP and memory counts,
 * the routing report, gradient accumulation, inference and options (the host's argument
 * checks are tests/unit/test_rig.c's). */
#include "moe_testkit.h"

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
    int rc = rig_create(m, mh_plugin(), cfg, &a, "model.ffn", err);
    json_decref(cfg);
    return rc;
}

typedef struct want_decl {
    const char *name;
    int role, ndim, experts;
    int64_t shape[3];
    int init;
    double std;
} want_decl;

static void expect_decls(const rig *m, const want_decl *w, int n)
{
    ck_assert_int_eq(rig_n_params(m), n);
    for (int i = 0; i < n; i++) {
        const k3rt_param_decl *p = rig_param(m, i);
        ck_assert_str_eq(p->name, w[i].name);
        ck_assert_msg(p->role == w[i].role, "%s: role %s", p->name, k3rt_role_name(p->role));
        ck_assert_int_eq(p->ndim, w[i].ndim);
        ck_assert_int_eq(p->experts, w[i].experts);
        for (int k = 0; k < w[i].ndim; k++)
            ck_assert_msg(p->shape[k] == w[i].shape[k], "%s: dim %d is %lld", p->name, k,
                          (long long)p->shape[k]);
        ck_assert_int_eq(p->init, w[i].init);
        ck_assert_msg(fabs(p->init_a - w[i].std) < 1e-15, "%s: std %g", p->name, p->init_a);
    }
}

START_TEST(declarations_roles_and_defaults)
{
    k3rt_error err = {0};
    rig m;
    /* defaults at d = 256, 8 layers: 64 experts, top-8, latent 128, expert hidden 128,
     * 2 shared experts of 128 fused to 256 */
    TU_OK(create("{}", 256, 8, &m, &err), err);
    const double out = 0.02 / 4.0, fd = 1 / sqrt(256.0), fl = 1 / sqrt(128.0);
    const want_decl w[] = {
        {"router.weight", K3RT_ROLE_ROUTER, 2, 64, {64, 256}, K3RT_INIT_NORMAL, 0.02},
        {"routed_down_proj.weight", K3RT_ROLE_MATRIX, 2, 0, {128, 256}, K3RT_INIT_NORMAL, fd},
        {"experts.gate_proj.weight", K3RT_ROLE_EXPERT_MATRIX, 3, 64, {64, 128, 128},
         K3RT_INIT_NORMAL, fl},
        {"experts.up_proj.weight", K3RT_ROLE_EXPERT_MATRIX, 3, 64, {64, 128, 128},
         K3RT_INIT_NORMAL, fl},
        {"experts.down_proj.weight", K3RT_ROLE_EXPERT_MATRIX, 3, 64, {64, 128, 128},
         K3RT_INIT_NORMAL, fl},
        {"routed_norm.weight", K3RT_ROLE_NORM_GAIN, 1, 0, {128}, K3RT_INIT_ONES, 0},
        {"routed_up_proj.weight", K3RT_ROLE_MATRIX, 2, 0, {256, 128}, K3RT_INIT_NORMAL, out},
        {"shared_experts.gate_proj.weight", K3RT_ROLE_MATRIX, 2, 0, {256, 256}, K3RT_INIT_NORMAL,
         0.02},
        {"shared_experts.up_proj.weight", K3RT_ROLE_MATRIX, 2, 0, {256, 256}, K3RT_INIT_NORMAL,
         0.02},
        {"shared_experts.down_proj.weight", K3RT_ROLE_MATRIX, 2, 0, {256, 256},
         K3RT_INIT_NORMAL, out},
    };
    expect_decls(&m, w, 10);
    ck_assert_int_eq(m.experts, 64);  /* what experts() reported to the rig */
    ck_assert_int_eq(m.top_k, 8);
    rig_destroy(&m);

    /* NVIDIA's LatentMoE without shared experts: no norm gain, no shared matrices; explicit
     * widths and a fixed latent init */
    TU_OK(create("{\"experts\": 16, \"top_k\": 2, \"latent\": 32, \"expert_hidden\": 48, "
                 "\"shared\": 0, \"latent_norm\": false, \"latent_init_std\": 0.1}", 64, 2, &m,
                 &err), err);
    const want_decl w2[] = {
        {"router.weight", K3RT_ROLE_ROUTER, 2, 16, {16, 64}, K3RT_INIT_NORMAL, 0.02},
        {"routed_down_proj.weight", K3RT_ROLE_MATRIX, 2, 0, {32, 64}, K3RT_INIT_NORMAL, 0.1},
        {"experts.gate_proj.weight", K3RT_ROLE_EXPERT_MATRIX, 3, 16, {16, 48, 32},
         K3RT_INIT_NORMAL, 0.1},
        {"experts.up_proj.weight", K3RT_ROLE_EXPERT_MATRIX, 3, 16, {16, 48, 32},
         K3RT_INIT_NORMAL, 0.1},
        {"experts.down_proj.weight", K3RT_ROLE_EXPERT_MATRIX, 3, 16, {16, 32, 48},
         K3RT_INIT_NORMAL, 0.1},
        {"routed_up_proj.weight", K3RT_ROLE_MATRIX, 2, 0, {64, 32}, K3RT_INIT_NORMAL, 0.01},
    };
    expect_decls(&m, w2, 6);
    rig_destroy(&m);

    /* one shared expert of its own width */
    TU_OK(create("{\"experts\": 4, \"top_k\": 1, \"latent\": 8, \"shared\": 1, "
                 "\"shared_hidden\": 40}", 16, 2, &m, &err), err);
    ck_assert_int_eq(rig_n_params(&m), 10);
    ck_assert_int_eq(rig_param(&m, 7)->shape[0], 40);
    ck_assert_int_eq(rig_param(&m, 9)->shape[1], 40);
    rig_destroy(&m);
}
END_TEST

START_TEST(flop_and_memory_counts)
{
    k3rt_error err = {0};
    rig m;
    TU_OK(create("{\"experts\": 8, \"top_k\": 2, \"latent\": 16, \"expert_hidden\": 24, "
                 "\"shared\": 2, \"shared_hidden\": 10}", 32, 2, &m, &err), err);
    /* per token: 2 d E + 4 d l + 6 k l m + 6 d Hs = 512 + 2048 + 4608 + 3840 = 11008 */
    k3rt_flops f;
    TU_OK(rig_flops(&m, 3, 5, &f, &err), err);
    ck_assert(f.forward == 15.0 * 11008);
    ck_assert(f.backward == 2 * 15.0 * 11008);
    k3rt_memory mem;
    TU_OK(rig_memory(&m, 3, 5, &mem, &err), err);
    /* the saved buffer holds at least s, p, c, g, u, a, ye, U, the norm's output and the shared
     * activations (f32), and the workspace at least the gathered latent rows */
    int64_t N = 15, R = 30;
    int64_t floor_saved = 4 * (N * 8 + R + N * 16 + 3 * R * 24 + R * 16 + 2 * N * 16 + N +
                               3 * N * 20);
    ck_assert_int_ge(mem.saved_bytes, floor_saved);
    ck_assert_int_lt(mem.saved_bytes, floor_saved + 4096);
    ck_assert_int_ge(mem.workspace_bytes, 4 * R * 16);
    ck_assert_int_eq(mem.state_bytes, 0);
    rig_destroy(&m);
}
END_TEST

START_TEST(routing_report)
{
    moe_h h;
    mh_init(&h, K3RT_F32, "{\"experts\": 6, \"top_k\": 2, \"latent\": 8, \"init_std\": 0.3}", 2,
            7, 16, 3, 0.1, 2);
    mh_forward(&h, 1);
    k3rt_routing *r = &h.routing;
    ck_assert_int_eq(r->batch, 2);
    ck_assert_int_eq(r->seq, 7);
    ck_assert_int_eq(r->experts, 6);
    ck_assert_int_eq(r->top_k, 2);
    /* shapes and dtypes are the host's check (the rig, after the forward) */
    k3rt_error err = {0};
    ck_assert_int_eq(r->counts.device, K3RT_DEVICE_CPU);
    ck_assert_int_eq(r->offsets.shape[0], 7);  /* the expert-sorted row offsets */
    const int64_t *off = r->offsets.data, *cnt = r->counts.data;
    for (int e = 0; e < 6; e++)
        ck_assert_int_eq(off[e + 1] - off[e], cnt[e]);
    const float *s = r->scores.data, *b = r->bias.data;
    const int32_t *sel = r->selected.data;
    int64_t counts[6] = {0};
    for (int64_t t = 0; t < 14; t++) {
        ck_assert_int_ne(sel[t * 2], sel[t * 2 + 1]);
        /* descending biased score, and nothing unchosen beats the second choice */
        float v0 = s[t * 6 + sel[t * 2]] + b[sel[t * 2]];
        float v1 = s[t * 6 + sel[t * 2 + 1]] + b[sel[t * 2 + 1]];
        ck_assert(v0 >= v1);
        for (int e = 0; e < 6; e++) {
            ck_assert(s[t * 6 + e] > 0 && s[t * 6 + e] < 1);
            if (e != sel[t * 2] && e != sel[t * 2 + 1])
                ck_assert(s[t * 6 + e] + b[e] <= v1);
        }
        counts[sel[t * 2]]++, counts[sel[t * 2 + 1]]++;
    }
    for (int e = 0; e < 6; e++) {
        ck_assert_int_eq(((const int64_t *)r->counts.data)[e], counts[e]);
        ck_assert(b[e] == h.bias[e]);
    }
    /* a forward without a bias routes with zero bias: the report says none was given, and the
     * choice is the top-2 of the scores alone */
    k3rt_fwd_args a = mh_fwd_args(&h, 1);
    memset(&a.bias, 0, sizeof a.bias);
    TU_OK(rig_forward(&h.m, &a, &err), err);
    ck_assert_int_eq(h.routing.bias.ndim, 0);
    s = h.routing.scores.data, sel = h.routing.selected.data;
    for (int64_t t = 0; t < 14; t++)
        for (int e = 0; e < 6; e++)
            if (e != sel[t * 2] && e != sel[t * 2 + 1])
                ck_assert(s[t * 6 + e] <= s[t * 6 + sel[t * 2 + 1]]);
    mh_free(&h);
}
END_TEST

START_TEST(inference_equals_training)
{
    moe_h h;
    mh_init(&h, K3RT_F32, "{\"experts\": 6, \"top_k\": 3, \"latent\": 8}", 2, 5, 16, 4, 0.05,
            2);
    mh_forward(&h, 1);
    size_t bytes = (size_t)h.n * sizeof(float);
    float *y = malloc(bytes);
    memcpy(y, h.y, bytes);
    int32_t sel[30];
    memcpy(sel, h.routing.selected.data, sizeof sel);
    memset(h.y, 0, bytes);
    mh_forward(&h, 0);
    ck_assert(memcmp(y, h.y, bytes) == 0);
    ck_assert(memcmp(sel, h.routing.selected.data, sizeof sel) == 0);
    free(y);
    mh_free(&h);
}
END_TEST

START_TEST(grads_accumulate_dx_overwrites)
{
    moe_h h;
    mh_init(&h, K3RT_F64, "{\"experts\": 5, \"top_k\": 2, \"latent\": 6, \"shared\": 1}", 2, 3,
            8, 6, 0.05, 1);
    h.dscores = malloc((size_t)(h.N * h.E) * sizeof(float));
    tu_randnf(h.dscores, h.N * h.E, 0.1, 3);
    mh_forward(&h, 1);
    mh_backward(&h);
    size_t xb = (size_t)h.n * sizeof(double);
    double *dx1 = malloc(xb), *g1[MH_MAX_PARAMS];
    memcpy(dx1, h.dx, xb);
    for (int i = 0; i < h.np; i++) {
        size_t b = k3rt_tensor_bytes(&h.grads[i]);
        g1[i] = malloc(b);
        memcpy(g1[i], h.grads[i].data, b);
    }
    mh_backward(&h);
    ck_assert(memcmp(dx1, h.dx, xb) == 0);
    for (int i = 0; i < h.np; i++) {
        int64_t n = k3rt_tensor_numel(&h.grads[i]);
        double nz = 0;
        for (int64_t j = 0; j < n; j++) {
            ck_assert(((double *)h.grads[i].data)[j] == 2 * g1[i][j]);
            nz += fabs(g1[i][j]);
        }
        ck_assert_msg(nz > 0, "%s has no gradient", rig_param(&h.m, i)->name);
        free(g1[i]);
    }
    free(dx1);
    mh_free(&h);
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
    expect_refused("{\"expert\": 8}", "unknown key 'expert'; did you mean 'experts'?");
    expect_refused("{\"experts\": 4, \"top_k\": 5}", "key 'top_k' must be <= experts, got 5");
    expect_refused("{\"act\": \"gelu\"}", "key 'act' must be one of situ|swiglu, got 'gelu'");
    expect_refused("{\"beta1\": 0}", "key 'beta1' must be > 0, got 0");
    expect_refused("{\"latent_norm\": 1}", "key 'latent_norm' expects a bool");
    expect_refused("{\"routed_scaling\": 0}", "key 'routed_scaling' must be in");
    expect_refused("{\"shared\": -1}", "key 'shared' must be in [0, 1024], got -1");
}
END_TEST


int main(void)
{
    Suite *s = suite_create("latent_moe_api");
    TCase *tc = tcase_create("api");
    tcase_add_test(tc, declarations_roles_and_defaults);
    tcase_add_test(tc, flop_and_memory_counts);
    tcase_add_test(tc, routing_report);
    tcase_add_test(tc, inference_equals_training);
    tcase_add_test(tc, grads_accumulate_dx_overwrites);
    tcase_add_test(tc, options_refused);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
