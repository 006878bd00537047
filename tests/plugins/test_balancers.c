/* The balancers side by side: aux_free's sign update (one rank and two), aux_loss's value and
 * score gradient, none / aux_free / quantile on a synthetic skewed router over 50 updates, and
 * exact state round trips. */
#include "balancer_testkit.h"

/* ---- aux_free ------------------------------------------------------------------------------ */

START_TEST(aux_free_sign_update)
{
    enum { E = 4 };
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    rig m;
    TU_OK(bk_create(&m, "aux_free", "{\"gamma\": 0.125}", E, 1, NULL, s, &err), err);
    /* loads 3, 1, 2, 2 over two micro-batches: mean 2 */
    const int64_t c1[E] = {2, 0, 1, 1}, c2[E] = {1, 1, 1, 1};
    int32_t sel[1];
    float scores[E];
    k3rt_routing r = bk_counts_routing(c1, E, 1, sel, scores);
    bk_observe(&m, &r);
    r.counts.data = (void *)c2;
    bk_observe(&m, &r);
    ck_assert(bk_bias(&m)[0] == 0.0f);  /* nothing moves before the step ends */
    bk_update(&m, NULL, 1);
    const float *b = bk_bias(&m);
    ck_assert(b[0] == -0.125f && b[1] == 0.125f && b[2] == 0.0f && b[3] == 0.0f);
    /* the counts were cleared: a second update with no traffic keeps the bias */
    bk_update(&m, NULL, 2);
    ck_assert(b[0] == -0.125f && b[1] == 0.125f);
    rig_destroy(&m);
    k3rt_stream_destroy(s);
}
END_TEST

typedef struct af_job {
    rig *m;
    k3rt_comm *comm;
    k3rt_stream *s;
    const int64_t *counts;
    int rc;
} af_job;

static void *af_rank(void *arg)
{
    af_job *j = arg;
    k3rt_error err = {0};
    int32_t sel[1];
    float scores[4];
    k3rt_routing r = bk_counts_routing(j->counts, 4, 1, sel, scores);
    j->rc = rig_observe(j->m, &r, &err);
    if (!j->rc)
        j->rc = rig_update(j->m, j->comm, 1, &err);
    return NULL;
}

START_TEST(aux_free_counts_are_global)
{
    k3rt_error err = {0};
    k3rt_comm **c2;
    TU_OK(comm_local_create(2, &c2, &err), err);
    k3rt_stream *s[2] = {tu_cpu_stream(1), tu_cpu_stream(1)};
    rig m[2];
    for (int r = 0; r < 2; r++)
        TU_OK(bk_create(&m[r], "aux_free", "{}", 4, 1, c2[r], s[r], &err), err);
    /* rank 0 alone would raise expert 0; the global counts (5, 3, 3, 5) lower it */
    const int64_t a[4] = {1, 3, 2, 2}, b[4] = {4, 0, 1, 3};
    af_job jobs[2] = {{&m[0], c2[0], s[0], a, 0}, {&m[1], c2[1], s[1], b, 0}};
    bk_threads(2, af_rank, jobs, sizeof jobs[0]);
    ck_assert(jobs[0].rc == 0 && jobs[1].rc == 0);
    for (int r = 0; r < 2; r++) {
        const float *bias = bk_bias(&m[r]);
        ck_assert(bias[0] == -0.001f && bias[1] == 0.001f && bias[2] == 0.001f &&
                  bias[3] == -0.001f);
        rig_destroy(&m[r]);
        k3rt_stream_destroy(s[r]);
    }
    comm_local_destroy(c2, 2);
}
END_TEST

/* ---- aux_loss ------------------------------------------------------------------------------ */

