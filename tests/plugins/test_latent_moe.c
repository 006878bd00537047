/* latent_moe math: finite differences of the whole layer with the routing held fixed (every
 * entry of every input and parameter, the balancer's score gradient included), the generic
 * checker, invariance to the routed scaling factor under the latent norm at eps = 0, the
 * grouped path against a dense masked computation (ties included), and f32 against f64. */
#include "moe_testkit.h"

/* ---- finite differences, routing held fixed ------------------------------------------------ */

typedef struct fd_stats {
    double worst;
    char what[256];
    int64_t checked, flips;
} fd_stats;

/* L = sum(y * dy) + sum(s * D): the second term stands for a balancer's auxiliary loss, whose
 * gradient D reaches the layer as d_scores. s is recomputed in double from x and the router. */
static double fd_loss(moe_h *h, const int32_t *sel0, int64_t *flips)
{
    mh_sync(h);
    mh_forward(h, 1);
    double L = 0;
    for (int64_t i = 0; i < h->n; i++)
        L += mh_get(h, h->y, i) * h->dy64[i];
    if (h->dscores) {
        double *s = malloc((size_t)(h->N * h->E) * sizeof(double));
        mh_scores(h, s);
        for (int64_t i = 0; i < h->N * h->E; i++)
            L += s[i] * (double)h->dscores[i];
        free(s);
    }
    if (memcmp(h->routing.selected.data, sel0, (size_t)(h->N * h->k) * sizeof(int32_t)))
        (*flips)++;
    return L;
}

static void fd_target(moe_h *h, const char *name, double *v, const double *g, int64_t n,
                      const int32_t *sel0, double eps, fd_stats *st)
{
    double rms = 0;
    for (int64_t i = 0; i < n; i++)
        rms += g[i] * g[i];
    rms = sqrt(rms / (double)n);
    double floor = 1e-3 * rms + 1e-12, worst = 0;
    for (int64_t i = 0; i < n; i++) {
        double keep = v[i];
        v[i] = keep + eps;
        double lp = fd_loss(h, sel0, &st->flips);
        v[i] = keep - eps;
        double lm = fd_loss(h, sel0, &st->flips);
        v[i] = keep;
        double num = (lp - lm) / (2 * eps), rel = fabs(g[i] - num) / fmax(fmax(fabs(g[i]),
                                                                               fabs(num)), floor);
        st->checked++;
        worst = fmax(worst, rel);
        if (rel > st->worst) {
            st->worst = rel;
            snprintf(st->what, sizeof st->what, "%s[%lld]: analytic %.9e numeric %.9e", name,
                     (long long)i, g[i], num);
        }
    }
    printf("    %-34s %5lld entries, worst %.2e\n", name, (long long)n, worst);
}

static void fd_case(const char *cfg, int with_dscores)
{
    moe_h h;
    mh_init(&h, K3RT_F64, cfg, 2, 3, 8, 5, 0.05, 1);
    if (with_dscores) {
        h.dscores = malloc((size_t)(h.N * h.E) * sizeof(float));
        tu_randnf(h.dscores, h.N * h.E, 0.5, 9);
    }
    mh_forward(&h, 1);
    mh_backward(&h);
    int32_t *sel0 = malloc((size_t)(h.N * h.k) * sizeof(int32_t));
    memcpy(sel0, h.routing.selected.data, (size_t)(h.N * h.k) * sizeof(int32_t));
    /* analytic gradients, copied out before the perturbed forwards overwrite the buffers */
    double *gx = malloc((size_t)h.n * sizeof(double)), *gp[MH_MAX_PARAMS];
    memcpy(gx, h.dx, (size_t)h.n * sizeof(double));
    for (int i = 0; i < h.np; i++) {
        size_t b = k3rt_tensor_bytes(&h.grads[i]);
        gp[i] = malloc(b);
        memcpy(gp[i], h.grads[i].data, b);
    }
    fd_stats st = {0};
    printf("latent_moe fd %s%s:\n", cfg, with_dscores ? " + d_scores" : "");
    fd_target(&h, "grad.x", h.x64, gx, h.n, sel0, 1e-5, &st);
    for (int i = 0; i < h.np; i++) {
        char name[160];
        snprintf(name, sizeof name, "grad.%s", rig_param(&h.m, i)->name);
        fd_target(&h, name, h.p64[i], gp[i], k3rt_tensor_numel(&h.params[i]), sel0, 1e-5, &st);
    }
    printf("  %lld entries, worst relative error %.2e (%s), routing changed in %lld of %lld "
           "evaluations\n", (long long)st.checked, st.worst, st.what, (long long)st.flips,
           (long long)(2 * st.checked));
    ck_assert_int_eq(st.flips, 0);
    ck_assert_msg(st.worst < 1e-6, "%s: %s", cfg, st.what);
    for (int i = 0; i < h.np; i++)
        free(gp[i]);
    free(gx), free(sel0);
    mh_free(&h);
}

