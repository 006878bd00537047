/* Recipes: the validated document, schema messages, the sandbox, --set, pattern rules,
 * on_step and the hash. Plugin options are tested on option-only fixture plugins
 * (tests/fixtures/recipe_fixture.c), so nothing here needs a real plugin to be built; the
 * parts that use the real ones skip when they are absent. */
#define _GNU_SOURCE /* realpath, symlink */
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "recipe/recipe.h"
#include "testutil/testutil.h"
#include "util/fs.h"
#include "util/log.h"

static registry g_reg;

static void setup(void) { tu_recipe_fixtures(&g_reg); }

static void teardown(void) { registry_free(&g_reg); }

/* Line numbers matter: messages are checked for them. */
static const char *TEMPLATE =
    "return k3.recipe {\n"                                             /* 1 */
    "  model = { d_model = 32, vocab = 256, layers = 4,\n"             /* 2 */
    "    mixers = { A = k3.fixture_mixer{ heads = 2, %s },\n"          /* 3 */
    "               B = k3.fixture_mixer{} },\n"                       /* 4 */
    "    pattern = 'AB', ffn = k3.fixture_ffn{ experts = 4 },\n"       /* 5 */
    "    residual = k3.fixture_residual{}, %s },\n"                    /* 6 */
    "  optimizer = k3.fixture_opt{ lr = 3e-3 },\n"                     /* 7 */
    "  data = { path = 'data/x.txt' },\n"                              /* 8 */
    "  %s\n"                                                           /* 9 */
    "}\n";

static int load_with(const char *mixer, const char *model, const char *top,
                     const char *const *ov, int n, recipe **r, k3rt_error *err)
{
    char text[4096];
    snprintf(text, sizeof text, TEMPLATE, mixer, model, top);
    return recipe_load_string(text, "recipe.lua", &g_reg, ov, n, NULL, r, err);
}

static int try_text(const char *text, const char *const *ov, int n, const recipe_limits *lim,
                    k3rt_error *err)
{
    recipe *r = NULL;
    int rc = recipe_load_string(text, "recipe.lua", &g_reg, ov, n, lim, &r, err);
    recipe_free(r);
    return rc;
}

static void has(const k3rt_error *err, const char *part)
{
    ck_assert_msg(strstr(err->msg, part) != NULL, "expected \"%s\" in: %s", part, err->msg);
}

/* Fails the test unless loading the template fails with every part in the message. */
static void fails(const char *mixer, const char *model, const char *top, const char *const *ov,
                  int n, const char *part1, const char *part2)
{
    recipe *r = NULL;
    k3rt_error err = {0};
    int rc = load_with(mixer, model, top, ov, n, &r, &err);
    recipe_free(r);
    ck_assert_msg(rc != K3RT_OK, "expected a failure containing \"%s\"", part1);
    has(&err, part1);
    if (part2)
        has(&err, part2);
}

/* The value at a dotted path of objects. */
static const json_t *at(const json_t *doc, const char *path)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", path);
    const json_t *v = doc;
    for (char *save = NULL, *k = strtok_r(buf, ".", &save); k && v;
         k = strtok_r(NULL, ".", &save))
        v = json_object_get(v, k);
    return v;
}

static void same_json(const json_t *got, const char *expected)
{
    json_error_t je;
    json_t *want = json_loads(expected, JSON_DECODE_ANY, &je);
    ck_assert_msg(want != NULL, "bad expected JSON: %s", je.text);
    char *g = json_dumps(got, JSON_COMPACT | JSON_ENCODE_ANY);
    ck_assert_msg(json_equal(want, (json_t *)got), "got %s\nwant %s", g, expected);
    free(g);
    json_decref(want);
}

static void same_keys(const json_t *obj, const char *const *keys, int n)
{
    const char *key;
    json_t *v;
    int i = 0;
    json_object_foreach((json_t *)obj, key, v) {
        ck_assert_msg(i < n && !strcmp(key, keys[i]), "key %d: got %s", i, key);
        i++;
    }
    ck_assert_int_eq(i, n);
}

