/* `k3rt check-plugin`: every in-tree plugin passes it, and each deliberately flawed fixture
 * fails it on the check that owns the flaw (a harness that cannot fail proves nothing). */
#include <dirent.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"

#define FIXTURES K3RT_BINARY_DIR "/fixtures/"

/* Runs check-plugin; returns the exit status and the report in *out. */
static int check(const char *target, const char *extra, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s check-plugin %s %s", tu_k3rt_bin(), target, extra);
    return tu_run(cmd, out);
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

START_TEST(every_in_tree_plugin_passes)
{
    DIR *d = opendir(K3RT_PLUGIN_DIR);
    ck_assert_msg(d != NULL, "cannot list %s", K3RT_PLUGIN_DIR);
    char *names[256];
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)) && n < 256) {
        size_t len = strlen(e->d_name);
        if (len > 3 && !strcmp(e->d_name + len - 3, ".so"))
            names[n++] = strdup(e->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_str);
    ck_assert_int_ge(n, 11);  /* attention 2, moe 2, balancer 3, optimizer 2, residual 2 */
    for (int i = 0; i < n; i++) {
        char path[1024], *out = NULL;
        snprintf(path, sizeof path, "%s/%s", K3RT_PLUGIN_DIR, names[i]);
        int rc = check(path, "", &out);
        printf("%s", out);
        ck_assert_msg(rc == 0 && strstr(out, "result: PASS"), "%s failed check-plugin (%d):\n%s",
                      names[i], rc, out);
        ck_assert_msg(!strstr(out, "FAIL"), "%s", out);
        free(out);
        free(names[i]);
    }
}
END_TEST

/* fixture, options, the check that must fail, a phrase of its message */
static const struct {
    const char *file, *extra, *check, *says;
} flaws[] = {
    {"shift_bad_grad.so", "--config '{\"init_std\": 0.3}'", "FAIL  gradients", "relative error"},
    {"shift_bad_grad.so", "--config '{\"init_std\": 0.3}'", "FAIL  contract",
     "must accumulate"},
    {"shift_nondet.so", "--config '{\"init_std\": 0.3}'", "FAIL  determinism",
     "a repeated call differs"},
    {"shift_no_flops.so", "--config '{\"init_std\": 0.3}'", "FAIL  flops", "no flops()"},
    {"shift_accumulate.so", "--config '{\"init_std\": 0.3}'", "FAIL  contract",
     "y is not finite"},
    {"shift_crash.so", "--config '{\"init_std\": 0.3}'", "FAIL  mixer",
     "the plugin crashed: signal"},
    {"shift_mixer.so", "", "FAIL  config", "missing required key 'init_std'"},
    {"shift_bad_decode.so", "--config '{\"init_std\": 0.3}'", "FAIL  decode",
     "worst relative rms against forward's y"},
    {"bad_norm_residual.so", "", "FAIL  fused norm", "worst relative rms"},
    {"leaky_state.so", "", "FAIL  state()", "diverges from the original"},
    {"leaky_wrong_sign.so", "", "FAIL  update", "moved with the load"},
    {"leaky_local.so", "", "FAIL  data parallel", "different biases"},
    {"wrong_major.so", "", "FAIL  load", "upgrade k3rt, or rebuild the plugin"},
    {"abi1_plugin.so", "", "FAIL  load", "rebuild it against this k3rt's SDK"},
    {"newer_minor.so", "", "FAIL  load", "newer than this k3rt's ABI"},
};

START_TEST(each_flaw_fails_its_check)
{
    char path[1024], *out = NULL;
    snprintf(path, sizeof path, FIXTURES "%s", flaws[_i].file);
    int rc = check(path, flaws[_i].extra, &out);
    ck_assert_msg(rc == 1, "%s: expected exit 1, got %d:\n%s", flaws[_i].file, rc, out);
    const char *line = strstr(out, flaws[_i].check);
    ck_assert_msg(line != NULL, "%s: no '%s' line:\n%s", flaws[_i].file, flaws[_i].check, out);
    const char *eol = strchr(line, '\n');
    char *says = strstr(line, flaws[_i].says);
    ck_assert_msg(says && (!eol || says < eol), "%s: the %s line does not say '%s':\n%s",
                  flaws[_i].file, flaws[_i].check, flaws[_i].says, out);
    ck_assert_msg(strstr(out, "result: FAIL"), "%s", out);
    free(out);
}
END_TEST

START_TEST(the_same_plugin_without_the_flaw_passes)
{
    char *out = NULL;
    int rc = check(FIXTURES "shift_mixer.so", "--config '{\"init_std\": 0.3}'", &out);
    ck_assert_msg(rc == 0 && strstr(out, "result: PASS"), "%s", out);
    free(out);
    /* with a recurrent state and the ABI 2.0 decode(): the state and decode checks pass */
    rc = check(FIXTURES "shift_state.so", "--config '{\"init_std\": 0.3}'", &out);
    ck_assert_msg(rc == 0 && strstr(out, "PASS  state") && strstr(out, "PASS  decode") &&
                  strstr(out, "result: PASS"), "%s", out);
    free(out);
    /* a name on the search path works as well as a path; usage errors exit 2 */
    rc = check("mla", "--seq 4", &out);
    ck_assert_msg(rc == 0 && strstr(out, "mla 1.0.0: attention"), "%s", out);
    free(out);
    rc = check("mla", "--seq 0", &out);
    ck_assert_int_eq(rc, 2);
    free(out);
    rc = check("mla", "--config '{not json'", &out);
    ck_assert_msg(rc == 2 && strstr(out, "not a JSON object"), "%s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("check_plugin");
    TCase *tc = tcase_create("check_plugin");
    tcase_set_timeout(tc, 600);
    tcase_add_test(tc, every_in_tree_plugin_passes);
    tcase_add_loop_test(tc, each_flaw_fails_its_check, 0, sizeof flaws / sizeof flaws[0]);
    tcase_add_test(tc, the_same_plugin_without_the_flaw_passes);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