START_TEST(fd_situ_norm_shared_dscores)
{
    /* small caps and large weights bend both tanh's of SiTU */
    fd_case("{\"experts\": 5, \"top_k\": 2, \"latent\": 6, \"expert_hidden\": 7, \"shared\": 2, "
            "\"shared_hidden\": 3, \"beta1\": 1.5, \"beta2\": 2.0, \"init_std\": 0.5}", 1);
}
END_TEST

START_TEST(fd_swiglu_plain_scaled)
{
    /* NVIDIA's LatentMoE: no latent norm, no renormalisation, a routed scaling factor */
    fd_case("{\"experts\": 5, \"top_k\": 3, \"latent\": 6, \"expert_hidden\": 4, \"shared\": 0, "
            "\"act\": \"swiglu\", \"latent_norm\": false, \"renormalize\": false, "
            "\"routed_scaling\": 2.5, \"init_std\": 0.5}", 0);
}
END_TEST

START_TEST(fd_top1_eps0_dscores)
{
    /* k = 1 with renormalisation: the gate is constant, the router learns from d_scores only */
    fd_case("{\"experts\": 4, \"top_k\": 1, \"latent\": 5, \"expert_hidden\": 6, \"shared\": 1, "
            "\"shared_hidden\": 4, \"norm_eps\": 0, \"routed_scaling\": 0.7, \"init_std\": 0.5}",
            1);
    fd_case("{\"experts\": 4, \"top_k\": 4, \"latent\": 5, \"expert_hidden\": 3, \"shared\": 1, "
            "\"shared_hidden\": 4, \"init_std\": 0.5}", 1);
}
END_TEST

START_TEST(fd_generic_checker)
{
    k3rt_error err = {0};
    json_t *cfg = json_loads("{\"experts\": 6, \"top_k\": 2, \"latent\": 8, \"expert_hidden\": "
                             "8, \"shared\": 2, \"shared_hidden\": 4, \"init_std\": 0.4}", 0,
                             NULL);
    fd_options o;
    memset(&o, 0, sizeof o);
    o.batch = 2, o.seq = 4, o.d_model = 12, o.seed = 3, o.samples = 16, o.eps = 1e-5;
    fd_result r;
    TU_OK(fd_check_module(mh_plugin(), cfg, &o, &r, &err), err);
    json_decref(cfg);
    printf("latent_moe generic fd: %d entries, worst %.2e (%s)\n", r.n_checked, r.worst,
           r.worst_what);
    ck_assert_int_eq(r.n_checked, 10 * 16 + 8);  /* x, nine parameters, all 8 norm gains */
    ck_assert_msg(r.worst < 1e-6, "%s", r.worst_what);
}
END_TEST

/* ---- the latent norm cancels the routed scale (ERRATA: exactly only at eps = 0) ---------- */

typedef struct run_out {
    double *y, *dx, *g[MH_MAX_PARAMS];
    int np;
    int64_t n, gn[MH_MAX_PARAMS];
} run_out;

