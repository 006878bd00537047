/* Several runs' loss and MaxVio curves in one SVG (runs_plot.h). */
#include "plot/runs_plot.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "metrics/run_metrics.h"
#include "plot/chart.h"

typedef struct plotted {
    run_metrics m;
    char name[128];
    double *step;        /* the steps as doubles, for the MaxVio panel's x */
} plotted;

/* A run's label: its folder's last component ("runs/tiny/" -> "tiny"). */
static void run_name(const char *dir, char *buf, size_t len)
{
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/')
        n--;
    size_t at = n;
    while (at > 0 && dir[at - 1] != '/')
        at--;
    snprintf(buf, len, "%.*s", (int)(n - at), dir + at);
}

static int load(plotted *p, const char *dir, k3rt_error *err)
{
    run_name(dir, p->name, sizeof p->name);
    K3RT_TRY(run_metrics_read(dir, &p->m, err));
    if (p->m.n == 0)
        return k3rt_fail(err, K3RT_ERR_INVALID, "%s/metrics.jsonl: no training-step records "
                         "(lines with \"tokens\") to plot", dir);
    p->step = malloc((size_t)p->m.n * sizeof *p->step);
    if (!p->step)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    for (int i = 0; i < p->m.n; i++)
        p->step[i] = (double)p->m.step[i];
    return K3RT_OK;
}

/* The loss panels: per run a training and a validation series in the run's colour. */
static void loss_series(const plotted *p, int n, int by_flops, chart_series *s, char (*names)[160])
{
    for (int r = 0; r < n; r++) {
        const double *x = by_flops ? p[r].m.flops : p[r].m.tokens;
        snprintf(names[2 * r], 160, "%s train", p[r].name);
        snprintf(names[2 * r + 1], 160, "%s val", p[r].name);
        s[2 * r] = (chart_series){names[2 * r], x, p[r].m.train_loss, p[r].m.n, r + 1, 1};
        s[2 * r + 1] = (chart_series){names[2 * r + 1], x, p[r].m.val_loss, p[r].m.n, r + 1, 0};
    }
}

/* The MaxVio panel: one series per (run, MoE layer), reading the layer's column out of the
 * run's record-major table into cols. */
static int maxvio_series(const plotted *p, int n, chart_series *s, char (*names)[160],
                         double **cols, int *count, k3rt_error *err)
{
    int k = 0;
    for (int r = 0; r < n; r++)
        for (int l = 0; l < p[r].m.n_moe; l++, k++) {
            const run_metrics *m = &p[r].m;
            cols[k] = malloc((size_t)m->n * sizeof **cols);
            if (!cols[k])
                return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
            for (int i = 0; i < m->n; i++)
                cols[k][i] = m->maxvio[(size_t)i * (size_t)m->n_moe + (size_t)l];
            if (n > 1)
                snprintf(names[k], 160, "%s layer %d", p[r].name, m->moe_layer[l]);
            else
                snprintf(names[k], 160, "layer %d", m->moe_layer[l]);
            /* colours after the runs' own, so a layer never looks like a run's loss */
            s[k] = (chart_series){names[k], p[r].step, cols[k], m->n, n + k + 1, 0};
            *count = k + 1;
        }
    return K3RT_OK;
}

static int draw(const plotted *p, int n, const char *svg_path, k3rt_error *err)
{
    int n_moe = 0;
    for (int r = 0; r < n; r++)
        n_moe += p[r].m.n_moe;
    int n_series = 4 * n + n_moe, n_cols = 0;
    chart_series *s = calloc((size_t)n_series, sizeof *s);
    char (*names)[160] = calloc((size_t)n_series, sizeof *names);
    double **cols = calloc((size_t)n_moe + 1, sizeof *cols);
    int rc = !s || !names || !cols ? k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory") : K3RT_OK;
    if (!rc) {
        loss_series(p, n, 0, s, names);
        loss_series(p, n, 1, s + 2 * n, names + 2 * n);
        rc = maxvio_series(p, n, s + 4 * n, names + 4 * n, cols, &n_cols, err);
    }
    if (!rc) {
        const char *y = "loss (nats/token)";
        chart_spec panels[3] = {
            {"training and validation loss vs tokens", "tokens", y, 0, s, 2 * n},
            {"training and validation loss vs training FLOPs",
             "training FLOPs (forward + backward, the plugins' counts)", y, 1, s + 2 * n, 2 * n},
            {"MaxVio per MoE layer (max expert load / mean load - 1)", "step", "MaxVio", 0,
             s + 4 * n, n_moe},
        };
        rc = chart_write_svg_panels(panels, n_moe ? 3 : 2, svg_path, err);
    }
    for (int k = 0; k < n_cols; k++)
        free(cols[k]);
    free(cols);
    free(names);
    free(s);
    return rc;
}

int runs_plot_write(const char *const *dirs, int n, const char *svg_path, k3rt_error *err)
{
    plotted *p = calloc((size_t)n, sizeof *p);
    if (!p)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "out of memory");
    int rc = K3RT_OK;
    for (int r = 0; r < n && !rc; r++)
        rc = load(&p[r], dirs[r], err);
    if (!rc)
        rc = draw(p, n, svg_path, err);
    for (int r = 0; r < n; r++) {
        run_metrics_free(&p[r].m);
        free(p[r].step);
    }
    free(p);
    return rc;
}
