/* The activation manager on the main job's model (scripts/recipes/tiny.lua: KDA + MLA, dense
 * GLU + LatentMoE with Quantile Balancing, Block AttnRes) in double precision: recompute and
 * offload (its staging slot poisoned with NaN once the copy is issued) give gradients bitwise
 * equal to keeping everything; the recipe keys' errors; the glob; fp8 tile storage. */
#include <math.h>
#include <string.h>

#include "model/actman.h"
#include "model/model.h"
#include "recipe/recipe.h"
#include "testutil/testutil.h"

enum { B = 2, T = 24 };

typedef struct run_result {
    double loss;
    double *grads;
    int64_t numel, device_bytes, stores, loads, recomputes;
} run_result;

static recipe *tiny(registry *reg)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/scripts/recipes/tiny.lua", tu_source_dir());
    recipe *rec = NULL;
    k3rt_error err = {0};
    TU_OK(recipe_load(path, reg, NULL, 0, NULL, &rec, &err), err);
    return rec;
}

/* Builds tiny.lua's model with the given plan.activations (JSON text or NULL) and runs one
 * training micro-batch; rc of the build is returned, the error in err. */
static int run_tiny(const char *policies, run_result *out, k3rt_error *err)
{
    registry reg;
    TU_OK(registry_init(&reg, NULL, err), *err);
    recipe *rec = tiny(&reg);
    json_t *pol = policies ? json_loads(policies, 0, NULL) : NULL;
    ck_assert(!policies || pol);
    k3rt_stream *s = tu_cpu_stream(1);
    model m;
    model_options o = {K3RT_F64, K3RT_DEVICE_CPU, s, NULL, 5, 1, pol, NULL};
    int rc = model_build(&m, json_object_get(recipe_json(rec), "model"), &reg, &o, err);
    if (!rc) {
        rc = model_set_shape(&m, B, T, err);
        if (!rc) {
            int32_t tok[B * T], tgt[B * T];
            for (int i = 0; i < B * T; i++) {
                tok[i] = (i * 37 + 11) % 256;
                tgt[i] = (i * 53 + 7) % 256;
            }
            model_zero_grads(&m);
            TU_OK(model_train_step(&m, tok, tgt, 1.0 / (B * T), 1.0, &out->loss, err), *err);
            out->numel = m.total_numel;
            out->grads = malloc((size_t)m.total_numel * sizeof(double));
            ck_assert_ptr_nonnull(out->grads);
            memcpy(out->grads, m.grad_buf, (size_t)m.total_numel * sizeof(double));
            out->device_bytes = actman_device_bytes(m.am);
            out->stores = m.am->stores;
            out->loads = m.am->loads;
            out->recomputes = m.am->recomputes;
        }
        model_free(&m);
    }
    k3rt_stream_destroy(s);
    json_decref(pol);
    recipe_free(rec);
    registry_free(&reg);
    return rc;
}

static int have_plugins(void)
{
    registry reg;
    k3rt_error err = {0};
    TU_OK(registry_init(&reg, NULL, &err), err);
    int ok = registry_find(&reg, "kda", 0) && registry_find(&reg, "mla", 0) &&
             registry_find(&reg, "latent_moe", 0) && registry_find(&reg, "block_attnres", 0);
    registry_free(&reg);
    return ok;
}

static void same_as_keep(const run_result *keep, const run_result *r, const char *what)
{
    ck_assert_msg(r->loss == keep->loss, "%s: loss %.17g vs keep %.17g", what, r->loss,
                  keep->loss);
    ck_assert_int_eq(r->numel, keep->numel);
    int64_t diff = 0, first = -1;
    for (int64_t i = 0; i < r->numel; i++)
        if (memcmp(&r->grads[i], &keep->grads[i], sizeof(double))) {
            diff++;
            first = first < 0 ? i : first;
        }
    ck_assert_msg(!diff, "%s: %lld gradient elements differ from keep (first %lld: %.17g vs "
                  "%.17g)", what, (long long)diff, (long long)first,
                  first < 0 ? 0 : r->grads[first], first < 0 ? 0 : keep->grads[first]);
}

