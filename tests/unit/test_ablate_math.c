/* Compute efficiency against a base curve (core/ablate/efficiency.h): interpolation in
 * log-log space, the best-so-far envelope, and the anchored power-law extrapolation. */
#include <math.h>
#include <string.h>

#include "ablate/efficiency.h"
#include "testutil/testutil.h"

/* A base curve on the exact power law L = 10 C^-0.1 at C = 1e12 .. 1e15. */
static void law_curve(double *C, double *L, int n)
{
    for (int i = 0; i < n; i++) {
        C[i] = 1e12 * pow(10, 3.0 * i / (n - 1));
        L[i] = 10 * pow(C[i], -0.1);
    }
}

static double law_flops(double L) { return pow(10 / L, 10); }

START_TEST(test_fit_recovers_law)
{
    double C[7], L[7];
    law_curve(C, L, 7);
    power_law p;
    k3rt_error err = {0};
    TU_OK(eff_fit(C, L, 7, &p, &err), err);
    ck_assert(fabs(p.alpha - 0.1) < 1e-12);
    ck_assert(fabs(p.A / 10 - 1) < 1e-10);
    /* the late half: C >= 5e14 holds the last two points of seven */
    ck_assert_int_eq(p.points, 2);
}
END_TEST

START_TEST(test_interpolation_is_exact_on_a_power_law)
{
    double C[7], L[7];
    law_curve(C, L, 7);
    k3rt_error err = {0};
    for (double target = L[6]; target <= L[0]; target *= 1.01) {
        double f;
        int ext;
        TU_OK(eff_base_flops(C, L, 7, target, &f, &ext, &err), err);
        ck_assert_int_eq(ext, 0);
        ck_assert_msg(fabs(f / law_flops(target) - 1) < 1e-9, "target %g: %g vs %g", target, f,
                      law_flops(target));
    }
}
END_TEST

START_TEST(test_extrapolation_beyond_both_ends)
{
    double C[7], L[7];
    law_curve(C, L, 7);
    k3rt_error err = {0};
    double f;
    int ext;
    /* below the best loss: on the law, anchored at the last point */
    TU_OK(eff_base_flops(C, L, 7, 0.9 * L[6], &f, &ext, &err), err);
    ck_assert_int_eq(ext, 1);
    ck_assert(fabs(f / law_flops(0.9 * L[6]) - 1) < 1e-9);
    ck_assert(f > C[6]);
    /* above the first point: anchored there */
    TU_OK(eff_base_flops(C, L, 7, 1.1 * L[0], &f, &ext, &err), err);
    ck_assert_int_eq(ext, 1);
    ck_assert(fabs(f / law_flops(1.1 * L[0]) - 1) < 1e-9);
    ck_assert(f < C[0]);
}
END_TEST

/* A curve that bumps up: the envelope of the best loss so far is what counts, and a target
 * just under the best ever reached is extrapolated beyond the point that reached it. */
START_TEST(test_envelope)
{
    double C[5] = {1, 2, 4, 8, 16}, L[5] = {4, 3, 3.5, 2, 2.5};
    k3rt_error err = {0};
    double f;
    int ext;
    /* 3.2 is crossed between C = 1 (4) and C = 2 (3) */
    TU_OK(eff_base_flops(C, L, 5, 3.2, &f, &ext, &err), err);
    ck_assert_int_eq(ext, 0);
    double u = (log(3.2) - log(4)) / (log(3) - log(4));
    ck_assert(fabs(f - exp(u * log(2))) < 1e-12);
    /* 2.8 is crossed between the best so far (C = 2, 3) and C = 8 (2): the bump at 4 is not
     * a crossing */
    TU_OK(eff_base_flops(C, L, 5, 2.8, &f, &ext, &err), err);
    u = (log(2.8) - log(3)) / (log(2) - log(3));
    ck_assert(fabs(f - exp(log(2) + u * (log(8) - log(2)))) < 1e-12);
    /* the best loss itself: the point that reached it */
    TU_OK(eff_base_flops(C, L, 5, 2, &f, &ext, &err), err);
    ck_assert(ext == 0 && fabs(f - 8) < 1e-12);
}
END_TEST

START_TEST(test_failures)
{
    double C[3] = {1, 2, 4}, flat[3] = {3, 3, 3}, f;
    int ext;
    power_law p;
    k3rt_error err = {0};
    ck_assert_int_eq(eff_fit(C, flat, 3, &p, &err), K3RT_ERR_INVALID);
    ck_assert(strstr(err.msg, "does not fall"));
    /* below a flat base: nothing to extrapolate with */
    ck_assert_int_eq(eff_base_flops(C, flat, 3, 2.5, &f, &ext, &err), K3RT_ERR_INVALID);
    /* one point cannot be fitted */
    ck_assert_int_eq(eff_base_flops(C, flat, 1, 2.5, &f, &ext, &err), K3RT_ERR_INVALID);
    ck_assert(strstr(err.msg, "usable points"));
    ck_assert_int_eq(eff_base_flops(C, flat, 3, NAN, &f, &ext, &err), K3RT_ERR_INVALID);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ablate_math");
    TCase *tc = tcase_create("efficiency");
    tcase_add_test(tc, test_fit_recovers_law);
    tcase_add_test(tc, test_interpolation_is_exact_on_a_power_law);
    tcase_add_test(tc, test_extrapolation_beyond_both_ends);
    tcase_add_test(tc, test_envelope);
    tcase_add_test(tc, test_failures);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
