/* The comparison of an ablation: each run's metrics.jsonl read back, compute efficiencies
 * against the base (efficiency.h), table.md, table.json and loss_vs_flops.{svg,png}. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ablate/ablate_internal.h"
#include "ablate/efficiency.h"
#include "plan/plan.h"
#include "plot/chart.h"
#include "util/fs.h"
#include "util/log.h"

static int append_point(variant_run *r, double x, double y, int *cap)
{
    if (r->n_curve == *cap) {
        int n = *cap ? 2 * *cap : 64;
        double *px = realloc(r->curve_flops, (size_t)n * sizeof *px);
        if (!px)
            return K3RT_ERR_NOMEM;
        r->curve_flops = px;
        double *py = realloc(r->curve_loss, (size_t)n * sizeof *py);
        if (!py)
            return K3RT_ERR_NOMEM;
        r->curve_loss = py;
        *cap = n;
    }
    r->curve_flops[r->n_curve] = x;
    r->curve_loss[r->n_curve++] = y;
    return K3RT_OK;
}

/* Per logged record: throughput (training-only intervals, so evaluations do not count
 * against a variant) and MaxVio (averaged over the records of the last tenth of the run). */
typedef struct reader {
    double prev_tokens, tok, secs, tok_all, secs_all;
    double vio_sum, vio_last;
    int vio_n, vio_any;
} reader;

static void read_record(variant_run *r, reader *rd, const json_t *rec, int *cap)
{
    const json_t *val = json_object_get(rec, "val_loss");
    const json_t *vio = json_object_get(rec, "maxvio_worst");
    r->steps_done = json_integer_value(json_object_get(rec, "step"));
    r->tokens = json_number_value(json_object_get(rec, "tokens"));
    r->flops = json_number_value(json_object_get(rec, "flops"));
    if (json_is_number(val)) {
        r->final_loss = json_number_value(val);
        if (append_point(r, r->flops, r->final_loss, cap))
            r->n_curve = -1; /* out of memory: reported by the caller */
    }
    double interval = r->tokens - rd->prev_tokens;
    double rate = json_number_value(json_object_get(rec, "tokens_per_s"));
    rd->prev_tokens = r->tokens;
    if (rate > 0) {
        rd->tok_all += interval, rd->secs_all += interval / rate;
        if (!val)
            rd->tok += interval, rd->secs += interval / rate;
    }
    if (json_is_number(vio)) {
        rd->vio_any = 1;
        rd->vio_last = json_number_value(vio);
        if ((double)r->steps_done > 0.9 * (double)r->steps)
            rd->vio_sum += rd->vio_last, rd->vio_n++;
    }
}

static int read_metrics(variant_run *r, k3rt_error *err)
{
    char path[2400];
    fs_join(path, sizeof path, r->dir, "metrics.jsonl");
    FILE *f = fopen(path, "rb");
    r->final_loss = r->tokens_per_s = r->maxvio = NAN;
    if (!f) {
        r->failed = 1;
        snprintf(r->failure, sizeof r->failure, "no %s", path);
        return K3RT_OK;
    }
    reader rd = {0};
    int cap = 0, rc = K3RT_OK;
    char line[1 << 16];
    while (!rc && fgets(line, sizeof line, f)) {
        json_t *rec = json_loads(line, 0, NULL);
        /* the training-step records (they count tokens); others, such as --profile's
         * table, describe the run rather than a step */
        if (json_is_object(rec) && json_is_number(json_object_get(rec, "tokens")))
            read_record(r, &rd, rec, &cap);
        json_decref(rec);
        if (r->n_curve < 0)
            rc = k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    }
    fclose(f);
    r->tokens_per_s = rd.secs > 0       ? rd.tok / rd.secs
                      : rd.secs_all > 0 ? rd.tok_all / rd.secs_all
                                        : NAN;
    r->maxvio = rd.vio_n ? rd.vio_sum / rd.vio_n : rd.vio_any ? rd.vio_last : NAN;
    if (!rc && !r->failed && r->steps_done < r->steps) {
        r->failed = 1;
        snprintf(r->failure, sizeof r->failure, "stopped at step %lld of %lld",
                 (long long)r->steps_done, (long long)r->steps);
    }
    return rc;
}

