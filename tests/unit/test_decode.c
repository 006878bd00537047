/* Incremental decoding on the CPU (model.h: model_decode_*): for models of tiny.lua's shape
 * with random weights, the logits of every position from decode steps (KDA's state and conv
 * cache, MLA's latent KV cache, the rest of the stack on one token) equal the full forward's;
 * greedy samples are identical along both paths; a mixer with only the ABI 2.0 decode()
 * decodes through the state the rig keeps for it; a model whose mixer cannot decode falls back
 * to the sliding context. */
#include <math.h>
#include <string.h>

#include "testutil/decode_kit.h"
#include "train/train_internal.h"

enum { B = 2, T = 19 };

/* A registry, a stream and a model of dk_model_doc built on the CPU. */
typedef struct fixture {
    registry reg;
    json_t *doc;
    k3rt_stream *s;
    model m;
} fixture;

/* 0 (and nothing to close) when this build lacks a plugin of the model. */
static int fx_open(fixture *f, const char *kda_extra, const char *mla_extra, int dtype)
{
    k3rt_error err = {0};
    TU_OK(registry_init(&f->reg, NULL, &err), err);
    if (!dk_have_plugins(&f->reg)) {
        registry_free(&f->reg);
        return 0;
    }
    f->doc = dk_model_doc(8, kda_extra, mla_extra);
    f->s = tu_cpu_stream(2);
    dk_build(&f->m, &f->reg, f->doc, f->s, dtype, K3RT_DEVICE_CPU);
    return 1;
}

static void fx_close(fixture *f)
{
    model_free(&f->m);
    json_decref(f->doc);
    k3rt_stream_destroy(f->s);
    registry_free(&f->reg);
}

/* Decode against full forward for one model document in one dtype: the worst relative rms
 * difference of a position's logits below tol. In f32 the full forward itself is some 1e-5
 * away from the f64 one (rounding, amplified by the layers), so the f32 check also holds the
 * decode to the f64 full forward: no further from it than twice the f32 full forward is. */
static void check_positions(const char *kda_extra, const char *mla_extra, int dtype, double tol)
{
    fixture f;
    if (!fx_open(&f, kda_extra, mla_extra, dtype))
        return;
    char why[256];
    ck_assert_msg(model_can_decode(&f.m, why, sizeof why), "%s", why);
    int32_t tok[B * T];
    dk_tokens(tok, B, T);
    const int64_t V = f.m.vocab;
    size_t n = (size_t)(T * B * V);
    double *full = malloc(n * sizeof *full), *dec = malloc(n * sizeof *dec);
    ck_assert(full && dec);
    for (size_t i = 0; i < n; i++)
        dec[i] = NAN;  /* every entry must be written */
    dk_full_logits(&f.m, tok, B, T, full);
    dk_decode_logits(&f.m, tok, B, T, dec);
    int64_t at = 0;
    double worst = dk_worst(full, dec, T * B, V, &at);
    ck_assert_msg(worst < tol, "%s: position %lld row %lld: rel rms %.3g (tolerance %.1g) [%s | %s]",
                  k3rt_dtype_name(dtype), (long long)(at / B), (long long)(at % B), worst, tol,
                  kda_extra, mla_extra);
    /* the logits are not trivially equal: they move with the position */
    ck_assert_double_gt(tu_rel_rms(full, full + (T - 1) * B * V, V), 1e-3);
    if (dtype == K3RT_F32) {
        model ref;
        double *truth = malloc(n * sizeof *truth);
        ck_assert_ptr_nonnull(truth);
        dk_build(&ref, &f.reg, f.doc, f.s, K3RT_F64, K3RT_DEVICE_CPU);
        dk_full_logits(&ref, tok, B, T, truth);
        double e_full = dk_worst(truth, full, T * B, V, &at);
        double e_dec = dk_worst(truth, dec, T * B, V, &at);
        /* Both are f32 roundings of the same sums in other orders (one token's row products
         * against the whole batch's GEMMs), so their distances from f64 are of one size, not
         * equal: with OpenBLAS's SkylakeX kernels the decode is within 2x of the forward, with
         * the Haswell ones it picks on an AVX-512 EPYC 2.5x (1.43e-5 against 5.66e-6). A wrong
         * cache or position is off by orders of magnitude more (the f64 case holds 1e-11). */
        ck_assert_msg(e_dec <= 4 * e_full + 1e-7, "f32 decode is %.3g from the f64 forward, "
                      "the f32 forward %.3g", e_dec, e_full);
        model_free(&ref);
        free(truth);
    }
    free(full);
    free(dec);
    fx_close(&f);
}

