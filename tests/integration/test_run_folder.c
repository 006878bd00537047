/* Runs never eat each other (issue 15, item 2): every manifest carries the run's identity; a
 * fresh run refuses a folder holding another run's checkpoints unless --force (which removes
 * them) or --resume (which continues that run, saying whose and from which step). */
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "testutil/testutil.h"
#include "util/fs.h"

#define ARGS "--no-sample --set plan.micro_batch=2 --set plan.seq_len=16 " \
             "--set train.eval_batches=1 --set train.eval_interval=0 " \
             "--set train.checkpoint_interval=2 --set train.log_interval=1"

static int train(const char *out, const char *extra, char **log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && %s train scripts/recipes/tiny_dense.lua --out %s " ARGS
             " %s", tu_source_dir(), tu_k3rt_bin(), out, extra);
    return tu_run(cmd, log);
}

static json_t *manifest(const char *out, int step)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/checkpoints/step_%08d/manifest.json", out, step);
    json_t *m = json_load_file(path, 0, NULL);
    ck_assert_msg(m != NULL, "%s does not load", path);
    return m;
}

static const char *run_field(const json_t *m, const char *key)
{
    return json_string_value(json_object_get(json_object_get(m, "run"), key));
}

static char *read_all(const char *path)
{
    char *text = NULL;
    size_t len;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &text, &len, &err), err);
    return text;
}

/* Run A (seed 1) leaves checkpoints 2 and 4; run B (seed 2) in the same folder is refused and
 * changes nothing there; with --force it replaces A. */
START_TEST(fresh_run_refuses_another_runs_folder)
{
    char out[512], path[1024], *log = NULL;
    tu_tmpdir(out, sizeof out);
    ck_assert_msg(train(out, "--quiet --set train.steps=4", &log) == 0, "%s", log);
    free(log);
    json_t *a = manifest(out, 4);
    ck_assert_msg(run_field(a, "id") && strlen(run_field(a, "id")) > 20, "no run id");
    ck_assert_str_eq(run_field(a, "recipe_sha256"),
                     json_string_value(json_object_get(json_object_get(a, "recipe"), "sha256")));
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(a, "run"), "seed")), 1);
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    char *metrics = read_all(path);

    int rc = train(out, "--quiet --set train.steps=2 --set train.seed=2", &log);
    ck_assert_msg(rc == 1, "a second run in the folder exited %d:\n%s", rc, log);
    ck_assert_msg(strstr(log, "holds 2 checkpoints of run ") && strstr(log, run_field(a, "id")) &&
                  strstr(log, "steps 2 to 4") && strstr(log, "--resume") &&
                  strstr(log, "--force"), "%s", log);
    free(log);
    char *after = read_all(path);
    ck_assert_msg(!strcmp(metrics, after), "the refused run changed metrics.jsonl");
    free(after);
    json_t *still = manifest(out, 4);
    ck_assert_str_eq(run_field(still, "id"), run_field(a, "id"));
    json_decref(still);

    rc = train(out, "--set train.steps=2 --set train.seed=2 --force", &log);
    ck_assert_msg(rc == 0, "--force exited %d:\n%s", rc, log);
    ck_assert_msg(strstr(log, "--force: removed 2 checkpoints of run "), "%s", log);
    free(log);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000004", out);
    ck_assert_msg(!fs_exists(path), "run A's step 4 is still there");
    json_t *b = manifest(out, 2);
    ck_assert_int_eq(json_integer_value(json_object_get(json_object_get(b, "run"), "seed")), 2);
    ck_assert_str_ne(run_field(b, "id"), run_field(a, "id"));
    json_decref(b);
    json_decref(a);
    free(metrics);
}
END_TEST

/* --resume says whose run it continues and from which step, and keeps its identity. */
START_TEST(resume_says_whose_run_and_which_step)
{
    char out[512], *log = NULL;
    tu_tmpdir(out, sizeof out);
    ck_assert_msg(train(out, "--quiet --set train.steps=4", &log) == 0, "%s", log);
    free(log);
    json_t *a = manifest(out, 4);
    ck_assert_msg(train(out, "--set train.steps=6 --resume", &log) == 0, "%s", log);
    char want[512];
    snprintf(want, sizeof want, "--resume: continuing run %s (recipe "
             "scripts/recipes/tiny_dense.lua, seed 1, started %s) from step 4 (", run_field(a, "id"),
             run_field(a, "started"));
    ck_assert_msg(strstr(log, want), "'%s' not in:\n%s", want, log);
    free(log);
    json_t *b = manifest(out, 6);
    ck_assert_msg(json_equal(json_object_get(a, "run"), json_object_get(b, "run")),
                  "the resumed run changed identity");
    json_decref(a);
    json_decref(b);
    /* --force and --resume together: refused. */
    ck_assert_int_eq(train(out, "--resume --force", &log), 1);
    ck_assert_msg(strstr(log, "give one of them"), "%s", log);
    free(log);
}
END_TEST

/* A run that logged steps 5 and 6 but was interrupted before step 6's checkpoint: --resume
 * replays them from step 4, and metrics.jsonl holds every step once, with the replayed
 * losses bitwise those logged before. */
START_TEST(resume_does_not_log_replayed_steps_twice)
{
    char out[512], path[1024], cmd[2048], *log = NULL;
    tu_tmpdir(out, sizeof out);
    ck_assert_msg(train(out, "--quiet --set train.steps=6 --set train.checkpoint_interval=4",
                        &log) == 0, "%s", log);
    free(log);
    double before[8] = {0}, after[10] = {0};
    ck_assert_int_eq(tu_metrics_losses(out, before, 8), 6);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000006", out);
    TU_OK(fs_remove_tree(path, NULL), (k3rt_error){0});
    ck_assert_msg(train(out, "--quiet --set train.steps=8 --set train.checkpoint_interval=4 "
                        "--resume", &log) == 0, "%s", log);
    free(log);
    ck_assert_int_eq(tu_metrics_losses(out, after, 10), 8);
    snprintf(cmd, sizeof cmd, "grep -c '\"step\"' %s/metrics.jsonl", out);
    ck_assert_int_eq(tu_run(cmd, &log), 0);
    ck_assert_msg(atoi(log) == 8, "metrics.jsonl has %s records for 8 steps", log);
    free(log);
    for (int s = 1; s <= 6; s++)
        ck_assert_msg(memcmp(&before[s], &after[s], sizeof(double)) == 0,
                      "step %d: %.17g before, %.17g replayed", s, before[s], after[s]);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("run_folder");
    TCase *tc = tcase_create("run_folder");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, fresh_run_refuses_another_runs_folder);
    tcase_add_test(tc, resume_says_whose_run_and_which_step);
    tcase_add_test(tc, resume_does_not_log_replayed_steps_twice);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
