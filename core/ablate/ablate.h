/* `k3rt ablate SUITE.lua`: trains a suite's base recipe and each variant (suite.h) as a child
 * `k3rt train` process each — so a failing variant cannot take the suite down — with the same
 * seed and data order, then compares them: a table (final validation loss, tokens, training
 * FLOPs, tokens/s, MaxVio, compute efficiency against the base) in Markdown and JSON, and the
 * validation loss against training FLOPs of every variant as SVG and PNG.
 *
 * Output: <out>/<variant>/ (each run's folder: metrics.jsonl, train.log, ...) and
 * <out>/{table.md, table.json, loss_vs_flops.svg, loss_vs_flops.png}; <out> defaults to
 * out/<suite name>. With a shared run folder (the suite's `runs` or --runs), the runs live
 * there instead, each in a folder named by its identity (suite.h).
 *
 * Runs that train on the GPU train one at a time whatever --jobs says: two on one device
 * would each measure a share of it. */
#ifndef K3RT_ABLATE_H
#define K3RT_ABLATE_H

#include <k3rt/errors.h>

typedef struct ablate_options {
    const char *suite_path;
    const char *const *overrides;  /* --set strings applied to every variant, after the suite's */
    int n_overrides;
    const char *out_root;          /* NULL: out/<suite name> */
    const char *runs_dir;          /* shared run folder (over the suite's `runs`); NULL: none */
    const char *plugin_path;       /* extra plugin directories, passed on to the children */
    int jobs;                      /* variants trained at once on the CPU (threads are split) */
    int reuse;                     /* keep a variant whose finished run used the same command */
    int quiet;
    int dry_run;                   /* check and plan every variant, print them, train nothing */
    const char *command;           /* the command line, recorded with the table */
} ablate_options;

/* Runs the suite and writes the table and charts. Fails (after writing what it can) when a
 * variant failed; the message names the variants and their logs. */
int ablate_main(const ablate_options *o, k3rt_error *err);

#endif
