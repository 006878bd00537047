/* The loss curve of a run, drawn as an SVG line chart (training loss per step, validation
 * loss at evaluations) with no dependency beyond the C library. */
#ifndef K3RT_TRAIN_PLOT_H
#define K3RT_TRAIN_PLOT_H

#include <stdint.h>
#include <k3rt/errors.h>

typedef struct plot_series {
    double *x, *y;
    int64_t n, cap;
} plot_series;

typedef struct loss_history {
    plot_series train, val;
} loss_history;

int plot_add(plot_series *s, double x, double y);
void loss_history_free(loss_history *h);
/* Writes an SVG with both series against the step; title names the run. */
int plot_write_svg(const loss_history *h, const char *title, const char *path,
                   k3rt_error *err);

#endif
