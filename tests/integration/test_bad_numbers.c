/* Bad numbers never become the last good checkpoint (issue 15, item 4): every tensor's
 * checksum is in the manifest and checked on load, loaded values must be finite (and Adam
 * second moments >= 0), a validation split too short for a loss is refused, and --resume falls
 * back past a corrupt newest checkpoint. (No saves during a streak of non-finite steps:
 * test_nan.c.) */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

#include <jansson.h>

#include "testutil/testutil.h"
#include "train/data.h"

#define ARGS "--no-sample --set plan.micro_batch=2 --set plan.seq_len=16 " \
             "--set train.eval_batches=1 --set train.eval_interval=0 " \
             "--set train.checkpoint_interval=2 --set train.log_interval=1"

static int k3rt(const char *args, char **log)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && %s %s", tu_source_dir(), tu_k3rt_bin(), args);
    return tu_run(cmd, log);
}

static void train(const char *recipe, const char *out, int steps)
{
    char args[2048], *log = NULL;
    snprintf(args, sizeof args, "train %s --out %s --quiet " ARGS " --set train.steps=%d",
             recipe, out, steps);
    int rc = k3rt(args, &log);
    ck_assert_msg(rc == 0, "training failed (%d):\n%s", rc, log);
    free(log);
}

static void expect(const char *args, int want, const char *needle)
{
    char *log = NULL;
    int rc = k3rt(args, &log);
    ck_assert_msg(rc == want, "exit %d (expected %d) for %s:\n%s", rc, want, args, log);
    ck_assert_msg(strstr(log, needle), "'%s' not in the output of %s:\n%s", needle, args, log);
    free(log);
}

/* Where tensor `name` lies in a safetensors file: absolute offset and byte count. */
static void span(const char *file, const char *name, long *offset, long *bytes)
{
    FILE *f = fopen(file, "rb");
    ck_assert_ptr_nonnull(f);
    unsigned char len8[8];
    ck_assert_int_eq(fread(len8, 1, 8, f), 8);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--)
        n = n << 8 | len8[i];
    char *header = calloc(1, (size_t)n + 1);
    ck_assert_int_eq(fread(header, 1, (size_t)n, f), n);
    fclose(f);
    json_t *h = json_loads(header, 0, NULL);
    json_t *off = json_object_get(json_object_get(h, name), "data_offsets");
    ck_assert_msg(off != NULL, "%s: no tensor %s", file, name);
    *offset = 8 + (long)n + (long)json_integer_value(json_array_get(off, 0));
    *bytes = (long)(json_integer_value(json_array_get(off, 1)) -
                    json_integer_value(json_array_get(off, 0)));
    json_decref(h);
    free(header);
}

/* Writes a float into element 0 of tensor `name` of checkpoint dir's `file`; with `rehash`,
 * the manifest's checksum is updated to match (so only the value checks can object). */
static void poke(const char *dir, const char *file, const char *name, float value, int rehash)
{
    char path[1024], mpath[1024];
    snprintf(path, sizeof path, "%s/%s", dir, file);
    long offset, bytes;
    span(path, name, &offset, &bytes);
    FILE *f = fopen(path, "r+b");
    ck_assert_ptr_nonnull(f);
    fseek(f, offset, SEEK_SET);
    ck_assert_int_eq(fwrite(&value, 4, 1, f), 1);
    unsigned char *data = malloc((size_t)bytes);
    fseek(f, offset, SEEK_SET);
    ck_assert_int_eq(fread(data, 1, (size_t)bytes, f), bytes);
    fclose(f);
    if (rehash) {
        char sum[32];
        snprintf(sum, sizeof sum, "crc32:%08lx", crc32(0L, data, (uInt)bytes) & 0xffffffffUL);
        snprintf(mpath, sizeof mpath, "%s/manifest.json", dir);
        json_t *m = json_load_file(mpath, 0, NULL);
        json_object_set_new(json_object_get(json_object_get(m, "tensors"), file), name,
                            json_string(sum));
        ck_assert_int_eq(json_dump_file(m, mpath, JSON_INDENT(1) | JSON_REAL_PRECISION(17)), 0);
        json_decref(m);
    }
    free(data);
}

/* A bit flip in a weight: caught by its checksum. A NaN weight, a negative Adam second
 * moment, a NaN balancer bias (checksums updated to match): caught by the value checks. */
START_TEST(loaded_tensors_are_checked)
{
    char out[512], dir[1024], args[2048];
    tu_tmpdir(out, sizeof out);
    train("scripts/recipes/tiny.lua", out, 2);
    snprintf(dir, sizeof dir, "%s/checkpoints/step_00000002", out);
    snprintf(args, sizeof args, "eval %s --windows 4", dir);
    expect(args, 0, "validation loss");
    poke(dir, "model.safetensors", "head.weight", 0.125f, 0);
    expect(args, 1, "tensor head.weight has checksum");
    poke(dir, "model.safetensors", "head.weight", NAN, 1);
    expect(args, 1, "tensor head.weight holds nan at element 0");
    poke(dir, "model.safetensors", "head.weight", 0.125f, 1);
    expect(args, 0, "validation loss");
    poke(dir, "state.safetensors", "optimizer.embed.weight.v", -1.0f, 1);
    expect(args, 1, "optimizer.embed.weight.v (an Adam second moment) holds -1");
    poke(dir, "state.safetensors", "optimizer.embed.weight.v", 0.0f, 1);
    poke(dir, "state.safetensors", "layers.1.balancer.bias", NAN, 1);
    expect(args, 1, "layers.1.balancer.bias holds nan");
}
END_TEST

