/* KDA recurrence on its own (internal functions over q, k, v, g, beta, S_0): finite-difference
 * checks of both hand-written backwards, recurrent == chunked in double and in float, and the
 * exact fallback for strong decays. */
#include "kda_testkit.h"

#include <time.h>

static kda_dims dims(int64_t B, int64_t T, int64_t H, int64_t HV, int64_t dim_k, int64_t dim_v,
                     int64_t C)
{
    kda_dims d = {B, T, H, HV, dim_k, dim_v, C, 1.0 / sqrt((double)dim_k)};
    return d;
}

/* FD check of every input of the recurrence for one algorithm; returns the worst error. */
static double fd_all(kda_dims d, int alg, double g_lo, double g_hi, uint64_t seed)
{
    kt_core c;
    kt_core_make(&c, d, seed, g_lo, g_hi);
    kt_core_fwd(&c, alg);
    kt_core_bwd(&c, alg);
    struct {
        const char *name;
        double *x, *g;
        int64_t n;
    } t[] = {{"q", c.q, c.dq, c.nq},     {"k", c.k, c.dk, c.nq},
             {"v", c.v, c.dv, c.nv},     {"g", c.g, c.dg, c.ng},
             {"beta", c.beta, c.dbeta, c.nb}, {"S0", c.s0, c.ds0, c.ns}};
    double worst = 0;
    for (size_t i = 0; i < sizeof t / sizeof t[0]; i++) {
        double e = kt_core_fd(&c, alg, t[i].x, t[i].g, t[i].n, 12, seed + i);
        printf("  fd %-9s %-4s worst relative error %.2e\n", alg ? "chunked" : "recurrent",
               t[i].name, e);
        ck_assert_msg(kt_maxabs(t[i].g, t[i].n) > 0, "gradient of %s is all zero", t[i].name);
        worst = fmax(worst, e);
    }
    kt_core_free(&c);
    return worst;
}

START_TEST(test_fd_recurrent)
{
    /* GVA (4 value heads on 2 qk heads), dim_k != dim_v, T = 19 not a multiple of the chunk 8 */
    double w = fd_all(dims(2, 19, 2, 4, 6, 5, 8), KDA_RECURRENT, 0.05, 2.0, 11);
    ck_assert_msg(w < 1e-7, "recurrent backward vs finite differences: %.3e", w);
}
END_TEST

START_TEST(test_fd_chunked)
{
    double w = fd_all(dims(2, 19, 2, 4, 6, 5, 8), KDA_CHUNKED, 0.05, 2.0, 12);
    ck_assert_msg(w < 1e-7, "chunked backward vs finite differences: %.3e", w);
    /* chunk 32 = two sub-blocks, ragged last chunk */
    w = fd_all(dims(1, 45, 1, 2, 5, 4, 32), KDA_CHUNKED, 0.05, 1.0, 13);
    ck_assert_msg(w < 1e-7, "chunked backward (sub-blocks) vs finite differences: %.3e", w);
}
END_TEST

START_TEST(test_fd_chunked_strong_decay)
{
    /* g in [-8, -4]: a sub-block decays > KDA_THETA nats, so diagonal blocks take the exact
     * pairwise path */
    double w = fd_all(dims(1, 40, 1, 1, 4, 3, 32), KDA_CHUNKED, 4, 8, 14);
    /* gate gradients of ~1e-5 here, 1e-2 of their RMS: the stencil's ~1e-12 rounding noise is
     * 1e-7 of them (the analytic values match the recurrent form to 1e-15, see below) */
    ck_assert_msg(w < 1e-6, "chunked backward, strong decay: %.3e", w);
}
END_TEST

/* recurrent vs chunked forward and backward in double; returns the worst relative deviation */
static double rec_vs_chunked(kda_dims d, double g_lo, double g_hi, uint64_t seed)
{
    kt_core r, c;
    kt_core_make(&r, d, seed, g_lo, g_hi);
    kt_core_make(&c, d, seed, g_lo, g_hi);
    kt_core_fwd(&r, KDA_RECURRENT);
    kt_core_bwd(&r, KDA_RECURRENT);
    kt_core_fwd(&c, KDA_CHUNKED);
    kt_core_bwd(&c, KDA_CHUNKED);
    double e[] = {kt_maxrel(r.o, c.o, r.nv),       kt_maxrel(r.sT, c.sT, r.ns),
                  kt_maxrel(r.states, c.states, r.nst), kt_maxrel(r.dq, c.dq, r.nq),
                  kt_maxrel(r.dk, c.dk, r.nq),     kt_maxrel(r.dv, c.dv, r.nv),
                  kt_maxrel(r.dg, c.dg, r.ng),     kt_maxrel(r.dbeta, c.dbeta, r.nb),
                  kt_maxrel(r.ds0, c.ds0, r.ns)};
    double worst = 0;
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        worst = fmax(worst, e[i]);
    printf("  f64 recurrent vs chunked T=%lld C=%lld dk=%lld dv=%lld HV/H=%lld/%lld g in "
           "[-%g,-%g]: o %.1e S_T %.1e dq %.1e dk %.1e dv %.1e dg %.1e dbeta %.1e dS0 %.1e\n",
           (long long)d.T, (long long)d.C, (long long)d.dim_k, (long long)d.dim_v, (long long)d.HV,
           (long long)d.H, g_hi, g_lo, e[0], e[1], e[3], e[4], e[5], e[6], e[7], e[8]);
    kt_core_free(&r);
    kt_core_free(&c);
    return worst;
}

