/* A checkpoint is data: nothing in a manifest makes k3rt load a plugin file, and what it
 * names goes through the recipe schema before anything is built from it (issue 15, item 1).
 * The fixture ctor_marker.so is a valid balancer whose constructor creates $K3RT_TEST_MARKER
 * the moment anything dlopens it. */
#define _GNU_SOURCE /* symlink */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "testutil/testutil.h"

#define MARKER_SO K3RT_BINARY_DIR "/fixtures/ctor_marker.so"
#define SHIFT_SO K3RT_BINARY_DIR "/fixtures/shift_mixer.so"
#define SMALL "--quiet --no-sample --set plan.micro_batch=2 --set plan.seq_len=16 " \
              "--set train.eval_batches=1 --set train.eval_interval=0"

/* Runs a k3rt command line in the source tree with $K3RT_TEST_MARKER set; returns the exit
 * status and the output in *out (free it). */
static int k3rt(const char *marker, const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "cd %s && K3RT_TEST_MARKER=%s %s %s", tu_source_dir(), marker,
             tu_k3rt_bin(), args);
    return tu_run(cmd, out);
}

/* Trains `recipe` for 2 steps into dir (a checkpoint at step 2). */
static void train2(const char *recipe, const char *dir)
{
    char args[2048], *out = NULL;
    snprintf(args, sizeof args, "train %s --out %s --set train.steps=2 " SMALL, recipe, dir);
    int rc = k3rt("/dev/null", args, &out);
    ck_assert_msg(rc == 0, "training failed (%d):\n%s", rc, out);
    free(out);
}

static json_t *load_manifest(const char *dir, char *path, size_t len)
{
    snprintf(path, len, "%s/checkpoints/step_00000002/manifest.json", dir);
    json_t *m = json_load_file(path, 0, NULL);
    ck_assert_ptr_nonnull(m);
    return m;
}

static void save_manifest(json_t *m, const char *path)
{
    ck_assert_int_eq(json_dump_file(m, path, JSON_INDENT(1) | JSON_REAL_PRECISION(17)), 0);
    json_decref(m);
}

static json_t *marker_balancer(void)
{
    return json_pack("{s:s, s:s, s:s, s:{}}", "plugin", "fake", "kind", "balancer", "path",
                     MARKER_SO, "config");
}

static void expect(int rc, const char *out, int want_rc, const char *needle)
{
    ck_assert_msg(rc == want_rc, "exit %d, expected %d:\n%s", rc, want_rc, out);
    ck_assert_msg(strstr(out, needle), "'%s' not in:\n%s", needle, out);
}

/* k3rt eval of a manifest whose mixer names a plugin file: refused without loading it; named
 * on the command line, it loads (and is then refused for being a balancer). */
START_TEST(eval_never_loads_a_plugin_file_a_manifest_names)
{
    char dir[512], marker[600], path[1024], args[2048], *out = NULL;
    tu_tmpdir(dir, sizeof dir);
    snprintf(marker, sizeof marker, "%s/loaded", dir);
    train2("scripts/recipes/tiny_dense.lua", dir);
    json_t *m = load_manifest(dir, path, sizeof path);
    json_t *mixer = json_object_get(json_object_get(json_object_get(json_object_get(m, "config"),
                                                                    "model"), "mixers"), "M");
    json_object_set_new(mixer, "path", json_string(MARKER_SO));
    save_manifest(m, path);
    snprintf(args, sizeof args, "eval %s/checkpoints", dir);
    int rc = k3rt(marker, args, &out);
    expect(rc, out, 1, "--plugin " MARKER_SO);
    ck_assert_msg(!(access(marker, F_OK) == 0), "the manifest's plugin file was loaded:\n%s", out);
    free(out);
    snprintf(args, sizeof args, "eval %s/checkpoints --plugin %s", dir, MARKER_SO);
    rc = k3rt(marker, args, &out);
    expect(rc, out, 1, "balancer plugin");
    ck_assert_msg((access(marker, F_OK) == 0), "--plugin did not load the file:\n%s", out);
    free(out);
}
END_TEST

/* --resume of a checkpoint whose mid-run change names a balancer file: refused, not loaded. */
START_TEST(resume_never_loads_a_plugin_file_a_manifest_names)
{
    char dir[512], marker[600], path[1024], args[2048], *out = NULL;
    tu_tmpdir(dir, sizeof dir);
    snprintf(marker, sizeof marker, "%s/loaded", dir);
    train2("scripts/recipes/tiny.lua", dir);
    json_t *m = load_manifest(dir, path, sizeof path);
    json_t *bal = marker_balancer();
    json_object_set_new(m, "changes", json_pack("[{s:i, s:s, s:O}]", "step", 2, "source",
                                                "on_step", "balancer", bal));
    json_object_set_new(m, "balancer", bal);
    save_manifest(m, path);
    snprintf(args, sizeof args, "train scripts/recipes/tiny.lua --out %s --resume "
             "--set train.steps=3 " SMALL, dir);
    int rc = k3rt(marker, args, &out);
    expect(rc, out, 1, "--plugin " MARKER_SO);
    ck_assert_msg(!(access(marker, F_OK) == 0), "the manifest's plugin file was loaded:\n%s", out);
    free(out);
}
END_TEST

/* The manifest's config goes through the recipe schema: a layer count of 2^32 + 4 is refused,
 * not truncated to 4. */
