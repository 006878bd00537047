/* Helpers shared by the Check suites (testutil.h). */
#include "testutil/testutil.h"

#include <jansson.h>

#include "plugin/registry.h"
#include "train/safetensors.h"

#include <math.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>

void tu_tmpdir(char *buf, size_t len)
{
    const char *base = getenv("TMPDIR");
    snprintf(buf, len, "%s/k3rt_test_XXXXXX", base && *base ? base : "/tmp");
    ck_assert_msg(mkdtemp(buf) != NULL, "mkdtemp failed for %s", buf);
}

int tu_run(const char *cmd, char **out)
{
    char full[8192];
    snprintf(full, sizeof full, "%s 2>&1", cmd);
    FILE *p = popen(full, "r");
    if (!p)
        return -1;
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t got;
    while (buf && (got = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += got;
        if (cap - n < 2048) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    int status = pclose(p);
    if (buf)
        buf[n] = '\0';
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

const char *tu_k3rt_bin(void)
{
    const char *env = getenv("K3RT_BIN");
    return env && *env ? env : K3RT_BINARY_DIR "/bin/k3rt";
}

const char *tu_source_dir(void)
{
    const char *env = getenv("K3RT_SOURCE_DIR");
    return env && *env ? env : K3RT_SOURCE_DIR;
}

void tu_write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "wb");
    ck_assert_msg(f != NULL, "cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static int fail_count;
static char fail_first[600];

void tu_fail_later(const char *fmt, ...)
{
    char msg[600];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    printf("FAILED: %s\n", msg);
    if (fail_count++ == 0)
        snprintf(fail_first, sizeof fail_first, "%s", msg);
}

void tu_failures_reset(void) { fail_count = 0; }

void tu_expect_no_failures(void)
{
    int n = fail_count;
    fail_count = 0;
    ck_assert_msg(n == 0, "%d checks failed; the first: %s", n, fail_first);
}

double tu_rel_rms(const double *ref, const double *x, int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        num += (ref[i] - x[i]) * (ref[i] - x[i]);
        den += ref[i] * ref[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

void tu_randn(double *x, int64_t n, double scale, uint64_t seed)
{
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 0);
    for (int64_t i = 0; i < n; i++)
        x[i] = scale * k3rt_rng_normal(&rng);
}

void tu_randnf(float *x, int64_t n, double scale, uint64_t seed)
{
    k3rt_rng rng;
    k3rt_rng_seed(&rng, seed, 0);
    for (int64_t i = 0; i < n; i++)
        x[i] = (float)(scale * k3rt_rng_normal(&rng));
}

k3rt_stream *tu_cpu_stream(int threads)
{
    /* Also used from main(), outside any test, so it cannot use ck_assert. */
    k3rt_stream *s = NULL;
    k3rt_error err = {0};
    if (k3rt_stream_create(K3RT_DEVICE_CPU, K3RT_STREAM_COMPUTE, &s, &err) != K3RT_OK) {
        fprintf(stderr, "cannot create a CPU stream: %s\n", err.msg);
        exit(1);
    }
    k3rt_stream_set_threads(s, threads);
    return s;
}

int tu_run_suite(Suite *s)
{
    SRunner *sr = srunner_create(s);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}

int tu_has_cuda_device(void)
{
    if (k3rt_cuda_device_count() > 0)
        return 1;
    printf("no CUDA device: skipped\n");
    return 0;
}

int tu_run_gpu_suite(Suite *(*make)(void), k3rt_stream **stream)
{
    if (!tu_has_cuda_device())
        return 77;
    k3rt_error err = {0};
    if (stream && k3rt_stream_create(0, K3RT_STREAM_COMPUTE, stream, &err) != K3RT_OK) {
        fprintf(stderr, "cannot create a CUDA stream: %s\n", err.msg);
        return 1;
    }
    SRunner *sr = srunner_create(make());
    srunner_set_fork_status(sr, CK_NOFORK);
    srunner_run_all(sr, CK_VERBOSE);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    if (stream)
        k3rt_stream_destroy(*stream);
    return failed == 0 ? 0 : 1;
}

const char *tu_python_with_numpy(void)
{
    const char *env = getenv("K3RT_PYTHON");
    const char *candidates[] = {env && *env ? env : "python3", "python3", "/usr/bin/python3"};
    for (size_t i = 0; i < sizeof candidates / sizeof candidates[0]; i++) {
        char cmd[1024];
        snprintf(cmd, sizeof cmd, "'%s' -c 'import numpy' 2>/dev/null", candidates[i]);
        if (tu_run(cmd, NULL) == 0)
            return candidates[i];
    }
    return NULL;
}

int tu_metrics_losses(const char *out, double *loss, int max)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    char line[65536];
    int n = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        ck_assert_msg(j != NULL, "bad metrics line: %s", line);
        int64_t step = json_integer_value(json_object_get(j, "step"));
        if (step > 0 && step < max && json_object_get(j, "loss")) {
            loss[step] = json_real_value(json_object_get(j, "loss"));
            n = step > n ? (int)step : n;
        }
        json_decref(j);
    }
    fclose(f);
    return n;
}

double tu_metrics_final_val_loss(const char *out)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    char line[65536];
    double val = NAN;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        ck_assert_msg(j != NULL, "bad metrics line: %s", line);
        if (json_is_number(json_object_get(j, "val_loss")))
            val = json_number_value(json_object_get(j, "val_loss"));
        json_decref(j);
    }
    fclose(f);
    return val;
}

