/* State shared by the files of `k3rt ablate` (ablate.h). */
#ifndef K3RT_ABLATE_INTERNAL_H
#define K3RT_ABLATE_INTERNAL_H

#include <jansson.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "ablate/ablate.h"
#include "ablate/suite.h"

typedef struct variant_run {
    const ablate_variant *v;
    const char **sets;             /* suite's, the variant's, the command line's */
    int n_sets;
    char dir[2300];
    /* from the recipe and the planner, before training */
    int64_t steps, params_total, params_active, seed;
    double step_flops;             /* planned training FLOPs per step */
    int cuda;                      /* trains on the GPU (device_choice.h) */
    char recipe_sha[65];           /* of the resolved recipe document */
    /* the child's command (argv[1:]) and the run's identity: the hash of the resolved recipe
     * and that command with its --out left out, recorded in <dir>/ablate.json for --reuse */
    json_t *args;
    char key[65];
    /* the child */
    int reused, failed, exit_code;
    double seconds;
    char failure[512];
    /* from metrics.jsonl */
    int64_t steps_done;
    double *curve_flops, *curve_loss;  /* evaluation points */
    int n_curve;
    double final_loss, tokens, flops, tokens_per_s, maxvio;
    double mfu;                    /* NAN when the records carry none (no known peak) */
    /* against the base */
    double base_flops, efficiency;
    int extrapolated;
    char note[256];
    /* against the seed spread (ablate_spread.c): 1 beyond, 0 within, -1 not known */
    int beyond_spread;
} variant_run;

/* The base's seed-to-seed spread, from the base and its seed replicas. */
typedef struct seed_spread {
    int runs;                      /* base runs with a final validation loss (>= 2 to count) */
    double loss;                   /* max - min of their final validation losses */
} seed_spread;

typedef struct ablate_ctx {
    const ablate_options *o;
    ablate_suite suite;
    variant_run *runs;
    int n;
    char root[2048];
    const char *runs_dir;          /* the shared run folder, NULL for <root>/<variant> */
    int cuda;                      /* some run trains on the GPU */
    int jobs, threads;             /* runs at once; CPU threads of each (0: all) */
    seed_spread spread;
} ablate_ctx;

/* ablate_run.c: each run's child command, identity and folder (after the recipes are checked
 * and c->jobs / c->threads are known); fails when two runs of the suite are the same run. */
int ablate_prepare_runs(ablate_ctx *c, k3rt_error *err);

/* ablate_run.c: trains every variant (skipping reused ones); a failed child marks its run. */
int ablate_run_all(ablate_ctx *c, k3rt_error *err);
/* ablate_spread.c: the seed spread and each variant's place against it (after the
 * efficiencies); its Markdown lines under the table and its JSON object. */
void ablate_seed_spread(ablate_ctx *c);
void ablate_spread_markdown(const ablate_ctx *c, FILE *f);
json_t *ablate_spread_json(const ablate_ctx *c);
/* ablate_report.c: reads every run's metrics, computes the efficiencies, writes the table
 * (Markdown, JSON) and the charts, prints the Markdown table. */
int ablate_report(ablate_ctx *c, k3rt_error *err);
/* A number for table.json: null when not finite. */
static inline json_t *ablate_num(double v)
{
    return isfinite(v) ? json_real(v) : json_null();
}

#endif
