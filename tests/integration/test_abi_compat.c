/* ABI compatibility end to end: a plugin built against an older ABI minor (smaller vtable and
 * option struct sizes, poison past them) passes `k3rt check-plugin`, trains, checkpoint
 * included, and samples (without the ABI 2.2 decode_step: along the sliding context); a newer minor and another major are refused by `k3rt train` naming both versions.
 * (The loader-level assertions are in unit/test_loader.c.) */
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"

#define FIXTURES K3RT_BINARY_DIR "/fixtures/"

/* A tiny dense model whose mixer is the fixture `file`, trained from the source tree. */
static int train_with(const char *file, int steps, const char *out, char **log)
{
    char dir[512], recipe[1024], text[2048], cmd[4096];
    tu_tmpdir(dir, sizeof dir);
    snprintf(recipe, sizeof recipe, "%s/abi.lua", dir);
    snprintf(text, sizeof text,
             "return k3.recipe {\n"
             "  model = { d_model = 32, vocab = 256, layers = 2,\n"
             "            mixers = { S = k3.plugin('%s%s', { init_std = 0.05 }) },\n"
             "            ffn = k3.dense_glu { hidden = 64 } },\n"
             "  optimizer = k3.adamw { lr = 3e-3 },\n"
             "  plan = { micro_batch = 8, seq_len = 32, threads = 1 },\n"
             "  train = { steps = %d, warmup = 2, seed = 1, eval_interval = 0,\n"
             "            checkpoint_interval = %d, log_interval = 1 },\n"
             "  data = { path = 'data/tinyshakespeare.txt', tokenizer = 'bytes' },\n"
             "}\n", FIXTURES, file, steps, steps);
    tu_write_file(recipe, text);
    snprintf(cmd, sizeof cmd, "cd %s && %s train %s --out %s --quiet --no-sample",
             tu_source_dir(), tu_k3rt_bin(), recipe, out);
    return tu_run(cmd, log);
}

START_TEST(older_minor_passes_the_harness_and_trains)
{
    char cmd[2048], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s check-plugin %sshift_old_minor.so --config "
             "'{\"init_std\": 0.3}'", tu_k3rt_bin(), FIXTURES);
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "an older minor, missing fields read as NULL"), "%s",
                  out);
    free(out);
    char run[512];
    tu_tmpdir(run, sizeof run);
    rc = train_with("shift_old_minor.so", 12, run, &out);
    /* The checkpoint asks every module for state(); the fixture's poison there would fail it. */
    ck_assert_msg(rc == 0, "training with the older-minor plugin failed (%d):\n%s", rc, out);
    free(out);
    double loss[16] = {0};
    ck_assert_int_eq(tu_metrics_losses(run, loss, 16), 12);
    ck_assert_msg(loss[12] < loss[1] - 0.5, "loss fell only from %.4f to %.4f", loss[1],
                  loss[12]);
    char done[1024];
    snprintf(done, sizeof done, "%s/checkpoints/step_00000012/DONE", run);
    FILE *f = fopen(done, "r");
    ck_assert_msg(f != NULL, "no checkpoint at step 12");
    fclose(f);
    /* An ABI 2.0 mixer has no decode_step: sampling falls back to the sliding context. */
    snprintf(cmd, sizeof cmd, "%s sample %s/checkpoints --bytes 12 --plugin "
             "%sshift_old_minor.so", tu_k3rt_bin(), run, FIXTURES);
    rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "12 bytes in") &&
                  strstr(out, "sliding context recomputed per byte") &&
                  strstr(out, "no incremental decoding"), "%s", out);
    free(out);
}
END_TEST

START_TEST(newer_minor_and_other_major_are_refused_naming_both_versions)
{
    const struct {
        const char *file;
        int major, minor;
    } bad[] = {{"newer_minor.so", K3RT_ABI_MAJOR, K3RT_ABI_MINOR + 1},
               {"wrong_major.so", K3RT_ABI_MAJOR + 1, K3RT_ABI_MINOR}};
    for (int i = 0; i < 2; i++) {
        char run[512], *out = NULL, plugin[32], host[32];
        tu_tmpdir(run, sizeof run);
        int rc = train_with(bad[i].file, 2, run, &out);
        snprintf(plugin, sizeof plugin, "ABI %d.%d", bad[i].major, bad[i].minor);
        snprintf(host, sizeof host, "ABI %d.%d", K3RT_ABI_MAJOR, K3RT_ABI_MINOR);
        ck_assert_msg(rc == 1 && strstr(out, bad[i].file) && strstr(out, plugin) &&
                      strstr(out, host), "%s: expected a refusal naming %s and %s (%d):\n%s",
                      bad[i].file, plugin, host, rc, out);
        free(out);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("abi_compat");
    TCase *tc = tcase_create("abi_compat");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, older_minor_passes_the_harness_and_trains);
    tcase_add_test(tc, newer_minor_and_other_major_are_refused_naming_both_versions);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
