/* The whole model in double precision: every parameter's gradient from the explicit
 * backward against central differences of the loss, and the counting conventions. */
#include <math.h>
#include <string.h>

#include "model/model.h"
#include "testutil/testutil.h"

static const char *MODEL_DOC_FMT =
    "{\"d_model\": 8, \"vocab\": 11, \"layers\": 2, \"pattern\": \"MM\", \"norm_eps\": 1e-5,"
    " \"init_std\": 0.3, \"dense_layers\": 0,"
    " \"mixers\": {\"M\": {\"plugin\": \"mla\", \"kind\": \"attention\", \"path\": null,"
    "   \"config\": {\"heads\": 2, \"kv_rank\": 6, \"qk_nope_dim\": 4, \"qk_shared_dim\": 2,"
    "               \"v_dim\": 3, \"init_std\": 0.3}}},"
    " \"ffn\": {\"plugin\": \"dense_glu\", \"kind\": \"moe\", \"path\": null,"
    "   \"config\": {\"hidden\": 12, \"init_std\": 0.3}},"
    " \"balancer\": {\"plugin\": \"none\", \"kind\": \"balancer\", \"path\": null, \"config\": {}},"
    " \"residual\": {\"plugin\": \"%s\", \"kind\": \"residual\", \"path\": null,"
    "   \"config\": %s}}";

enum { B = 2, T = 5 };

static int build_with(model *m, registry *reg, k3rt_stream *s, const char *residual,
                      const char *residual_config, k3rt_error *err)
{
    char text[4096];
    snprintf(text, sizeof text, MODEL_DOC_FMT, residual, residual_config);
    json_t *doc = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(doc);
    model_options o = {K3RT_F64, K3RT_DEVICE_CPU, s, NULL, 7, 0, NULL, NULL};
    int rc = model_build(m, doc, reg, &o, err);
    json_decref(doc);
    return rc;
}

static int build(model *m, registry *reg, k3rt_stream *s, k3rt_error *err)
{
    return build_with(m, reg, s, "standard", "{}", err);
}

static void check_gradients(const char *residual, const char *residual_config)
{
    registry reg;
    k3rt_error err = {0};
    TU_OK(registry_init(&reg, NULL, &err), err);
    if (!registry_find(&reg, "mla", 0) || !registry_find(&reg, "dense_glu", 0)) {
        registry_free(&reg);
        return; /* the baseline plugins are not built */
    }
    k3rt_stream *s = tu_cpu_stream(1);
    model m;
    TU_OK(build_with(&m, &reg, s, residual, residual_config, &err), err);
    TU_OK(model_set_shape(&m, B, T, &err), err);
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (i * 7 + 3) % 11;
        tgt[i] = (i * 5 + 1) % 11;
    }
    tgt[4] = -1;  /* an ignored target */
    /* Norm gains start at 1 and AttnRes queries at 0: move them so their gradients are
     * generic. */
    k3rt_rng rng;
    k3rt_rng_seed(&rng, 3, 0);
    for (int i = 0; i < m.n_params; i++)
        if (m.params[i].decl.role == K3RT_ROLE_NORM_GAIN ||
            m.params[i].decl.role == K3RT_ROLE_VECTOR)
            for (int64_t k = 0; k < m.params[i].numel; k++)
                ((double *)m.params[i].param.data)[k] += 0.2 * k3rt_rng_normal(&rng);
    model_zero_grads(&m);
    double loss;
    const int valid = B * T - 1;
    TU_OK(model_train_step(&m, tok, tgt, 1.0 / valid, 0.0, &loss, &err), err);
    ck_assert_double_gt(loss / valid, 1.0);
    double worst = 0;
    char where[256] = "";
    int checked = 0;
    for (int i = 0; i < m.n_params; i++) {
        param_slot *p = &m.params[i];
        double *v = p->param.data, *g = p->grad.data;
        for (int64_t k = 0; k < p->numel; k += 1 + p->numel / 6) {
            double keep = v[k], lp, lm, eps = 1e-5;
            int64_t cnt;
            v[k] = keep + eps;
            TU_OK(model_eval(&m, tok, tgt, &lp, &cnt, &err), err);
            v[k] = keep - eps;
            TU_OK(model_eval(&m, tok, tgt, &lm, &cnt, &err), err);
            v[k] = keep;
            ck_assert_int_eq(cnt, valid);
            double num = (lp - lm) / (2 * eps * valid);
            double rel = fabs(num - g[k]) / fmax(fmax(fabs(num), fabs(g[k])), 1e-6);
            checked++;
            if (rel > worst) {
                worst = rel;
                snprintf(where, sizeof where, "%s[%lld]: analytic %.10g numeric %.10g", p->name,
                         (long long)k, g[k], num);
            }
        }
    }
    ck_assert_msg(worst < 1e-6, "%s: worst relative error %.3g at %s (%d entries)", residual,
                  worst, where, checked);
    ck_assert_int_gt(checked, 60);
    model_free(&m);
    k3rt_stream_destroy(s);
    registry_free(&reg);
}

START_TEST(every_gradient_matches_finite_differences)
{
    check_gradients("standard", "{}");
}
END_TEST

