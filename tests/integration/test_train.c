/* Whole runs of `k3rt train` on the bundled corpus: the loss falls, resume is bitwise exact,
 * data parallelism on the local backend equals one rank with the whole batch, and the main
 * job's outputs (checkpoint, metrics, plot, sample) appear. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil/testutil.h"
#include "train/safetensors.h"

/* Runs k3rt train from the source tree (the recipes' data path is relative to it). */
static int train(const char *recipe, const char *out, const char *extra, char **log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && %s train %s --out %s --quiet --set train.log_interval=1 "
             "--set train.eval_interval=0 --set train.eval_batches=4 %s",
             tu_source_dir(), tu_k3rt_bin(), recipe, out, extra);
    return tu_run(cmd, log);
}


START_TEST(dense_loss_falls_within_100_steps)
{
    char out[512], *log = NULL;
    tu_tmpdir(out, sizeof out);
    int rc = train("scripts/recipes/tiny_dense.lua", out,
                   "--set train.steps=100 --set train.checkpoint_interval=0 --no-sample", &log);
    ck_assert_msg(rc == 0, "train failed (%d):\n%s", rc, log);
    double loss[128] = {0};
    ck_assert_int_eq(tu_metrics_losses(out, loss, 128), 100);
    double last = (loss[96] + loss[97] + loss[98] + loss[99] + loss[100]) / 5;
    ck_assert_msg(loss[1] > 5.0 && loss[1] < 6.0, "first loss %g is not near ln 256", loss[1]);
    ck_assert_msg(loss[1] - last >= 1.5, "loss fell only from %.4f to %.4f", loss[1], last);
    free(log);
}
END_TEST

START_TEST(resume_is_bitwise_exact)
{
    char a[512], b[512], *log = NULL;
    tu_tmpdir(a, sizeof a);
    tu_tmpdir(b, sizeof b);
    const char *common = "--set train.steps=12 --set train.checkpoint_interval=0 "
                         "--set plan.micro_batch=4 --set plan.seq_len=32 --no-sample";
    ck_assert_msg(train("scripts/recipes/tiny_dense.lua", a, common, &log) == 0, "%s", log);
    free(log);
    char extra[512];
    snprintf(extra, sizeof extra, "%s --stop-after 6", common);
    ck_assert_msg(train("scripts/recipes/tiny_dense.lua", b, extra, &log) == 0, "%s", log);
    free(log);
    snprintf(extra, sizeof extra, "%s --resume", common);
    ck_assert_msg(train("scripts/recipes/tiny_dense.lua", b, extra, &log) == 0, "%s", log);
    free(log);
    double la[16] = {0}, lb[16] = {0};
    ck_assert_int_eq(tu_metrics_losses(a, la, 16), 12);
    ck_assert_int_eq(tu_metrics_losses(b, lb, 16), 12);
    for (int s = 1; s <= 12; s++)
        ck_assert_msg(memcmp(&la[s], &lb[s], sizeof(double)) == 0,
                      "step %d: straight %.17g, resumed %.17g", s, la[s], lb[s]);
}
END_TEST


START_TEST(data_parallel_equals_one_rank_with_the_whole_batch)
{
    char one[512], two[512], acc[512], *log = NULL;
    tu_tmpdir(one, sizeof one);
    tu_tmpdir(two, sizeof two);
    tu_tmpdir(acc, sizeof acc);
    const char *common = "--set train.steps=3 --set train.checkpoint_interval=0 "
                         "--set plan.seq_len=32 --no-sample";
    char extra[512];
    snprintf(extra, sizeof extra, "%s --set plan.micro_batch=8", common);
    ck_assert_msg(train("scripts/recipes/tiny_dense.lua", one, extra, &log) == 0, "%s", log);
    free(log);
    snprintf(extra, sizeof extra, "%s --set plan.micro_batch=4 --set plan.dp=2", common);
    ck_assert_msg(train("scripts/recipes/tiny_dense.lua", two, extra, &log) == 0, "%s", log);
    free(log);
    snprintf(extra, sizeof extra, "%s --set plan.micro_batch=4 --set plan.grad_accum=2", common);
    ck_assert_msg(train("scripts/recipes/tiny_dense.lua", acc, extra, &log) == 0, "%s", log);
    free(log);
    char fa[1024], fb[1024], fc[1024];
    snprintf(fa, sizeof fa, "%s/checkpoints/step_00000003/model.safetensors", one);
    snprintf(fb, sizeof fb, "%s/checkpoints/step_00000003/model.safetensors", two);
    snprintf(fc, sizeof fc, "%s/checkpoints/step_00000003/model.safetensors", acc);
    double d2 = tu_safetensors_max_rel_diff(fa, fb), d3 = tu_safetensors_max_rel_diff(fa, fc);
    ck_assert_msg(d2 < 1e-5, "dp=2 x 4 differs from dp=1 x 8 by %g (relative rms)", d2);
    ck_assert_msg(d3 < 1e-5, "accum 2 x 4 differs from 1 x 8 by %g (relative rms)", d3);
}
END_TEST

/* train.eval_at_start: the initial weights' validation loss is the first record (step 0,
 * no training loss), near ln 256 for a fresh byte model. */