START_TEST(test_good_recipe_document)
{
    recipe *r;
    k3rt_error err = {0};
    TU_OK(load_with("scale = 2, lower_bound = k3.none", "", "", NULL, 0, &r, &err), err);
    const json_t *doc = recipe_json(r);
    static const char *const top[] = {"model", "optimizer", "plan", "train",
                                      "data", "sample", "out", "has_on_step"};
    same_keys(doc, top, 8);
    static const char *const model[] = {"d_model", "vocab", "layers", "pattern",
                                        "mixers", "ffn", "dense_ffn", "dense_layers",
                                        "balancer", "residual", "norm_eps", "init_std"};
    same_keys(at(doc, "model"), model, 12);
    ck_assert_str_eq(json_string_value(at(doc, "model.pattern")), "ABAB");
    /* scale = 2 (a Lua integer) is stored as a real; k3.none became null. */
    same_json(at(doc, "model.mixers.A"),
              "{\"plugin\":\"fixture_mixer\",\"kind\":\"attention\",\"path\":null,\"config\":"
              "{\"heads\":2,\"head_dim\":16,\"scale\":2.0,\"causal\":true,\"act\":\"situ\","
              "\"lower_bound\":null}}");
    same_json(at(doc, "model.mixers.B.config"),
              "{\"heads\":4,\"head_dim\":16,\"scale\":1.0,\"causal\":true,\"act\":\"situ\","
              "\"lower_bound\":-5.0}");
    same_json(at(doc, "model.ffn"), "{\"plugin\":\"fixture_ffn\",\"kind\":\"moe\",\"path\":null,"
                                    "\"config\":{\"experts\":4,\"top_k\":2}}");
    same_json(at(doc, "model.balancer"),
              "{\"plugin\":\"none\",\"kind\":\"balancer\",\"path\":null,\"config\":{}}");
    same_json(at(doc, "model.residual.config"), "{\"block_layers\":2}");
    if (registry_find(&g_reg, "dense_glu", K3RT_KIND_MOE))
        ck_assert_str_eq(json_string_value(at(doc, "model.dense_ffn.plugin")), "dense_glu");
    else
        ck_assert(json_is_null(at(doc, "model.dense_ffn")));
    same_json(at(doc, "model.dense_layers"), "0");
    same_json(at(doc, "model.norm_eps"), "1e-5");
    same_json(at(doc, "model.init_std"), "0.02");
    same_json(at(doc, "optimizer"),
              "{\"plugin\":\"fixture_opt\",\"kind\":\"optimizer\",\"path\":null,\"lr\":0.003,"
              "\"config\":{\"weight_decay\":0.0,\"beta1\":0.9}}");
    same_json(at(doc, "plan"),
              "{\"dp\":1,\"ep\":1,\"cp\":1,\"comm\":\"auto\",\"pp\":1,\"micro_batch\":8,"
              "\"seq_len\":256,\"grad_accum\":1,\"device\":\"auto\",\"dtype\":\"auto\",\"threads\":0,"
              "\"peak_tflops\":0.0,\"deterministic\":false,\"shard_optimizer\":false,"
              "\"shard_gradients\":false}");
    same_json(at(doc, "train"),
              "{\"steps\":1000,\"warmup\":100,\"schedule\":\"cosine\",\"min_lr_ratio\":0.1,"
              "\"seed\":1,\"grad_clip\":1.0,\"log_interval\":10,\"eval_interval\":250,"
              "\"eval_batches\":0,\"eval_at_start\":false,\"checkpoint_interval\":500,"
              "\"keep_checkpoints\":2,\"max_bad_steps\":5,\"init_weights\":null,\"changes\":[]}");
    same_json(at(doc, "data"), "{\"tokenizer\":\"bytes\",\"path\":\"data/x.txt\","
                               "\"val_fraction\":0.1,\"train\":null,\"val\":null,"
                               "\"packed_documents\":false}");
    same_json(at(doc, "sample"), "{\"bytes\":500,\"temperature\":0.8,\"top_k\":0,"
                                 "\"prompt\":\"\\n\",\"seed\":1}");
    same_json(at(doc, "out"), "\"runs/recipe\"");
    same_json(at(doc, "has_on_step"), "false");

    const plugin_entry *e = recipe_spec_plugin(r, at(doc, "model.mixers.A"));
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->desc.name, "fixture_mixer");
    e = recipe_spec_plugin(r, at(doc, "model.balancer"));
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->path, "(built-in)");
    ck_assert_ptr_null(recipe_spec_plugin(r, json_null()));
    ck_assert_str_eq(recipe_path(r), "recipe.lua");
    ck_assert(strstr(recipe_text(r), "k3.fixture_opt") != NULL);
    recipe_free(r);
}
END_TEST

START_TEST(test_sections_as_given)
{
    recipe *r;
    k3rt_error err = {0};
    TU_OK(load_with("", "dense_layers = 1, dense_ffn = k3.fixture_ffn{ experts = 1 }, "
                        "balancer = k3.fixture_balancer{ rate = 0.5 }, norm_eps = 1e-6",
                    "plan = { dp = 2, device = 'cpu', deterministic = true }, "
                    "train = { steps = 10, changes = { { step = 5, balancer = k3.none{} } } }, "
                    "sample = { prompt = 'To be' }, out = 'runs/x'",
                    NULL, 0, &r, &err),
          err);
    const json_t *doc = recipe_json(r);
    same_json(at(doc, "model.dense_ffn.config"), "{\"experts\":1,\"top_k\":2}");
    same_json(at(doc, "model.dense_layers"), "1");
    same_json(at(doc, "model.balancer.config"), "{\"rate\":0.5}");
    same_json(at(doc, "model.norm_eps"), "1e-6");
    same_json(at(doc, "plan.dp"), "2");
    same_json(at(doc, "plan.device"), "\"cpu\"");
    same_json(at(doc, "plan.deterministic"), "true");
    same_json(at(doc, "train.steps"), "10");
    same_json(at(doc, "train.changes"),
              "[{\"step\":5,\"balancer\":{\"plugin\":\"none\",\"kind\":\"balancer\","
              "\"path\":null,\"config\":{}}}]");
    same_json(at(doc, "sample.prompt"), "\"To be\"");
    same_json(at(doc, "out"), "\"runs/x\"");
    recipe_free(r);
}
END_TEST

