/* `k3rt train --profile` on the GPU (CUDA events): tiny_dense.lua, 6 deterministic steps with
 * --profile 3, against the same run without it: the record's parts non-negative and within the
 * step, every module instance named, and the losses bitwise the same.
 *
 * Skips (exit 77) without a CUDA device or when a plugin of the recipe has no CUDA path. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil/testutil.h"

#define STEPS 6

static void train(const char *dir, const char *extra, char **log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "'%s' train '%s/scripts/recipes/tiny_dense.lua' --out '%s' --no-sample "
             "--set plan.device='\"cuda\"' --set plan.deterministic=true --set train.steps=%d "
             "--set train.eval_interval=0 --set train.eval_batches=1 "
             "--set train.checkpoint_interval=0 --set train.log_interval=1 %s 2>&1",
             tu_k3rt_bin(), tu_source_dir(), dir, STEPS, extra);
    int rc = tu_run(cmd, log);
    ck_assert_msg(rc == 0, "run failed (exit %d):\n%s", rc, *log);
}

START_TEST(gpu_profile_sums_within_the_step_and_changes_no_number)
{
    char tmp[512], plain[600], prof[600], *log = NULL;
    tu_tmpdir(tmp, sizeof tmp);
    snprintf(plain, sizeof plain, "%s/plain", tmp);
    snprintf(prof, sizeof prof, "%s/prof", tmp);
    train(plain, "", &log);
    free(log);
    train(prof, "--profile 3", &log);
    const char *table = strstr(log, "profile of steps 3-5");
    ck_assert_msg(table && strstr(table, "CUDA events"), "%s", log);
    const char *end = strstr(table, "step (wall)");
    ck_assert_ptr_nonnull(end);
    printf("%.*s\n", (int)(strchr(end, '\n') ? strchr(end, '\n') - table : (long)strlen(table)),
           table);
    json_t *p = tu_metrics_profile(prof, 3, 5, 3);
    ck_assert_str_eq(json_string_value(json_object_get(p, "timer")), "cuda_events");
    tu_profile_check_modules(p, 4);
    json_decref(p);
    free(log);

    tu_assert_same_losses(plain, prof, STEPS);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("gpu_profile");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, gpu_profile_sums_within_the_step_and_changes_no_number);
    suite_add_tcase(s, tc);
    return s;
}

int main(void)
{
    if (k3rt_cuda_device_count() > 0 && !tu_dense_plugins_have_cuda())
        return 77;
    return tu_run_gpu_suite(suite, NULL);
}
