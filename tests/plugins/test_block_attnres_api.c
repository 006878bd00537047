/* block_attnres around the math: the depth-weight statistic, float against double, what the
 * plugin holds as layers grow at a fixed block count, K3's counts, and its own refusals. */
#include "plugins/attnres_testkit.h"

START_TEST(depth_weights_statistic)
{
    harness h;
    harness_init(&h, K3RT_F64, 3, 2, 3, 8, "{\"block_layers\": 1}", 1);
    int64_t n = h.n;
    double *emb = malloc((size_t)n * sizeof *emb), *out = malloc((size_t)n * sizeof *out);
    double *xs = malloc((size_t)h.S * (size_t)n * sizeof *xs);
    tu_randn(emb, n, 1.0, 93);
    k3rt_error err = {0};
    /* zero queries (the init): row s is uniform over its sources */
    run_model(&h, emb, xs, out, NULL, NULL);
    struct k3rt_tensor_sink sink;
    TU_OK(rig_stats(&h.m, &sink, &err), err);
    ck_assert_int_eq(sink.n, 1);
    ck_assert_str_eq(sink.items[0].name, "depth_weights");
    ck_assert_int_eq(sink.items[0].reduce, K3RT_REDUCE_AVG);
    k3rt_tensor t = sink.items[0].t;
    /* 3 layers in blocks of 1: stored sources emb, S0-1, S2-3; the output reads them + S4-5 */
    ck_assert(t.dtype == K3RT_F32 && t.ndim == 2 && t.shape[0] == 7 && t.shape[1] == 4);
    const float *w = t.data;
    static const int n_src[7] = {1, 2, 2, 3, 3, 4, 4};
    for (int s = 0; s < 7; s++)
        for (int i = 0; i < 4; i++) {
            float want = i < n_src[s] ? 1.0f / (float)n_src[s] : 0.0f;
            ck_assert_msg(fabsf(w[s * 4 + i] - want) < 1e-6f, "row %d col %d: %g, want %g", s, i,
                          w[s * 4 + i], want);
        }
    tensor_sink_free(&sink);
    /* peaked queries: rows still sum to 1 over the forwards since reset_stats */
    rig_reset_stats(&h.m);
    random_params(&h, 3.0, 7);
    run_model(&h, emb, xs, out, NULL, NULL);
    run_model(&h, emb, xs, out, NULL, NULL);
    TU_OK(rig_stats(&h.m, &sink, &err), err);
    w = sink.items[0].t.data;
    double spread = 0;
    for (int s = 0; s < 7; s++) {
        double sum = 0;
        for (int i = 0; i < 4; i++)
            sum += w[s * 4 + i];
        ck_assert_msg(fabs(sum - 1) < 1e-5, "row %d sums to %g", s, sum);
        spread = fmax(spread, fabs(w[s * 4] - 1.0 / n_src[s]));
    }
    ck_assert(spread > 0.05);
    tensor_sink_free(&sink);
    rig_reset_stats(&h.m);
    TU_OK(rig_stats(&h.m, &sink, &err), err);
    w = sink.items[0].t.data;
    for (int k = 0; k < 28; k++)
        ck_assert(w[k] == 0.0f);
    tensor_sink_free(&sink);
    free(emb), free(out), free(xs);
    harness_free(&h);
}
END_TEST

