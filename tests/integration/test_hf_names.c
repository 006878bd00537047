/* k3rt import / export against the names of a real Kimi-Linear checkpoint: the folder of
 * tests/fixtures/kimi_linear_names (config.json with Kimi-Linear-48B-A3B-Instruct's keys,
 * model.safetensors.index.json with its tensor names, tiny shapes), its tensors generated here
 * in the checkpoint's dtypes (bf16, and f32 for A_log, dt_bias and the routers'
 * e_score_correction_bias), is imported as a run folder (every Hub tensor mapped to a k3rt
 * parameter, or to the aux-free balancer's bias through train.init_state), and the step-0
 * checkpoint exported again gives the index's names, shapes, dtypes and bytes exactly, with
 * model_type kimi_linear; a tied folder is refused by name. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "train/safetensors.h"
#include "util/fs.h"


static int ends(const char *s, const char *tail)
{
    size_t n = strlen(s), k = strlen(tail);
    return n >= k && !strcmp(s + n - k, tail);
}

/* The shape of a Hub tensor of the fixture's config (hidden 64, KDA 2 x 32, MLA 2 heads of
 * nope 16 + rope 8 and v 16, kv rank 32, dense 128, 4 experts of 32, 1 shared, vocab 256);
 * *f32 where the checkpoint keeps f32. */
static int shape_of(const char *n, int64_t *s, int *f32)
{
    *f32 = ends(n, ".A_log") || ends(n, ".dt_bias") || ends(n, ".e_score_correction_bias");
    int mla = strstr(n, "layers.3.self_attn.") != NULL;
#define SET(...) do { int64_t v[] = {__VA_ARGS__}; memcpy(s, v, sizeof v); \
                      return (int)(sizeof v / sizeof v[0]); } while (0)
    if (ends(n, "embed_tokens.weight") || ends(n, "lm_head.weight")) SET(256, 64);
    if (ends(n, "layernorm.weight") && !strstr(n, "kv_a_")) SET(64);
    if (ends(n, "model.norm.weight")) SET(64);
    if (mla) {
        if (ends(n, "q_proj.weight")) SET(48, 64);
        if (ends(n, "kv_a_proj_with_mqa.weight")) SET(40, 64);
        if (ends(n, "kv_a_layernorm.weight")) SET(32);
        if (ends(n, "kv_b_proj.weight")) SET(64, 32);
        if (ends(n, "o_proj.weight")) SET(64, 32);
    }
    if (ends(n, "_conv1d.weight")) SET(64, 1, 4);
    if (ends(n, ".A_log")) SET(1, 1, 2, 1);
    if (ends(n, ".dt_bias") || ends(n, "o_proj.weight") || ends(n, "q_proj.weight") ||
        ends(n, "k_proj.weight") || ends(n, "v_proj.weight")) {
        if (ends(n, ".dt_bias")) SET(64);
        SET(64, 64);
    }
    if (ends(n, "f_a_proj.weight") || ends(n, "g_a_proj.weight")) SET(32, 64);
    if (ends(n, "f_b_proj.weight") || ends(n, "g_b_proj.weight")) SET(64, 32);
    if (ends(n, "b_proj.weight")) SET(2, 64);
    if (ends(n, "o_norm.weight")) SET(32);
    if (strstr(n, ".mlp.")) {
        if (ends(n, "down_proj.weight")) SET(64, 128);
        SET(128, 64);
    }
    if (ends(n, "gate.weight")) SET(4, 64);
    if (ends(n, ".e_score_correction_bias")) SET(4);
    if (ends(n, ".w2.weight") || ends(n, "shared_experts.down_proj.weight")) SET(64, 32);
    if (ends(n, ".w1.weight") || ends(n, ".w3.weight") || strstr(n, "shared_experts.")) SET(32, 64);
#undef SET
    ck_abort_msg("the fixture lists %s, which this test has no shape for", n);
    return 0;
}

