/* `k3rt ablate`: the CI suite runs end to end (table and plots written, every variant's FLOPs
 * equal to the planner's count for its recipe and steps, every final loss below ln 256 - 1),
 * a variant that fails at run time does not take the suite down, a misspelt override fails
 * before anything trains; a suite with `seeds` reports the seed spread and each variant
 * against it, MFU where the runs know their peak; the GPU suites load, plan and (shrunk) run
 * on the CPU, sharing their base runs through one run folder. */
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "util/fs.h"

/* s in single quotes for sh. */
static void quote(char *buf, size_t len, const char *s)
{
    size_t at = 0;
    buf[at++] = '\'';
    for (; *s && at + 6 < len; s++) {
        if (*s == '\'') {
            memcpy(buf + at, "'\\''", 4);
            at += 4;
        } else {
            buf[at++] = *s;
        }
    }
    buf[at++] = '\'';
    buf[at] = '\0';
}

static void append_sets(char *cmd, size_t len, const json_t *sets)
{
    size_t i;
    json_t *s;
    json_array_foreach(sets, i, s) {
        char q[512];
        quote(q, sizeof q, json_string_value(s));
        size_t at = strlen(cmd);
        snprintf(cmd + at, len - at, " --set %s", q);
    }
}

/* The sanitizer build runs the code several times slower: it trains the CI suite smaller. */
#if defined(__SANITIZE_ADDRESS__)
static const char *SMALLER = " --set train.steps=40 --set train.eval_interval=10"
                             " --set plan.micro_batch=4 --set plan.seq_len=32";
#else
static const char *SMALLER = "";
#endif

/* The planner's training FLOPs per step for the base recipe with these overrides. */
static double planned_step_flops(const char *base, const json_t *suite_sets,
                                 const json_t *variant_sets, const json_t *command_sets)
{
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cd %s && %s plan %s --gpus 1 --json", tu_source_dir(),
             tu_k3rt_bin(), base);
    append_sets(cmd, sizeof cmd, suite_sets);
    append_sets(cmd, sizeof cmd, variant_sets);
    append_sets(cmd, sizeof cmd, command_sets);
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s\n%s", cmd, out);
    json_t *plan = json_loads(out, 0, NULL);
    ck_assert_msg(plan != NULL, "plan --json printed: %s", out);
    double f = json_number_value(json_object_get(plan, "flops_per_step"));
    json_decref(plan);
    free(out);
    return f;
}

static void assert_png(const char *path)
{
    char *data;
    size_t len;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &data, &len, &err), err);
    ck_assert(len > 1000 && !memcmp(data, "\x89PNG\r\n\x1a\n", 8));
    free(data);
}

START_TEST(test_ci_suite)
{
    char dir[512], cmd[2048], path[700];
    tu_tmpdir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "cd %s && %s ablate scripts/recipes/ablations/ci.lua --out %s/ci%s",
             tu_source_dir(), tu_k3rt_bin(), dir, SMALLER);
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s\n%s", cmd, out);
    free(out);
    const char *files[] = {"table.md", "table.json", "loss_vs_flops.svg", "loss_vs_flops.png"};
    for (int i = 0; i < 4; i++) {
        snprintf(path, sizeof path, "%s/ci/%s", dir, files[i]);
        ck_assert_msg(fs_exists(path), "%s is missing", path);
    }
    snprintf(path, sizeof path, "%s/ci/loss_vs_flops.png", dir);
    assert_png(path);
    snprintf(path, sizeof path, "%s/ci/table.json", dir);
    json_t *t = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(t);
    const json_t *vars = json_object_get(t, "variants");
    ck_assert_int_eq((int)json_array_size(vars), 3);
    const char *base = "scripts/recipes/ablations/../tiny.lua";
    ck_assert_str_eq(json_string_value(json_object_get(t, "base")), base);
    size_t i;
    json_t *v;
    json_array_foreach(vars, i, v) {
        const char *name = json_string_value(json_object_get(v, "name"));
        ck_assert_msg(!json_is_true(json_object_get(v, "failed")), "%s failed: %s", name,
                      json_string_value(json_object_get(v, "failure")));
        double loss = json_number_value(json_object_get(v, "final_val_loss"));
        ck_assert_msg(loss < log(256.0) - 1, "%s: final validation loss %g", name, loss);
        double steps = (double)json_integer_value(json_object_get(v, "steps"));
        double flops = json_number_value(json_object_get(v, "flops"));
        double planned = planned_step_flops(base, json_object_get(t, "set"),
                                            json_object_get(v, "set"),
                                            json_object_get(t, "command_set"));
        ck_assert_msg(flops == steps * planned, "%s: trained %.17g FLOPs, planner %.17g x %g",
                      name, flops, planned, steps);
        ck_assert_int_ge((int)json_array_size(json_object_get(v, "curve")), 4);
        double eff = json_number_value(json_object_get(v, "efficiency"));
        ck_assert_msg(isfinite(eff) && eff > 0, "%s: efficiency %g", name, eff);
        if (i == 0)
            ck_assert(eff == 1);
    }
    json_decref(t);
    snprintf(path, sizeof path, "%s/ci/table.md", dir);
    char *md;
    size_t len;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &md, &len, &err), err);
    ck_assert(strstr(md, "| base |") && strstr(md, "| all-mla |") && strstr(md, "| aux-free |"));
    ck_assert(strstr(md, "Command: `k3rt ablate scripts/recipes/ablations/ci.lua"));
    free(md);
}
END_TEST

