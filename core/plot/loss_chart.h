/* The loss curve of a run (train/trainer.h's loss_history), drawn as an SVG line chart:
 * training loss per step, validation loss at evaluations. */
#ifndef K3RT_PLOT_LOSS_CHART_H
#define K3RT_PLOT_LOSS_CHART_H

#include <k3rt/errors.h>

#include "train/trainer.h"

/* Writes both series against the step to path atomically; title names the run. */
int loss_chart_write_svg(const loss_history *h, const char *title, const char *path,
                         k3rt_error *err);

#endif