/* L = mean over sequences of alpha * sum_i f_i P_i, written out directly. */
static double aux_reference(const bk_batch *b, double alpha)
{
    double total = 0;
    for (int64_t q = 0; q < b->B; q++) {
        double f[64] = {0}, P[64] = {0}, L = 0;
        for (int64_t t = q * b->T; t < (q + 1) * b->T; t++) {
            double S = 0;
            for (int e = 0; e < b->E; e++)
                S += b->scores[t * b->E + e];
            for (int e = 0; e < b->E; e++)
                P[e] += b->scores[t * b->E + e] / S / (double)b->T;
            for (int j = 0; j < b->k; j++)
                f[b->sel[t * b->k + j]] += (double)b->E / ((double)b->k * (double)b->T);
        }
        for (int e = 0; e < b->E; e++)
            L += f[e] * P[e];
        total += alpha * L;
    }
    return total / (double)b->B;
}

static double aux_value(rig *m, bk_batch *b, double scale, float *ds)
{
    k3rt_error err = {0};
    double loss = 0;
    k3rt_tensor t = k3rt_tensor_view(ds, K3RT_F32, K3RT_DEVICE_CPU, 2, b->N, b->E, 0, 0);
    TU_OK(rig_aux_loss(m, &b->r, scale, &loss, t, &err), err);
    return loss;
}

START_TEST(aux_loss_value_and_gradient)
{
    enum { E = 6, K = 2 };
    k3rt_error err = {0};
    rig m;
    TU_OK(bk_create(&m, "aux_loss", "{\"alpha\": 0.3}", E, K, NULL, NULL, &err), err);
    ck_assert_ptr_nonnull(m.e->vt.balancer.aux_loss);
    ck_assert_ptr_null(m.e->inst.state);  /* nothing persists: the bias stays zero */
    for (int e = 0; e < E; e++)
        ck_assert(bk_bias(&m)[e] == 0.0f);
    double off[E] = {-1, -0.5, 0, 0.2, 0.6, 1.2};
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 3, 0);
    bk_batch b;
    bk_batch_alloc(&b, 3, 5, E, K);
    bk_scores(&b, off, 1.0, &rng);
    float zero[E] = {0};
    bk_route(&b, zero);
    float *ds = malloc((size_t)(b.N * E) * sizeof(float));
    const double scale = 0.5;
    double L = aux_value(&m, &b, scale, ds), want = aux_reference(&b, 0.3);
    ck_assert_msg(fabs(L - want) <= 1e-12 * want, "loss %.17g, reference %.17g", L, want);
    /* d_scores = scale * dL/ds, by central differences on the f32 scores with the selection
     * (f) held fixed; the step 2^-12 is exact in f32 for scores in (0, 1) */
    float *tmp = malloc((size_t)(b.N * E) * sizeof(float));
    const double h = 1.0 / 4096;
    double worst = 0, rms = 0;
    for (int64_t i = 0; i < b.N * E; i++)
        rms += (double)ds[i] * ds[i];
    rms = sqrt(rms / (double)(b.N * E));
    for (int64_t i = 0; i < b.N * E; i++) {
        float keep = b.scores[i];
        b.scores[i] = (float)(keep + h);
        double lp = aux_value(&m, &b, scale, tmp);
        b.scores[i] = (float)(keep - h);
        double lm = aux_value(&m, &b, scale, tmp);
        b.scores[i] = keep;
        double num = scale * (lp - lm) / (2 * h);
        worst = fmax(worst, fabs(num - ds[i]) / fmax(fmax(fabs(num), fabs(ds[i])), 1e-3 * rms));
    }
    printf("aux_loss: loss %.6e (reference %.6e), d_scores vs finite differences: worst relative "
           "error %.2e over %lld entries\n", L, want, worst, (long long)(b.N * E));
    ck_assert_msg(worst < 1e-5, "worst %g", worst);
    /* every score of every token gets a gradient, and they sum to zero per token against the
     * normalised scores (the loss is invariant to scaling a token's scores) */
    for (int64_t t = 0; t < b.N; t++) {
        double dot = 0, mag = 0;
        for (int e = 0; e < E; e++) {
            ck_assert(ds[t * E + e] != 0.0f);
            dot += (double)ds[t * E + e] * b.scores[t * E + e];
            mag += fabs((double)ds[t * E + e] * b.scores[t * E + e]);
        }
        ck_assert(fabs(dot) < 1e-6 * mag);
    }
    free(ds), free(tmp);
    bk_batch_free(&b);
    rig_destroy(&m);
}
END_TEST

