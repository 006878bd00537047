/* The seed spread of a suite with `seeds` (suite.h). The base trained under each seed tells
 * how far two runs differing only in their seed (initialisation and data order) end apart;
 * a variant's difference from the base says something about the variant only when it is
 * larger. With two seeds this is one sample of that noise: a yardstick, not a test.
 *
 * spread = max - min of the base runs' final validation losses. A variant is beyond it when
 * |its final validation loss - the base's| > spread, within it otherwise. Each replica's
 * compute efficiency against the base (its own row's) is the spread in the efficiency
 * column's terms: how far from 1 a variant's efficiency may be by the seed alone. */
#include <math.h>
#include <string.h>

#include "ablate/ablate_internal.h"

static int is_base_run(const ablate_ctx *c, int i)
{
    return i == 0 || c->runs[i].v->replica;
}

void ablate_seed_spread(ablate_ctx *c)
{
    seed_spread *s = &c->spread;
    double lo = INFINITY, hi = -INFINITY;
    s->runs = 0;
    for (int i = 0; i < c->n; i++)
        if (is_base_run(c, i) && isfinite(c->runs[i].final_loss)) {
            s->runs++;
            lo = fmin(lo, c->runs[i].final_loss);
            hi = fmax(hi, c->runs[i].final_loss);
        }
    s->loss = s->runs >= 2 ? hi - lo : NAN;
    double base = c->runs[0].final_loss;
    for (int i = 0; i < c->n; i++) {
        variant_run *r = &c->runs[i];
        r->beyond_spread = -1;
        if (!is_base_run(c, i) && isfinite(s->loss) && isfinite(r->final_loss) &&
            isfinite(base))
            r->beyond_spread = fabs(r->final_loss - base) > s->loss;
    }
}

static void list(const ablate_ctx *c, FILE *f, int beyond)
{
    int any = 0;
    for (int i = 0; i < c->n; i++)
        if (c->runs[i].beyond_spread == beyond) {
            fprintf(f, "%s%s (%+.4f)", any ? ", " : "", c->runs[i].v->name,
                    c->runs[i].final_loss - c->runs[0].final_loss);
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
    for (int i = 0; i < c->n; i++)
        if (is_base_run(c, i))
            fprintf(f, "%s%lld", i ? ", " : " ", (long long)c->runs[i].seed);
    if (!isfinite(c->spread.loss)) {
        fprintf(f, ": not measured (fewer than two of its runs have a final validation "
                   "loss).\n");
        return;
    }
    fprintf(f, " ends %.4f apart in final validation loss", c->spread.loss);
    for (int i = 1, k = 0; i < c->n; i++)
        if (c->runs[i].v->replica) {
            char e[32] = "-";
            if (isfinite(c->runs[i].efficiency))
                snprintf(e, sizeof e, "%.3f", c->runs[i].efficiency);
            fprintf(f, "; %sof seed %lld against seed %lld: %s", k++ ? "" : "compute efficiency ",
                    (long long)c->runs[i].seed, (long long)b->seed, e);
        }
    fprintf(f, ".\nBeyond the spread (|final val loss - the base's| > %.4f): ", c->spread.loss);
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
        if (c->runs[i].v->replica)
            json_array_append_new(eff, ablate_num(c->runs[i].efficiency));
    for (int i = 0; i < c->n; i++)
        if (is_base_run(c, i))
            json_array_append_new(
                runs, json_pack("{s:s, s:I, s:o, s:o}", "name", c->runs[i].v->name, "seed",
                                (json_int_t)c->runs[i].seed, "final_val_loss",
                                ablate_num(c->runs[i].final_loss), "efficiency",
                                ablate_num(c->runs[i].efficiency)));
    return json_pack("{s:o, s:o, s:o}", "runs", runs, "final_val_loss_spread",
                     ablate_num(c->spread.loss), "replica_efficiency", eff);
}
