/* Non-finite losses: the step is skipped and logged; too many in a row stop the run. */
#include <string.h>
#include <unistd.h>

#include "testutil/testutil.h"

static int run_with_nan_and(int from, int count, const char *extra, char **log, char *out,
                            size_t len)
{
    char dir[512], recipe[1024], cmd[4096];
    tu_tmpdir(dir, sizeof dir);
    snprintf(out, len, "%s/run", dir);
    snprintf(recipe, sizeof recipe, "%s/nan.lua", dir);
    char text[2048];
    snprintf(text, sizeof text,
             "return k3.recipe {\n"
             "  model = { d_model = 16, vocab = 256, layers = 1,\n"
             "            mixers = { N = k3.plugin(\"%s/fixtures/nan_mixer.so\",\n"
             "                                     { nan_from = %d, nan_count = %d }) },\n"
             "            ffn = k3.dense_glu { hidden = 32 } },\n"
             "  optimizer = k3.adamw { lr = 1e-3 },\n"
             "  plan = { micro_batch = 2, seq_len = 8 },\n"
             "  train = { steps = 8, warmup = 0, max_bad_steps = 2, log_interval = 1,\n"
             "            eval_interval = 0, eval_batches = 1, checkpoint_interval = 0 },\n"
             "  data = { path = \"%s/data/tinyshakespeare.txt\" },\n"
             "}\n", K3RT_BINARY_DIR, from, count, tu_source_dir());
    tu_write_file(recipe, text);
    snprintf(cmd, sizeof cmd, "%s train %s --out %s --no-sample %s", tu_k3rt_bin(), recipe, out,
             extra);
    return tu_run(cmd, log);
}

static int run_with_nan(int from, int count, char **log, char *out, size_t len)
{
    return run_with_nan_and(from, count, "", log, out, len);
}

START_TEST(one_bad_step_is_skipped)
{
    char *log = NULL, out[1024];
    int rc = run_with_nan(3, 1, &log, out, sizeof out);
    ck_assert_msg(rc == 0, "run failed (%d):\n%s", rc, log);
    ck_assert_msg(strstr(log, "step 3: non-finite loss") && strstr(log, "step skipped"),
                  "no skip message:\n%s", log);
    free(log);
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "grep -c '\"skipped\":true' %s/metrics.jsonl", out);
    ck_assert_int_eq(tu_run(cmd, &log), 0);
    ck_assert_msg(strncmp(log, "1", 1) == 0, "expected one skipped step: %s", log);
    free(log);
}
END_TEST

START_TEST(too_many_in_a_row_stop_the_run)
{
    char *log = NULL, out[1024];
    int rc = run_with_nan(2, 5, &log, out, sizeof out);
    ck_assert_msg(rc == 1, "expected failure, got %d:\n%s", rc, log);
    ck_assert_msg(strstr(log, "3 non-finite steps in a row"), "%s", log);
    free(log);
}
END_TEST

/* Steps 4 and 5 non-finite, then step 6 too: the run stops. Checkpoints every step, one kept:
 * the one left is step 3's, the last before the streak, not one saved during it. */
START_TEST(no_checkpoint_during_a_streak)
{
    char *log = NULL, out[1024], path[1200];
    int rc = run_with_nan_and(4, 5, "--set train.checkpoint_interval=1 "
                              "--set train.keep_checkpoints=1", &log, out, sizeof out);
    ck_assert_msg(rc == 1, "expected failure, got %d:\n%s", rc, log);
    ck_assert_msg(strstr(log, "step 4: checkpoint skipped: the run is in a streak of 1 "
                              "non-finite step;") &&
                  strstr(log, "step 5: checkpoint skipped"), "%s", log);
    free(log);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000003/DONE", out);
    ck_assert_msg(access(path, F_OK) == 0, "the last good checkpoint is gone");
    snprintf(path, sizeof path, "%s/checkpoints/step_00000005", out);
    ck_assert_msg(access(path, F_OK) != 0, "a checkpoint was saved during the streak");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("nan");
    TCase *tc = tcase_create("nan");
    tcase_add_test(tc, one_bad_step_is_skipped);
    tcase_add_test(tc, too_many_in_a_row_stop_the_run);
    tcase_add_test(tc, no_checkpoint_during_a_streak);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
