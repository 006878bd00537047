/* `k3rt ablate`: the CI suite runs end to end (table and plots written, every variant's FLOPs
 * equal to the planner's count for its recipe and steps, every final loss below ln 256 - 1),
 * a variant that fails at run time does not take the suite down, and a misspelt override
 * fails before anything trains. */
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

int main(void)
{
    Suite *s = suite_create("ablate");
    TCase *tc = tcase_create("ablate");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, test_ci_suite);
    tcase_add_test(tc, test_failing_variant);
    tcase_add_test(tc, test_misspelt_override_fails_first);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
