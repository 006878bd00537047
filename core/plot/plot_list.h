/* The drawing items a chart is made of, in logical pixels (origin top left, y down), shared
 * by the SVG writer and the rasteriser. Text is placed at its baseline; anchor 0 starts, 1
 * centres, 2 ends it there; vertical text reads bottom to top. */
#ifndef K3RT_PLOT_LIST_H
#define K3RT_PLOT_LIST_H

#include <stdint.h>
#include <k3rt/errors.h>

enum { ITEM_LINE, ITEM_CIRCLE, ITEM_RECT, ITEM_TEXT };

typedef struct plot_item {
    int kind;
    double x0, y0, x1, y1;  /* line ends; circle centre (x0, y0); rect corner and size */
    double width;           /* line width, circle radius, rect stroke width */
    uint32_t color;         /* 0xRRGGBB: stroke, text or circle fill */
    uint32_t fill;          /* rect fill when filled */
    int filled;
    double size;            /* font size */
    int anchor, vertical;
    char text[128];
} plot_item;

typedef struct plot_list {
    plot_item *items;
    int n, cap;
    double width, height;
    uint32_t background;
} plot_list;

int plot_add_item(plot_list *l, const plot_item *it, k3rt_error *err);
void plot_list_free(plot_list *l);

/* svg.c, raster.c */
int plot_write_svg_list(const plot_list *l, const char *path, k3rt_error *err);
int plot_write_png_list(const plot_list *l, const char *path, k3rt_error *err);

#endif
