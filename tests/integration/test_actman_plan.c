/* `k3rt train` under plan.memory_budget (scripts/recipes/tiny.lua, micro-batches of 4 x 64,
 * 3 steps): a budget between keep-all (36.1 MB as the planner prices it) and the least that
 * works (29.7 MB) gives a plan mixing keep with recompute or offload, predicted within the
 * budget, whose losses equal keep-all bit for bit (plan.deterministic); the run records what
 * the activation manager measured; a budget below the least fails before training, naming
 * the least, which then works; the dry run lists the chosen policies. */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil/testutil.h"

enum { STEPS = 3 };
#define BUDGET 34000000.0

static int train(const char *out, const char *extra, char **log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd,
             "cd %s && %s train scripts/recipes/tiny.lua --out %s --no-sample "
             "--set train.steps=%d --set train.log_interval=1 --set train.eval_interval=0 "
             "--set train.eval_batches=1 --set train.checkpoint_interval=0 "
             "--set plan.micro_batch=4 --set plan.seq_len=64 --set plan.deterministic=true %s",
             tu_source_dir(), tu_k3rt_bin(), out, STEPS, extra);
    return tu_run(cmd, log);
}

/* The {"step", "activations"} record: exactly one, at the first step. */
static json_t *act_record(const char *out)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    json_error_t je;
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    json_t *found = NULL;
    int n = 0;
    for (json_t *j; (j = json_loadf(f, JSON_DISABLE_EOF_CHECK, &je)) != NULL; json_decref(j))
        if (json_object_get(j, "activations")) {
            n++;
            ck_assert_int_eq(json_integer_value(json_object_get(j, "step")), 1);
            ck_assert_ptr_null(json_object_get(j, "tokens"));  /* not a step record */
            found = json_incref(json_object_get(j, "activations"));
        }
    fclose(f);
    ck_assert_int_eq(n, 1);
    return found;
}

static double num(const json_t *o, const char *k)
{
    const json_t *v = json_object_get(o, k);
    ck_assert_msg(json_is_number(v), "no number %s", k);
    return json_number_value(v);
}

START_TEST(budget_mixes_policies_and_keeps_losses)
{
    char keep[512], planned[512], extra[128];
    tu_tmpdir(keep, sizeof keep);
    tu_tmpdir(planned, sizeof planned);
    char *log = NULL;
    int rc = train(keep, "--set 'plan.activations={[\"*\"]=\"keep\"}'", &log);
    ck_assert_msg(rc == 0, "keep run failed:\n%s", log);
    free(log);
    snprintf(extra, sizeof extra, "--set plan.memory_budget=%.0f", BUDGET);
    rc = train(planned, extra, &log);
    ck_assert_msg(rc == 0, "planned run failed:\n%s", log);
    ck_assert_ptr_nonnull(strstr(log, "activation plan: predicted"));
    free(log);
    tu_assert_same_losses(keep, planned, STEPS);

    json_t *a = act_record(planned), *kept = act_record(keep);
    const json_t *plan = json_object_get(a, "activation_plan"), *pol;
    ck_assert(json_is_true(json_object_get(plan, "solved")));
    double total = num(plan, "total"), peak = num(plan, "peak"), all_kept = 0;
    int n[4] = {0};
    size_t i;
    json_array_foreach(json_object_get(a, "activation_policies"), i, pol) {
        const char *p = json_string_value(json_object_get(pol, "policy"));
        n[!strcmp(p, "keep") ? 0 : !strcmp(p, "recompute") ? 1 : !strcmp(p, "offload") ? 2 : 3]++;
        all_kept += num(pol, "kept_bytes");
    }
    printf("plan: %d keep, %d recompute, %d offload, %d fp8; predicted %.0f of %.0f bytes "
           "(keep-all %.0f); measured peak %.0f bytes (keep-all %.0f), %.0f late prefetches\n",
           n[0], n[1], n[2], n[3], total, BUDGET, total - peak + all_kept,
           num(a, "peak_bytes"), num(kept, "peak_bytes"), num(a, "late_prefetches"));
    ck_assert_int_gt(n[0], 0);
    ck_assert_int_gt(n[1] + n[2] + n[3], 0);
    ck_assert_double_le(total, BUDGET);
    ck_assert_double_gt(total - peak + all_kept, BUDGET);  /* keep-all would not fit */
    /* measured: the manager moved or recomputed, and its peak fell below keep-all's */
    ck_assert_double_gt(num(a, "recomputes") + num(a, "loads"), 0);
    ck_assert_double_eq(num(a, "loads"), num(a, "stores"));
    ck_assert_double_lt(num(a, "peak_bytes"), num(kept, "peak_bytes"));
    ck_assert_double_eq(num(kept, "late_prefetches"), 0);
    /* the first reload of each backward cannot have been prefetched ahead */
    ck_assert_double_ge(num(a, "late_prefetches"), n[2] ? 1 : 0);
    ck_assert_ptr_null(json_object_get(kept, "activation_plan"));
    json_decref(a);
    json_decref(kept);
}
END_TEST

START_TEST(too_small_budget_names_the_least)
{
    char out[512], extra[256];
    tu_tmpdir(out, sizeof out);
    char *log = NULL;
    int rc = train(out, "--dry-run --set plan.memory_budget=20000000", &log);
    ck_assert_int_ne(rc, 0);
    const char *at = strstr(log, "the smallest budget that works is ");
    ck_assert_msg(at != NULL, "%s", log);
    at = strchr(at, '(');
    ck_assert_ptr_nonnull(at);
    double least = strtod(at + 1, NULL);
    ck_assert_msg(least > 20e6 && least < BUDGET, "least %.0f\n%s", least, log);
    ck_assert_ptr_null(strstr(log, "step "));  /* failed before training */
    free(log);
    snprintf(extra, sizeof extra, "--dry-run --set plan.memory_budget=%.0f", least);
    rc = train(out, extra, &log);
    ck_assert_msg(rc == 0, "the least budget %.0f failed:\n%s", least, log);
    free(log);
}
END_TEST

START_TEST(dry_run_lists_the_chosen_policies)
{
    char out[512], extra[128];
    tu_tmpdir(out, sizeof out);
    snprintf(extra, sizeof extra, "--dry-run --set plan.memory_budget=%.0f", BUDGET);
    char *log = NULL;
    int rc = train(out, extra, &log);
    ck_assert_msg(rc == 0, "%s", log);
    ck_assert_ptr_nonnull(strstr(log, "activation policies (budget 34.0 MB per GPU)"));
    ck_assert_ptr_nonnull(strstr(log, "activation plan: predicted"));
    /* the planner's table and the activation manager's agree: a recomputed KDA mixer */
    ck_assert_ptr_nonnull(strstr(log, "mixer.K.proj                   x3    recompute"));
    ck_assert_ptr_nonnull(strstr(log, "mixer.K.proj                     3     recompute"));
    ck_assert_ptr_nonnull(strstr(log, " keep "));
    free(log);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("actman_plan");
    TCase *tc = tcase_create("actman_plan");
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, budget_mixes_policies_and_keeps_losses);
    tcase_add_test(tc, too_small_budget_names_the_least);
    tcase_add_test(tc, dry_run_lists_the_chosen_policies);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
