/* per_head_muon, the Muon rule against exact math: Newton-Schulz output against the exact map
 * U p^5(sigma / ||G||_F) V^T and the quintic's band, update RMS against its prediction from
 * singular values, and two steps of momentum + Nesterov + decay in closed form.
 *
 * Newton-Schulz is reached through the vtable: with momentum 0 the orthogonalised matrix is
 * the gradient itself, and from W = 0 with lr = 1, scale = 1 and no decay one step leaves
 * W = -sqrt(max(R, C)) * NS(G). */
#include "muon_testkit.h"

/* NS(G) for a matrix of R x C through one optimizer step. */
static void ns_through_step(int dtype, const double *G, int64_t R, int64_t C, double *O)
{
    mt_spec sp = {"w", K3RT_ROLE_MATRIX, 2, {R, C, 0}, 0, 0, 0, 0, 0};
    mt_harness h;
    mt_init(&h, dtype, "{\"momentum\": 0, \"weight_decay\": 0, \"scale\": 1}", &sp, 1, 2);
    mt_set_grad(&h, 0, G);
    mt_step(&h, 1.0, 1);
    mt_get_param(&h, 0, O);
    double f = -1.0 / sqrt((double)(R > C ? R : C));
    for (int64_t i = 0; i < R * C; i++)
        O[i] *= f;
    mt_free(&h);
}

/* Gaussian G of each shape: NS output against the exact map, and the band on the singular
 * values that start at >= 2e-3 (read as u_j^T O v_j, the output's value in that direction). */
static void exact_map(int dtype, int64_t R, int64_t C, uint64_t seed, double tol)
{
    int64_t n = R * C, k = R < C ? R : C;
    double *G = mt_alloc(n), *O = mt_alloc(n), *want = mt_alloc(n), *sn = mt_alloc(k);
    tu_randn(G, n, 0.3, seed);
    ns_through_step(dtype, G, R, C, O);
    mt_ns_exact(G, R, C, 5, want, sn);
    for (int64_t i = 0; i < n; i++)
        want[i] -= O[i];
    double rel = mt_frob(want, n) / mt_frob(O, n);
    /* band on the directions of G */
    double *U = mt_alloc(R * k), *s = mt_alloc(k), *V = mt_alloc(C * k);
    mt_svd(G, R, C, U, s, V);
    double lo = INFINITY, hi = -INFINITY, smin = INFINITY, out_smin = 0;
    int in_band = 0;
    for (int64_t j = 0; j < k; j++) {
        double d = 0;
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++)
                d += U[r * k + j] * O[r * C + c] * V[c * k + j];
        double x = s[j] / (mt_frob(G, n) + 1e-7);
        if (x < smin)
            smin = x, out_smin = d;
        if (x < 2e-3)
            continue;
        in_band++;
        lo = fmin(lo, d), hi = fmax(hi, d);
    }
    printf("NS %s %lldx%lld: |O - U p5(s) V^T| / |O| = %.2e; %d of %lld singular values >= 2e-3 "
           "map into [%.4f, %.4f]; smallest normalised sigma %.2e -> %.4f\n",
           k3rt_dtype_name(dtype), (long long)R, (long long)C, rel, in_band, (long long)k, lo,
           hi, smin, out_smin);
    ck_assert_msg(rel < tol, "NS differs from the exact map by %.3e", rel);
    ck_assert(in_band > 0);
    ck_assert_msg(lo >= 0.68 && hi <= 1.21, "band [%.4f, %.4f]", lo, hi);
    free(G), free(O), free(want), free(sn), free(U), free(s), free(V);
}

START_TEST(exact_map_gaussian)
{
    exact_map(K3RT_F64, 48, 16, 1, 1e-10);  /* tall */
    exact_map(K3RT_F64, 16, 48, 2, 1e-10);  /* wide */
    exact_map(K3RT_F64, 80, 80, 3, 1e-10);  /* square: its smallest sigma are below 2e-3 */
    exact_map(K3RT_F32, 48, 16, 1, 1e-4);
    exact_map(K3RT_F32, 16, 48, 2, 1e-4);
    exact_map(K3RT_F32, 80, 80, 3, 1e-4);
}
END_TEST

/* G = U diag(s) V^T with ||G||_F = 1 and every s_j in [2e-3, 1]: all the output's singular
 * values (from a Jacobi SVD of the output itself) lie in [0.68, 1.21]. */