/* A newest checkpoint with a bit flip: --resume passes over it, says so, continues from the
 * previous complete one. With no usable checkpoint at all it fails, naming the newest's
 * problem. */
START_TEST(resume_falls_back_past_a_corrupt_checkpoint)
{
    char out[512], dir[1024], args[2048];
    tu_tmpdir(out, sizeof out);
    train("scripts/recipes/tiny_dense.lua", out, 4);
    snprintf(dir, sizeof dir, "%s/checkpoints/step_00000004", out);
    poke(dir, "model.safetensors", "embed.weight", 0.5f, 0);
    snprintf(args, sizeof args, "train scripts/recipes/tiny_dense.lua --out %s " ARGS
             " --set train.steps=6 --resume", out);
    char *log = NULL;
    int rc = k3rt(args, &log);
    ck_assert_msg(rc == 0, "resume failed (%d):\n%s", rc, log);
    ck_assert_msg(strstr(log, "step_00000004 is unusable:") && strstr(log, "checksum") &&
                  strstr(log, "falling back to the previous complete checkpoint, step 2") &&
                  strstr(log, "from step 2 ("), "%s", log);
    free(log);
    double loss[8] = {0};
    ck_assert_int_eq(tu_metrics_losses(out, loss, 8), 6);
    /* Both corrupt now: nothing to resume from. */
    snprintf(dir, sizeof dir, "%s/checkpoints/step_00000006", out);
    poke(dir, "model.safetensors", "embed.weight", 0.5f, 0);
    snprintf(dir, sizeof dir, "%s/checkpoints/step_00000004", out);
    poke(dir, "model.safetensors", "embed.weight", 0.5f, 0);
    snprintf(args, sizeof args, "train scripts/recipes/tiny_dense.lua --out %s " ARGS
             " --set train.steps=8 --resume", out);
    expect(args, 1, "none of the 2 checkpoints");
}
END_TEST

/* Token shards whose validation split holds one token: no loss can be computed from it. */
START_TEST(short_validation_split_is_refused)
{
    char out[512], train_shard[1024], val_shard[1024], args[4096];
    tu_tmpdir(out, sizeof out);
    snprintf(train_shard, sizeof train_shard, "%s/train.bin", out);
    snprintf(val_shard, sizeof val_shard, "%s/val.bin", out);
    int32_t tokens[400];
    for (int i = 0; i < 400; i++)
        tokens[i] = (i * 7) % 256;
    k3rt_error err = {0};
    TU_OK(data_write_shard(train_shard, tokens, 400, 0, &err), err);
    TU_OK(data_write_shard(val_shard, tokens, 1, 0, &err), err);
    snprintf(args, sizeof args, "train scripts/recipes/tiny_dense.lua --out %s/run --quiet "
             ARGS " --set train.steps=2 --set data.tokenizer='\"shards\"' "
             "--set data.train='\"%s\"' --set data.val='\"%s\"'", out, train_shard, val_shard);
    expect(args, 1, "the validation split has 1 token; a loss needs at least 2");
    /* A checkpoint whose validation shard became that short since. */
    TU_OK(data_write_shard(val_shard, tokens, 40, 0, &err), err);
    char *log = NULL;
    ck_assert_msg(k3rt(args, &log) == 0, "%s", log);
    free(log);
    TU_OK(data_write_shard(val_shard, tokens, 1, 0, &err), err);
    snprintf(args, sizeof args, "eval %s/run/checkpoints", out);
    expect(args, 1, "val.bin: the validation split has 1 token");
}
END_TEST

/* A manifest "changes" record without a balancer: refused when the checkpoint is loaded, not
 * later when the resumed run writes its next checkpoint (issue 15, item 6). */
START_TEST(change_without_balancer_fails_at_load)
{
    char out[512], path[1024], args[2048];
    tu_tmpdir(out, sizeof out);
    train("scripts/recipes/tiny_dense.lua", out, 2);
    snprintf(path, sizeof path, "%s/checkpoints/step_00000002/manifest.json", out);
    json_t *m = json_load_file(path, 0, NULL);
    json_object_set_new(m, "changes", json_pack("[{s:i, s:s}]", "step", 2, "source", "on_step"));
    ck_assert_int_eq(json_dump_file(m, path, JSON_INDENT(1) | JSON_REAL_PRECISION(17)), 0);
    json_decref(m);
    snprintf(args, sizeof args, "train scripts/recipes/tiny_dense.lua --out %s " ARGS
             " --set train.steps=4 --resume", out);
    expect(args, 1, "changes[1]: expected {step, source, balancer}");
    snprintf(path, sizeof path, "%s/checkpoints/step_00000004", out);
    ck_assert_msg(access(path, F_OK) != 0, "the run went on to step 4");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("bad_numbers");
    TCase *tc = tcase_create("bad_numbers");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, loaded_tensors_are_checked);
    tcase_add_test(tc, resume_falls_back_past_a_corrupt_checkpoint);
    tcase_add_test(tc, short_validation_split_is_refused);
    tcase_add_test(tc, change_without_balancer_fails_at_load);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