/* The fixture's folder in dir/hub: config.json (plus the data and plan a run needs, in the
 * k3rt block that holds no model), the index, and the two shards with generated tensors. */
static json_t *write_folder(const char *dir, int tie)
{
    char path[1024], out[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/kimi_linear_names/config.json",
             tu_source_dir());
    json_t *cfg = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(cfg);
    json_object_set_new(cfg, "k3rt", json_pack("{s:{s:s, s:s}, s:{s:i, s:i}}", "data", "path",
                                               "data/tinyshakespeare.txt", "tokenizer", "bytes",
                                               "plan", "micro_batch", 2, "seq_len", 16));
    if (tie)
        json_object_set_new(cfg, "tie_word_embeddings", json_true());
    snprintf(out, sizeof out, "%s/hub", dir);
    k3rt_error err = {0};
    TU_OK(fs_mkdirs(out, &err), err);
    ck_assert_int_eq(json_dump_file(cfg, strcat(strcpy(path, out), "/config.json"), 0), 0);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/tests/fixtures/kimi_linear_names/model.safetensors.index.json",
             tu_source_dir());
    json_t *index = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(index);
    ck_assert_int_eq(json_dump_file(index, strcat(strcpy(path, out),
                                                  "/model.safetensors.index.json"), 0), 0);
    const json_t *map = json_object_get(index, "weight_map");
    static const char *const files[] = {"model-00001-of-00002.safetensors",
                                        "model-00002-of-00002.safetensors"};
    uint64_t seed = 12345;
    for (int k = 0; k < 2; k++) {
        st_entry e[128];
        void *bufs[128];
        int n = 0;
        const char *name;
        const json_t *v;
        json_object_foreach((json_t *)map, name, v) {
            if (strcmp(json_string_value(v), files[k]))
                continue;
            ck_assert_int_lt(n, 128);
            int f32;
            e[n] = (st_entry){name, K3RT_F32, 0, {0}, NULL};
            e[n].ndim = shape_of(name, e[n].shape, &f32);
            e[n].dtype = f32 ? K3RT_F32 : K3RT_BF16;
            int64_t cnt = 1;
            for (int d = 0; d < e[n].ndim; d++)
                cnt *= e[n].shape[d];
            float *x = malloc((size_t)cnt * 4);
            for (int64_t q = 0; q < cnt; q++) {
                seed = seed * 6364136223846793005ULL + 1442695040888963407ULL;
                x[q] = ((float)(seed >> 40) / (float)(1 << 24) - 0.5f) * 0.2f;
            }
            if (!f32) {
                uint16_t *b = malloc((size_t)cnt * 2);
                for (int64_t q = 0; q < cnt; q++)
                    b[q] = k3rt_f32_to_bf16(x[q]);
                free(x);
                x = (float *)b;
            }
            e[n].data = bufs[n] = x;
            n++;
        }
        snprintf(path, sizeof path, "%s/%s", out, files[k]);
        TU_OK(st_write(path, e, n, NULL, &err), err);
        for (int q = 0; q < n; q++)
            free(bufs[q]);
    }
    return index;
}