static run_out run_once(const char *cfg)
{
    moe_h h;
    mh_init(&h, K3RT_F64, cfg, 2, 8, 16, 21, 0.05, 1);
    mh_forward(&h, 1);
    mh_backward(&h);
    run_out o;
    memset(&o, 0, sizeof o);
    o.n = h.n, o.np = h.np;
    o.y = malloc((size_t)h.n * sizeof(double));
    o.dx = malloc((size_t)h.n * sizeof(double));
    memcpy(o.y, h.y, (size_t)h.n * sizeof(double));
    memcpy(o.dx, h.dx, (size_t)h.n * sizeof(double));
    for (int i = 0; i < h.np; i++) {
        o.gn[i] = k3rt_tensor_numel(&h.grads[i]);
        o.g[i] = malloc((size_t)o.gn[i] * sizeof(double));
        memcpy(o.g[i], h.grads[i].data, (size_t)o.gn[i] * sizeof(double));
    }
    mh_free(&h);
    return o;
}

static void run_free(run_out *o)
{
    free(o->y), free(o->dx);
    for (int i = 0; i < o->np; i++)
        free(o->g[i]);
}

static double maxrel(const double *a, const double *b, int64_t n)
{
    double m = 0, s = 0;
    for (int64_t i = 0; i < n; i++) {
        m = fmax(m, fabs(a[i] - b[i]));
        s = fmax(s, fabs(a[i]));
    }
    return s > 0 ? m / s : m;
}

/* Largest relative difference of y and of every gradient between two configurations. */
static void compare_runs(const char *a_cfg, const char *b_cfg, double *dy_, double *dg)
{
    run_out a = run_once(a_cfg), b = run_once(b_cfg);
    *dy_ = maxrel(a.y, b.y, a.n);
    *dg = maxrel(a.dx, b.dx, a.n);
    for (int i = 0; i < a.np; i++)
        *dg = fmax(*dg, maxrel(a.g[i], b.g[i], a.gn[i]));
    run_free(&a), run_free(&b);
}

START_TEST(latent_norm_cancels_routed_scale_at_eps0)
{
#define BASE "{\"experts\": 8, \"top_k\": 3, \"latent\": 8, \"expert_hidden\": 12, \"shared\": 1, "
    const char *ref0 = BASE "\"norm_eps\": 0}";
    const char *variants0[] = {
        BASE "\"norm_eps\": 0, \"routed_scaling\": 3.7}",
        BASE "\"norm_eps\": 0, \"renormalize\": false}",
        BASE "\"norm_eps\": 0, \"renormalize\": false, \"routed_scaling\": 0.05}"};
    for (int v = 0; v < 3; v++) {
        double ey, eg;
        compare_runs(ref0, variants0[v], &ey, &eg);
        printf("latent_moe invariance at eps 0, %s: y %.2e, gradients %.2e (max relative)\n",
               variants0[v] + strlen(BASE), ey, eg);
        ck_assert_msg(ey < 1e-13, "forward changed by %g", ey);
        ck_assert_msg(eg < 1e-11, "gradients changed by %g", eg);
    }
    /* the property the test relies on is real: with eps = 1e-5 the scale shows through, and
     * without the norm the forward scales outright */
    double ey, eg;
    compare_runs(BASE "\"norm_eps\": 1e-5}", BASE "\"norm_eps\": 1e-5, \"routed_scaling\": 3.7}",
                 &ey, &eg);
    printf("latent_moe at eps 1e-5, routed_scaling 3.7: y %.2e, gradients %.2e\n", ey, eg);
    ck_assert_msg(ey > 1e-9, "eps = 1e-5 should leave a visible trace, got %g", ey);
    /* with neither the norm nor shared experts, y is linear in the scale */
    compare_runs("{\"experts\": 8, \"top_k\": 3, \"latent\": 8, \"shared\": 0, "
                 "\"latent_norm\": false}", "{\"experts\": 8, \"top_k\": 3, \"latent\": 8, "
                 "\"shared\": 0, \"latent_norm\": false, \"routed_scaling\": 3.7}", &ey, &eg);
    printf("latent_moe without the norm, routed_scaling 3.7: y changes by %.15f (2.7 expected)\n",
           ey);
    ck_assert_msg(fabs(ey - 2.7) < 1e-12, "without the norm y must scale by 3.7, changed by %g",
                  ey);
#undef BASE
}
END_TEST