static void write_suite(const char *dir, const char *variant_set, char *path, size_t len)
{
    char text[2048];
    snprintf(path, len, "%s/suite.lua", dir);
    snprintf(text, sizeof text,
             "return { name = 'small', base = '%s/scripts/recipes/tiny.lua',\n"
             "  set = { 'train.steps=6', 'train.warmup=1', 'train.eval_interval=3',\n"
             "          'train.eval_batches=1', 'train.checkpoint_interval=0',\n"
             "          'plan.micro_batch=2', 'plan.seq_len=32' },\n"
             "  variants = { { name = 'broken', set = { %s } } } }\n",
             tu_source_dir(), variant_set);
    tu_write_file(path, text);
}

START_TEST(test_failing_variant)
{
    char dir[512], suite[700], cmd[2048], path[700];
    tu_tmpdir(dir, sizeof dir);
    write_suite(dir, "[[data.path=\"/nonexistent/corpus.txt\"]]", suite, sizeof suite);
    snprintf(cmd, sizeof cmd, "cd %s && %s ablate %s --out %s/out", tu_source_dir(),
             tu_k3rt_bin(), suite, dir);
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 1, "%s\n%s", cmd, out);
    ck_assert_msg(strstr(out, "variants failed: broken"), "%s", out);
    free(out);
    snprintf(path, sizeof path, "%s/out/table.json", dir);
    json_t *t = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(t);
    const json_t *vars = json_object_get(t, "variants");
    ck_assert(!json_is_true(json_object_get(json_array_get(vars, 0), "failed")));
    ck_assert(isfinite(json_number_value(
        json_object_get(json_array_get(vars, 0), "final_val_loss"))));
    ck_assert(json_is_true(json_object_get(json_array_get(vars, 1), "failed")));
    json_decref(t);
    snprintf(path, sizeof path, "%s/out/broken/train.log", dir);
    char *log;
    size_t len;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &log, &len, &err), err);
    ck_assert_msg(strstr(log, "/nonexistent/corpus.txt"), "%s", log);
    free(log);
    snprintf(path, sizeof path, "%s/out/loss_vs_flops.png", dir);
    assert_png(path);
    /* The suite again in its folder: the base trains again there (its folder holds the
     * previous base run's checkpoints, which the new run replaces). */
    rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 1 && strstr(out, "variants failed: broken ("), "%s\n%s", cmd, out);
    free(out);
}
END_TEST

START_TEST(test_misspelt_override_fails_first)
{
    char dir[512], suite[700], cmd[2048], path[700];
    tu_tmpdir(dir, sizeof dir);
    write_suite(dir, "'model.layrs=2'", suite, sizeof suite);
    snprintf(cmd, sizeof cmd, "cd %s && %s ablate %s --out %s/out", tu_source_dir(),
             tu_k3rt_bin(), suite, dir);
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 1, "%s\n%s", cmd, out);
    ck_assert_msg(strstr(out, "variant 'broken'") && strstr(out, "did you mean 'layers'"), "%s",
                  out);
    free(out);
    snprintf(path, sizeof path, "%s/out/base", dir);
    ck_assert_msg(!fs_exists(path), "the base trained before the suite was checked");
}
END_TEST