START_TEST(test_misspelt_keys)
{
    fails("", "", "trian = {},", NULL, 0, "recipe.lua:1: top level: unknown key 'trian'",
          "did you mean 'train'?");
    fails("", "dmodel = 3", "", NULL, 0, "model: unknown key 'dmodel'",
          "did you mean 'd_model'?");
    fails("", "balancr = k3.none{}", "", NULL, 0, "unknown key 'balancr'",
          "did you mean 'balancer'?");
    fails("", "", "plan = { micro_bach = 4 },", NULL, 0, "plan: unknown key 'micro_bach'",
          "did you mean 'micro_batch'?");
    fails("head = 3", "", "", NULL, 0,
          "recipe.lua:3: model.mixers.A (fixture_mixer): unknown key 'head'; did you mean "
          "'heads'?", NULL);
    fails("", "", "optimizer = k3.fixture_opt{ lrr = 1 },", NULL, 0,
          "optimizer (fixture_opt): unknown key 'lrr'", "did you mean 'lr'?");
    fails("", "", "train = { changes = { { stp = 1, balancer = k3.none{} } } },", NULL, 0,
          "train.changes[1]: unknown key 'stp'", "did you mean 'step'?");
    fails("", "", "data = { path = 'x', zzzzzz = 1 },", NULL, 0, "data: unknown key 'zzzzzz'",
          "(valid keys: tokenizer, path, val_fraction, train, val, packed_documents)");
}
END_TEST

START_TEST(test_wrong_types_and_ranges)
{
    fails("heads = 'two'", "", "", NULL, 0, "recipe.lua:3: model.mixers.A (fixture_mixer)",
          "key 'heads' expects an integer, got a string");
    fails("heads = 0", "", "", NULL, 0, "model.mixers.A (fixture_mixer): key 'heads' must be "
                                        "in [1, 64], got 0", NULL);
    fails("heads = 2.5", "", "", NULL, 0, "key 'heads' expects an integer, got a number", NULL);
    fails("act = 'relu'", "", "", NULL, 0, "key 'act' must be one of situ|swiglu, got 'relu'",
          NULL);
    fails("causal = 1", "", "", NULL, 0, "key 'causal' expects a boolean, got an integer", NULL);
    fails("", "", "plan = { device = 3 },", NULL, 0,
          "plan: key 'device' expects a string, got an integer", NULL);
    fails("", "", "plan = { dp = 0 },", NULL, 0, "plan: key 'dp' must be in [1, 65536], got 0",
          NULL);
    fails("", "", "plan = 5,", NULL, 0, "plan: expected a table, got an integer", NULL);
    fails("", "", "train = { min_lr_ratio = 2 },", NULL, 0,
          "train: key 'min_lr_ratio' must be in [0, 1], got 2", NULL);
    fails("", "d_model = 0", "", NULL, 0, "model: key 'd_model' must be in", NULL);
    fails("", "dense_layers = 5", "", NULL, 0, "model: dense_layers (5) exceeds layers (4)",
          NULL);
    fails("", "", "optimizer = k3.fixture_opt{ lr = 0 },", NULL, 0,
          "optimizer (fixture_opt): key 'lr' expects a number > 0", NULL);
    fails("", "", "optimizer = k3.fixture_opt{},", NULL, 0,
          "optimizer (fixture_opt): missing required key 'lr'", NULL);
    fails("", "ffn = k3.fixture_mixer{}", "", NULL, 0,
          "model.ffn: 'fixture_mixer' is a attention plugin; a moe plugin is expected here",
          NULL);
    fails("", "ffn = { experts = 4 }", "", NULL, 0,
          "model.ffn: expected a moe plugin spec such as k3.NAME{ ... }, got a table", NULL);
    fails("", "", "data = { path = k3.none },", NULL, 0,
          "data: tokenizer \"bytes\" reads a text file: set data.path", NULL);
    fails("", "", "data = { tokenizer = 'shards', train = 'a.bin' },", NULL, 0,
          "needs data.train and data.val", NULL);
    fails("", "", "train = { changes = { { step = 5, balancer = k3.none{} }, "
          "{ step = 5, balancer = k3.none{} } } },", NULL, 0,
          "train.changes[2]: steps must increase strictly (step 5 after step 5)", NULL);
    fails("", "foo = function() end", "", NULL, 0,
          "model.foo: a function cannot be part of a recipe", NULL);
    fails("", "", "out = 7,", NULL, 0, "out: expected an output folder", NULL);
    fails("", "ffn = k3.none", "", NULL, 0, "model.ffn: cannot be none", NULL);
    fails("", "mixers = k3.fixture_mixer{}", "", NULL, 0,
          "model.mixers: expected a table of letter = spec", NULL);
    /* Without k3.recipe{} the messages name the file without a line. */
    k3rt_error e2 = {0};
    ck_assert_int_ne(try_text("return { optimizer = k3.fixture_opt{ lr = 1 } }", NULL, 0, NULL,
                              &e2),
                     K3RT_OK);
    has(&e2, "recipe.lua: top level: missing required section 'model'");
    ck_assert_int_ne(try_text("return { model = {} }", NULL, 0, NULL, &e2), K3RT_OK);
    has(&e2, "top level: missing required key 'optimizer'");
    ck_assert_int_ne(try_text("return { model = { d_model = 8 }, optimizer = k3.fixture_opt{ "
                              "lr = 1 } }", NULL, 0, NULL, &e2),
                     K3RT_OK);
    has(&e2, "model: missing required key 'vocab'");
    fails("", "", "on_step = 3,", NULL, 0, "on_step: expected a function", NULL);
    /* A table that contains itself is refused, not followed forever. */
    k3rt_error err = {0};
    ck_assert_int_ne(try_text("local t = {} t.t = t\n"
                              "return { model = t, optimizer = k3.fixture_opt{ lr = 1 } }",
                              NULL, 0, NULL, &err),
                     K3RT_OK);
    has(&err, "nested deeper than 32 levels");
}
END_TEST