/* ---- grouped == dense -------------------------------------------------------------------- */

static void dense_case(const char *cfg_text, const mh_cfg *c, int64_t l, int64_t m, int64_t Hs,
                       double bias_std, int tie_a, int tie_b)
{
    moe_h h;
    mh_init(&h, K3RT_F64, cfg_text, 2, 16, 12, 31, bias_std, 2);
    if (tie_a >= 0) {
        /* two experts with the same router row and bias: every token ties them */
        double *Wr = h.p64[mh_param_index(&h, "router.weight")];
        memcpy(Wr + tie_b * h.d, Wr + tie_a * h.d, (size_t)h.d * sizeof(double));
        h.bias[tie_b] = h.bias[tie_a];
        mh_sync(&h);
    }
    mh_forward(&h, 1);
    double *ref = malloc((size_t)h.n * sizeof(double));
    int *mask = malloc((size_t)(h.N * h.E) * sizeof(int));
    mh_dense_reference(&h, c, l, m, Hs, ref, mask);
    double diff = maxrel(ref, h.y, h.n);
    /* the grouped path's choice is the dense one, and its counts add up */
    const int32_t *sel = h.routing.selected.data;
    const int64_t *counts = h.routing.counts.data;
    int64_t total = 0, decided_ties = 0;
    for (int e = 0; e < h.E; e++)
        total += counts[e];
    ck_assert_int_eq(total, h.N * h.k);
    for (int64_t t = 0; t < h.N; t++) {
        int chosen = 0;
        for (int j = 0; j < h.k; j++) {
            ck_assert_msg(mask[t * h.E + sel[t * h.k + j]], "token %lld: expert %d chosen, the "
                          "dense rule disagrees", (long long)t, sel[t * h.k + j]);
            chosen += (sel[t * h.k + j] == tie_a) + 2 * (sel[t * h.k + j] == tie_b);
        }
        if (tie_a >= 0) {
            ck_assert_msg(chosen != 2, "token %lld: tie went to the higher id", (long long)t);
            decided_ties += chosen == 1;
        }
    }
    printf("latent_moe grouped vs dense %s: max |dy|/max|y| = %.2e, ties decided by id: %lld\n",
           cfg_text, diff, (long long)decided_ties);
    ck_assert_msg(diff < 1e-13, "grouped and dense differ by %g", diff);
    if (tie_a >= 0)
        ck_assert_msg(decided_ties > 0, "no token had to break the tie");
    free(ref), free(mask);
    mh_free(&h);
}

START_TEST(grouped_equals_dense)
{
    mh_cfg situ = {1, 4.0, 25.0, 1, 1, 1e-5, 1.0};
    dense_case("{\"experts\": 7, \"top_k\": 3, \"latent\": 6, \"expert_hidden\": 10, "
               "\"shared\": 2, \"shared_hidden\": 5, \"init_std\": 0.5}",
               &situ, 6, 10, 10, 0.3, -1, -1);
    dense_case("{\"experts\": 7, \"top_k\": 3, \"latent\": 6, \"expert_hidden\": 10, "
               "\"shared\": 2, \"shared_hidden\": 5, \"init_std\": 0.5}",
               &situ, 6, 10, 10, 0.0, 2, 5);
    mh_cfg plain = {0, 4.0, 25.0, 0, 0, 0, 2.5};
    dense_case("{\"experts\": 9, \"top_k\": 2, \"latent\": 4, \"expert_hidden\": 6, "
               "\"shared\": 0, \"act\": \"swiglu\", \"latent_norm\": false, \"renormalize\": "
               "false, \"routed_scaling\": 2.5, \"init_std\": 0.5}",
               &plain, 4, 6, 0, 0.2, 0, 8);
}
END_TEST

/* The bias only moves the selection: with a large bias on one expert every token takes it, and
 * its gate weight still comes from the unbiased score. */