START_TEST(eval_at_start_records_step_zero)
{
    char out[512], path[1024], *log = NULL;
    tu_tmpdir(out, sizeof out);
    int rc = train("scripts/recipes/tiny_dense.lua", out,
                   "--set train.steps=2 --set train.checkpoint_interval=0 --no-sample "
                   "--set train.eval_at_start=true", &log);
    ck_assert_msg(rc == 0, "train failed (%d):\n%s", rc, log);
    free(log);
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    ck_assert_ptr_nonnull(f);
    json_error_t je;
    json_t *first = json_loadf(f, JSON_DISABLE_EOF_CHECK, &je);
    fclose(f);
    ck_assert_msg(first != NULL, "metrics.jsonl: %s", je.text);
    ck_assert_int_eq(json_integer_value(json_object_get(first, "step")), 0);
    ck_assert_msg(!json_object_get(first, "loss"), "step 0 has a training loss");
    double v0 = json_number_value(json_object_get(first, "val_loss"));
    ck_assert_msg(v0 > 5.0 && v0 < 6.0, "step-0 validation loss %g is not near ln 256", v0);
    json_decref(first);
}
END_TEST

START_TEST(main_job_outputs)
{
    char out[512], *log = NULL, path[1024];
    tu_tmpdir(out, sizeof out);
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && %s train scripts/recipes/tiny.lua --out %s --set train.steps=20 "
             "--set train.eval_batches=2 --set sample.bytes=60",
             tu_source_dir(), tu_k3rt_bin(), out);
    int rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0, "main job failed (%d):\n%s", rc, log);
    ck_assert_msg(strstr(log, "step     20/20") != NULL, "no progress line:\n%s", log);
    ck_assert_msg(strstr(log, "--- sample") != NULL, "no sample printed:\n%s", log);
    const char *files[] = {"metrics.jsonl", "loss.svg", "sample.txt",
                           "checkpoints/step_00000020/DONE",
                           "checkpoints/step_00000020/model.safetensors",
                           "checkpoints/step_00000020/manifest.json"};
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++) {
        snprintf(path, sizeof path, "%s/%s", out, files[i]);
        FILE *f = fopen(path, "r");
        ck_assert_msg(f != NULL, "missing %s", path);
        fclose(f);
    }
    free(log);
    /* k3rt sample on the final checkpoint reproduces the run's own sample (weights and the
     * balancers' state are restored), and k3rt eval works on it. */
    snprintf(cmd, sizeof cmd, "cd %s && %s sample %s/checkpoints", tu_source_dir(),
             tu_k3rt_bin(), out);
    rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0, "sample failed:\n%s", log);
    char sample[256] = "";
    snprintf(path, sizeof path, "%s/sample.txt", out);
    FILE *sf = fopen(path, "r");
    ck_assert_ptr_nonnull(sf);
    size_t got = fread(sample, 1, sizeof sample - 1, sf);
    fclose(sf);
    sample[got] = '\0';
    ck_assert_msg(got > 0 && !strncmp(log, sample, got), "k3rt sample gave\n%s\nthe run wrote\n%s",
                  log, sample);
    ck_assert_msg(strstr(log, "60 bytes in") && strstr(log, "tokens/s on cpu") &&
                  strstr(log, "cached decode"), "no decoding report:\n%s", log);
    free(log);
    /* greedy text along the cache and along the sliding context (within seq_len: the same
     * context) agree; a GPU asked for where there is none is refused plainly */
    char *greedy[2];
    for (int i = 0; i < 2; i++) {
        snprintf(cmd, sizeof cmd, "cd %s && %s sample %s/checkpoints --temperature 0 "
                 "--bytes 40 %s", tu_source_dir(), tu_k3rt_bin(), out,
                 i ? "--recompute" : "");
        rc = tu_run(cmd, &greedy[i]);
        ck_assert_msg(rc == 0, "greedy sample failed:\n%s", greedy[i]);
    }
    ck_assert_msg(strlen(greedy[0]) > 41 && !strncmp(greedy[0], greedy[1], 41),
                  "cached:\n%s\nsliding:\n%s", greedy[0], greedy[1]); /* 40 bytes, newline */
    free(greedy[0]), free(greedy[1]);
    /* past seq_len (128) the caches keep the whole text, and say so */
    snprintf(cmd, sizeof cmd, "cd %s && %s sample %s/checkpoints --bytes 150", tu_source_dir(),
             tu_k3rt_bin(), out);
    rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0 && strstr(log, "context grew to 151 bytes, past plan.seq_len = 128"),
                  "%s", log);
    free(log);
    if (!tu_has_cuda_device()) {
        snprintf(cmd, sizeof cmd, "cd %s && %s sample %s/checkpoints --device cuda",
                 tu_source_dir(), tu_k3rt_bin(), out);
        rc = tu_run(cmd, &log);
        ck_assert_msg(rc == 1 && strstr(log, "no CUDA device"), "%s", log);
        free(log);
    }
    snprintf(cmd, sizeof cmd, "cd %s && %s eval %s/checkpoints --windows 8", tu_source_dir(),
             tu_k3rt_bin(), out);
    rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0 && strstr(log, "validation loss"), "eval failed:\n%s", log);
    free(log);
    /* an independent reader accepts the weights */
    const char *python = tu_python_with_numpy();
    snprintf(cmd, sizeof cmd, "'%s' %s/tests/integration/check_safetensors.py "
             "%s/checkpoints/step_00000020/model.safetensors --expect embed.weight:F32:256,128",
             python ? python : "python3", tu_source_dir(), out);
    if (python) {
        rc = tu_run(cmd, &log);
        ck_assert_msg(rc == 0, "python reader rejected the checkpoint:\n%s", log);
        free(log);
    }
}
END_TEST

int main(void)
{
    Suite *s = suite_create("train");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, dense_loss_falls_within_100_steps);
    tcase_add_test(tc, resume_is_bitwise_exact);
    tcase_add_test(tc, data_parallel_equals_one_rank_with_the_whole_batch);
    tcase_add_test(tc, main_job_outputs);
    tcase_add_test(tc, eval_at_start_records_step_zero);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
