/* The CPU's vectorised float tanh and sigmoid (core/ops/cpu_vmath.c, built into this test), over
 * a sweep of every float exponent: within their measured worst ulp error of the double-precision
 * value and mostly correctly rounded; special values, an element's result independent of its position in the
 * array (vector body or tail) and equal to the scalar entry; and the float SiTU / SwiGLU,
 * sigmoid and SiLU kernels built on them against the double ones, forward and backward, the
 * same bits for one thread and two. */
#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ops/cpu_vmath.h"
#include "testutil/testutil.h"

static uint32_t bits(float x)
{
    uint32_t b;
    memcpy(&b, &x, sizeof b);
    return b;
}

/* |y - ref| in units in the last place of a float at ref (ref in double, far more accurate
 * than a float; the denormal ulp below FLT_MIN) */
static double ulp_error(float y, double ref)
{
    int e;
    frexp(fabs(ref), &e);
    double ulp = fabs(ref) < FLT_MIN ? 0x1p-149 : ldexp(1.0, e - 24);
    return fabs((double)y - ref) / ulp;
}

static double tanh_ref(float x) { return tanh((double)x); }
static double sigmoid_ref(float x) { return 1.0 / (1.0 + exp(-(double)x)); }

/* The worst errors over all 2^32 floats (measured once, exhaustively), which the dense sweep
 * below must not exceed; sigmoid's holds for x >= -87 (below, it is 0: the exact value is
 * then under 1.7e-38). */
#define TANH_MAX_ULP 2.44
#define SIGMOID_MAX_ULP 2.41

/* Every 1021st bit pattern (all exponents, both signs), NaNs and infinities left out. */
static int64_t sweep(float *x, int64_t cap)
{
    int64_t n = 0;
    for (uint64_t b = 0; b < (1ull << 32) && n < cap; b += 1021) {
        uint32_t u = (uint32_t)b;
        float f;
        memcpy(&f, &u, sizeof f);
        if (isfinite(f))
            x[n++] = f;
    }
    return n;
}

/* y within max_ulp of ref(x) for x >= lo, y == 0 below; and not just by a wide bound: most
 * results are the correctly rounded ones */
static void check_against(const float *x, const float *y, int64_t n, double (*ref)(float),
                          double max_ulp, float lo, const char *what)
{
    int64_t exact = 0, checked = 0;
    for (int64_t i = 0; i < n; i++) {
        if (x[i] < lo) {
            ck_assert_msg(y[i] == 0.0f, "%s(%a) = %a, not 0", what, (double)x[i], (double)y[i]);
            continue;
        }
        double r = ref(x[i]), d = ulp_error(y[i], r);
        ck_assert_msg(d <= max_ulp, "%s(%a) = %a, exact %a (%.3f ulp)", what, (double)x[i],
                      (double)y[i], r, d);
        exact += y[i] == (float)r;
        checked++;
    }
    ck_assert_msg(exact * 10 > checked * 9, "%s: only %lld of %lld correctly rounded", what,
                  (long long)exact, (long long)checked);
}

START_TEST(tanh_within_its_ulp_bound)
{
    enum { CAP = 1 << 23 };
    float *x = malloc(CAP * sizeof *x), *y = malloc(CAP * sizeof *y);
    int64_t n = sweep(x, CAP);
    cpu_tanh_div_f32(x, y, n, 1.0f);
    check_against(x, y, n, tanh_ref, TANH_MAX_ULP, -INFINITY, "tanh");
    /* the division is the element type's, before tanh */
    cpu_tanh_div_f32(x, y, 1000, 4.0f);
    for (int64_t i = 0; i < 1000; i++)
        ck_assert_uint_eq(bits(y[i]), bits(cpu_tanhf(x[i] / 4.0f)));
    free(x), free(y);
}
END_TEST

