/* The SVG side of k3rt's charts (the ablation charts of chart.c, the run's loss curve and
 * heat maps): each writes its document through fs_atomic (util/fs.h), so a reader never sees
 * half a chart, with these pieces in common. */
#ifndef K3RT_PLOT_SVG_H
#define K3RT_PLOT_SVG_H

#include <stdio.h>

/* The opening <svg> element of a w x h document on a white background, sans-serif text of
 * font_size pixels. */
void svg_begin(FILE *f, double w, double h, int font_size);
/* Text with &, <, >, " escaped; NULL writes nothing. */
void svg_put_text(FILE *f, const char *text);

#endif
