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
    /* 0: the series' own colour (its index); k > 0: palette colour k - 1, so that two series
     * of one run (training and validation loss) share it */
    int color;
    int thin;              /* a thin line without dots: a dense curve such as training loss */
} chart_series;

typedef struct chart_spec {
    const char *title, *x_label, *y_label;
    int log_x;             /* logarithmic x axis (x must be > 0) */
    const chart_series *series;
    int n_series;
} chart_spec;

int chart_write_svg(const chart_spec *c, const char *path, k3rt_error *err);
int chart_write_png(const chart_spec *c, const char *path, k3rt_error *err);
/* n charts stacked top to bottom in one SVG document. */
int chart_write_svg_panels(const chart_spec *c, int n, const char *path, k3rt_error *err);

#endif