START_TEST(sigmoid_within_its_ulp_bound)
{
    enum { CAP = 1 << 23 };
    float *x = malloc(CAP * sizeof *x), *y = malloc(CAP * sizeof *y);
    int64_t n = sweep(x, CAP);
    cpu_sigmoid_f32(x, y, n);
    check_against(x, y, n, sigmoid_ref, SIGMOID_MAX_ULP, -87.0f, "sigmoid");
    free(x), free(y);
}
END_TEST

START_TEST(special_values)
{
    float x[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 1e-30f, -1e-30f, 0.0625f, -0.0625f,
                 9.5f, 9.6f, -20.0f, 120.0f, -120.0f, FLT_MAX, -FLT_MAX};
    enum { K = sizeof x / sizeof x[0] };
    float t[K], s[K];
    cpu_tanh_div_f32(x, t, K, 1.0f);
    cpu_sigmoid_f32(x, s, K);
    ck_assert_uint_eq(bits(t[0]), bits(0.0f));
    ck_assert_uint_eq(bits(t[1]), bits(-0.0f));
    ck_assert(t[2] == 1.0f && t[3] == -1.0f);
    ck_assert(isnan(t[4]) && isnan(s[4]));
    ck_assert(t[5] == 1e-30f && t[6] == -1e-30f);
    ck_assert(t[10] == 1.0f && t[11] == -1.0f && t[14] == 1.0f && t[15] == -1.0f);
    ck_assert(s[0] == 0.5f && s[1] == 0.5f && s[2] == 1.0f && s[3] == 0.0f);
    ck_assert(s[12] == 1.0f && s[13] == 0.0f && s[14] == 1.0f && s[15] == 0.0f);
    for (int i = 0; i < K; i++)
        if (isfinite(x[i])) {
            ck_assert_double_le(ulp_error(t[i], tanh_ref(x[i])), TANH_MAX_ULP);
            if (x[i] >= -87.0f)
                ck_assert_double_le(ulp_error(s[i], sigmoid_ref(x[i])), SIGMOID_MAX_ULP);
        }
}
END_TEST

START_TEST(position_does_not_change_bits)
{
    enum { M = 4099 };
    float *x = malloc(M * sizeof *x), *y = malloc(M * sizeof *y), one;
    tu_randnf(x, M, 6.0, 41);
    cpu_tanh_div_f32(x, y, M, 1.0f);
    for (int i = 0; i < M; i++) {
        ck_assert_uint_eq(bits(y[i]), bits(cpu_tanhf(x[i])));
        cpu_tanh_div_f32(x + i, &one, 1, 1.0f);
        ck_assert_uint_eq(bits(y[i]), bits(one));
    }
    cpu_sigmoid_f32(x, y, M);
    for (int i = 0; i < M; i++) {
        cpu_sigmoid_f32(x + i, &one, 1);
        ck_assert_uint_eq(bits(y[i]), bits(one));
    }
    free(x), free(y);
}
END_TEST

/* The float GLU and activation kernels against the double ones. Each float result is a few roundings from
 * the double one: 1e-6 relative to the largest magnitude of its tensor. */
static void close_to(const double *ref, const float *got, int64_t n, const char *what)
{
    double m = 0;
    for (int64_t i = 0; i < n; i++)
        m = fmax(m, fabs(ref[i]));
    for (int64_t i = 0; i < n; i++)
        ck_assert_msg(fabs(ref[i] - got[i]) <= 1e-6 * m, "%s[%lld]: %.9g vs %.9g", what,
                      (long long)i, got[i], ref[i]);
}

