/* Ablation suite files (core/ablate/suite.h): what a valid one yields and what each mistake
 * says. */
#include <string.h>

#include "ablate/suite.h"
#include "testutil/testutil.h"

static char g_dir[512];

static int load(const char *text, ablate_suite *s, k3rt_error *err)
{
    char path[600];
    if (!g_dir[0])
        tu_tmpdir(g_dir, sizeof g_dir);
    snprintf(path, sizeof path, "%s/suite.lua", g_dir);
    tu_write_file(path, text);
    memset(err, 0, sizeof *err);
    return suite_load(path, s, err);
}

START_TEST(test_valid_suite)
{
    ablate_suite s;
    k3rt_error err;
    if (!g_dir[0])
        tu_tmpdir(g_dir, sizeof g_dir);
    TU_OK(load("local steps = 100\n"
               "return { base = '../recipes/tiny.lua', description = 'd',\n"
               "  set = { 'train.steps=' .. steps },\n"
               "  variants = { { name = 'all-mla', set = { \"model.pattern='M'\", "
               "'model.mixers.K=nil' } },\n"
               "               { name = 'v2' } } }\n",
               &s, &err),
          err);
    ck_assert_str_eq(s.name, "suite");
    char base[700];
    snprintf(base, sizeof base, "%s/../recipes/tiny.lua", g_dir);
    ck_assert_str_eq(s.base, base);
    ck_assert_str_eq(s.description, "d");
    ck_assert_int_eq(s.n_sets, 1);
    ck_assert_str_eq(s.sets[0], "train.steps=100");
    ck_assert_int_eq(s.n_variants, 3);
    ck_assert_str_eq(s.variants[0].name, "base");
    ck_assert_int_eq(s.variants[0].n_sets, 0);
    ck_assert_str_eq(s.variants[1].name, "all-mla");
    ck_assert_int_eq(s.variants[1].n_sets, 2);
    ck_assert_str_eq(s.variants[1].sets[1], "model.mixers.K=nil");
    ck_assert_int_eq(s.variants[2].n_sets, 0);
    suite_free(&s);
    TU_OK(load("return { name = 'x', base = '/abs/r.lua', base_name = 'std', "
               "variants = { { name = 'a' } } }",
               &s, &err),
          err);
    ck_assert_str_eq(s.name, "x");
    ck_assert_str_eq(s.base, "/abs/r.lua");
    ck_assert_str_eq(s.variants[0].name, "std");
    suite_free(&s);
}
END_TEST

START_TEST(test_seeds_and_runs)
{
    ablate_suite s;
    k3rt_error err;
    TU_OK(load("return { base = 'r.lua', base_name = 'k3', set = { 'train.steps=5' },\n"
               "  seeds = { 3, 1, 7 }, runs = 'out/shared',\n"
               "  variants = { { name = 'v', set = { 'model.layers=2' } } } }\n",
               &s, &err),
          err);
    ck_assert_int_eq(s.n_seeds, 3);
    ck_assert_str_eq(s.runs, "out/shared");
    /* the first seed for every run, after the suite's own overrides */
    ck_assert_int_eq(s.n_sets, 2);
    ck_assert_str_eq(s.sets[1], "train.seed=3");
    /* the base, its replicas under the other seeds, then the variants */
    ck_assert_int_eq(s.n_variants, 4);
    const char *names[] = {"k3", "k3-seed1", "k3-seed7", "v"};
    const long long seeds[] = {3, 1, 7};
    for (int i = 0; i < 4; i++)
        ck_assert_str_eq(s.variants[i].name, names[i]);
    for (int i = 0; i < 3; i++) {
        ck_assert_int_eq(s.variants[i].seed, seeds[i]);
        ck_assert_int_eq(s.variants[i].replica, i > 0);
    }
    ck_assert_int_eq(s.variants[0].n_sets, 0);
    ck_assert_int_eq(s.variants[2].n_sets, 1);
    ck_assert_str_eq(s.variants[2].sets[0], "train.seed=7");
    ck_assert_int_eq(s.variants[3].replica, 0);
    suite_free(&s);
    /* without seeds: no seed override, no replicas */
    TU_OK(load("return { base = 'r.lua', variants = { { name = 'v' } } }", &s, &err), err);
    ck_assert_int_eq(s.n_seeds, 0);
    ck_assert_int_eq(s.n_sets, 0);
    ck_assert_int_eq(s.n_variants, 2);
    ck_assert_str_eq(s.runs, "");
    suite_free(&s);
}
END_TEST

static void fails(const char *text, const char *needle)
{
    ablate_suite s;
    k3rt_error err;
    ck_assert_int_ne(load(text, &s, &err), K3RT_OK);
    ck_assert_msg(strstr(err.msg, needle), "expected '%s' in: %s", needle, err.msg);
}

START_TEST(test_mistakes)
{
    fails("return { bse = 'r.lua', variants = { { name = 'a' } } }",
          "unknown key 'bse'; did you mean 'base'?");
    fails("return { variants = { { name = 'a' } } }", "key 'base' expects a non-empty string");
    fails("return { base = 'r.lua' }", "key 'variants' expects a non-empty list");
    fails("return { base = 'r.lua', variants = { { name = 'a' }, { name = 'a' } } }",
          "name 'a' is used twice");
    fails("return { base = 'r.lua', variants = { { name = 'base' } } }",
          "name 'base' is used twice");
    fails("return { base = 'r.lua', variants = { { name = 'a/b' } } }", "names a folder");
    fails("return { base = 'r.lua', variants = { { name = 'a', set = { 'model.layers' } } } }",
          "suite.variants[1].set[1]: expected \"key.path=value\"");
    fails("return { base = 'r.lua', set = 'x=1', variants = { { name = 'a' } } }",
          "suite.set: expected a list");
    fails("return { base = 'r.lua', variants = { { name = 'a', sett = {} } } }",
          "did you mean 'set'?");
    fails("return { base = 'r.lua', seeds = { 1, 1 }, variants = { { name = 'a' } } }",
          "suite.seeds[2]: seed 1 is listed twice");
    fails("return { base = 'r.lua', seeds = { 1, 'x' }, variants = { { name = 'a' } } }",
          "suite.seeds[2]: expected a non-negative integer");
    fails("return { base = 'r.lua', seeds = { 1.5 }, variants = { { name = 'a' } } }",
          "suite.seeds[1]: expected a non-negative integer");
    fails("return { base = 'r.lua', seeds = {}, variants = { { name = 'a' } } }",
          "key 'seeds' expects a list of 1 to 16 integers");
    fails("return { base = 'r.lua', seeds = 2, variants = { { name = 'a' } } }",
          "key 'seeds' expects a list");
    fails("return { base = 'r.lua', seeds = { 1, 2 }, variants = { { name = 'base-seed2' } } }",
          "name 'base-seed2' is used twice");
    fails("return { base = 'r.lua', runs = 3, variants = { { name = 'a' } } }",
          "key 'runs' expects a non-empty string");
    fails("return { base = 'r.lua', seed = { 1 }, variants = { { name = 'a' } } }",
          "did you mean 'seeds'?");
    fails("return 3", "a suite must return a table");
    fails("return {", "suite.lua:1:");
    fails("while true do end", "instruction budget");
}
END_TEST

int main(void)
{
    Suite *s = suite_create("ablate_suite");
    TCase *tc = tcase_create("suite");
    tcase_add_test(tc, test_valid_suite);
    tcase_add_test(tc, test_seeds_and_runs);
    tcase_add_test(tc, test_mistakes);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