/* The cell of table.md's row `row` under the column headed `col` ("" when absent). */
static void md_cell(const char *md, const char *row, const char *col, char *buf, size_t len)
{
    buf[0] = '\0';
    const char *head = strstr(md, "| variant |");
    ck_assert_ptr_nonnull(head);
    char key[160];
    snprintf(key, sizeof key, "\n| %s |", row);
    const char *line = strstr(head, key);
    ck_assert_msg(line != NULL, "no row %s in:\n%s", row, md);
    line++;
    int want = -1, k = 0;
    for (const char *p = head; *p && *p != '\n'; p++)
        if (*p == '|') {
            size_t n = strlen(col);
            if (!strncmp(p + 2, col, n) && p[2 + n] == ' ' && p[3 + n] == '|')
                want = k;
            k++;
        }
    ck_assert_msg(want >= 0, "no column '%s'", col);
    k = 0;
    for (const char *p = line; *p && *p != '\n'; p++)
        if (*p == '|' && k++ == want) {
            size_t n = strcspn(p + 1, "|\n");
            snprintf(buf, len, "%.*s", (int)(n > 1 ? n - 2 : 0), p + 2);
            return;
        }
}

static const json_t *row_named(const json_t *t, const char *name)
{
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(t, "variants"), i, v)
        if (!strcmp(json_string_value(json_object_get(v, "name")), name))
            return v;
    ck_abort_msg("no variant %s in table.json", name);
    return NULL;
}

static double num_of(const json_t *o, const char *key)
{
    const json_t *v = json_object_get(o, key);
    return json_is_number(v) ? json_number_value(v) : NAN;
}