json_t *tu_metrics_profile(const char *out, int first_step, int last_step, int steps)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/metrics.jsonl", out);
    FILE *f = fopen(path, "r");
    ck_assert_msg(f != NULL, "no %s", path);
    static char line[1 << 18];
    json_t *prof = NULL;
    int records = 0;
    while (fgets(line, sizeof line, f)) {
        json_t *j = json_loads(line, 0, NULL);
        ck_assert_msg(j != NULL, "bad metrics line: %.200s", line);
        if (json_object_get(j, "profile")) {
            records++;
            ck_assert_int_eq(json_integer_value(json_object_get(j, "step")), last_step);
            json_decref(prof);
            prof = json_incref(json_object_get(j, "profile"));
        }
        json_decref(j);
    }
    fclose(f);
    ck_assert_int_eq(records, 1);
    ck_assert_int_eq(json_integer_value(json_object_get(prof, "first_step")), first_step);
    ck_assert_int_eq(json_integer_value(json_object_get(prof, "last_step")), last_step);
    ck_assert_int_eq(json_integer_value(json_object_get(prof, "steps")), steps);
    double step = json_real_value(json_object_get(prof, "step_ms")), sum = 0;
    size_t i;
    const json_t *row;
    json_array_foreach(json_object_get(prof, "parts"), i, row) {
        double ms = json_real_value(json_object_get(row, "ms"));
        ck_assert_msg(ms >= 0, "%s: %g ms", json_string_value(json_object_get(row, "part")), ms);
        sum += ms;
    }
    ck_assert_msg(step > 0, "step time %g ms", step);
    ck_assert_msg(sum <= step, "the parts (%g ms) exceed the step (%g ms)", sum, step);
    ck_assert_double_eq_tol(json_real_value(json_object_get(prof, "gap_ms")), step - sum,
                            1e-9 * step);
    return prof;
}

const json_t *tu_profile_part(const json_t *prof, const char *prefix, const char *direction)
{
    size_t i;
    const json_t *p;
    json_array_foreach(json_object_get(prof, "parts"), i, p) {
        const char *name = json_string_value(json_object_get(p, "part"));
        if (name && !strncmp(name, prefix, strlen(prefix)) &&
            !strcmp(json_string_value(json_object_get(p, "direction")), direction))
            return p;
    }
    return NULL;
}

void tu_profile_check_modules(const json_t *prof, int layers)
{
    const char *dirs[] = {"forward", "backward"}, *slots[] = {"mixer", "ffn"};
    for (int l = 0; l < layers; l++)
        for (int k = 0; k < 4; k++) {
            char name[64];
            snprintf(name, sizeof name, "layers.%d.%s (", l, slots[k / 2]);
            const json_t *p = tu_profile_part(prof, name, dirs[k % 2]);
            ck_assert_msg(p, "no part %s %s", name, dirs[k % 2]);
            ck_assert_double_eq(json_real_value(json_object_get(p, "calls")), 1);
            ck_assert_msg(json_real_value(json_object_get(p, "ms")) > 0, "%s %s: %g ms", name,
                          dirs[k % 2], json_real_value(json_object_get(p, "ms")));
        }
    ck_assert_ptr_nonnull(tu_profile_part(prof, "residual (", "forward"));
    ck_assert_ptr_nonnull(tu_profile_part(prof, "residual (", "backward"));
    ck_assert_ptr_nonnull(tu_profile_part(prof, "optimizer (", "step"));
}

