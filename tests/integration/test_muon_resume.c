/* Whole runs of `k3rt train` with per_head_muon on the baseline recipe: the dry run prints the
 * rule of every parameter, the loss falls, and save -> resume is bitwise exact (momentum,
 * AdamW moments and the step counter travel in the checkpoint). */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil/testutil.h"
#include "train/safetensors.h"

#define RECIPE "scripts/recipes/tiny_dense.lua"
#define MUON "--set 'optimizer=k3.per_head_muon{lr=3e-3}' "

static int train(const char *out, const char *extra, char **log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && %s train " RECIPE " --out %s --quiet --set train.log_interval=1 "
             "--set train.eval_interval=0 --set train.eval_batches=4 " MUON "%s",
             tu_source_dir(), tu_k3rt_bin(), out, extra);
    return tu_run(cmd, log);
}


START_TEST(dry_run_prints_the_rules)
{
    char cmd[4096], *log = NULL;
    snprintf(cmd, sizeof cmd, "cd %s && %s train " RECIPE " --dry-run " MUON, tu_source_dir(),
             tu_k3rt_bin());
    int rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0, "dry run failed (%d):\n%s", rc, log);
    const char *want[] = {
        "layers.0.mixer.q_nope_proj.weight            [128, 128]         head_matrix    "
        "muon per-head x4 (axis 0), qk-clip sqrt",
        "layers.0.mixer.q_shared_proj.weight          [64, 128]          head_matrix    "
        "muon per-head x4 (axis 0), qk-clip full",
        "layers.0.mixer.o_proj.weight                 [128, 128]         head_matrix    "
        "muon per-head x4 (axis 1)",
        "layers.3.ffn.down_proj.weight                [128, 384]         matrix         muon",
        "embed.weight                                 [256, 128]         embedding      adamw",
        "norm.weight                                  [128]              norm_gain      "
        "adamw (no decay)",
        "optimizer per_head_muon",
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++)
        ck_assert_msg(strstr(log, want[i]) != NULL, "missing '%s' in:\n%s", want[i], log);
    free(log);
}
END_TEST

START_TEST(loss_falls)
{
    char out[512], *log = NULL;
    tu_tmpdir(out, sizeof out);
    int rc = train(out, "--set train.steps=40 --set train.warmup=5 "
                   "--set train.checkpoint_interval=0 --set plan.micro_batch=8 "
                   "--set plan.seq_len=64 --no-sample", &log);
    ck_assert_msg(rc == 0, "train failed (%d):\n%s", rc, log);
    free(log);
    double loss[64] = {0};
    ck_assert_int_eq(tu_metrics_losses(out, loss, 64), 40);
    double last = (loss[36] + loss[37] + loss[38] + loss[39] + loss[40]) / 5;
    printf("per_head_muon, 40 steps of 8 x 64 tokens: loss %.4f -> %.4f\n", loss[1], last);
    ck_assert_msg(loss[1] > 5.0 && loss[1] < 6.0, "first loss %g is not near ln 256", loss[1]);
    ck_assert_msg(loss[1] - last >= 1.5, "loss fell only from %.4f to %.4f", loss[1], last);
}
END_TEST

START_TEST(resume_is_bitwise_exact)
{
    char a[512], b[512], *log = NULL;
    tu_tmpdir(a, sizeof a);
    tu_tmpdir(b, sizeof b);
    const char *common = "--set train.steps=12 --set train.checkpoint_interval=0 "
                         "--set plan.micro_batch=4 --set plan.seq_len=32 --no-sample";
    ck_assert_msg(train(a, common, &log) == 0, "%s", log);
    free(log);
    char extra[512];
    snprintf(extra, sizeof extra, "%s --stop-after 6", common);
    ck_assert_msg(train(b, extra, &log) == 0, "%s", log);
    free(log);
    /* the checkpoint carries the optimizer's state under "optimizer.<name>" */
    char path[1024];
    snprintf(path, sizeof path, "%s/checkpoints/step_00000006/state.safetensors", b);
    st_file *f;
    k3rt_error err = {0};
    TU_OK(st_open(path, &f, &err), err);
    const char *names[] = {"optimizer.layers.0.mixer.q_nope_proj.weight.momentum",
                           "optimizer.embed.weight.m", "optimizer.norm.weight.v",
                           "optimizer.step"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        ck_assert_msg(st_find(f, names[i]) != NULL, "%s lacks %s", path, names[i]);
    st_close(f);
    snprintf(extra, sizeof extra, "%s --resume", common);
    ck_assert_msg(train(b, extra, &log) == 0, "%s", log);
    free(log);
    double la[16] = {0}, lb[16] = {0};
    ck_assert_int_eq(tu_metrics_losses(a, la, 16), 12);
    ck_assert_int_eq(tu_metrics_losses(b, lb, 16), 12);
    for (int s = 1; s <= 12; s++)
        ck_assert_msg(memcmp(&la[s], &lb[s], sizeof(double)) == 0,
                      "step %d: straight %.17g, resumed %.17g", s, la[s], lb[s]);
    printf("per_head_muon: 12 straight steps and 6 + resume + 6 agree bitwise (last loss "
           "%.6f)\n", la[12]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("muon_resume");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 1200);
    tcase_add_test(tc, dry_run_prints_the_rules);
    tcase_add_test(tc, loss_falls);
    tcase_add_test(tc, resume_is_bitwise_exact);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
