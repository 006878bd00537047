/* The plugin SDK as a third party meets it: `cmake --install` into a prefix that is then moved
 * elsewhere (the tree must be relocatable), both examples of sdk/examples built out of tree
 * against it — with find_package(k3rt) and with pkg-config — checked by the installed
 * `k3rt check-plugin`, and a model trained with them loaded by path from a recipe. */
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "testutil/testutil.h"
#include "train/safetensors.h"

#ifndef K3RT_INSTALL_LIBDIR
#define K3RT_INSTALL_LIBDIR "lib"
#endif

static char g_tmp[512], g_prefix[1024];
static char *g_setup_log;  /* what failed in setup, NULL when it all worked */

static void run_ok(const char *what, const char *cmd)
{
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0, "%s failed (%d): %s\n%s", what, rc, cmd, out);
    free(out);
}

static void expect_file(const char *rel)
{
    char path[2048];
    struct stat st;
    snprintf(path, sizeof path, "%s/%s", g_prefix, rel);
    ck_assert_msg(stat(path, &st) == 0, "the install lacks %s", rel);
}

/* Runs one setup command; on failure keeps its output for the tests to report. */
static int setup_step(const char *what, const char *cmd)
{
    char *out = NULL;
    int rc = tu_run(cmd, &out);
    if (rc != 0 && !g_setup_log) {
        size_t len = strlen(what) + strlen(cmd) + (out ? strlen(out) : 0) + 64;
        g_setup_log = malloc(len);
        if (g_setup_log)
            snprintf(g_setup_log, len, "%s failed (%d): %s\n%s", what, rc, cmd, out ? out : "");
    }
    free(out);
    return rc == 0;
}

/* Once, in the runner before the tests fork: install into a staging prefix and move it to its
 * final place (the tree must be relocatable), then build both examples with CMake (their own
 * ctest runs check-plugin) and with pkg-config. */
static void setup(void)
{
    /* ctest points K3RT_PLUGIN_PATH at the build tree; the install must stand on its own */
    unsetenv("K3RT_PLUGIN_PATH");
    tu_tmpdir(g_tmp, sizeof g_tmp);
    snprintf(g_prefix, sizeof g_prefix, "%s/prefix", g_tmp);
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "cmake --install %s --prefix %s/stage >/dev/null && mv %s/stage "
             "%s", K3RT_BINARY_DIR, g_tmp, g_tmp, g_prefix);
    if (!setup_step("cmake --install", cmd))
        return;
    const char *examples[2][2] = {{"sliding_window", "plugin.c core_f32.c core_f64.c"},
                                  {"proportional", "plugin.c"}};
    for (int i = 0; i < 2; i++) {
        const char *name = examples[i][0];
        snprintf(cmd, sizeof cmd,
                 "cmake -S %s/sdk/examples/%s -B %s/cmake-%s -DCMAKE_PREFIX_PATH=%s "
                 "-DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build %s/cmake-%s && "
                 "ctest --test-dir %s/cmake-%s --output-on-failure",
                 tu_source_dir(), name, g_tmp, name, g_prefix, g_tmp, name, g_tmp, name);
        if (!setup_step("the CMake build of an example", cmd))
            return;
        snprintf(cmd, sizeof cmd,
                 "mkdir -p %s/pc && cd %s/sdk/examples/%s && "
                 "PKG_CONFIG_PATH=%s/" K3RT_INSTALL_LIBDIR "/pkgconfig && export PKG_CONFIG_PATH "
                 "&& cc -std=c11 -O2 -Wall -Wextra -Werror -shared -fPIC -fvisibility=hidden "
                 "-o %s/pc/lib%s.so %s $(pkg-config --cflags --libs k3rt) -lm",
                 g_tmp, tu_source_dir(), name, g_prefix, g_tmp, name, examples[i][1]);
        if (!setup_step("the pkg-config build of an example", cmd))
            return;
    }
}

static void teardown(void)
{
    free(g_setup_log);
    g_setup_log = NULL;
}

#define SETUP_OK() ck_assert_msg(!g_setup_log, "%s", g_setup_log)