START_TEST(test_lua_errors_carry_lines)
{
    k3rt_error err = {0};
    ck_assert_int_ne(try_text("return k3.recipe {\n  model = {\n    d_model = = 3 }\n}\n", NULL,
                              0, NULL, &err),
                     K3RT_OK);
    has(&err, "recipe.lua:3:");
    ck_assert_int_ne(try_text("local x = nil\nlocal y = x.field\nreturn {}", NULL, 0, NULL,
                              &err),
                     K3RT_OK);
    has(&err, "recipe.lua:2: attempt to index a nil value (local 'x')");
    /* An error inside a helper keeps the recipe's own frames. */
    ck_assert_int_ne(try_text("local function f()\n  error('boom')\nend\n\nf()\nreturn {}",
                              NULL, 0, NULL, &err),
                     K3RT_OK);
    has(&err, "recipe.lua:2: boom");
    has(&err, "recipe.lua:5:");
    ck_assert_int_ne(try_text("error({})", NULL, 0, NULL, &err), K3RT_OK);
    has(&err, "error object is a table value");
    ck_assert_int_ne(try_text("local x = 1", NULL, 0, NULL, &err), K3RT_OK);
    has(&err, "recipe.lua: the recipe must return a table");
    ck_assert_int_ne(try_text("return k3.recipe(5)", NULL, 0, NULL, &err), K3RT_OK);
    has(&err, "recipe.lua:1: k3.recipe expects a table");
    ck_assert_int_ne(try_text("\n\nlocal s = k3.fixture_mixer('x')", NULL, 0, NULL, &err),
                     K3RT_OK);
    has(&err, "recipe.lua:3: k3.fixture_mixer expects a table of options");
    /* A misspelt plugin name fails where it is used, naming the nearest plugin. */
    ck_assert_int_ne(try_text("\nlocal s = k3.fixture_mixr{}", NULL, 0, NULL, &err), K3RT_OK);
    has(&err, "recipe.lua:2: k3.fixture_mixr: no plugin named 'fixture_mixr'; did you mean "
              "'fixture_mixer'?");
}
END_TEST

