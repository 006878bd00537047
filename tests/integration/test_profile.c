/* `k3rt train --profile N` on the main job's model (scripts/recipes/tiny.lua, 4 steps): the
 * table names every module instance, metrics.jsonl holds one profile record whose parts are
 * non-negative and sum to at most the step's wall time, and the losses are bitwise those of
 * the same run without --profile. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil/testutil.h"

#define STEPS 4

static int train(const char *out, const char *extra, char **log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && %s train scripts/recipes/tiny.lua --out %s --set train.steps=%d "
             "--set train.log_interval=1 --set train.eval_interval=0 --set train.eval_batches=1 "
             "--set train.checkpoint_interval=0 --set plan.micro_batch=4 --set plan.seq_len=64 "
             "--no-sample --quiet %s",
             tu_source_dir(), tu_k3rt_bin(), out, STEPS, extra);
    return tu_run(cmd, log);
}

START_TEST(profile_names_every_module_sums_within_the_step_and_changes_no_number)
{
    char plain[512], prof[512], *log = NULL;
    tu_tmpdir(plain, sizeof plain);
    tu_tmpdir(prof, sizeof prof);
    ck_assert_msg(train(plain, "", &log) == 0, "train failed:\n%s", log);
    free(log);
    ck_assert_msg(train(prof, "--profile 2", &log) == 0, "train --profile failed:\n%s", log);

    /* the table: steps 3-4 after two warm-up steps, every module instance named */
    ck_assert_msg(strstr(log, "profile of steps 3-4 (2 warm-up steps before)"), "%s", log);
    const char *names[] = {"layers.0.mixer (kda)", "layers.1.mixer (kda)", "layers.2.mixer (kda)",
                           "layers.3.mixer (mla)", "layers.0.ffn (dense_glu)",
                           "layers.1.ffn (latent_moe)", "layers.2.ffn (latent_moe)",
                           "layers.3.ffn (latent_moe)", "layers.1.balancer (quantile)",
                           "layers.2.balancer (quantile)", "layers.3.balancer (quantile)",
                           "residual (block_attnres)", "optimizer (per_head_muon)", "data",
                           "head+loss", "communication", "gap (launches"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++)
        ck_assert_msg(strstr(log, names[i]), "the table lacks %s:\n%s", names[i], log);

    /* the record: one, non-negative parts, their sum within the step */
    json_t *p = tu_metrics_profile(prof, 3, STEPS, 2);
    /* each mixer and FFN runs once per direction and step; the balancers and the work the
     * model's modules do are timed, communication exists with one rank and no call */
    tu_profile_check_modules(p, 4);
    const json_t *bal = tu_profile_part(p, "layers.1.balancer (", "step");
    ck_assert_ptr_nonnull(bal);
    ck_assert(json_real_value(json_object_get(bal, "calls")) >= 3);  /* bias, observe, update */
    const json_t *comm = tu_profile_part(p, "communication", "step");
    ck_assert_ptr_nonnull(comm);
    ck_assert_double_eq(json_real_value(json_object_get(comm, "calls")), 0);
    /* one host wait a step: the gradient norm's read (the loss and statistics come back with
     * it); on the CPU the calls are counted where a GPU waits, less its copies to the host */
    ck_assert_double_eq(json_real_value(json_object_get(p, "host_waits_per_step")), 1.0);
    ck_assert_msg(strstr(log, "host waits per step: 1.0"), "%s", log);
    json_decref(p);
    free(log);

    tu_assert_same_losses(plain, prof, STEPS);
}
END_TEST

START_TEST(profile_refuses_a_step_count_below_one)
{
    char out[512], *log = NULL;
    tu_tmpdir(out, sizeof out);
    ck_assert_int_ne(train(out, "--profile 0", &log), 0);
    ck_assert_msg(strstr(log, "--profile takes a number of steps >= 1"), "%s", log);
    free(log);
}
END_TEST

static Suite *suite(void)
{
    Suite *s = suite_create("profile");
    TCase *tc = tcase_create("train");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, profile_names_every_module_sums_within_the_step_and_changes_no_number);
    tcase_add_test(tc, profile_refuses_a_step_count_below_one);
    suite_add_tcase(s, tc);
    return s;
}

int main(void) { return tu_run_suite(suite()); }