/* The float path (runs) against the double one, over enough tokens for two threads. */
START_TEST(float_matches_double)
{
    harness h64, h32;
    const char *cfg = "{\"block_layers\": 1}";
    harness_init(&h64, K3RT_F64, 3, 2, 40, 16, cfg, 2);
    harness_init(&h32, K3RT_F32, 3, 2, 40, 16, cfg, 2);
    random_params(&h64, 0.5, 8);
    random_params(&h32, 0.5, 8);
    int64_t n = h64.n;
    double *emb = malloc((size_t)n * sizeof *emb), *dout = malloc((size_t)n * sizeof *dout);
    double *o64 = malloc((size_t)n * 5 * sizeof *o64), *o32 = malloc((size_t)n * 5 * sizeof *o32);
    double *xs = malloc((size_t)h64.S * (size_t)n * sizeof *xs);
    tu_randn(emb, n, 1.0, 94);
    tu_randn(dout, n, 1.0, 95);
    run_model(&h64, emb, xs, o64, dout, o64 + n);
    run_model(&h32, emb, xs, o32, dout, o32 + n);
    double e_out = tu_rel_rms(o64, o32, n), e_demb = tu_rel_rms(o64 + n, o32 + n, n), e_g = 0;
    for (int i = 2; i < h64.np; i++) {
        double g32[16];
        for (int k = 0; k < 16; k++)
            g32[k] = ((float *)h32.grads[i].data)[k];
        e_g = fmax(e_g, tu_rel_rms(grad64(&h64, i), g32, 16));
    }
    printf("block_attnres f32 vs f64: output %.2e, d embedding %.2e, parameter grads %.2e\n",
           e_out, e_demb, e_g);
    ck_assert(e_out < 1e-5 && e_demb < 1e-5 && e_g < 1e-4);
    free(emb), free(dout), free(o64), free(o32), free(xs);
    harness_free(&h64);
    harness_free(&h32);
}
END_TEST


/* Expected saved bytes: stored sources, partial and their gradients ((2 nb + 2) [N, d]) plus
 * per op s = 1..S alpha [N, n_s] and rho, z [N]. N * 8 bytes is a multiple of 64 here, so
 * no alignment padding enters. */
static int64_t alpha_bytes(int S, int kb, int64_t N)
{
    int64_t b = 0;
    for (int s = 1; s <= S; s++)
        b += N * ((s - 1) / kb + 2 + 2) * 8;
    return b;
}

/* What the plugin holds grows with the blocks: at a fixed block count, saved bytes grow with
 * the layers only by the per-op weights (alpha, rho, z: (n_s + 2) scalars per token per op),
 * never by an activation per layer. */
START_TEST(memory_grows_with_blocks)
{
    const int64_t B = 2, T = 8, d = 64, N = B * T, row = N * d * 8;
    printf("block_attnres saved bytes (B=%lld T=%lld d=%lld, f64):\n"
           "  layers block_layers blocks  saved   sources+partial+grads  per-op weights  "
           "standard  a copy per sublayer\n", (long long)B, (long long)T, (long long)d);
    static const int series[2][4][2] = {{{2, 1}, {4, 2}, {8, 4}, {16, 8}},
                                        {{4, 1}, {8, 2}, {16, 4}, {32, 8}}};
    for (int k = 0; k < 2; k++) {
        int64_t first = -1;
        for (int i = 0; i < 4; i++) {
            int L = series[k][i][0], bl = series[k][i][1], S = 2 * L, kb = 2 * bl;
            char cfg[64];
            snprintf(cfg, sizeof cfg, "{\"block_layers\": %d}", bl);
            harness h;
            harness_init(&h, K3RT_F64, L, B, T, d, cfg, 1);
            int nb = (S - 1) / kb + 1;
            ck_assert_int_eq(nb, k ? 4 : 2);
            int64_t fixed = h.m.mem.saved_bytes - alpha_bytes(S, kb, N);
            printf("  %6d %12d %6d %8lld %22lld %15lld %9lld %20lld\n", L, bl, nb,
                   (long long)h.m.mem.saved_bytes, (long long)fixed,
                   (long long)alpha_bytes(S, kb, N), (long long)(2 * row),
                   (long long)(S * row));
            ck_assert_int_eq(fixed, (2 * nb + 2) * row);
            if (first < 0)
                first = fixed;
            ck_assert_int_eq(fixed, first);
            /* the per-op term stays below one [N, d] activation per op */
            ck_assert(alpha_bytes(S, kb, N) < S * row);
            /* scratch does not grow with the layers either: q, dq, two [N, nb + 1] and two
             * rows (the rebuilt partial, the fused pre-norm's input gradient) */
            ck_assert_int_eq(h.m.mem.workspace_bytes,
                             2 * d * 8 + 2 * N * (nb + 1) * 8 + 2 * row);
            harness_free(&h);
        }
    }
}
END_TEST

