/* A LatentMoE run whose balancer changes mid-run (train.changes: aux_free -> quantile from
 * step 4): stopping before or after the change and resuming gives the straight run's losses
 * and load statistics bit for bit; the checkpoint records the change and the balancer state.
 * And quantile balancing on two data-parallel ranks trains as one rank with the whole batch. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil/testutil.h"
#include "train/safetensors.h"

enum { STEPS = 10, CHANGE = 4 };

static const char *RECIPE =
    "return k3.recipe {\n"
    "  model = {\n"
    "    d_model = 32, vocab = 256, layers = 3, dense_layers = 1,\n"
    "    mixers = { M = k3.mla { heads = 2, kv_rank = 16, qk_nope_dim = 8, qk_shared_dim = 4,\n"
    "                            v_dim = 8 } },\n"
    "    ffn = k3.latent_moe { experts = 8, top_k = 2, latent = 16, expert_hidden = 24,\n"
    "                          shared = 1, shared_hidden = 24 },\n"
    "    dense_ffn = k3.dense_glu { hidden = 64 },\n"
    "    balancer = k3.aux_free { gamma = 0.01 },\n"
    "    residual = k3.standard {},\n"
    "  },\n"
    "  optimizer = k3.adamw { lr = 3e-3 },\n"
    "  plan = { micro_batch = 4, seq_len = 32, grad_accum = 2 },\n"
    "  train = { steps = 10, warmup = 2, seed = 3, eval_interval = 0, checkpoint_interval = 0,\n"
    "            log_interval = 1,\n"
    "            changes = { { step = 4, balancer = k3.quantile { bins = 100 } } } },\n"
    "  data = { path = \"data/tinyshakespeare.txt\", tokenizer = \"bytes\" },\n"
    "}\n";

static void write_recipe(char *path, size_t len)
{
    char dir[512];
    tu_tmpdir(dir, sizeof dir);
    snprintf(path, len, "%s/moe_swap.lua", dir);
    tu_write_file(path, RECIPE);
}

/* One thread: the model is tiny (57K parameters), and the test is about exactness. */
static int train(const char *recipe, const char *out, const char *extra, char **log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && K3RT_THREADS=1 %s train %s --out %s --no-sample %s",
             tu_source_dir(), tu_k3rt_bin(), recipe, out, extra);
    return tu_run(cmd, log);
}

/* Loss and worst-layer MaxVio by step from metrics.jsonl; returns the steps read. */
static int read_metrics(const char *out, double *loss, double *vio)
{
    char path[1024], line[65536];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        ck_assert_msg(j != NULL, "bad metrics line: %s", line);
        int64_t step = json_integer_value(json_object_get(j, "step"));
        json_t *v = json_object_get(j, "maxvio_worst");
        if (step > 0 && step <= STEPS && v) {
            loss[step] = json_real_value(json_object_get(j, "loss"));
            vio[step] = json_real_value(v);
            n++;
        }
        json_decref(j);
    }
    fclose(f);
    return n;
}

static void expect_same(const char *straight, const char *resumed, const char *what)
{
    double la[STEPS + 1] = {0}, lb[STEPS + 1] = {0}, va[STEPS + 1] = {0}, vb[STEPS + 1] = {0};
    ck_assert_int_eq(read_metrics(straight, la, va), STEPS);
    ck_assert_int_eq(read_metrics(resumed, lb, vb), STEPS);
    for (int s = 1; s <= STEPS; s++) {
        ck_assert_msg(memcmp(&la[s], &lb[s], sizeof(double)) == 0,
                      "%s, step %d: loss straight %.17g, resumed %.17g", what, s, la[s], lb[s]);
        ck_assert_msg(memcmp(&va[s], &vb[s], sizeof(double)) == 0,
                      "%s, step %d: MaxVio straight %.17g, resumed %.17g", what, s, va[s], vb[s]);
    }
}