START_TEST(manifest_config_goes_through_the_schema)
{
    char dir[512], path[1024], args[2048], *out = NULL;
    tu_tmpdir(dir, sizeof dir);
    train2("scripts/recipes/tiny_dense.lua", dir);
    json_t *m = load_manifest(dir, path, sizeof path);
    json_t *model = json_object_get(json_object_get(m, "config"), "model");
    json_object_set_new(model, "layers", json_integer(((json_int_t)1 << 32) + 4));
    save_manifest(m, path);
    snprintf(args, sizeof args, "eval %s/checkpoints", dir);
    int rc = k3rt("/dev/null", args, &out);
    expect(rc, out, 1, "layers");
    ck_assert_msg(strstr(out, "manifest.json"), "the message does not name the file:\n%s", out);
    free(out);
    /* An option the schema does not know, added by hand. */
    m = load_manifest(dir, path, sizeof path);
    model = json_object_get(json_object_get(m, "config"), "model");
    json_object_set_new(model, "layers", json_integer(4));
    json_object_set_new(json_object_get(json_object_get(model, "ffn"), "config"), "hiden",
                        json_integer(3));
    save_manifest(m, path);
    rc = k3rt("/dev/null", args, &out);
    expect(rc, out, 1, "did you mean 'hidden'");
    free(out);
    /* Options it lacks that have defaults (a plugin that gained one since): filled in. */
    m = load_manifest(dir, path, sizeof path);
    model = json_object_get(json_object_get(m, "config"), "model");
    json_object_del(json_object_get(json_object_get(model, "ffn"), "config"), "hiden");
    json_object_del(json_object_get(json_object_get(model, "ffn"), "config"), "act");
    json_object_del(model, "norm_eps");
    save_manifest(m, path);
    snprintf(args, sizeof args, "eval %s/checkpoints --windows 4", dir);
    rc = k3rt("/dev/null", args, &out);
    expect(rc, out, 0, "validation loss");
    free(out);
}
END_TEST

/* A checkpoint folder renamed to another step: its manifest disagrees, and it is refused by
 * eval and by --resume (which would otherwise continue "from step 5" with step 2's state). */
START_TEST(step_must_match_the_folder_name)
{
    char dir[512], from[1024], to[1024], args[2048], *out = NULL;
    tu_tmpdir(dir, sizeof dir);
    train2("scripts/recipes/tiny_dense.lua", dir);
    snprintf(from, sizeof from, "%s/checkpoints/step_00000002", dir);
    snprintf(to, sizeof to, "%s/checkpoints/step_00000005", dir);
    ck_assert_int_eq(rename(from, to), 0);
    snprintf(args, sizeof args, "eval %s", to);
    int rc = k3rt("/dev/null", args, &out);
    expect(rc, out, 1, "named for step 5 but its manifest says step 2");
    free(out);
    snprintf(args, sizeof args, "train scripts/recipes/tiny_dense.lua --out %s --resume "
             "--set train.steps=6 " SMALL, dir);
    rc = k3rt("/dev/null", args, &out);
    expect(rc, out, 1, "step 2");
    free(out);
}
END_TEST

/* A plugin the recipe loads by path (k3.plugin): eval needs it named again with --plugin;
 * --resume with the same recipe finds it. */
START_TEST(a_plugin_file_named_again_is_used)
{
    char dir[512], recipe[1024], text[2048], args[4096], *out = NULL;
    tu_tmpdir(dir, sizeof dir);
    snprintf(recipe, sizeof recipe, "%s/shift.lua", dir);
    snprintf(text, sizeof text,
             "return k3.recipe {\n"
             "  model = { d_model = 32, vocab = 256, layers = 2,\n"
             "            mixers = { S = k3.plugin(\"%s\", { init_std = 0.02 }) },\n"
             "            ffn = k3.dense_glu { hidden = 64 } },\n"
             "  optimizer = k3.adamw { lr = 1e-3 },\n"
             "  data = { path = \"data/tinyshakespeare.txt\" },\n"
             "}\n", SHIFT_SO);
    tu_write_file(recipe, text);
    train2(recipe, dir);
    snprintf(args, sizeof args, "eval %s/checkpoints", dir);
    int rc = k3rt("/dev/null", args, &out);
    expect(rc, out, 1, "--plugin " SHIFT_SO);
    free(out);
    snprintf(args, sizeof args, "eval %s/checkpoints --windows 4 --plugin %s", dir, SHIFT_SO);
    rc = k3rt("/dev/null", args, &out);
    expect(rc, out, 0, "validation loss");
    free(out);
    /* The same file found through --plugin-path (under a plugin file name) counts too. */
    char plugins[600], link[700];
    snprintf(plugins, sizeof plugins, "%s/plugins", dir);
    snprintf(link, sizeof link, "%s/libk3rt_shift.so", plugins);
    ck_assert_int_eq(mkdir(plugins, 0755), 0);
    ck_assert_int_eq(symlink(SHIFT_SO, link), 0);
    snprintf(args, sizeof args, "eval %s/checkpoints --windows 4 --plugin-path %s", dir,
             plugins);
    rc = k3rt("/dev/null", args, &out);
    expect(rc, out, 0, "validation loss");
    free(out);
    snprintf(args, sizeof args, "train %s --out %s --resume --set train.steps=3 " SMALL, recipe,
             dir);
    rc = k3rt("/dev/null", args, &out);
    ck_assert_msg(rc == 0, "resume failed (%d):\n%s", rc, out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ckpt_trust");
    TCase *tc = tcase_create("ckpt_trust");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, eval_never_loads_a_plugin_file_a_manifest_names);
    tcase_add_test(tc, resume_never_loads_a_plugin_file_a_manifest_names);
    tcase_add_test(tc, manifest_config_goes_through_the_schema);
    tcase_add_test(tc, step_must_match_the_folder_name);
    tcase_add_test(tc, a_plugin_file_named_again_is_used);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