START_TEST(decode_equals_full_forward_f64)
{
    check_positions("", "", K3RT_F64, 1e-11);
}
END_TEST

START_TEST(decode_equals_full_forward_f32)
{
    check_positions("", "", K3RT_F32, 2e-5);
}
END_TEST

/* The other forms of both mixers: KDA's recurrent algorithm, GVA, low-rank output gate and the
 * unbounded softplus gate with dk != dv; MLA's query low rank, no shared key, no output gate. */
START_TEST(decode_equals_full_forward_variants)
{
    check_positions(", \"algorithm\": \"recurrent\", \"value_heads\": 4, \"gate_rank\": 4",
                    ", \"q_rank\": 12", K3RT_F64, 1e-11);
    check_positions(", \"lower_bound\": null, \"head_dk\": 6, \"forget_rank\": 0,"
                    " \"conv_width\": 2", ", \"qk_shared_dim\": 0, \"output_gate\": false",
                    K3RT_F64, 1e-11);
    check_positions(", \"conv_width\": 1", ", \"q_rank\": 12", K3RT_F32, 2e-5);
}
END_TEST

/* Two samples of one configuration, the second along the sliding context. */
static void sample_both(fixture *f, int64_t seq_len, json_t *cfg, char **cached, char **slid,
                        sample_stats *a, sample_stats *b)
{
    k3rt_error err = {0};
    json_object_set_new(cfg, "recompute", json_false());
    TU_OK(sample_text(&f->m, seq_len, cfg, cached, a, &err), err);
    json_object_set_new(cfg, "recompute", json_true());
    TU_OK(sample_text(&f->m, seq_len, cfg, slid, b, &err), err);
}

/* Greedy text from the cached path and from the sliding context, within seq_len (where the two
 * contexts are the same text): identical; a sample at temperature 0.8 is reproducible. */
START_TEST(greedy_samples_agree)
{
    fixture f;
    if (!fx_open(&f, "", "", K3RT_F32))
        return;
    json_t *cfg = json_pack("{s:i, s:f, s:i, s:s, s:i}", "bytes", 40, "temperature", 0.0,
                            "top_k", 0, "prompt", "To be", "seed", 3);
    char *cached = NULL, *slid = NULL;
    sample_stats a, b;
    sample_both(&f, 64, cfg, &cached, &slid, &a, &b);
    ck_assert_int_eq(a.cached, 1);
    ck_assert_int_eq(b.cached, 0);
    ck_assert_int_eq(a.tokens, 40);
    ck_assert_int_eq(b.tokens, 40);
    ck_assert_mem_eq(cached, slid, 40); /* (a random model may draw byte 0: no strlen) */
    free(cached);
    free(slid);
    json_object_set_new(cfg, "temperature", json_real(0.8));
    json_object_set_new(cfg, "recompute", json_false());
    char *t1 = NULL, *t2 = NULL;
    k3rt_error err = {0};
    TU_OK(sample_text(&f.m, 64, cfg, &t1, NULL, &err), err);
    TU_OK(sample_text(&f.m, 64, cfg, &t2, NULL, &err), err);
    ck_assert_mem_eq(t1, t2, 40);
    free(t1);
    free(t2);
    json_decref(cfg);
    fx_close(&f);
}
END_TEST

/* Past seq_len the cached path keeps the whole text as context and the sliding one the last
 * seq_len bytes: both run, and agree while the text fits seq_len. */
START_TEST(context_past_seq_len)
{
    fixture f;
    if (!fx_open(&f, "", "", K3RT_F64))
        return;
    const int64_t seq_len = 8, n = 30;
    json_t *cfg = json_pack("{s:i, s:f, s:i, s:s, s:i}", "bytes", (int)n, "temperature", 0.0,
                            "top_k", 0, "prompt", "ab", "seed", 1);
    char *cached = NULL, *slid = NULL;
    sample_stats a, b;
    sample_both(&f, seq_len, cfg, &cached, &slid, &a, &b);
    ck_assert_int_eq(a.tokens, n);
    ck_assert_int_eq(b.tokens, n);
    /* the first seq_len - 1 drawn bytes saw the same context (the prompt and what follows) */
    ck_assert_mem_eq(cached, slid, (size_t)(seq_len - 1));
    free(cached);
    free(slid);
    json_decref(cfg);
    fx_close(&f);
}
END_TEST