START_TEST(swap_then_resume_is_bitwise_exact)
{
    char recipe[600], a[512], b[512], c[512], *log = NULL, extra[128];
    write_recipe(recipe, sizeof recipe);
    tu_tmpdir(a, sizeof a);
    tu_tmpdir(b, sizeof b);
    tu_tmpdir(c, sizeof c);
    int rc = train(recipe, a, "", &log);
    ck_assert_msg(rc == 0, "straight run failed (%d):\n%s", rc, log);
    ck_assert_msg(strstr(log, "balancer changed to quantile from step 4 (recipe)"), "%s", log);
    free(log);

    /* stop after the change, resume: the quantile balancer comes back with its bias */
    snprintf(extra, sizeof extra, "--stop-after %d", CHANGE + 2);
    ck_assert_msg(train(recipe, b, extra, &log) == 0, "%s", log);
    free(log);
    ck_assert_msg(train(recipe, b, "--resume", &log) == 0, "%s", log);
    ck_assert_msg(strstr(log, "balancer quantile"), "resume did not rebuild the quantile "
                  "balancer:\n%s", log);
    free(log);
    expect_same(a, b, "stopped after the change");

    /* stop before it: the resumed run makes the change itself */
    snprintf(extra, sizeof extra, "--stop-after %d", CHANGE - 1);
    ck_assert_msg(train(recipe, c, extra, &log) == 0, "%s", log);
    free(log);
    ck_assert_msg(train(recipe, c, "--resume", &log) == 0, "%s", log);
    ck_assert_msg(strstr(log, "balancer changed to quantile from step 4 (recipe)"), "%s", log);
    free(log);
    expect_same(a, c, "stopped before the change");

    /* the checkpoint after the change records it and holds a non-trivial quantile bias */
    char path[1024];
    snprintf(path, sizeof path, "%s/checkpoints/step_%08d/manifest.json", b, CHANGE + 2);
    json_error_t jerr;
    json_t *man = json_load_file(path, 0, &jerr);
    ck_assert_msg(man != NULL, "%s: %s", path, jerr.text);
    json_t *ch = json_array_get(json_object_get(man, "changes"), 0);
    ck_assert_int_eq(json_integer_value(json_object_get(ch, "step")), CHANGE);
    ck_assert_str_eq(json_string_value(json_object_get(json_object_get(ch, "balancer"),
                                                       "plugin")), "quantile");
    json_decref(man);
    snprintf(path, sizeof path, "%s/checkpoints/step_%08d/state.safetensors", b, CHANGE + 2);
    st_file *f;
    k3rt_error err = {0};
    TU_OK(st_open(path, &f, &err), err);
    ck_assert_ptr_null(st_find(f, "layers.0.balancer.bias"));  /* the dense layer has none */
    for (int layer = 1; layer <= 2; layer++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.balancer.bias", layer);
        const st_entry *e = st_find(f, name);
        ck_assert_msg(e != NULL, "%s missing from %s", name, path);
        ck_assert_int_eq(e->dtype, K3RT_F32);
        ck_assert_int_eq(e->shape[0], 8);
        double mean = 0, spread = 0;
        for (int i = 0; i < 8; i++) {
            double v = ((const float *)e->data)[i];
            mean += v / 8;
            spread = fmax(spread, fabs(v));
        }
        ck_assert(fabs(mean) < 1e-6 && spread > 0);  /* quantile's centred bias */
    }
    st_close(f);
}
END_TEST


/* Two data-parallel ranks (histograms summed through the local backend) train the MoE model as
 * one rank with the whole batch does. */
START_TEST(data_parallel_quantile_equals_one_rank)
{
    char recipe[600], one[512], two[512], *log = NULL, fa[1024], fb[1024];
    write_recipe(recipe, sizeof recipe);
    tu_tmpdir(one, sizeof one);
    tu_tmpdir(two, sizeof two);
    const char *common = "--set train.steps=3 --set plan.grad_accum=1 "
                         "--set 'model.balancer=k3.quantile{}'";
    char extra[512];
    snprintf(extra, sizeof extra, "%s --set plan.micro_batch=8", common);
    ck_assert_msg(train(recipe, one, extra, &log) == 0, "%s", log);
    free(log);
    snprintf(extra, sizeof extra, "%s --set plan.micro_batch=4 --set plan.dp=2", common);
    ck_assert_msg(train(recipe, two, extra, &log) == 0, "%s", log);
    free(log);
    snprintf(fa, sizeof fa, "%s/checkpoints/step_00000003/model.safetensors", one);
    snprintf(fb, sizeof fb, "%s/checkpoints/step_00000003/model.safetensors", two);
    double dw = tu_safetensors_max_rel_diff(fa, fb);
    printf("dp=2 x 4 vs dp=1 x 8 with quantile balancing: weights differ by %.2e (relative "
           "rms)\n", dw);
    /* AdamW's first steps magnify rounding differences of the averaged gradients in small
     * weights (the shared experts' down-projection starts at std 0.02/sqrt(6)) */
    ck_assert_msg(dw < 1e-4, "weights differ by %g", dw);
    /* the biases come from integer histograms summed across ranks: the same bits */
    st_file *f1, *f2;
    k3rt_error err = {0};
    snprintf(fa, sizeof fa, "%s/checkpoints/step_00000003/state.safetensors", one);
    snprintf(fb, sizeof fb, "%s/checkpoints/step_00000003/state.safetensors", two);
    TU_OK(st_open(fa, &f1, &err), err);
    TU_OK(st_open(fb, &f2, &err), err);
    for (int layer = 1; layer <= 2; layer++) {
        char name[64];
        snprintf(name, sizeof name, "layers.%d.balancer.bias", layer);
        const st_entry *a = st_find(f1, name), *b = st_find(f2, name);
        ck_assert(a && b);
        ck_assert_msg(memcmp(a->data, b->data, 8 * sizeof(float)) == 0, "%s differs", name);
    }
    st_close(f1);
    st_close(f2);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("balancer_swap");
    TCase *tc = tcase_create("swap");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, swap_then_resume_is_bitwise_exact);
    tcase_add_test(tc, data_parallel_quantile_equals_one_rank);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
