/* Drawing items into pixels (plot_list.h) for png.c: anti-aliased strokes and discs from the
 * distance of each pixel centre to the shape, and the bitmap font scaled by whole pixels. The
 * image has SS device pixels per logical pixel so thin lines and small text stay legible. */
#include <math.h>
#include <stdlib.h>

#include "plot/font.h"
#include "plot/plot_list.h"
#include "plot/png.h"

#define SS 2

typedef struct image {
    int w, h;
    uint8_t *rgb;
} image;

static void blend(image *im, int x, int y, uint32_t c, double a)
{
    if (x < 0 || y < 0 || x >= im->w || y >= im->h || !(a > 0))
        return;
    a = a > 1 ? 1 : a;
    uint8_t *p = im->rgb + 3 * ((size_t)y * (size_t)im->w + (size_t)x);
    for (int k = 0; k < 3; k++) {
        double v = (double)((c >> (16 - 8 * k)) & 0xff);
        p[k] = (uint8_t)lround(p[k] + (v - p[k]) * a);
    }
}

/* A round-capped stroke of radius r from (x0, y0) to (x1, y1), in device pixels; a disc when
 * the ends coincide. */
static void capsule(image *im, double x0, double y0, double x1, double y1, double r, uint32_t c)
{
    double dx = x1 - x0, dy = y1 - y0, len2 = dx * dx + dy * dy;
    int xa = (int)floor(fmin(x0, x1) - r - 1), xb = (int)ceil(fmax(x0, x1) + r + 1);
    int ya = (int)floor(fmin(y0, y1) - r - 1), yb = (int)ceil(fmax(y0, y1) + r + 1);
    xa = xa < 0 ? 0 : xa, ya = ya < 0 ? 0 : ya;
    xb = xb > im->w ? im->w : xb, yb = yb > im->h ? im->h : yb;
    for (int y = ya; y < yb; y++)
        for (int x = xa; x < xb; x++) {
            double px = x + 0.5 - x0, py = y + 0.5 - y0;
            double t = len2 > 0 ? (px * dx + py * dy) / len2 : 0;
            t = t < 0 ? 0 : t > 1 ? 1 : t;
            double ex = px - t * dx, ey = py - t * dy;
            blend(im, x, y, c, r + 0.5 - sqrt(ex * ex + ey * ey));
        }
}

static void fill_block(image *im, int x, int y, int w, int h, uint32_t c)
{
    for (int j = y; j < y + h; j++)
        for (int i = x; i < x + w; i++)
            blend(im, i, j, c, 1);
}

/* Text at baseline (x, y) in device pixels; vertical text turns a quarter anticlockwise. */
static void text(image *im, const plot_item *it)
{
    int s = (int)lround(it->size * SS / 12.0);
    s = s < 1 ? 1 : s;
    int n = 0;
    while (it->text[n])
        n++;
    double width = (double)(n * FONT_ADVANCE - 1) * s;
    double u0 = it->anchor == 1 ? -width / 2 : it->anchor == 2 ? -width : 0;
    double X = it->x0 * SS, Y = it->y0 * SS;
    for (int k = 0; k < n; k++) {
        const uint8_t *g = font5x7_glyph(it->text[k]);
        for (int row = 0; row < FONT_H; row++)
            for (int col = 0; col < FONT_W; col++) {
                if (!(g[row] >> (FONT_W - 1 - col) & 1))
                    continue;
                /* u along the text, v from the baseline (negative upwards) */
                double u = u0 + (double)((k * FONT_ADVANCE + col) * s);
                double v = (double)((row - FONT_ASCENT) * s);
                int x = (int)lround(it->vertical ? X + v : X + u);
                int y = (int)lround(it->vertical ? Y - u - s : Y + v);
                fill_block(im, x, y, s, s, it->color);
            }
    }
}

static void draw(image *im, const plot_item *it)
{
    switch (it->kind) {
    case ITEM_LINE:
        capsule(im, it->x0 * SS, it->y0 * SS, it->x1 * SS, it->y1 * SS, it->width * SS / 2,
                it->color);
        break;
    case ITEM_CIRCLE:
        capsule(im, it->x0 * SS, it->y0 * SS, it->x0 * SS, it->y0 * SS, it->width * SS,
                it->color);
        break;
    case ITEM_RECT: {
        double x0 = it->x0 * SS, y0 = it->y0 * SS, x1 = x0 + it->x1 * SS, y1 = y0 + it->y1 * SS;
        if (it->filled)
            fill_block(im, (int)x0, (int)y0, (int)(x1 - x0), (int)(y1 - y0), it->fill);
        double r = it->width * SS / 2;
        capsule(im, x0, y0, x1, y0, r, it->color);
        capsule(im, x1, y0, x1, y1, r, it->color);
        capsule(im, x1, y1, x0, y1, r, it->color);
        capsule(im, x0, y1, x0, y0, r, it->color);
        break;
    }
    default:
        text(im, it);
    }
}

int plot_write_png_list(const plot_list *l, const char *path, k3rt_error *err)
{
    image im = {(int)(l->width * SS), (int)(l->height * SS), NULL};
    im.rgb = malloc(3 * (size_t)im.w * (size_t)im.h);
    if (!im.rgb)
        return k3rt_fail(err, K3RT_ERR_NOMEM, "%s: out of memory", path);
    for (size_t i = 0; i < (size_t)im.w * (size_t)im.h; i++)
        for (int k = 0; k < 3; k++)
            im.rgb[3 * i + (size_t)k] = (uint8_t)(l->background >> (16 - 8 * k));
    for (int i = 0; i < l->n; i++)
        draw(&im, &l->items[i]);
    int rc = png_write_rgb(path, im.rgb, im.w, im.h, err);
    free(im.rgb);
    return rc;
}
