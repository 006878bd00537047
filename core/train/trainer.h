/* `k3rt train`: builds the model of a recipe on every data-parallel rank, runs the training
 * loop (micro-batches, gradient accumulation, all-reduce, clipping, schedule, optimizer,
 * balancers, evaluation, checkpoints, the on_step hook) and, at the end, writes a text
 * sample. Charts (the loss curve, the depth-weight heat map) are drawn by whoever drives the
 * run, through train_charts: the k3rt command installs core/plot's writers; the engine draws
 * nothing itself. */
#ifndef K3RT_TRAINER_H
#define K3RT_TRAINER_H

#include <stdint.h>
#include <k3rt/errors.h>

#include "plugin/named.h"

/* The losses of a run (rank 0): training loss per step, validation loss per evaluation. */
typedef struct loss_series {
    double *x, *y;
    int64_t n, cap;
} loss_series;

typedef struct loss_history {
    loss_series train, val;
} loss_history;

/* A matrix statistic of the run for a heat map: rows x cols, row-major, labelled; lo..hi is
 * its colour range. */
typedef struct train_matrix {
    const char *title, *row_title, *col_title;
    const double *values;
    int rows, cols;
    const char *const *row_labels, *const *col_labels;
    double lo, hi;
} train_matrix;

/* Charts a run writes into its output folder, at the paths given; a NULL function: that chart
 * is not drawn. Called on rank 0 only; a failure stops the run with its message. */
typedef struct train_charts {
    void *user;
    /* at the end of the run: loss.svg */
    int (*loss)(void *user, const char *path, const char *title, const loss_history *h,
                k3rt_error *err);
    /* at every evaluation, when the residual reports "depth_weights": depth_weights.svg */
    int (*depth_weights)(void *user, const char *path, const train_matrix *m,
                         k3rt_error *err);
} train_charts;

typedef struct train_options {
    const char *recipe_path;
    const char *const *overrides;   /* "--set" strings */
    int n_overrides;
    const char *out_dir;            /* NULL: the recipe's `out` */
    plugin_sources plugins;         /* --plugin-path directories and --plugin files */
    int resume;                     /* continue from the newest usable checkpoint */
    int force;                      /* a fresh run may replace the checkpoints in the folder */
    int dry_run;                    /* print the plan (parameters, rules, memory) and stop */
    int quiet;                      /* no progress lines */
    int no_sample;                  /* skip the final sample (tests) */
    const train_charts *charts;     /* NULL: no charts */
    int64_t stop_after;             /* > 0: checkpoint and stop after this step, as an
                                       interrupted job would (the schedule still spans
                                       train.steps) */
    int save_start;                 /* write the checkpoint of the start (step 0: the initial
                                       weights and fresh plugin state) and stop, running no
                                       step (k3rt import --out) */
    int64_t profile;                /* > 0: time this many steps (after two warm-up steps) per
                                       module instance and part, print the table and write
                                       it into metrics.jsonl; the run goes on unchanged */
} train_options;

typedef struct train_result {
    int64_t steps_done;
    double final_train_loss;        /* mean over the last logged interval */
    double final_val_loss;          /* NaN when no evaluation ran */
    double first_loss;              /* loss of the first step run */
    double seconds;                 /* training + evaluation wall time */
    int rank;                       /* this process's first rank: the result is rank 0's */
} train_result;

int train_main(const train_options *o, train_result *result, k3rt_error *err);

#endif