START_TEST(test_rec_eq_chunked_f64)
{
    double w = rec_vs_chunked(dims(2, 37, 2, 4, 6, 5, 8), 0.05, 2.0, 21);
    ck_assert_msg(w < 1e-10, "GVA, ragged: %.3e", w);
    w = rec_vs_chunked(dims(1, 150, 1, 1, 16, 12, 64), 0.0, 0.3, 22);
    ck_assert_msg(w < 1e-10, "chunk 64 (4 sub-blocks), ragged: %.3e", w);
    w = rec_vs_chunked(dims(2, 70, 2, 2, 8, 8, 16), 4, 8, 23);
    ck_assert_msg(w < 1e-10, "strong decay (exact diagonal blocks): %.3e", w);
    w = rec_vs_chunked(dims(1, 64, 1, 1, 8, 8, 64), 0, 12, 25);
    ck_assert_msg(w < 1e-10, "mixed decay (some blocks exact): %.3e", w);
    w = rec_vs_chunked(dims(1, 33, 1, 1, 4, 4, 1), 0.05, 2.0, 24);
    ck_assert_msg(w < 1e-10, "chunk 1: %.3e", w);
    w = rec_vs_chunked(dims(2, 1, 1, 2, 3, 2, 4), 0.05, 2.0, 26);
    ck_assert_msg(w < 1e-10, "one token: %.3e", w);
}
END_TEST

/* Either backward follows either forward: both save the state at every chunk start. */
START_TEST(test_saved_states_shared)
{
    kt_core a, b;
    kda_dims d = dims(1, 29, 1, 2, 5, 6, 8);
    kt_core_make(&a, d, 31, 0.05, 1.0);
    kt_core_make(&b, d, 31, 0.05, 1.0);
    kt_core_fwd(&a, KDA_CHUNKED);
    kt_core_bwd(&a, KDA_RECURRENT);
    kt_core_fwd(&b, KDA_RECURRENT);
    kt_core_bwd(&b, KDA_CHUNKED);
    ck_assert_double_lt(kt_maxrel(a.states, b.states, a.nst), 1e-12);
    ck_assert_double_lt(kt_maxrel(a.dg, b.dg, a.ng), 1e-10);
    ck_assert_double_lt(kt_maxrel(a.dq, b.dq, a.nq), 1e-10);
    kt_core_free(&a);
    kt_core_free(&b);
}
END_TEST

/* ---- float ---------------------------------------------------------------------------------- */

static float *to_f32(const double *x, int64_t n)
{
    float *y = malloc((size_t)(n > 0 ? n : 1) * sizeof(float));
    ck_assert_ptr_nonnull(y);
    for (int64_t i = 0; i < n; i++)
        y[i] = (float)x[i];
    return y;
}