/* K3's shape: 93 layers in blocks of 12 make 8 stored sources (embedding + 7 blocks) and 9
 * at the output; 187 parameter sets, 186 mixing ops. */
START_TEST(k3_counts)
{
    harness h;
    harness_init(&h, K3RT_F64, 93, 1, 8, 8, "{\"block_layers\": 12}", 1);
    ck_assert_int_eq(h.np, 2 * 187);
    k3rt_error err = {0};
    struct k3rt_tensor_sink sink;
    TU_OK(rig_stats(&h.m, &sink, &err), err);
    ck_assert(sink.items[0].t.shape[0] == 187 && sink.items[0].t.shape[1] == 9);
    tensor_sink_free(&sink);
    const int64_t N = 8, row = N * 8 * 8;
    ck_assert_int_eq(h.m.mem.saved_bytes, (2 * 8 + 2) * row + alpha_bytes(186, 24, N));
    k3rt_flops f;
    TU_OK(rig_flops(&h.m, 1, 8, &f, &err), err);
    double sources = 0;
    for (int s = 1; s <= 186; s++)
        sources += (s - 1) / 24 + 2;
    ck_assert(fabs(f.forward - (double)N * (6 * 8 * sources + 186 * 8)) < 1e-6);
    harness_free(&h);
}
END_TEST

/* What only the plugin knows: how many sources its blocks mix, and its own options (the
 * host's argument checks are tests/unit/test_rig.c's). */
START_TEST(plugin_refusals)
{
    k3rt_error err = {0};
    harness h;
    harness_init(&h, K3RT_F64, 2, 2, 3, 8, "{\"block_layers\": 2}", 1);
    double t[48], dt[48];
    tu_randn(t, 48, 1.0, 3);
    tu_randn(dt, 48, 1.0, 4);
    /* op mode: 2 layers in one block mix at most 2 sources */
    k3rt_tensor src[3];
    for (int j = 0; j < 3; j++)
        src[j] = k3rt_tensor_view(t, K3RT_F64, -1, 3, 2, 3, 8, 0);
    k3rt_residual_args a = args(&h, 2, dt);
    a.sources = src, a.n_sources = 3;
    ck_assert_int_eq(rig_residual(&h.m, RIG_OP_FORWARD, &a, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "3 sources, but a model of 2 layers (block_layers 2) mixes "
                         "at most 2"), "%s", err.msg);
    harness_free(&h);
    rig m;
    k3rt_create_args ca;
    memset(&ca, 0, sizeof ca);
    ca.struct_size = sizeof ca;
    ca.dtype = K3RT_F64, ca.device = K3RT_DEVICE_CPU, ca.d_model = 8, ca.n_layers = 2;
    json_t *cfg = json_loads("{\"norm_eps\": 0}", 0, NULL);
    ck_assert_int_eq(rig_create(&m, plugin(), cfg, &ca, "model.residual", &err),
                     K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "'norm_eps' must be > 0"), "%s", err.msg);
    json_decref(cfg);
    cfg = json_loads("{\"block_layer\": 2}", 0, NULL);
    ck_assert_int_ne(rig_create(&m, plugin(), cfg, &ca, "model.residual", &err), K3RT_OK);
    ck_assert_msg(strstr(err.msg, "block_layers"), "%s", err.msg);
    json_decref(cfg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("block_attnres_api");
    TCase *tc = tcase_create("core");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, depth_weights_statistic);
    tcase_add_test(tc, float_matches_double);
    tcase_add_test(tc, memory_grows_with_blocks);
    tcase_add_test(tc, k3_counts);
    tcase_add_test(tc, plugin_refusals);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
