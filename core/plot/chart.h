/* Line charts of several series (an ablation's validation loss against training FLOPs) as
 * SVG and PNG. One layout (chart.c) produces a list of drawing items; svg.c writes them as
 * SVG elements and raster.c draws them into pixels for png.c, so both files show the same
 * chart. */
#ifndef K3RT_PLOT_CHART_H
#define K3RT_PLOT_CHART_H

#include <k3rt/errors.h>

typedef struct chart_series {
    const char *name;
    const double *x, *y;   /* n points in drawing order; non-finite points are skipped */
    int n;
} chart_series;

typedef struct chart_spec {
    const char *title, *x_label, *y_label;
    int log_x;             /* logarithmic x axis (x must be > 0) */
    const chart_series *series;
    int n_series;
} chart_spec;

int chart_write_svg(const chart_spec *c, const char *path, k3rt_error *err);
int chart_write_png(const chart_spec *c, const char *path, k3rt_error *err);

#endif
