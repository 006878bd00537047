/* The writer's files read by an independent reader (tests/integration/check_safetensors.py,
 * standard library + numpy). Skips (77) where python3 with numpy is not installed. */
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "train/safetensors.h"
#include "util/fs.h"

static char g_dir[512];
static const char *g_python;

static void setup(void) { tu_tmpdir(g_dir, sizeof g_dir); }
static void teardown(void) { fs_remove_tree(g_dir, NULL); }

static int run_checker(const char *file, const char *expects, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "'%s' '%s/tests/integration/check_safetensors.py' '%s' %s",
             g_python, tu_source_dir(), file, expects);
    return tu_run(cmd, out);
}

static void write_sample(const char *path)
{
    static float w[6] = {1, 2, 3, 4, 5, 6};                       /* sum 21 */
    static double d[3] = {0.25, -1.5, 1e10};                       /* sum 1e10 - 1.25 */
    static int64_t step = 7;
    static uint8_t u8[3] = {1, 2, 250};                            /* sum 253 */
    static uint16_t u16[2] = {65535, 1};                           /* sum 65536 */
    static int32_t i32[4] = {-5, 6, -7, 8};                        /* sum 2 */
    uint16_t bf[4];
    const float bfv[4] = {0.5f, 1, 2, -1};                         /* sum 2.5 */
    uint8_t f8[3];
    const float f8v[3] = {1, 2, -0.5f};                            /* sum 2.5 */
    for (int i = 0; i < 4; i++)
        bf[i] = k3rt_f32_to_bf16(bfv[i]);
    for (int i = 0; i < 3; i++)
        f8[i] = k3rt_f32_to_fp8e4m3(f8v[i]);
    st_entry e[] = {
        {"layers.0.mixer.q_proj.weight", K3RT_F32, 2, {2, 3}, w},
        {"f64", K3RT_F64, 1, {3}, d},
        {"bf16", K3RT_BF16, 1, {4}, bf},
        {"fp8", K3RT_FP8_E4M3, 1, {3}, f8},
        {"step", K3RT_I64, 0, {0}, &step},
        {"u8", K3RT_U8, 1, {3}, u8},
        {"u16", K3RT_U16, 1, {2}, u16},
        {"i32", K3RT_I32, 4, {1, 2, 1, 2}, i32},
        {"empty", K3RT_F32, 2, {0, 5}, NULL},
    };
    json_t *meta = json_pack("{s:s}", "k3rt.format", "1");
    k3rt_error err = {0};
    TU_OK(st_write(path, e, (int)(sizeof e / sizeof e[0]), meta, &err), err);
    json_decref(meta);
}

static void expect_line(const char *out, const char *line)
{
    ck_assert_msg(strstr(out, line), "missing '%s' in:\n%s", line, out);
}

START_TEST(test_python_reads_writer_output)
{
    char path[600], *out = NULL;
    fs_join(path, sizeof path, g_dir, "w.safetensors");
    write_sample(path);
    int rc = run_checker(path,
                         "--expect layers.0.mixer.q_proj.weight:F32:[2,3] --expect f64:F64:3 "
                         "--expect bf16:BF16:4 --expect fp8:F8_E4M3:3 --expect step:I64: "
                         "--expect i32:I32:1x2x1x2 --expect empty:F32:0,5",
                         &out);
    ck_assert_msg(rc == 0, "checker failed (%d):\n%s", rc, out);
    expect_line(out, "layers.0.mixer.q_proj.weight\tF32\t[2, 3]\tsum=21.0");
    expect_line(out, "f64\tF64\t[3]\tsum=9999999998.75");
    expect_line(out, "bf16\tBF16\t[4]\tsum=2.5");
    expect_line(out, "fp8\tF8_E4M3\t[3]\tsum=2.5");
    expect_line(out, "step\tI64\t[]\tsum=7.0");
    expect_line(out, "u8\tU8\t[3]\tsum=253.0");
    expect_line(out, "u16\tU16\t[2]\tsum=65536.0");
    expect_line(out, "i32\tI32\t[1, 2, 1, 2]\tsum=2.0");
    expect_line(out, "empty\tF32\t[0, 5]\tsum=0.0");
    expect_line(out, "__metadata__\tk3rt.format=1");
    free(out);
}
END_TEST

START_TEST(test_python_refuses)
{
    char path[600], cut[600], *out = NULL;
    fs_join(path, sizeof path, g_dir, "w.safetensors");
    fs_join(cut, sizeof cut, g_dir, "cut.safetensors");
    write_sample(path);
    /* A wrong expectation and a missing tensor. */
    ck_assert_int_eq(run_checker(path, "--expect f64:F32:3", &out), 1);
    expect_line(out, "tensor 'f64' is F64 [3], expected F32 [3]");
    free(out);
    ck_assert_int_eq(run_checker(path, "--expect nope:F32:1", &out), 1);
    expect_line(out, "expected tensor 'nope' is missing");
    free(out);
    /* The same file one byte short. */
    char *raw;
    size_t len;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &raw, &len, &err), err);
    FILE *f = fopen(cut, "wb");
    fwrite(raw, 1, len - 1, f);
    fclose(f);
    free(raw);
    ck_assert_int_eq(run_checker(cut, "", &out), 1);
    expect_line(out, "data buffer is");
    free(out);
}
END_TEST

int main(void)
{
    g_python = tu_python_with_numpy();
    if (!g_python) {
        printf("skipped: no python3 with numpy (Debian: python3-numpy; or set K3RT_PYTHON)\n");
        return 77;
    }
    Suite *s = suite_create("safetensors_python");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, test_python_reads_writer_output);
    tcase_add_test(tc, test_python_refuses);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
