/* A matrix drawn as an SVG heat map (e.g. the depth-attention weights of Block AttnRes: one row
 * per sublayer, one column per source) with no dependency beyond the C library. */
#ifndef K3RT_PLOT_HEATMAP_H
#define K3RT_PLOT_HEATMAP_H

#include <k3rt/errors.h>

typedef struct heatmap_spec {
    const char *title;                 /* NULL: none */
    const char *row_title, *col_title; /* axis names, e.g. "sublayer", "source"; may be NULL */
    const char *const *row_labels;     /* rows entries, or NULL for 0, 1, ... */
    const char *const *col_labels;     /* cols entries, or NULL for 0, 1, ... */
    double lo, hi;                     /* colour range; lo >= hi: the finite data's min and max */
} heatmap_spec;

/* Writes m [rows, cols] (row-major) to path atomically: one cell per entry coloured on a
 * perceptually ordered scale (dark blue -> green -> yellow; non-finite entries grey), each with
 * a tooltip of its value, the labels (thinned when rows are too close to print each) and a
 * colour bar with the range. Labels are XML-escaped. */
int heatmap_write_svg(const char *path, const double *m, int rows, int cols,
                      const heatmap_spec *spec, k3rt_error *err);

#endif