START_TEST(test_seed_spread_and_mfu)
{
    char dir[512], suite[700], cmd[2048], path[700], text[2048];
    tu_tmpdir(dir, sizeof dir);
    snprintf(suite, sizeof suite, "%s/seeds.lua", dir);
    snprintf(text, sizeof text,
             "return { name = 'seeds', base = '%s/scripts/recipes/tiny.lua',\n"
             "  set = { 'train.steps=8', 'train.warmup=1', 'train.eval_interval=2',\n"
             "          'train.log_interval=2', 'train.eval_batches=1',\n"
             "          'train.checkpoint_interval=0', 'plan.micro_batch=2', 'plan.seq_len=32',\n"
             "          'train.eval_at_start=true' },\n"
             "  seeds = { 1, 2 },\n"
             "  variants = { { name = 'mfu', set = { 'plan.peak_tflops=0.01' } },\n"
             "               { name = 'all-mla', set = { \"model.pattern='M'\",\n"
             "                                           'model.mixers.K=nil' } } } }\n",
             tu_source_dir());
    tu_write_file(suite, text);
    snprintf(cmd, sizeof cmd, "cd %s && %s ablate %s --out %s/out", tu_source_dir(),
             tu_k3rt_bin(), suite, dir);
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s\n%s", cmd, out);
    free(out);
    snprintf(path, sizeof path, "%s/out/table.json", dir);
    json_t *t = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(t);
    ck_assert_int_eq((int)json_array_size(json_object_get(t, "variants")), 4);
    const json_t *base = row_named(t, "base"), *seed2 = row_named(t, "base-seed2");
    const json_t *mfu = row_named(t, "mfu"), *mla = row_named(t, "all-mla");
    ck_assert_int_eq(json_integer_value(json_object_get(base, "seed")), 1);
    ck_assert_int_eq(json_integer_value(json_object_get(seed2, "seed")), 2);
    ck_assert_int_eq(json_integer_value(json_object_get(mla, "seed")), 1);
    ck_assert(json_is_true(json_object_get(seed2, "seed_replica")));
    ck_assert(json_is_false(json_object_get(mla, "seed_replica")));
    /* Each row's loss is its own run's; another seed is another run. */
    double lb = num_of(base, "final_val_loss"), l2 = num_of(seed2, "final_val_loss");
    ck_assert(lb == tu_metrics_final_val_loss(json_string_value(json_object_get(base, "dir"))));
    ck_assert(l2 == tu_metrics_final_val_loss(json_string_value(json_object_get(seed2, "dir"))));
    ck_assert_msg(lb != l2, "seeds 1 and 2 ended at the same loss %.17g", lb);
    const json_t *sp = json_object_get(t, "seed_spread");
    double spread = num_of(sp, "final_val_loss_spread");
    ck_assert_msg(spread == fabs(lb - l2), "spread %.17g, |%.17g - %.17g|", spread, lb, l2);
    ck_assert(num_of(json_array_get(json_object_get(sp, "runs"), 1), "final_val_loss") == l2);
    ck_assert(json_number_value(json_array_get(json_object_get(sp, "replica_efficiency"), 0)) ==
              num_of(seed2, "efficiency"));
    ck_assert(json_is_null(json_object_get(base, "beyond_seed_spread")));
    ck_assert(json_is_null(json_object_get(seed2, "beyond_seed_spread")));
    /* The step-0 evaluation (eval_at_start) is off the curve: it has no compute, and the
     * curve's axis and fit are logarithmic; the curve is the 4 evaluations that follow it. */
    const json_t *curve = json_object_get(base, "curve");
    ck_assert_int_eq((int)json_array_size(curve), 4);
    ck_assert(json_number_value(json_array_get(json_array_get(curve, 0), 0)) > 0);
    ck_assert(isfinite(num_of(mla, "efficiency")));
    const json_t *vs[] = {mfu, mla};
    for (int i = 0; i < 2; i++) {
        double d = fabs(num_of(vs[i], "final_val_loss") - lb);
        ck_assert(json_is_boolean(json_object_get(vs[i], "beyond_seed_spread")));
        ck_assert(json_is_true(json_object_get(vs[i], "beyond_seed_spread")) == (d > spread));
    }
    /* MFU only where the run knew a peak: the interval's FLOPs over time and peak, which is
     * tokens/s x FLOPs per token / peak over the same intervals. */
    ck_assert(json_is_null(json_object_get(base, "mfu")));
    double u = num_of(mfu, "mfu");
    double expect = num_of(mfu, "tokens_per_s") * num_of(mfu, "flops") / num_of(mfu, "tokens") /
                    0.01e12;
    ck_assert_msg(fabs(u - expect) <= 1e-9 * expect, "mfu %.17g, expected %.17g", u, expect);
    snprintf(path, sizeof path, "%s/out/table.md", dir);
    char *md, cell[128], want[160];
    size_t len;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &md, &len, &err), err);
    md_cell(md, "base", "MFU", cell, sizeof cell);
    ck_assert_str_eq(cell, "-");
    md_cell(md, "mfu", "MFU", cell, sizeof cell);
    snprintf(want, sizeof want, "%.1f%%", 100 * u);
    ck_assert_str_eq(cell, want);
    md_cell(md, "base-seed2", "Δ val loss vs base", cell, sizeof cell);
    snprintf(want, sizeof want, "%+.4f (seed)", l2 - lb);
    ck_assert_str_eq(cell, want);
    md_cell(md, "all-mla", "Δ val loss vs base", cell, sizeof cell);
    snprintf(want, sizeof want, "%+.4f, %s", num_of(mla, "final_val_loss") - lb,
             json_is_true(json_object_get(mla, "beyond_seed_spread")) ? "beyond" : "within");
    ck_assert_str_eq(cell, want);
    snprintf(want, sizeof want, "Seed spread: the base under seeds 1, 2 ends %.4f apart in "
             "final validation loss; compute efficiency of seed 2 against seed 1: %.3f.",
             spread, num_of(seed2, "efficiency"));
    ck_assert_msg(strstr(md, want), "no '%s' in:\n%s", want, md);
    free(md);
    json_decref(t);
    /* A seed on the command line would train the replicas under one seed: refused first. */
    snprintf(cmd, sizeof cmd, "cd %s && %s ablate %s --out %s/out2 --set train.seed=5",
             tu_source_dir(), tu_k3rt_bin(), suite, dir);
    rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 1 && strstr(out, "variant 'base': trains under train.seed = 5, not the "
                                         "suite's seed 1"), "%s\n%s", cmd, out);
    free(out);
    snprintf(path, sizeof path, "%s/out2", dir);
    ck_assert(!fs_exists(path));
}
END_TEST

/* The GPU suites' base shrunk to a CPU test: the same shape (KKKM, the KDA and MLA heads, 32
 * experts top-4, Block AttnRes over 4 layers), narrower and shorter. */
static const char *GPU_SHRINK =
    " --set model.layers=4 --set model.d_model=64 --set model.dense_ffn.hidden=128"
    " --set model.ffn.latent=32 --set model.ffn.expert_hidden=32 --set model.ffn.shared_hidden=64"
    " --set plan.micro_batch=2 --set plan.seq_len=64 --set train.steps=3 --set train.warmup=1"
    " --set train.eval_interval=1 --set train.eval_batches=1 --set train.log_interval=1";

