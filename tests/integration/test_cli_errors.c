/* Malformed input through the k3rt command: a one-line clear error, exit status 1, never a
 * crash. */
#include <string.h>
#include <unistd.h>

#include "testutil/testutil.h"

/* Runs cmd (in the source tree); asserts exit 1 and one line of output holding `needle`. */
static void expect_error(const char *cmd, const char *needle)
{
    char full[4096], *out = NULL;
    snprintf(full, sizeof full, "cd %s && %s", tu_source_dir(), cmd);
    int rc = tu_run(full, &out);
    ck_assert_msg(rc == 1, "expected exit 1, got %d for: %s\n%s", rc, cmd, out);
    ck_assert_msg(strstr(out, needle) != NULL, "'%s' not in the message of: %s\n%s", needle, cmd,
                  out);
    /* ASan, told to return NULL for an allocation too large, still warns of it on a line of
     * its own: not k3rt's message */
    char *warn = strstr(out, "==WARNING: AddressSanitizer failed to allocate");
    if (warn) {
        char *start = warn, *end = strchr(warn, '\n');
        while (start > out && start[-1] != '\n')
            start--;
        if (end)
            memmove(start, end + 1, strlen(end + 1) + 1);
        else
            *start = '\0';
    }
    size_t len = strlen(out);
    while (len && out[len - 1] == '\n')
        out[--len] = '\0';
    ck_assert_msg(strchr(out, '\n') == NULL, "more than one line for: %s\n%s", cmd, out);
    free(out);
}

static void write_recipe(const char *dir, const char *name, const char *text, char *path,
                         size_t len)
{
    snprintf(path, len, "%s/%s", dir, name);
    tu_write_file(path, text);
}

START_TEST(recipe_errors)
{
    char dir[512], path[1024], cmd[2048];
    tu_tmpdir(dir, sizeof dir);
    write_recipe(dir, "syntax.lua", "return k3.recipe {\n  model = {\n    d_model = = 4 }\n}\n",
                 path, sizeof path);
    snprintf(cmd, sizeof cmd, "%s train %s", tu_k3rt_bin(), path);
    expect_error(cmd, "syntax.lua:3:");
    snprintf(cmd, sizeof cmd, "%s train scripts/recipes/tiny_dense.lua --set plan.ep=2 --out %s",
             tu_k3rt_bin(), dir);
    expect_error(cmd, "not supported yet");
    snprintf(cmd, sizeof cmd, "%s train scripts/recipes/tiny_dense.lua --set plan.micro_bach=2 "
             "--out %s", tu_k3rt_bin(), dir);
    expect_error(cmd, "micro_batch");
    snprintf(cmd, sizeof cmd, "%s train scripts/recipes/tiny_dense.lua --set "
             "data.path='\"nowhere.txt\"' --out %s", tu_k3rt_bin(), dir);
    expect_error(cmd, "nowhere.txt");
    /* --dry-run reads the data too: a plan that cannot read its data is not one. */
    snprintf(cmd, sizeof cmd, "%s train scripts/recipes/tiny_dense.lua --dry-run --set "
             "data.path='\"nowhere.txt\"' --out %s", tu_k3rt_bin(), dir);
    expect_error(cmd, "nowhere.txt");
    snprintf(cmd, sizeof cmd, "%s train %s/none.lua", tu_k3rt_bin(), dir);
    expect_error(cmd, "none.lua");
}
END_TEST

START_TEST(corrupt_shard)
{
    char dir[512], cmd[4096], shard[1024];
    tu_tmpdir(dir, sizeof dir);
    snprintf(shard, sizeof shard, "%s/train.bin", dir);
    tu_write_file(shard, "this is not a token shard at all");
    snprintf(cmd, sizeof cmd, "%s train scripts/recipes/tiny_dense.lua --out %s "
             "--set data.tokenizer='\"shards\"' --set data.train='\"%s\"' "
             "--set data.val='\"%s\"'", tu_k3rt_bin(), dir, shard, shard);
    expect_error(cmd, "train.bin");
}
END_TEST

