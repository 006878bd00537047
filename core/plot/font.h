/* The bitmap font of the PNG charts: 5 x 7 glyphs above the baseline and one descender row
 * below it, on a 6-pixel advance. */
#ifndef K3RT_PLOT_FONT_H
#define K3RT_PLOT_FONT_H

#include <stdint.h>

#define FONT_W 5
#define FONT_H 8      /* rows, the last below the baseline */
#define FONT_ASCENT 7
#define FONT_ADVANCE 6

/* The FONT_H rows of c (bit 4 = leftmost column); '?' outside printable ASCII. */
const uint8_t *font5x7_glyph(char c);

#endif
