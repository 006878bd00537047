/* SVG heat maps (heatmap.h), in the style of the loss chart (loss_chart.c). */
#include "plot/heatmap.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plot/svg.h"
#include "util/fs.h"

/* Viridis at five stops, interpolated linearly: ordered in lightness, readable in grey. */
static void colour(double u, char *buf, size_t len)
{
    static const double stop[5][3] = {{68, 1, 84},
                                      {59, 82, 139},
                                      {33, 145, 140},
                                      {94, 201, 98},
                                      {253, 231, 37}};
    if (!isfinite(u)) {
        snprintf(buf, len, "#bbbbbb");
        return;
    }
    u = u < 0 ? 0 : u > 1 ? 1 : u;
    int i = u >= 1 ? 3 : (int)(u * 4);
    double f = u * 4 - i;
    int c[3];
    for (int k = 0; k < 3; k++)
        c[k] = (int)lround(stop[i][k] + f * (stop[i + 1][k] - stop[i][k]));
    snprintf(buf, len, "#%02x%02x%02x", c[0], c[1], c[2]);
}

static void put_label(FILE *f, const char *const *labels, int i)
{
    if (labels && labels[i])
        svg_put_text(f, labels[i]);
    else
        fprintf(f, "%d", i);
}

static double clampd(double x, double lo, double hi) { return x < lo ? lo : x > hi ? hi : x; }

int heatmap_write_svg(const char *path, const double *m, int rows, int cols,
                      const heatmap_spec *spec, k3rt_error *err)
{
    static const heatmap_spec none;
    if (!spec)
        spec = &none;
    if (rows < 1 || cols < 1 || !m)
        return k3rt_fail(err, K3RT_ERR_INVALID, "heat map %s: needs at least one row and one "
                         "column, got %d x %d", path, rows, cols);
    double lo = spec->lo, hi = spec->hi;
    if (!(lo < hi)) {
        lo = INFINITY, hi = -INFINITY;
        for (long i = 0; i < (long)rows * cols; i++)
            if (isfinite(m[i])) {
                lo = fmin(lo, m[i]);
                hi = fmax(hi, m[i]);
            }
        if (!isfinite(lo))
            lo = 0, hi = 1;
        if (hi - lo < 1e-12)
            hi = lo + 1;
    }
    /* Cells fill about 560 x 560 pixels, within readable bounds. */
    double cw = clampd(560.0 / cols, 8, 60), ch = clampd(560.0 / rows, 3, 30);
    double left = 110, top = spec->title ? 50 : 20, w = cw * cols, h = ch * rows;
    double bar_x = left + w + 30, width = bar_x + 90, height = top + h + 60;
    if (spec->title)  /* room for the title at 15 px (about 8 px a character) */
        width = fmax(width, 40 + 8.0 * (double)strlen(spec->title));
    int row_every = (int)ceil(12.0 / ch), col_every = (int)ceil(24.0 / cw);
    char fill[16];
    fs_atomic a;
    K3RT_TRY(fs_atomic_open(&a, path, err));
    FILE *f = a.f;
    svg_begin(f, width, height, 11);
    if (spec->title) {
        fprintf(f, "<text x=\"%.1f\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">",
                width / 2);
        svg_put_text(f, spec->title);
        fprintf(f, "</text>\n");
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            double v = m[(long)r * cols + c];
            colour((v - lo) / (hi - lo), fill, sizeof fill);
            fprintf(f, "<rect class=\"cell\" x=\"%.2f\" y=\"%.2f\" width=\"%.2f\" height=\"%.2f\" "
                       "fill=\"%s\"><title>", left + c * cw, top + r * ch, cw, ch, fill);
            put_label(f, spec->row_labels, r);
            fputs(", ", f);
            put_label(f, spec->col_labels, c);
            fprintf(f, ": %.4g</title></rect>\n", v);
        }
    for (int r = 0; r < rows; r += row_every) {
        fprintf(f, "<text class=\"row\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">", left - 6,
                top + (r + 0.5) * ch + 4);
        put_label(f, spec->row_labels, r);
        fprintf(f, "</text>\n");
    }
    for (int c = 0; c < cols; c += col_every) {
        fprintf(f, "<text class=\"col\" x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">",
                left + (c + 0.5) * cw, top + h + 16);
        put_label(f, spec->col_labels, c);
        fprintf(f, "</text>\n");
    }
    if (spec->col_title) {
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">", left + w / 2,
                top + h + 36);
        svg_put_text(f, spec->col_title);
        fprintf(f, "</text>\n");
    }
    if (spec->row_title) {
        fprintf(f, "<text transform=\"translate(18,%.1f) rotate(-90)\" text-anchor=\"middle\">",
                top + h / 2);
        svg_put_text(f, spec->row_title);
        fprintf(f, "</text>\n");
    }
    /* the colour bar: hi at the top */
    fprintf(f, "<defs><linearGradient id=\"scale\" x1=\"0\" y1=\"1\" x2=\"0\" y2=\"0\">");
    for (int k = 0; k <= 4; k++) {
        colour(k / 4.0, fill, sizeof fill);
        fprintf(f, "<stop offset=\"%d%%\" stop-color=\"%s\"/>", k * 25, fill);
    }
    fprintf(f, "</linearGradient></defs>\n"
               "<rect x=\"%.1f\" y=\"%.1f\" width=\"14\" height=\"%.1f\" fill=\"url(#scale)\" "
               "stroke=\"#888\"/>\n"
               "<text x=\"%.1f\" y=\"%.1f\">%.3g</text><text x=\"%.1f\" y=\"%.1f\">%.3g</text>\n"
               "</svg>\n", bar_x, top, h, bar_x + 20, top + 10, hi, bar_x + 20, top + h, lo);
    return fs_atomic_commit(&a, err);
}