static void efficiencies(ablate_ctx *c, power_law *fit, int *have_fit)
{
    const variant_run *b = &c->runs[0];
    k3rt_error e = {0};
    *have_fit = b->n_curve > 0 && !eff_fit(b->curve_flops, b->curve_loss, b->n_curve, fit, &e);
    for (int i = 0; i < c->n; i++) {
        variant_run *r = &c->runs[i];
        r->efficiency = r->base_flops = NAN;
        if (i == 0) {
            r->efficiency = 1;
            r->base_flops = r->flops;
            continue;
        }
        if (!isfinite(r->final_loss) || !(r->flops > 0) || b->n_curve < 1) {
            snprintf(r->note, sizeof r->note, "no comparison: %s",
                     b->n_curve < 1 ? "the base has no validation curve"
                                    : "the variant has no final validation loss");
            continue;
        }
        memset(&e, 0, sizeof e);
        if (eff_base_flops(b->curve_flops, b->curve_loss, b->n_curve, r->final_loss,
                           &r->base_flops, &r->extrapolated, &e)) {
            snprintf(r->note, sizeof r->note, "%s", e.msg);
            continue;
        }
        r->efficiency = r->base_flops / r->flops;
    }
}

static void sci(double v, char *buf, size_t len)
{
    if (!isfinite(v)) {
        snprintf(buf, len, "-");
        return;
    }
    int e = v > 0 ? (int)floor(log10(v)) : 0;
    snprintf(buf, len, "%.3fe%d", v / pow(10, e), e);
}

static void cell(double v, const char *fmt, char *buf, size_t len)
{
    if (isfinite(v))
        snprintf(buf, len, fmt, v);
    else
        snprintf(buf, len, "-");
}

/* The variant's own overrides, '|' escaped for Markdown. */
static void changes(const variant_run *r, char *buf, size_t len)
{
    size_t at = 0;
    buf[0] = '\0';
    for (int k = 0; k < r->v->n_sets && at + 4 < len; k++) {
        if (k)
            at += (size_t)snprintf(buf + at, len - at, "; ");
        for (const char *s = r->v->sets[k]; *s && at + 3 < len; s++) {
            if (*s == '|')
                buf[at++] = '\\';
            buf[at++] = *s;
        }
        buf[at] = '\0';
    }
    if (!r->v->n_sets)
        snprintf(buf, len, "(base)");
}

static void table_row(FILE *f, const variant_run *r)
{
    char ch[1024], tot[32], act[32], loss[32], tok[32], fl[32], tps[32], vio[32], eff[96];
    changes(r, ch, sizeof ch);
    plan_human((double)r->params_total, tot, sizeof tot);
    plan_human((double)r->params_active, act, sizeof act);
    cell(r->final_loss, "%.4f", loss, sizeof loss);
    plan_human(r->tokens, tok, sizeof tok);
    sci(r->flops, fl, sizeof fl);
    cell(r->tokens_per_s, "%.0f", tps, sizeof tps);
    cell(r->maxvio, "%.3f", vio, sizeof vio);
    if (r->failed)
        snprintf(eff, sizeof eff, "failed: %s", r->failure);
    else if (isfinite(r->efficiency))
        snprintf(eff, sizeof eff, "%.3f%s", r->efficiency,
                 r->extrapolated ? " (extrapolated)" : "");
    else
        snprintf(eff, sizeof eff, "- (%s)", r->note);
    fprintf(f, "| %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s |\n", r->v->name, ch, tot, act,
            loss, tok, fl, tps, vio, eff);
}

static int write_markdown(const ablate_ctx *c, const char *path, FILE *also, k3rt_error *err)
{
    char tmp[2400];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    FILE *f = fopen(tmp, "wb");
    if (!f)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot create", tmp);
    for (int pass = 0; pass < (also ? 2 : 1); pass++) {
        FILE *o = pass ? also : f;
        fprintf(o, "Suite `%s` (%s): base `%s`", c->suite.name, c->o->suite_path, c->suite.base);
        for (int k = 0; k < c->runs[0].n_sets; k++)
            fprintf(o, "%s`%s`", k ? ", " : " with ", c->runs[0].sets[k]);
        fprintf(o, ".\n");
        if (c->suite.description[0])
            fprintf(o, "%s\n", c->suite.description);
        if (c->o->command)
            fprintf(o, "\nCommand: `%s`\n", c->o->command);
        fprintf(o, "\n| variant | changes | parameters (active) | final val loss | tokens | "
                   "training FLOPs | tokens/s | MaxVio | compute efficiency |\n"
                   "|---|---|---|---|---|---|---|---|---|\n");
        for (int i = 0; i < c->n; i++)
            table_row(o, &c->runs[i]);
    }
    K3RT_TRY(fs_close_synced(f, tmp, err));
    if (rename(tmp, path) != 0)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot rename into place", path);
    return K3RT_OK;
}

static json_t *num(double v) { return isfinite(v) ? json_real(v) : json_null(); }