static void band(int dtype, int64_t R, int64_t C, uint64_t seed)
{
    int64_t k = R < C ? R : C, n = R * C;
    double *U = mt_alloc(R * k), *V = mt_alloc(C * k), *s = mt_alloc(k), *G = mt_alloc(n);
    mt_orthonormal(U, R, k, seed);
    mt_orthonormal(V, C, k, seed + 100);
    double rest = 0;
    for (int64_t j = 1; j < k; j++) {  /* log-spaced from 0.5 down to 2e-3 */
        s[j] = 0.5 * pow(2e-3 / 0.5, (double)(j - 1) / (double)(k - 2));
        rest += s[j] * s[j];
    }
    ck_assert(rest < 1);
    s[0] = sqrt(1 - rest);
    for (int64_t j = 0; j < k; j++)
        for (int64_t r = 0; r < R; r++)
            for (int64_t c = 0; c < C; c++)
                G[r * C + c] += s[j] * U[r * k + j] * V[c * k + j];
    double *O = mt_alloc(n), *Uo = mt_alloc(R * k), *Vo = mt_alloc(C * k), *so = mt_alloc(k);
    ns_through_step(dtype, G, R, C, O);
    mt_svd(O, R, C, Uo, so, Vo);
    double lo = INFINITY, hi = -INFINITY, plo = INFINITY, phi = -INFINITY;
    for (int64_t j = 0; j < k; j++) {
        lo = fmin(lo, so[j]), hi = fmax(hi, so[j]);
        double p = mt_quintic(s[j] / (1 + 1e-7), 5);
        plo = fmin(plo, p), phi = fmax(phi, p);
    }
    printf("NS band %s %lldx%lld, normalised sigma in [%.1e, %.3f]: output sigma in [%.4f, "
           "%.4f] (p5 predicts [%.4f, %.4f])\n", k3rt_dtype_name(dtype), (long long)R,
           (long long)C, s[k - 1], s[0], lo, hi, plo, phi);
    ck_assert_msg(lo >= 0.68 && hi <= 1.21, "output sigma in [%.4f, %.4f]", lo, hi);
    ck_assert(fabs(lo - plo) < 1e-4 && fabs(hi - phi) < 1e-4);
    free(U), free(V), free(s), free(G), free(O), free(Uo), free(Vo), free(so);
}

START_TEST(band_of_the_quintic)
{
    band(K3RT_F64, 64, 24, 11);
    band(K3RT_F64, 24, 64, 12);
    band(K3RT_F64, 32, 32, 13);
    band(K3RT_F32, 64, 24, 11);
    band(K3RT_F32, 32, 32, 13);
}
END_TEST

START_TEST(zero_gradient_gives_zero_update)
{
    int64_t R = 8, C = 12;
    double G[96] = {0}, O[96];
    ns_through_step(K3RT_F64, G, R, C, O);
    for (int i = 0; i < 96; i++)
        ck_assert(O[i] == 0);
    G[5] = 1e-20;  /* tiny but nonzero: still finite */
    ns_through_step(K3RT_F32, G, R, C, O);
    for (int i = 0; i < 96; i++)
        ck_assert(isfinite(O[i]));
}
END_TEST

/* ---- update RMS ---------------------------------------------------------------------------- */

/* Default options without decay, one step from W = 0: each block's update RMS / lr against
 * scale sqrt(max(R, C)) sqrt(sum_j p5(s_j)^2 / (R C)), s_j the block's normalised singular
 * values. */
