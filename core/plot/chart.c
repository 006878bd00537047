/* Chart layout: axes, ticks, grid, series and legend as drawing items (chart.h). */
#include "plot/chart.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "plot/plot_list.h"

/* Ten distinguishable colours (the common "category10" set). */
static const uint32_t PALETTE[] = {0x1f77b4, 0xd62728, 0x2ca02c, 0xff7f0e, 0x9467bd,
                                   0x8c564b, 0xe377c2, 0x7f7f7f, 0xbcbd22, 0x17becf};

typedef struct frame {
    double x0, x1, y0, y1;   /* data range (log10 of x on a log axis) */
    double left, top, w, h;  /* plot area */
    int log_x;
} frame;

static double fx(const frame *f, double x)
{
    double v = f->log_x ? log10(x) : x;
    return f->left + (v - f->x0) / (f->x1 - f->x0) * f->w;
}

static double fy(const frame *f, double y)
{
    return f->top + (f->y1 - y) / (f->y1 - f->y0) * f->h;
}

static int usable(const chart_spec *c, double x, double y)
{
    return isfinite(x) && isfinite(y) && (!c->log_x || x > 0);
}

static int add_line(plot_list *l, double x0, double y0, double x1, double y1, uint32_t color,
                    double width, k3rt_error *err)
{
    plot_item it = {.kind = ITEM_LINE, .x0 = x0, .y0 = y0, .x1 = x1, .y1 = y1,
                    .width = width, .color = color};
    return plot_add_item(l, &it, err);
}

static int add_text(plot_list *l, double x, double y, const char *s, double size, int anchor,
                    int vertical, uint32_t color, k3rt_error *err)
{
    plot_item it = {.kind = ITEM_TEXT, .x0 = x, .y0 = y, .size = size, .anchor = anchor,
                    .vertical = vertical, .color = color};
    snprintf(it.text, sizeof it.text, "%s", s ? s : "");
    return plot_add_item(l, &it, err);
}