static json_t *ablate_json(const char *dir, const char *suite, const char *opts)
{
    char cmd[4096], path[800];
    snprintf(cmd, sizeof cmd, "cd %s && %s ablate scripts/recipes/ablations/gpu/%s.lua "
             "--runs %s/runs --out %s/%s%s%s", tu_source_dir(), tu_k3rt_bin(), suite, dir, dir,
             suite, GPU_SHRINK, opts);
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s\n%s", cmd, out);
    free(out);
    snprintf(path, sizeof path, "%s/%s/table.json", dir, suite);
    json_t *t = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(t);
    return t;
}

START_TEST(test_gpu_suites)
{
    static const char *const suites[] = {"kda_hybrid", "attnres", "balancer", "optimizer"};
    char dir[512], cmd[2048], base_dir[4][256];
    tu_tmpdir(dir, sizeof dir);
    /* At full size: every variant loads and plans; the four bases are one run, and base.lua's
     * header states the planner's count. */
    char *header, *out = NULL;
    size_t len;
    k3rt_error err = {0};
    snprintf(cmd, sizeof cmd, "%s/scripts/recipes/ablations/gpu/base.lua", tu_source_dir());
    TU_OK(fs_read_file(cmd, &header, &len, &err), err);
    for (int i = 0; i < 4; i++) {
        snprintf(cmd, sizeof cmd, "cd %s && %s ablate scripts/recipes/ablations/gpu/%s.lua "
                 "--dry-run", tu_source_dir(), tu_k3rt_bin(), suites[i]);
        int rc = tu_run(cmd, &out);
        ck_assert_msg(rc == 0, "%s\n%s", cmd, out);
        char total[32], active[32];
        const char *row = strstr(out, "\n  ");
        ck_assert_msg(row && sscanf(row, " %*s %31s parameters (%31s active)", total,
                                    active) == 2, "%s", out);
        active[strcspn(active, ")")] = '\0';
        snprintf(cmd, sizeof cmd, "%s parameters, %s active", total, active);
        ck_assert_msg(strstr(header, cmd), "base.lua's header lacks '%s'", cmd);
        const char *in = strstr(out, " in out/gpu_runs/");
        ck_assert_msg(in != NULL, "%s", out);
        snprintf(base_dir[i], sizeof base_dir[i], "%.*s", (int)strcspn(in, "\n"), in);
        ck_assert_str_eq(base_dir[i], base_dir[0]);
        free(out);
    }
    free(header);
    /* Shrunk: one suite trains its three or four runs; another finds its base and seed
     * replica in the shared folder and trains only its own variant. */
    json_t *opt = ablate_json(dir, "optimizer", "");
    json_t *kda = ablate_json(dir, "kda_hybrid", " --reuse");
    const char *shared[] = {"per-head-muon", "kda-hybrid", "per-head-muon-seed2",
                            "kda-hybrid-seed2"};
    for (int k = 0; k < 2; k++) {
        const json_t *a = row_named(opt, shared[2 * k]), *b = row_named(kda, shared[2 * k + 1]);
        ck_assert_str_eq(json_string_value(json_object_get(a, "dir")),
                         json_string_value(json_object_get(b, "dir")));
        ck_assert(json_is_false(json_object_get(a, "reused")));
        ck_assert(json_is_true(json_object_get(b, "reused")));
        ck_assert(num_of(a, "final_val_loss") == num_of(b, "final_val_loss"));
    }
    const json_t *mla = row_named(kda, "all-mla");
    ck_assert(json_is_false(json_object_get(mla, "reused")));
    ck_assert(!json_is_true(json_object_get(mla, "failed")));
    ck_assert(isfinite(num_of(json_object_get(kda, "seed_spread"), "final_val_loss_spread")));
    ck_assert_int_eq((int)json_array_size(json_object_get(opt, "variants")), 4);
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(opt, "variants"), i, v)
        ck_assert_msg(isfinite(num_of(v, "final_val_loss")) && json_is_null(
                          json_object_get(v, "mfu")), "%s", json_string_value(
                          json_object_get(v, "name")));
    json_decref(opt);
    json_decref(kda);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ablate");
    TCase *tc = tcase_create("ablate");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_ci_suite);
    tcase_add_test(tc, test_failing_variant);
    tcase_add_test(tc, test_misspelt_override_fails_first);
    tcase_add_test(tc, test_seed_spread_and_mfu);
    tcase_add_test(tc, test_gpu_suites);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
