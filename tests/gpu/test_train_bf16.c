/* bf16 training on the GPU ends where fp32 training on the CPU ends: `k3rt train
 * tiny_dense.lua` both ways, the same seed, data order and steps; the final validation losses
 * must agree within 0.05 nats, and the GPU run's progress lines must carry an MFU figure.
 * K3RT_GPU_TRAIN_STEPS (default 600) sets the steps.
 *
 * Skips (exit 77) without a CUDA device or when a plugin of the recipe has no CUDA path. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"

static double train(const char *device, const char *dir, long steps, char **log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "'%s' train '%s/scripts/recipes/tiny_dense.lua' --out '%s' --no-sample "
             "--set plan.device='\"%s\"' --set train.steps=%ld --set train.eval_interval=%ld "
             "--set train.checkpoint_interval=0 --set train.log_interval=100 2>&1",
             tu_k3rt_bin(), tu_source_dir(), dir, device, steps, steps);
    int rc = tu_run(cmd, log);
    ck_assert_msg(rc == 0, "%s run failed (exit %d):\n%s", device, rc, *log);
    return tu_metrics_final_val_loss(dir);
}

START_TEST(bf16_gpu_training_matches_cpu)
{
    const char *env = getenv("K3RT_GPU_TRAIN_STEPS");
    long steps = env ? atol(env) : 600;
    char tmp[512], cpu_dir[600], gpu_dir[600];
    tu_tmpdir(tmp, sizeof tmp);
    snprintf(cpu_dir, sizeof cpu_dir, "%s/cpu", tmp);
    snprintf(gpu_dir, sizeof gpu_dir, "%s/gpu", tmp);
    char *cpu_log = NULL, *gpu_log = NULL;
    double cpu = train("cpu", cpu_dir, steps, &cpu_log);
    double gpu = train("cuda", gpu_dir, steps, &gpu_log);
    printf("tiny_dense, %ld steps: validation loss cpu f32 %.4f, gpu bf16 %.4f (diff %.4f)\n",
           steps, cpu, gpu, fabs(cpu - gpu));
    /* The last progress line of the GPU run, for the record. */
    const char *last = NULL;
    for (const char *p = strstr(gpu_log, "| MFU"); p; p = strstr(p + 1, "| MFU"))
        last = p;
    while (last && last > gpu_log && last[-1] != '\n')
        last--;
    printf("gpu progress: %.*s\n", last ? (int)strcspn(last, "\n") : 8,
           last ? last : "(no MFU)");
    ck_assert_msg(strstr(gpu_log, "compute bf16") != NULL, "the GPU run was not bf16:\n%s",
                  gpu_log);
    ck_assert_msg(strstr(gpu_log, "MFU") != NULL, "no MFU in the progress lines:\n%s", gpu_log);
    ck_assert_msg(isfinite(cpu) && isfinite(gpu), "validation losses %g / %g", cpu, gpu);
    ck_assert_msg(cpu < 2.8, "the CPU run did not learn (validation loss %.4f)", cpu);
    ck_assert_msg(fabs(cpu - gpu) <= 0.05, "bf16 on the GPU %.4f vs fp32 on the CPU %.4f", gpu,
                  cpu);
    free(cpu_log);
    free(gpu_log);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("train_bf16");
    TCase *t = tcase_create("tiny_dense");
    tcase_set_timeout(t, 900);
    tcase_add_test(t, bf16_gpu_training_matches_cpu);
    suite_add_tcase(s, t);
    return s;
}

int main(void)
{
    if (k3rt_cuda_device_count() > 0 && !tu_dense_plugins_have_cuda())
        return 77;
    return tu_run_gpu_suite(suite, NULL);
}