static double nice_step(double span)
{
    double raw = span / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

static void fit_range(const chart_spec *c, frame *f)
{
    double xl = INFINITY, xh = -INFINITY, yl = INFINITY, yh = -INFINITY;
    for (int s = 0; s < c->n_series; s++)
        for (int i = 0; i < c->series[s].n; i++) {
            double x = c->series[s].x[i], y = c->series[s].y[i];
            if (!usable(c, x, y))
                continue;
            x = c->log_x ? log10(x) : x;
            xl = fmin(xl, x), xh = fmax(xh, x), yl = fmin(yl, y), yh = fmax(yh, y);
        }
    if (!isfinite(xl)) {
        xl = 0, xh = 1, yl = 0, yh = 1;
    }
    if (xh - xl < 1e-9)
        xl -= 0.5, xh += 0.5;
    if (yh - yl < 1e-9)
        yl -= 0.5, yh += 0.5;
    f->x0 = xl - 0.03 * (xh - xl), f->x1 = xh + 0.03 * (xh - xl);
    f->y0 = yl - 0.05 * (yh - yl), f->y1 = yh + 0.05 * (yh - yl);
}

static int y_axis(plot_list *l, const frame *f, k3rt_error *err)
{
    double step = nice_step(f->y1 - f->y0);
    int decimals = step >= 1 ? 0 : (int)ceil(-log10(step) - 1e-9);
    for (double y = ceil(f->y0 / step) * step; y <= f->y1; y += step) {
        char label[32];
        snprintf(label, sizeof label, "%.*f", decimals, y);
        K3RT_TRY(add_line(l, f->left, fy(f, y), f->left + f->w, fy(f, y), 0xeeeeee, 1, err));
        K3RT_TRY(add_text(l, f->left - 6, fy(f, y) + 4, label, 12, 2, 0, 0x333333, err));
    }
    return K3RT_OK;
}

static int x_tick(plot_list *l, const frame *f, double v, const char *label, k3rt_error *err)
{
    double x = fx(f, v);
    K3RT_TRY(add_line(l, x, f->top, x, f->top + f->h, 0xeeeeee, 1, err));
    return add_text(l, x, f->top + f->h + 18, label, 12, 1, 0, 0x333333, err);
}

/* Log axis: decades, with 2x and 5x between them when the range is under two decades and
 * every multiple when it is under one. */
static int x_axis(plot_list *l, const frame *f, k3rt_error *err)
{
    char label[32];
    if (!f->log_x) {
        double step = nice_step(f->x1 - f->x0);
        for (double x = ceil(f->x0 / step) * step; x <= f->x1; x += step) {
            snprintf(label, sizeof label, "%.4g", x);
            K3RT_TRY(x_tick(l, f, x, label, err));
        }
        return K3RT_OK;
    }
    static const int few[] = {1, 2, 5}, all[] = {1, 2, 3, 4, 5, 6, 7, 8, 9};
    double span = f->x1 - f->x0;
    const int *mult = span < 1 ? all : few;
    int n_mult = span < 1 ? 9 : span < 2 ? 3 : 1;
    for (int e = (int)floor(f->x0); e <= (int)ceil(f->x1); e++)
        for (int k = 0; k < n_mult; k++) {
            double lv = e + log10((double)mult[k]);
            if (lv < f->x0 || lv > f->x1)
                continue;
            snprintf(label, sizeof label, "%de%d", mult[k], e);
            K3RT_TRY(x_tick(l, f, pow(10, lv), label, err));
        }
    return K3RT_OK;
}

static int series(plot_list *l, const chart_spec *c, const frame *f, k3rt_error *err)
{
    for (int s = 0; s < c->n_series; s++) {
        const chart_series *cs = &c->series[s];
        int slot = cs->color ? cs->color - 1 : s;
        uint32_t color = PALETTE[slot % (int)(sizeof PALETTE / sizeof PALETTE[0])];
        double width = cs->thin ? 1 : 2;
        int prev = -1;
        for (int i = 0; i < cs->n; i++) {
            if (!usable(c, cs->x[i], cs->y[i]))
                continue;
            double x = fx(f, cs->x[i]), y = fy(f, cs->y[i]);
            if (prev >= 0)
                K3RT_TRY(add_line(l, fx(f, cs->x[prev]), fy(f, cs->y[prev]), x, y, color,
                                  width, err));
            plot_item dot = {.kind = ITEM_CIRCLE, .x0 = x, .y0 = y, .width = 3, .color = color};
            if (!cs->thin)
                K3RT_TRY(plot_add_item(l, &dot, err));
            prev = i;
        }
        double lx = f->left + f->w + 20, ly = f->top + 12 + 20 * s;
        K3RT_TRY(add_line(l, lx, ly - 4, lx + 20, ly - 4, color, width, err));
        K3RT_TRY(add_text(l, lx + 26, ly, cs->name, 12, 0, 0, 0x222222, err));
    }
    return K3RT_OK;
}

enum { CHART_W = 800, CHART_H = 500 };

/* One chart whose top edge is at y = top of the list's page. */
static int layout_at(const chart_spec *c, plot_list *l, double top, k3rt_error *err)
{
    frame f = {.left = 80, .top = top + 45, .w = 520, .h = 375, .log_x = c->log_x};
    fit_range(c, &f);
    K3RT_TRY(add_text(l, CHART_W / 2, top + 26, c->title, 15, 1, 0, 0x000000, err));
    K3RT_TRY(y_axis(l, &f, err));
    K3RT_TRY(x_axis(l, &f, err));
    plot_item box = {.kind = ITEM_RECT, .x0 = f.left, .y0 = f.top, .x1 = f.w, .y1 = f.h,
                     .width = 1, .color = 0x888888};
    K3RT_TRY(plot_add_item(l, &box, err));
    K3RT_TRY(add_text(l, f.left + f.w / 2, f.top + f.h + 40, c->x_label, 12, 1, 0, 0x000000,
                      err));
    K3RT_TRY(add_text(l, 22, f.top + f.h / 2, c->y_label, 12, 1, 1, 0x000000, err));
    return series(l, c, &f, err);
}

static int layout(const chart_spec *c, int n, plot_list *l, k3rt_error *err)
{
    memset(l, 0, sizeof *l);
    l->width = CHART_W;
    l->height = CHART_H * n;
    l->background = 0xffffff;
    for (int i = 0; i < n; i++)
        K3RT_TRY(layout_at(&c[i], l, CHART_H * i, err));
    return K3RT_OK;
}

int chart_write_svg(const chart_spec *c, const char *path, k3rt_error *err)
{
    return chart_write_svg_panels(c, 1, path, err);
}

int chart_write_svg_panels(const chart_spec *c, int n, const char *path, k3rt_error *err)
{
    plot_list l;
    int rc = layout(c, n, &l, err);
    if (!rc)
        rc = plot_write_svg_list(&l, path, err);
    plot_list_free(&l);
    return rc;
}

int chart_write_png(const chart_spec *c, const char *path, k3rt_error *err)
{
    plot_list l;
    int rc = layout(c, 1, &l, err);
    if (!rc)
        rc = plot_write_png_list(&l, path, err);
    plot_list_free(&l);
    return rc;
}

int plot_add_item(plot_list *l, const plot_item *it, k3rt_error *err)
{
    if (l->n == l->cap) {
        int cap = l->cap ? 2 * l->cap : 64;
        plot_item *p = realloc(l->items, (size_t)cap * sizeof *p);
        if (!p)
            return k3rt_fail(err, K3RT_ERR_NOMEM, "chart: out of memory");
        l->items = p;
        l->cap = cap;
    }
    l->items[l->n++] = *it;
    return K3RT_OK;
}

void plot_list_free(plot_list *l)
{
    free(l->items);
    memset(l, 0, sizeof *l);
}
