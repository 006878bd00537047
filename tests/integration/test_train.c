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

/* Losses by step from metrics.jsonl (index = step). Returns the number of steps read. */
static int read_losses(const char *out, double *loss, int max)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    char line[65536];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        ck_assert_msg(j != NULL, "bad metrics line: %s", line);
        int64_t step = json_integer_value(json_object_get(j, "step"));
        if (step > 0 && step < max) {
            loss[step] = json_real_value(json_object_get(j, "loss"));
            n = step > n ? (int)step : n;
        }
        json_decref(j);
    }
    fclose(f);
    return n;
}

START_TEST(dense_loss_falls_within_100_steps)
{
    char out[512], *log = NULL;
    tu_tmpdir(out, sizeof out);
    int rc = train("scripts/recipes/tiny_dense.lua", out,
                   "--set train.steps=100 --set train.checkpoint_interval=0 --no-sample", &log);
    ck_assert_msg(rc == 0, "train failed (%d):\n%s", rc, log);
    double loss[128] = {0};
    ck_assert_int_eq(read_losses(out, loss, 128), 100);
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
    ck_assert_int_eq(read_losses(a, la, 16), 12);
    ck_assert_int_eq(read_losses(b, lb, 16), 12);
    for (int s = 1; s <= 12; s++)
        ck_assert_msg(memcmp(&la[s], &lb[s], sizeof(double)) == 0,
                      "step %d: straight %.17g, resumed %.17g", s, la[s], lb[s]);
}
END_TEST

static double max_rel_diff(const char *file_a, const char *file_b)
{
    st_file *fa, *fb;
    k3rt_error err = {0};
    TU_OK(st_open(file_a, &fa, &err), err);
    TU_OK(st_open(file_b, &fb, &err), err);
    double worst = 0;
    for (int i = 0; i < st_count(fa); i++) {
        const st_entry *ea = st_at(fa, i), *eb = st_find(fb, ea->name);
        ck_assert_ptr_nonnull(eb);
        int64_t n = 1;
        for (int k = 0; k < ea->ndim; k++)
            n *= ea->shape[k];
        const float *x = ea->data, *y = eb->data;
        double num = 0, den = 0;
        for (int64_t k = 0; k < n; k++) {
            num += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
            den += (double)x[k] * x[k];
        }
        worst = fmax(worst, sqrt(num / fmax(den, 1e-30)));
    }
    st_close(fa);
    st_close(fb);
    return worst;
}

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
    double d2 = max_rel_diff(fa, fb), d3 = max_rel_diff(fa, fc);
    ck_assert_msg(d2 < 1e-5, "dp=2 x 4 differs from dp=1 x 8 by %g (relative rms)", d2);
    ck_assert_msg(d3 < 1e-5, "accum 2 x 4 differs from 1 x 8 by %g (relative rms)", d3);
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
    /* k3rt sample and k3rt eval work on the checkpoint */
    snprintf(cmd, sizeof cmd, "cd %s && %s sample %s/checkpoints --bytes 40 && %s eval "
             "%s/checkpoints --windows 8", tu_source_dir(), tu_k3rt_bin(), out, tu_k3rt_bin(),
             out);
    rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0 && strstr(log, "validation loss"), "sample/eval failed:\n%s", log);
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
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