START_TEST(float_glu_and_activations_match_double_and_threads_do_not_change_bits)
{
    /* above the kernels' one-thread threshold (65536), and a ragged last block of 256 */
    enum { M = 70001 };
    size_t db = M * sizeof(double), fb = M * sizeof(float);
    double *g = malloc(db), *u = malloc(db), *dy = malloc(db), *o = malloc(db);
    double *dg = malloc(db), *du = malloc(db);
    float *gf = malloc(fb), *uf = malloc(fb), *dyf = malloc(fb), *of[2], *dgf[2], *duf[2];
    for (int t = 0; t < 2; t++)
        of[t] = malloc(fb), dgf[t] = malloc(fb), duf[t] = malloc(fb);
    tu_randnf(gf, M, 4.0, 42);
    tu_randnf(uf, M, 30.0, 43);
    tu_randnf(dyf, M, 1.0, 44);
    for (int i = 0; i < M; i++) /* the double reference reads the same inputs */
        g[i] = gf[i], u[i] = uf[i], dy[i] = dyf[i];
    k3rt_stream *st[2] = {tu_cpu_stream(1), tu_cpu_stream(2)};
    k3rt_error err = {0};
    for (int glu = K3RT_GLU_SWIGLU; glu <= K3RT_GLU_SITU; glu++) {
        TU_OK(k3rt_glu_fwd(st[0], K3RT_F64, glu, g, u, o, M, 4.0, 25.0, &err), err);
        TU_OK(k3rt_glu_bwd(st[0], K3RT_F64, glu, g, u, dy, dg, du, M, 4.0, 25.0, &err), err);
        for (int t = 0; t < 2; t++) {
            TU_OK(k3rt_glu_fwd(st[t], K3RT_F32, glu, gf, uf, of[t], M, 4.0, 25.0, &err), err);
            TU_OK(k3rt_glu_bwd(st[t], K3RT_F32, glu, gf, uf, dyf, dgf[t], duf[t], M, 4.0, 25.0,
                               &err), err);
        }
        close_to(o, of[0], M, "out");
        close_to(dg, dgf[0], M, "dg");
        close_to(du, duf[0], M, "du");
        ck_assert_int_eq(memcmp(of[0], of[1], fb), 0);
        ck_assert_int_eq(memcmp(dgf[0], dgf[1], fb), 0);
        ck_assert_int_eq(memcmp(duf[0], duf[1], fb), 0);
    }
    /* the activations that go through the vectorised sigmoid; backward accumulates into dx */
    int acts[] = {K3RT_ACT_SIGMOID, K3RT_ACT_SILU};
    for (int a = 0; a < 2; a++) {
        memset(dg, 0, db);
        TU_OK(k3rt_act_fwd(st[0], K3RT_F64, acts[a], g, o, M, &err), err);
        TU_OK(k3rt_act_bwd(st[0], K3RT_F64, acts[a], g, dy, dg, M, 1, &err), err);
        for (int t = 0; t < 2; t++) {
            memset(dgf[t], 0, fb);
            TU_OK(k3rt_act_fwd(st[t], K3RT_F32, acts[a], gf, of[t], M, &err), err);
            TU_OK(k3rt_act_bwd(st[t], K3RT_F32, acts[a], gf, dyf, dgf[t], M, 1, &err), err);
        }
        close_to(o, of[0], M, "act");
        close_to(dg, dgf[0], M, "act dx");
        ck_assert_int_eq(memcmp(of[0], of[1], fb), 0);
        ck_assert_int_eq(memcmp(dgf[0], dgf[1], fb), 0);
    }
    for (int t = 0; t < 2; t++) {
        k3rt_stream_destroy(st[t]);
        free(of[t]), free(dgf[t]), free(duf[t]);
    }
    free(g), free(u), free(dy), free(o), free(dg), free(du), free(gf), free(uf), free(dyf);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("vmath");
    TCase *tc = tcase_create("vmath");
    tcase_add_test(tc, tanh_within_its_ulp_bound);
    tcase_add_test(tc, sigmoid_within_its_ulp_bound);
    tcase_add_test(tc, special_values);
    tcase_add_test(tc, position_does_not_change_bits);
    tcase_add_test(tc, float_glu_and_activations_match_double_and_threads_do_not_change_bits);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