START_TEST(test_real_names_round_trip)
{
    char dir[512], args[4096], path[1024];
    tu_tmpdir(dir, sizeof dir);
    json_t *index = write_folder(dir, 0);
    const json_t *map = json_object_get(index, "weight_map");

    snprintf(args, sizeof args, "import %s/hub --out %s/run", dir, dir);
    char *out = tu_k3rt(args, 0);
    /* 115 Hub tensors: 3 MoE layers' 4 experts x 3 stacked (-27), their biases to the state
     * (-3); MLA's q_proj and kv_b_proj split (+2); the identity latent projections (+6) */
    ck_assert_msg(strstr(out, "(93 tensors)") && strstr(out, "state.safetensors"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/run/import/recipe.lua", dir);
    char *recipe = NULL;
    size_t len;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &recipe, &len, &err), err);
    ck_assert_msg(strstr(recipe, "k3.aux_free") && strstr(recipe, "init_state") &&
                  strstr(recipe, "lower_bound = k3.none") && strstr(recipe, "latent = 64") &&
                  strstr(recipe, "latent_norm = false"), "%s", recipe);
    free(recipe);
    /* the step-0 checkpoint's balancer state is the Hub's bias */
    st_file *st, *hub2;
    snprintf(path, sizeof path, "%s/run/checkpoints/step_00000000/state.safetensors", dir);
    TU_OK(st_open(path, &st, &err), err);
    snprintf(path, sizeof path, "%s/hub/model-00002-of-00002.safetensors", dir);
    TU_OK(st_open(path, &hub2, &err), err);
    const st_entry *b = st_find(st, "layers.3.balancer.bias");
    const st_entry *h = st_find(hub2, "model.layers.3.block_sparse_moe.gate.e_score_correction_bias");
    ck_assert_ptr_nonnull(b);
    ck_assert_ptr_nonnull(h);
    ck_assert(!memcmp(b->data, h->data, 16));
    st_close(st);
    st_close(hub2);

    /* exported again: the index's names, and every tensor's shape, dtype and bytes */
    snprintf(args, sizeof args, "export %s/run/checkpoints --hf %s/back --shard-size 100000",
             dir, dir);
    free(tu_k3rt(args, 0));
    snprintf(path, sizeof path, "%s/back/config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    ck_assert_str_eq(json_string_value(json_object_get(cfg, "model_type")), "kimi_linear");
    ck_assert(json_is_false(json_object_get(cfg, "tie_word_embeddings")));
    ck_assert_str_eq(json_string_value(json_object_get(cfg, "moe_router_activation_func")),
                     "sigmoid");
    ck_assert_int_eq(json_integer_value(json_object_get(cfg, "num_key_value_heads")), 2);
    json_decref(cfg);
    snprintf(path, sizeof path, "%s/back/model.safetensors.index.json", dir);
    json_t *back = json_load_file(path, 0, NULL);
    const json_t *bmap = json_object_get(back, "weight_map");
    ck_assert_int_eq(json_object_size(bmap), json_object_size(map));
    const char *name;
    const json_t *v;
    json_object_foreach((json_t *)map, name, v) {
        const json_t *f = json_object_get(bmap, name);
        ck_assert_msg(f, "the export lacks %s", name);
        st_file *a, *c;
        snprintf(path, sizeof path, "%s/hub/%s", dir, json_string_value(v));
        TU_OK(st_open(path, &a, &err), err);
        snprintf(path, sizeof path, "%s/back/%s", dir, json_string_value(f));
        TU_OK(st_open(path, &c, &err), err);
        const st_entry *x = st_find(a, name), *y = st_find(c, name);
        ck_assert_ptr_nonnull(y);
        ck_assert_msg(x->dtype == y->dtype && x->ndim == y->ndim, "%s: dtype or rank", name);
        int64_t n = 1;
        for (int d = 0; d < x->ndim; d++) {
            ck_assert_msg(x->shape[d] == y->shape[d], "%s: dim %d", name, d);
            n *= x->shape[d];
        }
        ck_assert_msg(!memcmp(x->data, y->data, (size_t)n * k3rt_dtype_size(x->dtype)),
                      "%s: the exported bytes differ", name);
        st_close(a);
        st_close(c);
    }
    json_decref(back);
    json_decref(index);
}
END_TEST

START_TEST(test_refuses_tied)
{
    char dir[512];
    tu_tmpdir(dir, sizeof dir);
    json_decref(write_folder(dir, 1));
    char args[4096];
    snprintf(args, sizeof args, "import %s/hub --recipe %s/r.lua", dir, dir);
    char *out = tu_k3rt(args, 1);
    ck_assert_msg(strstr(out, "tie_word_embeddings = true") && strstr(out, "head.weight"), "%s",
                  out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hf_names");
    TCase *tc = tcase_create("hf_names");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_real_names_round_trip);
    tcase_add_test(tc, test_refuses_tied);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