/* aux_loss_add, the form the engine calls: it adds into the sum exactly the value aux_loss
 * returns and writes the same d_scores (both poisoned first), over two micro-batches. */
START_TEST(aux_loss_add_matches_aux_loss)
{
    enum { E = 5, K = 2 };
    k3rt_error err = {0};
    rig m;
    TU_OK(bk_create(&m, "aux_loss", "{\"alpha\": 0.01}", E, K, NULL, NULL, &err), err);
    ck_assert_ptr_nonnull(m.e->vt.balancer.aux_loss_add);
    double off[E] = {-0.8, -0.1, 0, 0.3, 0.9};
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 11, 0);
    bk_batch b;
    bk_batch_alloc(&b, 2, 7, E, K);
    float zero[E] = {0};
    float *ds = malloc((size_t)(b.N * E) * sizeof(float));
    float *ds_add = malloc((size_t)(b.N * E) * sizeof(float));
    double sum = 0.25, host = 0, want = 0.25;  /* sum starts where an earlier layer left it */
    k3rt_tensor sum_t = k3rt_tensor_view(&sum, K3RT_F64, K3RT_DEVICE_CPU, 1, 1, 0, 0, 0);
    k3rt_tensor dt = k3rt_tensor_view(ds_add, K3RT_F32, K3RT_DEVICE_CPU, 2, b.N, E, 0, 0);
    for (int micro = 0; micro < 2; micro++) {
        bk_scores(&b, off, 1.0, &rng);
        bk_route(&b, zero);
        for (int64_t i = 0; i < b.N * E; i++)
            ds[i] = ds_add[i] = NAN;
        want += aux_value(&m, &b, 0.5, ds);
        TU_OK(rig_aux_loss_add(&m, &b.r, 0.5, sum_t, &host, dt, &err), err);
        ck_assert_msg(sum == want, "sum %.17g, expected %.17g", sum, want);
        ck_assert(host == 0);  /* the host sum is only for balancers without the device form */
        ck_assert(memcmp(ds, ds_add, (size_t)(b.N * E) * sizeof(float)) == 0);
    }
    ck_assert(want > 0.25);
    /* the sum must be one f64 on the balancer's device */
    k3rt_tensor bad = k3rt_tensor_view(&sum, K3RT_F32, K3RT_DEVICE_CPU, 1, 1, 0, 0, 0);
    ck_assert_int_eq(rig_aux_loss_add(&m, &b.r, 0.5, bad, &host, dt, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "loss_sum") != NULL, "%s", err.msg);
    free(ds), free(ds_add);
    bk_batch_free(&b);
    rig_destroy(&m);
}
END_TEST

/* ---- the synthetic skewed router ----------------------------------------------------------- */

/* MaxVio after `updates` steps of fresh tokens through a router with fixed per-expert logit
 * offsets, averaged over 10 more fresh batches routed with the final bias. */
