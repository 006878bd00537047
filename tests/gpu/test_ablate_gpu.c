/* `k3rt ablate` on the GPU: the CI suite (ci.lua cut to 40 steps, three runs) with --jobs 2
 * and plan.device "cuda" trains its runs one at a time (two on one GPU would each measure a
 * share of it), and every row of the table carries an MFU between 0 and 1 that is its
 * tokens/s x FLOPs per token over the device's peak: k3rt's measured 725 TFLOP/s on an H200
 * (core/train/peak.c), plan.peak_tflops = 100 on another GPU.
 *
 * Skips (exit 77) without a CUDA device. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil/testutil.h"

START_TEST(gpu_runs_one_at_a_time_with_mfu)
{
    char tmp[512], cmd[4096], path[700], name[256];
    tu_tmpdir(tmp, sizeof tmp);
    k3rt_error err = {0};
    TU_OK(k3rt_device_name(0, name, sizeof name, &err), err);
    int h200 = strstr(name, "H200") != NULL;
    double peak_expected = h200 ? 725e12 : 100e12;
    snprintf(cmd, sizeof cmd,
             "cd '%s' && '%s' ablate scripts/recipes/ablations/ci.lua --jobs 2 --out '%s/ci' "
             "--set plan.device='\"cuda\"' --set train.steps=40 --set train.eval_interval=10 "
             "%s 2>&1", tu_source_dir(), tu_k3rt_bin(), tmp,
             h200 ? "" : "--set plan.peak_tflops=100");
    char *log = NULL;
    int rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0, "exit %d:\n%s", rc, log);
    ck_assert_msg(strstr(log, "--jobs 2: the runs train on the GPU, so one at a time"), "%s",
                  log);
    /* Sequential: each run starts after the one before it has finished. */
    const char *at = log;
    for (int i = 1; i <= 3; i++) {
        char start[32];
        snprintf(start, sizeof start, "[%d/3] ", i);
        const char *s = strstr(at, start), *done = s ? strstr(s, ": finished after") : NULL;
        ck_assert_msg(s && done, "run %d did not start after the previous one ended:\n%s", i,
                      log);
        const char *next = strstr(s + strlen(start), "/3] ");
        ck_assert_msg(!next || next > done, "run %d overlapped the next:\n%s", i, log);
        at = done;
    }
    snprintf(path, sizeof path, "%s/ci/table.json", tmp);
    json_t *t = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(t);
    size_t i;
    json_t *v;
    json_array_foreach(json_object_get(t, "variants"), i, v) {
        const char *run = json_string_value(json_object_get(v, "name"));
        double mfu = json_number_value(json_object_get(v, "mfu"));
        double tps = json_number_value(json_object_get(v, "tokens_per_s"));
        double per_token = json_number_value(json_object_get(v, "flops")) /
                           json_number_value(json_object_get(v, "tokens"));
        printf("%s (%s): %.0f tokens/s, MFU %.2f%%\n", run, name, tps, 100 * mfu);
        ck_assert_msg(json_is_number(json_object_get(v, "mfu")) && mfu > 0 && mfu < 1,
                      "%s: mfu %g", run, mfu);
        double peak = tps * per_token / mfu;
        ck_assert_msg(fabs(peak / peak_expected - 1) < 1e-6, "%s: implied peak %.6g", run,
                      peak);
    }
    json_decref(t);
    free(log);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("ablate_gpu");
    TCase *t = tcase_create("ci");
    tcase_set_timeout(t, 600);
    tcase_add_test(t, gpu_runs_one_at_a_time_with_mfu);
    suite_add_tcase(s, t);
    return s;
}

int main(void) { return tu_run_gpu_suite(suite, NULL); }
