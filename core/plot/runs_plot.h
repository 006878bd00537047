/* `k3rt plot`: several runs' curves in one SVG, read from their metrics.jsonl
 * (metrics/run_metrics.h) and drawn by chart.c. Panels, top to bottom: training and validation
 * loss against tokens, the same against training FLOPs (logarithmic), and, when any run has
 * MoE layers, MaxVio of every MoE layer against the step. A run's two loss curves share its
 * colour: training loss thin, validation loss thick with a dot per evaluation. */
#ifndef K3RT_PLOT_RUNS_PLOT_H
#define K3RT_PLOT_RUNS_PLOT_H

#include <k3rt/errors.h>

/* dirs: run folders (each with metrics.jsonl); a folder without one fails naming it. */
int runs_plot_write(const char *const *dirs, int n, const char *svg_path, k3rt_error *err);

#endif