START_TEST(install_layout_is_complete_and_relocatable)
{
    SETUP_OK();
    const char *files[] = {
        "bin/k3rt",
        K3RT_INSTALL_LIBDIR "/libk3rt.so",
        "include/k3rt/k3rt.h", "include/k3rt/plugin.h", "include/k3rt/ops.h",
        "include/k3rt/tensor.h", "include/k3rt/stream.h", "include/k3rt/comm.h",
        "include/k3rt/errors.h", "include/k3rt/config.h", "include/k3rt/random.h",
        K3RT_INSTALL_LIBDIR "/cmake/k3rt/k3rtConfig.cmake",
        K3RT_INSTALL_LIBDIR "/cmake/k3rt/k3rtConfigVersion.cmake",
        K3RT_INSTALL_LIBDIR "/cmake/k3rt/k3rtTargets.cmake",
        K3RT_INSTALL_LIBDIR "/cmake/k3rt/k3rtPlugin.cmake",
        K3RT_INSTALL_LIBDIR "/pkgconfig/k3rt.pc",
        K3RT_INSTALL_LIBDIR "/k3rt/plugins/libk3rt_kda.so",
        K3RT_INSTALL_LIBDIR "/k3rt/plugins/libk3rt_quantile.so",
        "share/k3rt/data/tinyshakespeare.txt",
    };
    for (size_t i = 0; i < sizeof files / sizeof files[0]; i++)
        expect_file(files[i]);
    /* The moved tree runs and finds its own plugins, not the build tree's. */
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s/bin/k3rt plugins", g_prefix);
    int rc = tu_run(cmd, &out);
    char want[1200];
    snprintf(want, sizeof want, "%s/" K3RT_INSTALL_LIBDIR "/k3rt/plugins/libk3rt_mla.so",
             g_prefix);
    ck_assert_msg(rc == 0 && strstr(out, want), "the moved install does not list its own "
                  "plugins (%d):\n%s", rc, out);
    ck_assert_msg(!strstr(out, K3RT_PLUGIN_DIR), "the install picked up build-tree plugins:\n%s",
                  out);
    free(out);
    snprintf(cmd, sizeof cmd, "PKG_CONFIG_PATH=%s/" K3RT_INSTALL_LIBDIR "/pkgconfig pkg-config "
             "--cflags --libs k3rt", g_prefix);
    rc = tu_run(cmd, &out);
    ck_assert_msg(rc == 0 && strstr(out, "-lk3rt") && strstr(out, g_prefix), "%s", out);
    free(out);
}
END_TEST

START_TEST(examples_build_both_ways_and_pass_the_harness)
{
    SETUP_OK();
    const char *builds[4][2] = {
        {"cmake-sliding_window/libsliding_window.so", "{\"heads\": 2, \"window\": 3}"},
        {"pc/libsliding_window.so", "{\"heads\": 4, \"head_dim\": 3, \"window\": 5}"},
        {"cmake-proportional/libproportional.so", "{}"},
        {"pc/libproportional.so", "{\"step\": 0.1}"},
    };
    for (int i = 0; i < 4; i++) {
        char cmd[4096], *out = NULL;
        snprintf(cmd, sizeof cmd, "%s/bin/k3rt check-plugin %s/%s --config '%s' --seq 11",
                 g_prefix, g_tmp, builds[i][0], builds[i][1]);
        int rc = tu_run(cmd, &out);
        printf("%s", out);
        ck_assert_msg(rc == 0 && strstr(out, "result: PASS") && !strstr(out, "FAIL"),
                      "%s failed the harness (%d):\n%s", builds[i][0], rc, out);
        free(out);
        /* exactly one exported symbol */
        snprintf(cmd, sizeof cmd, "nm -D --defined-only %s/%s | grep -c ' T '", g_tmp,
                 builds[i][0]);
        rc = tu_run(cmd, &out);
        ck_assert_msg(rc == 0 && atoi(out) == 1, "%s exports %s functions", builds[i][0], out);
        free(out);
    }
}
END_TEST

/* y at token t sees tokens t - window + 1 .. t only: changing token 0 changes rows 0..w-1 of
 * y and leaves every later row bit for bit. */
START_TEST(sliding_window_sees_only_its_window)
{
    SETUP_OK();
    enum { T = 12, D = 8, W = 4 };
    static double x[T * D];
    tu_randn(x, T * D, 1.0, 21);
    char in[1200], out[2][1200], cmd[4096];
    const st_file *y[2];
    st_file *f[2];
    k3rt_error err = {0};
    for (int pass = 0; pass < 2; pass++) {
        if (pass)
            for (int i = 0; i < D; i++)
                x[i] += 0.5;
        snprintf(in, sizeof in, "%s/window_in%d.safetensors", g_tmp, pass);
        snprintf(out[pass], sizeof out[pass], "%s/window_out%d.safetensors", g_tmp, pass);
        st_entry e = {"x", K3RT_F64, 3, {1, T, D, 0}, x};
        TU_OK(st_write(in, &e, 1, NULL, &err), err);
        snprintf(cmd, sizeof cmd, "%s/bin/k3rt op %s/pc/libsliding_window.so --config "
                 "'{\"heads\": 2, \"window\": %d}' --in %s --out %s --seed 5", g_prefix, g_tmp,
                 W, in, out[pass]);
        run_ok("k3rt op", cmd);
        TU_OK(st_open(out[pass], &f[pass], &err), err);
        y[pass] = f[pass];
    }
    const double *y0 = st_find(y[0], "y")->data, *y1 = st_find(y[1], "y")->data;
    for (int t = 0; t < T; t++) {
        int same = !memcmp(y0 + t * D, y1 + t * D, D * sizeof(double));
        ck_assert_msg(t < W ? !same : same, "row %d of y %s after changing token 0 (window %d)",
                      t, same ? "did not change" : "changed", W);
    }
    st_close(f[0]);
    st_close(f[1]);
}
END_TEST

