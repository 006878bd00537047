/* `k3rt plot`: two short runs (the MoE model tiny.lua and the dense tiny_dense.lua) drawn into
 * one SVG. Checks what the picture says against the runs' metrics.jsonl: every series in the
 * legend, one dot per evaluation in the run's colour (twice: the tokens and the FLOPs panel),
 * dots ordered on the page as the losses are, the axes' tick labels inside the data's range,
 * one MaxVio series per MoE layer with a dot per record; a dense run alone has no MaxVio
 * panel; a folder without metrics fails naming the file. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "metrics/run_metrics.h"
#include "testutil/testutil.h"
#include "util/fs.h"

static const char *SMALL = " --set train.steps=12 --set train.eval_interval=6"
                           " --set train.eval_batches=2 --set train.log_interval=3"
                           " --set plan.micro_batch=4 --set plan.seq_len=32"
                           " --set train.checkpoint_interval=12 --quiet";

static void train(const char *recipe, const char *out)
{
    char cmd[2048], *log = NULL;
    snprintf(cmd, sizeof cmd, "cd %s && %s train scripts/recipes/%s --out %s%s",
             tu_source_dir(), tu_k3rt_bin(), recipe, out, SMALL);
    int rc = tu_run(cmd, &log);
    ck_assert_msg(rc == 0, "%s\n%s", cmd, log);
    free(log);
}

static char *plot(const char *args, int expect_rc)
{
    char cmd[4096], *out = NULL;
    snprintf(cmd, sizeof cmd, "%s plot %s", tu_k3rt_bin(), args);
    int rc = tu_run(cmd, &out);
    ck_assert_msg(rc == expect_rc, "%s: exit %d\n%s", cmd, rc, out);
    return out;
}

static char *read_text(const char *path)
{
    char *data;
    size_t len;
    k3rt_error err = {0};
    TU_OK(fs_read_file(path, &data, &len, &err), err);
    return data;
}

static int count(const char *s, const char *what)
{
    int n = 0;
    for (const char *p = strstr(s, what); p; p = strstr(p + 1, what))
        n++;
    return n;
}

/* The y coordinates of the circles of one colour, in document order. */
static int circles(const char *svg, const char *color, double *y, int max)
{
    char fill[32];
    snprintf(fill, sizeof fill, "fill=\"#%s\"", color);
    int n = 0;
    for (const char *p = strstr(svg, "<circle "); p; p = strstr(p + 1, "<circle ")) {
        const char *end = strchr(p, '>');
        const char *f = strstr(p, fill);
        if (f && f < end) {
            ck_assert_int_lt(n, max);
            y[n++] = atof(strstr(p, "cy=\"") + 4);
        }
    }
    return n;
}

/* The texts of the document, '|'-joined, for label checks. */
static void texts(const char *svg, char *buf, size_t len)
{
    size_t at = 0;
    for (const char *p = strstr(svg, "<text"); p && at + 2 < len; p = strstr(p + 1, "<text")) {
        const char *b = strchr(p, '>') + 1, *e = strstr(b, "</text>");
        at += (size_t)snprintf(buf + at, len - at, "%.*s|", (int)(e - b), b);
    }
}

/* The runs' validation points: with a lower loss, a dot lower on the page (larger y). */
static void assert_val_dots(const char *svg, const char *color, const run_metrics *m)
{
    double y[64], loss[64];
    int n_val = 0;
    for (int i = 0; i < m->n; i++)
        if (isfinite(m->val_loss[i]))
            loss[n_val++] = m->val_loss[i];
    ck_assert_int_eq(n_val, 2);
    int n = circles(svg, color, y, 64);
    ck_assert_int_eq(n, 2 * n_val);  /* the tokens panel and the FLOPs panel */
    for (int p = 0; p < 2; p++)
        for (int i = 1; i < n_val; i++)
            ck_assert_msg((loss[i] < loss[i - 1]) == (y[p * n_val + i] > y[p * n_val + i - 1]),
                          "val loss %g -> %g drawn at y %g -> %g", loss[i - 1], loss[i],
                          y[p * n_val + i - 1], y[p * n_val + i]);
}

/* The numeric labels between `after` and `before`: each inside the y range [ylo, yhi] or the
 * x range [xlo, xhi]; how many fall in each. */
static void ticks(const char *labels, const char *after, const char *before, const double y[2],
                  const double x[2], int *n_y, int *n_x)
{
    const char *p = strstr(labels, after), *end = p ? strstr(p, before) : NULL;
    ck_assert(p && end);
    *n_y = *n_x = 0;
    for (p += strlen(after); p < end; p = strchr(p, '|') + 1) {
        char *stop;
        double v = strtod(p, &stop);
        if (stop == p || *stop != '|')
            continue;
        int in_y = v >= y[0] && v <= y[1], in_x = v >= x[0] && v <= x[1];
        ck_assert_msg(in_y || in_x, "tick %g outside [%g, %g] and [%g, %g]", v, y[0], y[1],
                      x[0], x[1]);
        *n_y += in_y;
        *n_x += in_x && !in_y;
    }
}