START_TEST(recompute_and_offload_are_bitwise_keep)
{
    if (!have_plugins())
        return;
    k3rt_error err = {0};
    run_result keep, rec, off, mixed;
    TU_OK(run_tiny(NULL, &keep, &err), err);
    double gsum = 0;
    for (int64_t i = 0; i < keep.numel; i++)
        gsum += fabs(keep.grads[i]);
    ck_assert_double_gt(gsum, 0);  /* the comparison is not between zeros */
    ck_assert_int_eq(keep.stores + keep.loads + keep.recomputes, 0);

    TU_OK(run_tiny("{\"*\": \"recompute\"}", &rec, &err), err);
    same_as_keep(&keep, &rec, "recompute");
    ck_assert_int_eq(rec.recomputes, 8);  /* 4 mixers + 4 FFNs */
    ck_assert_int_lt(rec.device_bytes, keep.device_bytes / 3);

    TU_OK(run_tiny("{\"*\": \"offload\"}", &off, &err), err);
    same_as_keep(&keep, &off, "offload");
    ck_assert_int_eq(off.stores, 8);
    ck_assert_int_eq(off.loads, 8);
    ck_assert_int_lt(off.device_bytes, keep.device_bytes);

    TU_OK(run_tiny("{\"mixer.K.*\": \"recompute\", \"ffn.*\": \"offload\", "
                   "\"ffn.dense_glu.*\": \"keep\"}", &mixed, &err), err);
    same_as_keep(&keep, &mixed, "mixed");
    ck_assert_int_eq(mixed.recomputes, 3);
    ck_assert_int_eq(mixed.stores, 3);  /* the LatentMoE layers; the dense one is kept */
    free(keep.grads);
    free(rec.grads);
    free(off.grads);
    free(mixed.grads);
}
END_TEST

/* fp8 on GEMM-only classes: the forward is untouched, every gradient within 5e-2 relative
 * rms of keep and not equal to it (the rounding is real). Once the dense GLU's activated hidden
 * alone (read only by dWd += dy^T a), once every eligible class of the model. */
static void fp8_close(const char *policies, int stores, int saves)
{
    k3rt_error err = {0};
    run_result keep, f8;
    TU_OK(run_tiny(NULL, &keep, &err), err);
    TU_OK(run_tiny(policies, &f8, &err), err);
    ck_assert(f8.loss == keep.loss);
    ck_assert_int_eq(f8.stores, stores);
    /* one module saves nothing (its full-precision staging slot stays); many share three */
    if (saves)
        ck_assert_int_lt(f8.device_bytes, keep.device_bytes);
    double num = 0, den = 0;
    for (int64_t i = 0; i < keep.numel; i++) {
        double d = f8.grads[i] - keep.grads[i];
        num += d * d;
        den += keep.grads[i] * keep.grads[i];
    }
    double rel = sqrt(num / den);
    printf("fp8 %s: gradients %.3g relative rms from keep, device bytes %lld -> %lld\n",
           policies, rel, (long long)keep.device_bytes, (long long)f8.device_bytes);
    ck_assert_double_gt(rel, 0);
    ck_assert_double_lt(rel, 5e-2);
    free(keep.grads);
    free(f8.grads);
}

START_TEST(fp8_gradients_are_close_to_keep)
{
    if (!have_plugins())
        return;
    fp8_close("{\"ffn.dense_glu.*\": \"fp8\"}", 1, 0);
    fp8_close("{\"*\": \"fp8\"}", 8, 1);  /* every mixer and FFN has a GEMM-only part */
}
END_TEST

START_TEST(bad_patterns_are_refused)
{
    if (!have_plugins())
        return;
    k3rt_error err = {0};
    run_result r;
    ck_assert_int_ne(run_tiny("{\"mixer.Z.*\": \"offload\"}", &r, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "matches no saved tensor class"));
    ck_assert_ptr_nonnull(strstr(err.msg, "mixer.K.core_in"));
    memset(&err, 0, sizeof err);
    ck_assert_int_ne(run_tiny("{\"mixer.*.gates\": \"fp8\"}", &r, &err), 0);
    ck_assert_ptr_nonnull(strstr(err.msg, "GEMM_ONLY"));
}
END_TEST