/* maxvio_worst of each logged step from <out>/metrics.jsonl; returns how many. */
static int maxvio(const char *out, double *v, int max)
{
    char path[1200], line[65536];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    int n = 0;
    while (n < max && fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        json_t *m = j ? json_object_get(j, "maxvio_worst") : NULL;
        if (m)
            v[n++] = json_number_value(m);
        json_decref(j);
    }
    fclose(f);
    return n;
}

/* The recipe loads both plugins by path (relative to its folder); `balancer` is swapped for
 * the built-in none to show the balancer at work. */
static void train(const char *balancer, const char *run, char **log)
{
    char dir[1200], recipe[1300], text[4096], cmd[4096];
    snprintf(dir, sizeof dir, "%s/run", g_tmp);
    mkdir(dir, 0755);
    snprintf(recipe, sizeof recipe, "%s/recipe.lua", dir);
    snprintf(text, sizeof text,
             "return k3.recipe {\n"
             "  model = { d_model = 32, vocab = 256, layers = 2,\n"
             "    mixers = { S = k3.plugin('../pc/libsliding_window.so', "
             "{ heads = 2, window = 16 }) },\n"
             "    ffn = k3.latent_moe { experts = 4, top_k = 2, latent = 16, expert_hidden = 32,\n"
             "                          shared = 1, shared_hidden = 32 },\n"
             "    balancer = k3.plugin('../cmake-proportional/libproportional.so', "
             "{ step = 0.01 }) },\n"
             "  optimizer = k3.adamw { lr = 3e-3 },\n"
             "  plan = { micro_batch = 8, seq_len = 32, threads = 1 },\n"
             "  train = { steps = 40, warmup = 5, seed = 1, eval_interval = 0,\n"
             "            checkpoint_interval = 40, log_interval = 1 },\n"
             "  data = { path = '%s/share/k3rt/data/tinyshakespeare.txt', tokenizer = 'bytes' },\n"
             "}\n", g_prefix);
    tu_write_file(recipe, text);
    snprintf(cmd, sizeof cmd, "cd %s && %s/bin/k3rt train recipe.lua --out %s --quiet "
             "--no-sample %s", dir, g_prefix, run, balancer);
    int rc = tu_run(cmd, log);
    ck_assert_msg(rc == 0, "training failed (%d):\n%s", rc, *log);
}

START_TEST(a_model_trains_with_both_plugins)
{
    SETUP_OK();
    char with[1200], without[1200], *log = NULL;
    snprintf(with, sizeof with, "%s/with", g_tmp);
    snprintf(without, sizeof without, "%s/without", g_tmp);
    train("", with, &log);
    free(log);
    train("--set 'model.balancer=k3.none{}'", without, &log);
    free(log);
    double loss[48] = {0};
    ck_assert_int_eq(tu_metrics_losses(with, loss, 48), 40);
    double last = (loss[36] + loss[37] + loss[38] + loss[39] + loss[40]) / 5;
    printf("sdk recipe: loss %.4f at step 1, %.4f over steps 36-40\n", loss[1], last);
    ck_assert_msg(loss[1] > 5.0 && loss[1] - last > 1.0, "loss fell only from %.4f to %.4f",
                  loss[1], last);
    /* the proportional balancer evens the load out compared with no balancing */
    double a[48], b[48];
    ck_assert_int_eq(maxvio(with, a, 48), 40);
    ck_assert_int_eq(maxvio(without, b, 48), 40);
    double va = 0, vb = 0;
    for (int i = 30; i < 40; i++)
        va += a[i] / 10, vb += b[i] / 10;
    printf("sdk recipe: mean worst max violation over steps 31-40: %.3f proportional, %.3f "
           "none\n", va, vb);
    ck_assert_msg(va < 0.5 * vb, "proportional %.3f against none %.3f", va, vb);
    char state[1400];
    snprintf(state, sizeof state, "%s/checkpoints/step_00000040/state.safetensors", with);
    st_file *f = NULL;
    k3rt_error err = {0};
    TU_OK(st_open(state, &f, &err), err);
    const st_entry *bias = st_find(f, "layers.1.balancer.bias");
    ck_assert_msg(bias && bias->ndim == 1 && bias->shape[0] == 4, "no balancer state saved");
    st_close(f);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("sdk");
    TCase *tc = tcase_create("sdk");
    tcase_set_timeout(tc, 600);
    tcase_add_unchecked_fixture(tc, setup, teardown);
    tcase_add_test(tc, install_layout_is_complete_and_relocatable);
    tcase_add_test(tc, examples_build_both_ways_and_pass_the_harness);
    tcase_add_test(tc, sliding_window_sees_only_its_window);
    tcase_add_test(tc, a_model_trains_with_both_plugins);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
