/* Helpers shared by the Check suites (testutil.h). */
#include "testutil/testutil.h"

#include <math.h>
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