static double skewed_run(const char *name, const char *cfg, int updates)
{
    enum { E = 16, K = 4 };
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    rig m;
    TU_OK(bk_create(&m, name, cfg, E, K, NULL, s, &err), err);
    double off[E];
    for (int e = 0; e < E; e++)
        off[e] = 2.0 * e / (E - 1) - 1.0;  /* logits -1 .. 1 */
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 2026, 0);
    bk_batch b;
    bk_batch_alloc(&b, 4, 256, E, K);
    for (int step = 1; step <= updates; step++) {
        bk_scores(&b, off, 1.0, &rng);
        bk_route(&b, bk_bias(&m));
        bk_observe(&m, &b.r);
        bk_update(&m, NULL, step);
    }
    double vio = 0;
    for (int i = 0; i < 10; i++) {
        bk_scores(&b, off, 1.0, &rng);
        bk_route(&b, bk_bias(&m));
        vio += bk_maxvio(b.counts, E) / 10;
    }
    bk_batch_free(&b);
    rig_destroy(&m);
    k3rt_stream_destroy(s);
    return vio;
}

START_TEST(skewed_router_50_updates)
{
    double none = skewed_run("none", "{}", 50);
    double af = skewed_run("aux_free", "{}", 50);
    double af10 = skewed_run("aux_free", "{\"gamma\": 0.01}", 50);
    double qh = skewed_run("quantile", "{}", 50);
    double qx = skewed_run("quantile", "{\"mode\": \"exact\"}", 50);
    printf("skewed router (E 16, k 4, 1024 fresh tokens per step), MaxVio after 50 updates: "
           "none %.3f | aux_free gamma 1e-3 %.3f | aux_free gamma 1e-2 %.3f | quantile "
           "histogram %.3f | quantile exact %.3f\n", none, af, af10, qh, qx);
    ck_assert(none > 1.0);
    ck_assert(af < none);
    ck_assert_msg(qh <= 0.5 * af && qx <= 0.5 * af, "quantile %g / %g vs aux_free %g", qh, qx,
                  af);
    /* a 10x larger step catches up within 50 updates, to the same floor: the sampling noise
     * of a fresh batch (256 expected tokens per expert) */
    ck_assert(af10 < af);
}
END_TEST

/* ---- state round trips -------------------------------------------------------------------- */

static void round_trip(const char *name, const char *cfg)
{
    enum { E = 8, K = 2 };
    k3rt_error err = {0};
    k3rt_stream *s = tu_cpu_stream(1);
    rig a, b;
    TU_OK(bk_create(&a, name, cfg, E, K, NULL, s, &err), err);
    double off[E] = {-1, -0.7, -0.2, 0, 0.1, 0.4, 0.8, 1.1};
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 17, 0);
    bk_batch mb;
    bk_batch_alloc(&mb, 2, 32, E, K);
    for (int step = 1; step <= 3; step++) {
        bk_scores(&mb, off, 1.0, &rng);
        bk_route(&mb, bk_bias(&a));
        bk_observe(&a, &mb.r);
        bk_update(&a, NULL, step);
    }
    /* "save": the state tensors' bytes; "resume": a fresh instance loads them */
    float saved[E];
    memcpy(saved, bk_state_bias(&a), sizeof saved);
    TU_OK(bk_create(&b, name, cfg, E, K, NULL, s, &err), err);
    memcpy(bk_state_bias(&b), saved, sizeof saved);
    if (b.e->inst.state_loaded)
        TU_OK(rig_state_loaded(&b, &err), err);
    for (int step = 4; step <= 6; step++) {
        bk_scores(&mb, off, 1.0, &rng);
        bk_route(&mb, bk_bias(&a));
        bk_observe(&a, &mb.r);
        bk_observe(&b, &mb.r);
        bk_update(&a, NULL, step);
        bk_update(&b, NULL, step);
        ck_assert_msg(memcmp(bk_bias(&a), bk_bias(&b), sizeof saved) == 0,
                      "%s %s: step %d differs after resume", name, cfg, step);
    }
    ck_assert(memcmp(saved, bk_bias(&a), sizeof saved) != 0);  /* the bias kept moving */
    bk_batch_free(&mb);
    rig_destroy(&a), rig_destroy(&b);
    k3rt_stream_destroy(s);
}