START_TEST(bias_selects_but_does_not_weight)
{
    moe_h h;
    mh_init(&h, K3RT_F64, "{\"experts\": 6, \"top_k\": 2, \"latent\": 4, \"init_std\": 0.5}", 1,
            10, 8, 41, 0.0, 1);
    h.bias[4] = 5.0f;
    mh_forward(&h, 1);
    double *s = malloc((size_t)(h.N * h.E) * sizeof(double));
    mh_scores(&h, s);
    const int32_t *sel = h.routing.selected.data;
    const float *s32 = h.routing.scores.data;
    for (int64_t t = 0; t < h.N; t++) {
        ck_assert_int_eq(sel[t * 2], 4);
        for (int e = 0; e < h.E; e++)
            ck_assert(s32[t * h.E + e] == (float)s[t * h.E + e]);
    }
    ck_assert(((const float *)h.routing.bias.data)[4] == 5.0f);
    /* the layer's output equals the dense reference whose gates use the raw scores */
    mh_cfg c = {1, 4.0, 25.0, 1, 1, 1e-5, 1.0};
    double *ref = malloc((size_t)h.n * sizeof(double));
    int *mask = malloc((size_t)(h.N * h.E) * sizeof(int));
    mh_dense_reference(&h, &c, 4, 4, 8, ref, mask);
    ck_assert(maxrel(ref, h.y, h.n) < 1e-13);
    free(s), free(ref), free(mask);
    mh_free(&h);
}
END_TEST

/* ---- f32 against f64 ---------------------------------------------------------------------- */

START_TEST(f32_matches_f64)
{
    const char *cfg = "{\"experts\": 8, \"top_k\": 2, \"latent\": 16, \"expert_hidden\": 24, "
                      "\"shared\": 2, \"shared_hidden\": 8, \"init_std\": 0.2}";
    moe_h a, b;
    mh_init(&a, K3RT_F64, cfg, 2, 16, 32, 51, 0.05, 2);
    mh_init(&b, K3RT_F32, cfg, 2, 16, 32, 51, 0.05, 2);
    mh_forward(&a, 1);
    mh_backward(&a);
    mh_forward(&b, 1);
    mh_backward(&b);
    ck_assert(memcmp(a.routing.selected.data, b.routing.selected.data,
                     (size_t)(a.N * a.k) * sizeof(int32_t)) == 0);
    double *tmp = malloc((size_t)a.n * sizeof(double));
    k3rt_error err = {0};
    TU_OK(k3rt_convert(tmp, K3RT_F64, b.y, K3RT_F32, a.n, &err), err);
    double ey = tu_rel_rms(a.y, tmp, a.n);
    TU_OK(k3rt_convert(tmp, K3RT_F64, b.dx, K3RT_F32, a.n, &err), err);
    double edx = tu_rel_rms(a.dx, tmp, a.n), edw = 0;
    free(tmp);
    for (int i = 0; i < a.np; i++) {
        int64_t n = k3rt_tensor_numel(&a.grads[i]);
        double *g = malloc((size_t)n * sizeof(double));
        TU_OK(k3rt_convert(g, K3RT_F64, b.grads[i].data, K3RT_F32, n, &err), err);
        edw = fmax(edw, tu_rel_rms(a.grads[i].data, g, n));
        free(g);
    }
    printf("latent_moe f32 vs f64: y %.2e, dx %.2e, dW %.2e (relative rms)\n", ey, edx, edw);
    ck_assert(ey < 1e-5 && edx < 1e-5 && edw < 1e-5);
    mh_free(&a), mh_free(&b);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("latent_moe");
    TCase *tc = tcase_create("math");
    tcase_add_test(tc, fd_situ_norm_shared_dscores);
    tcase_add_test(tc, fd_swiglu_plain_scaled);
    tcase_add_test(tc, fd_top1_eps0_dscores);
    tcase_add_test(tc, fd_generic_checker);
    tcase_add_test(tc, latent_norm_cancels_routed_scale_at_eps0);
    tcase_add_test(tc, grouped_equals_dense);
    tcase_add_test(tc, bias_selects_but_does_not_weight);
    tcase_add_test(tc, f32_matches_f64);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
