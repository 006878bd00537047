/* k3rt export / import: a Kimi-Linear-shaped model (KDA + MLA with a query low rank, dense
 * first layer, MoE after it) trained a few steps, exported to a sharded Hugging Face folder
 * and imported back. The folder parses in Python (config.json, the index, every shard); the
 * imported tensors equal the checkpoint's bit for bit, by k3rt's own model document and
 * from the Kimi-Linear fields alone; `k3rt eval` of the imported recipe equals the
 * checkpoint's, and `k3rt train` of it starts from them (train.init_weights); `import --out
 * RUN_DIR` writes a step-0 checkpoint that eval reads and --resume continues; a bf16 export
 * comes back as the bf16 rounding of every weight but A_log and dt_bias (kept f32); a tensor
 * without a Hub name (Block AttnRes) and a Hub tensor without a k3rt name are refused by
 * name. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "train/safetensors.h"
#include "util/fs.h"

static const char *RECIPE =
    "return k3.recipe {\n"
    "  model = {\n"
    "    d_model = 64, vocab = 256, layers = 4, pattern = 'KKKM',\n"
    "    mixers = {\n"
    "      K = k3.kda { heads = 2, head_dim = 32, lower_bound = k3.none, gate_rank = 32 },\n"
    "      M = k3.mla { heads = 2, q_rank = 24, kv_rank = 32, qk_nope_dim = 16,\n"
    "                   qk_shared_dim = 8, v_dim = 16, output_gate = false },\n"
    "    },\n"
    "    dense_layers = 1,\n"
    "    dense_ffn = k3.dense_glu { hidden = 128, act = 'swiglu' },\n"
    "    ffn = k3.latent_moe { experts = 4, top_k = 2, expert_hidden = 32, shared = 1,\n"
    "                          shared_hidden = 32, act = 'swiglu', latent = 64,\n"
    "                          latent_norm = false },\n"
    "    balancer = k3.none {}, residual = k3.standard {},\n"
    "  },\n"
    "  optimizer = k3.adamw { lr = 3e-3 },\n"
    "  plan = { micro_batch = 4, seq_len = 32 },\n"
    "  train = { steps = 6, eval_interval = 6, eval_batches = 2, log_interval = 3,\n"
    "            checkpoint_interval = 6 },\n"
    "  data = { path = 'data/tinyshakespeare.txt', tokenizer = 'bytes' },\n"
    "}\n";


/* "validation loss X nats/token" of k3rt eval PATH over its first 16 windows, as printed. */
static void eval_loss(const char *path, char *loss, size_t len)
{
    char args[2048];
    snprintf(args, sizeof args, "eval %s --windows 16", path);
    char *out = tu_k3rt(args, 0);
    const char *at = strstr(out, "validation loss ");
    ck_assert_msg(at, "%s", out);
    snprintf(loss, len, "%.*s", (int)strcspn(at + 16, " "), at + 16);
    free(out);
}

/* Every tensor of a equals b's of the same name: bitwise, or (bf16) as a's bf16 rounding but
 * for the ones a bf16 export keeps f32 (KDA's A_log and dt_bias, as the Hub checkpoint). */
static int compare(const char *file_a, const char *file_b, int bf16)
{
    st_file *a, *b;
    k3rt_error err = {0};
    TU_OK(st_open(file_a, &a, &err), err);
    TU_OK(st_open(file_b, &b, &err), err);
    ck_assert_int_eq(st_count(a), st_count(b));
    for (int i = 0; i < st_count(a); i++) {
        const st_entry *x = st_at(a, i), *y = st_find(b, x->name);
        ck_assert_msg(y, "%s lacks %s", file_b, x->name);
        ck_assert_int_eq(x->ndim, y->ndim);
        int64_t n = 1;
        for (int d = 0; d < x->ndim; d++) {
            ck_assert_int_eq(x->shape[d], y->shape[d]);
            n *= x->shape[d];
        }
        ck_assert_int_eq(x->dtype, K3RT_F32);
        ck_assert_int_eq(y->dtype, K3RT_F32);
        const float *p = x->data, *q = y->data;
        size_t len = strlen(x->name);
        int f32 = (len >= 5 && !strcmp(x->name + len - 5, "A_log")) ||
                  (len >= 7 && !strcmp(x->name + len - 7, "dt_bias"));
        for (int64_t k = 0; k < n; k++) {
            float want = bf16 && !f32 ? k3rt_bf16_to_f32(k3rt_f32_to_bf16(p[k])) : p[k];
            ck_assert_msg(!memcmp(&want, &q[k], 4), "%s[%lld]: %.9g, imported %.9g", x->name,
                          (long long)k, want, q[k]);
        }
    }
    int n = st_count(a);
    st_close(a);
    st_close(b);
    return n;
}