START_TEST(update_rms_matches_singular_values)
{
    enum { H = 4 };
    mt_spec sp[3] = {
        {"q", K3RT_ROLE_HEAD_MATRIX, 2, {H * 32, 128, 0}, H, 0, 0, 0, 0},
        {"ffn", K3RT_ROLE_MATRIX, 2, {192, 64, 0}, 0, 0, 0, 0, 0},
        {"sq", K3RT_ROLE_MATRIX, 2, {96, 96, 0}, 0, 0, 0, 0, 0},
    };
    mt_harness h;
    mt_init(&h, K3RT_F64, "{\"weight_decay\": 0}", sp, 3, 2);
    double *g[3];
    for (int i = 0; i < 3; i++) {
        g[i] = mt_alloc(mt_numel(&h, i));
        tu_randn(g[i], mt_numel(&h, i), 1.0, 40 + (uint64_t)i);
        mt_set_grad(&h, i, g[i]);
    }
    const double lr = 0.01;
    mt_step(&h, lr, 1);
    /* blocks: the 4 heads of q, then ffn, then sq */
    struct { int param; int64_t off, R, C; } blk[H + 2];
    for (int b = 0; b < H; b++)
        blk[b].param = 0, blk[b].off = b * 32 * 128, blk[b].R = 32, blk[b].C = 128;
    blk[H].param = 1, blk[H].off = 0, blk[H].R = 192, blk[H].C = 64;
    blk[H + 1].param = 2, blk[H + 1].off = 0, blk[H + 1].R = 96, blk[H + 1].C = 96;
    for (int b = 0; b < H + 2; b++) {
        int64_t R = blk[b].R, C = blk[b].C, k = R < C ? R : C, n = R * C;
        double *w = mt_alloc(mt_numel(&h, blk[b].param)), *sn = mt_alloc(k), *O = mt_alloc(n);
        mt_get_param(&h, blk[b].param, w);
        mt_ns_exact(g[blk[b].param] + blk[b].off, R, C, 5, O, sn);
        double sum = 0, ms = 0;
        for (int64_t j = 0; j < k; j++)
            sum += pow(mt_quintic(sn[j], 5), 2);
        for (int64_t i = 0; i < n; i++)
            ms += w[blk[b].off + i] * w[blk[b].off + i];
        double measured = sqrt(ms / (double)n) / lr;
        double predicted = 0.2 * sqrt((double)(R > C ? R : C)) * sqrt(sum / (double)n);
        printf("update RMS / lr, block %lldx%lld: measured %.6f, predicted %.6f (scale 0.2)\n",
               (long long)R, (long long)C, measured, predicted);
        ck_assert_msg(fabs(measured - predicted) < 1e-6 * predicted, "%.8f vs %.8f", measured,
                      predicted);
        ck_assert(measured > 0.15 && measured < 0.2);
        free(w), free(sn), free(O);
    }
    for (int i = 0; i < 3; i++)
        free(g[i]);
    mt_free(&h);
}
END_TEST

/* ---- two steps in closed form ------------------------------------------------------------- */

/* W2 from W0 and G1, G2 with EMA momentum, Nesterov (or not) and decoupled decay:
 *   m_t = beta m_{t-1} + (1 - beta) G_t ; u_t = (1 - beta) G_t + beta m_t (or m_t)
 *   W_t = W_{t-1} (1 - lr_t wd) - lr_t 0.2 sqrt(max(R, C)) U p5(s) V^T of u_t */
static void two_steps(int nesterov, const char *cfg)
{
    const int64_t R = 24, C = 40, n = R * C;
    const double beta = 0.95, wd = 0.1, lr[2] = {0.02, 0.01};
    mt_spec sp = {"w", K3RT_ROLE_MATRIX, 2, {R, C, 0}, 0, 0, 0, 0, 0};
    mt_harness h;
    mt_init(&h, K3RT_F64, cfg, &sp, 1, 1);
    double *w = mt_alloc(n), *m = mt_alloc(n), *g = mt_alloc(n), *u = mt_alloc(n);
    double *O = mt_alloc(n), *got = mt_alloc(n);
    tu_randn(w, n, 0.5, 7);
    mt_set_param(&h, 0, w);
    for (int t = 0; t < 2; t++) {
        tu_randn(g, n, 1.0, 70 + (uint64_t)t);
        mt_set_grad(&h, 0, g);
        mt_step(&h, lr[t], t + 1);
        for (int64_t i = 0; i < n; i++) {
            m[i] = beta * m[i] + (1 - beta) * g[i];
            u[i] = nesterov ? (1 - beta) * g[i] + beta * m[i] : m[i];
        }
        mt_ns_exact(u, R, C, 5, O, NULL);
        for (int64_t i = 0; i < n; i++)
            w[i] = w[i] * (1 - lr[t] * wd) - lr[t] * 0.2 * sqrt((double)C) * O[i];
    }
    mt_get_param(&h, 0, got);
    double e = mt_max_abs_diff(got, w, n);
    printf("muon two steps (nesterov %d) against the closed form: max |diff| %.2e\n", nesterov,
           e);
    ck_assert_msg(e < 1e-12, "max diff %.3e", e);
    free(w), free(m), free(g), free(u), free(O), free(got);
    mt_free(&h);
}

START_TEST(two_steps_closed_form)
{
    two_steps(1, "{}");
    two_steps(0, "{\"nesterov\": false}");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("per_head_muon_ns");
    TCase *tc = tcase_create("ns");
    tcase_add_test(tc, exact_map_gaussian);
    tcase_add_test(tc, band_of_the_quintic);
    tcase_add_test(tc, zero_gradient_gives_zero_update);
    tcase_add_test(tc, update_rms_matches_singular_values);
    tcase_add_test(tc, two_steps_closed_form);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