/* rms(ref - x) / rms(ref) of a float result against the double reference */
static double rel_rms_f(const double *ref, const float *x, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (ref[i] - x[i]) * (ref[i] - x[i]);
        den += ref[i] * ref[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

/* Float recurrence (alg) against the double recurrent reference: worst of the forward errors
 * (o, S_T) in *fwd and of the gradient errors in *bwd, as rms ratios. */
static void f32_vs_f64(kda_dims d, int alg, double g_lo, double g_hi, uint64_t seed, double *fwd,
                       double *bwd)
{
    kt_core r;
    kt_core_make(&r, d, seed, g_lo, g_hi);
    kt_core_fwd(&r, KDA_RECURRENT);
    kt_core_bwd(&r, KDA_RECURRENT);
    float *q = to_f32(r.q, r.nq), *k = to_f32(r.k, r.nq), *v = to_f32(r.v, r.nv);
    float *g = to_f32(r.g, r.ng), *b = to_f32(r.beta, r.nb), *s0 = to_f32(r.s0, r.ns);
    float *dO = to_f32(r.dO, r.nv), *dsT = to_f32(r.dsT, r.ns);
    float *o = to_f32(r.o, r.nv), *sT = to_f32(r.sT, r.ns), *st = to_f32(r.states, r.nst);
    float *dq = to_f32(r.dq, r.nq), *dk = to_f32(r.dk, r.nq), *dv = to_f32(r.dv, r.nv);
    float *dg = to_f32(r.dg, r.ng), *db = to_f32(r.dbeta, r.nb), *ds0 = to_f32(r.ds0, r.ns);
    int64_t wn = kda_core_ws_elems_f32(&d, 2);
    float *ws = malloc((size_t)wn * sizeof(float));
    k3rt_error err;
    TU_OK(kda_core_fwd_f32(kt_stream(), alg, &d, q, k, v, g, b, s0, o, st, sT, ws, wn, &err), err);
    TU_OK(kda_core_bwd_f32(kt_stream(), alg, &d, q, k, v, g, b, st, dO, dsT, dq, dk, dv, dg, db,
                           ds0, ws, wn, &err),
          err);
    *fwd = fmax(rel_rms_f(r.o, o, r.nv), rel_rms_f(r.sT, sT, r.ns));
    double e[] = {rel_rms_f(r.dq, dq, r.nq), rel_rms_f(r.dk, dk, r.nq), rel_rms_f(r.dv, dv, r.nv),
                  rel_rms_f(r.dg, dg, r.ng), rel_rms_f(r.dbeta, db, r.nb),
                  rel_rms_f(r.ds0, ds0, r.ns)};
    *bwd = 0;
    for (size_t i = 0; i < sizeof e / sizeof e[0]; i++)
        *bwd = fmax(*bwd, e[i]);
    printf("  f32 %-9s vs f64 T=%lld C=%lld g in [-%g,-%g]: forward %.1e, gradients %.1e "
           "(rms ratios)\n", alg ? "chunked" : "recurrent", (long long)d.T, (long long)d.C,
           g_hi, g_lo, *fwd, *bwd);
    float *all[] = {q, k, v, g, b, s0, dO, dsT, o, sT, st, dq, dk, dv, dg, db, ds0, ws};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        free(all[i]);
    kt_core_free(&r);
}

/* fp32 tolerance, as rms(ref - x) / rms(ref) against the double recurrent form: 1e-6 for
 * outputs and states, 1e-5 for gradients (float epsilon 6e-8 times the ~C-term products and
 * sums of a chunk; measured 1e-7 and 2e-6 at worst). fla's own fp32 comparison allows 5e-3. */
START_TEST(test_rec_eq_chunked_f32)
{
    struct {
        kda_dims d;
        double lo, hi;
    } cases[] = {{dims(2, 37, 2, 4, 6, 5, 8), 0.05, 2.0},
                 {dims(1, 200, 2, 2, 32, 32, 64), 0.0, 0.5},
                 {dims(1, 96, 1, 1, 16, 16, 32), 5.0, 10.0}}; /* exact diagonal blocks */
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        for (int alg = 0; alg < 2; alg++) {
            double f, b;
            f32_vs_f64(cases[i].d, alg, cases[i].lo, cases[i].hi, 40 + i, &f, &b);
            ck_assert_msg(f < 1e-6, "case %zu alg %d: f32 forward rms error %.3e", i, alg, f);
            ck_assert_msg(b < 1e-5, "case %zu alg %d: f32 gradient rms error %.3e", i, alg, b);
        }
}
END_TEST

/* The workspace check refuses a buffer too small for one slot. */
START_TEST(test_core_rejects_small_workspace)
{
    kt_core c;
    kda_dims d = dims(1, 8, 1, 1, 4, 4, 4);
    kt_core_make(&c, d, 5, 0.1, 1.0);
    k3rt_error err;
    int rc = kda_core_fwd_f64(kt_stream(), KDA_CHUNKED, &d, c.q, c.k, c.v, c.g, c.beta, NULL,
                              c.o, c.states, NULL, c.ws, 10, &err);
    ck_assert_int_eq(rc, K3RT_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "workspace"));
    kda_dims bad = dims(1, 8, 2, 3, 4, 4, 4);
    rc = kda_core_fwd_f64(kt_stream(), KDA_CHUNKED, &bad, c.q, c.k, c.v, c.g, c.beta, NULL, c.o,
                          c.states, NULL, c.ws, c.ws_n, &err);
    ck_assert_int_eq(rc, K3RT_ERR_INVALID);
    ck_assert_ptr_nonnull(strstr(err.msg, "multiple of H"));
    kt_core_free(&c);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("kda_core");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_fd_recurrent);
    tcase_add_test(tc, test_fd_chunked);
    tcase_add_test(tc, test_fd_chunked_strong_decay);
    tcase_add_test(tc, test_rec_eq_chunked_f64);
    tcase_add_test(tc, test_saved_states_shared);
    tcase_add_test(tc, test_rec_eq_chunked_f32);
    tcase_add_test(tc, test_core_rejects_small_workspace);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