void tu_assert_same_losses(const char *out_a, const char *out_b, int steps)
{
    double *a = calloc((size_t)steps + 2, sizeof *a), *b = calloc((size_t)steps + 2, sizeof *b);
    ck_assert(a && b);
    ck_assert_int_eq(tu_metrics_losses(out_a, a, steps + 2), steps);
    ck_assert_int_eq(tu_metrics_losses(out_b, b, steps + 2), steps);
    for (int s = 1; s <= steps; s++)
        ck_assert_msg(memcmp(&a[s], &b[s], sizeof a[s]) == 0,
                      "step %d: %.17g in %s, %.17g in %s", s, a[s], out_a, b[s], out_b);
    free(a);
    free(b);
}

double tu_safetensors_max_rel_diff(const char *file_a, const char *file_b)
{
    st_file *fa, *fb;
    k3rt_error err = {0};
    TU_OK(st_open(file_a, &fa, &err), err);
    TU_OK(st_open(file_b, &fb, &err), err);
    double worst = 0;
    for (int i = 0; i < st_count(fa); i++) {
        const st_entry *ea = st_at(fa, i), *eb = st_find(fb, ea->name);
        ck_assert_msg(eb != NULL, "%s lacks %s", file_b, ea->name);
        ck_assert_int_eq(ea->dtype, K3RT_F32);
        int64_t n = 1;
        for (int k = 0; k < ea->ndim; k++)
            n *= ea->shape[k];
        const float *x = ea->data, *y = eb->data;
        double num = 0, den = 0;
        for (int64_t k = 0; k < n; k++) {
            num += ((double)x[k] - y[k]) * ((double)x[k] - y[k]);
            den += (double)x[k] * x[k];
        }
        worst = fmax(worst, sqrt(num / fmax(den, 1e-30)));
    }
    st_close(fa);
    st_close(fb);
    return worst;
}

int tu_dense_plugins_have_cuda(void)
{
    registry reg;
    k3rt_error err = {0};
    /* Called before the suite runs, where Check's assertions cannot report. */
    if (registry_init(&reg, NULL, &err) != K3RT_OK) {
        printf("plugin registry: %s\n", err.msg);
        return 0;
    }
    const char *names[] = {"mla", "dense_glu", "standard", "adamw"};
    const int kinds[] = {K3RT_KIND_ATTENTION, K3RT_KIND_MOE, K3RT_KIND_RESIDUAL,
                         K3RT_KIND_OPTIMIZER};
    int ok = 1;
    for (int i = 0; ok && i < 4; i++) {
        const plugin_entry *e = registry_find(&reg, names[i], kinds[i]);
        if (!e || !(e->desc.caps & K3RT_CAP_CUDA)) {
            printf("plugin %s has no CUDA path in this build\n", names[i]);
            ok = 0;
        }
    }
    registry_free(&reg);
    return ok;
}

const plugin_entry *tu_plugin(const char *name)
{
    /* One registry per plugin: a registry's entries move when it grows. */
    enum { MAX = 16 };
    static registry regs[MAX];
    static const plugin_entry *loaded[MAX];
    static char names[MAX][64];
    int i = 0;
    for (; i < MAX && loaded[i]; i++)
        if (!strcmp(names[i], name))
            return loaded[i];
    ck_assert_msg(i < MAX, "tu_plugin: more than %d plugins", MAX);
    char path[1024];
    const char *env = getenv("K3RT_PLUGIN_PATH");
    if (env && *env)
        snprintf(path, sizeof path, "%.*s/libk3rt_%s.so", (int)strcspn(env, ":"), env, name);
    else
        snprintf(path, sizeof path, "%s/libk3rt_%s.so", K3RT_PLUGIN_DIR, name);
    k3rt_error err = {0};
    TU_OK(registry_load_file(&regs[i], path, &loaded[i], &err), err);
    snprintf(names[i], sizeof names[i], "%s", name);
    return loaded[i];
}

void tu_recipe_fixtures(registry *reg)
{
    static const char *const kinds[] = {"attention", "moe", "balancer", "optimizer",
                                        "residual"};
    k3rt_error err = {0};
    TU_OK(registry_init(reg, NULL, &err), err);
    for (int i = 0; i < 5; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/fixtures/recipe_fixture_%s.so", K3RT_BINARY_DIR,
                 kinds[i]);
        const plugin_entry *e;
        TU_OK(registry_load_file(reg, path, &e, &err), err);
    }
}