START_TEST(recipe_keys_are_validated)
{
    registry reg;
    k3rt_error err = {0};
    TU_OK(registry_init(&reg, NULL, &err), err);
    static const char *const bad[][2] = {
        {"activations = { [\"ffn.*\"] = \"swap\" }", "expected one of keep|recompute"},
        {"activations = { [\"ffn/x\"] = \"keep\" }", "is not a class pattern"},
        {"activations = \"keep\"", "expected a table of tensor-class patterns"},
        {"memory_budget = \"120%\"", "plan.memory_budget: expected"},
        {"memory_budget = \"lots\"", "plan.memory_budget: expected"},
        {"memory_budget = 0", "plan.memory_budget: expected"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char text[1024];
        snprintf(text, sizeof text,
                 "return k3.recipe { model = { d_model = 8, vocab = 16, layers = 1, "
                 "mixers = { M = k3.mla { heads = 2, kv_rank = 4 } }, "
                 "ffn = k3.dense_glu { hidden = 8 } }, optimizer = k3.adamw { lr = 1e-3 }, "
                 "plan = { %s } }", bad[i][0]);
        recipe *rec = NULL;
        memset(&err, 0, sizeof err);
        int rc = recipe_load_string(text, "bad.lua", &reg, NULL, 0, NULL, &rec, &err);
        if (!registry_find(&reg, "mla", 0))
            break;
        ck_assert_msg(rc != 0, "%s was accepted", bad[i][0]);
        ck_assert_msg(strstr(err.msg, bad[i][1]) != NULL, "%s: %s", bad[i][0], err.msg);
    }
    double bytes, frac;
    ck_assert_int_eq(act_budget_parse("60%", &bytes, &frac), 0);
    ck_assert_double_eq_tol(frac, 0.6, 1e-12);
    ck_assert_int_eq(act_budget_parse("96 GiB", &bytes, &frac), 0);
    ck_assert_double_eq(bytes, 96.0 * 1073741824.0);
    ck_assert_int_eq(act_budget_parse("1.5GB", &bytes, &frac), 0);
    ck_assert_double_eq(bytes, 1.5e9);
    registry_free(&reg);
}
END_TEST

START_TEST(glob_matches_class_names)
{
    ck_assert(act_glob("mixer.K.*", "mixer.K.activations"));
    ck_assert(!act_glob("mixer.K.*", "mixer.M.saved"));
    ck_assert(act_glob("*", "ffn.latent_moe.saved"));
    ck_assert(act_glob("ffn.*.saved", "ffn.latent_moe.saved"));
    ck_assert(!act_glob("ffn.*.saved", "ffn.latent_moe.x"));
    ck_assert(act_glob("mixer.?.qkv", "mixer.M.qkv"));
    ck_assert(!act_glob("mixer.?.qkv", "mixer.MM.qkv"));
    ck_assert(act_glob("*a*a*a*", "aaaa"));
    ck_assert(!act_glob("*a*a*a*b", "aaaaaaaaaaaaaaaaaaaa"));
}
END_TEST

/* The e4m3 encoder against the nearest code found by scanning every magnitude (ties to the
 * even code), on every code, every midpoint between neighbours and its two float neighbours,
 * and random values over the whole range. */
static uint8_t nearest_by_scan(float a)
{
    uint8_t best = 0;
    float best_d = a;
    for (uint8_t c = 1; c < 0x7f; c++) {
        float d = fabsf(k3rt_fp8e4m3_to_f32(c) - a);
        if (d < best_d || (d == best_d && (c & 1) == 0 && (best & 1) == 1)) {
            best_d = d;
            best = c;
        }
    }
    return a >= 448.0f ? 0x7e : best;
}

START_TEST(fp8_encoder_is_nearest_even)
{
    int checked = 0;
    for (int c = 0; c < 0x7e; c++) {
        float lo = k3rt_fp8e4m3_to_f32((uint8_t)c), hi = k3rt_fp8e4m3_to_f32((uint8_t)(c + 1));
        float mid = 0.5f * (lo + hi);
        float probes[] = {lo, mid, nextafterf(mid, 0), nextafterf(mid, 1000), hi};
        for (int i = 0; i < 5; i++, checked++) {
            ck_assert_msg(k3rt_f32_to_fp8e4m3(probes[i]) == nearest_by_scan(probes[i]),
                          "%.9g: %d vs %d", probes[i], k3rt_f32_to_fp8e4m3(probes[i]),
                          nearest_by_scan(probes[i]));
            ck_assert_int_eq(k3rt_f32_to_fp8e4m3(-probes[i]), 0x80 | nearest_by_scan(probes[i]));
        }
    }
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 5, 0);
    for (int i = 0; i < 20000; i++, checked++) {
        float a = (float)(ldexp(1.0 + k3rt_rng_normal(&rng) * 0.3, (int)(i % 24) - 14));
        a = fabsf(a);
        ck_assert_int_eq(k3rt_f32_to_fp8e4m3(a), nearest_by_scan(a));
    }
    ck_assert_int_eq(k3rt_f32_to_fp8e4m3(1e6f), 0x7e);
    ck_assert_int_eq(k3rt_f32_to_fp8e4m3(NAN), 0x7f);
    ck_assert_int_gt(checked, 20000);
}
END_TEST

