/* A short training run of the main job (scripts/recipes/tiny.lua, micro-batches of 4 x 64)
 * with every fp8-eligible saved tensor stored in fp8 against the same run keeping everything:
 * the losses differ (the rounding is real) but the last ten steps' mean stays within 0.02
 * nats. 150 steps rather than 300, to keep CI's wall time near a minute for both runs. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"

/* The sanitizer build runs several times slower: it trains 30 steps (the bound still holds). */
#if defined(__SANITIZE_ADDRESS__)
enum { STEPS = 30 };
#else
enum { STEPS = 150 };
#endif

static void train(const char *out, const char *activations)
{
    char cmd[4096], *log = NULL;
    snprintf(cmd, sizeof cmd,
             "cd %s && %s train scripts/recipes/tiny.lua --out %s --quiet --no-sample "
             "--set train.steps=%d --set train.warmup=10 --set train.log_interval=1 "
             "--set train.eval_interval=0 --set train.eval_batches=2 "
             "--set train.checkpoint_interval=0 --set plan.micro_batch=4 --set plan.seq_len=64 "
             "--set 'plan.activations=%s'",
             tu_source_dir(), tu_k3rt_bin(), out, STEPS, activations);
    int rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0, "train failed (%d):\n%s", rc, log);
    free(log);
}

START_TEST(fp8_training_tracks_keep)
{
    char keep[512], fp8[512];
    tu_tmpdir(keep, sizeof keep);
    tu_tmpdir(fp8, sizeof fp8);
    train(keep, "{}");
    train(fp8, "{[\"*\"]=\"fp8\"}");
    double lk[STEPS + 8] = {0}, lf[STEPS + 8] = {0};
    ck_assert_int_eq(tu_metrics_losses(keep, lk, STEPS + 8), STEPS);
    ck_assert_int_eq(tu_metrics_losses(fp8, lf, STEPS + 8), STEPS);
    ck_assert(lk[1] == lf[1]);  /* the first forward is the same; only backwards read fp8 */
    double mk = 0, mf = 0;
    int differ = 0;
    for (int s = 1; s <= STEPS; s++)
        differ += lk[s] != lf[s];
    for (int s = STEPS - 9; s <= STEPS; s++) {
        mk += lk[s] / 10;
        mf += lf[s] / 10;
    }
    printf("last 10 steps: keep %.4f, fp8 %.4f nats (%d of %d step losses differ); first %.4f\n",
           mk, mf, differ, STEPS, lk[1]);
    ck_assert_int_gt(differ, STEPS / 2);
    ck_assert_double_lt(mk, lk[1] - 1.0);  /* it trained */
    ck_assert_double_lt(fabs(mf - mk), 0.02);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("actman_train");
    TCase *tc = tcase_create("actman_train");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, fp8_training_tracks_keep);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
