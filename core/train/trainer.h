/* `k3rt train`: builds the model of a recipe on every data-parallel rank, runs the training
 * loop (micro-batches, gradient accumulation, all-reduce, clipping, schedule, optimizer,
 * balancers, evaluation, checkpoints, the on_step hook) and, at the end, writes the loss plot
 * and a text sample. */
#ifndef K3RT_TRAINER_H
#define K3RT_TRAINER_H

#include <stdint.h>
#include <k3rt/errors.h>

#include "plugin/named.h"

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
    int64_t stop_after;             /* > 0: checkpoint and stop after this step, as an
                                       interrupted job would (the schedule still spans
                                       train.steps) */
} train_options;

typedef struct train_result {
    int64_t steps_done;
    double final_train_loss;        /* mean over the last logged interval */
    double final_val_loss;          /* NaN when no evaluation ran */
    double first_loss;              /* loss of the first step run */
    double seconds;                 /* training + evaluation wall time */
} train_result;

int train_main(const train_options *o, train_result *result, k3rt_error *err);

#endif