/* The range of a column of both runs, widened by the chart's margin on each side. */
static void span(const double *a, int na, const double *b, int nb, double margin, double r[2])
{
    r[0] = INFINITY, r[1] = -INFINITY;
    for (int i = 0; i < na + nb; i++) {
        double v = i < na ? a[i] : b[i - na];
        if (isfinite(v))
            r[0] = fmin(r[0], v), r[1] = fmax(r[1], v);
    }
    double w = r[1] - r[0];
    r[0] -= margin * w, r[1] += margin * w;
}

START_TEST(test_two_runs)
{
    char dir[512], moe[700], dense[700], svg_path[700], labels[1 << 14];
    tu_tmpdir(dir, sizeof dir);
    snprintf(moe, sizeof moe, "%s/tiny", dir);
    snprintf(dense, sizeof dense, "%s/tiny_dense", dir);
    snprintf(svg_path, sizeof svg_path, "%s/runs.svg", dir);
    train("tiny.lua", moe);
    train("tiny_dense.lua", dense);
    char args[2400];
    snprintf(args, sizeof args, "%s %s/ --out %s", moe, dense, svg_path);
    free(plot(args, 0));
    char *svg = read_text(svg_path);
    run_metrics a, b;
    k3rt_error err = {0};
    TU_OK(run_metrics_read(moe, &a, &err), err);
    TU_OK(run_metrics_read(dense, &b, &err), err);
    ck_assert_int_eq(a.n, 4);  /* steps 3, 6, 9, 12 */
    ck_assert_int_eq(a.n_moe, 3);  /* layers 1-3: layer 0 is dense */
    ck_assert_int_eq(b.n_moe, 0);
    ck_assert(strstr(svg, "height=\"1500\""));  /* three panels */
    texts(svg, labels, sizeof labels);
    for (const char *name = "tiny train|tiny val|tiny_dense train|tiny_dense val|"; *name;) {
        const char *bar = strchr(name, '|');
        char one[64];
        snprintf(one, sizeof one, "|%.*s|", (int)(bar - name), name);
        ck_assert_int_eq(count(labels, one), 2);
        name = bar + 1;
    }
    for (int l = 1; l <= 3; l++) {
        char one[64];
        snprintf(one, sizeof one, "|tiny layer %d|", l);
        ck_assert_msg(strstr(labels, one), "%s missing: %s", one, labels);
    }
    assert_val_dots(svg, "1f77b4", &a);  /* palette colour 1: the first run */
    assert_val_dots(svg, "d62728", &b);
    /* the tokens panel's ticks: losses on y (5% margins), tokens on x (3%) */
    double yr[2], yv[2], xr[2];
    span(a.train_loss, a.n, b.train_loss, b.n, 0.05, yr);
    span(a.val_loss, a.n, b.val_loss, b.n, 0.05, yv);
    yr[0] = fmin(yr[0], yv[0]), yr[1] = fmax(yr[1], yv[1]);
    span(a.tokens, a.n, b.tokens, b.n, 0.03, xr);
    int n_y, n_x;
    ticks(labels, "vs tokens|", "|tokens|", yr, xr, &n_y, &n_x);
    ck_assert_msg(n_y >= 3 && n_x >= 3, "%d y ticks, %d x ticks: %s", n_y, n_x, labels);
    /* MaxVio dots: one per record and layer, in the colours after the two runs' */
    double y[64];
    ck_assert_int_eq(circles(svg, "2ca02c", y, 64), a.n);
    ck_assert_int_eq(circles(svg, "ff7f0e", y, 64), a.n);
    ck_assert_int_eq(circles(svg, "9467bd", y, 64), a.n);
    run_metrics_free(&a);
    run_metrics_free(&b);
    free(svg);

    /* the dense run alone: two panels, no MaxVio */
    snprintf(args, sizeof args, "%s --out %s", dense, svg_path);
    free(plot(args, 0));
    svg = read_text(svg_path);
    ck_assert(strstr(svg, "height=\"1000\"") && !strstr(svg, "MaxVio"));
    free(svg);

    /* a folder that is not a run */
    snprintf(args, sizeof args, "%s %s/nothing --out %s/x.svg", dense, dir, dir);
    char *out = plot(args, 1);
    ck_assert_msg(strstr(out, "nothing/metrics.jsonl"), "%s", out);
    free(out);
}
END_TEST

int main(void)
{
    Suite *s = suite_create("plot");
    TCase *tc = tcase_create("plot");
    tcase_set_timeout(tc, 300);
    tcase_add_test(tc, test_two_runs);
    suite_add_tcase(s, tc);
    return tu_run_suite(s);
}