START_TEST(corrupt_checkpoints_are_refused)
{
    char dir[512], cmd[4096], *out = NULL, file[1024];
    tu_tmpdir(dir, sizeof dir);
    const char *args = "--quiet --no-sample --set train.steps=2 --set plan.micro_batch=2 "
                       "--set plan.seq_len=16 --set train.eval_batches=1";
    snprintf(cmd, sizeof cmd, "cd %s && %s train scripts/recipes/tiny_dense.lua --out %s %s",
             tu_source_dir(), tu_k3rt_bin(), dir, args);
    ck_assert_msg(tu_run(cmd, &out) == 0, "%s", out);
    free(out);
    /* truncated weights */
    snprintf(file, sizeof file, "%s/checkpoints/step_00000002/model.safetensors", dir);
    ck_assert_int_eq(truncate(file, 1000), 0);
    snprintf(cmd, sizeof cmd, "%s train scripts/recipes/tiny_dense.lua --out %s %s "
             "--set train.steps=4 --resume", tu_k3rt_bin(), dir, args);
    expect_error(cmd, "model.safetensors");
    /* a manifest whose recipe hash does not match its text */
    snprintf(file, sizeof file, "%s/checkpoints/step_00000002/manifest.json", dir);
    snprintf(cmd, sizeof cmd, "sed -i 's/\"sha256\": \"[0-9a-f]*\"/\"sha256\": \"%064d\"/' %s",
             0, file);
    ck_assert_int_eq(tu_run(cmd, NULL), 0);
    snprintf(cmd, sizeof cmd, "%s train scripts/recipes/tiny_dense.lua --out %s %s "
             "--set train.steps=4 --resume", tu_k3rt_bin(), dir, args);
    expect_error(cmd, "hash");
    /* a different model shape */
    snprintf(cmd, sizeof cmd, "%s eval %s/nothing_here", tu_k3rt_bin(), dir);
    expect_error(cmd, "nothing_here");
}
END_TEST

/* Schema-legal sizes whose products overflow 64 bits: refused as too large before anything
 * is built or allocated. */
START_TEST(sizes_too_large)
{
    char dir[512], cmd[2048];
    tu_tmpdir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "%s train scripts/recipes/tiny_dense.lua --dry-run --out %s "
             "--set train.steps=1000000000000000 --set plan.micro_batch=1000000 "
             "--set plan.seq_len=100000000", tu_k3rt_bin(), dir);
    expect_error(cmd, "too large");
    snprintf(cmd, sizeof cmd, "%s train scripts/recipes/tiny_dense.lua --dry-run --out %s "
             "--set train.eval_batches=1000000000000000 --set plan.micro_batch=1000000 "
             "--set plan.seq_len=100000", tu_k3rt_bin(), dir);
    expect_error(cmd, "train.eval_batches");
    /* Sizes that fit in 64 bits but not in this machine: the dry run says which command
     * sizes them without allocating (ASan is told to return NULL, as malloc does). */
    snprintf(cmd, sizeof cmd, "ASAN_OPTIONS=$ASAN_OPTIONS:allocator_may_return_null=1 %s train "
             "scripts/recipes/tiny_dense.lua --dry-run --out %s --set plan.micro_batch=1000000 "
             "--set plan.seq_len=4096", tu_k3rt_bin(), dir);
    expect_error(cmd, "k3rt plan RECIPE --gpus N");
}
END_TEST

START_TEST(op_errors)
{
    char dir[512], cmd[2048];
    tu_tmpdir(dir, sizeof dir);
    snprintf(cmd, sizeof cmd, "%s op mla --config '{}' --in %s/missing.safetensors --out %s/o",
             tu_k3rt_bin(), dir, dir);
    expect_error(cmd, "missing.safetensors");
    snprintf(cmd, sizeof cmd, "%s op mla --config '{\"haeds\": 2}' --in %s/missing.safetensors "
             "--out %s/o", tu_k3rt_bin(), dir, dir);
    expect_error(cmd, "did you mean 'heads'");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("cli_errors");
    TCase *tc = tcase_create("cli");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, recipe_errors);
    tcase_add_test(tc, corrupt_shard);
    tcase_add_test(tc, corrupt_checkpoints_are_refused);
    tcase_add_test(tc, sizes_too_large);
    tcase_add_test(tc, op_errors);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