START_TEST(state_round_trips)
{
    round_trip("quantile", "{}");
    round_trip("quantile", "{\"mode\": \"exact\"}");
    round_trip("aux_free", "{\"gamma\": 0.01}");
}
END_TEST

/* The engine resets statistics at the start of every step; a step that ended without an update
 * (skipped for a non-finite loss) leaves nothing behind. */
START_TEST(reset_drops_an_unfinished_step)
{
    const char *names[3] = {"quantile", "quantile", "aux_free"};
    const char *cfgs[3] = {"{}", "{\"mode\": \"exact\"}", "{}"};
    double off[4] = {-1, 0, 0.5, 1};
    for (int i = 0; i < 3; i++) {
        k3rt_error err = {0};
        k3rt_stream *s = tu_cpu_stream(1);
        rig m;
        TU_OK(bk_create(&m, names[i], cfgs[i], 4, 1, NULL, s, &err), err);
        ck_assert_ptr_nonnull(m.e->inst.reset_stats);
        k3rt_rng rng;
        k3rt_rng_seed(&rng, 1, 0);
        bk_batch b;
        bk_batch_alloc(&b, 1, 64, 4, 1);
        bk_scores(&b, off, 1.0, &rng);
        bk_route(&b, bk_bias(&m));
        bk_observe(&m, &b.r);
        rig_reset_stats(&m);
        bk_update(&m, NULL, 1);
        for (int e = 0; e < 4; e++)
            ck_assert_msg(bk_bias(&m)[e] == 0.0f, "%s %s kept a reset step", names[i], cfgs[i]);
        bk_observe(&m, &b.r);  /* without the reset the same batch does move it */
        bk_update(&m, NULL, 2);
        ck_assert(bk_bias(&m)[0] != 0.0f);
        bk_batch_free(&b);
        rig_destroy(&m);
        k3rt_stream_destroy(s);
    }
}
END_TEST

START_TEST(refused)
{
    k3rt_error err = {0};
    rig m;
    ck_assert_int_eq(bk_create(&m, "aux_free", "{}", 0, 0, NULL, NULL, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "a balancer serves a routed MoE layer"), "%s", err.msg);
    ck_assert_int_eq(bk_create(&m, "aux_free", "{\"gama\": 1}", 4, 1, NULL, NULL, &err),
                     K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "did you mean 'gamma'"), "%s", err.msg);
    ck_assert_int_eq(bk_create(&m, "aux_loss", "{\"alpha\": -1}", 4, 1, NULL, NULL, &err),
                     K3RT_ERR_INVALID);
    /* the host refuses a selection outside the layer before aux_loss reads it */
    TU_OK(bk_create(&m, "aux_loss", "{}", 4, 1, NULL, NULL, &err), err);
    bk_batch b;
    bk_batch_alloc(&b, 1, 3, 4, 1);
    memset(b.scores, 0, (size_t)12 * sizeof(float));
    float zero[4] = {0}, ds[12];
    bk_route(&b, zero);
    b.sel[2] = 7;
    double loss;
    k3rt_tensor t = k3rt_tensor_view(ds, K3RT_F32, K3RT_DEVICE_CPU, 2, 3, 4, 0, 0);
    ck_assert_int_eq(rig_aux_loss(&m, &b.r, 1.0, &loss, t, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "routing.selected[2] = 7 is outside [0, 4)"), "%s", err.msg);
    bk_batch_free(&b);
    rig_destroy(&m);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("balancers");
    TCase *tc = tcase_create("balancers");
    tcase_add_test(tc, aux_free_sign_update);
    tcase_add_test(tc, aux_free_counts_are_global);
    tcase_add_test(tc, aux_loss_value_and_gradient);
    tcase_add_test(tc, aux_loss_add_matches_aux_loss);
    tcase_add_test(tc, skewed_router_50_updates);
    tcase_add_test(tc, state_round_trips);
    tcase_add_test(tc, reset_drops_an_unfinished_step);
    tcase_add_test(tc, refused);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
