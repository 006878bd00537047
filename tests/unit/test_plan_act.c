/* The activation planner on a made-up cost table: everything kept when it fits; under a
 * budget the cheapest choice that fits (checked against every combination); the PCIe
 * capacity respected; a recipe's fixed policy honoured; an impossible budget refused with the
 * smallest one that works. */
#include <math.h>
#include <string.h>

#include "plan/plan_act.h"
#include "testutil/testutil.h"

enum { N = 4 };

static void table(act_cost *c)
{
    /* name, bytes, elem, instances, fp8, recompute_s, overlap_s */
    static const struct { const char *n; double b; int inst, fp8; double r, ov; } T[N] = {
        {"mixer.K.qkv", 4e9, 3, 1, 0.030, 0.010},
        {"mixer.K.states", 2e9, 3, 0, 0.050, 0.010},
        {"ffn.moe.hidden", 6e9, 2, 1, 0.020, 0.020},
        {"mixer.M.scores", 1e9, 1, 0, 0.004, 0.002},
    };
    for (int i = 0; i < N; i++) {
        memset(&c[i], 0, sizeof c[i]);
        snprintf(c[i].name, sizeof c[i].name, "%s", T[i].n);
        c[i].bytes = T[i].b;
        c[i].elem_bytes = 2;
        c[i].instances = T[i].inst;
        c[i].fp8_ok = T[i].fp8;
        c[i].recompute_s = T[i].r;
        c[i].overlap_s = T[i].ov;
        c[i].fixed = -1;
    }
}

static act_plan plan_of(act_cost *c, double budget, double pcie_cap)
{
    act_plan p;
    memset(&p, 0, sizeof p);
    p.cls = c;
    p.n = N;
    p.budget = budget;
    p.window = 0.5e9;
    p.hbm_bw = 4e12;
    p.pcie_bw = 50e9;
    p.pcie_capacity_s = pcie_cap;
    return p;
}

/* The least extra time over all 4^N choices that fit, by brute force. */
static double brute(act_plan *p)
{
    double best = INFINITY;
    for (int code = 0; code < 256; code++) {
        double mem = 0, t = 0, pcie = 0;
        int moved = 0, ok = 1;
        for (int i = 0, k = code; i < N; i++, k /= 4) {
            act_cost *c = &p->cls[i];
            int o = k % 4;
            double n = c->instances, b = c->bytes;
            if ((o == ACT_FP8 && !c->fp8_ok) || (c->fixed >= 0 && o != c->fixed))
                ok = 0;
            moved |= o != ACT_KEEP;
            if (o == ACT_KEEP)
                mem += n * b;
            if (o == ACT_FP8) {
                mem += n * b * (1 + 4.0 / 128) / 2;
                t += 3 * n * b / p->hbm_bw;
            }
            if (o == ACT_OFFLOAD) {
                pcie += 2 * n * b / p->pcie_bw;
                t += n * fmax(0, 2 * b / p->pcie_bw - c->overlap_s);
            }
            if (o == ACT_RECOMPUTE)
                t += n * c->recompute_s;
        }
        mem += moved ? p->window : 0;
        if (ok && mem <= p->budget && pcie <= p->pcie_capacity_s)
            best = fmin(best, t);
    }
    return best;
}

START_TEST(keeps_everything_when_it_fits)
{
    act_cost c[N];
    table(c);
    act_plan p = plan_of(c, 40e9, 10);
    k3rt_error err = {0};
    TU_OK(act_plan_solve(&p, &err), err);
    for (int i = 0; i < N; i++)
        ck_assert_int_eq(c[i].policy, ACT_KEEP);
    ck_assert_double_eq(p.peak, 31e9);
    ck_assert_double_eq(p.extra_s, 0);
}
END_TEST

START_TEST(meets_budgets_at_least_time)
{
    const double budgets[] = {30e9, 25e9, 20e9, 12e9, 6e9, 2e9, 0.6e9};
    const double caps[] = {10, 0.5, 0.1, 0};
    for (size_t b = 0; b < sizeof budgets / sizeof budgets[0]; b++)
        for (size_t k = 0; k < sizeof caps / sizeof caps[0]; k++) {
            act_cost c[N];
            table(c);
            act_plan p = plan_of(c, budgets[b], caps[k]);
            k3rt_error err = {0};
            TU_OK(act_plan_solve(&p, &err), err);
            ck_assert_double_le(p.peak, budgets[b]);
            ck_assert_double_le(p.pcie_s, caps[k] + 1e-12);
            double best = brute(&p);
            /* the DP rounds memory up to budget/4096 units: at most a hair above optimal */
            ck_assert_msg(p.extra_s <= best + 1e-3, "budget %g cap %g: %g s vs best %g s",
                          budgets[b], caps[k], p.extra_s, best);
            ck_assert_double_ge(p.extra_s, best - 1e-12);
        }
}
END_TEST

START_TEST(honours_fixed_policies)
{
    act_cost c[N];
    table(c);
    c[2].fixed = ACT_KEEP;  /* the recipe keeps the 12 GB class */
    act_plan p = plan_of(c, 14e9, 10);
    k3rt_error err = {0};
    TU_OK(act_plan_solve(&p, &err), err);
    ck_assert_int_eq(c[2].policy, ACT_KEEP);
    ck_assert_double_le(p.peak, 14e9);
}
END_TEST

START_TEST(refuses_an_impossible_budget)
{
    act_cost c[N];
    table(c);
    c[3].fixed = ACT_KEEP;  /* 1 GB that must stay: the least is 1 GB + the 0.5 GB window */
    act_plan p = plan_of(c, 1.2e9, 10);
    k3rt_error err = {0};
    ck_assert_int_ne(act_plan_solve(&p, &err), 0);
    ck_assert_double_eq(p.min_budget, 1.5e9);
    ck_assert_ptr_nonnull(strstr(err.msg, "the smallest that works is 1.50 GB"));
    ck_assert_ptr_nonnull(strstr(err.msg, "1.20 GB"));
    act_plan q = plan_of(c, 1.5e9, 10);
    memset(&err, 0, sizeof err);
    TU_OK(act_plan_solve(&q, &err), err);
    ck_assert_double_le(q.peak, 1.5e9);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plan_act");
    TCase *tc = tcase_create("plan_act");
    tcase_add_test(tc, keeps_everything_when_it_fits);
    tcase_add_test(tc, meets_budgets_at_least_time);
    tcase_add_test(tc, honours_fixed_policies);
    tcase_add_test(tc, refuses_an_impossible_budget);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