/* Each element within 2^-4 of itself (e4m3 keeps 3 mantissa bits: half an ulp is 2^-4
 * relative) plus half the smallest subnormal step of its tile (2^-10 x scale); every tile's
 * largest element exactly representable up to that rounding. */
START_TEST(fp8_tiles_round_within_bounds)
{
    enum { N = 1000 };
    double x[N], y[N];
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 11, 0);
    for (int i = 0; i < N; i++)
        x[i] = k3rt_rng_normal(&rng) * pow(10.0, (double)(i / 128) - 3);
    for (int i = 256; i < 384; i++)
        x[i] = 0;  /* a tile of zeros */
    unsigned char buf[2048];
    ck_assert_int_le(act_fp8_bytes(N), (int64_t)sizeof buf);
    ck_assert_int_eq(act_fp8_bytes(N), 1000 + 8 * 4);
    act_fp8_store(x, K3RT_F64, N, buf);
    act_fp8_load(buf, N, y, K3RT_F64);
    double worst = 0;
    for (int t0 = 0; t0 < N; t0 += ACT_FP8_TILE) {
        double amax = 0;
        for (int i = t0; i < t0 + ACT_FP8_TILE && i < N; i++)
            amax = fmax(amax, fabs(x[i]));
        double scale = amax / 448;
        for (int i = t0; i < t0 + ACT_FP8_TILE && i < N; i++) {
            double bound = ldexp(fabs(x[i]), -4) + ldexp(scale, -10) * 1.0000001;
            ck_assert_msg(fabs(y[i] - x[i]) <= bound, "element %d: %.9g -> %.9g", i, x[i], y[i]);
            if (fabs(x[i]) > 64 * scale)
                worst = fmax(worst, fabs(y[i] - x[i]) / fabs(x[i]));
        }
    }
    ck_assert_double_gt(worst, 0.01);  /* it is really 3 bits */
    ck_assert_double_le(worst, 0.0625);
    for (int i = 256; i < 384; i++)
        ck_assert(y[i] == 0);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("actman");
    TCase *tc = tcase_create("actman");
    tcase_set_timeout(tc, 240);
    tcase_add_test(tc, recompute_and_offload_are_bitwise_keep);
    tcase_add_test(tc, fp8_gradients_are_close_to_keep);
    tcase_add_test(tc, bad_patterns_are_refused);
    tcase_add_test(tc, recipe_keys_are_validated);
    tcase_add_test(tc, glob_matches_class_names);
    tcase_add_test(tc, fp8_tiles_round_within_bounds);
    tcase_add_test(tc, fp8_encoder_is_nearest_even);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
