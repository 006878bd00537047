/* The seed spread of a suite with `seeds` (suite.h). The base trained under each seed tells
 * how far two runs differing only in their seed (initialisation and data order) end apart;
 * a variant's difference from the base says something about the variant only when it is
 * larger. With two seeds this is one sample of that noise: a yardstick, not a test.
 *
 * spread = max - min of the base runs' final validation losses. A variant trained once is
 * beyond it when |its final validation loss - the base's| > spread, within it otherwise.
 * Under replicate = "all" every variant has a run per seed, and it is beyond when its runs
 * and the base's do not overlap: every one of its final losses on the same side of every one
 * of the base's (with two seeds each, no two-run noise band can straddle that). Its
 * difference is then the mean over its seeds less the base's mean. Each replica's compute
 * efficiency against the base (its own row's) is the spread in the efficiency column's
 * terms: how far from 1 a variant's efficiency may be by the seed alone. */
#include <math.h>
#include <string.h>

#include "ablate/ablate_internal.h"

/* The variant a run belongs to: itself, or the one it replicates. */
static int group_of(const ablate_ctx *c, int i)
{
    return c->runs[i].v->replica ? c->runs[i].v->of : i;
}

/* Range and mean of group g's final losses; the number of finite ones. */
static int group_stats(const ablate_ctx *c, int g, double *lo, double *hi, double *mean)
{
    int n = 0;
    double sum = 0;
    *lo = INFINITY, *hi = -INFINITY;
    for (int i = 0; i < c->n; i++)
        if (group_of(c, i) == g && isfinite(c->runs[i].final_loss)) {
            double l = c->runs[i].final_loss;
            *lo = fmin(*lo, l), *hi = fmax(*hi, l), sum += l, n++;
        }
    *mean = n ? sum / n : NAN;
    return n;
}

void ablate_seed_spread(ablate_ctx *c)
{
    seed_spread *s = &c->spread;
    double lo0, hi0, mean0;
    s->runs = group_stats(c, 0, &lo0, &hi0, &mean0);
    s->loss = s->runs >= 2 ? hi0 - lo0 : NAN;
    s->base_mean = s->runs >= 2 ? mean0 : NAN;
    double base = c->runs[0].final_loss;
    for (int i = 0; i < c->n; i++) {
        variant_run *r = &c->runs[i];
        r->beyond_spread = -1;
        r->seed_runs = 0;
        r->seed_mean = NAN;
        if (i == 0 || r->v->replica || !isfinite(s->loss))
            continue;
        double lo, hi, mean;
        int n = group_stats(c, i, &lo, &hi, &mean);
        if (c->suite.replicate_all) {
            r->seed_runs = n;
            if (n >= 2) {
                r->seed_mean = mean;
                r->beyond_spread = hi < lo0 || lo > hi0;
            }
        } else if (isfinite(r->final_loss) && isfinite(base)) {
            r->beyond_spread = fabs(r->final_loss - base) > s->loss;
        }
    }
}

/* The difference a variant's row and the summary quote: its mean's from the base's under
 * replicate "all", else its final loss's from the base run's. */
double ablate_spread_delta(const ablate_ctx *c, const variant_run *r)
{
    if (c->suite.replicate_all)
        return r->seed_mean - c->spread.base_mean;
    return r->final_loss - c->runs[0].final_loss;
}

static void list(const ablate_ctx *c, FILE *f, int beyond)
{
    int any = 0;
    for (int i = 0; i < c->n; i++)
        if (c->runs[i].beyond_spread == beyond) {
            fprintf(f, "%s%s (%+.4f)", any ? ", " : "", c->runs[i].v->name,
                    ablate_spread_delta(c, &c->runs[i]));
            any = 1;
        }
    if (!any)
        fprintf(f, "none");
}

void ablate_spread_markdown(const ablate_ctx *c, FILE *f)
{
    if (c->suite.n_seeds < 2)
        return;
    const variant_run *b = &c->runs[0];
    fprintf(f, "\nSeed spread: the base under seeds");
    for (int i = 0, k = 0; i < c->n; i++)
        if (group_of(c, i) == 0)
            fprintf(f, "%s%lld", k++ ? ", " : " ", (long long)c->runs[i].seed);
    if (!isfinite(c->spread.loss)) {
        fprintf(f, ": not measured (fewer than two of its runs have a final validation "
                   "loss).\n");
        return;
    }
    fprintf(f, " ends %.4f apart in final validation loss", c->spread.loss);
    for (int i = 1, k = 0; i < c->n; i++)
        if (c->runs[i].v->replica && c->runs[i].v->of == 0) {
            char e[32] = "-";
            if (isfinite(c->runs[i].efficiency))
                snprintf(e, sizeof e, "%.3f", c->runs[i].efficiency);
            fprintf(f, "; %sof seed %lld against seed %lld: %s", k++ ? "" : "compute efficiency ",
                    (long long)c->runs[i].seed, (long long)b->seed, e);
        }
    if (c->suite.replicate_all)
        fprintf(f, ".\nEvery variant ran under each seed. Beyond the spread (none of its runs "
                   "inside the base's range, mean difference from the base's mean in "
                   "brackets): ");
    else
        fprintf(f, ".\nBeyond the spread (|final val loss - the base's| > %.4f): ",
                c->spread.loss);
    list(c, f, 1);
    fprintf(f, ". Within it: ");
    list(c, f, 0);
    fprintf(f, ".\n");
}

json_t *ablate_spread_json(const ablate_ctx *c)
{
    if (c->suite.n_seeds < 2)
        return json_null();
    json_t *runs = json_array(), *eff = json_array();
    for (int i = 0; i < c->n; i++)
        if (c->runs[i].v->replica && c->runs[i].v->of == 0)
            json_array_append_new(eff, ablate_num(c->runs[i].efficiency));
    for (int i = 0; i < c->n; i++)
        if (group_of(c, i) == 0)
            json_array_append_new(
                runs, json_pack("{s:s, s:I, s:o, s:o}", "name", c->runs[i].v->name, "seed",
                                (json_int_t)c->runs[i].seed, "final_val_loss",
                                ablate_num(c->runs[i].final_loss), "efficiency",
                                ablate_num(c->runs[i].efficiency)));
    return json_pack("{s:o, s:o, s:o, s:s, s:o}", "runs", runs, "final_val_loss_spread",
                     ablate_num(c->spread.loss), "replica_efficiency", eff, "replicate",
                     c->suite.replicate_all ? "all" : "base", "base_mean_final_val_loss",
                     ablate_num(c->spread.base_mean));
}
