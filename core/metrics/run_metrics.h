/* A finished (or running) run's metrics.jsonl read back: its training-step records (those that
 * count tokens) as columns. Records that describe the run rather than a step, such as
 * --profile's table, are left out. `k3rt ablate` and `k3rt plot` read runs through this one
 * reader, so both see the same numbers. */
#ifndef K3RT_METRICS_RUN_METRICS_H
#define K3RT_METRICS_RUN_METRICS_H

#include <stdint.h>
#include <k3rt/errors.h>

typedef struct run_metrics {
    int n;                     /* training-step records, in file order */
    int64_t *step;
    double *tokens, *flops;    /* consumed and spent so far */
    double *train_loss;        /* train_loss_mean over the log interval; NAN when not finite */
    double *val_loss;          /* NAN in records without an evaluation */
    double *tokens_per_s;      /* NAN when absent */
    double *mfu;               /* model FLOPs utilisation of the interval; NAN when absent (a
                                  device without a known peak) */
    double *maxvio_worst;      /* NAN when the record has no MoE statistics */
    /* MaxVio per MoE layer: n_moe layers (model layer indices in moe_layer, ascending) and
     * maxvio[record * n_moe + k], NAN where a record lacks the layer. */
    int n_moe;
    int *moe_layer;
    double *maxvio;
} run_metrics;

/* Reads <dir>/metrics.jsonl. K3RT_ERR_NOT_FOUND (message naming the file) when it does not
 * exist. A line that is not a JSON object is skipped: a running trainer may be half-way
 * through writing the last one. */
int run_metrics_read(const char *dir, run_metrics *out, k3rt_error *err);
void run_metrics_free(run_metrics *m);

#endif