static json_t *run_json(const variant_run *r)
{
    json_t *sets = json_array(), *curve = json_array();
    for (int k = 0; k < r->v->n_sets; k++)
        json_array_append_new(sets, json_string(r->v->sets[k]));
    for (int i = 0; i < r->n_curve; i++)
        json_array_append_new(curve, json_pack("[f, f]", r->curve_flops[i], r->curve_loss[i]));
    double planned = r->step_flops * (double)r->steps;
    return json_pack("{s:s, s:o, s:s, s:I, s:I, s:I, s:I, s:o, s:f, s:o, s:f, s:b, s:o, s:o, "
                     "s:o, s:o, s:b, s:s, s:o, s:b, s:s, s:f, s:b}",
                     "name", r->v->name, "set", sets, "dir", r->dir, "steps",
                     (json_int_t)r->steps, "steps_done", (json_int_t)r->steps_done,
                     "parameters", (json_int_t)r->params_total, "active_parameters",
                     (json_int_t)r->params_active, "final_val_loss", num(r->final_loss),
                     "tokens", r->tokens, "flops", num(r->flops), "planned_flops", planned,
                     "flops_match", r->flops == planned, "tokens_per_s", num(r->tokens_per_s),
                     "maxvio", num(r->maxvio), "efficiency", num(r->efficiency), "base_flops",
                     num(r->base_flops), "extrapolated", r->extrapolated, "note", r->note,
                     "curve", curve, "failed", r->failed, "failure", r->failure, "seconds",
                     r->seconds, "reused", r->reused);
}

static int write_json(const ablate_ctx *c, const char *path, const power_law *fit, int have_fit,
                      k3rt_error *err)
{
    json_t *runs = json_array(), *sets = json_array(), *cli = json_array();
    for (int i = 0; i < c->n; i++)
        json_array_append_new(runs, run_json(&c->runs[i]));
    for (int k = 0; k < c->suite.n_sets; k++)
        json_array_append_new(sets, json_string(c->suite.sets[k]));
    for (int k = 0; k < c->o->n_overrides; k++)
        json_array_append_new(cli, json_string(c->o->overrides[k]));
    json_t *law = have_fit ? json_pack("{s:f, s:f, s:i}", "A", fit->A, "alpha", fit->alpha,
                                       "points", fit->points)
                           : json_null();
    json_t *doc = json_pack("{s:s, s:s, s:s, s:s, s:s?, s:o, s:o, s:o, s:o}", "suite",
                            c->suite.name, "file", c->o->suite_path, "base", c->suite.base,
                            "description", c->suite.description, "command", c->o->command,
                            "set", sets, "command_set", cli, "base_power_law", law, "variants",
                            runs);
    char *text = doc ? json_dumps(doc, JSON_INDENT(2) | JSON_REAL_PRECISION(17)) : NULL;
    json_decref(doc);
    if (!text)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", path);
    int rc = fs_write_atomic(path, text, strlen(text), err);
    free(text);
    return rc;
}

static int write_charts(const ablate_ctx *c, k3rt_error *err)
{
    chart_series *s = calloc((size_t)c->n, sizeof *s);
    if (!s)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < c->n; i++)
        s[i] = (chart_series){c->runs[i].v->name, c->runs[i].curve_flops, c->runs[i].curve_loss,
                              c->runs[i].n_curve};
    char title[256], svg[2100], png[2100];
    snprintf(title, sizeof title, "%s: validation loss vs training FLOPs", c->suite.name);
    chart_spec spec = {title, "training FLOPs (forward + backward, the plugins' counts)",
                       "validation loss (nats/token)", 1, s, c->n};
    fs_join(svg, sizeof svg, c->root, "loss_vs_flops.svg");
    fs_join(png, sizeof png, c->root, "loss_vs_flops.png");
    int rc = chart_write_svg(&spec, svg, err);
    if (!rc)
        rc = chart_write_png(&spec, png, err);
    free(s);
    return rc;
}

int ablate_report(ablate_ctx *c, k3rt_error *err)
{
    for (int i = 0; i < c->n; i++)
        if (!c->runs[i].failed)
            K3RT_TRY(read_metrics(&c->runs[i], err));
        else
            c->runs[i].final_loss = c->runs[i].tokens_per_s = c->runs[i].maxvio = NAN;
    for (int i = 0; i < c->n; i++) {
        const variant_run *r = &c->runs[i];
        if (!r->failed && r->flops != r->step_flops * (double)r->steps)
            log_warn("%s: the run counted %.6e training FLOPs, the planner %.6e", r->v->name,
                     r->flops, r->step_flops * (double)r->steps);
    }
    power_law fit;
    int have_fit;
    efficiencies(c, &fit, &have_fit);
    char md[2100], js[2100];
    fs_join(md, sizeof md, c->root, "table.md");
    fs_join(js, sizeof js, c->root, "table.json");
    K3RT_TRY(write_json(c, js, &fit, have_fit, err));
    K3RT_TRY(write_charts(c, err));
    K3RT_TRY(write_markdown(c, md, c->o->quiet ? NULL : stdout, err));
    if (!c->o->quiet)
        log_info("wrote %s, %s and %s/loss_vs_flops.{svg,png}", md, js, c->root);
    return K3RT_OK;
}