START_TEST(test_escapes_refused)
{
    static const char *const cases[][2] = {
        {"io.open('/etc/passwd')", "global 'io'"},
        {"os.execute('true')", "global 'os'"},
        {"require('os')", "global 'require'"},
        {"load('return 1')", "global 'load'"},
        {"loadfile('/etc/passwd')", "global 'loadfile'"},
        {"dofile('/etc/passwd')", "global 'dofile'"},
        {"debug.traceback()", "global 'debug'"},
        {"package.loadlib('libc.so.6', 'system')", "global 'package'"},
        {"string.dump(print)", "field 'dump'"},
        {"(\"x\"):dump()", "method 'dump'"},
        {"collectgarbage()", "global 'collectgarbage'"},
        {"getmetatable('').__index.dump(print)", "field 'dump'"},
        {"_G.io.open('x')", "field 'io'"},
        {"setmetatable({}, { __gc = function() while true do end end })",
         "recipes cannot set __gc finalizers"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[256];
        snprintf(text, sizeof text, "%s\nreturn {}\n", cases[i][0]);
        k3rt_error err = {0};
        ck_assert_msg(try_text(text, NULL, 0, NULL, &err) != K3RT_OK, "not refused: %s",
                      cases[i][0]);
        has(&err, "recipe.lua:1:");
        has(&err, cases[i][1]);
    }
    /* The whitelist stays usable. */
    recipe *r;
    k3rt_error err = {0};
    TU_OK(load_with("", "", "plan = { seq_len = math.floor(2 ^ 6) + #string.rep('a', 3) "
                            "+ select('#', 1, 2) + utf8.len('ab') + #table.concat({'x'}) },",
                    NULL, 0, &r, &err),
          err);
    same_json(at(recipe_json(r), "plan.seq_len"), "72");
    recipe_free(r);
}
END_TEST

START_TEST(test_bytecode_refused)
{
    static const char chunk[] = "\x1bLua\x54\x00\x19\x93\r\n\x1a\n\x04\x08\x08";
    k3rt_error err = {0};
    recipe *r = NULL;
    ck_assert_int_ne(recipe_load_string(chunk, "r.luac", &g_reg, NULL, 0, NULL, &r, &err),
                     K3RT_OK);
    has(&err, "r.luac: is a precompiled Lua chunk");
    char dir[512], path[600];
    tu_tmpdir(dir, sizeof dir);
    snprintf(path, sizeof path, "%s/compiled.lua", dir);
    FILE *f = fopen(path, "wb");
    ck_assert_ptr_nonnull(f);
    fwrite(chunk, 1, sizeof chunk - 1, f);
    fclose(f);
    ck_assert_int_ne(recipe_load(path, &g_reg, NULL, 0, NULL, &r, &err), K3RT_OK);
    has(&err, "is a precompiled Lua chunk; recipes are loaded as source text only");
    fs_remove_tree(dir, NULL);
}
END_TEST

START_TEST(test_runaway_loop_stopped)
{
    k3rt_error err = {0};
    recipe_limits lim = {0, 1000000, 0};
    ck_assert_int_eq(try_text("local n = 0\nwhile true do n = n + 1 end", NULL, 0, &lim, &err),
                     K3RT_ERR_LIMIT);
    has(&err, "recipe.lua:2: recipe exceeded its instruction budget of 1000000 instructions");
    /* Catching the error does not escape the budget. */
    ck_assert_int_eq(try_text("while true do pcall(function() while true do end end) end",
                              NULL, 0, &lim, &err),
                     K3RT_ERR_LIMIT);
    has(&err, "instruction budget");
    /* The default budget (1e8) stops it too. */
    double t0 = time_now();
    ck_assert_int_eq(try_text("while true do end", NULL, 0, NULL, &err), K3RT_ERR_LIMIT);
    has(&err, "budget of 100000000 instructions");
    ck_assert_msg(time_now() - t0 < 30, "the default budget took too long");
}
END_TEST

START_TEST(test_memory_bomb_stopped)
{
    k3rt_error err = {0};
    ck_assert_int_eq(try_text("local t = {}\nfor i = 1, 1e9 do t[i] = i end", NULL, 0, NULL,
                              &err),
                     K3RT_ERR_LIMIT);
    has(&err, "recipe.lua: recipe exceeded its memory limit of 64 MiB");
    recipe_limits lim = {4u << 20, 0, 0};
    ck_assert_int_eq(try_text("local s = string.rep('x', 1e9)", NULL, 0, &lim, &err),
                     K3RT_ERR_LIMIT);
    has(&err, "memory limit of 4 MiB");
    ck_assert_int_eq(try_text("local t = {}\nwhile true do t[#t + 1] = {} end", NULL, 0, &lim,
                              &err),
                     K3RT_ERR_LIMIT);
    has(&err, "memory limit");
}
END_TEST

START_TEST(test_overrides)
{
    static const char *const ov[] = {
        "model.mixers.A.heads=8",     "optimizer.lr=1e-3",
        "model.balancer=k3.fixture_balancer{ rate = 0.25 }",
        "plan.device=\"cpu\"",        "sample.bytes=10",
        "model.layers=6",             "model.ffn.top_k = 4",
        "train.changes={ { step = 3, balancer = k3.none{} } }",
    };
    recipe *r;
    k3rt_error err = {0};
    TU_OK(load_with("", "", "", ov, 8, &r, &err), err);
    const json_t *doc = recipe_json(r);
    same_json(at(doc, "model.mixers.A.config.heads"), "8");
    same_json(at(doc, "optimizer.lr"), "0.001");
    same_json(at(doc, "model.balancer.plugin"), "\"fixture_balancer\"");
    same_json(at(doc, "model.balancer.config"), "{\"rate\":0.25}");
    same_json(at(doc, "plan.device"), "\"cpu\"");
    same_json(at(doc, "sample.bytes"), "10");
    same_json(at(doc, "model.pattern"), "\"ABABAB\"");
    same_json(at(doc, "model.ffn.config.top_k"), "4");
    ck_assert_int_eq((int)json_array_size(at(doc, "train.changes")), 1);
    recipe_free(r);

    /* A required plugin option given only by --set. */
    static const char *const fill[] = {"model.ffn.experts=2"};
    TU_OK(recipe_load_string("return k3.recipe { model = { d_model = 8, vocab = 8, layers = 1,"
                             " mixers = { A = k3.fixture_mixer{} }, ffn = k3.fixture_ffn{},"
                             " residual = k3.fixture_residual{} },"
                             " optimizer = k3.fixture_opt{ lr = 1 }, data = { path = 'x' } }",
                             "recipe.lua", &g_reg, fill, 1, NULL, &r, &err),
          err);
    same_json(at(recipe_json(r), "model.ffn.config.experts"), "2");
    recipe_free(r);

    /* nil removes a key (back to its default). */
    static const char *const rm[] = {"model.mixers.A.heads=nil"};
    TU_OK(load_with("", "", "", rm, 1, &r, &err), err);
    same_json(at(recipe_json(r), "model.mixers.A.config.heads"), "4");
    recipe_free(r);
}
END_TEST

START_TEST(test_override_errors)
{
    const char *ov[1];
    ov[0] = "plan.device=cpu";
    fails("", "", "", ov, 1, "--set plan.device=cpu: 'cpu' is not a value; a string needs "
                             "quotes", "--set 'plan.device=\"cpu\"'");
    ov[0] = "model.mixers.A.head=8";
    fails("", "", "", ov, 1, "--set model.mixers.A.head=8: model.mixers.A (fixture_mixer): "
                             "unknown key 'head'; did you mean 'heads'?", NULL);
    ov[0] = "modle.d_model=8";
    fails("", "", "", ov, 1, "top level: unknown key 'modle'; did you mean 'model'?", NULL);
    ov[0] = "plan.db=2";
    fails("", "", "", ov, 1, "plan: unknown key 'db'; did you mean 'dp'?", NULL);
    ov[0] = "model.d_model.x=2";
    fails("", "", "", ov, 1, "model.d_model is a number, not a table", NULL);
    ov[0] = "model.mixers.C.heads=2";
    fails("", "", "", ov, 1, "model.mixers.C is not set in the recipe", NULL);
    ov[0] = "model.dense_ffn.top_k=2";
    fails("", "", "", ov, 1, "model.dense_ffn is not set in the recipe",
          "k3.NAME{...}");
    ov[0] = "model.mixers.A.heads=100";
    fails("", "", "", ov, 1, "--set model.mixers.A.heads=100: model.mixers.A (fixture_mixer): "
                             "key 'heads' must be in [1, 64], got 100", NULL);
    ov[0] = "model.mixers.A.heads=8 8";
    fails("", "", "", ov, 1, "--set model.mixers.A.heads:1:", "values are Lua expressions");
    ov[0] = "plan.dp";
    fails("", "", "", ov, 1, "--set plan.dp: expected key.path=value", NULL);
    ov[0] = "plan..dp=1";
    fails("", "", "", ov, 1, "is not a key path", NULL);
    ov[0] = "train.changes.x=1";
    fails("", "", "", ov, 1, "train.changes is a list", NULL);
    ov[0] = "model.balancer=k3.fixture_balancer{ rat = 1 }";
    fails("", "", "", ov, 1, "unknown key 'rat'; did you mean 'rate'?", NULL);
    ov[0] = "plan.dp=undefined_name + 1";
    fails("", "", "", ov, 1, "--set plan.dp:1: attempt to perform arithmetic on a nil value",
          NULL);
}
END_TEST

START_TEST(test_pattern_rules)
{
    fails("", "pattern = 'ABA'", "", NULL, 0,
          "model.pattern: has 3 letters, which does not divide model.layers (4)", NULL);
    fails("", "pattern = 'ABABAB'", "", NULL, 0, "which is more than model.layers (4)", NULL);
    fails("", "pattern = 'AC'", "", NULL, 0,
          "model.pattern: letter 'C' (position 2) has no entry in model.mixers (entries: A, B)",
          NULL);
    fails("", "pattern = 'AA'", "", NULL, 0, "model.mixers: entry 'B' is not used", NULL);
    fails("", "pattern = k3.none", "", NULL, 0, "model.pattern: required when model.mixers has "
                                               "2 entries (A, B)", "pattern = \"AB\"");
    fails("", "pattern = ''", "", NULL, 0, "model.pattern: is empty", NULL);
    fails("", "mixers = { AB = k3.fixture_mixer{} }", "", NULL, 0,
          "model.mixers: key 'AB' must be a single letter", NULL);

    recipe *r;
    k3rt_error err = {0};
    TU_OK(load_with("", "pattern = 'ABBA'", "", NULL, 0, &r, &err), err);
    same_json(at(recipe_json(r), "model.pattern"), "\"ABBA\"");
    recipe_free(r);
    TU_OK(recipe_load_string("return { model = { d_model = 8, vocab = 8, layers = 3,"
                             " mixers = { M = k3.fixture_mixer{} }, ffn = k3.fixture_ffn{"
                             " experts = 2 }, residual = k3.fixture_residual{} },"
                             " optimizer = k3.fixture_opt{ lr = 1 }, data = { path = 'x' } }",
                             "one.lua", &g_reg, NULL, 0, NULL, &r, &err),
          err);
    same_json(at(recipe_json(r), "model.pattern"), "\"MMM\"");
    recipe_free(r);

    /* K3's full-length form: 93 layers, MLA at layers 4, 8, ..., 92 and 93 (1-based). */
    char pattern[94], model[256];
    for (int i = 1; i <= 93; i++)
        pattern[i - 1] = (i % 4 == 0 || i == 93) ? 'B' : 'A';
    pattern[93] = '\0';
    snprintf(model, sizeof model, "pattern = '%s'", pattern);
    static const char *const ov[] = {"model.layers=93"};
    TU_OK(load_with("", model, "", ov, 1, &r, &err), err);
    const char *got = json_string_value(at(recipe_json(r), "model.pattern"));
    ck_assert_str_eq(got, pattern);
    int mla = 0;
    for (int i = 0; i < 93; i++)
        mla += got[i] == 'B';
    ck_assert_int_eq(mla, 24);
    ck_assert_int_eq(got[3], 'B');
    ck_assert_int_eq(got[92], 'B');
    ck_assert_int_eq(got[91], 'B');
    ck_assert_int_eq(got[90], 'A');
    recipe_free(r);
}
END_TEST

static const char *ON_STEP =
    "on_step = function(step, m)\n"                                        /* 9 */
    "  if step == 5 then\n"                                                /* 10 */
    "    return { balancer = k3.fixture_balancer{ rate = m.loss * m.nested.scale } }\n"
    "  elseif step == 6 then\n"
    "    return { balancr = k3.none{} }\n"
    "  elseif step == 7 then\n"
    "    return k3.none{}\n"
    "  elseif step == 8 then\n"
    "    while true do end\n"
    "  elseif step == 9 then\n"
    "    return { balancer = k3.fixture_balancer{ rat = 1 } }\n"           /* 19 */
    "  end\n"
    "end,\n";

START_TEST(test_on_step)
{
    recipe *r;
    k3rt_error err = {0};
    TU_OK(load_with("", "", ON_STEP, NULL, 0, &r, &err), err);
    same_json(at(recipe_json(r), "has_on_step"), "true");
    json_error_t je;
    json_t *metrics = json_loads("{\"loss\": 0.5, \"nested\": {\"scale\": 0.5}, \"tag\": \"x\","
                                 " \"ok\": true, \"list\": [1, 2]}", 0, &je);
    json_t *ch = NULL;
    TU_OK(recipe_on_step(r, 4, metrics, &ch, &err), err);
    ck_assert_ptr_null(ch);
    TU_OK(recipe_on_step(r, 5, metrics, &ch, &err), err);
    ck_assert_ptr_nonnull(ch);
    same_json(ch, "{\"balancer\":{\"plugin\":\"fixture_balancer\",\"kind\":\"balancer\","
                  "\"path\":null,\"config\":{\"rate\":0.25}}}");
    json_decref(ch);
    ck_assert_int_ne(recipe_on_step(r, 6, metrics, &ch, &err), K3RT_OK);
    has(&err, "recipe.lua:9: on_step result: unknown key 'balancr'; did you mean 'balancer'?");
    ck_assert_int_ne(recipe_on_step(r, 7, metrics, &ch, &err), K3RT_OK);
    has(&err, "on_step must return nil or a table");
    ck_assert_int_eq(recipe_on_step(r, 8, metrics, &ch, &err), K3RT_ERR_LIMIT);
    has(&err, "recipe.lua:17: recipe exceeded its instruction budget");
    ck_assert_int_ne(recipe_on_step(r, 9, metrics, &ch, &err), K3RT_OK);
    has(&err, "recipe.lua:19: on_step result: balancer (fixture_balancer): unknown key 'rat'");
    /* The state survives errors: the hook still works afterwards. */
    TU_OK(recipe_on_step(r, 5, metrics, &ch, &err), err);
    ck_assert_ptr_nonnull(ch);
    json_decref(ch);
    json_decref(metrics);
    recipe_free(r);

    TU_OK(load_with("", "", "", NULL, 0, &r, &err), err);
    TU_OK(recipe_on_step(r, 1, NULL, &ch, &err), err);
    ck_assert_ptr_null(ch);
    recipe_free(r);
}
END_TEST

START_TEST(test_hash_stable)
{
    static const char *text =
        "return { model = { d_model = 8, vocab = 8, layers = 1,"
        " mixers = { M = k3.fixture_mixer{} }, ffn = k3.fixture_ffn{ experts = 2 },"
        " residual = k3.fixture_residual{} }, optimizer = k3.fixture_opt{ lr = 1 },"
        " data = { path = 'x' } }\n";
    recipe *a, *b, *c;
    k3rt_error err = {0};
    TU_OK(recipe_load_string(text, "a.lua", &g_reg, NULL, 0, NULL, &a, &err), err);
    TU_OK(recipe_load_string(text, "b.lua", &g_reg, NULL, 0, NULL, &b, &err), err);
    static const char *const ov[] = {"plan.dp=2"};
    TU_OK(recipe_load_string(text, "c.lua", &g_reg, ov, 1, NULL, &c, &err), err);
    /* sha256 of `text`, computed independently. */
    ck_assert_str_eq(recipe_hash(a),
                     "98f864ae60ea61f07c12b98888f6f4e34796bbdb6b00d065355dfd3dc8b0c952");
    ck_assert_str_eq(recipe_hash(a), recipe_hash(b));
    ck_assert_str_eq(recipe_hash(a), recipe_hash(c)); /* the hash is of the file's text */
    recipe_free(c);
    char changed[512];
    snprintf(changed, sizeof changed, "%s-- a comment\n", text);
    TU_OK(recipe_load_string(changed, "a.lua", &g_reg, NULL, 0, NULL, &c, &err), err);
    ck_assert_str_ne(recipe_hash(a), recipe_hash(c));
    recipe_free(a);
    recipe_free(b);
    recipe_free(c);
}
END_TEST

START_TEST(test_plugin_by_path)
{
    char dir[512], link[600], path[600], fixture[1024];
    tu_tmpdir(dir, sizeof dir);
    snprintf(fixture, sizeof fixture, "%s/fixtures/recipe_fixture_balancer.so",
             K3RT_BINARY_DIR);
    snprintf(link, sizeof link, "%s/libmine.so", dir);
    ck_assert_int_eq(symlink(fixture, link), 0);
    snprintf(path, sizeof path, "%s/r.lua", dir);
    tu_write_file(path, "return { model = { d_model = 8, vocab = 8, layers = 1,\n"
                        "  mixers = { M = k3.fixture_mixer{} },\n"
                        "  ffn = k3.fixture_ffn{ experts = 2 },\n"
                        "  balancer = k3.plugin('libmine.so', { rate = 0.5 }),\n"
                        "  residual = k3.plugin('fixture_residual', {}) },\n"
                        "  optimizer = k3.fixture_opt{ lr = 1 }, data = { path = 'x' } }\n");
    recipe *r;
    k3rt_error err = {0};
    TU_OK(recipe_load(path, &g_reg, NULL, 0, NULL, &r, &err), err);
    const json_t *bal = at(recipe_json(r), "model.balancer");
    char real[4096];
    ck_assert_ptr_nonnull(realpath(fixture, real));
    same_json(at(bal, "plugin"), "\"fixture_balancer\"");
    ck_assert_str_eq(json_string_value(at(bal, "path")), real);
    same_json(at(bal, "config"), "{\"rate\":0.5}");
    const plugin_entry *e = recipe_spec_plugin(r, bal);
    ck_assert_ptr_nonnull(e);
    ck_assert_str_eq(e->path, real);
    same_json(at(recipe_json(r), "model.residual.path"), "null");
    same_json(at(recipe_json(r), "out"), "\"runs/r\"");
    recipe_free(r);

    tu_write_file(path, "\nlocal b = k3.plugin('missing.so', {})\nreturn {}\n");
    ck_assert_int_ne(recipe_load(path, &g_reg, NULL, 0, NULL, &r, &err), K3RT_OK);
    has(&err, "r.lua:2: k3.plugin:");
    has(&err, "plugin file does not exist");
    fs_remove_tree(dir, NULL);
}
END_TEST

START_TEST(test_spec_values_in_lua)
{
    recipe *r;
    k3rt_error err = {0};
    /* Specs are tables of their options, tagged; k3.none prints as such. */
    TU_OK(load_with("", "", "plan = { threads = (function()\n"
                            "  local s = k3.fixture_mixer{ heads = 3 }\n"
                            "  assert(getmetatable(s) == 'k3.spec' and s.heads == 3)\n"
                            "  assert(tostring(s) == 'k3.fixture_mixer{...}')\n"
                            "  assert(tostring(k3.none) == 'k3.none')\n"
                            "  assert(not pcall(setmetatable, s, nil))\n"
                            "  return 1 end)() },",
                    NULL, 0, &r, &err),
          err);
    same_json(at(recipe_json(r), "plan.threads"), "1");
    recipe_free(r);
}
END_TEST

/* With the real plugins built (dense_glu, mla, adamw, standard), the defaults resolve to them
 * and their options are checked the same way. */
START_TEST(test_real_plugins)
{
    if (!registry_find(&g_reg, "mla", K3RT_KIND_ATTENTION) ||
        !registry_find(&g_reg, "dense_glu", K3RT_KIND_MOE) ||
        !registry_find(&g_reg, "adamw", K3RT_KIND_OPTIMIZER) ||
        !registry_find(&g_reg, "standard", K3RT_KIND_RESIDUAL)) {
        fprintf(stderr, "test_real_plugins: mla/dense_glu/adamw/standard not built; skipped\n");
        return;
    }
    static const char *text =
        "return k3.recipe {\n"
        "  model = { d_model = 64, vocab = 256, layers = 2, dense_layers = 1,\n"
        "            mixers = { M = k3.mla{ heads = 2 } }, ffn = k3.dense_glu{} },\n"
        "  optimizer = k3.adamw{ lr = 1e-3 },\n"
        "  data = { path = 'x' },\n"
        "}\n";
    recipe *r;
    k3rt_error err = {0};
    TU_OK(recipe_load_string(text, "tiny.lua", &g_reg, NULL, 0, NULL, &r, &err), err);
    const json_t *doc = recipe_json(r);
    same_json(at(doc, "model.residual.plugin"), "\"standard\"");
    same_json(at(doc, "model.dense_ffn.plugin"), "\"dense_glu\"");
    same_json(at(doc, "model.mixers.M.config.heads"), "2");
    ck_assert_ptr_nonnull(at(doc, "optimizer.config.weight_decay"));
    recipe_free(r);
    static const char *const ov[] = {"model.mixers.M.head=4"};
    ck_assert_int_ne(recipe_load_string(text, "tiny.lua", &g_reg, ov, 1, NULL, &r, &err),
                     K3RT_OK);
    has(&err, "model.mixers.M (mla): unknown key 'head'; did you mean 'heads'?");
}
END_TEST

START_TEST(test_dense_default_missing)
{
    if (registry_find(&g_reg, "dense_glu", K3RT_KIND_MOE))
        return; /* the default exists: nothing to refuse */
    fails("", "dense_layers = 1", "", NULL, 0, "model.dense_ffn (default dense_glu{})",
          "no moe plugin named 'dense_glu'");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("recipe");
    TCase *tc = tcase_create("recipe");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_set_timeout(tc, 120);
    tcase_add_test(tc, test_good_recipe_document);
    tcase_add_test(tc, test_sections_as_given);
    tcase_add_test(tc, test_misspelt_keys);
    tcase_add_test(tc, test_wrong_types_and_ranges);
    tcase_add_test(tc, test_lua_errors_carry_lines);
    tcase_add_test(tc, test_escapes_refused);
    tcase_add_test(tc, test_bytecode_refused);
    tcase_add_test(tc, test_runaway_loop_stopped);
    tcase_add_test(tc, test_memory_bomb_stopped);
    tcase_add_test(tc, test_overrides);
    tcase_add_test(tc, test_override_errors);
    tcase_add_test(tc, test_pattern_rules);
    tcase_add_test(tc, test_on_step);
    tcase_add_test(tc, test_hash_stable);
    tcase_add_test(tc, test_plugin_by_path);
    tcase_add_test(tc, test_spec_values_in_lua);
    tcase_add_test(tc, test_real_plugins);
    tcase_add_test(tc, test_dense_default_missing);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