/* A model of two previous-token mixers from a fixture file (tests/fixtures/shift_mixer.c). */
static void build_shift_model(model *m, registry *reg, k3rt_stream *s, const char *file)
{
    char path[1024], text[2048];
    k3rt_error err = {0};
    const plugin_entry *e;
    snprintf(path, sizeof path, "%s/fixtures/%s", K3RT_BINARY_DIR, file);
    TU_OK(registry_load_file(reg, path, &e, &err), err);
    snprintf(text, sizeof text,
             "{\"d_model\": 16, \"vocab\": 256, \"layers\": 2, \"pattern\": \"SS\","
             " \"norm_eps\": 1e-5, \"init_std\": 0.3, \"dense_layers\": 0,"
             " \"mixers\": {\"S\": {\"plugin\": \"shift\", \"kind\": \"attention\","
             "   \"path\": \"%s\", \"config\": {\"init_std\": 0.3}}},"
             " \"ffn\": {\"plugin\": \"dense_glu\", \"kind\": \"moe\", \"path\": null,"
             "   \"config\": {\"hidden\": 24, \"init_std\": 0.3}},"
             " \"balancer\": {\"plugin\": \"none\", \"kind\": \"balancer\", \"path\": null,"
             "   \"config\": {}},"
             " \"residual\": {\"plugin\": \"standard\", \"kind\": \"residual\","
             "   \"path\": null, \"config\": {}}}", path);
    json_t *doc = json_loads(text, 0, NULL);
    ck_assert_ptr_nonnull(doc);
    model_options o = {K3RT_F64, K3RT_DEVICE_CPU, s, NULL, 3, 0, NULL, NULL};
    TU_OK(model_build(m, doc, reg, &o, &err), err);
    json_decref(doc);
}

/* A plugin with only the ABI 2.0 decode() (its state carried by the rig) decodes as well; one
 * with neither entry cannot, says which mixer, and samples along the sliding context. */
START_TEST(older_decode_and_fallback)
{
    registry reg;
    k3rt_error err = {0};
    TU_OK(registry_init(&reg, NULL, &err), err);
    if (!registry_find(&reg, "dense_glu", 0) || !registry_find(&reg, "standard", 0)) {
        registry_free(&reg);
        return;
    }
    k3rt_stream *s = tu_cpu_stream(1);
    model m;
    build_shift_model(&m, &reg, s, "shift_state.so");
    char why[256];
    ck_assert(model_can_decode(&m, why, sizeof why));
    enum { T2 = 7 };
    int32_t tok[B * T2];
    dk_tokens(tok, B, T2);
    double full[T2 * B * 256], dec[T2 * B * 256];
    dk_full_logits(&m, tok, B, T2, full);
    dk_decode_logits(&m, tok, B, T2, dec);
    int64_t at;
    ck_assert_double_lt(dk_worst(full, dec, T2 * B, 256, &at), 1e-12);
    model_free(&m);

    build_shift_model(&m, &reg, s, "shift_mixer.so");
    ck_assert(!model_can_decode(&m, why, sizeof why));
    ck_assert_msg(strstr(why, "layers.0.mixer (shift)"), "%s", why);
    ck_assert_int_eq(model_decode_begin(&m, 1, 8, &err), K3RT_ERR_UNSUPPORTED);
    json_t *cfg = json_pack("{s:i, s:f, s:i, s:s, s:i}", "bytes", 5, "temperature", 0.0,
                            "top_k", 0, "prompt", "x", "seed", 1);
    char *text = NULL;
    sample_stats st;
    TU_OK(sample_text(&m, 16, cfg, &text, &st, &err), err);
    ck_assert_int_eq(st.cached, 0);
    ck_assert_int_eq(st.tokens, 5);
    ck_assert_msg(strstr(st.why, "shift"), "%s", st.why);
    free(text);
    json_decref(cfg);
    model_free(&m);
    k3rt_stream_destroy(s);
    registry_free(&reg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("decode");
    TCase *tc = tcase_create("decode");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, decode_equals_full_forward_f64);
    tcase_add_test(tc, decode_equals_full_forward_f32);
    tcase_add_test(tc, decode_equals_full_forward_variants);
    tcase_add_test(tc, greedy_samples_agree);
    tcase_add_test(tc, context_past_seq_len);
    tcase_add_test(tc, older_decode_and_fallback);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
