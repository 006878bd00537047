/* The SVG heat map writer: cells, colours, labels, thinning, escaping and bad input. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "testutil/testutil.h"
#include "plot/heatmap.h"
#include "util/fs.h"

static char g_dir[512];

static void setup(void) { tu_tmpdir(g_dir, sizeof g_dir); }
static void teardown(void) { fs_remove_tree(g_dir, NULL); }

static char *slurp(const char *path)
{
    char *buf = NULL;
    size_t len = 0;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &buf, &len, &err), err);
    return buf;
}

static int count(const char *s, const char *needle)
{
    int n = 0;
    for (const char *p = strstr(s, needle); p; p = strstr(p + 1, needle))
        n++;
    return n;
}

START_TEST(cells_labels_and_colours)
{
    k3rt_error err = {0};
    char path[1024];
    fs_join(path, sizeof path, g_dir, "depth.svg");
    const double m[3 * 4] = {1.0, 0.0, 0.0, 0.0,
                             0.5, 0.5, 0.0, 0.0,
                             0.25, 0.25, NAN, 0.25};
    const char *rows[3] = {"L0 attn", "L0 ffn", "out <&>"};
    const char *cols[4] = {"emb", "b1", "b2", "b3"};
    heatmap_spec spec = {"depth \"weights\"", "sublayer", "source", rows, cols, 0, 0};
    TU_OK(heatmap_write_svg(path, m, 3, 4, &spec, &err), err);
    char *svg = slurp(path);
    ck_assert(strncmp(svg, "<svg ", 5) == 0);
    ck_assert(strcmp(svg + strlen(svg) - 7, "</svg>\n") == 0);
    ck_assert_int_eq(count(svg, "<rect class=\"cell\""), 12);
    ck_assert_int_eq(count(svg, "<rect"), 12 + 2);  /* background and colour bar */
    ck_assert_int_eq(count(svg, "<text"), count(svg, "</text>"));
    ck_assert_int_eq(count(svg, "<title>"), 12);
    for (int c = 0; c < 4; c++) {
        char want[64];
        snprintf(want, sizeof want, "text-anchor=\"middle\">%s</text>", cols[c]);
        ck_assert_msg(strstr(svg, want), "column label %s missing", cols[c]);
    }
    ck_assert(strstr(svg, ">L0 attn</text>") && strstr(svg, ">L0 ffn</text>"));
    ck_assert(strstr(svg, ">out &lt;&amp;&gt;</text>") && !strstr(svg, "out <&>"));
    ck_assert(strstr(svg, "depth &quot;weights&quot;"));
    ck_assert(strstr(svg, ">sublayer</text>") && strstr(svg, ">source</text>"));
    /* automatic range [0, 1]: 1 is the top of the scale, 0 the bottom, NaN grey */
    ck_assert(strstr(svg, "fill=\"#fde725\"><title>L0 attn, emb: 1</title>"));
    ck_assert(strstr(svg, "fill=\"#440154\"><title>L0 attn, b1: 0</title>"));
    ck_assert(strstr(svg, "fill=\"#21918c\"><title>L0 ffn, emb: 0.5</title>"));
    ck_assert(strstr(svg, "fill=\"#bbbbbb\"><title>out &lt;&amp;&gt;, b2: nan</title>"));
    free(svg);
    /* a fixed range: 0.5 of [0, 2] is a quarter of the way up */
    spec.lo = 0, spec.hi = 2;
    TU_OK(heatmap_write_svg(path, m, 3, 4, &spec, &err), err);
    svg = slurp(path);
    ck_assert(strstr(svg, "fill=\"#3b528b\"><title>L0 ffn, emb: 0.5</title>"));
    free(svg);
}
END_TEST

/* K3's shape: 187 rows (186 sublayers and the output) of 9 sources, default index labels;
 * rows 3 pixels high get a label every 4th row. */
START_TEST(many_rows_are_thinned)
{
    k3rt_error err = {0};
    char path[1024];
    fs_join(path, sizeof path, g_dir, "k3.svg");
    double *m = malloc(187 * 9 * sizeof *m);
    for (int i = 0; i < 187 * 9; i++)
        m[i] = (i % 9) / 8.0;
    TU_OK(heatmap_write_svg(path, m, 187, 9, NULL, &err), err);
    char *svg = slurp(path);
    ck_assert_int_eq(count(svg, "<rect class=\"cell\""), 187 * 9);
    ck_assert_int_eq(count(svg, "<text class=\"row\""), (187 + 3) / 4);
    ck_assert_int_eq(count(svg, "<text class=\"col\""), 9);
    ck_assert(strstr(svg, ">184</text>") && !strstr(svg, ">185</text>"));
    ck_assert(strstr(svg, "<title>186, 8: 1</title>"));
    free(svg);
    free(m);
}
END_TEST

START_TEST(bad_input)
{
    k3rt_error err = {0};
    char path[1024];
    double m[1] = {0};
    fs_join(path, sizeof path, g_dir, "x.svg");
    ck_assert_int_eq(heatmap_write_svg(path, m, 0, 3, NULL, &err), K3RT_ERR_INVALID);
    ck_assert_msg(strstr(err.msg, "needs at least one row and one column, got 0 x 3"), "%s",
                  err.msg);
    fs_join(path, sizeof path, g_dir, "no/such/dir/x.svg");
    ck_assert_int_eq(heatmap_write_svg(path, m, 1, 1, NULL, &err), K3RT_ERR_IO);
    ck_assert_msg(strstr(err.msg, "cannot create"), "%s", err.msg);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("heatmap");
    TCase *tc = tcase_create("core");
    tcase_add_checked_fixture(tc, setup, teardown);
    tcase_add_test(tc, cells_labels_and_colours);
    tcase_add_test(tc, many_rows_are_thinned);
    tcase_add_test(tc, bad_input);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
