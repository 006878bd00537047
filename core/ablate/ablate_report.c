/* The comparison of an ablation: each run's metrics.jsonl read back, compute efficiencies
 * against the base (efficiency.h), table.md, table.json and loss_vs_flops.{svg,png}. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ablate/ablate_internal.h"
#include "ablate/efficiency.h"
#include "metrics/run_metrics.h"
#include "plan/plan.h"
#include "plot/chart.h"
#include "util/fs.h"
#include "util/log.h"

/* What the table shows of a run, from its records: the validation curve, the last record's
 * counts, throughput and MFU over training-only intervals (so evaluations do not count against
 * a variant; MFU weighted by each interval's time, i.e. the intervals' FLOPs over their time)
 * and MaxVio averaged over the records of the last tenth of the run. */
static int summarise(variant_run *r, const run_metrics *m, k3rt_error *err)
{
    r->curve_flops = malloc(((size_t)m->n + 1) * sizeof *r->curve_flops);
    r->curve_loss = malloc(((size_t)m->n + 1) * sizeof *r->curve_loss);
    if (!r->curve_flops || !r->curve_loss)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    double prev_tokens = 0, tok = 0, secs = 0, tok_all = 0, secs_all = 0, vio_sum = 0;
    double mfu = 0, mfu_secs = 0, mfu_all = 0, mfu_secs_all = 0;
    double vio_last = NAN;
    int vio_n = 0;
    for (int i = 0; i < m->n; i++) {
        r->steps_done = m->step[i];
        r->tokens = m->tokens[i];
        r->flops = isfinite(m->flops[i]) ? m->flops[i] : 0;
        int eval = isfinite(m->val_loss[i]);
        /* A step-0 evaluation (train.eval_at_start) has no compute: it stays off the
         * loss-vs-FLOPs curve, whose axis and fit are logarithmic. */
        if (eval)
            r->final_loss = m->val_loss[i];
        if (eval && r->flops > 0) {
            r->curve_flops[r->n_curve] = r->flops;
            r->curve_loss[r->n_curve++] = r->final_loss;
        }
        double interval = r->tokens - prev_tokens, rate = m->tokens_per_s[i];
        prev_tokens = r->tokens;
        if (rate > 0) {
            double dt = interval / rate, u = m->mfu[i];
            tok_all += interval, secs_all += dt;
            if (!eval)
                tok += interval, secs += dt;
            if (isfinite(u)) {
                mfu_all += u * dt, mfu_secs_all += dt;
                if (!eval)
                    mfu += u * dt, mfu_secs += dt;
            }
        }
        if (isfinite(m->maxvio_worst[i])) {
            vio_last = m->maxvio_worst[i];
            if ((double)r->steps_done > 0.9 * (double)r->steps)
                vio_sum += vio_last, vio_n++;
        }
    }
    r->tokens_per_s = secs > 0 ? tok / secs : secs_all > 0 ? tok_all / secs_all : NAN;
    r->mfu = mfu_secs > 0 ? mfu / mfu_secs : mfu_secs_all > 0 ? mfu_all / mfu_secs_all : NAN;
    r->maxvio = vio_n ? vio_sum / vio_n : vio_last;
    return K3RT_OK;
}

