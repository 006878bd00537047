/* The SVG writer (svg.h) and drawing items as SVG elements (plot_list.h). */
#include "plot/svg.h"

#include <stdio.h>

#include "plot/plot_list.h"
#include "util/fs.h"

void svg_begin(FILE *f, double w, double h, int font_size)
{
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\" font-size=\"%d\">\n"
               "<rect width=\"%.0f\" height=\"%.0f\" fill=\"white\"/>\n", w, h, font_size, w,
            h);
}

void svg_put_text(FILE *f, const char *s)
{
    for (; s && *s; s++) {
        switch (*s) {
        case '&': fputs("&amp;", f); break;
        case '<': fputs("&lt;", f); break;
        case '>': fputs("&gt;", f); break;
        case '"': fputs("&quot;", f); break;
        default: fputc(*s, f);
        }
    }
}

static void item(FILE *f, const plot_item *it)
{
    static const char *const anchor[] = {"start", "middle", "end"};
    switch (it->kind) {
    case ITEM_LINE:
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#%06x\" "
                   "stroke-width=\"%.1f\" stroke-linecap=\"round\"/>\n",
                it->x0, it->y0, it->x1, it->y1, (unsigned)it->color, it->width);
        break;
    case ITEM_CIRCLE:
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"%.1f\" fill=\"#%06x\"/>\n", it->x0,
                it->y0, it->width, (unsigned)it->color);
        break;
    case ITEM_RECT:
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" ", it->x0,
                it->y0, it->x1, it->y1);
        if (it->filled)
            fprintf(f, "fill=\"#%06x\"", (unsigned)it->fill);
        else
            fprintf(f, "fill=\"none\"");
        fprintf(f, " stroke=\"#%06x\" stroke-width=\"%.1f\"/>\n", (unsigned)it->color,
                it->width);
        break;
    default:
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"%.0f\" fill=\"#%06x\" "
                   "text-anchor=\"%s\"",
                it->x0, it->y0, it->size, (unsigned)it->color, anchor[it->anchor % 3]);
        if (it->vertical)
            fprintf(f, " transform=\"rotate(-90 %.1f %.1f)\"", it->x0, it->y0);
        fputc('>', f);
        svg_put_text(f, it->text);
        fputs("</text>\n", f);
    }
}

int plot_write_svg_list(const plot_list *l, const char *path, k3rt_error *err)
{
    fs_atomic a;
    K3RT_TRY(fs_atomic_open(&a, path, err));
    FILE *f = a.f;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" "
               "font-family=\"sans-serif\">\n<rect width=\"100%%\" height=\"100%%\" "
               "fill=\"#%06x\"/>\n",
            l->width, l->height, (unsigned)l->background);
    for (int i = 0; i < l->n; i++)
        item(f, &l->items[i]);
    fputs("</svg>\n", f);
    return fs_atomic_commit(&a, err);
}