START_TEST(every_gradient_with_block_attnres)
{
    registry reg;
    k3rt_error err = {0};
    TU_OK(registry_init(&reg, NULL, &err), err);
    int have = registry_find(&reg, "block_attnres", 0) != NULL;
    registry_free(&reg);
    if (!have)
        return;
    check_gradients("block_attnres", "{\"block_layers\": 1}");
    check_gradients("block_attnres", "{\"full\": true}");
}
END_TEST

START_TEST(names_roles_and_counts)
{
    registry reg;
    k3rt_error err = {0};
    TU_OK(registry_init(&reg, NULL, &err), err);
    if (!registry_find(&reg, "mla", 0) || !registry_find(&reg, "dense_glu", 0)) {
        registry_free(&reg);
        return;
    }
    k3rt_stream *s = tu_cpu_stream(1);
    model m;
    TU_OK(build(&m, &reg, s, &err), err);
    ck_assert_str_eq(m.params[0].name, "embed.weight");
    ck_assert_int_eq(m.params[m.n_params - 1].decl.role, K3RT_ROLE_OUTPUT_HEAD);
    ck_assert_str_eq(m.params[m.n_params - 1].name, "head.weight");
    ck_assert_int_ge(model_find_param(&m, "layers.1.ffn.down_proj.weight"), 0);
    ck_assert_int_ge(model_find_param(&m, "layers.0.mixer_norm.weight"), 0);
    /* linear weights are [out, in] */
    param_slot *down = &m.params[model_find_param(&m, "layers.1.ffn.down_proj.weight")];
    ck_assert_int_eq(down->param.shape[0], 8);
    ck_assert_int_eq(down->param.shape[1], 12);
    int64_t total, active, sum = 0;
    model_param_counts(&m, &total, &active);
    for (int i = 0; i < m.n_params; i++)
        sum += m.params[i].numel;
    ck_assert_int_eq(total, sum);
    ck_assert_int_eq(active, total - 11 * 8);  /* the embedding lookup is not active */
    model_free(&m);
    k3rt_stream_destroy(s);
    registry_free(&reg);
}
END_TEST

/* 1000 layers of a previous-token mixer and a width-1 GLU: the core's activation arena for
 * micro-batches of 2^24 x 2^23 tokens is 2000 x 2^47 rows x 64 bytes (> 2^63) for the
 * sublayer inputs alone, while each plugin's own byte counts still fit. Refused as too
 * large, never a wrapped byte count. */
START_TEST(activation_sizes_are_checked)
{
    registry reg;
    k3rt_error err = {0};
    TU_OK(registry_init(&reg, NULL, &err), err);
    const plugin_entry *shift;
    TU_OK(registry_load_file(&reg, K3RT_BINARY_DIR "/fixtures/shift_mixer.so", &shift, &err),
          err);
    if (!registry_find(&reg, "dense_glu", 0)) {
        registry_free(&reg);
        return;
    }
    char pattern[1001], text[8192];
    memset(pattern, 'S', 1000);
    pattern[1000] = '\0';
    snprintf(text, sizeof text,
             "{\"d_model\": 8, \"vocab\": 11, \"layers\": 1000, \"pattern\": \"%s\","
             " \"norm_eps\": 1e-5, \"init_std\": 0.3, \"dense_layers\": 0,"
             " \"mixers\": {\"S\": {\"plugin\": \"shift\", \"kind\": \"attention\","
             "   \"path\": \"%s\", \"config\": {\"init_std\": 0.3}}},"
             " \"ffn\": {\"plugin\": \"dense_glu\", \"kind\": \"moe\", \"path\": null,"
             "   \"config\": {\"hidden\": 1, \"init_std\": 0.3}},"
             " \"balancer\": {\"plugin\": \"none\", \"kind\": \"balancer\", \"path\": null,"
             "   \"config\": {}},"
             " \"residual\": {\"plugin\": \"standard\", \"kind\": \"residual\","
             "   \"path\": null, \"config\": {}}}", pattern, shift->path);
    json_t *doc = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(doc);
    model_options o = {K3RT_F64, K3RT_DEVICE_CPU, NULL, NULL, 7, 0, NULL, NULL};
    model m;
    TU_OK(model_declare(&m, doc, &reg, &o, &err), err);
    json_decref(doc);
    int64_t bytes = -1;
    TU_OK(model_act_bytes(&m, 4, 16, &bytes, &err), err);
    ck_assert_int_gt(bytes, 4 * 16 * 8 * 2000);
    bytes = -1;
    int rc = model_act_bytes(&m, (int64_t)1 << 24, (int64_t)1 << 23, &bytes, &err);
    ck_assert_msg(rc == K3RT_ERR_INVALID, "status %d, %lld bytes: %s", rc, (long long)bytes,
                  err.msg);
    ck_assert_msg(strstr(err.msg, "too large") && strstr(err.msg, "plan.micro_batch"), "%s",
                  err.msg);
    ck_assert_int_eq(bytes, -1);
    model_free(&m);
    registry_free(&reg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("model");
    TCase *tc = tcase_create("model");
    tcase_add_test(tc, every_gradient_matches_finite_differences);
    tcase_add_test(tc, every_gradient_with_block_attnres);
    tcase_add_test(tc, names_roles_and_counts);
    tcase_add_test(tc, activation_sizes_are_checked);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