static int read_metrics(variant_run *r, k3rt_error *err)
{
    r->final_loss = r->tokens_per_s = r->mfu = r->maxvio = NAN;
    run_metrics m;
    k3rt_error e = {0};
    int rc = run_metrics_read(r->dir, &m, &e);
    if (rc == K3RT_ERR_NOT_FOUND) {
        r->failed = 1;
        snprintf(r->failure, sizeof r->failure, "no %s/metrics.jsonl", r->dir);
        return K3RT_OK;
    }
    if (rc) {
        *err = e;
        return rc;
    }
    rc = summarise(r, &m, err);
    run_metrics_free(&m);
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

/* Against the seed spread: the difference from the base's final loss and where it lies. */
static void spread_cell(const ablate_ctx *c, const variant_run *r, char *buf, size_t len)
{
    double d = r->final_loss - c->runs[0].final_loss;
    if (r == c->runs || !isfinite(d))
        snprintf(buf, len, "-");
    else if (r->v->replica)
        snprintf(buf, len, "%+.4f (seed)", d);
    else
        snprintf(buf, len, "%+.4f%s", d, r->beyond_spread == 1   ? ", beyond"
                                         : r->beyond_spread == 0 ? ", within"
                                                                 : "");
}

static void table_row(FILE *f, const ablate_ctx *c, const variant_run *r)
{
    char ch[1024], tot[32], act[32], loss[32], tok[32], fl[32], tps[32], mfu[32], vio[32];
    char eff[96], spread[64] = "";
    int seeds = c->suite.n_seeds >= 2;
    changes(r, ch, sizeof ch);
    plan_human((double)r->params_total, tot, sizeof tot);
    plan_human((double)r->params_active, act, sizeof act);
    cell(r->final_loss, "%.4f", loss, sizeof loss);
    plan_human(r->tokens, tok, sizeof tok);
    sci(r->flops, fl, sizeof fl);
    cell(r->tokens_per_s, "%.0f", tps, sizeof tps);
    cell(100 * r->mfu, "%.1f%%", mfu, sizeof mfu);
    cell(r->maxvio, "%.3f", vio, sizeof vio);
    if (r->failed)
        snprintf(eff, sizeof eff, "failed: %s", r->failure);
    else if (isfinite(r->efficiency))
        snprintf(eff, sizeof eff, "%.3f%s", r->efficiency,
                 r->extrapolated ? " (extrapolated)" : "");
    else
        snprintf(eff, sizeof eff, "- (%s)", r->note);
    if (seeds)
        spread_cell(c, r, spread, sizeof spread);
    fprintf(f, "| %s | %s | %s (%s) | %s | %s | %s | %s | %s | %s | %s |%s%s%s\n", r->v->name,
            ch, tot, act, loss, tok, fl, tps, mfu, vio, eff, seeds ? " " : "", spread,
            seeds ? " |" : "");
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
        int seeds = c->suite.n_seeds >= 2;
        fprintf(o, "\n| variant | changes | parameters (active) | final val loss | tokens | "
                   "training FLOPs | tokens/s | MFU | MaxVio | compute efficiency |%s\n"
                   "|---|---|---|---|---|---|---|---|---|---|%s\n",
                seeds ? " Δ val loss vs base |" : "", seeds ? "---|" : "");
        for (int i = 0; i < c->n; i++)
            table_row(o, c, &c->runs[i]);
        ablate_spread_markdown(c, o);
    }
    K3RT_TRY(fs_close_synced(f, tmp, err));
    if (rename(tmp, path) != 0)
        return k3rt_fail(err, K3RT_ERR_IO, "%s: cannot rename into place", path);
    return K3RT_OK;
}

static json_t *run_json(const variant_run *r)
{
    json_t *sets = json_array(), *curve = json_array();
    for (int k = 0; k < r->v->n_sets; k++)
        json_array_append_new(sets, json_string(r->v->sets[k]));
    for (int i = 0; i < r->n_curve; i++)
        json_array_append_new(curve, json_pack("[f, f]", r->curve_flops[i], r->curve_loss[i]));
    double planned = r->step_flops * (double)r->steps;
    return json_pack(
        "{s:s, s:o, s:s, s:I, s:I, s:I, s:I, s:o, s:f, s:o, s:f, s:b, s:o, s:o, s:o, s:o, s:o, "
        "s:b, s:s, s:o, s:b, s:s, s:f, s:b, s:I, s:b, s:o, s:s}",
        "name", r->v->name, "set", sets, "dir", r->dir, "steps", (json_int_t)r->steps,
        "steps_done", (json_int_t)r->steps_done, "parameters", (json_int_t)r->params_total,
        "active_parameters", (json_int_t)r->params_active, "final_val_loss",
        ablate_num(r->final_loss), "tokens", r->tokens, "flops", ablate_num(r->flops),
        "planned_flops", planned, "flops_match", r->flops == planned, "tokens_per_s",
        ablate_num(r->tokens_per_s), "mfu", ablate_num(r->mfu), "maxvio", ablate_num(r->maxvio),
        "efficiency", ablate_num(r->efficiency), "base_flops", ablate_num(r->base_flops),
        "extrapolated", r->extrapolated, "note", r->note, "curve", curve, "failed", r->failed,
        "failure", r->failure, "seconds", r->seconds, "reused", r->reused, "seed",
        (json_int_t)r->seed, "seed_replica", r->v->replica, "beyond_seed_spread",
        r->beyond_spread < 0 ? json_null() : json_boolean(r->beyond_spread), "key", r->key);
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
    json_t *doc = json_pack("{s:s, s:s, s:s, s:s, s:s?, s:o, s:o, s:o, s:o, s:o}", "suite",
                            c->suite.name, "file", c->o->suite_path, "base", c->suite.base,
                            "description", c->suite.description, "command", c->o->command,
                            "set", sets, "command_set", cli, "base_power_law", law,
                            "seed_spread", ablate_spread_json(c), "variants", runs);
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
                              c->runs[i].n_curve, 0, 0};
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
            c->runs[i].final_loss = c->runs[i].tokens_per_s = c->runs[i].mfu =
                c->runs[i].maxvio = NAN;
    for (int i = 0; i < c->n; i++) {
        const variant_run *r = &c->runs[i];
        if (!r->failed && r->flops != r->step_flops * (double)r->steps)
            log_warn("%s: the run counted %.6e training FLOPs, the planner %.6e", r->v->name,
                     r->flops, r->step_flops * (double)r->steps);
    }
    power_law fit;
    int have_fit;
    efficiencies(c, &fit, &have_fit);
    ablate_seed_spread(c);
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
