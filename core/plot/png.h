/* Minimal PNG writer: 8-bit RGB, one zlib-compressed IDAT, no filtering (png.c). */
#ifndef K3RT_PLOT_PNG_H
#define K3RT_PLOT_PNG_H

#include <stdint.h>
#include <k3rt/errors.h>

/* rgb holds h rows of w pixels, 3 bytes each; the file is written atomically. */
int png_write_rgb(const char *path, const uint8_t *rgb, int w, int h, k3rt_error *err);

#endif
