/* State shared by the files of `k3rt ablate` (ablate.h). */
#ifndef K3RT_ABLATE_INTERNAL_H
#define K3RT_ABLATE_INTERNAL_H

#include <stdint.h>

#include "ablate/ablate.h"
#include "ablate/suite.h"

typedef struct variant_run {
    const ablate_variant *v;
    const char **sets;             /* suite's, the variant's, the command line's */
    int n_sets;
    char dir[2300];
    /* from the recipe and the planner, before training */
    int64_t steps, params_total, params_active;
    double step_flops;             /* planned training FLOPs per step */
    /* the child */
    int reused, failed, exit_code;
    double seconds;
    char failure[512];
    /* from metrics.jsonl */
    int64_t steps_done;
    double *curve_flops, *curve_loss;  /* evaluation points */
    int n_curve;
    double final_loss, tokens, flops, tokens_per_s, maxvio;
    /* against the base */
    double base_flops, efficiency;
    int extrapolated;
    char note[256];
} variant_run;

typedef struct ablate_ctx {
    const ablate_options *o;
    ablate_suite suite;
    variant_run *runs;
    int n;
    char root[2048];
} ablate_ctx;

/* ablate_run.c: trains every variant (skipping reused ones); a failed child marks its run. */
int ablate_run_all(ablate_ctx *c, k3rt_error *err);
/* ablate_report.c: reads every run's metrics, computes the efficiencies, writes the table
 * (Markdown, JSON) and the charts, prints the Markdown table. */
int ablate_report(ablate_ctx *c, k3rt_error *err);

#endif