static int shards(const char *hf)
{
    char path[1024];
    json_t *index = json_load_file(fs_join(path, sizeof path, hf,
                                           "model.safetensors.index.json"), 0, NULL);
    ck_assert_ptr_nonnull(index);
    const char *key;
    json_t *v, *files = json_object();
    json_object_foreach(json_object_get(index, "weight_map"), key, v)
        json_object_set_new(files, json_string_value(v), json_true());
    int n = (int)json_object_size(files);
    json_decref(files);
    json_decref(index);
    return n;
}

START_TEST(test_round_trip)
{
    char dir[512], path[1024], args[4096], ckpt[1024], weights[1024], loss0[32], loss1[32];
    tu_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/kimi.lua", dir);
    tu_write_file(path, RECIPE);
    snprintf(args, sizeof args, "train %s --out %s/run --quiet", path, dir);
    free(tu_k3rt(args, 0));
    snprintf(ckpt, sizeof ckpt, "%s/run/checkpoints/step_00000006", dir);

    /* f32, sharded at 64 KB */
    snprintf(args, sizeof args, "export %s --hf %s/hf --dtype f32 --shard-size 65536", ckpt, dir);
    free(tu_k3rt(args, 0));
    ck_assert_int_ge(shards(strcat(strcpy(path, dir), "/hf")), 3);
    const char *py = tu_python_with_numpy();
    ck_assert_msg(py, "no python3 with numpy to read the folder with");
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "'%s' %s/tests/integration/check_hf_folder.py %s/hf", py,
             tu_source_dir(), dir);
    ck_assert_msg(tu_run(cmd, &out) == 0, "%s\n%s", cmd, out);
    /* 95 k3rt tensors: MLA's q_nope/q_shared and k_b/v_b fused (-2), 4 experts x 3 matrices
     * x 3 MoE layers split (+27), a zero router bias per MoE layer (+3: balancer none); the
     * trained latent projections are not the identity, so this is no Kimi-Linear model */
    ck_assert_msg(strstr(out, "tensors 123 ") && strstr(out, "model_type kimi_k3"), "%s", out);
    free(out);

    /* back, by the k3rt block */
    snprintf(args, sizeof args, "import %s/hf --recipe %s/own.lua --out %s/own", dir, dir, dir);
    free(tu_k3rt(args, 0));
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    snprintf(weights, sizeof weights, "%s/own/model.safetensors", dir);
    ck_assert_int_eq(compare(path, weights, 0), 95);
    eval_loss(ckpt, loss0, sizeof loss0);
    snprintf(path, sizeof path, "%s/own.lua", dir);
    eval_loss(path, loss1, sizeof loss1);
    ck_assert_str_eq(loss0, loss1);
    ck_assert(atof(loss0) > 3 && atof(loss0) < 5.6);
    /* fine-tuning starts from them: one step at lr 1e-12 keeps them (a fresh init would not) */
    snprintf(args, sizeof args, "train %s --out %s/ft --quiet --set train.steps=1 "
             "--set optimizer.lr=1e-12 --set train.checkpoint_interval=1 "
             "--set train.eval_interval=0 --set train.eval_batches=1", path, dir);
    free(tu_k3rt(args, 0));
    snprintf(path, sizeof path, "%s/ft/checkpoints/step_00000001/model.safetensors", dir);
    double moved = tu_safetensors_max_rel_diff(weights, path);
    ck_assert_msg(moved < 1e-6, "one step at lr 1e-12 moved a weight by %g (relative rms)",
                  moved);

    /* back as a run folder: step 0's checkpoint holds the weights bit for bit, `k3rt eval`
     * of it equals the original's, and `--resume` trains on from it (lr 1e-12: kept) */
    snprintf(args, sizeof args, "import %s/hf --out %s/imp", dir, dir);
    free(tu_k3rt(args, 0));
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    snprintf(weights, sizeof weights, "%s/imp/checkpoints/step_00000000/model.safetensors", dir);
    ck_assert_int_eq(compare(path, weights, 0), 95);
    snprintf(path, sizeof path, "%s/imp/checkpoints/step_00000000/state.safetensors", dir);
    ck_assert(fs_exists(path));
    snprintf(path, sizeof path, "%s/imp/checkpoints", dir);
    eval_loss(path, loss1, sizeof loss1);
    ck_assert_str_eq(loss0, loss1);
    snprintf(args, sizeof args, "train %s/imp/import/recipe.lua --out %s/imp --resume "
             "--set train.steps=1 --set optimizer.lr=1e-12 --set train.checkpoint_interval=1 "
             "--set train.eval_interval=0 --set train.eval_batches=1 --no-sample", dir, dir);
    out = tu_k3rt(args, 0);
    ck_assert_msg(strstr(out, "--resume: continuing") && strstr(out, "from step 0"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/imp/checkpoints/step_00000001/model.safetensors", dir);
    moved = tu_safetensors_max_rel_diff(weights, path);
    ck_assert_msg(moved < 1e-6 && moved > 0, "one resumed step at lr 1e-12 moved the weights "
                  "by %g (relative rms)", moved);
    snprintf(args, sizeof args, "import %s/hf --out %s/imp", dir, dir);
    out = tu_k3rt(args, 1);
    ck_assert_msg(strstr(out, "imp already holds import/"), "%s", out);
    free(out);

    /* back, from the Kimi-Linear fields alone */
    snprintf(path, sizeof path, "%s/hf/config.json", dir);
    json_t *cfg = json_load_file(path, 0, NULL);
    json_object_del(json_object_get(cfg, "k3rt"), "model");
    ck_assert_int_eq(json_dump_file(cfg, path, 0), 0);
    json_decref(cfg);
    snprintf(args, sizeof args, "import %s/hf --recipe %s/hub.lua --out %s/hub", dir, dir, dir);
    free(tu_k3rt(args, 0));
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    snprintf(weights, sizeof weights, "%s/hub/model.safetensors", dir);
    ck_assert_int_eq(compare(path, weights, 0), 95);
    snprintf(path, sizeof path, "%s/hub.lua", dir);
    eval_loss(path, loss1, sizeof loss1);
    ck_assert_str_eq(loss0, loss1);

    /* bf16, one file */
    snprintf(args, sizeof args, "export %s --hf %s/bf16", ckpt, dir);
    free(tu_k3rt(args, 0));
    snprintf(args, sizeof args, "import %s/bf16 --recipe %s/bf16.lua", dir, dir);
    free(tu_k3rt(args, 0));
    snprintf(path, sizeof path, "%s/model.safetensors", ckpt);
    snprintf(weights, sizeof weights, "%s/bf16/k3rt/model.safetensors", dir);
    ck_assert_int_eq(compare(path, weights, 1), 95);

    /* a Hub tensor k3rt has no name for */
    st_file *f;
    k3rt_error err = {0};
    snprintf(path, sizeof path, "%s/bf16/model.safetensors", dir);
    TU_OK(st_open(path, &f, &err), err);
    int n = st_count(f);
    st_entry *e = calloc((size_t)n + 1, sizeof *e);
    for (int i = 0; i < n; i++)
        e[i] = *st_at(f, i);
    float freq[4] = {1, 2, 3, 4};
    e[n] = (st_entry){"model.layers.3.self_attn.rotary_emb.inv_freq", K3RT_F32, 1, {4}, freq};
    snprintf(weights, sizeof weights, "%s/bf16/extra.safetensors", dir);
    TU_OK(st_write(weights, e, n + 1, NULL, &err), err);
    st_close(f);
    free(e);
    ck_assert_int_eq(rename(weights, path), 0);
    snprintf(args, sizeof args, "import %s/bf16 --recipe %s/bad.lua", dir, dir);
    out = tu_k3rt(args, 1);
    ck_assert_msg(strstr(out, "model.layers.3.self_attn.rotary_emb.inv_freq maps to no "
                            "parameter"), "%s", out);
    free(out);
}
END_TEST

START_TEST(test_refuses_unmapped)
{
    char dir[512], args[4096];
    tu_tmpdir(dir, sizeof dir);
    snprintf(args, sizeof args, "train scripts/recipes/tiny.lua --out %s/run --quiet "
             "--set train.steps=1 --set train.eval_interval=0 --set train.eval_batches=1 "
             "--set plan.micro_batch=2 --set plan.seq_len=16 --set train.checkpoint_interval=1",
             dir);
    free(tu_k3rt(args, 0));
    snprintf(args, sizeof args, "export %s/run/checkpoints --hf %s/hf", dir, dir);
    char *out = tu_k3rt(args, 1);
    ck_assert_msg(strstr(out, "parameter layers.0.residual.attn.query has no Hugging Face "
                            "name") && strstr(out, "block_attnres"), "%s", out);
    free(out);
    char path[1024];
    snprintf(path, sizeof path, "%s/hf/config.json", dir);
    ck_assert(!fs_exists(path));
}
END_TEST

int main(void)
{
    Suite *s = suite_create("hf_interop");
    TCase *tc = tcase_create("hf_interop");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_round_trip);
    tcase_add_test(tc, test_refuses_unmapped);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
