/* SVG loss curves (loss_chart.h). */
#include "plot/loss_chart.h"

#include <math.h>
#include <stdio.h>

#include "plot/svg.h"
#include "util/fs.h"

typedef struct frame {
    double x0, x1, y0, y1;   /* data range */
    double left, top, w, h;  /* plot area in pixels */
} frame;

static double px(const frame *f, double x) { return f->left + (x - f->x0) / (f->x1 - f->x0) * f->w; }
static double py(const frame *f, double y) { return f->top + (f->y1 - y) / (f->y1 - f->y0) * f->h; }

static void range(const loss_series *s, double *lo, double *hi, double *xmax)
{
    for (int64_t i = 0; i < s->n; i++) {
        if (!isfinite(s->y[i]))
            continue;
        if (s->y[i] < *lo) *lo = s->y[i];
        if (s->y[i] > *hi) *hi = s->y[i];
        if (s->x[i] > *xmax) *xmax = s->x[i];
    }
}

/* A polyline of a series; a training curve this long is averaged over windows so the line
 * shows the trend and stays small. */
static void polyline(FILE *f, const frame *fr, const loss_series *s, const char *color,
                     int64_t max_points, double width)
{
    if (s->n == 0)
        return;
    int64_t win = s->n > max_points ? (s->n + max_points - 1) / max_points : 1;
    fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"%.1f\" points=\"", color,
            width);
    for (int64_t i = 0; i < s->n; i += win) {
        double sx = 0, sy = 0;
        int64_t k = 0;
        for (int64_t j = i; j < s->n && j < i + win; j++)
            if (isfinite(s->y[j])) {
                sx += s->x[j];
                sy += s->y[j];
                k++;
            }
        if (k)
            fprintf(f, "%.1f,%.1f ", px(fr, sx / k), py(fr, sy / k));
    }
    fprintf(f, "\"/>\n");
}

static double nice_step(double span)
{
    double raw = span / 5, mag = pow(10, floor(log10(raw))), r = raw / mag;
    return (r < 1.5 ? 1 : r < 3.5 ? 2 : r < 7.5 ? 5 : 10) * mag;
}

int loss_chart_write_svg(const loss_history *h, const char *title, const char *path,
                         k3rt_error *err)
{
    double lo = INFINITY, hi = -INFINITY, xmax = 1;
    range(&h->train, &lo, &hi, &xmax);
    range(&h->val, &lo, &hi, &xmax);
    if (!isfinite(lo)) {
        lo = 0;
        hi = 1;
    }
    if (hi - lo < 1e-6)
        hi = lo + 1;
    frame fr = {0, xmax, lo - 0.05 * (hi - lo), hi + 0.05 * (hi - lo), 70, 40, 600, 360};
    fs_atomic a;
    K3RT_TRY(fs_atomic_open(&a, path, err));
    FILE *f = a.f;
    svg_begin(f, 700, 460, 12);
    fputs("<text x=\"350\" y=\"22\" text-anchor=\"middle\" font-size=\"15\">", f);
    svg_put_text(f, title);
    fputs("</text>\n", f);
    fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"none\" "
               "stroke=\"#888\"/>\n", fr.left, fr.top, fr.w, fr.h);
    double ys = nice_step(fr.y1 - fr.y0);
    for (double y = ceil(fr.y0 / ys) * ys; y <= fr.y1; y += ys)
        fprintf(f, "<line x1=\"%.1f\" x2=\"%.1f\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"#eee\"/>"
                   "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"end\">%.2f</text>\n",
                fr.left, fr.left + fr.w, py(&fr, y), py(&fr, y), fr.left - 6, py(&fr, y) + 4, y);
    double xs = nice_step(fr.x1 - fr.x0);
    for (double x = 0; x <= fr.x1; x += xs)
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">%.0f</text>\n",
                px(&fr, x), fr.top + fr.h + 18, x);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" text-anchor=\"middle\">step</text>\n",
            fr.left + fr.w / 2, fr.top + fr.h + 36);
    fprintf(f, "<text transform=\"translate(18,%.1f) rotate(-90)\" text-anchor=\"middle\">"
               "loss (nats/token)</text>\n", fr.top + fr.h / 2);
    polyline(f, &fr, &h->train, "#1f77b4", 600, 1.5);
    polyline(f, &fr, &h->val, "#d62728", 600, 2.0);
    for (int64_t i = 0; i < h->val.n; i++)
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"#d62728\"/>\n",
                px(&fr, h->val.x[i]), py(&fr, h->val.y[i]));
    fprintf(f, "<text x=\"%.0f\" y=\"%.0f\" fill=\"#1f77b4\">train</text>"
               "<text x=\"%.0f\" y=\"%.0f\" fill=\"#d62728\">validation</text>\n</svg>\n",
            fr.left + fr.w - 120, fr.top + 18, fr.left + fr.w - 70, fr.top + 18);
    return fs_atomic_commit(&a, err);
}
